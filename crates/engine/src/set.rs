//! The compiled policy set and the engine's one front door.
//!
//! A [`PolicySet`] is immutable and shared (`Arc`): the policies in force, the exceptions, and
//! where namespace labels come from. [`PolicySet::evaluate`] runs one request through the
//! phases in Kyverno's order — every policy's mutate rules (each policy sees the object as the
//! earlier ones patched it), then validate on the patched object, then generate — and returns
//! one [`Outcome`]. `verno test`, `verno apply`, the webhook (through [`PolicySet::review`])
//! and the controllers call only this, so the CLI and the cluster cannot drift apart.
//!
//! Which phases run and which policies take part is the caller's [`Scope`]: the CLI runs all
//! of them; a webhook call runs the phase of its hook with the policies of its entry
//! ([`Filter`]). Time is the caller's: an [`Observer`] hears when each policy starts and ends.

use crate::context::Saved;
use crate::context::build_context_with;
use crate::evaluate::{Phase, Sequence};
use crate::matching::{RequestUser, labels_of};
use crate::outcome::{PolicyResponse, Status};
use crate::policy::{Action, CompiledException, CompiledPolicy};
use crate::ports::{Asker, Data, Request, UserInfoRef, str_at};
use crate::verdict::{Applied, PolicyApplied, ResourceRef, RuleViolation, Violation, blocked_message};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use verno_api::AdmissionRequest;
use verno_api::{Kind, Operation};
use verno_jmespath::Env;

/// Label key → value.
pub type Labels = BTreeMap<String, String>;

/// The cluster's Namespaces, kept current from a watch (in a cluster) and read per request:
/// their labels for `namespaceSelector`s, the objects as CEL policies' `namespaceObject`.
/// Shared with the set (`Arc`) so that a namespace change does not rebuild it.
#[derive(Debug, Default)]
pub struct LiveNamespaces {
    map: RwLock<HashMap<String, Arc<LiveNamespace>>>,
}

/// One Namespace of [`LiveNamespaces`].
#[derive(Debug)]
pub struct LiveNamespace {
    pub labels: Labels,
    pub object: Arc<Value>,
}

impl LiveNamespaces {
    /// A Namespace as Kyverno hands it to CEL: without `apiVersion` and `kind` (a typed object
    /// from its lister, or from its client's GET, has no type fields).
    pub fn as_cel_sees_it(object: &mut Value) {
        if let Some(m) = object.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
        }
    }

    /// Adds or replaces a Namespace from the watch, kept as CEL sees it
    /// ([`LiveNamespaces::as_cel_sees_it`]). An object without a name is ignored.
    pub fn upsert(&self, mut object: Value) {
        let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string) else {
            return;
        };
        Self::as_cel_sees_it(&mut object);
        let labels = labels_of(&object);
        if let Ok(mut map) = self.map.write() {
            map.insert(name, Arc::new(LiveNamespace { labels, object: Arc::new(object) }));
        }
    }

    pub fn remove(&self, name: &str) {
        if let Ok(mut map) = self.map.write() {
            map.remove(name);
        }
    }

    /// Keeps only the namespaces `keep` accepts (after a re-list: the ones it listed).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        if let Ok(mut map) = self.map.write() {
            map.retain(|name, _| keep(name));
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.read().is_ok_and(|m| m.contains_key(name))
    }

    /// The Namespace: its labels and its object as CEL policies see it.
    pub fn get(&self, name: &str) -> Option<Arc<LiveNamespace>> {
        self.map.read().ok()?.get(name).cloned()
    }
}

/// What metrics and reports say about a policy, made once per set and shared by pointer.
#[derive(Debug)]
pub struct PolicyMeta {
    pub name: Arc<str>,
    /// `-` for a cluster-wide policy, as Kyverno labels it in every metric.
    pub namespace: Arc<str>,
    pub namespaced: bool,
    pub background: bool,
    /// Rule name and whether its effective action is Enforce.
    pub rules: Vec<(Arc<str>, bool)>,
}

impl PolicyMeta {
    fn of(p: &CompiledPolicy) -> PolicyMeta {
        let namespaced = p.kind.is_namespaced();
        PolicyMeta {
            name: Arc::from(p.name.as_str()),
            namespace: Arc::from(if namespaced { p.namespace.as_deref().unwrap_or("") } else { "-" }),
            namespaced,
            background: p.background,
            rules: p
                .rules
                .iter()
                .map(|r| (Arc::from(r.name.as_str()), p.rule_action(&r.name) == Action::Enforce))
                .collect(),
        }
    }

    /// The shared name of a rule and whether it enforces (a rule the set does not know: not).
    pub fn rule(&self, name: &str) -> (Arc<str>, bool) {
        self.rule_index(name).and_then(|i| self.rules.get(i)).cloned().unwrap_or_else(|| (Arc::from(name), false))
    }

    /// Where the rule `name` is in [`PolicyMeta::rules`].
    pub fn rule_index(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|(n, _)| **n == *name)
    }
}

/// The admission webhook a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Validate,
    Mutate,
}

/// Which policies a webhook entry serves: `/validate` all, `/validate/fail` the fail-closed
/// ones, `/validate/ignore` the rest (see [`fail_closed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    All,
    Fail,
    Ignore,
    /// Kyverno's layout (`kyvernoNames`): the policies whose `failurePolicy` is Fail (or not
    /// Ignore), Audit-only ones included, as Kyverno's webhook controller places them.
    SpecFail,
    /// Kyverno's layout: the policies whose `failurePolicy` is Ignore.
    SpecIgnore,
    /// No policy: a path whose work is done elsewhere (GeneratingPolicies run in the
    /// background controller).
    Nothing,
}

impl Filter {
    pub fn keeps(self, hook: Hook, p: &CompiledPolicy) -> bool {
        match self {
            Filter::All => true,
            Filter::Fail => fail_closed(hook, p),
            Filter::Ignore => !fail_closed(hook, p),
            Filter::SpecFail => !p.failure_policy_ignore,
            Filter::SpecIgnore => p.failure_policy_ignore,
            Filter::Nothing => false,
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
        Hook::Validate => p.enforces() || p.rules.iter().any(|r| p.rule_action(&r.name) == Action::Enforce),
    }
}

/// Which policies a call evaluates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Every policy: `verno test`, `verno apply`.
    All,
    /// A background scan: the policies [`CompiledPolicy::in_background_scan`] keeps.
    Background,
    /// The background controller: the policies [`CompiledPolicy::in_background_apply`] keeps.
    Apply,
    /// Kyverno's `/validate…` and `/mutate…` webhooks: ClusterPolicy and Policy only.
    Kyverno(Hook, Filter),
    /// The cleanup controller: one cleanup or deleting policy.
    Cleanup { kind: Kind, namespace: Option<String>, name: String },
    /// Kyverno's `/vpol`, `/nvpol`, `/mpol` and `/nmpol` webhooks: the validating (or mutating)
    /// CEL policies of one scope — cluster-wide or namespaced — named in the path (all of them
    /// when `names` is empty) that `filter` keeps.
    /// `image`: Kyverno's `/ivpol/validate…` and `/ivpol/mutate…` (ImageValidatingPolicies;
    /// the mutating one only pins digests).
    Cel { hook: Hook, namespaced: bool, names: Vec<String>, filter: Filter, image: bool },
}

impl Route {
    /// The webhook the route answers for; `None` for [`Route::All`].
    pub fn hook(&self) -> Option<Hook> {
        match self {
            Route::Kyverno(hook, _) | Route::Cel { hook, .. } => Some(*hook),
            Route::All | Route::Background | Route::Apply | Route::Cleanup { .. } => None,
        }
    }

    /// Whether the route evaluates `p`.
    pub fn keeps(&self, p: &CompiledPolicy) -> bool {
        match self {
            Route::All => true,
            Route::Background => p.in_background_scan(),
            Route::Apply => p.in_background_apply(),
            Route::Cleanup { kind, namespace, name } => {
                p.kind == *kind && p.name == *name && (!kind.is_namespaced() || p.namespace == *namespace)
            }
            // A policy with admission processing off is left to background scans.
            Route::Kyverno(..) | Route::Cel { .. } if !p.admission => false,
            Route::Kyverno(hook, filter) => {
                matches!(p.kind, Kind::ClusterPolicy | Kind::Policy) && filter.keeps(*hook, p)
            }
            Route::Cel { hook, namespaced, names, filter, image } => {
                let kind = match (image, hook, namespaced) {
                    (true, _, false) => Kind::ImageValidatingPolicy,
                    (true, _, true) => Kind::NamespacedImageValidatingPolicy,
                    (false, Hook::Validate, false) => Kind::ValidatingPolicy,
                    (false, Hook::Validate, true) => Kind::NamespacedValidatingPolicy,
                    (false, Hook::Mutate, false) => Kind::MutatingPolicy,
                    (false, Hook::Mutate, true) => Kind::NamespacedMutatingPolicy,
                };
                p.kind == kind && (names.is_empty() || names.contains(&p.name)) && filter.keeps(*hook, p)
            }
        }
    }
}

/// Which phases run, and for which policies.
#[derive(Debug, Clone)]
pub struct Scope {
    phases: &'static [Phase],
    route: Route,
    /// Whether [`Outcome::responses`] keeps every policy's response. A webhook call does not
    /// need them (its verdict, warnings and violations are worked out as each policy ends, and
    /// an [`Observer`] sees each response), and dropping each at once keeps the allocator warm.
    keep_responses: bool,
    /// Whether mutate-existing rules patch their targets ([`Request::existing`]).
    existing: bool,
}

impl Scope {
    /// Every phase, every policy: `verno test`, `verno apply`.
    pub const ALL: Scope = Scope {
        phases: &[Phase::Mutate, Phase::Verify, Phase::Validate, Phase::Generate, Phase::Cleanup],
        route: Route::All,
        keep_responses: true,
        existing: true,
    };

    /// A background scan of a stored object, as Kyverno's reports controller runs it: the
    /// validation phase of the background-scanned policies, and the mutation phase of the CEL
    /// mutating kinds (each on the stored object alone: a mutation that would still change
    /// it fails with "mutation is not applied"), every response kept for reports.
    pub const BACKGROUND: Scope = Scope {
        phases: &[Phase::Mutate, Phase::Validate],
        route: Route::Background,
        keep_responses: true,
        existing: false,
    };

    /// The background controller's work on one trigger: the generate rules and mutate-existing
    /// targets of the policies [`CompiledPolicy::in_background_apply`] keeps, every response kept.
    pub const APPLY: Scope =
        Scope { phases: &[Phase::Mutate, Phase::Generate], route: Route::Apply, keep_responses: true, existing: true };

    /// The cleanup controller's question about one stored object: is it due for deletion under
    /// the cleanup or deleting policy `kind` `namespace`/`name`? The policy's response is kept.
    pub fn cleanup(kind: Kind, namespace: Option<&str>, name: &str) -> Scope {
        Scope {
            phases: &[Phase::Cleanup],
            route: Route::Cleanup { kind, namespace: namespace.map(str::to_string), name: name.to_string() },
            keep_responses: true,
            existing: false,
        }
    }

    /// One webhook call: the phase of the route's hook, the policies it keeps.
    pub fn webhook(route: Route) -> Scope {
        let Some(hook) = route.hook() else { return Scope::ALL };
        let image = matches!(route, Route::Cel { image: true, .. });
        let phases: &'static [Phase] = match hook {
            Hook::Mutate if image => &[Phase::PinDigests],
            // Kyverno's mutate webhook verifies images after it mutates.
            Hook::Mutate => &[Phase::Mutate, Phase::Verify],
            Hook::Validate => &[Phase::Validate],
        };
        Scope { phases, route, keep_responses: false, existing: false }
    }

    /// The same scope, keeping every policy's response in [`Outcome::responses`].
    pub fn keeping_responses(mut self) -> Scope {
        self.keep_responses = true;
        self
    }

    fn keeps(&self, p: &CompiledPolicy) -> bool {
        self.route.keeps(p)
    }
}

/// Hears each policy's evaluation: the server times policies with it (the engine has no clock).
pub trait Observer {
    fn policy_started(&mut self, _policy: usize) {}
    fn policy_finished(&mut self, _policy: usize, _response: &PolicyResponse) {}
    /// Whether [`Observer::policy_finished`] reads the messages of passing rules (a report
    /// does). When it does not and the scope keeps no responses, they are left empty.
    fn reads_pass_messages(&self) -> bool {
        true
    }
}

impl Observer for () {}

/// What one request produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Per policy that took part (its index in [`PolicySet::policies`]), phases merged; empty
    /// unless the scope keeps responses (see [`Scope::keeping_responses`]).
    pub responses: Vec<(usize, PolicyResponse)>,
    /// The object after every mutation, when one changed it.
    pub patched: Option<Value>,
    /// Validation results that refuse the request: policy key → rule → message.
    pub blocked: BTreeMap<String, BTreeMap<String, String>>,
    /// Mutations that failed where that refuses the request (`failed to apply policy …`).
    pub mutate_failures: Vec<String>,
    /// ValidatingPolicies with the Deny action that failed or errored (`Policy p failed: …`).
    pub cel_denials: Vec<String>,
    /// MutatingPolicies with failurePolicy Fail whose mutation errored (`Policy p: …`).
    pub cel_mutation_errors: Vec<String>,
    /// Warnings for policies with `emitWarning` (`policy key.rule: message`).
    pub warnings: Vec<String>,
    /// Failed and errored validation rules: what becomes PolicyViolation events.
    pub violations: Vec<RuleViolation>,
    /// Policies that ran and failed no rule: what becomes PolicyApplied and PolicySkipped
    /// events.
    pub applied: Vec<PolicyApplied>,
    /// The caller cancelled the evaluation ([`verno_jmespath::Env::cancelled`]) before every
    /// policy ran: the rest is incomplete and the request is not [`allowed`](Outcome::allowed).
    pub cancelled: bool,
}

impl Outcome {
    pub fn allowed(&self) -> bool {
        !self.cancelled
            && self.blocked.is_empty()
            && self.mutate_failures.is_empty()
            && self.cel_denials.is_empty()
            && self.cel_mutation_errors.is_empty()
    }

    /// Kyverno's message for a refused request about `kind` `namespace/name`. Each webhook
    /// serves one family of policies, so one message applies; the CLI never shows this.
    pub fn denial(&self, kind: &str, namespace: &str, name: &str) -> Option<String> {
        if self.cancelled {
            return Some("the policy evaluation was cancelled before it finished".to_string());
        }
        if !self.mutate_failures.is_empty() {
            return Some(self.mutate_failures.join("; "));
        }
        if !self.cel_mutation_errors.is_empty() {
            // Kyverno formats the list with Go's `%v`: `[a b]`.
            let errors = self.cel_mutation_errors.join(" ");
            return Some(format!("Resource: {namespace}/{name}, Kind: {kind}, Errors: [{errors}]"));
        }
        if !self.blocked.is_empty() {
            return Some(blocked_message(kind, namespace, name, &self.blocked));
        }
        // Kyverno joins the errors with multierr: `; `.
        (!self.cel_denials.is_empty()).then(|| self.cel_denials.join("; "))
    }

    /// The violations as events need them, about `resource`.
    pub fn violations_of(&self, set: &PolicySet, resource: &ResourceRef) -> Vec<Violation> {
        self.violations
            .iter()
            .filter_map(|v| Some(Violation::new(set.policies.get(v.policy)?, v, resource.clone())))
            .collect()
    }

    /// The policies that ran and failed no rule, as events need them, about `resource`.
    pub fn applied_of(&self, set: &PolicySet, resource: &ResourceRef) -> Vec<Applied> {
        self.applied
            .iter()
            .filter_map(|a| Some(Applied::new(set.policies.get(a.policy)?, a, resource.clone())))
            .collect()
    }

    /// The responses in policy order, without the indexes (the CLI's view).
    pub fn into_responses(self) -> Vec<PolicyResponse> {
        self.responses.into_iter().map(|(_, r)| r).collect()
    }
}

/// Which of a set's policy families are all self-contained.
#[derive(Debug, Clone, Copy)]
struct SelfContained {
    kyverno: bool,
    validating: bool,
    mutating: bool,
}

/// The policies in force. Swapped whole on every change; evaluation takes `&self`.
pub struct PolicySet {
    policies: Vec<Arc<CompiledPolicy>>,
    exceptions: Vec<CompiledException>,
    meta: Vec<Arc<PolicyMeta>>,
    /// Namespace labels known without a cluster (`--namespace-labels`).
    namespace_labels: BTreeMap<String, Labels>,
    /// Namespaces kept current from the cluster: labels consulted after `namespace_labels`,
    /// objects before [`Data::namespace_object`].
    live_namespaces: Option<Arc<LiveNamespaces>>,
    /// Which families of the set's policies are all [`CompiledPolicy::self_contained`].
    self_contained: SelfContained,
    /// Some policy or exception may read the `images` variable (a string of it says `images`).
    reads_images: bool,
    /// Some policy names roles or cluster roles (match/exclude `roles`/`clusterRoles`,
    /// `request.roles`, `request.clusterRoles`): admission requests ask the data port for the
    /// user's ([`Data::user_roles`]).
    reads_roles: bool,
    /// Which rules a request of a given kind can match, known from the rules' kinds alone.
    gates: KindGates,
}

/// Which rules of each policy a request's kind leaves in play, from the rules' kinds alone
/// ([`crate::Matcher::rules_out_kind`]), worked out when the set is built. Most rules of a
/// typical set are autogen's, for Pod controllers, and a Pod request rules them out; with the
/// answer here the evaluation does not read those rules at all — each is a few cache lines of
/// matcher and kind names, and between two requests in a server TLS, HTTP and the kernel have
/// evicted them.
#[derive(Default)]
struct KindGates {
    /// Per policy: its rules a request of any kind may match (bit `i`: rule `i`; their
    /// matchers name no exact kinds); `None` for a policy of more than 64 rules (not gated).
    open: Vec<Option<u64>>,
    /// Per kind some rule names exactly: per policy, its rules that name it.
    named: Vec<(compact_str::CompactString, Vec<u64>)>,
}

impl KindGates {
    fn of(policies: &[Arc<CompiledPolicy>]) -> KindGates {
        let mut gates = KindGates { open: Vec::with_capacity(policies.len()), named: Vec::new() };
        for (i, p) in policies.iter().enumerate() {
            if p.rules.len() > 64 {
                gates.open.push(None);
                continue;
            }
            let mut open = 0u64;
            for (r, rule) in p.rules.iter().enumerate() {
                let bit = 1u64 << r;
                let Some(kinds) = rule.matcher.exact_kinds() else {
                    open |= bit;
                    continue;
                };
                for k in kinds {
                    let at = match gates.named.iter().position(|(n, _)| n == k) {
                        Some(at) => at,
                        None => {
                            gates.named.push((k.clone(), vec![0; policies.len()]));
                            gates.named.len() - 1
                        }
                    };
                    if let Some(mask) = gates.named.get_mut(at).and_then(|(_, m)| m.get_mut(i)) {
                        *mask |= bit;
                    }
                }
            }
            gates.open.push(Some(open));
        }
        gates
    }

    /// For a request of `kind`: per policy, the rules it may match (`None`: not gated).
    fn for_kind<'a>(&'a self, kind: &'a str) -> Gate<'a> {
        let named = self.named.iter().find(|(n, _)| verno_jmespath::value::same(n, kind)).map(|(_, m)| m.as_slice());
        Gate { kind, open: &self.open, named }
    }
}

impl PolicySet {
    /// Kyverno's `validate.allowExistingViolations` (on unless set to `false`): on an UPDATE, a
    /// rule that enforces (its `failureAction`, else the policy's action) and fails on the new
    /// object is judged on the old object too, as if it were being created; when that fails as
    /// well, the violation was there before and the rule is skipped — labelling, annotating or
    /// re-applying an object that predates a policy is not refused. (Pattern, anyPattern, deny,
    /// foreach and podSecurity rules; not `validate.cel`, which Kyverno judges apart.)
    fn allow_existing_violations(
        &self,
        p: &CompiledPolicy,
        gate: Option<(&str, u64)>,
        req: &Request,
        r: &mut PolicyResponse,
        env: &dyn Env,
        data: &dyn Data,
    ) {
        let Some(old) = req.old_object.filter(|o| !o.is_null()) else { return };
        if req.operation != Operation::Update
            || req.object.is_null()
            || !matches!(p.kind, Kind::ClusterPolicy | Kind::Policy)
        {
            return;
        }
        let eligible = |rr: &crate::outcome::RuleResponse| {
            rr.status == Status::Fail
                && rr.rule_type == crate::outcome::RuleType::Validation
                && p.allows_existing(&rr.name)
        };
        if !r.rules.iter().any(eligible) {
            return;
        }
        // The old object is matched as Kyverno matches it: as itself (its own kind, no
        // subresource — a `Pod/ephemeralcontainers` or `Deployment/scale` rule does not match
        // the stored Pod or Scale) and by no user (the requester's subjects and roles are not
        // the creator's), so such rules keep their violation.
        let nobody = RequestUser {
            username: "kyverno:kyverno-invalid-controller".into(),
            groups: vec!["kyverno:invalidgroup".into()],
            roles: vec!["kyverno:invalidrole".into()],
            cluster_roles: vec!["kyverno:invalidrole".into()],
        };
        let before = Request {
            operation: Operation::Create,
            object: old,
            old_object: None,
            asker: Asker { user: Some(&nobody), ..req.asker },
            subresource: "",
            kind: None,
            ..req.clone()
        };
        // Variables (`request.roles`, `request.userInfo`) stay the request's, as in Kyverno:
        // only matching is done as nobody.
        let mut ctx = build_context_with(&Request { asker: req.asker, ..before.clone() }, env, self.reads_images);
        let prior = Sequence::new(before.clone()).without_explanations().evaluate(
            p,
            gate,
            Phase::Validate,
            &self.exceptions,
            &mut ctx,
            data,
        );
        for rr in r.rules.iter_mut().filter(|rr| eligible(rr)) {
            if prior.rules.iter().any(|x| x.name == rr.name && x.status == Status::Fail) {
                *rr = crate::outcome::RuleResponse::new(
                    &rr.name,
                    crate::outcome::RuleType::Validation,
                    Status::Skip,
                    "skipping the rule evaluation as pre-existing violations are allowed",
                );
            }
        }
    }
}

/// [`KindGates`] for one request's kind.
struct Gate<'a> {
    kind: &'a str,
    open: &'a [Option<u64>],
    named: Option<&'a [u64]>,
}

impl<'a> Gate<'a> {
    /// The request's kind and the rules of policy `i` it may match.
    fn of(&self, i: usize) -> Option<(&'a str, u64)> {
        let open = self.open.get(i).copied().flatten()?;
        let named = self.named.and_then(|m| m.get(i)).copied().unwrap_or(0);
        Some((self.kind, open | named))
    }
}

impl Default for PolicySet {
    fn default() -> PolicySet {
        PolicySet::new(Vec::new(), Vec::new())
    }
}

impl PolicySet {
    pub fn new(policies: Vec<Arc<CompiledPolicy>>, exceptions: Vec<CompiledException>) -> PolicySet {
        let meta = policies.iter().map(|p| Arc::new(PolicyMeta::of(p))).collect();
        let all_of = |kinds: &[Kind]| policies.iter().filter(|p| kinds.contains(&p.kind)).all(|p| p.self_contained());
        // A CEL PolicyException's conditions run with the policies it exempts.
        let exceptions_plain = exceptions.iter().all(|e| e.cel_conditions.iter().all(|(_, c)| !c.uses_host()));
        let self_contained = SelfContained {
            kyverno: all_of(&[Kind::ClusterPolicy, Kind::Policy]),
            validating: exceptions_plain && all_of(&[Kind::ValidatingPolicy, Kind::NamespacedValidatingPolicy]),
            mutating: exceptions_plain && all_of(&[Kind::MutatingPolicy, Kind::NamespacedMutatingPolicy]),
        };
        fn says_images(v: &Value) -> bool {
            match v {
                Value::String(s) => s.contains("images"),
                Value::Array(a) => a.iter().any(says_images),
                Value::Object(m) => m.values().any(says_images),
                _ => false,
            }
        }
        // Exceptions keep no document: any with conditions may read it.
        let reads_images = policies.iter().any(|p| says_images(&p.document))
            || exceptions.iter().any(|e| e.conditions.is_some() || !e.cel_conditions.is_empty());
        fn says_roles(v: &Value) -> bool {
            match v {
                Value::String(s) => s.contains("request.roles") || s.contains("request.clusterRoles"),
                Value::Array(a) => a.iter().any(says_roles),
                Value::Object(m) => m.iter().any(|(k, v)| {
                    ((k == "roles" || k == "clusterRoles") && v.as_array().is_some_and(|a| !a.is_empty()))
                        || says_roles(v)
                }),
                _ => false,
            }
        }
        let reads_roles = policies.iter().any(|p| says_roles(&p.document)) || !exceptions.is_empty();
        let gates = KindGates::of(&policies);
        PolicySet {
            policies,
            exceptions,
            meta,
            namespace_labels: BTreeMap::new(),
            live_namespaces: None,
            self_contained,
            reads_images,
            reads_roles,
            gates,
        }
    }

    /// Whether a request on `route` is answered by self-contained policies only (see
    /// [`CompiledPolicy::self_contained`]): the Kyverno routes of a set whose ClusterPolicies
    /// and Policies all are; the ValidatingPolicy (MutatingPolicy) routes of a set whose
    /// validating (mutating) CEL policies all are — those read the request's Namespace, at hand
    /// without I/O only when [`PolicySet::holds_namespace_of`] says so. Such an evaluation is
    /// CPU in proportion to the request, with no I/O: a server may run it where it stands
    /// instead of on a pool meant for blocking work.
    pub fn self_contained(&self, route: &Route) -> bool {
        match route {
            Route::Kyverno(..) => self.self_contained.kyverno,
            Route::Cel { image: true, .. } => false,
            Route::Cel { hook: Hook::Validate, .. } => self.self_contained.validating,
            Route::Cel { hook: Hook::Mutate, .. } => self.self_contained.mutating,
            Route::All | Route::Background | Route::Apply | Route::Cleanup { .. } => false,
        }
    }

    /// Whether the Namespace CEL policies see as `namespaceObject` for `req` is at hand without
    /// I/O: the request is cluster-scoped, or the set holds the namespace (a cluster's watch),
    /// or the set has no watch (no cluster: nothing to read).
    pub fn holds_namespace_of(&self, req: &AdmissionRequest) -> bool {
        let subject = if req.object.is_null() { &req.old_object } else { &req.object };
        let ns = str_at(subject, "/metadata/namespace");
        ns.is_empty() || self.live_namespaces.as_ref().is_none_or(|l| l.contains(ns))
    }

    /// Labels of namespaces known up front (Namespace objects or a name → labels file).
    pub fn with_namespace_labels(mut self, labels: BTreeMap<String, Labels>) -> PolicySet {
        self.namespace_labels = labels;
        self
    }

    /// Namespaces kept current by a watch.
    pub fn with_live_namespaces(mut self, live: Arc<LiveNamespaces>) -> PolicySet {
        self.live_namespaces = Some(live);
        self
    }

    pub fn policies(&self) -> &[Arc<CompiledPolicy>] {
        &self.policies
    }

    pub fn exceptions(&self) -> &[CompiledException] {
        &self.exceptions
    }

    pub fn meta(&self, policy: usize) -> Option<&Arc<PolicyMeta>> {
        self.meta.get(policy)
    }

    /// Every policy's [`PolicyMeta`], in policy order.
    pub fn metas(&self) -> &[Arc<PolicyMeta>] {
        &self.meta
    }

    /// Runs one request through the phases of `scope`. `req.namespace_labels`, when unset, is
    /// looked up: a Namespace's own labels, then the set's namespaces, then `data`.
    pub fn evaluate(
        &self,
        req: &Request,
        scope: Scope,
        env: &dyn Env,
        data: &dyn Data,
        observer: &mut dyn Observer,
    ) -> Outcome {
        let subject = req.subject();
        // `str_at`, not `pointer`: no allocation on the request path.
        let ns = str_at(subject, "/metadata/namespace");
        let held = if ns.is_empty() { None } else { self.live_namespaces.as_ref().and_then(|l| l.get(ns)) };
        let own;
        let labels = match req.namespace_labels {
            Some(l) => Some(l),
            None if subject.get("kind").and_then(Value::as_str) == Some("Namespace") => {
                own = Some(labels_of(subject));
                own.as_ref()
            }
            None if ns.is_empty() => None,
            None => match (self.namespace_labels.get(ns), &held) {
                (Some(l), _) => Some(l),
                (None, Some(h)) => Some(&h.labels),
                (None, None) => {
                    own = data.namespace_labels(ns);
                    own.as_ref()
                }
            },
        };
        let req = Request { namespace_labels: labels, existing: scope.existing, ..req.clone() };
        let name = str_at(subject, "/metadata/name");
        let mut ctx = build_context_with(&req, env, self.reads_images);
        // A webhook call that keeps no response and reports nothing reads no pass message
        // (its verdict, warnings and events come from failures, names and exceptions).
        ctx.set_quiet_passes(!scope.keep_responses && !observer.reads_pass_messages());
        ctx.set_live_namespace(held.as_ref().map(|h| h.object.clone()));
        let gate = self.gates.for_kind(req.group_version_kind().2);
        let mut seq = Sequence::new(req.clone());
        if !scope.keep_responses {
            seq = seq.without_explanations();
        }
        let kept: Vec<(usize, &Arc<CompiledPolicy>)> =
            self.policies.iter().enumerate().filter(|(_, p)| scope.keeps(p)).collect();
        let capacity = if scope.keep_responses { kept.len() } else { 0 };
        // Most policies apply (each adds an entry): sized once instead of grown four times.
        let mut out = Outcome {
            responses: Vec::with_capacity(capacity),
            applied: Vec::with_capacity(kept.len()),
            ..Outcome::default()
        };
        for &phase in scope.phases {
            for &(i, p) in &kept {
                // The caller gave up (its deadline passed): stop between policies; the work
                // inside one stops at its next check (JMESPath, foreach, CEL expressions).
                if env.cancelled() {
                    out.cancelled = true;
                    break;
                }
                // A background scan mutates nothing: it asks the CEL mutating kinds only.
                let background_mutation = phase == Phase::Mutate && scope.route == Route::Background;
                if background_mutation && !p.rules.iter().any(|r| p.scans_mutation(r)) {
                    continue;
                }
                observer.policy_started(i);
                // The CLI's per-resource values hold for this policy only.
                let mut saved = Saved::default();
                for (k, v) in data.resource_values(&p.name, name) {
                    if k != "request.operation" {
                        saved.absorb(ctx.set_path(&k, v));
                    }
                }
                let mut r = if background_mutation {
                    scan_mutation(p, gate.of(i), &self.exceptions, &req, &mut ctx, data)
                } else {
                    seq.evaluate(p, gate.of(i), phase, &self.exceptions, &mut ctx, data)
                };
                seq.restore(&mut ctx, saved);
                if phase == Phase::Validate {
                    self.allow_existing_violations(p, gate.of(i), &req, &mut r, env, data);
                }
                observer.policy_finished(i, &r);
                // A response nobody keeps gives its strings to the verdict instead of copies.
                judge(&mut out, i, p, phase, &mut r, !scope.keep_responses, Some((ns, labels)));
                if !scope.keep_responses {
                    seq.recycle(r);
                    continue;
                }
                match out.responses.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, prev)) => prev.merge(r),
                    None => out.responses.push((i, r)),
                }
            }
        }
        // A background scan answers no request: nothing it finds blocks anything.
        if matches!(scope.route, Route::Background | Route::Apply | Route::Cleanup { .. }) {
            out.blocked.clear();
            out.cel_denials.clear();
            for v in &mut out.violations {
                v.blocked = false;
            }
        }
        out.patched = seq.patched().cloned();
        out
    }

    /// One admission webhook call: the request as the API server sent it, through
    /// [`PolicySet::evaluate`] with the phase and the policies of `route`.
    pub fn review(
        &self,
        req: &AdmissionRequest,
        route: Route,
        env: &dyn Env,
        data: &dyn Data,
        observer: &mut dyn Observer,
    ) -> Outcome {
        let (roles, cluster_roles) = if self.reads_roles {
            data.user_roles(&req.user_info.username, &req.user_info.groups).unwrap_or_default()
        } else {
            (Vec::new(), Vec::new())
        };
        let user = RequestUser {
            username: req.user_info.username.clone(),
            groups: req.user_info.groups.clone(),
            roles,
            cluster_roles,
        };
        let request = Request {
            operation: req.operation,
            object: &req.object,
            old_object: Some(&req.old_object).filter(|o| !o.is_null()),
            asker: Asker { user: Some(&user), info: UserInfoRef::Sent(&req.user_info) },
            namespace_labels: None,
            subresource: &req.sub_resource,
            kind: Some(&req.kind),
            variables: &[],
            existing: false,
            dry_run: req.dry_run,
        };
        self.evaluate(&request, Scope::webhook(route), env, data, observer)
    }
}

/// A background scan's question to a CEL mutating policy: is the stored object already what
/// the policy would make of it? Evaluated on the object alone (no other policy's mutation
/// before it), as Kyverno's reports controller runs each policy; a rule that applies
/// without an exception and would still change the object fails with "mutation is not
/// applied" (Kyverno's words), and the context's object is the stored one again afterwards.
fn scan_mutation(
    p: &CompiledPolicy,
    gate: Option<(&str, u64)>,
    exceptions: &[CompiledException],
    req: &Request<'_>,
    ctx: &mut crate::context::Context,
    data: &dyn Data,
) -> PolicyResponse {
    let mut lone = Sequence::new(req.clone());
    let mut r = lone.evaluate(p, gate, Phase::Mutate, exceptions, ctx, data);
    let changed = r.patched.take().is_some_and(|v| &v != req.object);
    if lone.patched().is_some() {
        let _stored: crate::context::Saved = ctx.set_path("request.object", req.object.clone());
    }
    for rr in &mut r.rules {
        if rr.status == Status::Pass && rr.exceptions().is_empty() && changed {
            rr.status = Status::Fail;
            rr.message = "mutation is not applied".into();
            // Kyverno's failure carries no audit annotations (a MutatingAdmissionPolicy's
            // binding stays).
            if p.kind != Kind::MutatingAdmissionPolicy {
                rr.extra_mut().properties.clear();
            }
        }
    }
    r
}

/// What one policy's phase means for the request: refusals, warnings and violations. With
/// `take`, the response is dropped afterwards: its names and messages are moved, not copied.
/// `at`: the resource's namespace and its labels (failure action overrides depend on them).
fn judge(
    out: &mut Outcome,
    i: usize,
    p: &CompiledPolicy,
    phase: Phase,
    r: &mut PolicyResponse,
    take: bool,
    at: crate::policy::At<'_>,
) {
    note_applied(out, i, phase, r);
    match p.kind {
        Kind::ClusterPolicy | Kind::Policy => judge_kyverno(out, i, p, phase, r, (take, at)),
        _ => judge_cel(out, i, p, phase, r),
    }
}

/// `s` itself when the response it belongs to is dropped afterwards (`take`), else a copy.
fn grab(s: &mut String, take: bool) -> String {
    if take { std::mem::take(s) } else { s.clone() }
}

/// A policy whose rules ran without a failure or an error, as Kyverno's admission events see
/// it: if some rules skipped, the ones PolicyExceptions skipped (none: no event); otherwise
/// the policy applied. A policy none of whose rules ran says nothing.
fn note_applied(out: &mut Outcome, i: usize, phase: Phase, r: &PolicyResponse) {
    if !matches!(phase, Phase::Validate | Phase::Mutate)
        || r.rules.is_empty()
        || r.rules.iter().any(|x| matches!(x.status, Status::Fail | Status::Error))
    {
        return;
    }
    let skipped = r.rules.iter().any(|x| x.status == Status::Skip);
    let exempted: Vec<(String, Vec<String>)> = r
        .rules
        .iter()
        .filter(|x| x.status == Status::Skip && !x.exceptions().is_empty())
        .map(|x| (x.name.to_string(), x.exceptions().to_vec()))
        .collect();
    if skipped && exempted.is_empty() {
        return;
    }
    out.applied.push(PolicyApplied { policy: i, exempted });
}

/// The CEL kinds, as Kyverno's `/vpol` and `/mpol` handlers answer: a ValidatingPolicy with the
/// Deny action refuses on a failure or an error, one with Warn warns; a MutatingPolicy refuses
/// on an error when its failurePolicy is Fail.
fn judge_cel(out: &mut Outcome, i: usize, p: &CompiledPolicy, phase: Phase, r: &PolicyResponse) {
    let said = |status: Status, message: &str| match status {
        Status::Error => format!("Policy {} error: {message}", p.name),
        _ => format!("Policy {} failed: {message}", p.name),
    };
    match phase {
        Phase::Validate => {
            for rr in r.rules.iter().filter(|rr| matches!(rr.status, Status::Fail | Status::Error)) {
                let deny = p.action == Action::Enforce;
                out.violations.push(RuleViolation {
                    policy: i,
                    rule: rr.name.to_string(),
                    status: rr.status,
                    message: rr.message.clone(),
                    blocked: deny,
                });
                if deny {
                    out.cel_denials.push(said(rr.status, &rr.message));
                }
                if p.emit_warning {
                    out.warnings.push(said(rr.status, &rr.message));
                }
            }
        }
        Phase::Mutate => {
            for rr in &r.rules {
                match rr.status {
                    Status::Error if !p.failure_policy_ignore => {
                        out.cel_mutation_errors.push(format!("Policy {}: {}", p.name, rr.message));
                    }
                    Status::Warn => out.warnings.push(rr.message.clone()),
                    _ => {}
                }
            }
        }
        // An ImageValidatingPolicy that cannot pin a digest refuses when it denies.
        Phase::PinDigests => {
            for rr in r.rules.iter().filter(|rr| rr.status == Status::Error) {
                if p.action == Action::Enforce {
                    out.cel_denials.push(said(rr.status, &rr.message));
                }
                if p.emit_warning {
                    out.warnings.push(said(rr.status, &rr.message));
                }
            }
        }
        Phase::Verify | Phase::Generate | Phase::Cleanup | Phase::All => {}
    }
}

/// ClusterPolicy and Policy, as Kyverno's `/validate` and `/mutate` handlers answer.
fn judge_kyverno(
    out: &mut Outcome,
    i: usize,
    p: &CompiledPolicy,
    phase: Phase,
    r: &mut PolicyResponse,
    (take, at): (bool, crate::policy::At<'_>),
) {
    match phase {
        Phase::Mutate => {
            let bad: Vec<&str> = r.rules.iter().filter(|x| p.blocks(x, at)).map(|x| x.name.as_str()).collect();
            if !bad.is_empty() {
                out.mutate_failures.push(format!("failed to apply policy {} rules {}", p.name, bad.join(", ")));
            }
            if p.emit_warning {
                out.warnings.extend(
                    r.rules
                        .iter()
                        .filter(|x| x.status != Status::Skip)
                        .map(|x| format!("policy {}.{}: {}", p.name, x.name, x.message)),
                );
            }
        }
        // verifyImages failures refuse the request as validation failures do (Kyverno's
        // image verification handler uses the same blocking rule and message).
        Phase::Validate | Phase::Verify => {
            // The policy's entry, made once per policy, under its name (a namespaced Policy's
            // too: Kyverno's message names `er.Policy().GetName()`).
            let mut blocked =
                r.rules.iter().any(|rr| p.blocks(rr, at)).then(|| out.blocked.entry(p.name.clone()).or_default());
            for rr in &mut r.rules {
                let blocks = p.blocks(rr, at);
                if matches!(rr.status, Status::Fail | Status::Error) {
                    out.violations.push(RuleViolation {
                        policy: i,
                        rule: rr.name.to_string(),
                        status: rr.status,
                        message: rr.message.clone(),
                        blocked: blocks,
                    });
                }
                if blocks {
                    if let Some(rules) = blocked.as_mut() {
                        rules.insert(rr.name.to_string(), grab(&mut rr.message, take));
                    }
                } else if p.emit_warning && rr.status != Status::Skip && rr.status != Status::Pass {
                    out.warnings.push(format!("policy {}.{}: {}", p.name, rr.name, rr.message));
                }
            }
        }
        Phase::PinDigests | Phase::Generate | Phase::Cleanup | Phase::All => {}
    }
}
