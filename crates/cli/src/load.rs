//! Reading manifests: files or directories of YAML/JSON (multi-document, `kind: List`
//! flattened), with errors that name the file and line; and turning them into compiled
//! policies, exceptions, values and user info for `test` and `apply`.

use anyhow::{Context as _, Result, anyhow};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use verno_api::{ClusterPolicy, PolicyException, UserInfoFile, Values, strict};
use verno_engine::{CompiledException, CompiledPolicy, RequestUser, compile_exception, compile_policy};

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
    matches!(kind(v), "ClusterPolicy" | "Policy") && api_version(v).starts_with("kyverno.io/")
}

/// `policies.kyverno.io` policies Verno compiles: Validating and Mutating (and Namespaced).
pub fn is_cel_policy(v: &Value) -> bool {
    matches!(kind(v), "ValidatingPolicy" | "NamespacedValidatingPolicy" | "MutatingPolicy" | "NamespacedMutatingPolicy")
        && api_version(v).starts_with("policies.kyverno.io/")
}

pub fn is_kyverno_exception(v: &Value) -> bool {
    kind(v) == "PolicyException" && api_version(v).starts_with("kyverno.io/")
}

/// Policy kinds Verno recognises but cannot evaluate yet (CEL and Kubernetes admission policies).
pub fn is_unsupported_policy(v: &Value) -> bool {
    let av = api_version(v);
    av.starts_with("policies.kyverno.io/")
        || (av.starts_with("admissionregistration.k8s.io/")
            && matches!(
                kind(v),
                "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
                    | "MutatingAdmissionPolicy"
                    | "MutatingAdmissionPolicyBinding"
            ))
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
    pub compiled: Vec<CompiledPolicy>,
    pub invalid: HashMap<String, String>,
    pub unsupported: HashMap<String, String>,
    pub other_docs: Vec<Doc>,
}

pub fn load_policies(docs: Vec<Doc>) -> LoadedPolicies {
    let mut out = LoadedPolicies {
        compiled: Vec::new(),
        invalid: HashMap::new(),
        unsupported: HashMap::new(),
        other_docs: Vec::new(),
    };
    let k8s = |v: &Value| api_version(v).starts_with("admissionregistration.k8s.io/");
    let is_binding =
        |v: &Value| matches!(kind(v), "ValidatingAdmissionPolicyBinding" | "MutatingAdmissionPolicyBinding") && k8s(v);
    let bindings: Vec<Value> = docs.iter().filter(|d| is_binding(&d.value)).map(|d| d.value.clone()).collect();
    for d in docs {
        if is_binding(&d.value) {
            continue;
        }
        if matches!(kind(&d.value), "ValidatingAdmissionPolicy" | "MutatingAdmissionPolicy") && k8s(&d.value) {
            let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let binding_kind = format!("{}Binding", kind(&d.value));
            let binding = bindings.iter().find(|b| {
                kind(b) == binding_kind && b.pointer("/spec/policyName").and_then(Value::as_str) == Some(name.as_str())
            });
            let compiled = if kind(&d.value) == "MutatingAdmissionPolicy" {
                verno_engine::mpol::compile_mutating_admission_policy(&d.value, binding)
            } else {
                verno_engine::vpol::compile_admission_policy(&d.value, binding)
            };
            match compiled {
                Ok(c) => out.compiled.push(c),
                Err(e) => {
                    eprintln!("Error: {}: policy {name}: {e}", d.file.display());
                    out.invalid.insert(name, e.to_string());
                }
            }
            continue;
        }
        if is_kyverno_policy(&d.value) {
            let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let ns = d.value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
            let key = if kind(&d.value) == "Policy" { format!("{ns}/{name}") } else { name.clone() };
            let mut value = d.value.clone();
            if kind(&value) == "Policy"
                && value.pointer("/metadata/namespace").is_none()
                && let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut)
            {
                m.insert("namespace".into(), Value::String("default".into()));
            }
            match serde_json::from_value::<ClusterPolicy>(value) {
                Ok(p) => match compile_policy(&p) {
                    Ok(c) => out.compiled.push(c),
                    Err(e) => {
                        eprintln!("Error: {}: policy {key}: {e}", d.file.display());
                        out.invalid.insert(key, e.to_string());
                    }
                },
                Err(e) => {
                    eprintln!("Error: {}: policy {key}: {e}", d.file.display());
                    out.invalid.insert(key, e.to_string());
                }
            }
        } else if is_cel_policy(&d.value) {
            let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let compiled = if kind(&d.value).ends_with("MutatingPolicy") {
                verno_engine::mpol::compile_mutating_policy(&d.value)
            } else {
                verno_engine::vpol::compile_validating_policy(&d.value)
            };
            match compiled {
                Ok(c) => out.compiled.push(c),
                Err(e) => {
                    eprintln!("Error: {}: policy {name}: {e}", d.file.display());
                    out.invalid.insert(name, e.to_string());
                }
            }
        } else if is_unsupported_policy(&d.value) {
            let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            out.unsupported
                .insert(name, format!("{} policies are not supported by this build of verno yet", kind(&d.value)));
        } else {
            out.other_docs.push(d);
        }
    }
    out
}

pub fn load_exceptions(docs: &[Doc]) -> Result<Vec<CompiledException>> {
    let mut out = Vec::new();
    for d in docs
        .iter()
        .filter(|d| kind(&d.value) == "PolicyException" && api_version(&d.value).starts_with("policies.kyverno.io/"))
    {
        out.push(
            verno_engine::compile_cel_exception(&d.value)
                .map_err(|e| anyhow!("{}: PolicyException: {e}", d.file.display()))?,
        );
    }
    for d in docs.iter().filter(|d| is_kyverno_exception(&d.value)) {
        let e: PolicyException = serde_json::from_value(d.value.clone())
            .map_err(|e| anyhow!("{}: invalid PolicyException: {e}", d.file.display()))?;
        out.push(compile_exception(&e).map_err(|e| anyhow!("{}: PolicyException: {e}", d.file.display()))?);
    }
    Ok(out)
}
