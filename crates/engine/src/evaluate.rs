//! The per-request pipeline: for each rule of a policy, match/exclude → context → preconditions
//! → exceptions → handler. Evaluation is pure: data from outside arrives through the
//! [`Data`] port and the request.

use crate::cel_env::{cel_env, cel_vars};
use crate::context::{Context, EXCEPTIONS_KEY, Saved};
use crate::context_entry::load_context;
use crate::forms::Check;
use crate::images;
use crate::matching::MatchInput;
use crate::outcome::{NotApplied, PolicyResponse, RuleResponse, RuleType, Status};
use crate::policy::{CompiledException, CompiledPolicy, CompiledRule, RuleBody};
use crate::ports::{Data, NamespaceView, Request, obj_at, str_at};
use crate::validate::ValidateCtx;
use serde_json::Value;
use std::collections::BTreeMap;

/// The rule name of a CEL kind's result decided by a PolicyException (Kyverno's CEL engines).
pub const EXCEPTION_RULE: &str = "exception";

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
        user: req.asker.user,
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
    let data: &dyn Data = match crate::confine::Reach::of(policy.confined_to(), req.dry_run, data) {
        Some(r) => {
            reach = r;
            &reach
        }
        None => data,
    };
    ctx.set_confinement(policy.confined_to());
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
        let out = RuleRun::new(policy, rule, req, data).evaluate(
            exceptions,
            input,
            ctx,
            current.as_ref().unwrap_or(req.object),
            phase,
            &mut resp.rules,
        );
        let (patched, r) = (out.patched, out.response);
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

/// How a rule's evaluation ended before its body ran: with this answer, or (`None`) with no
/// result at all.
type Step<T> = Result<T, Option<RuleResponse>>;

/// One rule of one request: what every step of its evaluation reads.
struct RuleRun<'a> {
    policy: &'a CompiledPolicy,
    rule: &'a CompiledRule,
    req: &'a Request<'a>,
    data: &'a dyn Data,
    rt: RuleType,
    /// The rule the values given for it are keyed by (an autogen rule's original).
    origin: &'a str,
    /// The context keys the caller's values set (a `--values` file, the test's).
    provided: Vec<String>,
}

/// What one rule made of the request.
struct RuleOutcome {
    /// The rule's response (`None`: it gave none).
    response: Option<RuleResponse>,
    /// The resource as the rule left it, when it changed it.
    patched: Option<Value>,
}

impl<'a> RuleRun<'a> {
    fn new(policy: &'a CompiledPolicy, rule: &'a CompiledRule, req: &'a Request<'a>, data: &'a dyn Data) -> Self {
        let origin = rule.autogen_of.as_deref().unwrap_or(&rule.name);
        RuleRun { policy, rule, req, data, rt: rule.rule_type(), origin, provided: Vec::new() }
    }

    /// Evaluates the rule, which matched: context, exceptions, preconditions, then its body.
    /// `object`: the resource as this policy's earlier rules left it; `before`: the policy's
    /// responses so far, which responses that go before the rule's own (verifyImages' per image)
    /// join.
    fn evaluate(
        mut self,
        exceptions: &[CompiledException],
        input: &MatchInput,
        ctx: &mut Context,
        object: &Value,
        phase: Phase,
        before: &mut Vec<RuleResponse>,
    ) -> RuleOutcome {
        let mut saved = Saved::default();
        for (k, v) in self.data.rule_values(&self.policy.name, self.origin) {
            saved.absorb(ctx.set_path(&k, v));
            self.provided.push(k);
        }
        let mut out = RuleOutcome { response: None, patched: None };
        // `reportProperties` are rendered once the context is loaded and the preconditions
        // hold; responses before that carry them as written (as Kyverno's do).
        let mut properties: Option<Vec<(String, String)>> = None;
        let steps = (|| -> Step<Option<RuleResponse>> {
            let applying = self.enter(exceptions, input, ctx, &mut saved)?;
            properties = self.properties(ctx);
            self.excepted(&applying)?;
            Ok(self.body(phase, object, ctx, &mut saved, &mut out.patched, before))
        })();
        ctx.restore(saved);
        let (Ok(r) | Err(r)) = steps;
        out.response = r.map(|r| self.with_properties(r, properties));
        out
    }
}

impl RuleRun<'_> {
    fn answer(&self, status: Status, message: impl Into<String>) -> RuleResponse {
        RuleResponse::new(&self.rule.name, self.rt, status, message)
    }

    /// Loads the rule's context and checks its preconditions; gives the exceptions that name
    /// and match the rule (those that only offer allowed images or values are set in the
    /// context for the policy to read instead, as Kyverno's CEL engines do).
    fn enter<'e>(
        &self,
        exceptions: &'e [CompiledException],
        input: &MatchInput,
        ctx: &mut Context,
        saved: &mut Saved,
    ) -> Step<Vec<&'e CompiledException>> {
        let (policy, rule, data) = (self.policy, self.rule, self.data);
        load_context(&rule.context, ctx, data, &self.provided, policy.confined_to(), saved);
        let mut applying: Vec<&CompiledException> =
            exceptions.iter().filter(|e| exception_applies(e, policy, &rule.name, input, ctx, data)).collect();
        // Unless another matching exception exempts the rule outright, it runs and reads them
        // as `exceptions.allowedImages` / `exceptions.allowedValues`.
        if !applying.is_empty() && applying.iter().all(|e| !e.exempts()) {
            let images: Vec<&String> = applying.iter().flat_map(|e| &e.allowed_images).collect();
            let values: Vec<&String> = applying.iter().flat_map(|e| &e.allowed_values).collect();
            saved
                .absorb(ctx.set(EXCEPTIONS_KEY, serde_json::json!({"allowedImages": images, "allowedValues": values})));
            applying.clear();
        }
        self.cel_preconditions(ctx)?;
        self.preconditions(ctx)?;
        Ok(applying)
    }

    /// `celPreconditions` / the CEL kinds' `matchConditions`, as Kubernetes evaluates them: a
    /// condition that is false decides, even after one that failed; an error counts only when
    /// none is false.
    fn cel_preconditions(&self, ctx: &Context) -> Step<()> {
        let rule = self.rule;
        if rule.cel_preconditions.is_empty() {
            return Ok(());
        }
        // Match conditions may read params and the policy's variables.
        let vars = rule_cel_vars(rule, ctx, self.data).map_err(|e| Some(self.answer(Status::Error, e)))?;
        let mut failed = None;
        for (name, e) in &rule.cel_preconditions {
            match e.eval_bool(&vars) {
                Ok(true) => {}
                Ok(false) => {
                    // Kyverno's ValidatingPolicy engine reports a skip whose message is "skip".
                    let msg = match self.policy.kind {
                        crate::Kind::ValidatingPolicy | crate::Kind::NamespacedValidatingPolicy => "skip".to_string(),
                        _ => format!("cel preconditions not met: {name}"),
                    };
                    return Err(Some(self.answer(Status::Skip, msg)));
                }
                Err(err) => {
                    failed.get_or_insert((name, err));
                }
            }
        }
        match failed {
            None => Ok(()),
            // The CEL kinds' matchConditions are the API server's: with failurePolicy Ignore
            // an error there means the webhook is not called at all.
            Some(_)
                if self.policy.failure_policy_ignore
                    && !matches!(self.policy.kind, crate::Kind::ClusterPolicy | crate::Kind::Policy) =>
            {
                Err(None)
            }
            Some((name, err)) => {
                Err(Some(self.answer(Status::Error, format!("failed to evaluate cel preconditions: {name}: {err}"))))
            }
        }
    }

    /// The rule's JMESPath `preconditions`.
    fn preconditions(&self, ctx: &Context) -> Step<()> {
        let Some(pre) = &self.rule.preconditions else { return Ok(()) };
        match pre.evaluate(ctx) {
            Err(e) => Err(Some(self.answer(Status::Error, format!("failed to evaluate preconditions: {e}")))),
            Ok((false, msg)) => {
                let m = if msg.is_empty() {
                    "preconditions not met".to_string()
                } else {
                    format!("preconditions not met; {msg}")
                };
                Err(Some(self.answer(Status::Skip, m)))
            }
            Ok((true, _)) => Ok(()),
        }
    }

    /// `reportProperties`, rendered (a value that does not render is kept as written).
    fn properties(&self, ctx: &Context) -> Option<Vec<(String, String)>> {
        let props = &self.rule.report_properties;
        (!props.is_empty()).then(|| {
            props
                .iter()
                .map(|(k, t)| {
                    let v = match t.render(ctx, "") {
                        Ok(Value::String(s)) => s,
                        Ok(other) => other.to_string(),
                        Err(_) => t.source().to_string(),
                    };
                    (k.clone(), v)
                })
                .collect()
        })
    }

    /// What the exceptions that apply decide: a Pod Security rule has the controls they name
    /// waived; any other rule is skipped (or, in the CEL kinds, passed when the exception says
    /// `reportResult: pass`).
    fn excepted(&self, applying: &[&CompiledException]) -> Step<()> {
        if applying.is_empty() {
            return Ok(());
        }
        let hits: Vec<String> = applying.iter().map(|e| e.key.clone()).collect();
        // A podSecurity rule whose matching exceptions all name podSecurity controls is still
        // evaluated; the exceptions waive those controls (Kyverno's validate_pss handler).
        if let RuleBody::Validate(v) = &self.rule.body
            && let Check::PodSecurity(pss) = &v.check
            && applying.iter().all(|e| !e.pod_security.is_empty())
        {
            return Err(self.waive_controls(pss, applying, hits));
        }
        let mut r = if !matches!(self.policy.kind, crate::Kind::ClusterPolicy | crate::Kind::Policy) {
            // Kyverno's CEL engines: the exception with the highest priority (the first among
            // equals) decides between skip and its `reportResult: pass`.
            let top = applying.iter().fold(None::<&&CompiledException>, |best, e| match best {
                Some(b) if b.priority >= e.priority => Some(b),
                _ => Some(e),
            });
            let (status, word) =
                if top.is_some_and(|e| e.report_pass) { (Status::Pass, "passed") } else { (Status::Skip, "skipped") };
            // Kyverno's CEL engines name such a result `exception`.
            RuleResponse::new(
                EXCEPTION_RULE,
                self.rt,
                status,
                format!("rule is {word} due to policy exception: {}", hits.join(", ")),
            )
        } else {
            self.answer(Status::Skip, format!("rule is skipped due to policy exceptions{}", hits.join(", ")))
        };
        r.extra_mut().exceptions = hits;
        Err(Some(r))
    }

    /// A Pod Security rule with the controls its exceptions name waived.
    fn waive_controls(
        &self,
        pss: &crate::pss::PodSecurityCheck,
        applying: &[&CompiledException],
        hits: Vec<String>,
    ) -> Option<RuleResponse> {
        if self.req.is_delete() {
            return None;
        }
        let target = self.req.subject();
        if pss.violations(target).is_empty() {
            return Some(self.answer(Status::Pass, format!("Validation rule '{}' passed.", self.rule.name)));
        }
        let mut waived = pss.clone();
        waived.exclude.extend(applying.iter().flat_map(|e| e.pod_security.iter().cloned()));
        let left = waived.violations(target);
        if left.is_empty() {
            let mut r =
                self.answer(Status::Skip, format!("rule is skipped due to policy exceptions {}", hits.join(", ")));
            r.extra_mut().exceptions = hits;
            return Some(r);
        }
        Some(self.answer(Status::Fail, waived.message(&self.rule.name, &left)))
    }

    /// The rule's body, by kind and phase.
    fn body(
        &self,
        phase: Phase,
        object: &Value,
        ctx: &mut Context,
        saved: &mut Saved,
        patched: &mut Option<Value>,
        extra: &mut Vec<RuleResponse>,
    ) -> Option<RuleResponse> {
        let (policy, rule, req, data) = (self.policy, self.rule, self.req, self.data);
        match &rule.body {
            RuleBody::Unsupported { what, .. } => Some(self.answer(Status::Error, *what)),
            // A verifyImages rule answers once per image in the verify phase (the last
            // response is the rule's, the others go before it) and once in the validate phase.
            RuleBody::Validate(v) if phase == Phase::PinDigests => {
                let Check::Cel(c) = &v.check else { return None };
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
            RuleBody::Cleanup(c) => Some(c.decide(&rule.name, req.subject(), ctx, data, saved)),
            RuleBody::Mutate(m) => match m.cel.as_deref() {
                Some(c) => Some(self.cel_mutation(c, object, ctx, patched)),
                None => {
                    let mu = crate::mutate::Mutator { rule: &rule.name, data, policy, provided: &self.provided };
                    if !m.targets.is_empty() {
                        // Existing objects are patched by the background controller and the
                        // CLI, never while a webhook waits.
                        return req.existing.then(|| mu.run_targets(m, ctx));
                    }
                    let (r, v) = mu.run(&m.patches, &m.foreach, object, ctx);
                    *patched = v;
                    Some(r)
                }
            },
            RuleBody::Generate(g) => match g.cel.as_deref() {
                Some(c) => Some(crate::gpol::generate(g, c, policy, object, ctx, data)),
                None => Some(crate::generate::generate(g, policy, &rule.name, object, ctx, data, &self.provided)),
            },
            RuleBody::Validate(v) => self.validate(v, ctx),
        }
    }

    /// A MutatingPolicy's / MutatingAdmissionPolicy's mutations (and, for mutate-existing,
    /// its targets). A CEL mutation that applies passes, whether or not it changed anything.
    fn cel_mutation(
        &self,
        c: &crate::forms::CompiledCelMutation,
        object: &Value,
        ctx: &Context,
        patched: &mut Option<Value>,
    ) -> RuleResponse {
        let (req, data) = (self.req, self.data);
        // The variables are evaluated by `mpol::run`, against each mutation's object.
        let mut vars = match cel_env(ctx, data, c.params.as_ref(), &[]) {
            Ok(v) => v,
            Err(e) => return self.answer(Status::Error, e),
        };
        let base = (req.existing && c.targets.is_some()).then(|| {
            let mut v = vars.clone();
            // Kyverno selects the targets with the trigger as `object` and no `oldObject`: on a
            // DELETE, the deleted object.
            if let (true, Some(old)) = (req.is_delete(), req.old_object) {
                v.set("object", old);
                v.set("oldObject", &Value::Null);
            }
            for (name, e) in &c.variables {
                let _ = e.eval_into_variable(name, &mut v);
            }
            v
        });
        let mut r = match crate::mpol::run(c, object, &mut vars) {
            // Kyverno's MutatingPolicy engine says `success` whether or not the object changed,
            // with the audit annotations (of the mutated object) as properties.
            Ok(v) => {
                if !c.audit_annotations.is_empty() {
                    vars.set("object", v.as_ref().unwrap_or(object));
                }
                match crate::policy::audit_annotation_values(&c.audit_annotations, &vars) {
                    Ok(props) => {
                        *patched = v;
                        let mut r = self.answer(Status::Pass, "success");
                        if !props.is_empty() {
                            r.extra_mut().properties = props;
                        }
                        r
                    }
                    Err(e) => self.answer(Status::Error, e),
                }
            }
            Err(e) => self.answer(Status::Error, e),
        };
        if let (Some(t), Some(base)) = (c.targets.as_deref(), base) {
            match crate::mpol::run_targets(c, t, &base, data) {
                Ok(targets) => r.extra_mut().patched_targets = targets,
                Err(e) => return self.answer(Status::Error, e),
            }
        }
        r
    }

    fn validate(&self, v: &crate::forms::CompiledValidation, ctx: &mut Context) -> Option<RuleResponse> {
        // Only a foreach reads them (the call and the empty map's drop showed per rule).
        static NO_VALUES: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let fetched;
        let foreach_values = match v.check {
            Check::Foreach(_) => {
                fetched = self.data.foreach_values(&self.policy.name, self.origin);
                &fetched
            }
            _ => &NO_VALUES,
        };
        let subject = self.req.subject();
        let mut vc = ValidateCtx {
            rule: &self.rule.name,
            v,
            foreach_values,
            data: self.data,
            policy: self.policy,
            provided: &self.provided,
            subject,
        };
        vc.validate(&v.check, subject, ctx, 0, self.req.is_delete())
    }

    /// `reportProperties` on the rule's response: the rule's own first; what the check adds
    /// (Pod Security controls) wins.
    fn with_properties(&self, mut r: RuleResponse, rendered: Option<Vec<(String, String)>>) -> RuleResponse {
        let props = &self.rule.report_properties;
        if !props.is_empty() {
            let mut all =
                rendered.unwrap_or_else(|| props.iter().map(|(k, t)| (k.clone(), t.source().to_string())).collect());
            let own = &mut r.extra_mut().properties;
            all.retain(|(k, _)| !own.iter().any(|(q, _)| q == k));
            all.append(own);
            *own = all;
        }
        r
    }
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
    let names = e.refs.iter().enumerate().any(|(i, (p, rules))| {
        (*p == key || *p == policy.name)
            && rules.iter().any(|r| verno_jmespath::wildcard::matches(r, rule))
            && e.ref_kinds.get(i).is_none_or(|k| k == policy.kind.name())
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
