//! Reading manifests: files or directories of YAML/JSON (multi-document, `kind: List`
//! flattened), with errors that name the file and line.

use anyhow::{Context as _, Result, anyhow};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One document and where it came from.
#[derive(Debug, Clone)]
pub struct Doc {
    pub value: Value,
    pub file: PathBuf,
}

fn is_manifest(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

/// Every manifest file under `path` (the path itself when it is a file), sorted.
pub fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for e in rd {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if is_manifest(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Parses YAML (or JSON) text into documents; `kind: List` items are flattened.
pub fn parse_docs(text: &str, file: &Path) -> Result<Vec<Doc>> {
    let values = verno_jmespath::yaml::parse_all(text).map_err(|e| anyhow!("{}: invalid YAML: {e}", file.display()))?;
    let mut out = Vec::new();
    for v in values {
        if v.get("kind").and_then(Value::as_str).is_some_and(|k| k == "List" || k.ends_with("List") && v.get("items").is_some()) {
            if let Some(items) = v.get("items").and_then(Value::as_array) {
                for it in items {
                    out.push(Doc { value: it.clone(), file: file.to_path_buf() });
                }
                continue;
            }
        }
        out.push(Doc { value: v, file: file.to_path_buf() });
    }
    Ok(out)
}

/// Reads all documents under `path`.
pub fn read_docs(path: &Path) -> Result<Vec<Doc>> {
    let mut out = Vec::new();
    for f in files(path)? {
        let text = std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?;
        out.extend(parse_docs(&text, &f)?);
    }
    Ok(out)
}

pub fn kind(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

pub fn api_version(v: &Value) -> &str {
    v.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

pub fn is_kyverno_policy(v: &Value) -> bool {
    matches!(kind(v), "ClusterPolicy" | "Policy") && api_version(v).starts_with("kyverno.io/")
}

pub fn is_kyverno_exception(v: &Value) -> bool {
    kind(v) == "PolicyException" && api_version(v).starts_with("kyverno.io/")
}

/// Policy kinds Verno recognises but cannot evaluate yet (CEL and Kubernetes admission policies).
pub fn is_unsupported_policy(v: &Value) -> bool {
    let av = api_version(v);
    av.starts_with("policies.kyverno.io/")
        || (av.starts_with("admissionregistration.k8s.io/")
            && matches!(kind(v), "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding" | "MutatingAdmissionPolicy" | "MutatingAdmissionPolicyBinding"))
}
