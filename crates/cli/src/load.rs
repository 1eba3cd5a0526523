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

/// The largest manifest file read (a policy set, a test's resources); larger is an error, so a
/// stray 4 GB file or a sparse one cannot take the memory.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Every manifest file under `path` (the path itself when it is a file), sorted. Only regular
/// files are read: a FIFO would block the reader for good, a device (`/dev/zero`) never ends.
/// Hidden entries are skipped, which also skips a ConfigMap mount's `..data` and timestamped
/// folders (their files are reached once, through the visible links). A directory reached
/// twice (a symlink loop) is listed once.
pub fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_dir() {
        regular(path, &meta)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if !seen.insert(std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone())) {
            continue;
        }
        let rd = std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for e in rd {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let p = e.path();
            let Ok(meta) = std::fs::metadata(&p) else { continue };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() && is_manifest(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A regular file of bounded size, or the error that says why not.
fn regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if !meta.is_file() {
        return Err(anyhow!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(anyhow!(
            "{} is {} bytes; files over {MAX_FILE_BYTES} bytes are not read",
            path.display(),
            meta.len()
        ));
    }
    Ok(())
}

/// The text of a manifest file: a regular file, at most [`MAX_FILE_BYTES`] (checked before
/// opening, and again while reading in case it grows).
pub fn read_text(path: &Path) -> Result<String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    regular(path, &meta)?;
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(anyhow!("{} grew past {MAX_FILE_BYTES} bytes while being read", path.display()));
    }
    Ok(text)
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
        out.extend(parse_docs(&read_text(&f)?, &f)?);
    }
    Ok(out)
}

/// A resource as Kyverno's CLI reads it from a file: a namespaced kind without a namespace is put
/// in `default`, and map fields written empty (`annotations:`, which some Helm charts produce)
/// are empty maps rather than null. Which kinds are cluster-scoped is Kyverno's built-in list
/// of Kubernetes' own kinds, so every other kind, custom resources included, counts as
/// namespaced, as it does for Kyverno.
pub fn as_kyverno_reads(v: &mut Value) {
    fn empty_maps(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if x.is_null()
                        && matches!(
                            k.as_str(),
                            "annotations" | "labels" | "matchLabels" | "nodeSelector" | "data" | "stringData"
                        )
                    {
                        *x = Value::Object(serde_json::Map::new());
                    } else {
                        empty_maps(x);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(empty_maps),
            _ => {}
        }
    }
    if !v.is_object() {
        return;
    }
    empty_maps(v);
    let has_ns = v.pointer("/metadata/namespace").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    if !has_ns
        && !kyverno_cluster_scoped(api_version(v), kind(v))
        && let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut)
    {
        m.insert("namespace".into(), Value::String("default".into()));
    }
}

/// The cluster-scoped kinds of the API group list built into Kyverno's CLI (the group matters,
/// not the version).
fn kyverno_cluster_scoped(api_version: &str, kind: &str) -> bool {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    matches!(
        (group, kind),
        ("", "ComponentStatus" | "Namespace" | "Node" | "PersistentVolume")
            | (
                "admissionregistration.k8s.io",
                "MutatingWebhookConfiguration"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
                    | "ValidatingWebhookConfiguration"
            )
            | ("apiextensions.k8s.io", "CustomResourceDefinition")
            | ("apiregistration.k8s.io", "APIService")
            | ("authentication.k8s.io", "SelfSubjectReview" | "TokenReview")
            | ("authorization.k8s.io", "SelfSubjectAccessReview" | "SelfSubjectRulesReview" | "SubjectAccessReview")
            | ("certificates.k8s.io", "CertificateSigningRequest")
            | ("flowcontrol.apiserver.k8s.io", "FlowSchema" | "PriorityLevelConfiguration")
            | ("networking.k8s.io", "IPAddress" | "IngressClass" | "ServiceCIDR")
            | ("node.k8s.io", "RuntimeClass")
            | ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding")
            | ("resource.k8s.io", "DeviceClass" | "ResourceSlice")
            | ("scheduling.k8s.io", "PriorityClass")
            | (
                "storage.k8s.io",
                "CSIDriver" | "CSINode" | "StorageClass" | "VolumeAttachment" | "VolumeAttributesClass"
            )
    )
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
    let values: Values =
        serde_json::from_value(norm).map_err(|e| anyhow!("{}: invalid values: {e}", file.display()))?;
    // `request.operation` says how a resource is presented (DELETE: as the old object); a word
    // the API server never sends is refused here, in Kyverno's words.
    let resource_values = values.policies.iter().flat_map(|p| &p.resources).map(|r| &r.values);
    for v in std::iter::once(&values.global_values).chain(resource_values) {
        if let Some(op) = v.get("request.operation").and_then(Value::as_str)
            && verno_engine::Operation::parse(op).is_none()
        {
            bail!(
                "{}: invalid request.operation value {op:?}, must be one of CREATE, UPDATE, DELETE, CONNECT",
                file.display()
            );
        }
    }
    Ok(values)
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
    /// The policies that did not compile, in the order read.
    pub invalid: Vec<InvalidPolicy>,
    pub unsupported: HashMap<String, String>,
}

/// A policy that did not compile.
#[derive(Debug, Clone)]
pub struct InvalidPolicy {
    /// `name`, or `namespace/name` for a namespaced Policy.
    pub key: String,
    /// `metadata.name`.
    pub name: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// The error, in Kyverno's words where it has them.
    pub reason: String,
    /// How many rules it declares (`spec.rules`, autogen not counted).
    pub rules: usize,
}

impl LoadedPolicies {
    /// Why the policy `key` did not compile, if it did not.
    pub fn invalid_reason(&self, key: &str) -> Option<&str> {
        self.invalid.iter().find(|i| i.key == key).map(|i| i.reason.as_str())
    }

    /// The keys of the policies that did not compile.
    pub fn invalid_keys(&self) -> Vec<&str> {
        self.invalid.iter().map(|i| i.key.as_str()).collect()
    }

    /// Prints each policy that did not compile to stderr: `Error: FILE: policy KEY: REASON`.
    pub fn print_invalid(&self) {
        for i in &self.invalid {
            eprintln!("Error: {}: policy {}: {}", i.file.display(), i.key, i.reason);
        }
    }
}

/// Compiles every policy among `docs` through the engine's one front door; exceptions
/// ([`load_exceptions`]), bindings (read with their policy) and other documents are skipped.
pub fn load_policies(docs: Vec<Doc>) -> LoadedPolicies {
    let mut out = LoadedPolicies { compiled: Vec::new(), invalid: Vec::new(), unsupported: HashMap::new() };
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
                    _ => name.clone(),
                };
                let rules = d.value.pointer("/spec/rules").and_then(Value::as_array).map_or(0, Vec::len);
                out.invalid.push(InvalidPolicy { key, name, file: d.file.clone(), reason: e.to_string(), rules });
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

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata:\n  name: p\n";

    #[test]
    fn a_request_operation_value_must_be_one_the_api_server_sends() {
        let file = Path::new("values.yaml");
        let global = serde_json::json!({"globalValues": {"request.operation": "PATCH"}});
        let err = parse_values(&global, file).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            err,
            "values.yaml: invalid request.operation value \"PATCH\", must be one of CREATE, UPDATE, DELETE, CONNECT"
        );
        let per_resource = serde_json::json!({"policies": [{"name": "p", "resources": [
            {"name": "r", "values": {"request.operation": "GET"}}]}]});
        assert!(parse_values(&per_resource, file).is_err());
        for ok in ["CREATE", "update", "DELETE", "CONNECT"] {
            let v = serde_json::json!({"globalValues": {"request.operation": ok}});
            assert!(parse_values(&v, file).is_ok(), "{ok}");
        }
    }

    fn names(files: &[PathBuf], root: &Path) -> Vec<String> {
        files.iter().map(|f| f.strip_prefix(root).unwrap_or(f).display().to_string()).collect()
    }

    /// A FIFO named like a manifest blocked the loader (and the server) for
    /// good; hidden files loaded; a ConfigMap mount loaded every policy three times.
    #[test]
    fn only_visible_regular_files_are_read_and_a_configmap_mount_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.yaml"), POLICY).unwrap();
        std::fs::write(root.join(".hidden.yaml"), POLICY).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(root.join("x.yaml")).status();
        assert!(fifo.is_ok_and(|s| s.success()), "mkfifo");
        // A ConfigMap volume: files are links into `..data`, which links to a timestamped folder.
        let stamp = root.join("cm/..2026_11_23_10_00_00.123");
        std::fs::create_dir_all(&stamp).unwrap();
        std::fs::write(stamp.join("b.yaml"), POLICY).unwrap();
        std::os::unix::fs::symlink("..2026_11_23_10_00_00.123", root.join("cm/..data")).unwrap();
        std::os::unix::fs::symlink("..data/b.yaml", root.join("cm/b.yaml")).unwrap();
        let found = files(root).unwrap();
        assert_eq!(names(&found, root), ["a.yaml", "cm/b.yaml"]);
        assert_eq!(read_docs(root).unwrap().len(), 2);
    }

    /// `/dev/zero` or a 4 GB sparse file was read until memory ran out.
    #[test]
    fn devices_and_oversized_files_are_refused_with_the_reason() {
        let err = read_docs(Path::new("/dev/zero")).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert_eq!(err, "/dev/zero is not a regular file");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::File::create(&big).unwrap().set_len(4 << 30).unwrap();
        let err = read_docs(&big).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err.ends_with("is 4294967296 bytes; files over 67108864 bytes are not read"), "{err}");
        // In a folder it is an error too, not a silent skip: the user named it.
        assert!(read_docs(dir.path()).is_err());
    }
}
