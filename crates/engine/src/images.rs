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

/// A rule's `imageExtractors` for one kind: where images are in a custom resource.
#[derive(Debug, Clone)]
pub struct Extractor {
    /// Path segments down to the objects that hold the image (`*`: every element).
    fields: Vec<String>,
    /// The field holding the image.
    value: String,
    /// The field naming the image (its key in `images.<name>`); empty: the JSON pointer.
    key: String,
    /// The group in `images` (`custom` when not named).
    pub name: String,
    /// Applied to the field's value to get the image.
    jmes: Option<verno_jmespath::Expression>,
}

/// `imageExtractors`: per kind, its extractors.
pub type Extractors = std::collections::BTreeMap<String, Vec<Extractor>>;

/// Compiles a rule's `imageExtractors` (`{Kind: [{path, value, key, name, jmesPath}]}`).
pub fn compile_extractors(v: &Value, path: &str) -> Result<Extractors, crate::CompileError> {
    let map = v.as_object().ok_or_else(|| crate::CompileError::new(path, "imageExtractors must be a map of kinds"))?;
    let mut out = Extractors::new();
    for (kind, list) in map {
        let list =
            list.as_array().ok_or_else(|| crate::CompileError::new(format!("{path}.{kind}"), "must be a list"))?;
        let mut ex = Vec::with_capacity(list.len());
        for (i, e) in list.iter().enumerate() {
            let p = format!("{path}.{kind}[{i}]");
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let mut fields: Vec<String> =
                s("path").split('/').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect();
            if fields.is_empty() {
                return Err(crate::CompileError::new(format!("{p}.path"), "a path is required"));
            }
            let mut value = s("value");
            if value.is_empty() {
                value = fields.pop().unwrap_or_default();
            }
            let jmes = match s("jmesPath") {
                q if q.is_empty() => None,
                q => Some(verno_jmespath::Expression::compile(&q).map_err(|e| {
                    crate::CompileError::new(format!("{p}.jmesPath"), format!("invalid jmespath {q}: {e}"))
                })?),
            };
            let name = if s("name").is_empty() { "custom".to_string() } else { s("name") };
            ex.push(Extractor { fields, value, key: s("key"), name, jmes });
        }
        out.insert(kind.clone(), ex);
    }
    Ok(out)
}

/// `images` of a resource through custom extractors (`None`: none for its kind, the standard
/// ones apply); an error says which extractor could not read the resource.
pub fn extract_custom(resource: &Value, extractors: &Extractors) -> Option<Result<Value, String>> {
    let kind = resource.get("kind").and_then(Value::as_str).unwrap_or("");
    let list = extractors.get(kind)?;
    let mut out = Map::new();
    for e in list {
        let mut found = Map::new();
        if let Err(err) = walk(resource, &mut Vec::new(), e, &e.fields, &mut found) {
            return Some(Err(err));
        }
        if !found.is_empty() {
            let group = out.entry(e.name.clone()).or_insert_with(|| Value::Object(Map::new()));
            if let Some(g) = group.as_object_mut() {
                g.extend(found);
            }
        }
    }
    Some(Ok(Value::Object(out)))
}

fn walk(
    obj: &Value,
    path: &mut Vec<String>,
    e: &Extractor,
    fields: &[String],
    out: &mut Map<String, Value>,
) -> Result<(), String> {
    if obj.is_null() {
        return Ok(());
    }
    if let Some((first, rest)) = fields.split_first() {
        if first == "*" {
            match obj {
                Value::Array(a) => {
                    for (i, v) in a.iter().enumerate() {
                        path.push(i.to_string());
                        walk(v, path, e, rest, out)?;
                        path.pop();
                    }
                }
                Value::Object(m) => {
                    for (k, v) in m {
                        path.push(k.clone());
                        walk(v, path, e, rest, out)?;
                        path.pop();
                    }
                }
                _ => return Err("invalid type".into()),
            }
            return Ok(());
        }
        let Some(m) = obj.as_object() else { return Err("invalid image config".into()) };
        path.push(first.clone());
        let r = walk(m.get(first).unwrap_or(&Value::Null), path, e, rest, out);
        path.pop();
        return r;
    }
    let Some(m) = obj.as_object() else { return Err("invalid image config".into()) };
    let pointer = format!("/{}/{}", path.join("/"), e.value);
    let key = if e.key.is_empty() {
        pointer.clone()
    } else {
        m.get(&e.key).and_then(Value::as_str).ok_or("invalid key")?.to_string()
    };
    let Some(mut value) = m.get(&e.value).and_then(Value::as_str).filter(|v| !v.trim().is_empty()).map(str::to_string)
    else {
        return Ok(());
    };
    if let Some(q) = &e.jmes {
        let input = Value::String(value.clone());
        let r = q
            .search(&input, &verno_jmespath::NoEnv)
            .map_err(|err| format!("failed to apply jmespath {}: {err}", q.source()))?;
        value = r
            .as_str()
            .ok_or_else(|| format!("jmespath {} must produce a string, but produced {r}", q.source()))?
            .to_string();
    }
    let info = image_info(&value, &pointer).ok_or_else(|| format!("invalid image '{value}'"))?;
    out.insert(key, info);
    Ok(())
}
