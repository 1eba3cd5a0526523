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
use verno_engine::policy::RuleBody;
use verno_engine::{CompileError, CompiledException, CompiledPolicy};
use verno_server::admission::{NamespaceLabels, PolicySet};

pub fn cluster_policy_resource() -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v1".into(),
        api_version: "kyverno.io/v1".into(),
        kind: "ClusterPolicy".into(),
        plural: "clusterpolicies".into(),
    }
}

pub fn policy_resource() -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v1".into(),
        api_version: "kyverno.io/v1".into(),
        kind: "Policy".into(),
        plural: "policies".into(),
    }
}

pub fn exception_resource() -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v2".into(),
        api_version: "kyverno.io/v2".into(),
        kind: "PolicyException".into(),
        plural: "policyexceptions".into(),
    }
}

/// `ClusterPolicy/name` or `Policy/ns/name`.
pub fn object_key(kind: &str, o: &DynamicObject) -> String {
    match &o.metadata.namespace {
        Some(ns) if kind != "ClusterPolicy" => format!("{kind}/{ns}/{}", o.metadata.name.as_deref().unwrap_or("")),
        _ => format!("{kind}/{}", o.metadata.name.as_deref().unwrap_or("")),
    }
}

struct Entry {
    uid: String,
    generation: i64,
    result: Result<Arc<CompiledPolicy>, CompileError>,
    /// The last version that compiled, kept in force while a newer one is broken.
    last_good: Option<Arc<CompiledPolicy>>,
    /// The status this version should show and its error text, worked out once per compile.
    status: Value,
    error: Option<String>,
}

/// What a policy's status should say.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyStatus {
    pub kind: String,
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

fn compile(kind: &str, o: &DynamicObject) -> Result<CompiledPolicy, CompileError> {
    let v = serde_json::to_value(o).map_err(|e| CompileError::new("", e.to_string()))?;
    verno_server::admission::compile_policy_object(kind, &v)
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
        policies: &[(&str, Arc<DynamicObject>)],
        exceptions: &[Arc<DynamicObject>],
        namespaces: Arc<NamespaceLabels>,
    ) -> (PolicySet, Vec<PolicyStatus>) {
        let mut compiled = Vec::new();
        let mut statuses = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (kind, o) in policies {
            let key = object_key(kind, o);
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
                let result = compile(kind, o).map(Arc::new);
                if let Err(e) = &result {
                    tracing::warn!(policy = %key, path = %e.path, error = %e.message, "policy does not compile; its previous version stays in force");
                }
                let (status, error) = desired_status(generation, &result, last_good.is_some());
                self.cache.insert(key.clone(), Entry { uid, generation, result, last_good, status, error });
            }
            let Some(entry) = self.cache.get(&key) else { continue };
            let in_force = entry.result.as_ref().ok().or(entry.last_good.as_ref());
            if let Some(p) = in_force {
                compiled.push((**p).clone());
            }
            statuses.push(PolicyStatus {
                kind: kind.to_string(),
                namespace: o.metadata.namespace.clone().filter(|_| *kind != "ClusterPolicy"),
                name: o.metadata.name.clone().unwrap_or_default(),
                error: entry.error.clone(),
                status: entry.status.clone(),
                live: o.data.get("status").cloned(),
            });
        }
        self.cache.retain(|k, _| seen.contains(k));
        let mut excs: Vec<CompiledException> = Vec::new();
        for e in exceptions {
            let Ok(v) = serde_json::to_value(&**e) else { continue };
            match verno_server::admission::compile_exception_object(&v) {
                Ok(c) => excs.push(c),
                Err(err) => {
                    tracing::warn!(exception = %e.metadata.name.as_deref().unwrap_or(""), error = %err, "PolicyException ignored")
                }
            }
        }
        let mut set = PolicySet::new(compiled, excs, Default::default());
        set.live_namespaces = Some(namespaces);
        (set, statuses)
    }
}

/// The status a compile result should show, and the error text when it failed.
fn desired_status(
    generation: i64,
    result: &Result<Arc<CompiledPolicy>, CompileError>,
    kept_previous: bool,
) -> (Value, Option<String>) {
    let (ready, reason, message, error) = match result {
        Ok(_) => (true, "Succeeded", "Ready".to_string(), None),
        Err(err) => {
            let text = if err.path.is_empty() { err.message.clone() } else { format!("{}: {}", err.path, err.message) };
            let kept = if kept_previous { " (the previous version stays in force)" } else { "" };
            (false, "Failed", format!("policy is invalid: {text}{kept}"), Some(text))
        }
    };
    let compiled = result.as_ref().ok().map(|p| &**p);
    let autogen: Vec<Value> = compiled
        .map(|p| verno_engine::autogen::rules(&p.source))
        .unwrap_or_default()
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    let mut status = json!({
        "ready": ready,
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": reason, "message": message, "observedGeneration": generation}],
        "rulecount": rule_counts(compiled),
    });
    if !autogen.is_empty()
        && let Some(m) = status.as_object_mut()
    {
        m.insert("autogen".into(), json!({"rules": autogen}));
    }
    (status, error)
}

/// The status without `lastTransitionTime`, for comparison.
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
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
        if self.live.as_ref().map(comparable) == Some(comparable(&self.status)) {
            return None;
        }
        let mut out = self.status.clone();
        let old_cond = self.live.as_ref().and_then(|l| l.pointer("/conditions/0")).cloned();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        if let Some(c) = out.pointer_mut("/conditions/0").and_then(Value::as_object_mut) {
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
