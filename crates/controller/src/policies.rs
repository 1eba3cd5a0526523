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
use verno_engine::{Compiled, CompiledException, CompiledPolicy, DocumentError, Kind, LiveNamespaces, PolicySet};

/// [`resource`], with MutatingAdmissionPolicies (and their bindings) at `map_version`, the
/// version the API server serves (see `admission_policies::map_version`).
pub fn resource_at(kind: Kind, map_version: &str) -> ApiResource {
    let mut ar = resource(kind);
    if matches!(kind, Kind::MutatingAdmissionPolicy | Kind::MutatingAdmissionPolicyBinding) {
        ar.version = map_version.into();
        ar.api_version = format!("{}/{map_version}", ar.group);
    }
    ar
}

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
    /// A ValidatingAdmissionPolicy's bindings (name and resourceVersion): they compile with it.
    bindings: Vec<(String, String)>,
    result: Result<Arc<CompiledPolicy>, DocumentError>,
    /// The last version that compiled, kept in force while a newer one is broken.
    last_good: Option<Arc<CompiledPolicy>>,
    /// The status this version should show and its error text, worked out once per compile.
    status: Value,
    error: Option<String>,
    reporting: Reporting,
}

/// A resource a policy's background scan reads: `group/version, Resource=plural` as Kyverno
/// prints it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

impl std::fmt::Display for Gvr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}, Resource={}", self.group, self.version, self.resource)
    }
}

/// Whether a CEL policy's status carries Kyverno's `RBACPermissionsGranted` condition, and what
/// it depends on.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Reporting {
    /// ClusterPolicy / Policy (their status has no such condition), or a policy that does not
    /// compile.
    #[default]
    None,
    /// Background scanning is off: no read permission is needed.
    Disabled,
    /// Background scanning reads these resources: Verno's service account must be allowed to
    /// get, list and watch each.
    Check(Vec<Gvr>),
}

/// The answer to a permission check: `(verb, resource, reason)` for every check refused.
pub type Missing = Vec<(String, Gvr, String)>;

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
    /// The permission check the `RBACPermissionsGranted` condition needs, if any.
    pub reporting: Reporting,
    /// A ClusterPolicy with validate rules, or a ValidatingPolicy: whether it becomes a
    /// ValidatingAdmissionPolicy (Kyverno's `generateValidatingAdmissionPolicy`, on by default);
    /// `Err`: it cannot be planned now (a kind that does not resolve). The leader writes the
    /// objects and the outcome into the status (`admission_policies`).
    pub vap: Option<Result<verno_engine::vapgen::VapPlan, String>>,
    /// The live status says its admission policy is generated: the API server enforces it, so
    /// Verno does not evaluate it (as Kyverno).
    pub generated: bool,
}

/// Whether a live ClusterPolicy or ValidatingPolicy says its ValidatingAdmissionPolicy is
/// generated.
pub fn generated(kind: Kind, o: &DynamicObject) -> bool {
    let at = match kind {
        Kind::ClusterPolicy => "/status/validatingadmissionpolicy/generated",
        Kind::ValidatingPolicy | Kind::MutatingPolicy => "/status/generated",
        _ => return false,
    };
    o.data.pointer(at).and_then(Value::as_bool) == Some(true)
}

/// The admission-policy plan of a policy (see [`PolicyStatus::vap`]), with the cluster's
/// exceptions of both kinds.
fn vap_plan(
    kind: Kind,
    o: &DynamicObject,
    exceptions: &[Value],
    cel_exceptions: &[Value],
    map_version: Option<&str>,
) -> Option<Result<verno_engine::vapgen::VapPlan, String>> {
    let doc = serde_json::to_value(o).ok()?;
    match kind {
        Kind::ClusterPolicy => {
            let rules = doc.pointer("/spec/rules").and_then(Value::as_array)?;
            if !rules.iter().any(|r| r.get("validate").is_some_and(|v| !v.is_null())) {
                return None;
            }
            Some(verno_engine::vapgen::plan_cluster_policy(&doc, exceptions, &crate::webhooks::resolve_kind))
        }
        Kind::ValidatingPolicy | Kind::MutatingPolicy => {
            let autogen = verno_engine::vpol_autogen_status(&doc) != serde_json::json!({});
            Some(Ok(match kind {
                Kind::MutatingPolicy => {
                    verno_engine::vapgen::plan_mutating_policy(&doc, cel_exceptions, autogen, map_version)
                }
                _ => verno_engine::vapgen::plan_validating_policy(&doc, cel_exceptions, autogen),
            }))
        }
        _ => None,
    }
}

#[derive(Default)]
pub struct Compiler {
    cache: HashMap<String, Entry>,
    /// Every policy compiles fail-open (Kyverno's `--forceFailurePolicyIgnore`).
    force_ignore: bool,
    /// Which PolicyExceptions are put in force.
    exceptions: ExceptionScope,
    /// The MutatingAdmissionPolicy version the API server prefers (`None`: it serves none).
    map_version: Option<String>,
}

/// Which PolicyExceptions (both kinds) are put in force: Kyverno's `--enablePolicyException`
/// (off by default, as in Kyverno's chart: exceptions are then stored but waive nothing) and
/// `--exceptionNamespace` (empty or `*`: every namespace; else only exceptions in that one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExceptionScope {
    pub enabled: bool,
    pub namespace: String,
}

impl ExceptionScope {
    /// Exceptions in force everywhere (Kyverno's CI values: enabled, namespace `*`).
    pub fn everywhere() -> ExceptionScope {
        ExceptionScope { enabled: true, namespace: "*".into() }
    }

    fn admits(&self, o: &DynamicObject) -> bool {
        self.enabled
            && (self.namespace.is_empty()
                || self.namespace == "*"
                || o.metadata.namespace.as_deref() == Some(self.namespace.as_str()))
    }
}

/// Compiles a stored policy through the engine's front door.
fn compile(kind: Kind, o: &DynamicObject) -> Result<CompiledPolicy, DocumentError> {
    let v = serde_json::to_value(o).map_err(|e| DocumentError::Decode(e.to_string()))?;
    match verno_engine::compile_stored(kind, &resource(kind).api_version, &v)? {
        Compiled::Policy(p) => Ok(p),
        Compiled::Exception(_) => Err(DocumentError::Decode(format!("a {kind} is not a policy"))),
    }
}

/// The binding kind of an admission policy kind.
fn binding_kind(kind: Kind) -> Option<Kind> {
    match kind {
        Kind::ValidatingAdmissionPolicy => Some(Kind::ValidatingAdmissionPolicyBinding),
        Kind::MutatingAdmissionPolicy => Some(Kind::MutatingAdmissionPolicyBinding),
        _ => None,
    }
}

/// Compiles a ValidatingAdmissionPolicy or MutatingAdmissionPolicy with its first binding
/// (Verno's engine evaluates one binding per policy; further bindings are not used).
/// Watched objects carry no apiVersion and kind: they are put back (the engine reads every
/// served version of an admission policy the same way).
fn compile_admission(
    kind: Kind,
    o: &DynamicObject,
    bindings: &[&Arc<DynamicObject>],
) -> Result<CompiledPolicy, DocumentError> {
    let typed = |o: &DynamicObject, kind: Kind| -> Option<Value> {
        let mut v = serde_json::to_value(o).ok()?;
        let m = v.as_object_mut()?;
        m.insert("apiVersion".into(), json!("admissionregistration.k8s.io/v1"));
        m.insert("kind".into(), json!(kind.name()));
        Some(v)
    };
    let v = typed(o, kind).ok_or_else(|| DocumentError::Decode(format!("a {kind} that is not an object")))?;
    let docs: Vec<Value> = match binding_kind(kind) {
        Some(bk) => bindings.iter().take(1).filter_map(|b| typed(b, bk)).collect(),
        None => Vec::new(),
    };
    match verno_engine::compile(&v, &docs)? {
        Compiled::Policy(p) => Ok(p),
        Compiled::Exception(_) => Err(DocumentError::Decode(format!("a {kind} is not an exception"))),
    }
}

fn rule_counts(p: Option<&CompiledPolicy>) -> Value {
    let (mut validate, mut mutate, mut generate, mut verify) = (0, 0, 0, 0);
    for r in p.map(|p| p.rules.as_slice()).unwrap_or(&[]).iter().filter(|r| r.autogen_of.is_none()) {
        match &r.body {
            RuleBody::Validate(_) => validate += 1,
            RuleBody::Mutate(_) => mutate += 1,
            RuleBody::Generate(_) => generate += 1,
            RuleBody::Unsupported { .. } | RuleBody::VerifyImages(_) => verify += 1,
            RuleBody::Cleanup(_) => {}
        }
    }
    json!({"validate": validate, "mutate": mutate, "generate": generate, "verifyimages": verify})
}

impl Compiler {
    /// A compiler whose policies are all fail-open when `force` (Kyverno's
    /// `--forceFailurePolicyIgnore`).
    pub fn forcing_ignore(force: bool) -> Compiler {
        Compiler { force_ignore: force, ..Compiler::default() }
    }

    /// The PolicyExceptions put in force (see [`ExceptionScope`]).
    pub fn with_exceptions(mut self, scope: ExceptionScope) -> Compiler {
        self.exceptions = scope;
        self
    }

    /// The MutatingAdmissionPolicy API version generated policies are written at (see
    /// `admission_policies::map_version`).
    pub fn with_map_version(mut self, version: Option<String>) -> Compiler {
        self.map_version = version;
        self
    }

    /// Compiles what changed and returns the set (with `exceptions` and the live namespaces)
    /// plus every policy's desired status.
    pub fn build(
        &mut self,
        policies: &[(Kind, Arc<DynamicObject>)],
        exceptions: &[(Kind, Arc<DynamicObject>)],
        namespaces: Arc<LiveNamespaces>,
    ) -> (PolicySet, Vec<PolicyStatus>) {
        self.build_with(policies, exceptions, &[], namespaces)
    }

    /// [`Compiler::build`], with the ValidatingAdmissionPolicyBindings the admission policies
    /// among `policies` compile with. The API server enforces admission policies; Verno only
    /// scans with those labelled `reports.kyverno.io/enabled: "true"` (as Kyverno reports
    /// them), and writes no status for them.
    pub fn build_with(
        &mut self,
        policies: &[(Kind, Arc<DynamicObject>)],
        exceptions: &[(Kind, Arc<DynamicObject>)],
        bindings: &[(Kind, Arc<DynamicObject>)],
        namespaces: Arc<LiveNamespaces>,
    ) -> (PolicySet, Vec<PolicyStatus>) {
        let mut compiled = Vec::new();
        let mut statuses = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let exceptions: Vec<(Kind, Arc<DynamicObject>)> =
            exceptions.iter().filter(|(_, e)| self.exceptions.admits(e)).cloned().collect();
        let exceptions = exceptions.as_slice();
        let of_kind = |want: Kind| -> Vec<Value> {
            exceptions.iter().filter(|(k, _)| *k == want).filter_map(|(_, e)| serde_json::to_value(&**e).ok()).collect()
        };
        let (kyverno_exceptions, cel_exceptions) = (of_kind(Kind::PolicyException), of_kind(Kind::CelPolicyException));
        for (kind, o) in in_set_order(policies) {
            let admission_policy = binding_kind(*kind).is_some();
            if admission_policy
                && o.metadata.labels.as_ref().and_then(|l| l.get("reports.kyverno.io/enabled")).map(String::as_str)
                    != Some("true")
            {
                continue;
            }
            let key = object_key(*kind, o);
            seen.insert(key.clone());
            let mine = if admission_policy { bindings_of(*kind, o, bindings) } else { Vec::new() };
            self.refresh(&key, *kind, o, &mine);
            let Some(entry) = self.cache.get(&key) else { continue };
            let in_force = entry.result.as_ref().ok().or(entry.last_good.as_ref());
            let generated = generated(*kind, o);
            if let Some(p) = in_force.filter(|_| !generated) {
                compiled.push(p.clone());
            }
            if admission_policy {
                continue;
            }
            statuses.push(PolicyStatus {
                kind: *kind,
                namespace: o.metadata.namespace.clone().filter(|_| kind.is_namespaced()),
                name: o.metadata.name.clone().unwrap_or_default(),
                error: entry.error.clone(),
                status: entry.status.clone(),
                live: o.data.get("status").cloned(),
                reporting: entry.reporting.clone(),
                vap: vap_plan(*kind, o, &kyverno_exceptions, &cel_exceptions, self.map_version.as_deref()),
                generated,
            });
        }
        self.cache.retain(|k, _| seen.contains(k));
        (PolicySet::new(compiled, compile_exceptions(exceptions)).with_live_namespaces(namespaces), statuses)
    }

    /// Compiles the policy `o` (an admission policy with its bindings `mine`) again unless the
    /// cache holds this very version of it, and caches the result with its desired status.
    fn refresh(&mut self, key: &str, kind: Kind, o: &DynamicObject, mine: &[&Arc<DynamicObject>]) {
        let uid = o.metadata.uid.clone().unwrap_or_default();
        let generation = o.metadata.generation.unwrap_or(0);
        let binding_versions: Vec<(String, String)> = mine
            .iter()
            .map(|b| {
                (b.metadata.name.clone().unwrap_or_default(), b.metadata.resource_version.clone().unwrap_or_default())
            })
            .collect();
        let fresh = self
            .cache
            .get(key)
            .is_some_and(|e| e.uid == uid && e.generation == generation && e.bindings == binding_versions);
        if fresh {
            return;
        }
        let last_good = self
            .cache
            .get(key)
            .filter(|e| e.uid == uid)
            .and_then(|e| e.result.as_ref().ok().cloned().or_else(|| e.last_good.clone()));
        let admission_policy = binding_kind(kind).is_some();
        let result = if admission_policy { compile_admission(kind, o, mine) } else { compile(kind, o) }.map(|mut p| {
            p.failure_policy_ignore |= self.force_ignore;
            Arc::new(p)
        });
        match &result {
            Err(e @ verno_engine::DocumentError::Unsupported(_)) => {
                tracing::warn!(policy = %key, error = %e, "policy kind not supported by Verno yet: not enforced");
            }
            Err(e) => {
                tracing::warn!(policy = %key, error = %e.with_path(), "policy does not compile; its previous version stays in force");
            }
            Ok(_) => {}
        }
        let spec = o.data.get("spec").cloned().unwrap_or(Value::Null);
        let (mut status, error) = desired_status(kind, generation, &result, last_good.is_some(), &spec);
        // A ValidatingPolicy's status also shows the rules autogen derived for Pod
        // controllers, as Kyverno's.
        if matches!(kind, Kind::ValidatingPolicy | Kind::NamespacedValidatingPolicy)
            && result.is_ok()
            && let (Ok(doc), Some(m)) = (serde_json::to_value(o), status.as_object_mut())
        {
            m.insert("autogen".into(), verno_engine::vpol_autogen_status(&doc));
        }
        let reporting = if result.is_ok() { reporting(kind, &spec) } else { Reporting::None };
        self.cache.insert(
            key.to_string(),
            Entry { uid, generation, bindings: binding_versions, result, last_good, status, error, reporting },
        );
    }
}

/// The policies in the set's order. The watch caches hand objects over in no particular order;
/// the set is in name order (ClusterPolicies and Policies, then the CEL kinds), so that
/// mutations that depend on each other apply the same way on every replica and after every
/// restart.
fn in_set_order(policies: &[(Kind, Arc<DynamicObject>)]) -> Vec<&(Kind, Arc<DynamicObject>)> {
    let mut ordered: Vec<&(Kind, Arc<DynamicObject>)> = policies.iter().collect();
    ordered.sort_by_cached_key(|(kind, o)| {
        let cel = !matches!(kind, Kind::ClusterPolicy | Kind::Policy);
        let position = Kind::ALL.iter().position(|k| k == kind).unwrap_or(usize::MAX);
        (cel, o.metadata.name.clone().unwrap_or_default(), o.metadata.namespace.clone().unwrap_or_default(), position)
    });
    ordered
}

/// The bindings (of its binding kind) that name admission policy `o`.
fn bindings_of<'b>(
    kind: Kind,
    o: &DynamicObject,
    bindings: &'b [(Kind, Arc<DynamicObject>)],
) -> Vec<&'b Arc<DynamicObject>> {
    bindings
        .iter()
        .filter(|(k, b)| {
            Some(*k) == binding_kind(kind)
                && b.data.pointer("/spec/policyName").and_then(Value::as_str) == o.metadata.name.as_deref()
        })
        .map(|(_, b)| b)
        .collect()
}

/// The PolicyExceptions (both kinds) that compile; the others are logged and left out.
fn compile_exceptions(exceptions: &[(Kind, Arc<DynamicObject>)]) -> Vec<CompiledException> {
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
    excs
}

/// Where a kind keeps its conditions: Kyverno's policies in `status.conditions`, the CEL kinds
/// in `status.conditionStatus.conditions`.
fn conditions_at(kind: Kind) -> &'static str {
    match kind {
        Kind::ClusterPolicy | Kind::Policy | Kind::CleanupPolicy | Kind::ClusterCleanupPolicy => "/conditions",
        _ => "/conditionStatus/conditions",
    }
}

fn enabled(spec: &Value, mode: &str) -> bool {
    spec.pointer(&format!("/evaluation/{mode}/enabled")).and_then(Value::as_bool).unwrap_or(true)
}

/// The resources a CEL policy's background scan reads (every group × version × resource of its
/// `matchConstraints.resourceRules`, as Kyverno checks them), or `Disabled` when it has no
/// background scan.
fn reporting(kind: Kind, spec: &Value) -> Reporting {
    if matches!(kind, Kind::ClusterPolicy | Kind::Policy) || kind.is_exception() || is_cleanup(kind) {
        return Reporting::None;
    }
    if !enabled(spec, "background") {
        return Reporting::Disabled;
    }
    let strs = |v: &Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let mut gvrs = Vec::new();
    for rule in spec.pointer("/matchConstraints/resourceRules").and_then(Value::as_array).into_iter().flatten() {
        for group in strs(rule, "apiGroups") {
            for version in strs(rule, "apiVersions") {
                for resource in strs(rule, "resources") {
                    gvrs.push(Gvr { group: group.clone(), version: version.clone(), resource });
                }
            }
        }
    }
    Reporting::Check(gvrs)
}

/// A policy registered only for background scanning has no webhook, so no WebhookConfigured
/// condition (Kyverno: a MutatingPolicy with admission off; any other CEL kind with admission
/// off and background on).
fn background_only(kind: Kind, spec: &Value) -> bool {
    let admission = enabled(spec, "admission");
    match kind {
        Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy => !admission,
        _ => !admission && enabled(spec, "background"),
    }
}

/// The cleanup kinds: scheduled, no webhook, no background scan.
pub fn is_cleanup(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::CleanupPolicy | Kind::ClusterCleanupPolicy | Kind::DeletingPolicy | Kind::NamespacedDeletingPolicy
    )
}

/// The status a compile result should show, and the error text when it failed.
fn desired_status(
    kind: Kind,
    generation: i64,
    result: &Result<Arc<CompiledPolicy>, DocumentError>,
    kept_previous: bool,
    spec: &Value,
) -> (Value, Option<String>) {
    let (ready, reason, message, error) = match result {
        Ok(_) => (true, "Succeeded", "Ready".to_string(), None),
        Err(err) => {
            let text = err.with_path();
            let kept = if kept_previous { " (the previous version stays in force)" } else { "" };
            (false, "Failed", format!("policy is invalid: {text}{kept}"), Some(text))
        }
    };
    if is_cleanup(kind) {
        // Kyverno writes only `lastExecutionTime` (the cleanup controller's, beside this);
        // Verno adds readiness and the compile error where the kind's schema has room: the
        // DeletingPolicies' `conditionStatus`, the CleanupPolicies' `conditions`.
        let status = if kind.group() == verno_api::Group::Kyverno {
            json!({"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": reason, "message": message, "observedGeneration": generation}]})
        } else {
            json!({"conditionStatus": {"ready": ready, "conditions": [], "message": if ready { String::new() } else { message }}})
        };
        return (status, error);
    }
    if !matches!(kind, Kind::ClusterPolicy | Kind::Policy) {
        // As Kyverno writes a CEL policy's status: `conditionStatus` with a WebhookConfigured
        // condition (Verno serves every policy that compiles); the error, if any, in `message`.
        let (status, reason, condition_message) = match result {
            Ok(_) => ("True", "Succeeded", "Webhook configured."),
            Err(_) => ("False", "Failed", "Policy is not configured in the webhook."),
        };
        let conditions = if background_only(kind, spec) && result.is_ok() {
            vec![]
        } else {
            vec![
                json!({"type": "WebhookConfigured", "status": status, "reason": reason, "message": condition_message, "observedGeneration": generation}),
            ]
        };
        let status = json!({"conditionStatus": {
            "ready": ready,
            "conditions": conditions,
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
    /// Writes the admission-policy outcome where Kyverno keeps it: a ClusterPolicy's
    /// `status.validatingadmissionpolicy` (`generated`, `message`), a ValidatingPolicy's
    /// `status.generated`.
    pub fn with_generation(&mut self, generated: bool, message: &str) {
        let Some(m) = self.status.as_object_mut() else { return };
        match self.kind {
            Kind::ClusterPolicy => {
                m.insert("validatingadmissionpolicy".into(), json!({"generated": generated, "message": message}));
            }
            Kind::ValidatingPolicy | Kind::MutatingPolicy => {
                m.insert("generated".into(), json!(generated));
            }
            _ => {}
        }
    }

    /// Adds the `RBACPermissionsGranted` condition as Kyverno words it, given the permissions
    /// found missing (`None`: the check could not be made, so the condition is left out), and
    /// recomputes `ready` from every condition.
    pub fn with_permissions(&mut self, missing: Option<&Missing>) {
        let (status, message) = match (&self.reporting, missing) {
            (Reporting::None, _) | (Reporting::Check(_), None) => return,
            (Reporting::Disabled, _) => {
                ("True", "Background scanning disabled; reporting permissions not required.".to_string())
            }
            (Reporting::Check(_), Some(m)) if m.is_empty() => ("True", "Policy is ready for reporting.".to_string()),
            (Reporting::Check(_), Some(m)) => {
                let list: Vec<String> = m.iter().map(|(verb, gvr, reason)| format!("{verb} {gvr}: {reason}")).collect();
                ("False", format!("Policy is not ready for reporting, missing permissions: {}.", list.join("; ")))
            }
        };
        let reason = if status == "True" { "Succeeded" } else { "Failed" };
        let Some(cs) = self.status.get_mut("conditionStatus").and_then(Value::as_object_mut) else { return };
        let generation =
            cs.get("conditions").and_then(|c| c.pointer("/0/observedGeneration")).cloned().unwrap_or(Value::Null);
        let mut cond =
            json!({"type": "RBACPermissionsGranted", "status": status, "reason": reason, "message": message});
        if let (false, Some(m)) = (generation.is_null(), cond.as_object_mut()) {
            m.insert("observedGeneration".into(), generation);
        }
        if let Some(list) = cs.get_mut("conditions").and_then(Value::as_array_mut) {
            list.retain(|c| c.get("type").and_then(Value::as_str) != Some("RBACPermissionsGranted"));
            list.push(cond);
            let all_true = list.iter().all(|c| c.get("status").and_then(Value::as_str) == Some("True"));
            let compiled = cs.get("message").and_then(Value::as_str).is_none_or(str::is_empty);
            cs.insert("ready".into(), Value::Bool(all_true && compiled));
        }
    }

    /// The status to write, or `None` when the live one already says it. A condition's
    /// `lastTransitionTime` moves only when its `status` does.
    pub fn to_write(&self) -> Option<Value> {
        let at = conditions_at(self.kind);
        if self.live.as_ref().map(|l| comparable(l, at)) == Some(comparable(&self.status, at)) {
            return None;
        }
        let mut out = self.status.clone();
        let old: Vec<Value> =
            self.live.as_ref().and_then(|l| l.pointer(at)).and_then(Value::as_array).cloned().unwrap_or_default();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        for c in
            out.pointer_mut(at).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut)
        {
            let before = old.iter().find(|o| o.get("type") == c.get("type"));
            let kept = before
                .filter(|o| o.get("status") == c.get("status"))
                .and_then(|o| o.get("lastTransitionTime"))
                .cloned();
            c.insert("lastTransitionTime".into(), kept.unwrap_or(Value::String(now.clone())));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vpol_status(spec: Value) -> PolicyStatus {
        // A compiled policy's status, without compiling one: ready, WebhookConfigured true.
        let status = json!({"conditionStatus": {"ready": true, "message": "", "conditions": if background_only(Kind::ValidatingPolicy, &spec) { json!([]) } else {
            json!([{"type": "WebhookConfigured", "status": "True", "reason": "Succeeded", "message": "Webhook configured.", "observedGeneration": 1}])
        }}});
        PolicyStatus {
            kind: Kind::ValidatingPolicy,
            namespace: None,
            name: "p".into(),
            error: None,
            status,
            live: None,
            reporting: reporting(Kind::ValidatingPolicy, &spec),
            vap: None,
            generated: false,
        }
    }

    fn rules() -> Value {
        json!({"matchConstraints": {"resourceRules": [
            {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments", "configmaps"]}]}})
    }

    #[test]
    fn forced_ignore_makes_every_policy_fail_open() {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p", "uid": "u1", "generation": 1},
            "spec": {"failurePolicy": "Fail", "rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"failureAction": "Enforce", "message": "m", "pattern": {"metadata": {"name": "?*"}}}}]}});
        let o: Arc<DynamicObject> = Arc::new(serde_json::from_value(doc).unwrap());
        for (force, expected) in [(false, false), (true, true)] {
            let (set, _) =
                Compiler::forcing_ignore(force).build(&[(Kind::ClusterPolicy, o.clone())], &[], Arc::default());
            assert_eq!(set.policies()[0].failure_policy_ignore, expected, "forced: {force}");
        }
    }

    /// PolicyExceptions are put in force as Kyverno's flags say: none unless enabled (its
    /// chart's default), then those of the exception namespace (empty or `*`: every one).
    #[test]
    fn exceptions_are_in_force_only_where_enabled() {
        let exception = |ns: &str| -> (Kind, Arc<DynamicObject>) {
            let doc = json!({"apiVersion": "kyverno.io/v2", "kind": "PolicyException",
                "metadata": {"name": "e", "namespace": ns, "uid": format!("u-{ns}"), "generation": 1},
                "spec": {"exceptions": [{"policyName": "p", "ruleNames": ["r"]}],
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}}});
            (Kind::PolicyException, Arc::new(serde_json::from_value(doc).unwrap()))
        };
        let all = [exception("team-a"), exception("kyverno")];
        let count = |scope: ExceptionScope| {
            Compiler::default().with_exceptions(scope).build(&[], &all, Arc::default()).0.exceptions().len()
        };
        assert_eq!(count(ExceptionScope::default()), 0);
        assert_eq!(count(ExceptionScope { enabled: false, namespace: "*".into() }), 0);
        assert_eq!(count(ExceptionScope::everywhere()), 2);
        assert_eq!(count(ExceptionScope { enabled: true, namespace: String::new() }), 2);
        assert_eq!(count(ExceptionScope { enabled: true, namespace: "kyverno".into() }), 1);
    }

    #[test]
    fn background_scans_check_every_group_version_resource() {
        let Reporting::Check(gvrs) = reporting(Kind::ValidatingPolicy, &rules()) else { panic!("expected a check") };
        let names: Vec<String> = gvrs.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["apps/v1, Resource=deployments", "apps/v1, Resource=configmaps"]);
        let mut off = rules();
        off["evaluation"] = json!({"background": {"enabled": false}});
        assert_eq!(reporting(Kind::ValidatingPolicy, &off), Reporting::Disabled);
        assert_eq!(reporting(Kind::ClusterPolicy, &rules()), Reporting::None);
    }

    #[test]
    fn missing_permissions_are_worded_as_kyverno_and_make_the_policy_not_ready() {
        let mut st = vpol_status(rules());
        let gvr = Gvr { group: "apps".into(), version: "v1".into(), resource: "configmaps".into() };
        let missing: Missing =
            ["get", "list", "watch"].iter().map(|v| (v.to_string(), gvr.clone(), String::new())).collect();
        st.with_permissions(Some(&missing));
        let cs = &st.status["conditionStatus"];
        assert_eq!(cs["ready"], false);
        assert_eq!(cs["conditions"][0]["type"], "WebhookConfigured");
        let c = &cs["conditions"][1];
        assert_eq!(c["type"], "RBACPermissionsGranted");
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "Failed");
        assert_eq!(
            c["message"],
            "Policy is not ready for reporting, missing permissions: get apps/v1, Resource=configmaps: ; list apps/v1, Resource=configmaps: ; watch apps/v1, Resource=configmaps: ."
        );
        st.with_permissions(Some(&Missing::new()));
        let cs = &st.status["conditionStatus"];
        assert_eq!(cs["ready"], true);
        assert_eq!(cs["conditions"].as_array().map(Vec::len), Some(2), "the condition is replaced, not added twice");
        assert_eq!(cs["conditions"][1]["message"], "Policy is ready for reporting.");
    }

    #[test]
    fn an_admission_disabled_policy_has_no_webhook_condition() {
        let mut spec = rules();
        spec["evaluation"] = json!({"admission": {"enabled": false}});
        let ok: Result<Arc<CompiledPolicy>, DocumentError> = Err(DocumentError::Decode("x".into()));
        assert!(background_only(Kind::ValidatingPolicy, &spec));
        let (status, _) = desired_status(Kind::ValidatingPolicy, 1, &ok, false, &spec);
        // A policy that does not compile still says why in its webhook condition.
        assert_eq!(status["conditionStatus"]["conditions"][0]["type"], "WebhookConfigured");
        let mut st = vpol_status(spec);
        st.with_permissions(Some(&Missing::new()));
        let conds = st.status["conditionStatus"]["conditions"].as_array().cloned().unwrap_or_default();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["type"], "RBACPermissionsGranted");
    }
}
