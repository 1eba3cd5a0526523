//! Reading manifests: files or directories of YAML/JSON (multi-document, `kind: List`
//! flattened), with errors that name the file and line; and turning them into compiled
//! policies, exceptions, values and user info for `test` and `apply`.

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use verno_api::{Kind, UserInfoFile, Values, strict};
use verno_engine::{Compiled, CompiledException, CompiledPolicy, DocumentError, RequestUser};

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
        if v.get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k == "List" || k.ends_with("List") && v.get("items").is_some())
            && let Some(items) = v.get("items").and_then(Value::as_array)
        {
            for it in items {
                out.push(Doc { value: it.clone(), file: file.to_path_buf() });
            }
            continue;
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
    matches!(Kind::of_document(v), Some(Kind::ClusterPolicy | Kind::Policy))
}

pub fn parse_values(v: &Value, file: &Path) -> Result<Values> {
    let norm =
        strict::normalize(v, &verno_api::cli::VALUES_SPEC, "").map_err(|e| anyhow!("{}: {e}", file.display()))?;
    serde_json::from_value(norm).map_err(|e| anyhow!("{}: invalid values: {e}", file.display()))
}

pub fn parse_user_info(v: &Value, file: &Path) -> Result<(RequestUser, Value)> {
    let norm = strict::normalize(v, &verno_api::cli::USER_INFO, "").map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let u: UserInfoFile =
        serde_json::from_value(norm).map_err(|e| anyhow!("{}: invalid user info: {e}", file.display()))?;
    let username = u.user_info.get("username").and_then(Value::as_str).unwrap_or("").to_string();
    let groups = u
        .user_info
        .get("groups")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let info = if u.user_info.is_null() { serde_json::json!({}) } else { u.user_info.clone() };
    Ok((RequestUser { username, groups, roles: u.roles, cluster_roles: u.cluster_roles }, info))
}

/// Policies from files: compiled ones, and the names of those that could not be used (with why).
pub struct LoadedPolicies {
    pub compiled: Vec<Arc<CompiledPolicy>>,
    pub invalid: HashMap<String, String>,
    pub unsupported: HashMap<String, String>,
}

/// Compiles every policy among `docs` through the engine's one front door; exceptions
/// ([`load_exceptions`]), bindings (read with their policy) and other documents are skipped.
pub fn load_policies(docs: Vec<Doc>) -> LoadedPolicies {
    let mut out = LoadedPolicies { compiled: Vec::new(), invalid: HashMap::new(), unsupported: HashMap::new() };
    let bindings: Vec<Value> = docs
        .iter()
        .filter(|d| Kind::of_document(&d.value).is_some_and(Kind::is_binding))
        .map(|d| d.value.clone())
        .collect();
    for d in docs {
        let Some(kind) = Kind::of_document(&d.value) else { continue };
        if kind.is_binding() || kind.is_exception() {
            continue;
        }
        let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        match verno_engine::compile(&d.value, &bindings) {
            Ok(Compiled::Policy(p)) => out.compiled.push(Arc::new(p)),
            Ok(Compiled::Exception(_)) => {}
            Err(e @ DocumentError::Unsupported(_)) => {
                out.unsupported.insert(name, e.to_string());
            }
            Err(e) => {
                let key = match kind {
                    Kind::Policy => {
                        let ns = d.value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
                        format!("{ns}/{name}")
                    }
                    _ => name,
                };
                eprintln!("Error: {}: policy {key}: {e}", d.file.display());
                out.invalid.insert(key, e.to_string());
            }
        }
    }
    out
}

/// Compiles every PolicyException (`kyverno.io` and CEL) among `docs`; the first that does not
/// compile is an error naming its file.
pub fn load_exceptions(docs: &[Doc]) -> Result<Vec<CompiledException>> {
    let mut cel = Vec::new();
    let mut kyverno = Vec::new();
    for d in docs {
        let kind = Kind::of_document(&d.value);
        if !kind.is_some_and(Kind::is_exception) {
            continue;
        }
        match verno_engine::compile(&d.value, &[]) {
            Ok(Compiled::Exception(e)) if kind == Some(Kind::CelPolicyException) => cel.push(e),
            Ok(Compiled::Exception(e)) => kyverno.push(e),
            Ok(Compiled::Policy(_)) => {}
            Err(e @ DocumentError::Decode(_)) => bail!("{}: invalid PolicyException: {e}", d.file.display()),
            Err(e) => bail!("{}: PolicyException: {e}", d.file.display()),
        }
    }
    // CEL exceptions first, as they were always listed.
    cel.extend(kyverno);
    Ok(cel)
}
