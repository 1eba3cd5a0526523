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
        let version = if p.version.is_empty() { "latest".to_string() } else { p.version.clone() };
        Ok(PodSecurityCheck { level, version, exclude: p.exclude.clone() })
    }

    pub fn level_name(&self) -> &'static str {
        match self.level {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// The violated controls, as `(control name, detail)`, after exclusions.
    pub fn violations(&self, resource: &Value) -> Vec<(String, String)> {
        let Some((meta, spec)) = pod_parts(resource) else { return Vec::new() };
        let mut out = Vec::new();
        if self.level >= Level::Baseline {
            baseline(meta, spec, &mut out);
        }
        if self.level >= Level::Restricted {
            restricted(spec, &mut out);
        }
        out.retain(|v| !self.excluded(v));
        out.into_iter().map(|v| (v.control.to_string(), v.detail)).collect()
    }

    fn excluded(&self, v: &Violation) -> bool {
        self.exclude.iter().any(|e| {
            if !e.control_name.eq_ignore_ascii_case(v.control) {
                return false;
            }
            if v.images.is_empty() || e.images.is_empty() {
                return e.images.is_empty() || v.images.is_empty();
            }
            v.images.iter().all(|img| e.images.iter().any(|p| wildcard::matches(p, img)))
        })
    }
}

struct Violation {
    control: &'static str,
    detail: String,
    images: Vec<String>,
}

fn pod_parts(r: &Value) -> Option<(&Value, &Value)> {
    match r.get("kind").and_then(Value::as_str)? {
        "Pod" => Some((r.get("metadata")?, r.get("spec")?)),
        "CronJob" => {
            let t = r.pointer("/spec/jobTemplate/spec/template")?;
            Some((t.get("metadata").unwrap_or(&Value::Null), t.get("spec")?))
        }
        _ => {
            let t = r.pointer("/spec/template")?;
            Some((t.get("metadata").unwrap_or(&Value::Null), t.get("spec")?))
        }
    }
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|f| spec.get(f).and_then(Value::as_array))
        .flatten()
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

fn push(out: &mut Vec<Violation>, control: &'static str, detail: String, images: Vec<String>) {
    out.push(Violation { control, detail, images });
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
];
const SELINUX_TYPES: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];
const RESTRICTED_VOLUMES: &[&str] =
    &["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

fn baseline(meta: &Value, spec: &Value, out: &mut Vec<Violation>) {
    let psc = spec.get("securityContext");
    if truthy(psc.and_then(|s| s.pointer("/windowsOptions/hostProcess")))
        || containers(spec).any(|c| truthy(c.pointer("/securityContext/windowsOptions/hostProcess")))
    {
        push(out, "HostProcess", "hostProcess must not be true".into(), vec![]);
    }
    for f in ["hostNetwork", "hostPID", "hostIPC"] {
        if truthy(spec.get(f)) {
            push(out, "Host Namespaces", format!("{f}=true"), vec![]);
        }
    }
    for c in containers(spec) {
        if truthy(c.pointer("/securityContext/privileged")) {
            push(
                out,
                "Privileged Containers",
                format!("container {:?} must not set securityContext.privileged=true", cname(c)),
                vec![cimage(c)],
            );
        }
        if let Some(add) = c.pointer("/securityContext/capabilities/add").and_then(Value::as_array) {
            let bad: Vec<&str> = add.iter().filter_map(Value::as_str).filter(|a| !BASELINE_CAPS.contains(a)).collect();
            if !bad.is_empty() {
                push(
                    out,
                    "Capabilities",
                    format!("container {:?} must not include {:?} in securityContext.capabilities.add", cname(c), bad),
                    vec![cimage(c)],
                );
            }
        }
        if c.get("ports")
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(|p| p.get("hostPort").and_then(Value::as_i64).unwrap_or(0) != 0))
        {
            push(out, "Host Ports", format!("container {:?} uses hostPort", cname(c)), vec![cimage(c)]);
        }
        if c.pointer("/securityContext/procMount").and_then(Value::as_str).is_some_and(|m| m != "Default") {
            push(
                out,
                "/proc Mount Type",
                format!("container {:?} must not set securityContext.procMount", cname(c)),
                vec![cimage(c)],
            );
        }
        if c.pointer("/securityContext/seccompProfile/type").and_then(Value::as_str) == Some("Unconfined") {
            push(
                out,
                "Seccomp",
                format!("container {:?} must not set securityContext.seccompProfile.type to \"Unconfined\"", cname(c)),
                vec![cimage(c)],
            );
        }
        if let Some(t) = c.pointer("/securityContext/appArmorProfile/type").and_then(Value::as_str)
            && t != "RuntimeDefault"
            && t != "Localhost"
        {
            push(
                out,
                "AppArmor",
                format!("container {:?} must not set appArmorProfile.type={t}", cname(c)),
                vec![cimage(c)],
            );
        }
        if let Some(se) = c.pointer("/securityContext/seLinuxOptions")
            && selinux_bad(se)
        {
            push(out, "SELinux", format!("container {:?} sets forbidden seLinuxOptions", cname(c)), vec![cimage(c)]);
        }
    }
    if spec.get("volumes").and_then(Value::as_array).is_some_and(|vs| vs.iter().any(|v| v.get("hostPath").is_some())) {
        push(out, "HostPath Volumes", "hostPath volumes are forbidden".into(), vec![]);
    }
    if psc.and_then(|s| s.pointer("/seccompProfile/type")).and_then(Value::as_str) == Some("Unconfined") {
        push(out, "Seccomp", "pod must not set securityContext.seccompProfile.type to \"Unconfined\"".into(), vec![]);
    }
    if let Some(t) = psc.and_then(|s| s.pointer("/appArmorProfile/type")).and_then(Value::as_str)
        && t != "RuntimeDefault"
        && t != "Localhost"
    {
        push(out, "AppArmor", format!("pod must not set appArmorProfile.type={t}"), vec![]);
    }
    if let Some(se) = psc.and_then(|s| s.get("seLinuxOptions"))
        && selinux_bad(se)
    {
        push(out, "SELinux", "pod sets forbidden seLinuxOptions".into(), vec![]);
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        for (k, v) in ann {
            if k.starts_with("container.apparmor.security.beta.kubernetes.io/") {
                let v = v.as_str().unwrap_or("");
                if v != "runtime/default" && !v.starts_with("localhost/") {
                    push(out, "AppArmor", format!("annotation {k}={v} is forbidden"), vec![]);
                }
            }
        }
    }
    if let Some(s) = psc.and_then(|s| s.get("sysctls")).and_then(Value::as_array) {
        let bad: Vec<&str> = s
            .iter()
            .filter_map(|x| x.get("name").and_then(Value::as_str))
            .filter(|n| !SAFE_SYSCTLS.contains(n))
            .collect();
        if !bad.is_empty() {
            push(out, "Sysctls", format!("forbidden sysctls {bad:?}"), vec![]);
        }
    }
}

fn selinux_bad(se: &Value) -> bool {
    let t = se.get("type").and_then(Value::as_str).unwrap_or("");
    !SELINUX_TYPES.contains(&t)
        || se.get("user").and_then(Value::as_str).is_some_and(|u| !u.is_empty())
        || se.get("role").and_then(Value::as_str).is_some_and(|r| !r.is_empty())
}

fn restricted(spec: &Value, out: &mut Vec<Violation>) {
    if let Some(vs) = spec.get("volumes").and_then(Value::as_array) {
        for v in vs {
            if let Some(o) = v.as_object()
                && let Some(t) = o.keys().find(|k| *k != "name" && !RESTRICTED_VOLUMES.contains(&k.as_str()))
            {
                push(
                    out,
                    "Volume Types",
                    format!(
                        "volume {:?} uses restricted volume type {t:?}",
                        o.get("name").and_then(Value::as_str).unwrap_or("")
                    ),
                    vec![],
                );
            }
        }
    }
    let psc = spec.get("securityContext");
    let pod_non_root = psc.and_then(|s| s.get("runAsNonRoot")).and_then(Value::as_bool);
    let pod_user_zero = psc.and_then(|s| s.get("runAsUser")).and_then(Value::as_i64) == Some(0);
    let pod_seccomp = psc.and_then(|s| s.pointer("/seccompProfile/type")).and_then(Value::as_str);
    if pod_user_zero {
        push(out, "Running as Non-root user", "pod must not set runAsUser=0".into(), vec![]);
    }
    for c in containers(spec) {
        let sc = c.get("securityContext");
        if sc.and_then(|s| s.get("allowPrivilegeEscalation")).and_then(Value::as_bool) != Some(false) {
            push(
                out,
                "Privilege Escalation",
                format!("container {:?} must set securityContext.allowPrivilegeEscalation=false", cname(c)),
                vec![cimage(c)],
            );
        }
        let c_non_root = sc.and_then(|s| s.get("runAsNonRoot")).and_then(Value::as_bool);
        if c_non_root == Some(false) || (c_non_root.is_none() && pod_non_root != Some(true)) {
            push(
                out,
                "Running as Non-root",
                format!("container {:?} must set securityContext.runAsNonRoot=true", cname(c)),
                vec![cimage(c)],
            );
        }
        if sc.and_then(|s| s.get("runAsUser")).and_then(Value::as_i64) == Some(0) {
            push(
                out,
                "Running as Non-root user",
                format!("container {:?} must not set runAsUser=0", cname(c)),
                vec![cimage(c)],
            );
        }
        let cs = sc.and_then(|s| s.pointer("/seccompProfile/type")).and_then(Value::as_str).or(pod_seccomp);
        if !matches!(cs, Some("RuntimeDefault" | "Localhost")) {
            push(
                out,
                "Seccomp",
                format!(
                    "container {:?} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                    cname(c)
                ),
                vec![cimage(c)],
            );
        }
        let drops_all = sc
            .and_then(|s| s.pointer("/capabilities/drop"))
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        let adds_bad = sc
            .and_then(|s| s.pointer("/capabilities/add"))
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE"));
        if !drops_all || adds_bad {
            push(
                out,
                "Capabilities",
                format!(
                    "container {:?} must set securityContext.capabilities.drop=[\"ALL\"] and add only NET_BIND_SERVICE",
                    cname(c)
                ),
                vec![cimage(c)],
            );
        }
    }
}
