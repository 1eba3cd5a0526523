//! Autogen: rules written for Pods also cover the Pod controllers. Rules are derived
//! at compile time: `autogen-<rule>` for Deployment, DaemonSet, Job, StatefulSet, ReplicaSet and
//! ReplicationController, and `autogen-cronjob-<rule>` for CronJob.

use serde_json::{Value, json};
use verno_api::{ClusterPolicy, MatchResources, ResourceDescription, Rule};

pub const ANNOTATION: &str = "pod-policies.kyverno.io/autogen-controllers";

/// In the order of their kind names, which is the order Kyverno lists an autogen rule's kinds.
const CONTROLLERS: &[(&str, &str)] = &[
    ("DaemonSet", "apps/v1/DaemonSet"),
    ("Deployment", "apps/v1/Deployment"),
    ("Job", "batch/v1/Job"),
    ("ReplicaSet", "apps/v1/ReplicaSet"),
    ("ReplicationController", "v1/ReplicationController"),
    ("StatefulSet", "apps/v1/StatefulSet"),
];

fn descriptions(m: &MatchResources) -> Vec<&ResourceDescription> {
    let mut v: Vec<&ResourceDescription> = Vec::new();
    if let Some(r) = &m.resources {
        v.push(r);
    }
    for f in m.any.iter().flatten().chain(m.all.iter().flatten()) {
        v.push(&f.resources);
    }
    v
}

fn eligible_description(d: &ResourceDescription) -> bool {
    let has_pod = d.kinds.iter().any(|k| k == "Pod");
    d.name.is_none()
        && d.names.is_empty()
        && d.selector.is_none()
        && d.annotations.is_empty()
        && !(has_pod && d.kinds.len() > 1)
}

fn uses_json6902(rule: &Rule) -> bool {
    rule.mutate.as_ref().is_some_and(|m| {
        m.patches_json6902.is_some()
            || m.foreach.as_ref().is_some_and(|f| f.iter().any(|x| x.patches_json6902.is_some()))
    })
}

/// The controllers autogen applies to for this policy, or `None` when it does not apply.
pub fn controllers(policy: &ClusterPolicy) -> Option<(Vec<&'static str>, bool)> {
    let spec = &policy.spec;
    if spec.rules.iter().any(|r| r.generate.is_some() || uses_json6902(r)) {
        return None;
    }
    for r in &spec.rules {
        let mut ds = descriptions(&r.match_);
        if let Some(e) = &r.exclude {
            ds.extend(descriptions(e));
        }
        if !ds.iter().all(|d| eligible_description(d)) {
            return None;
        }
    }
    let annotation = policy.metadata.annotations.get(ANNOTATION).map(String::as_str);
    let (list, cronjob): (Vec<&'static str>, bool) = match annotation {
        None | Some("") => (CONTROLLERS.iter().map(|c| c.0).collect(), true),
        Some("none") => return None,
        Some("all") => (CONTROLLERS.iter().map(|c| c.0).collect(), true),
        Some(s) => {
            let names: Vec<&str> = s.split(',').map(str::trim).collect();
            (CONTROLLERS.iter().map(|c| c.0).filter(|c| names.contains(c)).collect(), names.contains(&"CronJob"))
        }
    };
    if list.is_empty() && !cronjob {
        return None;
    }
    Some((list, cronjob))
}

fn matches_pod(m: &MatchResources) -> bool {
    descriptions(m).iter().any(|d| d.kinds.iter().any(|k| k == "Pod"))
}

fn truncate(name: String) -> String {
    name.chars().take(63).collect()
}

/// The autogen rules for a policy (to be appended after its own rules).
pub fn rules(policy: &ClusterPolicy) -> Vec<Rule> {
    let Some((ctrls, cronjob)) = controllers(policy) else { return Vec::new() };
    let mut out = Vec::new();
    for rule in policy.spec.rules.iter().filter(|r| !r.name.starts_with("autogen-")) {
        if !matches_pod(&rule.match_) {
            continue;
        }
        if let Some(e) = &rule.exclude {
            let ek: Vec<&String> = descriptions(e).iter().flat_map(|d| d.kinds.iter()).collect();
            if !ek.is_empty() && !ek.iter().any(|k| *k == "Pod") {
                continue;
            }
        }
        let kinds: Vec<String> = CONTROLLERS.iter().filter(|c| ctrls.contains(&c.0)).map(|c| c.1.to_string()).collect();
        let ctrl_rule = derive(rule, &format!("autogen-{}", rule.name), &kinds, Shift::Template);
        if !kinds.is_empty()
            && let Some(r) = ctrl_rule.clone()
        {
            out.push(r);
        }
        if cronjob {
            // The CronJob rule wraps the controller rule once more.
            let base =
                derive(rule, &format!("autogen-{}", rule.name), &["batch/v1/CronJob".to_string()], Shift::Template);
            if let Some(b) = base
                && let Some(r) = derive(
                    &b,
                    &format!("autogen-cronjob-{}", rule.name),
                    &["batch/v1/CronJob".to_string()],
                    Shift::JobTemplate,
                )
            {
                out.push(r);
            }
        }
    }
    out
}

#[derive(Clone, Copy)]
pub(crate) enum Shift {
    Template,
    JobTemplate,
}

/// `object.spec…` / `object.metadata…` (not `request.object`) moved under the pod template.
pub(crate) fn shift_cel(v: &Value, shift: Shift) -> Option<Value> {
    static TEMPLATE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    static JOB: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let text = serde_json::to_string(v).ok()?;
    let out = match shift {
        Shift::Template => {
            let re = TEMPLATE
                .get_or_init(|| regex::Regex::new(r"(^|[^.\w])(object|oldObject)\.(spec|metadata)\b").ok())
                .as_ref()?;
            re.replace_all(&text, |c: &regex::Captures| {
                let field = c.get(3).map(|m| m.as_str()).unwrap_or("");
                // As Kyverno: `object.metadata.namespace` stays on the controller itself (pod
                // templates carry no namespace).
                let whole = c.get(0).map(|m| (m.as_str(), m.end())).unwrap_or(("", 0));
                if text.get(whole.1..).is_some_and(|rest| rest.starts_with(".namespace")) {
                    return whole.0.to_string();
                }
                format!(
                    "{}{}.spec.template.{field}",
                    c.get(1).map(|m| m.as_str()).unwrap_or(""),
                    c.get(2).map(|m| m.as_str()).unwrap_or("")
                )
            })
            .into_owned()
        }
        Shift::JobTemplate => {
            let re = JOB
                .get_or_init(|| regex::Regex::new(r"(^|[^.\w])(object|oldObject)\.spec\.template\b").ok())
                .as_ref()?;
            re.replace_all(&text, |c: &regex::Captures| {
                format!(
                    "{}{}.spec.jobTemplate.spec.template",
                    c.get(1).map(|m| m.as_str()).unwrap_or(""),
                    c.get(2).map(|m| m.as_str()).unwrap_or("")
                )
            })
            .into_owned()
        }
    };
    serde_json::from_str(&out).ok()
}

fn derive(rule: &Rule, name: &str, kinds: &[String], shift: Shift) -> Option<Rule> {
    let mut v = serde_json::to_value(rule).ok()?;
    // Rewrite variable paths over the whole rule text.
    let text = serde_json::to_string(&v).ok()?;
    let text = match shift {
        Shift::Template => text
            .replace("request.object.spec", "request.object.spec.template.spec")
            .replace("request.oldObject.spec", "request.oldObject.spec.template.spec")
            .replace("request.object.metadata", "request.object.spec.template.metadata")
            .replace("request.oldObject.metadata", "request.oldObject.spec.template.metadata"),
        Shift::JobTemplate => text
            .replace("request.object.spec.template", "request.object.spec.jobTemplate.spec.template")
            .replace("request.oldObject.spec.template", "request.oldObject.spec.jobTemplate.spec.template"),
    };
    v = serde_json::from_str(&text).ok()?;
    let obj = v.as_object_mut()?;
    // CEL reads `object` / `oldObject` directly: shift those paths inside CEL parts only.
    if let Some(cel) = obj.get_mut("validate").and_then(|x| x.get_mut("cel")) {
        *cel = shift_cel(cel, shift)?;
    }
    if let Some(pre) = obj.get_mut("celPreconditions") {
        *pre = shift_cel(pre, shift)?;
    }
    obj.insert("name".into(), Value::String(truncate(name.to_string())));
    if let Some(m) = obj.get_mut("match") {
        rewrite_kinds(m, kinds, false);
    }
    if let Some(e) = obj.get_mut("exclude") {
        rewrite_kinds(e, kinds, true);
    }
    let wrap = |p: Value| match shift {
        Shift::Template => json!({"spec": {"template": p}}),
        Shift::JobTemplate => json!({"spec": {"jobTemplate": p}}),
    };
    if let Some(val) = obj.get_mut("validate").and_then(Value::as_object_mut) {
        if let Some(p) = val.remove("pattern") {
            val.insert("pattern".into(), wrap(p));
        }
        if let Some(Value::Array(ps)) = val.remove("anyPattern") {
            val.insert("anyPattern".into(), Value::Array(ps.into_iter().map(wrap).collect()));
        }
    }
    if let Some(m) = obj.get_mut("mutate").and_then(Value::as_object_mut) {
        if let Some(p) = m.remove("patchStrategicMerge") {
            m.insert("patchStrategicMerge".into(), wrap(p));
        }
        if let Some(Value::Array(fs)) = m.get_mut("foreach") {
            for f in fs.iter_mut() {
                if let Some(f) = f.as_object_mut()
                    && let Some(p) = f.remove("patchStrategicMerge")
                {
                    f.insert("patchStrategicMerge".into(), wrap(p));
                }
            }
        }
    }
    serde_json::from_value(v).ok()
}

fn rewrite_kinds(m: &mut Value, kinds: &[String], exclude: bool) {
    let new_kinds = Value::Array(kinds.iter().map(|k| Value::String(k.clone())).collect());
    let has_pod = |r: &Value| r.get("kinds").and_then(Value::as_array).is_some_and(|a| a.iter().any(|k| k == "Pod"));
    if let Some(res) = m.get_mut("resources") {
        let nonempty = res.get("kinds").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if (!exclude || nonempty)
            && res.is_object()
            && let Some(o) = res.as_object_mut()
        {
            o.insert("kinds".into(), new_kinds.clone());
        }
    }
    for key in ["any", "all"] {
        if let Some(Value::Array(fs)) = m.get_mut(key) {
            for f in fs.iter_mut() {
                if let Some(res) = f.get_mut("resources")
                    && has_pod(res)
                    && let Some(o) = res.as_object_mut()
                {
                    o.insert("kinds".into(), new_kinds.clone());
                }
            }
        }
    }
}
