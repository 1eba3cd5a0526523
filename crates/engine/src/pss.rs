//! `validate.podSecurity`: the Pod Security Standards (baseline, restricted) checked in our own
//! code (no Rust port of `k8s.io/pod-security-admission` exists). Each check names its control
//! as the standard does, so `exclude[].controlName` (+ `images`) can waive it.

use crate::error::CompileError;
use serde_json::Value;
use verno_api::{PodSecurity, PodSecurityStandard};
use verno_jmespath::wildcard;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

#[derive(Debug, Clone)]
pub struct PodSecurityCheck {
    pub level: Level,
    pub version: String,
    /// The Kubernetes minor version whose checks apply (`latest`: the newest), read once.
    minor: u32,
    pub exclude: Vec<PodSecurityStandard>,
}

impl PodSecurityCheck {
    pub fn compile(p: &PodSecurity, path: &str) -> Result<PodSecurityCheck, CompileError> {
        let level = match p.level.as_str() {
            "privileged" => Level::Privileged,
            "baseline" => Level::Baseline,
            "restricted" => Level::Restricted,
            other => {
                return Err(CompileError::new(
                    format!("{path}.level"),
                    format!("unknown level {other:?}, expected privileged, baseline or restricted"),
                ));
            }
        };
        // The version as written (Kyverno's messages and report properties print it so, empty
        // when omitted); the checks of the newest when omitted.
        Ok(PodSecurityCheck { level, minor: minor(&p.version), version: p.version.clone(), exclude: p.exclude.clone() })
    }

    pub fn level_name(&self) -> &'static str {
        match self.level {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// Whether Kyverno reads a pod out of this kind of resource (a Pod, a CronJob's job
    /// template, the pod template of the other controllers); on another kind a podSecurity
    /// rule is an error: [`UNSUPPORTED_KIND`].
    pub fn supports(resource: &Value) -> bool {
        pod_kind(resource).is_some()
    }

    /// The failed checks after exclusions, each worded as Kyverno words it:
    /// `(Forbidden reason: R, field error list: [E, …])`, with the fields named in the
    /// resource as Kyverno renames them (every `spec` of a controller's field becomes its pod
    /// template's, every `metadata` becomes `spec.template.metadata`, whatever the kind).
    pub fn violations(&self, resource: &Value) -> Vec<String> {
        let spec_at = match pod_kind(resource) {
            Some(PodKind::Controller) => Some("spec.template.spec"),
            Some(PodKind::CronJob) => Some("spec.jobTemplate.spec.template.spec"),
            _ => None,
        };
        self.failed(resource)
            .into_iter()
            .map(|mut r| {
                for e in &mut r.errs {
                    if let Some(at) = spec_at {
                        e.field = e.field.replace("spec", at);
                    }
                    e.field = e.field.replace("metadata", "spec.template.metadata");
                }
                r.to_string()
            })
            .collect()
    }

    fn failed(&self, resource: &Value) -> Vec<CheckResult> {
        let Some((meta, spec)) = pod_parts(resource) else { return Vec::new() };
        let mut results = self.evaluate(meta, spec);
        for e in &self.exclude {
            results = self.exempt(results, e, meta, spec);
        }
        results.retain(|r| r.bare || !r.errs.is_empty());
        results
    }

    /// The report properties of a failed podSecurity rule, as Kyverno writes them: `standard`,
    /// `version`, `controls` (the failed check IDs) and `controlsJSON` (`ID`, the control's
    /// `Name`, and the `Images` of the containers the check names — Go's `null` for a pod-level
    /// check). Empty when nothing failed.
    pub fn properties(&self, resource: &Value) -> Vec<(String, String)> {
        let failed = self.failed(resource);
        let Some((_, spec)) = pod_parts(resource) else { return Vec::new() };
        if failed.is_empty() {
            return Vec::new();
        }
        // Go's encoding of Kyverno's Control struct: fields in declaration order.
        let controls: Vec<String> = failed
            .iter()
            .map(|r| {
                let mut images: Vec<String> = Vec::new();
                for e in &r.errs {
                    if let Some(image) = container_image(&e.field, spec)
                        && !images.contains(&image)
                    {
                        images.push(image);
                    }
                }
                let images = if images.is_empty() { Value::Null } else { serde_json::json!(images) };
                format!(
                    r#"{{"ID":{},"Name":{},"Images":{}}}"#,
                    Value::from(r.id),
                    Value::from(control_name(r.id)),
                    images
                )
            })
            .collect();
        let ids: Vec<&str> = failed.iter().map(|r| r.id).collect();
        vec![
            ("controls".to_string(), ids.join(",")),
            ("controlsJSON".to_string(), format!("[{}]", controls.join(","))),
            ("standard".to_string(), self.level_name().to_string()),
            ("version".to_string(), self.version.clone()),
        ]
    }

    /// The failure message of rule `rule` for the failed checks `v`: Kyverno writes the checks
    /// one after the other, with no separator.
    pub fn message(&self, rule: &str, v: &[String]) -> String {
        format!(
            "Validation rule '{rule}' failed. It violates PodSecurity \"{}:{}\": {}",
            self.level_name(),
            self.version,
            v.concat()
        )
    }

    fn evaluate(&self, meta: &Value, spec: &Value) -> Vec<CheckResult> {
        let mut out = Vec::new();
        if self.level >= Level::Baseline {
            checks(meta, spec, self.level >= Level::Restricted, self.minor, &mut out);
        }
        out
    }

    /// One `exclude` entry, as Kyverno applies it: the checks are run again on the part of the
    /// pod the entry names (the pod without its containers when it names no images; only the
    /// containers whose image matches, without the pod's own fields, when it does), and each
    /// field error found there for the entry's control (and its `restrictedField`, with every
    /// bad value among `values`) removes one equal field error — same path with indexes as `*`,
    /// and for a container field, a container of the same name — from the pod's results. A check
    /// left with no field error passes.
    fn exempt(
        &self,
        mut results: Vec<CheckResult>,
        e: &PodSecurityStandard,
        meta: &Value,
        spec: &Value,
    ) -> Vec<CheckResult> {
        let ids = control_ids(&e.control_name);
        let container_level = !e.images.is_empty();
        let part = if container_level {
            let mut m = serde_json::Map::new();
            for f in ["initContainers", "containers", "ephemeralContainers"] {
                let matching: Vec<Value> = spec
                    .get(f)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|c| e.images.iter().any(|p| wildcard::matches(p, &cimage(c))))
                    .cloned()
                    .collect();
                if !matching.is_empty() {
                    m.insert(f.to_string(), Value::Array(matching));
                }
            }
            Value::Object(m)
        } else {
            let mut s = spec.clone();
            if let Some(m) = s.as_object_mut() {
                m.insert("containers".into(), serde_json::json!([{"name": "fake"}]));
                m.remove("initContainers");
                m.remove("ephemeralContainers");
            }
            s
        };
        let part_meta = if container_level { Value::Null } else { meta.clone() };
        let restricted_field = e.restricted_field.as_deref().unwrap_or("");
        for found in self.evaluate(&part_meta, &part).into_iter().filter(|r| ids.contains(&r.id)) {
            for err in &found.errs {
                let (pattern, container) = locate(&err.field, &part, container_level);
                if !restricted_field.is_empty() && pattern != restricted_field {
                    continue;
                }
                if !e.values.is_empty() && !err.bad.iter().all(|b| e.values.iter().any(|p| wildcard::matches(p, b))) {
                    continue;
                }
                let Some(result) = results.iter_mut().find(|r| r.id == found.id) else { continue };
                let at = result.errs.iter().position(|d| {
                    let (d_pattern, d_container) = locate(&d.field, spec, container_level);
                    match d_container {
                        Some(name) => d_pattern == pattern && container.as_deref() == Some(name.as_str()),
                        None => d_pattern == pattern,
                    }
                });
                // Kyverno removes a waived error by moving the last one into its place, which
                // reorders what is left (its message shows that order).
                if let Some(i) = at {
                    result.errs.swap_remove(i);
                }
            }
        }
        results.retain(|r| !r.errs.is_empty());
        results
    }
}

/// Kyverno's control names and the Pod Security check IDs each covers.
fn control_ids(control: &str) -> &'static [&'static str] {
    match control {
        "Capabilities" => &["capabilities_baseline", "capabilities_restricted"],
        "Seccomp" => &["seccompProfile_baseline", "seccompProfile_restricted"],
        "Privileged Containers" => &["privileged"],
        "Host Ports" => &["hostPorts"],
        "/proc Mount Type" => &["procMount"],
        "HostProcess" => &["windowsHostProcess"],
        "SELinux" => &["seLinuxOptions"],
        "Host Namespaces" => &["hostNamespaces"],
        "HostPath Volumes" => &["hostPathVolumes"],
        "Sysctls" => &["sysctls"],
        "AppArmor" => &["appArmorProfile"],
        "Privilege Escalation" => &["allowPrivilegeEscalation"],
        "Running as Non-root" => &["runAsNonRoot"],
        "Running as Non-root user" => &["runAsUser"],
        "Volume Types" => &["restrictedVolumes"],
        _ => &[],
    }
}

/// Kyverno's name of the control a check ID belongs to.
fn control_name(id: &str) -> &'static str {
    const NAMES: [&str; 15] = [
        "Capabilities",
        "Seccomp",
        "Privileged Containers",
        "Host Ports",
        "/proc Mount Type",
        "HostProcess",
        "SELinux",
        "Host Namespaces",
        "HostPath Volumes",
        "Sysctls",
        "AppArmor",
        "Privilege Escalation",
        "Running as Non-root",
        "Running as Non-root user",
        "Volume Types",
    ];
    NAMES.into_iter().find(|n| control_ids(n).contains(&id)).unwrap_or("")
}

/// The image of the container a field error's path names (`spec.containers[0]…`), as Kyverno's
/// image references print it (`docker.io/nginx:latest`).
fn container_image(field: &str, spec: &Value) -> Option<String> {
    ["initContainers", "containers", "ephemeralContainers"].into_iter().find_map(|f| {
        let rest = field.split("spec.").last()?.strip_prefix(f)?.strip_prefix('[')?;
        let index: usize = rest.split(']').next()?.parse().ok()?;
        let c = spec.get(f)?.as_array()?.get(index)?;
        let info = crate::images::image_info(&cimage(c), "")?;
        let s = |k: &str| info.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Some(if s("digest").is_empty() {
            format!("{}/{}:{}", s("registry"), s("path"), s("tag"))
        } else {
            format!("{}/{}@{}", s("registry"), s("path"), s("digest"))
        })
    })
}

/// A field error's path with every run of digits as `*`, and — when `by_container` and the
/// path is a container's — the name of that container in `spec`.
fn locate(field: &str, spec: &Value, by_container: bool) -> (String, Option<String>) {
    let mut pattern = String::with_capacity(field.len());
    let mut in_digits = false;
    for ch in field.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                pattern.push('*');
            }
            in_digits = true;
        } else {
            pattern.push(ch);
            in_digits = false;
        }
    }
    if !by_container {
        return (pattern, None);
    }
    let container = ["initContainers", "containers", "ephemeralContainers"].into_iter().find_map(|f| {
        let rest = field.strip_prefix("spec.")?.strip_prefix(f)?.strip_prefix('[')?;
        let index: usize = rest.split(']').next()?.parse().ok()?;
        let c = spec.get(f)?.as_array()?.get(index)?;
        Some(cname(c))
    });
    (pattern, container)
}

/// A field error as Kubernetes' Pod Security checks report it (Kyverno's fork, with field
/// errors): the path, and the bad values as Kyverno compares them with `values`.
#[derive(Debug, Clone)]
struct FieldError {
    field: String,
    kind: ErrKind,
    bad: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ErrKind {
    /// Forbidden, with the bad value printed as Go's `%+v` prints it (a list as `[a b]`).
    Forbidden {
        list: bool,
    },
    Required,
}

fn forbidden(field: String, bad: impl Into<String>) -> FieldError {
    let bad = bad.into();
    FieldError { field, kind: ErrKind::Forbidden { list: false }, bad: if bad.is_empty() { vec![] } else { vec![bad] } }
}

fn forbidden_list(field: String, mut bad: Vec<String>) -> FieldError {
    bad.sort();
    bad.dedup();
    FieldError { field, kind: ErrKind::Forbidden { list: true }, bad }
}

fn required(field: String) -> FieldError {
    FieldError { field, kind: ErrKind::Required, bad: vec![] }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ErrKind::Required => write!(f, "{}: Required value", self.field),
            ErrKind::Forbidden { list: true } => {
                write!(f, "{} is forbidden, forbidden values found: [{}]", self.field, self.bad.join(" "))
            }
            ErrKind::Forbidden { list: false } if self.bad.is_empty() => write!(f, "{}: Forbidden", self.field),
            ErrKind::Forbidden { list: false } => {
                write!(f, "{} is forbidden, forbidden values found: {}", self.field, self.bad.join(" "))
            }
        }
    }
}

/// One failed check.
#[derive(Debug, Clone)]
struct CheckResult {
    id: &'static str,
    reason: String,
    errs: Vec<FieldError>,
    /// A check that fails without field errors (Kubernetes 1.34's hostProbesAndHostLifecycle):
    /// no exclusion can waive it, as none can in Kyverno.
    bare: bool,
}

impl std::fmt::Display for CheckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let errs: Vec<String> = self.errs.iter().map(ToString::to_string).collect();
        write!(f, "(Forbidden reason: {}, field error list: [{}])", self.reason, errs.join(", "))
    }
}

/// Kyverno's words for a podSecurity rule on a kind it reads no pod from.
pub const UNSUPPORTED_KIND: &str = "Error while getting new resource: could not find correct resource type";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodKind {
    Pod,
    /// A controller with a pod template at `spec.template`.
    Controller,
    CronJob,
}

/// The kinds Kyverno's podSecurity reads a pod from.
fn pod_kind(r: &Value) -> Option<PodKind> {
    match r.get("kind").and_then(Value::as_str)? {
        "Pod" => Some(PodKind::Pod),
        "DaemonSet" | "Deployment" | "Job" | "StatefulSet" | "ReplicaSet" | "ReplicationController" => {
            Some(PodKind::Controller)
        }
        "CronJob" => Some(PodKind::CronJob),
        _ => None,
    }
}

/// The pod's metadata and spec. For a CronJob the metadata is its job template's, not the pod
/// template's, as Kyverno reads it.
fn pod_parts(r: &Value) -> Option<(&Value, &Value)> {
    match pod_kind(r)? {
        PodKind::Pod => Some((r.get("metadata")?, r.get("spec")?)),
        PodKind::CronJob => {
            let jt = r.pointer("/spec/jobTemplate")?;
            Some((jt.get("metadata").unwrap_or(&Value::Null), jt.pointer("/spec/template/spec")?))
        }
        PodKind::Controller => {
            let t = r.pointer("/spec/template")?;
            Some((t.get("metadata").unwrap_or(&Value::Null), t.get("spec")?))
        }
    }
}

/// Every container with its field path, in the checks' order (init, regular, ephemeral).
fn containers(spec: &Value) -> impl Iterator<Item = (String, &Value)> {
    ["initContainers", "containers", "ephemeralContainers"].into_iter().flat_map(move |f| {
        spec.get(f)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .map(move |(i, c)| (format!("spec.{f}[{i}]"), c))
    })
}

fn cname(c: &Value) -> String {
    c.get("name").and_then(Value::as_str).unwrap_or("").to_string()
}

fn cimage(c: &Value) -> String {
    c.get("image").and_then(Value::as_str).unwrap_or("").to_string()
}

fn truthy(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool) == Some(true)
}

fn push(out: &mut Vec<CheckResult>, id: &'static str, reason: impl Into<String>, errs: Vec<FieldError>) {
    if !errs.is_empty() {
        out.push(CheckResult { id, reason: reason.into(), errs, bare: false });
    }
}

/// A seccomp profile's type when one is set (`""` when it names none).
fn profile_type(p: Option<&Value>) -> Option<&str> {
    p.filter(|p| !p.is_null()).map(|p| p.get("type").and_then(Value::as_str).unwrap_or(""))
}

/// The minor version of Kubernetes 1.x whose Pod Security checks apply (`v1.23` → 23); `latest`
/// (or anything else) is the newest, as Kyverno's `api.ParseVersion` reads it.
fn minor(version: &str) -> u32 {
    version.strip_prefix('v').and_then(|v| v.strip_prefix("1.")).and_then(|m| m.parse().ok()).unwrap_or(u32::MAX)
}

const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];
/// The Kubernetes minor version a safe sysctl became allowed in.
fn sysctl_since(name: &str) -> u32 {
    match name {
        "net.ipv4.ip_local_reserved_ports" => 27,
        "net.ipv4.tcp_keepalive_time"
        | "net.ipv4.tcp_fin_timeout"
        | "net.ipv4.tcp_keepalive_intvl"
        | "net.ipv4.tcp_keepalive_probes" => 29,
        "net.ipv4.tcp_rmem" | "net.ipv4.tcp_wmem" => 32,
        _ => 0,
    }
}

const SELINUX_TYPES: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn str_at<'a>(v: Option<&'a Value>, pointer: &str) -> Option<&'a str> {
    v.and_then(|v| v.pointer(pointer)).and_then(Value::as_str)
}

/// The Pod Security checks (Kyverno's fork of pod-security-admission), in the order Kubernetes
/// registers them (the order of Kyverno's message); `restricted` adds the restricted-level ones.
/// The checks of the standard at version `minor`, as Kyverno's evaluation picks them: every
/// check applies at every version in its first form (Kyverno starts from a check's first version
/// whatever the version asked, so a check added in 1.23 or 1.34 applies at v1.22 too, as its
/// CLI shows); a later form replaces it from the version that introduced it (Windows
/// exemptions from 1.25, SELinux types from 1.31, sysctls from 1.27/1.29/1.32).
fn checks(meta: &Value, spec: &Value, restricted: bool, minor: u32, out: &mut Vec<CheckResult>) {
    let psc = spec.get("securityContext");
    let sc_path = "spec.securityContext";
    // From 1.25 a Windows pod (`spec.os.name: windows`) is exempt from the Linux-only checks
    // (privilege escalation, capabilities, seccomp): the API server refuses those fields on it.
    let windows = minor >= 25 && spec.pointer("/os/name").and_then(Value::as_str) == Some("windows");
    // allowPrivilegeEscalation (restricted)
    if restricted && !windows {
        let errs = containers(spec)
            .filter_map(|(path, c)| {
                let field = format!("{path}.securityContext.allowPrivilegeEscalation");
                match c.get("securityContext") {
                    None | Some(Value::Null) => Some(required(field)),
                    Some(sc) => match sc.get("allowPrivilegeEscalation").and_then(Value::as_bool) {
                        None => Some(forbidden(field, "nil")),
                        Some(true) => Some(forbidden(field, "true")),
                        Some(false) => None,
                    },
                }
            })
            .collect();
        push(out, "allowPrivilegeEscalation", "allowPrivilegeEscalation != false", errs);
    }
    // appArmorProfile
    {
        let ok_type = |t: &str| t == "RuntimeDefault" || t == "Localhost";
        let mut errs = Vec::new();
        let mut bad = std::collections::BTreeSet::new();
        if let Some(t) = str_at(psc, "/appArmorProfile/type").filter(|t| !ok_type(t)) {
            errs.push(forbidden(format!("{sc_path}.appArmorProfile.type"), t));
            bad.insert(t.to_string());
        }
        for (path, c) in containers(spec) {
            if let Some(t) = str_at(Some(c), "/securityContext/appArmorProfile/type").filter(|t| !ok_type(t)) {
                errs.push(forbidden(format!("{path}.securityContext.appArmorProfile.type"), t));
                bad.insert(t.to_string());
            }
        }
        if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
            for (k, v) in ann {
                let v = v.as_str().unwrap_or("");
                if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
                    && v != "runtime/default"
                    && !v.starts_with("localhost/")
                {
                    errs.push(forbidden(format!("metadata.annotations[{k}]"), v));
                    bad.insert(v.to_string());
                }
            }
        }
        let reason = if bad.len() == 1 { "forbidden AppArmor profile" } else { "forbidden AppArmor profiles" };
        push(out, "appArmorProfile", reason, errs);
    }
    // capabilities_baseline
    let adds = |c: &Value| -> Vec<String> {
        c.pointer("/securityContext/capabilities/add")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    {
        let errs = containers(spec)
            .filter_map(|(path, c)| {
                let bad: Vec<String> = adds(c).into_iter().filter(|a| !BASELINE_CAPS.contains(&a.as_str())).collect();
                (!bad.is_empty()).then(|| forbidden_list(format!("{path}.securityContext.capabilities.add"), bad))
            })
            .collect();
        push(out, "capabilities_baseline", "non-default capabilities", errs);
    }
    // capabilities_restricted
    if restricted && !windows {
        let (mut missing_drop, mut adding) = (Vec::new(), Vec::new());
        for (path, c) in containers(spec) {
            let drop_field = format!("{path}.securityContext.capabilities.drop");
            let Some(caps) = c.pointer("/securityContext/capabilities").filter(|v| !v.is_null()) else {
                missing_drop.push(required(drop_field));
                continue;
            };
            let drops: Vec<String> = caps
                .get("drop")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            if !drops.iter().any(|d| d == "ALL") {
                missing_drop.push(if drops.is_empty() {
                    required(drop_field)
                } else {
                    forbidden_list(drop_field, drops)
                });
            }
            let bad: Vec<String> = adds(c).into_iter().filter(|a| a != "NET_BIND_SERVICE").collect();
            if !bad.is_empty() {
                adding.push(forbidden_list(format!("{path}.securityContext.capabilities.add"), bad));
            }
        }
        missing_drop.extend(adding);
        push(out, "capabilities_restricted", "unrestricted capabilities", missing_drop);
    }
    // hostNamespaces
    {
        let errs = ["hostNetwork", "hostPID", "hostIPC"]
            .into_iter()
            .filter(|f| truthy(spec.get(*f)))
            .map(|f| forbidden(format!("spec.{f}"), "true"))
            .collect();
        push(out, "hostNamespaces", "host namespaces", errs);
    }
    let volumes: Vec<&Value> = spec.get("volumes").and_then(Value::as_array).into_iter().flatten().collect();
    // hostPathVolumes
    {
        let errs = volumes
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let hp = v.get("hostPath").filter(|h| !h.is_null())?;
                Some(forbidden(
                    format!("spec.volumes[{i}].hostPath"),
                    hp.get("path").and_then(Value::as_str).unwrap_or(""),
                ))
            })
            .collect();
        push(out, "hostPathVolumes", "hostPath volumes", errs);
    }
    // hostPorts
    {
        let mut errs = Vec::new();
        for (path, c) in containers(spec) {
            for (j, p) in c.get("ports").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let port = p.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
                if port != 0 {
                    errs.push(forbidden(format!("{path}.ports[{j}].hostPort"), port.to_string()));
                }
            }
        }
        push(out, "hostPorts", "hostPort", errs);
    }
    // hostProbesAndHostLifecycle (added in 1.34, applied at every version as Kyverno does): no
    // field errors, the hosts in the reason's detail
    {
        let mut bad_containers = std::collections::BTreeSet::new();
        for (_, c) in containers(spec) {
            let probes = ["livenessProbe", "readinessProbe", "startupProbe"]
                .into_iter()
                .flat_map(|p| ["httpGet", "tcpSocket"].map(|h| format!("/{p}/{h}/host")));
            let hooks = ["postStart", "preStop"]
                .into_iter()
                .flat_map(|p| ["httpGet", "tcpSocket"].map(|h| format!("/lifecycle/{p}/{h}/host")));
            if probes.chain(hooks).any(|ptr| c.pointer(&ptr).and_then(Value::as_str).is_some_and(|h| !h.is_empty())) {
                bad_containers.insert(cname(c));
            }
        }
        if !bad_containers.is_empty() {
            out.push(CheckResult {
                id: "hostProbesAndHostLifecycle",
                reason: "probe or lifecycle host".into(),
                errs: Vec::new(),
                bare: true,
            });
        }
    }
    // privileged
    {
        let errs = containers(spec)
            .filter(|(_, c)| truthy(c.pointer("/securityContext/privileged")))
            .map(|(path, _)| forbidden(format!("{path}.securityContext.privileged"), "true"))
            .collect();
        push(out, "privileged", "privileged", errs);
    }
    // procMount
    {
        let errs = containers(spec)
            .filter_map(|(path, c)| {
                let m = str_at(Some(c), "/securityContext/procMount").filter(|m| *m != "Default")?;
                Some(forbidden(format!("{path}.securityContext.procMount"), m))
            })
            .collect();
        push(out, "procMount", "procMount", errs);
    }
    // restrictedVolumes (restricted)
    if restricted {
        let errs = volumes
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let o = v.as_object()?;
                // A volume with no source at all is of an unknown type to the check.
                if o.keys().all(|k| k == "name") {
                    return Some(forbidden(format!("spec.volumes[{i}].unknown"), ""));
                }
                let t = o.keys().find(|k| *k != "name" && !RESTRICTED_VOLUMES.contains(&k.as_str()))?;
                Some(forbidden(format!("spec.volumes[{i}].{t}"), ""))
            })
            .collect();
        push(out, "restrictedVolumes", "restricted volume types", errs);
    }
    if restricted {
        // runAsNonRoot
        let pod_non_root = psc.and_then(|s| s.get("runAsNonRoot")).and_then(Value::as_bool);
        let mut errs = Vec::new();
        if pod_non_root == Some(false) {
            errs.push(forbidden(format!("{sc_path}.runAsNonRoot"), "false"));
        }
        let mut implicit = Vec::new();
        for (path, c) in containers(spec) {
            let field = format!("{path}.securityContext.runAsNonRoot");
            match c.pointer("/securityContext/runAsNonRoot").and_then(Value::as_bool) {
                Some(false) => errs.push(forbidden(field, "false")),
                Some(true) => {}
                None if pod_non_root != Some(true) => implicit.push(required(field)),
                None => {}
            }
        }
        errs.extend(implicit);
        push(out, "runAsNonRoot", "runAsNonRoot != true", errs);
        // runAsUser (1.23+)
        let mut errs = Vec::new();
        if psc.and_then(|s| s.get("runAsUser")).and_then(Value::as_i64) == Some(0) {
            errs.push(forbidden(format!("{sc_path}.runAsUser"), "0"));
        }
        for (path, c) in containers(spec) {
            if c.pointer("/securityContext/runAsUser").and_then(Value::as_i64) == Some(0) {
                errs.push(forbidden(format!("{path}.securityContext.runAsUser"), "0"));
            }
        }
        push(out, "runAsUser", "runAsUser=0", errs);
    }
    // seLinuxOptions
    {
        let selinux = |base: &str, se: Option<&Value>, errs: &mut Vec<FieldError>| {
            let Some(se) = se.filter(|s| !s.is_null()) else { return };
            let t = se.get("type").and_then(Value::as_str).unwrap_or("");
            // `container_engine_t` is allowed from 1.31.
            if !SELINUX_TYPES.contains(&t) || (t == "container_engine_t" && minor < 31) {
                errs.push(forbidden(format!("{base}.seLinuxOptions.type"), t));
            }
            for f in ["user", "role"] {
                if let Some(v) = se.get(f).and_then(Value::as_str).filter(|v| !v.is_empty()) {
                    errs.push(forbidden(format!("{base}.seLinuxOptions.{f}"), v));
                }
            }
        };
        let mut errs = Vec::new();
        selinux(sc_path, psc.and_then(|s| s.get("seLinuxOptions")), &mut errs);
        for (path, c) in containers(spec) {
            selinux(&format!("{path}.securityContext"), c.pointer("/securityContext/seLinuxOptions"), &mut errs);
        }
        push(out, "seLinuxOptions", "seLinuxOptions", errs);
    }
    // seccompProfile_baseline. Kyverno's Pod Security library (its fork of
    // k8s.io/pod-security-admission) forbids at baseline every type a profile that is set
    // names other than RuntimeDefault and Localhost — an empty or missing type included, not
    // only Unconfined (checked against Kyverno's CLI).
    let valid = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod_seccomp = profile_type(psc.and_then(|s| s.get("seccompProfile")));
    // The profiles set to a bad type (pod, then containers): baseline's whole finding, and
    // restricted's when there are any.
    let mut bad_setters = Vec::new();
    if let Some(t) = pod_seccomp.filter(|t| !valid(t)) {
        bad_setters.push(forbidden(format!("{sc_path}.seccompProfile.type"), t));
    }
    for (path, c) in containers(spec) {
        if let Some(t) = profile_type(c.pointer("/securityContext/seccompProfile")).filter(|t| !valid(t)) {
            bad_setters.push(forbidden(format!("{path}.securityContext.seccompProfile.type"), t));
        }
    }
    push(out, "seccompProfile_baseline", "seccompProfile", bad_setters.clone());
    // seccompProfile_restricted
    if restricted && !windows {
        // Otherwise the containers that set none, unless a valid pod profile stands for them.
        let errs = if !bad_setters.is_empty() || pod_seccomp.is_some_and(valid) {
            bad_setters
        } else {
            containers(spec)
                .filter(|(_, c)| profile_type(c.pointer("/securityContext/seccompProfile")).is_none())
                .map(|(path, _)| required(format!("{path}.securityContext.seccompProfile.type")))
                .collect()
        };
        push(out, "seccompProfile_restricted", "seccompProfile", errs);
    }
    // sysctls
    {
        let errs = psc
            .and_then(|s| s.get("sysctls"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, x)| {
                let name = x.get("name").and_then(Value::as_str)?;
                let allowed = SAFE_SYSCTLS.contains(&name) && sysctl_since(name) <= minor;
                (!allowed).then(|| forbidden(format!("{sc_path}.sysctls[{i}].name"), name))
            })
            .collect();
        push(out, "sysctls", "forbidden sysctls", errs);
    }
    // windowsHostProcess
    {
        let mut errs = Vec::new();
        if truthy(psc.and_then(|s| s.pointer("/windowsOptions/hostProcess"))) {
            errs.push(forbidden(format!("{sc_path}.windowsOptions.hostProcess"), "true"));
        }
        errs.extend(
            containers(spec)
                .filter(|(_, c)| truthy(c.pointer("/securityContext/windowsOptions/hostProcess")))
                .map(|(path, _)| forbidden(format!("{path}.securityContext.windowsOptions.hostProcess"), "true")),
        );
        push(out, "windowsHostProcess", "hostProcess", errs);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(level: &str, exclude: Value) -> PodSecurityCheck {
        let p: PodSecurity =
            serde_json::from_value(json!({"level": level, "version": "latest", "exclude": exclude})).unwrap();
        PodSecurityCheck::compile(&p, "podSecurity").unwrap()
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    }

    fn with_caps(main: &[&str], init: &[&str]) -> Value {
        pod(json!({
            "containers": [{"name": "app", "image": "registry.test/app:1", "securityContext": {"capabilities": {"add": main}}}],
            "initContainers": [{"name": "setup", "image": "registry.test/app:1", "securityContext": {"capabilities": {"add": init}}}],
        }))
    }

    #[test]
    fn failed_checks_are_worded_as_kyverno_words_them() {
        let c = check("baseline", json!([]));
        let v = c.violations(&pod(json!({
            "hostNetwork": true,
            "containers": [{"name": "a", "image": "x", "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "NET_RAW", "SYS_ADMIN"]}}}],
        })));
        assert_eq!(
            v,
            [
                "(Forbidden reason: non-default capabilities, field error list: [spec.containers[0].securityContext.capabilities.add is forbidden, forbidden values found: [NET_RAW SYS_ADMIN]])",
                "(Forbidden reason: host namespaces, field error list: [spec.hostNetwork is forbidden, forbidden values found: true])",
                "(Forbidden reason: privileged, field error list: [spec.containers[0].securityContext.privileged is forbidden, forbidden values found: true])",
            ]
        );
        let r = check("restricted", json!([]));
        let v = r.violations(&pod(json!({"containers": [{"name": "a", "image": "x", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]})));
        assert_eq!(
            v,
            [
                "(Forbidden reason: runAsNonRoot != true, field error list: [spec.containers[0].securityContext.runAsNonRoot: Required value])"
            ]
        );
        assert!(r.violations(&pod(json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a", "image": "x", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]}))).is_empty());
    }

    /// Checked against Kyverno's CLI (issue 50): a volume with no source is of an unknown type.
    #[test]
    fn a_volume_without_a_source_is_an_unknown_restricted_type() {
        let r = check("restricted", json!([]));
        let v = r.violations(&pod(json!({"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "a", "image": "x", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}],
            "volumes": [{"name": "cache"}, {"name": "e", "emptyDir": {}}]})));
        assert_eq!(
            v,
            ["(Forbidden reason: restricted volume types, field error list: [spec.volumes[0].unknown: Forbidden])"]
        );
    }

    /// Checked against Kyverno's CLI (issue 50): a waived field error is replaced by the last
    /// one, so the errors left come in Kyverno's order.
    #[test]
    fn a_waived_error_leaves_the_others_in_kyvernos_order() {
        let c = check("restricted", json!([{"controlName": "Capabilities", "images": ["nginx*"]}]));
        let p = pod(json!({"containers": [
            {"name": "c0", "image": "nginx:latest"},
            {"name": "c1", "image": "x"},
            {"name": "c2", "image": "y", "securityContext": {"capabilities": {"add": []}}}]}));
        let caps: Vec<String> =
            c.violations(&p).into_iter().filter(|v| v.contains("unrestricted capabilities")).collect();
        assert_eq!(
            caps,
            [
                "(Forbidden reason: unrestricted capabilities, field error list: [spec.containers[2].securityContext.capabilities.drop: Required value, spec.containers[1].securityContext.capabilities.drop: Required value])"
            ]
        );
    }

    /// Found by the Kyverno oracle (issue 50), each checked against Kyverno's CLI: a profile
    /// that is set with an empty or unknown type fails baseline (Verno admitted it), and at
    /// restricted the containers that set none are reported only when nothing set a bad one.
    #[test]
    fn seccomp_profiles_are_judged_as_kyvernos_library_does() {
        let baseline = versioned("baseline", "latest");
        let empty =
            pod(json!({"containers": [{"name": "c", "image": "x", "securityContext": {"seccompProfile": {}}}]}));
        assert_eq!(
            baseline.violations(&empty),
            [
                "(Forbidden reason: seccompProfile, field error list: [spec.containers[0].securityContext.seccompProfile.type: Forbidden])"
            ]
        );
        let bogus = pod(
            json!({"securityContext": {"seccompProfile": {"type": "Bogus"}}, "containers": [{"name": "c", "image": "x"}]}),
        );
        assert_eq!(
            baseline.violations(&bogus),
            [
                "(Forbidden reason: seccompProfile, field error list: [spec.securityContext.seccompProfile.type is forbidden, forbidden values found: Bogus])"
            ]
        );
        assert!(
            baseline
                .violations(&pod(
                    json!({"containers": [{"name": "c", "image": "x", "securityContext": {"seccompProfile": null}}]})
                ))
                .is_empty()
        );
        let restricted = versioned("restricted", "latest");
        let mixed = pod(json!({"containers": [
            {"name": "c", "image": "x", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "d", "image": "x"}]}));
        let seccomp: Vec<String> =
            restricted.violations(&mixed).into_iter().filter(|v| v.contains("seccompProfile,")).collect();
        assert_eq!(
            seccomp,
            [
                "(Forbidden reason: seccompProfile, field error list: [spec.containers[0].securityContext.seccompProfile.type is forbidden, forbidden values found: Unconfined])",
                "(Forbidden reason: seccompProfile, field error list: [spec.containers[0].securityContext.seccompProfile.type is forbidden, forbidden values found: Unconfined])",
            ]
        );
    }

    /// Found by the Kyverno oracle (issue 50): a controller's fields are named in it, the
    /// version is printed as written, and a kind Kyverno reads no pod from is not evaluated.
    #[test]
    fn controllers_name_their_template_fields_and_other_kinds_are_not_pods() {
        let c = versioned("baseline", "");
        let spec = json!({"hostIPC": true, "containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
        let deploy = json!({"kind": "Deployment", "spec": {"template": {"spec": spec}}});
        assert_eq!(
            c.violations(&deploy),
            [
                "(Forbidden reason: host namespaces, field error list: [spec.template.spec.hostIPC is forbidden, forbidden values found: true])",
                "(Forbidden reason: hostPort, field error list: [spec.template.spec.containers[0].ports[0].hostPort is forbidden, forbidden values found: 8080])",
            ]
        );
        let cron = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        assert!(c.violations(&cron)[0].contains("[spec.jobTemplate.spec.template.spec.hostIPC is forbidden"));
        assert!(
            c.message("r", &["(x)".into()])
                .starts_with("Validation rule 'r' failed. It violates PodSecurity \"baseline:\": ")
        );
        assert!(PodSecurityCheck::supports(&deploy));
        assert!(!PodSecurityCheck::supports(&json!({"kind": "ConfigMap", "data": {}})));
        assert!(!PodSecurityCheck::supports(&json!({"kind": "PodTemplate", "template": {"spec": spec}})));
    }

    #[test]
    fn an_exclusion_removes_only_the_field_errors_whose_path_and_values_it_names() {
        let c = check(
            "baseline",
            json!([
                {"controlName": "Capabilities", "images": ["registry.test/*"], "restrictedField": "spec.containers[*].securityContext.capabilities.add", "values": ["foo"]},
                {"controlName": "Capabilities", "images": ["registry.test/*"], "restrictedField": "spec.initContainers[*].securityContext.capabilities.add", "values": ["baz"]},
            ]),
        );
        assert!(c.violations(&with_caps(&["foo"], &["baz"])).is_empty());
        // Every bad value of the field must be among `values`.
        let v = c.violations(&with_caps(&["foo", "bar"], &["baz"]));
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("spec.containers[0].securityContext.capabilities.add"), "{v:?}");
        // The values of one field do not carry over to another.
        assert_eq!(c.violations(&with_caps(&["foo"], &["foo"])).len(), 1);
        // An image the exclusion does not name is not excluded.
        let mut other = with_caps(&["foo"], &["baz"]);
        other["spec"]["containers"][0]["image"] = json!("elsewhere.test/app:1");
        assert_eq!(c.violations(&other).len(), 1);
    }

    #[test]
    fn a_pod_level_exclusion_names_pod_fields() {
        let c = check(
            "baseline",
            json!([{"controlName": "Host Namespaces", "restrictedField": "spec.hostNetwork", "values": ["true"]}]),
        );
        let one = pod(json!({"hostNetwork": true, "containers": [{"name": "a", "image": "x"}]}));
        assert!(c.violations(&one).is_empty());
        let two = pod(json!({"hostNetwork": true, "hostPID": true, "containers": [{"name": "a", "image": "x"}]}));
        assert_eq!(
            c.violations(&two),
            [
                "(Forbidden reason: host namespaces, field error list: [spec.hostPID is forbidden, forbidden values found: true])"
            ]
        );
        // Naming images makes it a container-level exclusion, which pod fields never match.
        let c = check("baseline", json!([{"controlName": "Host Namespaces", "images": ["*"]}]));
        assert_eq!(c.violations(&one).len(), 1);
        // A whole control, without a field: every error of it goes.
        let c = check("baseline", json!([{"controlName": "Host Namespaces"}]));
        assert!(c.violations(&two).is_empty());
    }

    fn versioned(level: &str, version: &str) -> PodSecurityCheck {
        let p: PodSecurity = serde_json::from_value(json!({"level": level, "version": version})).unwrap();
        PodSecurityCheck::compile(&p, "podSecurity").unwrap()
    }

    /// A restricted Linux pod except for what the 1.22, 1.23 and 1.19 checks ask.
    fn nearly_restricted() -> Value {
        pod(json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0},
            "containers": [{"name": "a", "image": "x", "securityContext": {"allowPrivilegeEscalation": false}}]}))
    }

    /// Checked against Kyverno's CLI (issue 50): every check applies at every version in its
    /// first form (runAsUser, added in 1.23, at v1.19 too); later forms from their version.
    #[test]
    fn a_pinned_version_applies_every_check_and_later_forms_from_their_version() {
        let ids = |c: &PodSecurityCheck, p: &Value| c.failed(p).iter().map(|r| r.id).collect::<Vec<_>>();
        let p = nearly_restricted();
        for v in ["v1.19", "v1.22", "latest"] {
            assert_eq!(
                ids(&versioned("restricted", v), &p),
                ["capabilities_restricted", "runAsUser", "seccompProfile_restricted"],
                "{v}"
            );
        }
        // Sysctls and SELinux types allowed from a version on.
        let sysctl =
            pod(json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}]},
            "containers": [{"name": "a", "image": "x"}]}));
        assert_eq!(ids(&versioned("baseline", "v1.31"), &sysctl), ["sysctls"]);
        assert!(ids(&versioned("baseline", "v1.32"), &sysctl).is_empty());
        let engine = pod(
            json!({"containers": [{"name": "a", "image": "x", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}}]}),
        );
        assert_eq!(ids(&versioned("baseline", "v1.30"), &engine), ["seLinuxOptions"]);
        assert!(ids(&versioned("baseline", "latest"), &engine).is_empty());
    }

    /// No false denials: from 1.25 a Windows pod is not asked for Linux-only settings (the
    /// API server refuses seccomp and capabilities on it, so before this no Windows pod could
    /// pass a restricted policy).
    #[test]
    fn windows_pods_are_exempt_from_the_linux_only_restricted_checks() {
        let windows = pod(json!({"os": {"name": "windows"}, "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "a", "image": "x"}]}));
        let r = versioned("restricted", "latest");
        assert!(r.violations(&windows).is_empty(), "{:?}", r.violations(&windows));
        let old: Vec<&str> = versioned("restricted", "v1.24").failed(&windows).iter().map(|x| x.id).collect();
        assert_eq!(old, ["allowPrivilegeEscalation", "capabilities_restricted", "seccompProfile_restricted"]);
    }

    /// Kubernetes 1.34's check: a probe or lifecycle handler may not name a host (baseline).
    #[test]
    fn probe_and_lifecycle_hosts_are_refused_at_every_version() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x",
            "livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]}));
        assert_eq!(
            versioned("baseline", "latest").violations(&p),
            ["(Forbidden reason: probe or lifecycle host, field error list: [])"]
        );
        // Added in 1.34, applied at v1.25 too, as Kyverno's CLI shows.
        assert_eq!(versioned("baseline", "v1.25").violations(&p).len(), 1);
        let fine =
            pod(json!({"containers": [{"name": "a", "image": "x", "readinessProbe": {"tcpSocket": {"port": 80}}}]}));
        assert!(versioned("baseline", "latest").violations(&fine).is_empty());
    }
}
