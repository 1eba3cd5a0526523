//! The per-request pipeline: for each rule of a policy, match/exclude → context → preconditions
//! → exceptions → handler. Evaluation is pure: data from outside arrives through the
//! [`Data`] port and the request.

use crate::context::{Context, Saved};
use crate::context_entry::load_context;
use crate::images;
use crate::matching::{MatchInput, RequestUser};
use crate::outcome::{NotApplied, PolicyResponse, RuleResponse, RuleType, Status};
use crate::policy::{CompiledException, CompiledPolicy, CompiledRule, RuleBody};
use crate::validate::{Check, ValidateCtx};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use verno_jmespath::Env;

/// The rule name of a CEL kind's result decided by a PolicyException (Kyverno's CEL engines).
pub const EXCEPTION_RULE: &str = "exception";

/// What a context loader found.
pub enum Loaded {
    Value(Value),
    /// The source is not available here (no cluster, no mock): the entry is not loaded.
    Unavailable,
    Error(String),
}

/// The engine's port to data it cannot compute itself: CLI values, ConfigMaps, API calls,
/// global context entries. The CLI answers from files; the server will answer from the cluster.
pub trait Data: Sync {
    /// Values injected for a rule (the CLI's `policies[].rules[].values`).
    fn rule_values(&self, _policy: &str, _rule: &str) -> Vec<(String, Value)> {
        Vec::new()
    }
    /// Values injected for a policy on one resource, by the resource's name (the CLI's
    /// `policies[].resources[].values`); they hold while that policy runs.
    fn resource_values(&self, _policy: &str, _resource: &str) -> Vec<(String, Value)> {
        Vec::new()
    }
    /// Labels of a namespace, for `namespaceSelector`s, when the policy set does not know them.
    fn namespace_labels(&self, _namespace: &str) -> Option<BTreeMap<String, String>> {
        None
    }
    /// Per-element values for foreach (`foreachValues`).
    fn foreach_values(&self, _policy: &str, _rule: &str) -> BTreeMap<String, Vec<Value>> {
        BTreeMap::new()
    }
    fn config_map(&self, _namespace: &str, _name: &str) -> Loaded {
        Loaded::Unavailable
    }
    /// An API call: a Kubernetes API path (`/api/...`, `/apis/...`) or an external service URL;
    /// `data` is the request body (the object `apiCall.data`'s key/value pairs make).
    fn api_call(&self, _method: &str, _url_path: &str, _data: Option<&Value>) -> Loaded {
        Loaded::Unavailable
    }
    /// An API call to a service (`apiCall.service`): its URL, with the service's CA bundle and
    /// headers. By default, [`Data::api_call`] (the CLI answers by URL from its mocks).
    fn service_call(&self, method: &str, url: &str, data: Option<&Value>, service: &Service<'_>) -> Loaded {
        let _ = service;
        self.api_call(method, url, data)
    }
    fn global_reference(&self, _name: &str) -> Loaded {
        Loaded::Unavailable
    }
    /// An image's data from its registry (`imageRegistry` context entries; Kyverno's
    /// ImageData). Unavailable unless the caller reads registries (Kyverno's CLI only with
    /// `--registry`).
    fn image_data(&self, _image: &str, _credentials: Option<&verno_api::images::RegistryCredentials>) -> Loaded {
        Loaded::Unavailable
    }
    /// The Namespace object CEL policies see as `namespaceObject`.
    fn namespace_object(&self, _name: &str) -> Option<Value> {
        None
    }
    /// The Roles (`namespace:name`) and ClusterRoles bound to a user or one of its groups, as
    /// Kyverno works them out from RoleBindings and ClusterRoleBindings for every admission
    /// request (`roles`/`clusterRoles` in match and exclude, `request.roles`,
    /// `request.clusterRoles`); `None`: not known here.
    fn user_roles(&self, _username: &str, _groups: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        None
    }
    /// `namespaceObject` as a policy of this view sees it. In a cluster every kind sees the
    /// Namespace itself (the default); Kyverno's CLI builds it differently per kind (see
    /// [`NamespaceView`]), so the CLI's data answers each view.
    fn namespace_object_as(&self, view: NamespaceView, name: &str) -> Option<Value> {
        let _ = view;
        self.namespace_object(name)
    }
    /// One object from the cluster (clone sources).
    fn resource(&self, _api_version: &str, _kind: &str, _namespace: &str, _name: &str) -> Option<Value> {
        None
    }
    /// Objects of a kind (`apiVersion` may be empty: any version) in a namespace (empty: all).
    fn list(&self, _api_version: &str, _kind: &str, _namespace: &str) -> Vec<Value> {
        Vec::new()
    }
    /// What answers the Kyverno CEL libraries (`resource.*`, `http.*`, `globalContext.Get`,
    /// `image.GetMetadata`, `time.now()`); none: they report that they are not available.
    fn cel_host(&self) -> Option<std::sync::Arc<dyn verno_cel::Host>> {
        None
    }
    /// What verifies image signatures and attestations against registries (`verifyImages`);
    /// none: such rules report that verification is not available here.
    fn image_verifier(&self) -> Option<std::sync::Arc<dyn crate::verify_images::ImageVerifier>> {
        None
    }
    /// Whether objects of a kind live in namespaces (generated objects of cluster-scoped kinds
    /// get none). By default, every kind but Kubernetes' own cluster-scoped ones.
    fn is_namespaced(&self, api_version: &str, kind: &str) -> bool {
        !crate::gpol::cluster_scoped(api_version, kind)
    }
    /// Objects of a resource (plural) and apiVersion, in a namespace (empty: all): the
    /// candidates of a MutatingPolicy's mutate-existing targets. By default, the
    /// [`Data::targets`] of that resource.
    fn resource_objects(&self, api_version: &str, resource: &str, namespace: &str) -> Vec<Value> {
        self.targets("", "", namespace)
            .into_iter()
            .filter(|o| {
                let kind = str_at(o, "/kind");
                (crate::matching::is_plural_of(resource, kind) || resource == "*")
                    && (api_version.is_empty()
                        || str_at(o, "/apiVersion") == api_version
                        || api_version.ends_with("/*"))
            })
            .collect()
    }
    /// Candidates for mutate-existing targets; the cluster by default.
    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.list(api_version, kind, namespace)
    }
}

/// How to reach a service an `apiCall` names: the PEM CA bundle that verifies it (empty: the
/// system's roots) and the headers sent.
#[derive(Debug, Clone, Copy)]
pub struct Service<'a> {
    pub ca_bundle: &'a str,
    pub headers: &'a [(String, String)],
}

/// Whose `namespaceObject` a CEL expression reads: Kyverno builds it per policy kind, and the
/// kinds differ where the request has no namespace and (in its CLI) where the namespace is not
/// described by the test's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceView {
    /// `validate.cel` in a ClusterPolicy / Policy: null for cluster-scoped requests; offline, a
    /// Namespace carrying only the request's namespace name.
    #[default]
    Rule,
    /// ValidatingAdmissionPolicy: an empty Namespace (not null) for cluster-scoped requests;
    /// offline, the name and the labels the values give it.
    ValidatingAdmission,
    /// MutatingAdmissionPolicy: as ValidatingAdmissionPolicy, but null for cluster-scoped
    /// requests.
    MutatingAdmission,
    /// The `policies.kyverno.io` kinds: null for cluster-scoped requests; offline, only a
    /// namespace the values describe (`namespaces` or `namespaceSelector`), null otherwise.
    Policy,
}

impl NamespaceView {
    pub fn of(kind: verno_api::Kind) -> Self {
        use verno_api::Kind;
        match kind {
            Kind::ClusterPolicy | Kind::Policy | Kind::CleanupPolicy | Kind::ClusterCleanupPolicy => {
                NamespaceView::Rule
            }
            Kind::ValidatingAdmissionPolicy | Kind::ValidatingAdmissionPolicyBinding => {
                NamespaceView::ValidatingAdmission
            }
            Kind::MutatingAdmissionPolicy | Kind::MutatingAdmissionPolicyBinding => NamespaceView::MutatingAdmission,
            _ => NamespaceView::Policy,
        }
    }

    /// A Namespace as Kubernetes' typed object turns into JSON: what Kyverno hands CEL when it
    /// makes one up from a name (and labels) rather than reading it.
    pub fn made_up(name: &str, labels: Option<&std::collections::BTreeMap<String, String>>) -> Value {
        let mut meta = Map::new();
        if !name.is_empty() {
            meta.insert("name".into(), Value::String(name.into()));
        }
        if let Some(l) = labels.filter(|l| !l.is_empty()) {
            meta.insert("labels".into(), json!(l));
        }
        meta.insert("creationTimestamp".into(), Value::Null);
        json!({"metadata": meta, "spec": {}, "status": {}})
    }
}

/// Which rules to run: Kyverno mutates (all policies, in sequence) before it validates, and
/// generates last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Mutate,
    /// verifyImages rules: signatures and attestations checked, digests pinned, outcomes
    /// recorded in annotations (Kyverno runs it after every mutation, before validation).
    Verify,
    /// ImageValidatingPolicies' mutating webhook: image tags pinned to their digests
    /// (`mutateDigest`), nothing verified.
    PinDigests,
    Validate,
    Generate,
    /// Cleanup and deleting policies: is a stored object due for deletion?
    Cleanup,
    All,
}

impl Phase {
    fn runs(self, body: &RuleBody) -> bool {
        matches!(
            (self, body),
            (Phase::All, _)
                | (Phase::Mutate, RuleBody::Mutate(_))
                | (Phase::Generate, RuleBody::Generate(_))
                | (Phase::Cleanup, RuleBody::Cleanup(_))
                | (Phase::Verify, RuleBody::VerifyImages(_))
                | (Phase::PinDigests, RuleBody::Validate(_))
                | (Phase::Validate, RuleBody::Validate(_) | RuleBody::Unsupported { .. } | RuleBody::VerifyImages(_))
        )
    }
}

/// A `Data` that knows nothing.
pub struct NoData;
impl Data for NoData {}

/// One admission-style request: the resource and who asks for what.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'a str,
    /// The new object (`Value::Null` on DELETE).
    pub object: &'a Value,
    /// The old object (UPDATE and DELETE).
    pub old_object: Option<&'a Value>,
    pub user: Option<&'a RequestUser>,
    /// `request.userInfo` as JSON (username, groups, ...).
    pub user_info: Option<&'a Value>,
    /// `request.userInfo` as the API server sent it (used when `user_info` is `None`): turned
    /// into JSON only if an expression reads it, which few policies do.
    pub user_info_sent: Option<&'a verno_api::admission::UserInfo>,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub subresource: &'a str,
    /// The kind the API server says the request is about (`request.kind`); `None` (the CLI):
    /// the object's own `apiVersion` and `kind`. Matching trusts this, not the object, so a
    /// Pod that calls itself a Deployment is still a Pod.
    pub kind: Option<&'a verno_api::admission::GroupVersionKind>,
    /// Extra variables (dotted keys allowed), applied after the request context.
    pub variables: &'a [(String, Value)],
    /// Whether mutate-existing rules patch their targets in this evaluation (the CLI and the
    /// background controller; never a webhook). Set from the [`crate::Scope`].
    pub existing: bool,
    /// A dry-run admission request (`request.dryRun`): API calls it makes must persist
    /// nothing, so a POST is sent with `dryRun=All`.
    pub dry_run: bool,
}

impl<'a> Request<'a> {
    /// `operation` on `object` and nothing else known: no old object, user, namespace labels,
    /// subresource, requested kind or extra variables. Set the rest with struct update syntax.
    pub fn new(operation: &'a str, object: &'a Value) -> Request<'a> {
        Request {
            operation,
            object,
            old_object: None,
            user: None,
            user_info: None,
            user_info_sent: None,
            namespace_labels: None,
            subresource: "",
            kind: None,
            variables: &[],
            existing: false,
            dry_run: false,
        }
    }

    /// The object policies match and validate: the old object on DELETE.
    pub fn subject(&self) -> &'a Value {
        if self.object.is_null() { self.old_object.unwrap_or(self.object) } else { self.object }
    }
    /// (group, version, kind) the request is about.
    pub fn group_version_kind(&self) -> (&'a str, &'a str, &'a str) {
        match self.kind.filter(|k| !k.kind.is_empty()) {
            Some(k) => (&k.group, &k.version, &k.kind),
            None => {
                let subject = self.subject();
                let (group, version) = group_version(str_at(subject, "/apiVersion"));
                (group, version, str_at(subject, "/kind"))
            }
        }
    }

    pub fn is_delete(&self) -> bool {
        self.operation.eq_ignore_ascii_case("DELETE")
    }
}

/// A string at a `/`-separated path (no JSON-pointer escapes, no allocation).
pub(crate) fn str_at<'v>(v: &'v Value, p: &str) -> &'v str {
    let mut cur = v;
    // Segments found byte by byte, not with `split('/')`: the searcher's set-up cost more than
    // these short paths' whole walk (hundreds of instructions per call, several per request).
    let mut rest = p;
    while !rest.is_empty() {
        let (seg, tail) = match rest.bytes().position(|b| b == b'/') {
            Some(i) => (rest.get(..i).unwrap_or_default(), rest.get(i + 1..).unwrap_or_default()),
            None => (rest, ""),
        };
        rest = tail;
        if seg.is_empty() {
            continue;
        }
        match member(cur, seg) {
            Some(x) => cur = x,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (``, `v1`).
fn group_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

fn obj_at<'v>(v: &'v Value, a: &str, b: &str) -> Option<&'v Map<String, Value>> {
    member(member(v, a)?, b)?.as_object()
}

/// `v[k]` when `v` is an object (the key compared in line, see `verno_jmespath::value::Key`).
fn member<'v>(v: &'v Value, k: &str) -> Option<&'v Value> {
    v.as_object().and_then(|m| verno_jmespath::value::get(m, k))
}

/// Builds the variable context for a request (shared by all policies of one evaluation).
#[cfg(test)]
pub fn build_context<'e>(req: &Request<'e>, env: &'e dyn Env) -> Context<'e> {
    build_context_with(req, env, true)
}

/// [`build_context`]; without `images` the `images` variable (the request's images, parsed) is
/// not worked out — for a set no policy of which reads it.
pub fn build_context_with<'e>(req: &Request<'e>, env: &'e dyn Env, images: bool) -> Context<'e> {
    let subject = req.subject();
    let (group, version, kind) = req.group_version_kind();
    let username = match (req.user_info, req.user_info_sent) {
        (Some(u), _) => u.get("username").and_then(Value::as_str).unwrap_or(""),
        (None, Some(u)) => u.username.as_str(),
        (None, None) => "",
    };
    let (sa_ns, sa_name) = match username.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => (String::new(), String::new()),
    };
    // `request`'s fields are filled in as expressions read them (`Context::lend_request`).
    let mut root = Map::new();
    root.insert("request".into(), Value::Object(Map::new()));
    root.insert("serviceAccountName".into(), Value::String(sa_name));
    root.insert("serviceAccountNamespace".into(), Value::String(sa_ns));
    if images {
        root.insert("images".into(), images::extract(subject));
    }
    let mut ctx = Context::new(root, req.is_delete(), env);
    ctx.lend_request(crate::context::RequestFields {
        operation: req.operation,
        old_object: req.old_object,
        subject,
        kind: (group, version, kind),
        user_info: req.user_info,
        user_info_sent: req.user_info_sent,
        user: req.user,
        subresource: req.subresource,
    });
    ctx.lend_object(req.object);
    ctx.set_serves_images(images);
    for (k, v) in req.variables {
        // Values are permanent for this request: nothing to restore.
        let _kept: Saved = ctx.set_path(k, v.clone());
    }
    ctx
}

/// One request evaluated policy after policy, as Kyverno does: each policy sees the object as
/// the earlier policies patched it. Callers run the phases in Kyverno's order (every policy's
/// Mutate, then Validate, then Generate) through [`Sequence::evaluate`].
pub struct Sequence<'r> {
    req: Request<'r>,
    patched: Option<Value>,
    /// What matching reads from the request's own object, worked out at the first policy
    /// (used while no mutation changed the object).
    facts: Option<MatchInput<'r>>,
    /// Whether responses say why rules did not apply ([`PolicyResponse::not_applied`]).
    explain: bool,
    /// A response the caller is done with, emptied, for the next one ([`Sequence::recycle`]).
    spare: PolicyResponse,
}

impl<'r> Sequence<'r> {
    pub fn new(req: Request<'r>) -> Self {
        Sequence { req, patched: None, facts: None, explain: true, spare: PolicyResponse::default() }
    }

    /// Leaves [`PolicyResponse::not_applied`] empty: a caller that drops the responses (a
    /// webhook call) does not need to know why rules did not apply.
    pub fn without_explanations(mut self) -> Self {
        self.explain = false;
        self
    }

    /// Runs one phase of one policy on the object as patched so far. A Mutate response's
    /// `patched` is the object after this policy and every earlier one (when any changed it).
    /// `gate`: the request's kind and the policy's rules a request of that kind may match
    /// (bit `i`: rule `i`), when the caller knows (see [`crate::Matcher::rules_out_kind`]).
    pub fn evaluate(
        &mut self,
        policy: &CompiledPolicy,
        gate: Option<(&str, u64)>,
        phase: Phase,
        exceptions: &[CompiledException],
        ctx: &mut Context,
        data: &dyn Data,
    ) -> PolicyResponse {
        let req = Request { object: self.patched.as_ref().unwrap_or(self.req.object), ..self.req.clone() };
        let facts = match self.patched {
            None => Some(&*self.facts.get_or_insert_with(|| match_input(&self.req))),
            Some(_) => None,
        };
        let blank = std::mem::take(&mut self.spare);
        let mut r = evaluate_phase_with(policy, gate, phase, exceptions, &req, facts, ctx, data, self.explain, blank);
        if matches!(phase, Phase::Verify | Phase::PinDigests) {
            // Only a policy whose images were verified carries the object on: the others'
            // responses keep what their own mutations made.
            if let Some(v) = &r.patched {
                self.patched = Some(v.clone());
            }
        } else if matches!(phase, Phase::Mutate | Phase::All) {
            if let Some(v) = r.patched.take() {
                self.patched = Some(v);
            }
            r.patched = self.patched.clone();
        }
        r
    }

    /// Takes back a response the caller is done with: emptied, it holds the next policy's
    /// name and rules (no allocations per policy).
    pub fn recycle(&mut self, mut r: PolicyResponse) {
        r.rules.clear();
        r.not_applied.clear();
        r.patched = None;
        self.spare = r;
    }

    /// Restores caller-set values without undoing the mutations made so far.
    pub fn restore(&self, ctx: &mut Context, saved: Saved) {
        ctx.restore(saved);
        if let Some(v) = &self.patched {
            let _kept: Saved = ctx.set_path("request.object", v.clone());
        }
    }

    /// The object after every mutation so far, if any changed it.
    pub fn patched(&self) -> Option<&Value> {
        self.patched.as_ref()
    }
}

#[cfg(test)]
/// Evaluates every rule of one policy against one request.
pub fn evaluate_policy(
    policy: &CompiledPolicy,
    exceptions: &[CompiledException],
    req: &Request,
    ctx: &mut Context,
    data: &dyn Data,
) -> PolicyResponse {
    evaluate_phase_with(policy, None, Phase::All, exceptions, req, None, ctx, data, true, PolicyResponse::default())
}

/// What matching reads from the request and the object it is about.
fn match_input<'a>(req: &Request<'a>) -> MatchInput<'a> {
    let subject = req.subject();
    let (group, version, kind) = req.group_version_kind();
    let name = {
        let n = str_at(subject, "/metadata/name");
        if n.is_empty() { str_at(subject, "/metadata/generateName") } else { n }
    };
    MatchInput {
        group,
        version,
        kind,
        subresource: req.subresource,
        name,
        namespace: str_at(subject, "/metadata/namespace"),
        labels: obj_at(subject, "metadata", "labels"),
        annotations: obj_at(subject, "metadata", "annotations"),
        operation: req.operation,
        namespace_labels: req.namespace_labels,
        user: req.user,
    }
}

/// Evaluates the rules of one phase. Mutate rules patch `request.object` in `ctx` as they go,
/// so later rules (and the caller's later policies) see the patched resource; the response's
/// `patched` holds it. `facts`: what matching reads, when the caller has it for `req`.
/// `explain`: note why rules did not apply. `blank`: an empty response to fill in. `gate`: a
/// kind and the rules a request of that kind may match; without explanations, a request of
/// that kind skips the others unread.
#[allow(clippy::too_many_arguments)]
fn evaluate_phase_with(
    policy: &CompiledPolicy,
    gate: Option<(&str, u64)>,
    phase: Phase,
    exceptions: &[CompiledException],
    req: &Request,
    facts: Option<&MatchInput>,
    ctx: &mut Context,
    data: &dyn Data,
    explain: bool,
    blank: PolicyResponse,
) -> PolicyResponse {
    let mut resp = blank;
    policy.write_key(&mut resp.policy);
    // What the policy may reach: a namespaced policy only its namespace, a dry run nothing
    // it would persist (see `crate::confine`).
    let reach;
    let data: &dyn Data = match crate::confine::Reach::of(policy, req.dry_run, data) {
        Some(r) => {
            reach = r;
            &reach
        }
        None => data,
    };
    ctx.set_confinement(crate::confine::namespace_of(policy));
    fn note(resp: &mut PolicyResponse, explain: bool, why: impl FnOnce() -> NotApplied) {
        if explain {
            resp.not_applied.push(why());
        }
    }
    ctx.set_namespace_view(NamespaceView::of(policy.kind));
    let own;
    let input = match facts {
        Some(f) => f,
        None => {
            own = match_input(req);
            &own
        }
    };
    let namespace = input.namespace;
    if policy.kind.is_namespaced() {
        let pns = policy.namespace.as_deref().unwrap_or("default");
        if namespace.is_empty() || namespace != pns {
            note(&mut resp, explain, || NotApplied {
                rule: None,
                reason: format!("namespaced policy {pns}/{} does not apply to namespace {namespace:?}", policy.name)
                    .into(),
            });
            return resp;
        }
    }
    if !policy.match_conditions.is_empty() {
        let vars = cel_vars(ctx, data);
        if let Some(name) =
            policy.match_conditions.iter().find(|(_, e)| !matches!(e.eval_bool(&vars), Ok(true))).map(|(n, _)| n)
        {
            note(&mut resp, explain, || NotApplied {
                rule: None,
                reason: format!("webhookConfiguration.matchConditions {name} does not hold").into(),
            });
            return resp;
        }
    }
    let mut current: Option<Value> = None;
    // The rules the request's kind leaves in play, when the caller worked them out for this
    // kind; the others are passed over before anything of theirs is read.
    let gate = gate.filter(|(kind, _)| !explain && verno_jmespath::value::same(kind, input.kind)).map(|(_, m)| m);
    for (index, rule) in policy.rules.iter().enumerate() {
        if gate.is_some_and(|m| m.checked_shr(index as u32).is_none_or(|bits| bits & 1 == 0)) {
            continue;
        }
        if !phase.runs(&rule.body) {
            continue;
        }
        // Nothing to patch on a DELETE, but mutate-existing rules that list it patch their
        // targets (the background controller evaluates the deleted object).
        if let RuleBody::Mutate(m) = &rule.body
            && req.is_delete()
            && !(req.existing && (!m.targets.is_empty() || m.cel.as_ref().is_some_and(|c| c.targets.is_some())))
        {
            continue;
        }
        // Once an earlier rule of this policy patched the object, later rules match the object
        // as patched (Kyverno matches each rule against the policy context's new resource): a
        // label one rule adds selects the next (cascading mutation).
        let patched_req;
        let patched_input;
        let input: &MatchInput = match &current {
            Some(c) => {
                patched_req = Request { object: c, ..req.clone() };
                patched_input = match_input(&patched_req);
                &patched_input
            }
            None => input,
        };
        // Most rules of a set name kinds the request is not (autogen's for controllers): without
        // a reason to note, the kind alone rules them out (already done when gated).
        if !explain && gate.is_none() && rule.matcher.rules_out_kind(input.kind) {
            continue;
        }
        if let Err(reason) = rule.matcher.matches(input) {
            note(&mut resp, explain, || NotApplied { rule: Some(index), reason });
            continue;
        }
        if rule.exclude.as_ref().is_some_and(|e| e.excludes(input)) {
            note(&mut resp, explain, || NotApplied { rule: Some(index), reason: "excluded".into() });
            continue;
        }
        let mut patched: Option<Value> = None;
        let mut extra: Vec<RuleResponse> = Vec::new();
        let r = evaluate_rule(
            policy,
            rule,
            exceptions,
            req,
            input,
            ctx,
            data,
            current.as_ref().unwrap_or(req.object),
            &mut patched,
            (phase, &mut extra),
        );
        resp.rules.extend(extra);
        if let Some(v) = patched {
            // Permanent for this request: later rules and policies see the patched object.
            let _kept: Saved = ctx.set_path("request.object", v.clone());
            if ctx.serves_images() {
                let _kept: Saved = ctx.set("images", images::extract(&v));
            }
            current = Some(v);
        }
        if let Some(r) = r {
            let counts = matches!(r.status, Status::Pass | Status::Fail);
            resp.rules.push(r);
            if policy.apply_one && counts {
                break;
            }
        } else {
            note(&mut resp, explain, || NotApplied { rule: Some(index), reason: "the rule produced no result".into() });
        }
    }
    resp.patched = current;
    resp
}

fn rule_type(rule: &CompiledRule) -> RuleType {
    rule.rule_type()
}

/// Where a rule's partial CEL exceptions wait for the CEL variables (`exceptions`); a name no
/// JMESPath or template can reach.
pub(crate) const EXCEPTIONS_KEY: &str = "@exceptions";

#[allow(clippy::too_many_arguments)]
fn evaluate_rule(
    policy: &CompiledPolicy,
    rule: &CompiledRule,
    exceptions: &[CompiledException],
    req: &Request,
    input: &MatchInput,
    ctx: &mut Context,
    data: &dyn Data,
    object: &Value,
    patched: &mut Option<Value>,
    (phase, extra): (Phase, &mut Vec<RuleResponse>),
) -> Option<RuleResponse> {
    let rt = rule_type(rule);
    let origin = rule.autogen_of.as_deref().unwrap_or(&rule.name);
    let mut saved = Saved::default();
    let mut provided: Vec<String> = Vec::new();
    for (k, v) in data.rule_values(&policy.name, origin) {
        saved.absorb(ctx.set_path(&k, v));
        provided.push(k);
    }
    // `reportProperties` are rendered once the context is loaded and the preconditions hold;
    // responses before that carry them as written (as Kyverno's do).
    let mut properties: Option<Vec<(String, String)>> = None;
    let result = (|| {
        load_context(&rule.context, ctx, data, &provided, policy, &mut saved);
        let mut applying: Vec<&CompiledException> =
            exceptions.iter().filter(|e| exception_applies(e, policy, &rule.name, input, ctx, data)).collect();
        // CEL exceptions that only offer allowed images or values do not exempt: the policy runs
        // and reads them as `exceptions.allowedImages` / `exceptions.allowedValues` (unless
        // another matching exception exempts it outright), as Kyverno's CEL engines do.
        if !applying.is_empty() && applying.iter().all(|e| !e.exempts()) {
            let images: Vec<&String> = applying.iter().flat_map(|e| &e.allowed_images).collect();
            let values: Vec<&String> = applying.iter().flat_map(|e| &e.allowed_values).collect();
            saved
                .absorb(ctx.set(EXCEPTIONS_KEY, serde_json::json!({"allowedImages": images, "allowedValues": values})));
            applying.clear();
        }
        if !rule.cel_preconditions.is_empty() {
            // Match conditions may read params and the policy's variables.
            let vars = match rule_cel_vars(rule, ctx, data) {
                Ok(v) => v,
                Err(e) => return Some(RuleResponse::new(&rule.name, rt, Status::Error, e)),
            };
            // As Kubernetes evaluates matchConditions: a condition that is false decides, even
            // after one that failed; an error counts only when none is false.
            let mut failed = None;
            for (name, e) in &rule.cel_preconditions {
                match e.eval_bool(&vars) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Some(RuleResponse::new(
                            &rule.name,
                            rt,
                            Status::Skip,
                            format!("cel preconditions not met: {name}"),
                        ));
                    }
                    Err(err) => {
                        failed.get_or_insert((name, err));
                    }
                }
            }
            match failed {
                None => {}
                // The CEL kinds' matchConditions are the API server's: with failurePolicy
                // Ignore an error there means the webhook is not called at all.
                Some(_)
                    if policy.failure_policy_ignore
                        && !matches!(policy.kind, crate::Kind::ClusterPolicy | crate::Kind::Policy) =>
                {
                    return None;
                }
                Some((name, err)) => {
                    return Some(RuleResponse::new(
                        &rule.name,
                        rt,
                        Status::Error,
                        format!("failed to evaluate cel preconditions: {name}: {err}"),
                    ));
                }
            }
        }
        if let Some(pre) = &rule.preconditions {
            match pre.evaluate(ctx) {
                Err(e) => {
                    return Some(RuleResponse::new(
                        &rule.name,
                        rt,
                        Status::Error,
                        format!("failed to evaluate preconditions: {e}"),
                    ));
                }
                Ok((false, msg)) => {
                    let m = if msg.is_empty() {
                        "preconditions not met".to_string()
                    } else {
                        format!("preconditions not met; {msg}")
                    };
                    return Some(RuleResponse::new(&rule.name, rt, Status::Skip, m));
                }
                Ok((true, _)) => {}
            }
        }
        if !rule.report_properties.is_empty() {
            properties = Some(
                rule.report_properties
                    .iter()
                    .map(|(k, t)| {
                        let v = match t.render(ctx, "") {
                            Ok(Value::String(s)) => s,
                            Ok(other) => other.to_string(),
                            Err(_) => t.source().to_string(),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            );
        }
        let hits: Vec<String> = applying.iter().map(|e| e.key.clone()).collect();
        // A podSecurity rule whose matching exceptions all name podSecurity controls is still
        // evaluated; the exceptions waive those controls (Kyverno's validate_pss handler).
        let pss_waivers = match &rule.body {
            RuleBody::Validate(v) if !applying.is_empty() && applying.iter().all(|e| !e.pod_security.is_empty()) => {
                match &v.check {
                    crate::validate::Check::PodSecurity(pss) => Some(pss),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(pss) = pss_waivers {
            if req.is_delete() {
                return None;
            }
            let target = req.subject();
            let own = pss.violations(target);
            if own.is_empty() {
                return Some(RuleResponse::new(
                    &rule.name,
                    rt,
                    Status::Pass,
                    format!("Validation rule '{}' passed.", rule.name),
                ));
            }
            let mut waived = pss.clone();
            waived.exclude.extend(applying.iter().flat_map(|e| e.pod_security.iter().cloned()));
            let left = waived.violations(target);
            if left.is_empty() {
                let mut r = RuleResponse::new(
                    &rule.name,
                    rt,
                    Status::Skip,
                    format!("rule is skipped due to policy exceptions {}", hits.join(", ")),
                );
                r.extra_mut().exceptions = hits;
                return Some(r);
            }
            return Some(RuleResponse::new(&rule.name, rt, Status::Fail, waived.message(&rule.name, &left)));
        }
        if !hits.is_empty() {
            let cel_kind = !matches!(policy.kind, crate::Kind::ClusterPolicy | crate::Kind::Policy);
            let mut r = if cel_kind {
                // Kyverno's CEL engines: the exception with the highest priority (the first
                // among equals) decides between skip and its `reportResult: pass`.
                let top = applying.iter().fold(None::<&&CompiledException>, |best, e| match best {
                    Some(b) if b.priority >= e.priority => Some(b),
                    _ => Some(e),
                });
                let (status, word) = if top.is_some_and(|e| e.report_pass) {
                    (Status::Pass, "passed")
                } else {
                    (Status::Skip, "skipped")
                };
                // Kyverno's CEL engines name such a result `exception`.
                RuleResponse::new(
                    EXCEPTION_RULE,
                    rt,
                    status,
                    format!("rule is {word} due to policy exception: {}", hits.join(", ")),
                )
            } else {
                RuleResponse::new(
                    &rule.name,
                    rt,
                    Status::Skip,
                    format!("rule is skipped due to policy exceptions{}", hits.join(", ")),
                )
            };
            r.extra_mut().exceptions = hits;
            return Some(r);
        }
        match &rule.body {
            RuleBody::Unsupported { what, .. } => Some(RuleResponse::new(&rule.name, rt, Status::Error, *what)),
            // A verifyImages rule answers once per image in the verify phase (the last
            // response is the rule's, the others go before it) and once in the validate phase.
            RuleBody::Validate(v) if phase == Phase::PinDigests => {
                let crate::validate::Check::Cel(c) = &v.check else { return None };
                let img = c.image.as_ref()?;
                let (r, p) = img.pin_digests(&rule.name, object, data);
                *patched = p;
                r
            }
            RuleBody::VerifyImages(v) if phase == Phase::Verify => {
                let out = v.verify(&rule.name, policy, req, object, ctx, data)?;
                *patched = out.patched;
                let mut responses = out.responses;
                let last = responses.pop();
                extra.extend(responses);
                last
            }
            RuleBody::VerifyImages(v) => v.validate(&rule.name, policy, req, object),
            RuleBody::Cleanup(c) => Some(c.decide(&rule.name, req.subject(), ctx, data, &mut saved)),
            RuleBody::Mutate(m) if m.cel.is_some() => {
                let c = m.cel.as_deref()?;
                // The variables are evaluated by `mpol::run`, against each mutation's object.
                let mut vars = match cel_env(ctx, data, c.params.as_ref(), &[]) {
                    Ok(v) => v,
                    Err(e) => return Some(RuleResponse::new(&rule.name, rt, Status::Error, e)),
                };
                let base = (req.existing && c.targets.is_some()).then(|| {
                    let mut v = vars.clone();
                    // Kyverno selects the targets with the trigger as `object` and no
                    // `oldObject`: on a DELETE, the deleted object.
                    if let (true, Some(old)) = (req.is_delete(), req.old_object) {
                        v.set("object", old);
                        v.set("oldObject", &Value::Null);
                    }
                    for (name, e) in &c.variables {
                        let _ = e.eval_into_variable(name, &mut v);
                    }
                    v
                });
                // A CEL mutation that applies passes, whether or not it changed anything.
                let mut r = match crate::mpol::run(c, object, &mut vars) {
                    // Kyverno's MutatingPolicy engine says `success` whether or not the object
                    // changed, with the audit annotations (of the mutated object) as properties.
                    Ok(v) => {
                        if !c.audit_annotations.is_empty() {
                            vars.set("object", v.as_ref().unwrap_or(object));
                        }
                        match crate::policy::audit_annotation_values(&c.audit_annotations, &vars) {
                            Ok(props) => {
                                *patched = v;
                                let mut r = RuleResponse::new(&rule.name, rt, Status::Pass, "success");
                                if !props.is_empty() {
                                    r.extra_mut().properties = props;
                                }
                                r
                            }
                            Err(e) => RuleResponse::new(&rule.name, rt, Status::Error, e),
                        }
                    }
                    Err(e) => RuleResponse::new(&rule.name, rt, Status::Error, e),
                };
                if let (Some(t), Some(base)) = (c.targets.as_deref(), base) {
                    match crate::mpol::run_targets(c, t, &base, data) {
                        Ok(targets) => r.extra_mut().patched_targets = targets,
                        Err(e) => return Some(RuleResponse::new(&rule.name, rt, Status::Error, e)),
                    }
                }
                Some(r)
            }
            RuleBody::Mutate(m) => {
                let mu = crate::mutate::Mutator { rule: &rule.name, data, policy, provided: &provided };
                if !m.targets.is_empty() {
                    // Existing objects are patched by the background controller and the CLI,
                    // never while a webhook waits.
                    return req.existing.then(|| mu.run_targets(m, ctx));
                }
                let (r, v) = mu.run(&m.patches, &m.foreach, object, ctx);
                *patched = v;
                Some(r)
            }
            RuleBody::Generate(g) => match g.cel.as_deref() {
                Some(c) => Some(crate::gpol::generate(g, c, policy, object, ctx, data)),
                None => Some(crate::generate::generate(g, policy, &rule.name, object, ctx, data, &provided)),
            },
            RuleBody::Validate(v) => {
                // Only a foreach reads them (the call and the empty map's drop showed per rule).
                static NO_VALUES: BTreeMap<String, Vec<Value>> = BTreeMap::new();
                let fetched;
                let foreach_values = match v.check {
                    crate::validate::Check::Foreach(_) => {
                        fetched = data.foreach_values(&policy.name, origin);
                        &fetched
                    }
                    _ => &NO_VALUES,
                };
                let mut vc = ValidateCtx {
                    rule: &rule.name,
                    v,
                    foreach_values,
                    data,
                    policy,
                    provided: &provided,
                    subject: req.subject(),
                };
                vc.validate(&v.check, req.subject(), ctx, 0, req.is_delete())
            }
        }
    })();
    ctx.restore(saved);
    result.map(|mut r| {
        if !rule.report_properties.is_empty() {
            // The rule's own first; what the check adds (Pod Security controls) wins.
            let mut all = properties.unwrap_or_else(|| {
                rule.report_properties.iter().map(|(k, t)| (k.clone(), t.source().to_string())).collect()
            });
            let own = &mut r.extra_mut().properties;
            all.retain(|(k, _)| !own.iter().any(|(q, _)| q == k));
            all.append(own);
            *own = all;
        }
        r
    })
}

fn exception_applies(
    e: &CompiledException,
    policy: &CompiledPolicy,
    rule: &str,
    input: &MatchInput,
    ctx: &Context,
    data: &dyn Data,
) -> bool {
    let key = policy.key();
    let names = e.refs.iter().any(|(p, rules)| {
        (*p == key || *p == policy.name) && rules.iter().any(|r| verno_jmespath::wildcard::matches(r, rule))
    });
    if !names {
        return false;
    }
    if e.matcher.as_ref().is_some_and(|m| m.matches(input).is_err()) {
        return false;
    }
    if !e.cel_conditions.is_empty() {
        let vars = cel_vars(ctx, data);
        if !e.cel_conditions.iter().all(|(_, c)| matches!(c.eval_bool(&vars), Ok(true))) {
            return false;
        }
    }
    match &e.conditions {
        Some(c) => matches!(c.evaluate(ctx), Ok((true, _))),
        None => true,
    }
}

/// The variables Kubernetes CEL expressions read: `object`, `oldObject`, `request`, and
/// (unavailable offline, so null) `namespaceObject` and `params`.
fn cel_vars(ctx: &Context, data: &dyn Data) -> verno_cel::Vars {
    ctx.cel_vars(|root, object| {
        build_cel_vars(root, object, data, ctx.env(), ctx.namespace_view(), ctx.live_namespace())
    })
}

/// `object`: the request's object when the context lends it (not in `root`'s `request`).
fn build_cel_vars(
    root: &Value,
    object: Option<&Value>,
    data: &dyn Data,
    env: &dyn verno_jmespath::Env,
    view: NamespaceView,
    live: Option<&Value>,
) -> verno_cel::Vars {
    let null = Value::Null;
    let req = root.get("request").unwrap_or(&null);
    let mut vars = verno_cel::Vars::default();
    // `request` is converted once; `object` and `oldObject` share its fields.
    match object {
        Some(o) => vars.set_with_fields("request", req, &[("object", o)]),
        None => vars.set("request", req),
    }
    for (name, field) in [("object", "object"), ("oldObject", "oldObject")] {
        if !vars.set_field_of(name, "request", field) {
            vars.set(name, &Value::Null);
        }
    }
    let mut ns = req.get("namespace").and_then(Value::as_str).unwrap_or("");
    // A Namespace is not in itself (Kyverno unsets it for the kinds it builds the object for).
    if view != NamespaceView::Policy
        && req.pointer("/kind/kind").and_then(Value::as_str) == Some("Namespace")
        && req.pointer("/kind/group").and_then(Value::as_str).unwrap_or("").is_empty()
    {
        ns = "";
    }
    // The caller's copy of the Namespace (a cluster's watch) when it holds this one; else the
    // data port's.
    let held = live.filter(|o| !ns.is_empty() && str_at(o, "/metadata/name") == ns);
    let ns_obj = if held.is_some() {
        None
    } else if !ns.is_empty() {
        data.namespace_object_as(view, ns)
    } else if view == NamespaceView::ValidatingAdmission {
        Some(NamespaceView::made_up("", None))
    } else {
        None
    };
    vars.set("namespaceObject", held.or(ns_obj.as_ref()).unwrap_or(&Value::Null));
    vars.set("params", &Value::Null);
    static NO_EXCEPTIONS: std::sync::LazyLock<Value> =
        std::sync::LazyLock::new(|| serde_json::json!({"allowedImages": [], "allowedValues": []}));
    vars.set("exceptions", root.get(EXCEPTIONS_KEY).unwrap_or(&NO_EXCEPTIONS));
    if let Some(h) = data.cel_host() {
        vars.set_host(h);
    }
    if let Some(flag) = env.cancel_flag() {
        vars.set_cancel(flag);
    }
    // The context keeps these per request (rebuilt when `request` changes): the policies
    // evaluating it share their common composition variables.
    vars.share_results();
    vars
}

/// [`cel_vars`] plus `params` and the policy's variables. Variables are lazy in Kubernetes: one
/// that fails only matters where it is used, so it is left unset and expressions reading it fail.
pub(crate) fn cel_env(
    ctx: &Context,
    data: &dyn Data,
    params: Option<&crate::policy::ParamRef>,
    variables: &[(String, verno_cel::Expr)],
) -> Result<verno_cel::Vars, String> {
    let mut vars = cel_vars(ctx, data);
    if let Some(p) = params {
        let ns = ctx.read(|root| str_at(root, "/request/namespace").to_string());
        vars.set("params", &p.resolve(data, &ns)?);
    }
    for (name, e) in variables {
        let _ = e.eval_into_variable(name, &mut vars);
    }
    Ok(vars)
}

/// The CEL variables a rule's match conditions see.
fn rule_cel_vars(rule: &CompiledRule, ctx: &Context, data: &dyn Data) -> Result<verno_cel::Vars, String> {
    match &rule.body {
        RuleBody::Validate(v) => match &v.check {
            Check::Cel(c) => cel_env(ctx, data, c.params.as_ref(), &c.variables),
            _ => Ok(cel_vars(ctx, data)),
        },
        RuleBody::Mutate(m) => match m.cel.as_deref() {
            Some(c) => cel_env(ctx, data, c.params.as_ref(), &c.variables),
            None => Ok(cel_vars(ctx, data)),
        },
        _ => Ok(cel_vars(ctx, data)),
    }
}
