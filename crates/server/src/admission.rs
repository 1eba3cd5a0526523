//! AdmissionReview in, AdmissionReview out (spec §6.1–§6.3). Synchronous and free of HTTP: the
//! server calls it off the async executor, tests call it directly. Evaluation is the engine's.

use base64::Engine as _;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use verno_engine::{
    Action, CompiledException, CompiledPolicy, Phase, PolicyResponse, Request, RequestUser, RuleType, Sequence, Status,
    build_context, evaluate_phase, jsonpatch,
};

/// The policies in force: swapped as a whole on reload.
#[derive(Default)]
pub struct PolicySet {
    pub policies: Vec<CompiledPolicy>,
    pub exceptions: Vec<CompiledException>,
    /// Namespace labels known without a cluster (`--namespace-labels`).
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Namespace labels kept current from the cluster (in-cluster mode), consulted after
    /// `namespace_labels`; shared so that a label change does not rebuild the set.
    pub live_namespaces: Option<Arc<NamespaceLabels>>,
    /// Shared names for metrics, made once per set.
    meta: std::sync::OnceLock<Vec<Arc<PolicyMeta>>>,
}

/// Namespace name → labels, updated from a watch.
pub type NamespaceLabels = std::sync::RwLock<std::collections::HashMap<String, BTreeMap<String, String>>>;

/// What metrics say about a policy, shared instead of copied per request.
#[derive(Debug)]
pub struct PolicyMeta {
    pub name: Arc<str>,
    pub namespace: Arc<str>,
    pub namespaced: bool,
    pub background: bool,
    /// Rule name and whether its effective action is Enforce.
    pub rules: Vec<(Arc<str>, bool)>,
}

impl PolicySet {
    pub fn new(
        policies: Vec<CompiledPolicy>,
        exceptions: Vec<CompiledException>,
        namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    ) -> Self {
        PolicySet { policies, exceptions, namespace_labels, live_namespaces: None, meta: std::sync::OnceLock::new() }
    }

    fn meta(&self) -> &[Arc<PolicyMeta>] {
        self.meta.get_or_init(|| {
            self.policies
                .iter()
                .map(|p| {
                    Arc::new(PolicyMeta {
                        name: Arc::from(p.name.as_str()),
                        // Kyverno labels a cluster policy's namespace "-" in every metric.
                        namespace: Arc::from(if p.kind == "Policy" {
                            p.namespace.as_deref().unwrap_or("")
                        } else {
                            "-"
                        }),
                        namespaced: p.kind == "Policy",
                        background: p.background,
                        rules: p
                            .rules
                            .iter()
                            .map(|r| (Arc::from(r.name.as_str()), p.rule_action(&r.name) == Action::Enforce))
                            .collect(),
                    })
                })
                .collect()
        })
    }
}

/// Which policies a path serves: `/validate` all, `/validate/fail` those with failurePolicy
/// Fail, `/validate/ignore` those with Ignore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    All,
    Fail,
    Ignore,
}

impl Filter {
    fn keeps(self, hook: Hook, p: &CompiledPolicy) -> bool {
        match self {
            Filter::All => true,
            Filter::Fail => fail_closed(hook, p),
            Filter::Ignore => !fail_closed(hook, p),
        }
    }
}

/// Whether a policy belongs on the fail-closed webhook for `hook`: its failurePolicy is Fail
/// and, for validation, at least one rule can block (Enforce). An Audit-only policy never
/// justifies refusing a request when Verno is unreachable, so it always goes fail-open.
pub fn fail_closed(hook: Hook, p: &CompiledPolicy) -> bool {
    if p.failure_policy_ignore {
        return false;
    }
    match hook {
        Hook::Mutate => true,
        Hook::Validate => {
            p.action == Action::Enforce
                || !p.overrides.is_empty()
                || p.rules.iter().any(|r| p.rule_action(&r.name) == Action::Enforce)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Validate,
    Mutate,
}

/// One rule result, for metrics.
#[derive(Debug, Clone)]
pub struct RuleResult {
    pub policy: Arc<PolicyMeta>,
    pub rule: Arc<str>,
    pub enforce: bool,
    pub rule_type: RuleType,
    pub status: Status,
}

/// The object a request is about, as an event's `related` / `regarding` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The object's uid; validating webhooks see it on CREATE too, since the API server
    /// assigns it (and a generated name) before validating admission.
    pub uid: String,
}

/// A rule that failed or errored during validation: what Kyverno turns into `PolicyViolation`
/// events (on the policy, and on the resource when the request went through). The server only
/// reports them; the in-cluster controller writes the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `ClusterPolicy` or `Policy`.
    pub policy_kind: String,
    pub policy_name: String,
    /// Set for a namespaced `Policy`.
    pub policy_namespace: Option<String>,
    pub rule: String,
    pub status: Status,
    pub message: String,
    /// The request was refused because of this rule.
    pub blocked: bool,
    pub resource: ResourceRef,
}

impl Violation {
    /// The note of the event on the policy: `Pod ns/name: [rule] fail (blocked); message`.
    pub fn policy_note(&self) -> String {
        let r = &self.resource;
        let mut out = if r.namespace.is_empty() {
            format!("{} {}", r.kind, r.name)
        } else {
            format!("{} {}/{}", r.kind, r.namespace, r.name)
        };
        out.push_str(&format!(": [{}] {}", self.rule, self.status.as_str()));
        if self.blocked {
            out.push_str(" (blocked)");
        }
        if !self.message.is_empty() {
            out.push_str("; ");
            out.push_str(&self.message);
        }
        out
    }

    /// The note of the event on the resource: `policy name/rule fail: message`.
    pub fn resource_note(&self) -> String {
        format!("policy {}/{} {}: {}", self.policy_name, self.rule, self.status.as_str(), self.message)
    }
}

/// What a review produced.
#[derive(Debug)]
pub struct Outcome {
    pub review: Value,
    pub allowed: bool,
    pub kind: String,
    pub namespace: String,
    pub operation: String,
    pub results: Vec<RuleResult>,
    /// Per policy: seconds spent evaluating it.
    pub policy_seconds: Vec<(Arc<PolicyMeta>, f64)>,
    /// Failed and errored validation rules (for events).
    pub violations: Vec<Violation>,
}

/// The JSON the webhook answers with, for a request that could not be evaluated at all.
pub fn error_review(api_version: &str, uid: &str, allowed: bool, message: &str) -> Value {
    let mut response = Map::new();
    response.insert("uid".into(), json!(uid));
    response.insert("allowed".into(), json!(allowed));
    if !allowed {
        response.insert("status".into(), failure(message));
    } else if !message.is_empty() {
        response.insert("warnings".into(), json!([message]));
    }
    envelope(api_version, Value::Object(response))
}

/// The review's `apiVersion`, which the answer repeats.
pub fn api_version(review: &Value) -> &str {
    review.get("apiVersion").and_then(Value::as_str).unwrap_or("admission.k8s.io/v1")
}

/// An AdmissionReview around `response`.
fn envelope(api_version: &str, response: Value) -> Value {
    json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})
}

/// A denial's `status`.
fn failure(message: &str) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": message})
}

fn s<'v>(v: &'v Value, p: &str) -> &'v str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Checks the envelope; the error says what is wrong.
pub fn parse(body: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid AdmissionReview JSON: {e}"))?;
    if !v.is_object() {
        return Err("invalid AdmissionReview: expected a JSON object".into());
    }
    let Some(req) = v.get("request").filter(|r| r.is_object()) else {
        return Err("invalid AdmissionReview: request is missing".into());
    };
    if s(req, "/uid").is_empty() {
        return Err("invalid AdmissionReview: request.uid is missing".into());
    }
    Ok(v)
}

/// Formats a string as a yaml.v3 scalar (the denial message is yaml.v3 output in Kyverno).
pub fn yaml_scalar(text: &str) -> String {
    let special_start = text
        .starts_with(['-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`']);
    let looks_typed = matches!(
        text.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~" | "y" | "n"
    ) || text.parse::<f64>().is_ok();
    if text.contains(['\n', '\t', '\r']) || text.chars().any(char::is_control) || looks_typed || text.is_empty() {
        return serde_json::to_string(text).unwrap_or_default();
    }
    let plain_ok = !special_start
        && !text.contains(": ")
        && !text.contains(" #")
        && !text.ends_with([' ', ':'])
        && !text.starts_with(' ');
    if plain_ok { text.to_string() } else { format!("'{}'", text.replace('\'', "''")) }
}

/// Kyverno's denial message: the blocked resource, then policy → rule → message as YAML.
pub fn blocked_message(
    kind: &str,
    namespace: &str,
    name: &str,
    failures: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    let mut out = format!("\n\nresource {kind}/{namespace}/{name} was blocked due to the following policies \n\n");
    for (policy, rules) in failures {
        out.push_str(&format!("{}:\n", yaml_scalar(policy)));
        for (rule, msg) in rules {
            out.push_str(&format!("  {}: {}\n", yaml_scalar(rule), yaml_scalar(msg)));
        }
    }
    out
}

/// Reviews one AdmissionReview with the policies of `set` that `filter` keeps.
pub fn review(set: &PolicySet, hook: Hook, filter: Filter, review: &Value) -> Outcome {
    let api_version = api_version(review);
    let null = Value::Null;
    let req = review.get("request").unwrap_or(&null);
    let uid = s(req, "/uid");
    let operation = s(req, "/operation").to_string();
    let object = req.get("object").unwrap_or(&null);
    let old = req.get("oldObject").filter(|o| !o.is_null());
    let subject = if object.is_null() { old.unwrap_or(&null) } else { object };
    let kind = {
        let k = s(req, "/kind/kind");
        if k.is_empty() { s(subject, "/kind").to_string() } else { k.to_string() }
    };
    let namespace = {
        let n = s(req, "/namespace");
        if n.is_empty() { s(subject, "/metadata/namespace").to_string() } else { n.to_string() }
    };
    let name = {
        let n = s(req, "/name");
        if n.is_empty() { s(subject, "/metadata/name").to_string() } else { n.to_string() }
    };
    let empty_user = json!({});
    let user_info = req.get("userInfo").unwrap_or(&empty_user);
    let user = RequestUser {
        username: s(user_info, "/username").to_string(),
        groups: user_info
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default(),
        roles: Vec::new(),
        cluster_roles: Vec::new(),
    };
    // A Namespace request carries its own labels; other namespaces come from --namespace-labels.
    let own_labels = (kind == "Namespace").then(|| verno_engine::matching::labels_of(subject));
    let live_labels = match (&own_labels, set.namespace_labels.contains_key(&namespace), &set.live_namespaces) {
        (None, false, Some(live)) => live.read().ok().and_then(|m| m.get(&namespace).cloned()),
        _ => None,
    };
    let ns_labels = own_labels.as_ref().or_else(|| set.namespace_labels.get(&namespace)).or(live_labels.as_ref());
    let request = Request {
        operation: &operation,
        object,
        old_object: old,
        user: Some(&user),
        user_info: Some(user_info),
        namespace_labels: ns_labels,
        subresource: s(req, "/subResource"),
        variables: &[],
    };
    let env = ServerEnv;
    let mut ctx = build_context(&request, &env);
    let mut results = Vec::new();
    let mut policy_seconds: Vec<(Arc<PolicyMeta>, f64)> = Vec::new();
    let metas = set.meta();
    let mut record = |i: usize, r: &PolicyResponse, started: std::time::Instant| {
        let Some(m) = metas.get(i) else { return };
        policy_seconds.push((m.clone(), started.elapsed().as_secs_f64()));
        for rr in &r.rules {
            let (rule, enforce) = m
                .rules
                .iter()
                .find(|(n, _)| **n == *rr.name)
                .cloned()
                .unwrap_or_else(|| (Arc::from(rr.name.as_str()), false));
            results.push(RuleResult { policy: m.clone(), rule, enforce, rule_type: rr.rule_type, status: rr.status });
        }
    };
    let mut violations = Vec::new();
    let mut response = Map::new();
    response.insert("uid".into(), Value::String(uid.to_string()));
    let mut allowed = true;
    let mut warnings: Vec<String> = Vec::new();
    match hook {
        Hook::Mutate => {
            let mut seq = Sequence::new(request.clone());
            let mut failed: Vec<String> = Vec::new();
            for (i, p) in set.policies.iter().enumerate().filter(|(_, p)| filter.keeps(hook, p)) {
                let started = std::time::Instant::now();
                let r = seq.evaluate(p, Phase::Mutate, &set.exceptions, &mut ctx, &verno_engine::NoData);
                record(i, &r, started);
                let bad: Vec<&str> = r.rules.iter().filter(|x| p.blocks(x)).map(|x| x.name.as_str()).collect();
                if !bad.is_empty() {
                    failed.push(format!("failed to apply policy {} rules {}", p.key(), bad.join(", ")));
                }
                if p.emit_warning {
                    warnings.extend(
                        r.rules
                            .iter()
                            .filter(|x| x.status != Status::Skip)
                            .map(|x| format!("policy {}.{}: {}", p.key(), x.name, x.message)),
                    );
                }
            }
            if !failed.is_empty() {
                allowed = false;
                response.insert("status".into(), failure(&failed.join("; ")));
            } else if let Some(patched) = seq.patched() {
                let ops = jsonpatch::diff(object, patched);
                if !ops.is_empty() {
                    let bytes = serde_json::to_vec(&ops).unwrap_or_default();
                    response
                        .insert("patch".into(), Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)));
                    response.insert("patchType".into(), Value::String("JSONPatch".into()));
                }
            }
        }
        Hook::Validate => {
            let mut failures: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
            for (i, p) in set.policies.iter().enumerate().filter(|(_, p)| filter.keeps(hook, p)) {
                let started = std::time::Instant::now();
                let r = evaluate_phase(p, Phase::Validate, &set.exceptions, &request, &mut ctx, &verno_engine::NoData);
                record(i, &r, started);
                for rr in &r.rules {
                    if matches!(rr.status, Status::Fail | Status::Error) {
                        violations.push(Violation {
                            policy_kind: p.kind.clone(),
                            policy_name: p.name.clone(),
                            policy_namespace: if p.kind == "Policy" { p.namespace.clone() } else { None },
                            rule: rr.name.clone(),
                            status: rr.status,
                            message: rr.message.clone(),
                            blocked: p.blocks(rr),
                            resource: ResourceRef {
                                api_version: api_version_of(req, subject),
                                kind: kind.clone(),
                                namespace: namespace.clone(),
                                name: name.clone(),
                                uid: s(subject, "/metadata/uid").to_string(),
                            },
                        });
                    }
                    if p.blocks(rr) {
                        failures.entry(p.key()).or_default().insert(rr.name.clone(), rr.message.clone());
                    } else if p.emit_warning && rr.status != Status::Skip && rr.status != Status::Pass {
                        warnings.push(format!("policy {}.{}: {}", p.key(), rr.name, rr.message));
                    }
                }
            }
            if !failures.is_empty() {
                allowed = false;
                response.insert("status".into(), failure(&blocked_message(&kind, &namespace, &name, &failures)));
            }
        }
    }
    response.insert("allowed".into(), Value::Bool(allowed));
    // As Kyverno: warnings accompany allowed requests only.
    if allowed && !warnings.is_empty() {
        response.insert("warnings".into(), json!(warnings));
    }
    Outcome {
        review: envelope(api_version, Value::Object(response)),
        allowed,
        kind,
        namespace,
        operation,
        results,
        policy_seconds,
        violations,
    }
}

/// `group/version` of the request's kind (the object's own `apiVersion` when absent).
fn api_version_of(req: &Value, subject: &Value) -> String {
    let (g, v) = (s(req, "/kind/group"), s(req, "/kind/version"));
    match (g.is_empty(), v.is_empty()) {
        (_, true) => s(subject, "/apiVersion").to_string(),
        (true, false) => v.to_string(),
        (false, false) => format!("{g}/{v}"),
    }
}

/// An object from the API (which may lack `apiVersion`/`kind`, e.g. a DynamicObject) with its
/// type set and its `status` dropped, ready for the serde types.
fn typed(object: &Value, api_version: &str, kind: &str) -> Value {
    let mut v = object.clone();
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.into()));
        m.insert("kind".into(), Value::String(kind.into()));
        m.remove("status");
    }
    v
}

/// Compiles a ClusterPolicy or Policy object as the API stores it (`status` ignored). The one
/// path for the controller's policy watch and the policy validation webhook, so what the
/// webhook admits is exactly what the controller can put in force.
pub fn compile_policy_object(kind: &str, object: &Value) -> Result<CompiledPolicy, verno_engine::CompileError> {
    let p: verno_api::ClusterPolicy = serde_json::from_value(typed(object, "kyverno.io/v1", kind))
        .map_err(|e| verno_engine::CompileError::new("spec", e.to_string()))?;
    verno_engine::compile_policy(&p)
}

/// Compiles a `kyverno.io` PolicyException object as the API stores it.
pub fn compile_exception_object(object: &Value) -> Result<CompiledException, String> {
    let pe: verno_api::PolicyException =
        serde_json::from_value(typed(object, "kyverno.io/v2", "PolicyException")).map_err(|e| format!("spec: {e}"))?;
    verno_engine::compile_exception(&pe).map_err(|e| e.to_string())
}

/// The policy validation webhook (Kyverno's `/policyvalidate`): a ClusterPolicy, Policy or
/// PolicyException that would not compile is refused at `kubectl apply` time with the error and
/// its field path, instead of being stored and reported in its status afterwards.
pub fn validate_policy_review(review: &Value) -> Value {
    let uid = s(review, "/request/uid");
    let object = review.pointer("/request/object").filter(|o| o.is_object());
    let kind = s(review, "/request/kind/kind");
    let error = match (kind, object) {
        (_, None) => None,
        ("ClusterPolicy" | "Policy", Some(o)) => compile_policy_object(kind, o)
            .err()
            .map(|e| if e.path.is_empty() { e.message } else { format!("{}: {}", e.path, e.message) }),
        ("PolicyException", Some(o)) => compile_exception_object(o).err(),
        _ => None,
    };
    error_review(api_version(review), uid, error.is_none(), error.as_deref().unwrap_or(""))
}

/// The annotation the end-to-end probe's webhook stamps on the probe Lease (Kyverno's verify
/// webhook stamps `kyverno.io/last-request-time`).
pub const LAST_REQUEST_ANNOTATION: &str = "verno.io/last-request-time";

/// The probe's answer: allow, and set [`LAST_REQUEST_ANNOTATION`] to `now` by JSON patch, so
/// whoever made the write sees in the stored object that the API server reached Verno.
pub fn verify_review(review: &Value, now: &str) -> Value {
    let uid = s(review, "/request/uid");
    let has_annotations = review.pointer("/request/object/metadata/annotations").is_some_and(Value::is_object);
    let ops = if has_annotations {
        json!([{"op": "add", "path": format!("/metadata/annotations/{}", LAST_REQUEST_ANNOTATION.replace('/', "~1")), "value": now}])
    } else {
        json!([{"op": "add", "path": "/metadata/annotations", "value": {LAST_REQUEST_ANNOTATION: now}}])
    };
    let patch = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&ops).unwrap_or_default());
    envelope(api_version(review), json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch}))
}

/// The clock for `time_now*`; no DNS lookups from the admission path.
struct ServerEnv;

impl verno_jmespath::Env for ServerEnv {
    fn random_seed(&self) -> Option<u64> {
        use std::hash::{BuildHasher, Hasher};
        // A fresh randomly keyed hasher per call: random enough for `random()`, no extra crate.
        Some(std::collections::hash_map::RandomState::new().build_hasher().finish())
    }
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Utc::now().fixed_offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_scalars_are_quoted_as_yaml_v3_does() {
        assert_eq!(yaml_scalar("require-labels"), "require-labels");
        assert_eq!(yaml_scalar("validation error: x"), "'validation error: x'");
        assert_eq!(yaml_scalar("label 'app': required"), "'label ''app'': required'");
        assert_eq!(yaml_scalar("true"), "\"true\"");
        assert_eq!(yaml_scalar("a\nb"), "\"a\\nb\"");
        assert_eq!(yaml_scalar("-leading"), "'-leading'");
    }

    #[test]
    fn the_probe_answer_stamps_the_time_whether_or_not_annotations_exist() {
        let decode = |r: &Value| -> Value {
            let b = base64::engine::general_purpose::STANDARD
                .decode(r["response"]["patch"].as_str().unwrap_or(""))
                .unwrap_or_default();
            serde_json::from_slice(&b).unwrap_or(Value::Null)
        };
        let bare = json!({"request": {"uid": "u1", "object": {"metadata": {"name": "verno-health"}}}});
        let r = verify_review(&bare, "2026-11-21T10:00:00Z");
        assert_eq!(r["response"]["uid"], "u1");
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(
            decode(&r),
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"verno.io/last-request-time": "2026-11-21T10:00:00Z"}}])
        );
        let annotated = json!({"request": {"uid": "u2", "object": {"metadata": {"annotations": {"a": "b"}}}}});
        assert_eq!(
            decode(&verify_review(&annotated, "t")),
            json!([{"op": "add", "path": "/metadata/annotations/verno.io~1last-request-time", "value": "t"}])
        );
    }

    #[test]
    fn envelope_errors_say_what_is_missing() {
        assert_eq!(parse(b"[]").err().unwrap_or_default(), "invalid AdmissionReview: expected a JSON object");
        assert_eq!(
            parse(br#"{"request": {}}"#).err().unwrap_or_default(),
            "invalid AdmissionReview: request.uid is missing"
        );
        assert!(parse(br#"{"request": {"uid": "1"}}"#).is_ok());
    }
}
