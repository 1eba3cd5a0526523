//! ClusterPolicy / Policy / PolicyException objects from the cluster → a compiled
//! [`PolicySet`], and the `status` each policy should show.
//!
//! Compilation is cached by (uid, generation): status writes and label edits do not recompile.
//! A policy that fails to compile keeps its last good version in force (if it had one) and
//! reports the error, with the field path, in its `Ready` condition.

use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use verno_engine::RuleBody;
use verno_engine::{Compiled, CompiledException, CompiledPolicy, DocumentError, Kind, NamespaceLabels, PolicySet};

/// The API resource (served version and plural) Verno watches for a kind.
pub fn resource(kind: Kind) -> ApiResource {
    let version = match kind {
        Kind::PolicyException | Kind::CleanupPolicy | Kind::ClusterCleanupPolicy => "v2",
        _ => "v1",
    };
    let group = kind.group().as_str();
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.name().into(),
        plural: verno_engine::plural(kind.name()),
    }
}

pub fn cluster_policy_resource() -> ApiResource {
    resource(Kind::ClusterPolicy)
}

pub fn policy_resource() -> ApiResource {
    resource(Kind::Policy)
}

pub fn exception_resource() -> ApiResource {
    resource(Kind::PolicyException)
}

/// `ClusterPolicy/name` or `Policy/ns/name`.
pub fn object_key(kind: Kind, o: &DynamicObject) -> String {
    match &o.metadata.namespace {
        Some(ns) if kind.is_namespaced() => format!("{kind}/{ns}/{}", o.metadata.name.as_deref().unwrap_or("")),
        _ => format!("{kind}/{}", o.metadata.name.as_deref().unwrap_or("")),
    }
}

struct Entry {
    uid: String,
    generation: i64,
    result: Result<Arc<CompiledPolicy>, DocumentError>,
    /// The last version that compiled, kept in force while a newer one is broken.
    last_good: Option<Arc<CompiledPolicy>>,
    /// The status this version should show and its error text, worked out once per compile.
    status: Value,
    error: Option<String>,
}

/// What a policy's status should say.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyStatus {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
    /// `None` when ready; else the error with its field path.
    pub error: Option<String>,
    pub status: Value,
    /// The live object's status, to write only on change.
    pub live: Option<Value>,
}

#[derive(Default)]
pub struct Compiler {
    cache: HashMap<String, Entry>,
}

/// Compiles a stored policy through the engine's front door.
fn compile(kind: Kind, o: &DynamicObject) -> Result<CompiledPolicy, DocumentError> {
    let v = serde_json::to_value(o).map_err(|e| DocumentError::Decode(e.to_string()))?;
    match verno_engine::compile_stored(kind, &resource(kind).api_version, &v)? {
        Compiled::Policy(p) => Ok(p),
        Compiled::Exception(_) => Err(DocumentError::Decode(format!("a {kind} is not a policy"))),
    }
}

fn rule_counts(p: Option<&CompiledPolicy>) -> Value {
    let (mut validate, mut mutate, mut generate, mut verify) = (0, 0, 0, 0);
    for r in p.map(|p| p.rules.as_slice()).unwrap_or(&[]).iter().filter(|r| r.autogen_of.is_none()) {
        match &r.body {
            RuleBody::Validate(_) => validate += 1,
            RuleBody::Mutate(_) => mutate += 1,
            RuleBody::Generate(_) => generate += 1,
            RuleBody::Unsupported { .. } => verify += 1,
        }
    }
    json!({"validate": validate, "mutate": mutate, "generate": generate, "verifyimages": verify})
}

impl Compiler {
    /// Compiles what changed and returns the set (with `exceptions` and the live namespace
    /// labels) plus every policy's desired status.
    pub fn build(
        &mut self,
        policies: &[(Kind, Arc<DynamicObject>)],
        exceptions: &[(Kind, Arc<DynamicObject>)],
        namespaces: Arc<NamespaceLabels>,
    ) -> (PolicySet, Vec<PolicyStatus>) {
        let mut compiled = Vec::new();
        let mut statuses = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (kind, o) in policies {
            let key = object_key(*kind, o);
            seen.insert(key.clone());
            let uid = o.metadata.uid.clone().unwrap_or_default();
            let generation = o.metadata.generation.unwrap_or(0);
            let fresh = self.cache.get(&key).is_some_and(|e| e.uid == uid && e.generation == generation);
            if !fresh {
                let last_good = self
                    .cache
                    .get(&key)
                    .filter(|e| e.uid == uid)
                    .and_then(|e| e.result.as_ref().ok().cloned().or_else(|| e.last_good.clone()));
                let result = compile(*kind, o).map(Arc::new);
                if let Err(e) = &result {
                    tracing::warn!(policy = %key, error = %e.with_path(), "policy does not compile; its previous version stays in force");
                }
                let (status, error) = desired_status(*kind, generation, &result, last_good.is_some());
                self.cache.insert(key.clone(), Entry { uid, generation, result, last_good, status, error });
            }
            let Some(entry) = self.cache.get(&key) else { continue };
            let in_force = entry.result.as_ref().ok().or(entry.last_good.as_ref());
            if let Some(p) = in_force {
                compiled.push(p.clone());
            }
            statuses.push(PolicyStatus {
                kind: *kind,
                namespace: o.metadata.namespace.clone().filter(|_| kind.is_namespaced()),
                name: o.metadata.name.clone().unwrap_or_default(),
                error: entry.error.clone(),
                status: entry.status.clone(),
                live: o.data.get("status").cloned(),
            });
        }
        self.cache.retain(|k, _| seen.contains(k));
        let mut excs: Vec<CompiledException> = Vec::new();
        for (kind, e) in exceptions {
            let Ok(v) = serde_json::to_value(&**e) else { continue };
            match verno_engine::compile_stored(*kind, &resource(*kind).api_version, &v) {
                Ok(Compiled::Exception(c)) => excs.push(c),
                Ok(Compiled::Policy(_)) => {}
                Err(err) => {
                    tracing::warn!(exception = %e.metadata.name.as_deref().unwrap_or(""), error = %err, "PolicyException ignored")
                }
            }
        }
        (PolicySet::new(compiled, excs).with_live_namespaces(namespaces), statuses)
    }
}

/// Where a kind keeps its conditions: Kyverno's policies in `status.conditions`, the CEL kinds
/// in `status.conditionStatus.conditions`.
fn conditions_at(kind: Kind) -> &'static str {
    match kind {
        Kind::ClusterPolicy | Kind::Policy => "/conditions",
        _ => "/conditionStatus/conditions",
    }
}

/// The status a compile result should show, and the error text when it failed.
fn desired_status(
    kind: Kind,
    generation: i64,
    result: &Result<Arc<CompiledPolicy>, DocumentError>,
    kept_previous: bool,
) -> (Value, Option<String>) {
    let (ready, reason, message, error) = match result {
        Ok(_) => (true, "Succeeded", "Ready".to_string(), None),
        Err(err) => {
            let text = err.with_path();
            let kept = if kept_previous { " (the previous version stays in force)" } else { "" };
            (false, "Failed", format!("policy is invalid: {text}{kept}"), Some(text))
        }
    };
    if !matches!(kind, Kind::ClusterPolicy | Kind::Policy) {
        // As Kyverno writes a CEL policy's status: `conditionStatus` with a WebhookConfigured
        // condition (Verno serves every policy that compiles); the error, if any, in `message`.
        let (status, reason, condition_message) = match result {
            Ok(_) => ("True", "Succeeded", "Webhook configured."),
            Err(_) => ("False", "Failed", "Policy is not configured in the webhook."),
        };
        let status = json!({"conditionStatus": {
            "ready": ready,
            "conditions": [{"type": "WebhookConfigured", "status": status, "reason": reason, "message": condition_message, "observedGeneration": generation}],
            "message": if ready { String::new() } else { message },
        }});
        return (status, error);
    }
    let compiled = result.as_ref().ok().map(|p| &**p);
    let autogen: Vec<Value> = compiled
        .map(|p| p.autogen_rules())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    let mut status = json!({
        "ready": ready,
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": reason, "message": message, "observedGeneration": generation}],
        "rulecount": rule_counts(compiled),
    });
    // Kyverno writes `autogen: {}` when no rule was generated.
    if let Some(m) = status.as_object_mut() {
        m.insert("autogen".into(), if autogen.is_empty() { json!({}) } else { json!({"rules": autogen}) });
    }
    (status, error)
}

/// The status without `lastTransitionTime`, for comparison.
fn comparable(v: &Value, at: &str) -> Value {
    let mut v = v.clone();
    if let Some(conds) = v.pointer_mut(at).and_then(Value::as_array_mut) {
        for c in conds.iter_mut().filter_map(Value::as_object_mut) {
            c.remove("lastTransitionTime");
        }
    }
    v
}

impl PolicyStatus {
    /// The status to write, or `None` when the live one already says it. The condition's
    /// `lastTransitionTime` moves only when its `status` does.
    pub fn to_write(&self) -> Option<Value> {
        let at = conditions_at(self.kind);
        if self.live.as_ref().map(|l| comparable(l, at)) == Some(comparable(&self.status, at)) {
            return None;
        }
        let mut out = self.status.clone();
        let first = format!("{at}/0");
        let old_cond = self.live.as_ref().and_then(|l| l.pointer(&first)).cloned();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        if let Some(c) = out.pointer_mut(&first).and_then(Value::as_object_mut) {
            let same = old_cond.as_ref().and_then(|o| o.get("status")) == c.get("status");
            let at = old_cond
                .as_ref()
                .and_then(|o| o.get("lastTransitionTime"))
                .filter(|_| same)
                .cloned()
                .unwrap_or(Value::String(now));
            c.insert("lastTransitionTime".into(), at);
        }
        Some(out)
    }
}
