//! The `images` context variable: every container image of a Pod (or a Pod template),
//! split into registry, path, name, tag and digest.

use serde_json::{Map, Value, json};

const DEFAULT_REGISTRY: &str = "docker.io";

/// Parses an image reference the way Kyverno fills `images.*`.
pub fn image_info(image: &str, pointer: &str) -> Option<Value> {
    if image.is_empty() {
        return None;
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, d.to_string()),
        None => (image, String::new()),
    };
    let (name_part, mut tag) = match name_tag.rfind(':') {
        Some(i) if !name_tag.get(i + 1..).unwrap_or("").contains('/') => {
            (name_tag.get(..i).unwrap_or(""), name_tag.get(i + 1..).unwrap_or("").to_string())
        }
        _ => (name_tag, String::new()),
    };
    let (registry, path) = match name_part.split_once('/') {
        Some((d, rest)) if d.contains(['.', ':']) || d == "localhost" => (d.to_string(), rest.to_string()),
        _ => (DEFAULT_REGISTRY.to_string(), name_part.to_string()),
    };
    let name = path.rsplit('/').next().unwrap_or(&path).to_string();
    if digest.is_empty() && tag.is_empty() {
        tag = "latest".into();
    }
    let mut reference = format!("{registry}/{path}");
    if !tag.is_empty() {
        reference.push(':');
        reference.push_str(&tag);
    }
    let reference_with_tag = reference.clone();
    if !digest.is_empty() {
        reference.push('@');
        reference.push_str(&digest);
    }
    Some(json!({
        "registry": registry,
        "path": path,
        "name": name,
        "tag": tag,
        "digest": digest,
        "reference": reference,
        "referenceWithTag": reference_with_tag,
        "jsonPointer": pointer,
    }))
}

/// `images` for a resource: Pods, Pod templates (controllers) and CronJob job templates.
pub fn extract(resource: &Value) -> Value {
    let kind = resource.get("kind").and_then(Value::as_str).unwrap_or("");
    let (spec, prefix) = match kind {
        "Pod" => (resource.get("spec"), "/spec"),
        "CronJob" => (resource.pointer("/spec/jobTemplate/spec/template/spec"), "/spec/jobTemplate/spec/template/spec"),
        _ => (resource.pointer("/spec/template/spec"), "/spec/template/spec"),
    };
    let mut out = Map::new();
    let Some(spec) = spec else { return Value::Object(out) };
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(list) = spec.get(field).and_then(Value::as_array) else { continue };
        let mut m = Map::new();
        for (i, c) in list.iter().enumerate() {
            let (Some(name), Some(image)) =
                (c.get("name").and_then(Value::as_str), c.get("image").and_then(Value::as_str))
            else {
                continue;
            };
            if let Some(info) = image_info(image, &format!("{prefix}/{field}/{i}/image")) {
                m.insert(name.to_string(), info);
            }
        }
        if !m.is_empty() {
            out.insert(field.to_string(), Value::Object(m));
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_and_private_registries() {
        let i = image_info("nginx", "/x").unwrap_or_default();
        assert_eq!(i["registry"], "docker.io");
        assert_eq!(i["path"], "nginx");
        assert_eq!(i["tag"], "latest");
        let j = image_info("ghcr.io/org/app:v1@sha256:abc", "/x").unwrap_or_default();
        assert_eq!(j["registry"], "ghcr.io");
        assert_eq!(j["path"], "org/app");
        assert_eq!(j["name"], "app");
        assert_eq!(j["tag"], "v1");
        assert_eq!(j["digest"], "sha256:abc");
    }
}
