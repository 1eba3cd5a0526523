//! AdmissionReview in, AdmissionReview out. Synchronous and free of HTTP: the server calls it
//! off the async executor, tests call it directly. Evaluation is the engine's
//! ([`PolicySet::review`]); this turns its outcome into the webhook's answer and the figures
//! metrics and events need.

use base64::Engine as _;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use verno_api::admission::Status as ReviewStatus;
use verno_api::{AdmissionRequest, AdmissionResponse, AdmissionReview, Kind, Operation};
use verno_engine::{
    Filter, Hook, NoData, Notice, Observer, PolicyResponse, PolicySet, ResourceRef, Route, RuleType, Status, jsonpatch,
};

/// One rule result, for metrics: the policy and rule by their places in the set that evaluated
/// the request (the metrics look the names up in their own tables), not by shared names —
/// under load on several threads, counting references on the set's names kept their cache
/// lines moving between the cores.
#[derive(Debug, Clone)]
pub struct RuleResult {
    /// The policy's index in the set.
    pub policy: usize,
    /// The rule's index in the policy's [`verno_engine::PolicyMeta::rules`], or its own name
    /// when the set does not know it.
    pub rule: Result<usize, Arc<str>>,
    pub enforce: bool,
    pub rule_type: RuleType,
    pub status: Status,
}

/// What a review produced.
#[derive(Debug)]
pub struct Outcome {
    pub review: AdmissionReview,
    pub allowed: bool,
    pub kind: String,
    pub namespace: String,
    pub operation: Operation,
    pub results: Vec<RuleResult>,
    /// Per policy (its index in the set): seconds spent evaluating it.
    pub policy_seconds: Vec<(usize, f64)>,
    /// What becomes events: failed and errored rules, and policies that applied (or that
    /// PolicyExceptions made skip; only for requests that went through, as Kyverno).
    pub notices: Vec<Notice>,
    /// What the resource's PolicyReport gets (validation webhooks, requests that went
    /// through, CREATE and UPDATE of a named object).
    pub report: Option<verno_engine::report::ReportNotice>,
}

/// Why a body is not an AdmissionReview the webhook can answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid AdmissionReview JSON: {0}")]
    Json(String),
    #[error("invalid AdmissionReview: expected a JSON object")]
    NotAnObject,
    #[error("invalid AdmissionReview: request is missing")]
    NoRequest,
    #[error("invalid AdmissionReview: request.uid is missing")]
    NoUid,
    #[error("invalid AdmissionReview: {0}")]
    Shape(String),
    #[error("invalid AdmissionReview: the request nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// How deep an object in a request may nest: Kubernetes' own limit for the objects it decodes
/// (apimachinery's `util/json`), so the API server never sends the webhook anything deeper.
/// serde_json stops at 128 levels by default, and a webhook under `failurePolicy: Fail` that
/// refuses a request denies a good object. The engine walks values recursively: the server's
/// threads have stacks for this depth (`crate::runtime`).
pub const MAX_DEPTH: usize = 10_000;

/// The review's own levels around its object (`{"request": {"object": …`), allowed on top of
/// [`MAX_DEPTH`].
const ENVELOPE_DEPTH: usize = 4;

/// The deepest nesting of arrays and objects in `body`, outside strings; stops counting once
/// past `limit`.
fn nesting(body: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    break;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `body` as a `T`: as serde_json reads it, and, when that stops at its recursion limit, again
/// without the limit if the body nests no deeper than Kubernetes allows (rare: the common path
/// pays nothing for it).
fn from_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ParseError> {
    let deep = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str::<T>(text),
        Err(_) => serde_json::from_slice::<T>(body),
    };
    match deep {
        Ok(v) => return Ok(v),
        Err(e) if !e.to_string().starts_with("recursion limit exceeded") => {
            return Err(ParseError::Json(e.to_string()));
        }
        Err(_) => {}
    }
    if nesting(body, MAX_DEPTH + ENVELOPE_DEPTH) > MAX_DEPTH + ENVELOPE_DEPTH {
        return Err(ParseError::TooDeep);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    let v = T::deserialize(&mut de).map_err(|e| ParseError::Json(e.to_string()))?;
    de.end().map_err(|e| ParseError::Json(e.to_string()))?;
    Ok(v)
}

/// The `apiVersion` and `request.uid` of a review, read without building the whole document:
/// what any answer needs, known before the request waits for an evaluation slot. A body that
/// does not have them gets the full check's reason.
pub fn identify(body: &[u8]) -> Result<(String, String), ParseError> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(rename = "apiVersion", default)]
        api_version: Option<String>,
        #[serde(default)]
        request: Option<Uid>,
    }
    #[derive(serde::Deserialize)]
    struct Uid {
        #[serde(default)]
        uid: String,
    }
    match from_json::<Envelope>(body) {
        Ok(Envelope { api_version, request: Some(Uid { uid }) }) if !uid.is_empty() => {
            Ok((api_version.unwrap_or_else(|| "admission.k8s.io/v1".into()), uid))
        }
        _ => Err(parse(body).err().unwrap_or(ParseError::NoRequest)),
    }
}

/// Decodes and checks the envelope; the error says what is wrong.
pub fn parse(body: &[u8]) -> Result<AdmissionReview, ParseError> {
    // Straight into the typed envelope; only a body that does not fit is read again, as plain
    // JSON, to say what is wrong with it.
    // A body that is UTF-8 as a whole (checked at once, fast) is read as text: serde_json then
    // does not check every string on its own, a fifth of the parse. Other bodies are read as
    // bytes, whose error says where the bad byte is.
    let shape = match from_json::<AdmissionReview>(body) {
        Ok(r) if r.request.as_ref().is_some_and(|req| !req.uid.is_empty()) => return Ok(r),
        Ok(_) => None,
        Err(ParseError::TooDeep) => return Err(ParseError::TooDeep),
        Err(e) => Some(e),
    };
    let v: Value = from_json(body)?;
    if !v.is_object() {
        return Err(ParseError::NotAnObject);
    }
    let Some(req) = v.get("request").filter(|r| r.is_object()) else {
        return Err(ParseError::NoRequest);
    };
    if req.get("uid").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(ParseError::NoUid);
    }
    Err(match shape {
        Some(ParseError::Json(e)) => ParseError::Shape(e),
        Some(other) => other,
        None => ParseError::Shape(String::new()),
    })
}

/// The answer for a request that could not be evaluated at all: allowed with the message as a
/// warning, or refused with it.
pub fn error_review(api_version: &str, uid: &str, allowed: bool, message: &str) -> AdmissionReview {
    let mut response = AdmissionResponse { uid: uid.to_string(), allowed, ..Default::default() };
    if !allowed {
        response.status = Some(ReviewStatus::failure(message));
    } else if !message.is_empty() {
        response.warnings = vec![message.to_string()];
    }
    AdmissionReview::answer(api_version, response)
}

/// The answer to a request Kyverno's ConfigMap says to leave alone (its `resourceFilters`, or
/// a user its `exclude*` keys name): allowed, nothing evaluated, as Kyverno's webhook filter
/// answers. `None`: the request is reviewed. The user's roles and cluster roles (for
/// `excludeRoles` / `excludeClusterRoles`) come from `data`, worked out only when those keys
/// name any.
pub fn filtered(
    filters: &verno_engine::filters::RequestFilters,
    review: &AdmissionReview,
    data: &dyn verno_engine::Data,
) -> Option<AdmissionReview> {
    let req = review.request.as_ref()?;
    let u = &req.user_info;
    let k = &req.kind;
    let (roles, cluster_roles) = if filters.reads_roles() {
        data.user_roles(&u.username, &u.groups).unwrap_or_default()
    } else {
        Default::default()
    };
    let skip = filters.excludes_user(&u.username, &u.groups, &roles, &cluster_roles)
        || filters.filters_resource((&k.group, &k.version, &k.kind), &req.sub_resource, &req.namespace, &req.name);
    skip.then(|| {
        AdmissionReview::answer(
            &review.api_version,
            AdmissionResponse { uid: req.uid.clone(), allowed: true, ..Default::default() },
        )
    })
}

/// Times each policy and collects its rule results for metrics (the engine has no clock).
struct Recorder<'s> {
    set: &'s PolicySet,
    started: Option<Instant>,
    /// When the previous policy finished: the next one starts then (one clock read per policy;
    /// what the engine does between two policies, microseconds at most, counts to the next).
    finished: Option<Instant>,
    results: Vec<RuleResult>,
    policy_seconds: Vec<(usize, f64)>,
    /// Report results, when the request is reported.
    report: Option<Vec<Value>>,
    evaluated: Vec<verno_engine::report::Evaluated>,
    phase: verno_engine::Phase,
}

impl Observer for Recorder<'_> {
    fn policy_started(&mut self, _policy: usize) {
        self.started = Some(self.finished.take().unwrap_or_else(Instant::now));
    }

    fn policy_finished(&mut self, policy: usize, r: &PolicyResponse) {
        let Some(m) = self.set.meta(policy) else { return };
        let now = Instant::now();
        let seconds = self.started.take().map_or(0.0, |s| now.duration_since(s).as_secs_f64());
        self.finished = Some(now);
        self.policy_seconds.push((policy, seconds));
        if let (Some(out), Some(p)) = (self.report.as_mut(), self.set.policies().get(policy)) {
            let evaluated = verno_engine::report::Evaluated::of(p, self.phase);
            out.extend(verno_engine::report::results(p, r).into_iter().filter(|x| evaluated.covers(x)));
            self.evaluated.push(evaluated);
        }
        for rr in &r.rules {
            let (rule, enforce) = match m.rule_index(&rr.name) {
                Some(i) => (Ok(i), m.rules.get(i).is_some_and(|r| r.1)),
                None => (Err(Arc::from(rr.name.as_str())), false),
            };
            self.results.push(RuleResult { policy, rule, enforce, rule_type: rr.rule_type, status: rr.status });
        }
    }

    fn reads_pass_messages(&self) -> bool {
        self.report.is_some()
    }
}

/// The route of a CEL policy path (`/vpol/<name>/<name>…`): Kyverno names the policies; the
/// segments `_fail` and `_ignore`, which cannot be policy names, pick the policies by failure
/// policy (Verno's installer owns its paths, so it cannot list names).
pub fn cel_route(hook: Hook, namespaced: bool, path: &str) -> Route {
    policy_route(hook, namespaced, path, false)
}

/// The route of an ImageValidatingPolicy path (`/ivpol/validate/…`, `/ivpol/mutate/…`).
pub fn image_route(hook: Hook, namespaced: bool, path: &str) -> Route {
    policy_route(hook, namespaced, path, true)
}

fn policy_route(hook: Hook, namespaced: bool, path: &str, image: bool) -> Route {
    let mut filter = Filter::All;
    let mut names = Vec::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        match segment {
            "_fail" => filter = Filter::Fail,
            "_ignore" => filter = Filter::Ignore,
            name => names.push(name.to_string()),
        }
    }
    Route::Cel { hook, namespaced, names, filter, image }
}

/// Whether a request this route cannot evaluate (deadline, panic) is allowed: the failure
/// policy of the webhook entry behind the route.
pub fn allows_on_error(set: &PolicySet, route: &Route) -> bool {
    match route {
        Route::All | Route::Background | Route::Apply | Route::Cleanup { .. } => false,
        Route::Kyverno(_, filter) => matches!(filter, Filter::Ignore | Filter::SpecIgnore),
        Route::Cel { filter: Filter::Fail | Filter::SpecFail, .. } => false,
        Route::Cel { filter: Filter::Ignore | Filter::SpecIgnore | Filter::Nothing, .. } => true,
        Route::Cel { .. } => {
            let mut served = set.policies().iter().filter(|p| route.keeps(p)).peekable();
            served.peek().is_some() && served.all(|p| p.failure_policy_ignore)
        }
    }
}

/// What a request must carry to be evaluated at all: the object of a CREATE or UPDATE, the old
/// object of a DELETE. Without it no policy could match, and admitting would be fail-open.
fn missing_object(req: &AdmissionRequest) -> Option<&'static str> {
    match req.operation {
        Operation::Create | Operation::Update if !req.object.is_object() => Some("request.object must be an object"),
        Operation::Delete if !req.old_object.is_object() => Some("request.oldObject must be an object"),
        _ => None,
    }
}

/// How a review is made (see [`review_with`]); the default has no cluster to read, no report
/// results, and works out the events' notices.
#[derive(Clone)]
pub struct ReviewOptions<'a> {
    /// Set when the deadline passes and the failure policy has answered (the server does): the
    /// work then ends at its next check instead of holding an evaluation slot to its end. A
    /// cancelled review is not allowed.
    pub cancel: Arc<AtomicBool>,
    /// Where context entries read the cluster.
    pub data: &'a dyn verno_engine::Data,
    /// Work out the results for the resource's PolicyReport.
    pub reports: bool,
    /// Work out the events' notices (something publishes them: in a cluster).
    pub notices: bool,
}

impl Default for ReviewOptions<'_> {
    fn default() -> Self {
        ReviewOptions { cancel: Arc::default(), data: &NoData, reports: false, notices: true }
    }
}

/// Reviews one AdmissionReview with the policies of `set` that `route` serves.
pub fn review(set: &PolicySet, route: Route, review: &AdmissionReview) -> Outcome {
    review_with(set, route, review, ReviewOptions::default())
}

/// [`review`], made as `opts` says.
pub fn review_with(set: &PolicySet, route: Route, review: &AdmissionReview, opts: ReviewOptions<'_>) -> Outcome {
    let ReviewOptions { cancel, data, reports, notices: want_notices } = opts;
    let empty = AdmissionRequest::default();
    let req = review.request.as_ref().unwrap_or(&empty);
    if let Some(why) = missing_object(req) {
        return Outcome {
            review: error_review(&review.api_version, &req.uid, false, &format!("invalid AdmissionReview: {why}")),
            allowed: false,
            kind: req.kind_name().to_string(),
            namespace: req.namespace_name().to_string(),
            operation: req.operation,
            results: Vec::new(),
            policy_seconds: Vec::new(),
            notices: Vec::new(),
            report: None,
        };
    }
    let hook = route.hook().unwrap_or(Hook::Validate);
    // Mutating webhooks see no uid on CREATE (the API server assigns it later): the writer
    // finds the object by name.
    let reporting = reports
        && matches!(req.operation, Operation::Create | Operation::Update)
        && req.sub_resource.is_empty()
        && !req.object_name().is_empty();
    let mut recorder = Recorder {
        set,
        started: None,
        finished: None,
        // Room for every policy's time and (most policies have one) rule result up front: grown
        // from empty, they were reallocated eight times a request.
        results: Vec::with_capacity(set.policies().len() + 4),
        policy_seconds: Vec::with_capacity(set.policies().len()),
        report: reporting.then(Vec::new),
        evaluated: Vec::new(),
        phase: if hook == Hook::Mutate { verno_engine::Phase::Mutate } else { verno_engine::Phase::Validate },
    };
    let cel = matches!(route, Route::Cel { .. });
    let outcome = set.review(req, route, &ServerEnv { cancel }, data, &mut recorder);
    let (kind, namespace, name) = (req.kind_name(), req.namespace_name(), req.object_name());
    let allowed = outcome.allowed();
    let mut response = AdmissionResponse { uid: req.uid.clone(), allowed, ..Default::default() };
    if let Some(message) = outcome.denial(kind, namespace, name) {
        response.status = Some(ReviewStatus::failure(message));
    } else if hook == Hook::Mutate
        && let Some(patched) = &outcome.patched
    {
        let ops = jsonpatch::diff(&req.object, patched);
        if !ops.is_empty() {
            let bytes = serde_json::to_vec(&ops).unwrap_or_default();
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            response.patch_type = Some("JSONPatch".into());
        }
    }
    // As Kyverno: the ClusterPolicy webhooks warn on allowed requests only; the CEL policy
    // webhooks warn on refused ones too.
    if allowed || cel {
        response.warnings = outcome.warnings.clone();
    }
    let mut notices: Vec<Notice> = Vec::new();
    if want_notices {
        let resource = ResourceRef::of_request(req);
        notices.extend(outcome.violations_of(set, &resource).into_iter().map(Notice::Violation));
        notices.extend(
            outcome
                .applied_of(set, &resource)
                .into_iter()
                .filter(|a| allowed || a.exempted.is_empty())
                .map(Notice::Applied),
        );
    }
    Outcome {
        review: AdmissionReview::answer(&review.api_version, response),
        allowed,
        kind: kind.to_string(),
        namespace: namespace.to_string(),
        operation: req.operation,
        results: recorder.results,
        policy_seconds: recorder.policy_seconds,
        notices,
        report: match recorder.report {
            Some(results) if allowed => Some(verno_engine::report::ReportNotice {
                resource: ResourceRef::of_request(req),
                group: req.resource.group.clone(),
                version: req.resource.version.clone(),
                plural: req.resource.resource.clone(),
                evaluated: recorder.evaluated,
                results,
            }),
            _ => None,
        },
    }
}

/// The policy validation webhook (Kyverno's `/policyvalidate`): a policy or exception that
/// would not compile is refused at `kubectl apply` time with the error and its field path,
/// instead of being stored and reported in its status afterwards. It compiles through the
/// same front door as the cluster's policy watch, so what it admits can be put in force.
pub fn validate_policy_review(review: &AdmissionReview) -> AdmissionReview {
    let empty = AdmissionRequest::default();
    let req = review.request.as_ref().unwrap_or(&empty);
    let global_entry = req.kind.group == "kyverno.io" && req.kind.kind == "GlobalContextEntry";
    let error = match (Kind::of(&req.kind.api_version(), &req.kind.kind), req.object.is_object()) {
        // Kyverno's global context validation (`/globalcontextvalidate`), on the same entry.
        (None, true) if global_entry => verno_engine::global_context::GlobalEntry::from_object(&req.object).err(),
        (Some(kind), true) if !kind.is_binding() => {
            verno_engine::compile_stored(kind, &req.kind.api_version(), &req.object)
                .err()
                .map(|e| e.with_path())
                .or_else(|| {
                    (req.operation == Operation::Update && req.old_object.is_object())
                        .then(|| verno_engine::generate_update_allowed(&req.old_object, &req.object).err())
                        .flatten()
                })
        }
        _ => None,
    };
    let mut answer = error_review(&review.api_version, &req.uid, error.is_none(), error.as_deref().unwrap_or(""));
    // Kyverno's CEL policy kinds also return each error as a warning.
    if let (Some(e), Some(r)) = (&error, answer.response.as_mut())
        && Kind::of(&req.kind.api_version(), &req.kind.kind).is_some_and(warns_its_errors)
    {
        r.warnings = vec![e.clone()];
    }
    answer
}

/// Kyverno's warnings for a PolicyException created or updated where exceptions are not in
/// force: the feature off, or on with no namespace named, or another namespace named.
pub fn exception_warnings(enabled: bool, namespace: &str, exception_namespace: &str) -> Vec<String> {
    let warning = if !enabled {
        "PolicyException resources would not be processed until it is enabled."
    } else if namespace.is_empty() {
        "The exceptionNamespace flag is not set"
    } else if namespace != "*" && namespace != exception_namespace {
        "PolicyException resource namespace must match the defined namespace."
    } else {
        return Vec::new();
    };
    vec![warning.to_string()]
}

/// The kinds whose policy validation warns with its errors too (Kyverno's CEL policy kinds).
fn warns_its_errors(kind: Kind) -> bool {
    use Kind::*;
    matches!(
        kind,
        ValidatingPolicy
            | NamespacedValidatingPolicy
            | MutatingPolicy
            | NamespacedMutatingPolicy
            | GeneratingPolicy
            | NamespacedGeneratingPolicy
            | DeletingPolicy
            | NamespacedDeletingPolicy
            | ImageValidatingPolicy
            | NamespacedImageValidatingPolicy
    )
}

pub use verno_api::admission::LAST_REQUEST_ANNOTATION;

/// The probe's answer: allow, and set [`LAST_REQUEST_ANNOTATION`] to `now` by JSON patch, so
/// whoever made the write sees in the stored object that the API server reached Verno.
pub fn verify_review(review: &AdmissionReview, now: &str) -> AdmissionReview {
    let empty = AdmissionRequest::default();
    let req = review.request.as_ref().unwrap_or(&empty);
    let has_annotations = req.object.pointer("/metadata/annotations").is_some_and(Value::is_object);
    let ops = if has_annotations {
        json!([{"op": "add", "path": format!("/metadata/annotations/{}", LAST_REQUEST_ANNOTATION.replace('/', "~1")), "value": now}])
    } else {
        json!([{"op": "add", "path": "/metadata/annotations", "value": {LAST_REQUEST_ANNOTATION: now}}])
    };
    let patch = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&ops).unwrap_or_default());
    AdmissionReview::answer(
        &review.api_version,
        AdmissionResponse {
            uid: req.uid.clone(),
            allowed: true,
            patch: Some(patch),
            patch_type: Some("JSONPatch".into()),
            ..Default::default()
        },
    )
}

/// The clock and randomness for JMESPath; no DNS lookups from the admission path.
struct ServerEnv {
    cancel: Arc<AtomicBool>,
}

impl verno_jmespath::Env for ServerEnv {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
    fn cancel_flag(&self) -> Option<Arc<AtomicBool>> {
        Some(self.cancel.clone())
    }
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Utc::now().fixed_offset())
    }
    fn random_seed(&self) -> Option<u64> {
        use std::hash::{BuildHasher, Hasher};
        // A fresh randomly keyed hasher per call: random enough for `random()`, no extra crate.
        Some(std::collections::hash_map::RandomState::new().build_hasher().finish())
    }
}

/// The answer's JSON, as `serde_json::to_vec` writes it, for an answer (a review with a
/// response and no request); anything else goes through serde. Written by hand for the strings:
/// a denial message runs to kilobytes, and serde_json looks every byte up in its escape table
/// where this copies the runs that need no escape a block at a time.
pub fn answer_json(review: &AdmissionReview) -> Vec<u8> {
    let (None, Some(r)) = (&review.request, &review.response) else {
        return serde_json::to_vec(review).unwrap_or_default();
    };
    let status_len = r.status.as_ref().map_or(0, |s| s.message.len() + s.status.len() + 48);
    let mut out = Vec::with_capacity(128 + review.api_version.len() + r.uid.len() + status_len);
    out.extend_from_slice(b"{\"apiVersion\":");
    push_json_str(&mut out, &review.api_version);
    out.extend_from_slice(b",\"kind\":");
    push_json_str(&mut out, &review.kind);
    out.extend_from_slice(b",\"response\":{\"uid\":");
    push_json_str(&mut out, &r.uid);
    out.extend_from_slice(if r.allowed { b",\"allowed\":true" } else { b",\"allowed\":false" });
    if let Some(s) = &r.status {
        out.extend_from_slice(b",\"status\":{\"metadata\":");
        if serde_json::to_writer(&mut out, &s.metadata).is_err() {
            return serde_json::to_vec(review).unwrap_or_default();
        }
        out.extend_from_slice(b",\"status\":");
        push_json_str(&mut out, &s.status);
        if !s.message.is_empty() {
            out.extend_from_slice(b",\"message\":");
            push_json_str(&mut out, &s.message);
        }
        out.push(b'}');
    }
    if let Some(p) = &r.patch {
        out.extend_from_slice(b",\"patch\":");
        push_json_str(&mut out, p);
    }
    if let Some(t) = &r.patch_type {
        out.extend_from_slice(b",\"patchType\":");
        push_json_str(&mut out, t);
    }
    if !r.warnings.is_empty() {
        out.extend_from_slice(b",\"warnings\":[");
        for (i, w) in r.warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_json_str(&mut out, w);
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
    out
}

/// `s` as a JSON string, escaped as serde_json escapes: `"`, `\` and the C0 controls (the
/// short forms for backspace, form feed, newline, carriage return and tab, `\u00XX` for the
/// rest); everything else as it is.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    const BLOCK: usize = 32;
    fn needs_escape(b: u8) -> bool {
        b < 0x20 || b == b'"' || b == b'\\'
    }
    /// Whether any byte of a block needs an escape: a fold without a branch per byte, which the
    /// compiler turns into a few vector compares for the whole block.
    fn any_needs_escape(block: &[u8; BLOCK]) -> bool {
        block.iter().fold(false, |seen, &b| seen | needs_escape(b))
    }
    /// Writes the run before `i` and the escape of `b`, the byte at `i`, which needs one.
    fn escape_at(out: &mut Vec<u8>, bytes: &[u8], start: &mut usize, i: usize, b: u8) {
        out.extend_from_slice(bytes.get(*start..i).unwrap_or_default());
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0C => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'));
                out.push(HEX.get(usize::from(b & 0xF)).copied().unwrap_or(b'0'));
            }
        }
        *start = i + 1;
    }
    /// Whether a block holds a control other than a newline.
    fn other_control(block: &[u8]) -> bool {
        block.iter().fold(false, |seen, &b| seen | (b < 0x20 && b != b'\n'))
    }
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    // A denial message has a newline or a quote in most blocks, and seldom another control:
    // then the three bytes to escape are found by memchr's vector search (a byte-by-byte look
    // at each such block took ~2.8 k instructions a request, a sixtieth of the handler).
    let mut blocks = bytes.chunks_exact(BLOCK);
    let others = blocks.by_ref().any(|b| <&[u8; BLOCK]>::try_from(b).is_ok_and(|b| other_control(b)))
        || other_control(blocks.remainder());
    if !others {
        for i in memchr::memchr3_iter(b'"', b'\\', b'\n', bytes) {
            if let Some(&b) = bytes.get(i) {
                escape_at(out, bytes, &mut start, i, b);
            }
        }
        out.extend_from_slice(bytes.get(start..).unwrap_or_default());
        out.push(b'"');
        return;
    }
    let mut chunks = bytes.chunks_exact(BLOCK);
    for (n, chunk) in chunks.by_ref().enumerate() {
        if <&[u8; BLOCK]>::try_from(chunk).is_ok_and(any_needs_escape) {
            for (k, &b) in chunk.iter().enumerate() {
                if needs_escape(b) {
                    escape_at(out, bytes, &mut start, n * BLOCK + k, b);
                }
            }
        }
    }
    let tail = bytes.len() - chunks.remainder().len();
    for (k, &b) in chunks.remainder().iter().enumerate() {
        if needs_escape(b) {
            escape_at(out, bytes, &mut start, tail + k, b);
        }
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or_default());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use verno_engine::Compiled;

    fn review_of(v: Value) -> AdmissionReview {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_probe_answer_stamps_the_time_whether_or_not_annotations_exist() {
        let decode = |r: &AdmissionReview| -> Value {
            let patch = r.response.as_ref().and_then(|r| r.patch.clone()).unwrap_or_default();
            let b = base64::engine::general_purpose::STANDARD.decode(patch).unwrap_or_default();
            serde_json::from_slice(&b).unwrap_or(Value::Null)
        };
        let bare = review_of(json!({"request": {"uid": "u1", "object": {"metadata": {"name": "verno-health"}}}}));
        let r = verify_review(&bare, "2026-11-21T10:00:00Z");
        assert_eq!(r.response.as_ref().map(|r| (r.uid.as_str(), r.allowed)), Some(("u1", true)));
        assert_eq!(
            decode(&r),
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"verno.io/last-request-time": "2026-11-21T10:00:00Z"}}])
        );
        let annotated =
            review_of(json!({"request": {"uid": "u2", "object": {"metadata": {"annotations": {"a": "b"}}}}}));
        assert_eq!(
            decode(&verify_review(&annotated, "t")),
            json!([{"op": "add", "path": "/metadata/annotations/verno.io~1last-request-time", "value": "t"}])
        );
    }

    fn require_team() -> PolicySet {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "require-team"},
            "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "team",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"message": "team label", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}});
        match verno_engine::compile(&doc, &[]) {
            Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
            other => panic!("{other:?}"),
        }
    }

    /// A webhook call that reports writes each passing rule's message into the report; one
    /// that does not leaves them unwritten (nothing reads them) with the same verdict and the
    /// same results for metrics.
    #[test]
    fn pass_messages_are_written_when_a_report_reads_them() {
        let r = review_of(json!({"request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "shop",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "shop", "labels": {"team": "a"}}}}}));
        let set = require_team();
        let route = || Route::Kyverno(Hook::Validate, Filter::All);
        let reported = review_with(&set, route(), &r, ReviewOptions { reports: true, ..ReviewOptions::default() });
        let quiet = review_with(&set, route(), &r, ReviewOptions::default());
        assert!(reported.allowed && quiet.allowed);
        let results = reported.report.as_ref().map(|n| n.results.clone()).unwrap_or_default();
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results.first().and_then(|x| x.get("message")), Some(&json!("validation rule 'team' passed.")));
        assert!(quiet.report.is_none());
        let statuses = |o: &Outcome| o.results.iter().map(|x| (x.policy, x.status)).collect::<Vec<_>>();
        assert_eq!(statuses(&reported), statuses(&quiet));
        assert_eq!(statuses(&quiet), vec![(0, verno_engine::Status::Pass)]);
    }

    /// Rules matched the object's own `kind`, so a Pod whose body said
    /// `kind: Deployment` was admitted past every Pod policy.
    #[test]
    fn a_pod_that_calls_itself_a_deployment_is_still_matched_as_a_pod() {
        let r = review_of(json!({"request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "shop",
            "object": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p", "namespace": "shop"}}}}));
        let o = review(&require_team(), Route::Kyverno(Hook::Validate, Filter::All), &r);
        assert!(!o.allowed);
    }

    /// Kyverno 1.19 answers every create/update of a ClusterPolicy, Policy or (Cluster)CleanupPolicy
    /// with a deprecation warning; Verno keeps these kinds for the long run and warns for none.
    #[test]
    fn kyverno_io_policies_are_admitted_without_a_deprecation_warning() {
        let rule = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "m", "pattern": {"metadata": {"labels": {"team": "?*"}}}}});
        let cleanup = json!({"schedule": "*/5 * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}});
        for (version, kind, ns, spec) in [
            ("v1", "ClusterPolicy", "", json!({"rules": [rule.clone()]})),
            ("v1", "Policy", "team", json!({"rules": [rule.clone()]})),
            ("v2", "CleanupPolicy", "team", cleanup.clone()),
            ("v2beta1", "ClusterCleanupPolicy", "", cleanup.clone()),
        ] {
            for operation in ["CREATE", "UPDATE"] {
                let object = json!({"apiVersion": format!("kyverno.io/{version}"), "kind": kind,
                    "metadata": {"name": "p", "namespace": ns}, "spec": spec});
                let r = review_of(json!({"request": {"uid": "u", "operation": operation,
                    "kind": {"group": "kyverno.io", "version": version, "kind": kind},
                    "object": object, "oldObject": if operation == "UPDATE" { object.clone() } else { Value::Null }}}));
                let answer = validate_policy_review(&r).response.unwrap_or_default();
                assert!(answer.allowed, "{kind} {operation}: {:?}", answer.status);
                assert!(answer.warnings.is_empty(), "{kind} {operation}: {:?}", answer.warnings);
            }
        }
    }

    /// Kyverno's policy validation of the CEL kinds: each error is also a warning, in its
    /// words; a MutatingPolicy keeps an evaluation mode; a namespaced policy calls no `http.*`.
    #[test]
    fn cel_policy_validation_answers_in_kyvernos_words_with_warnings() {
        let ask = |kind: &str, namespace: &str, spec: Value| {
            let object = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": kind,
                "metadata": {"name": "p", "namespace": namespace}, "spec": spec});
            let r = review_of(json!({"request": {"uid": "u", "operation": "CREATE",
                "kind": {"group": "policies.kyverno.io", "version": "v1beta1", "kind": kind}, "object": object}}));
            validate_policy_review(&r).response.unwrap_or_default()
        };
        let missing =
            "spec.matchConstraints: Required value: a matchConstraints with at least one resource rule is required";
        let a = ask("ValidatingPolicy", "", json!({"validations": [{"expression": "true"}]}));
        assert!(!a.allowed);
        assert_eq!(a.status.map(|s| s.message).as_deref(), Some(missing));
        assert_eq!(a.warnings, vec![missing.to_string()]);

        let rules = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]});
        let mutation = json!([{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}]);
        let a = ask(
            "MutatingPolicy",
            "",
            json!({"matchConstraints": rules, "mutations": mutation,
            "evaluation": {"admission": {"enabled": false}}}),
        );
        assert_eq!(
            a.status.map(|s| s.message).as_deref(),
            Some(
                "spec.evaluation: Forbidden: disabling both admission and mutateExisting evaluation modes is not allowed"
            )
        );
        let fine = ask("MutatingPolicy", "", json!({"matchConstraints": rules, "mutations": mutation}));
        assert!(fine.allowed && fine.warnings.is_empty(), "{fine:?}");

        let calls =
            json!({"matchConstraints": rules, "validations": [{"expression": "http.Get('http://x/').ok == true"}]});
        let a = ask("NamespacedValidatingPolicy", "team", calls.clone());
        assert_eq!(
            a.status.map(|s| s.message).as_deref(),
            Some(
                "spec: Forbidden: http.* is not allowed in namespaced policies; set --allowHTTPInNamespacedPolicies to enable"
            )
        );
        // Cluster-wide it is the administrator's policy; a string that merely says http is fine.
        assert!(ask("ValidatingPolicy", "", calls).allowed);
        let text =
            json!({"matchConstraints": rules, "validations": [{"expression": "object.metadata.name != 'http'"}]});
        assert!(ask("NamespacedValidatingPolicy", "team", text).allowed);
    }

    /// A CREATE without an object matched no policy and was admitted.
    #[test]
    fn a_create_without_an_object_is_refused() {
        for object in [json!(null), json!("Pod"), json!([1])] {
            let r = review_of(json!({"request": {"uid": "u", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": object}}));
            let o = review(&require_team(), Route::Kyverno(Hook::Validate, Filter::All), &r);
            assert!(!o.allowed, "{object}");
            let msg = o.review.response.and_then(|r| r.status).map(|s| s.message).unwrap_or_default();
            assert_eq!(msg, "invalid AdmissionReview: request.object must be an object");
        }
    }

    #[test]
    fn identity_is_read_without_the_document_and_bad_bodies_get_the_full_reason() {
        let body = br#"{"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u-1", "object": {"big": [1, 2, 3]}}}"#;
        assert_eq!(identify(body), Ok(("admission.k8s.io/v1".into(), "u-1".into())));
        assert_eq!(identify(br#"{"request": {"uid": "u-2"}}"#), Ok(("admission.k8s.io/v1".into(), "u-2".into())));
        assert_eq!(identify(b"[]"), Err(ParseError::NotAnObject));
        assert_eq!(identify(br#"{"request": {}}"#), Err(ParseError::NoUid));
    }

    /// A UTF-8 body is read as text, anything else as bytes: the same review either way, and a
    /// bad byte is still reported where it is.
    #[test]
    fn text_and_byte_bodies_read_alike_and_bad_bytes_say_where() {
        let body = r#"{"request": {"uid": "u-1", "operation": "CREATE", "object": {"kind": "Pod", "metadata": {"name": "ünï\u00e9"}}}}"#;
        let typed = parse(body.as_bytes()).ok();
        let as_json = |r: Option<AdmissionReview>| r.and_then(|r| serde_json::to_value(r).ok());
        assert_eq!(as_json(typed.clone()), as_json(serde_json::from_slice::<AdmissionReview>(body.as_bytes()).ok()));
        assert_eq!(typed.and_then(|r| r.request).map(|r| r.object_name().to_string()).as_deref(), Some("ünïé"));
        let mut bad = body.as_bytes().to_vec();
        if let Some(i) = bad.iter().position(|b| *b == b'P') {
            bad.insert(i, 0xff);
        }
        let err = parse(&bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("invalid unicode code point") && err.contains("column"), "{err}");
    }

    #[test]
    fn envelope_errors_say_what_is_missing() {
        let err = |b: &[u8]| parse(b).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(err(b"[]"), "invalid AdmissionReview: expected a JSON object");
        assert_eq!(err(br#"{"request": {}}"#), "invalid AdmissionReview: request.uid is missing");
        let e7 = err(br#"{"request": {"uid": "1", "operation": 7}}"#);
        assert!(e7.starts_with("invalid AdmissionReview: invalid type"), "{e7}");
        let odd = err(br#"{"request": {"uid": "1", "operation": "PATCH"}}"#);
        assert!(odd.starts_with("invalid AdmissionReview: unknown operation \"PATCH\", expected CREATE"), "{odd}");
        assert!(parse(br#"{"request": {"uid": "1"}}"#).is_ok());
    }
}

#[cfg(test)]
mod answer_tests {
    use super::*;

    /// The hand-written answer is byte for byte what serde_json writes, for answers with and
    /// without each optional part and for strings with every kind of byte to escape, at every
    /// position around the 32-byte blocks.
    #[test]
    fn answers_are_written_as_serde_json_writes_them() {
        let mut texts: Vec<String> = vec![String::new(), "plain".into(), "é ü \u{85} \u{7f} \u{2028}".into()];
        for special in ["\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{1}", "\u{1f}", "\u{0}"] {
            for at in 0..70 {
                let mut t = "x".repeat(at);
                t.push_str(special);
                t.push_str(&"y".repeat(70 - at));
                texts.push(t);
            }
        }
        texts.push("\n\nresource Pod/ns/p was blocked due to the following policies \n\np:\n  r: 'validation error: \"x\" \\ y'\n".repeat(20));
        // Several bytes to escape at once, with and without another control among them.
        for other in ["", "\t", "\u{1}"] {
            for at in 0..40 {
                texts.push(format!("{}\"a\\b\n{other}c\"\n{}", "x".repeat(at), "y\n\\".repeat(at % 7)));
            }
        }
        for text in &texts {
            let mut metadata = serde_json::Map::new();
            if text.len() % 2 == 0 {
                metadata.insert(text.clone(), serde_json::json!({"a": [1, text]}));
            }
            let answers = [
                AdmissionResponse { uid: text.clone(), allowed: true, ..Default::default() },
                AdmissionResponse {
                    uid: "u".into(),
                    allowed: false,
                    status: Some(ReviewStatus { metadata, status: text.clone(), message: text.clone() }),
                    patch: Some(text.clone()),
                    patch_type: Some("JSONPatch".into()),
                    warnings: vec![text.clone(), "w".into()],
                },
                AdmissionResponse { uid: "u".into(), warnings: vec![text.clone()], ..Default::default() },
            ];
            for response in answers {
                let review = AdmissionReview::answer(text, response);
                let expected = serde_json::to_vec(&review).unwrap_or_default();
                assert_eq!(String::from_utf8_lossy(&answer_json(&review)), String::from_utf8_lossy(&expected));
            }
        }
        // A review that is not an answer goes through serde as it is.
        let review = AdmissionReview { request: Some(AdmissionRequest::default()), ..Default::default() };
        assert_eq!(answer_json(&review), serde_json::to_vec(&review).unwrap_or_default());
    }

    /// Kyverno's exception webhook warns when an exception would be ignored.
    #[test]
    fn exceptions_that_would_be_ignored_are_warned_about_in_kyvernos_words() {
        assert_eq!(
            exception_warnings(false, "*", "team"),
            ["PolicyException resources would not be processed until it is enabled."]
        );
        assert_eq!(exception_warnings(true, "", "team"), ["The exceptionNamespace flag is not set"]);
        assert_eq!(
            exception_warnings(true, "kyverno", "team"),
            ["PolicyException resource namespace must match the defined namespace."]
        );
        assert!(exception_warnings(true, "*", "team").is_empty());
        assert!(exception_warnings(true, "team", "team").is_empty());
    }
}
