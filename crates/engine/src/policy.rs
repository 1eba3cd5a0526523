//! Compiling `kyverno.io` policies and exceptions into immutable, shareable structures.
//! Everything that can be parsed ahead of time is: templates, JMESPath, conditions, matchers,
//! autogen rules. Errors name the field path.

use crate::autogen;
use crate::condition::CompiledConditions;
use crate::context_entry::CompiledContextEntry;
use crate::error::CompileError;
use crate::forms::CompiledGeneration;
use crate::forms::CompiledMutation;
use crate::forms::CompiledValidation;
use crate::matching::Matcher;
use serde_json::Value;
use std::collections::BTreeMap;
use verno_api::{ClusterPolicy, FailureActionOverride, Kind, PolicyException, Rule};

pub use crate::forms::Action;

/// Where a resource is, for failure action overrides: its namespace and the namespace's labels
/// (`None`: not known — only overrides for every namespace hold).
pub type At<'a> = Option<(&'a str, Option<&'a BTreeMap<String, String>>)>;

/// The action of the first failure action override that holds for a resource in namespace
/// `at` (see [`CompiledPolicy::rule_action_at`]).
fn override_at(overrides: &[FailureActionOverride], at: At<'_>) -> Option<Action> {
    let empty = BTreeMap::new();
    let (ns, labels) = at.map_or(("", &empty), |(ns, l)| (ns, l.unwrap_or(&empty)));
    overrides.iter().find_map(|o| {
        let action = Action::parse(&o.action.to_ascii_lowercase())?;
        // A cluster-scoped resource has no namespace: only an override for every namespace
        // (none named, no selector) holds for it — Kyverno's policy cache matches no other, so
        // the rule does not even run before the answer.
        if ns.is_empty() && (!o.namespaces.is_empty() || o.namespace_selector.is_some()) {
            return None;
        }
        let in_namespaces = if o.namespaces.is_empty() {
            true
        } else {
            at.is_some() && o.namespaces.iter().any(|n| verno_jmespath::wildcard::matches(n, ns))
        };
        let selected =
            o.namespace_selector.as_ref().is_none_or(|sel| crate::matching::selector_matches(sel, labels, false));
        (in_namespaces && selected).then_some(action)
    })
}

#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub name: String,
    pub namespace: Option<String>,
    pub kind: Kind,
    pub action: Action,
    pub overrides: Vec<FailureActionOverride>,
    pub background: bool,
    /// Whether admission requests are evaluated (Kyverno's `spec.admission`, the CEL kinds'
    /// `evaluation.admission.enabled`); `false` leaves the policy to background scans.
    pub admission: bool,
    pub apply_one: bool,
    pub scored: bool,
    pub emit_warning: bool,
    pub failure_policy_ignore: bool,
    pub rules: Vec<CompiledRule>,
    /// A ClusterPolicy's or Policy's `spec.webhookConfiguration.matchConditions`: unless all
    /// hold (an error counts as not holding), the policy does not apply to the request, as
    /// Kyverno's engine checks them before any rule — at admission, in background scans (whose
    /// request has no user) and in the CLI.
    pub match_conditions: Vec<(String, verno_cel::Expr)>,
    /// What reports say about the policy, read once from its labels and annotations.
    pub report_meta: ReportMeta,
    /// The document as it was compiled (`status` dropped): what changed between two versions,
    /// and the autogen rules a ClusterPolicy's status lists.
    pub document: Value,
    /// [`CompiledPolicy::self_contained`], worked out once (it parses the policy's CEL) and
    /// kept for every set the policy is built into.
    pub(crate) self_contained_memo: std::sync::OnceLock<bool>,
}

impl CompiledPolicy {
    /// `name`, or `namespace/name` for a namespaced Policy.
    /// The namespace the policy is confined to: a namespaced kind's own namespace (`default`
    /// when the document names none, as matching takes it); `None` for the cluster-wide kinds.
    pub(crate) fn confined_to(&self) -> Option<&str> {
        self.kind.is_namespaced().then(|| self.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or("default"))
    }

    pub fn key(&self) -> String {
        let mut key = String::new();
        self.write_key(&mut key);
        key
    }

    /// [`CompiledPolicy::key`] into `out`, in place of what it held.
    pub fn write_key(&self, out: &mut String) {
        out.clear();
        if let Some(ns) = self.namespace.as_deref().filter(|_| self.kind == Kind::Policy) {
            out.push_str(ns);
            out.push('/');
        }
        out.push_str(&self.name);
    }

    /// The rules autogen added to a ClusterPolicy or Policy (what its `status.autogen` lists);
    /// none for the other kinds.
    pub fn autogen_rules(&self) -> Vec<Rule> {
        match self.kind {
            Kind::ClusterPolicy | Kind::Policy => serde_json::from_value::<ClusterPolicy>(self.document.clone())
                .map(|p| autogen::rules(&p))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Whether background scans evaluate this policy and report its results, as Kyverno's
    /// reports controller scans them: validation policies with background processing on
    /// (ClusterPolicy, Policy, ValidatingPolicy, NamespacedValidatingPolicy and
    /// ValidatingAdmissionPolicy), and the CEL mutating kinds (MutatingPolicy,
    /// NamespacedMutatingPolicy, MutatingAdmissionPolicy), whose scan says whether the stored
    /// object is already mutated ([`CompiledPolicy::scans_mutation`]).
    pub fn in_background_scan(&self) -> bool {
        self.background
            && match self.kind {
                Kind::ClusterPolicy | Kind::Policy => {
                    self.rules.iter().any(|r| matches!(r.body, RuleBody::Validate(_)))
                }
                Kind::ValidatingPolicy | Kind::NamespacedValidatingPolicy | Kind::ValidatingAdmissionPolicy => true,
                Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy | Kind::MutatingAdmissionPolicy => {
                    self.rules.iter().any(|r| self.scans_mutation(r))
                }
                _ => false,
            }
    }

    /// Whether a background scan evaluates `rule`'s mutation: a mutation of the object itself
    /// (not a mutate-existing one) in one of the CEL mutating kinds.
    pub fn scans_mutation(&self, rule: &CompiledRule) -> bool {
        matches!(self.kind, Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy | Kind::MutatingAdmissionPolicy)
            && matches!(&rule.body, RuleBody::Mutate(m) if m.targets.is_empty()
                && m.cel.as_ref().is_some_and(|c| c.targets.is_none()))
    }

    /// Whether the background controller works for this policy: it has generate rules or
    /// mutate-existing rules (ClusterPolicy `targets`, MutatingPolicy `mutateExisting`).
    pub fn in_background_apply(&self) -> bool {
        self.rules.iter().any(|r| match &r.body {
            RuleBody::Generate(_) => true,
            RuleBody::Mutate(m) => !m.targets.is_empty() || m.cel.as_ref().is_some_and(|c| c.targets.is_some()),
            _ => false,
        })
    }

    /// Whether evaluating the policy at admission needs nothing from outside the request and
    /// the set. Such a policy does no I/O through the [`crate::Data`] port and costs CPU in
    /// proportion to the request; the server evaluates sets of these without handing the
    /// request to another thread.
    ///
    /// - A ClusterPolicy or Policy whose context entries (rule, foreach or target level) are all
    ///   `variable`s, with no image verification, signed manifests, generate or mutate-existing
    ///   rules, and whose CEL (`validate.cel`, `celPreconditions`, webhook `matchConditions`)
    ///   has no parameters and no expression that reads the world (below).
    /// - A ValidatingPolicy or MutatingPolicy (and their namespaced kinds) with no parameters
    ///   (`paramKind`, `paramRef`), no mutate-existing targets, and no expression that calls a
    ///   library reading the world (`resource.*`, `http.*`, `globalContext`, `image.GetMetadata`,
    ///   the authorizer, `time.now()`).
    ///
    /// CEL's `namespaceObject` is read through the data port unless the set holds the
    /// namespace ([`crate::LiveNamespaces`]): a caller that wants no I/O checks
    /// [`crate::PolicySet::holds_namespace_of`] first.
    /// - No other kind (image verification, generation, cleanup).
    pub fn self_contained(&self) -> bool {
        *self.self_contained_memo.get_or_init(|| self.work_out_self_contained())
    }

    fn work_out_self_contained(&self) -> bool {
        fn plain(v: &Value) -> bool {
            match v {
                Value::Object(m) => m.iter().all(|(k, v)| match k.as_str() {
                    "context" => v.as_array().is_none_or(|entries| {
                        entries.iter().all(|e| {
                            e.as_object().is_none_or(|e| {
                                !["configMap", "apiCall", "globalReference", "imageRegistry"]
                                    .iter()
                                    .any(|k| e.contains_key(*k))
                            }) && plain(e)
                        })
                    }),
                    "verifyImages" => v.as_array().is_none_or(Vec::is_empty),
                    "manifests" | "generate" | "targets" => v.is_null(),
                    "cel" | "celPreconditions" => !reads_world(v),
                    _ => plain(v),
                }),
                Value::Array(a) => a.iter().all(plain),
                _ => true,
            }
        }
        /// Parameters, or an expression (the fields CEL kinds evaluate are all named
        /// `…expression`/`…Expression`) that calls a host library.
        fn reads_world(v: &Value) -> bool {
            match v {
                Value::Object(m) => m.iter().any(|(k, v)| match (k.as_str(), v) {
                    ("paramKind" | "paramRef", v) => !v.is_null(),
                    (k, Value::String(src)) if k.ends_with("xpression") => verno_cel::calls_host(src),
                    _ => reads_world(v),
                }),
                Value::Array(a) => a.iter().any(reads_world),
                _ => false,
            }
        }
        match self.kind {
            Kind::ClusterPolicy | Kind::Policy => {
                self.match_conditions.iter().all(|(_, e)| !e.uses_host())
                    && self.rules.iter().all(|r| r.cel_preconditions.iter().all(|(_, e)| !e.uses_host()))
                    && self.document.pointer("/spec/rules").is_none_or(plain)
            }
            Kind::ValidatingPolicy
            | Kind::NamespacedValidatingPolicy
            | Kind::MutatingPolicy
            | Kind::NamespacedMutatingPolicy => {
                !self.in_background_apply() && self.document.get("spec").is_none_or(|s| !reads_world(s))
            }
            _ => false,
        }
    }

    /// A rule's effective failure action wherever it is: [`CompiledPolicy::rule_action_at`]
    /// with no namespace (an override naming namespaces does not apply).
    pub fn rule_action(&self, rule: &str) -> Action {
        self.rule_action_at(rule, None)
    }

    /// A rule's effective failure action for a resource in namespace `at` (its name and
    /// labels), as Kyverno resolves it when deciding whether a failure blocks: the rule's
    /// `validate.failureActionOverrides` that match, its own `failureAction`, the policy's
    /// `validationFailureActionOverrides` that match, the policy's action. An override
    /// matches when its action is valid and its `namespaces` (wildcards) hold the resource's
    /// namespace — or name none — and its `namespaceSelector`, if any, selects the namespace's
    /// labels; the first that matches decides.
    pub fn rule_action_at(&self, rule: &str, at: At<'_>) -> Action {
        let own = self.rules.iter().find(|r| r.name == rule).and_then(|r| match &r.body {
            RuleBody::Validate(v) => override_at(&v.overrides, at).or(v.failure_action),
            RuleBody::VerifyImages(v) => v.failure_action,
            _ => None,
        });
        own.or_else(|| override_at(&self.overrides, at)).unwrap_or(self.action)
    }

    /// Whether a rule response blocks an admission request: a mutation that failed or errored
    /// (unless failurePolicy is Ignore), a failure of an Enforce rule, or an error under
    /// failurePolicy Fail — for a validation rule, only of a rule that enforces where the
    /// resource is: Kyverno answers with those rules and evaluates the others (Audit) after
    /// answering, so nothing they find, errors included, refuses a request.
    ///
    /// `at` is the resource's namespace and its labels, for failure action overrides.
    pub fn blocks(&self, r: &crate::outcome::RuleResponse, at: At<'_>) -> bool {
        use crate::outcome::{RuleType, Status};
        match (r.rule_type, r.status) {
            (RuleType::Mutation, Status::Fail | Status::Error) => !self.failure_policy_ignore,
            (_, Status::Fail) => self.rule_action_at(&r.name, at) == Action::Enforce,
            // Kyverno answers with the rules that enforce where the resource is; the others run
            // after the answer, so their errors refuse nothing.
            (RuleType::Validation, Status::Error) => {
                !self.failure_policy_ignore && self.rule_action_at(&r.name, at) == Action::Enforce
            }
            (_, Status::Error) => !self.failure_policy_ignore,
            _ => false,
        }
    }

    /// Whether Kyverno's `allowExistingViolations` applies to the rule `name`: a pattern,
    /// anyPattern, deny, foreach or podSecurity validation that allows existing violations and
    /// enforces by its own `failureAction` or the policy's action (overrides are not read here,
    /// as Kyverno reads none).
    pub fn allows_existing(&self, name: &str) -> bool {
        use crate::forms::Check;
        self.rules.iter().find(|r| r.name == name).is_some_and(|r| match &r.body {
            RuleBody::Validate(v) => {
                v.allow_existing_violations
                    && v.failure_action.unwrap_or(self.action) == Action::Enforce
                    && matches!(
                        v.check,
                        Check::Pattern(_)
                            | Check::AnyPattern(_)
                            | Check::Deny(_)
                            | Check::Foreach(_)
                            | Check::PodSecurity(_)
                    )
            }
            _ => false,
        })
    }

    /// Whether some validation of the policy can refuse a request (Kyverno's "enforce policy":
    /// the policy's action, an override or a rule's `failureAction` is Enforce).
    pub fn enforces(&self) -> bool {
        self.action == Action::Enforce
            || self.overrides.iter().any(|o| o.action.eq_ignore_ascii_case("enforce"))
            || self.rules.iter().any(|r| {
                matches!(&r.body, RuleBody::Validate(v)
                    if v.overrides.iter().any(|o| o.action.eq_ignore_ascii_case("enforce")))
            })
            || self
                .rules
                .iter()
                .any(|r| matches!(&r.body, RuleBody::Validate(v) if v.failure_action == Some(Action::Enforce)))
    }

    /// The result a report (and the CLI) shows for a rule response: an unscored policy reports
    /// failures as warnings, and so do Audit rules when `audit_warn` is set.
    pub fn report_result(&self, r: &crate::outcome::RuleResponse, audit_warn: bool) -> crate::outcome::Status {
        use crate::outcome::Status;
        match r.status {
            Status::Fail if !self.scored || (audit_warn && self.rule_action(&r.name) == Action::Audit) => Status::Warn,
            s => s,
        }
    }
}

#[derive(Debug, Clone)]
pub struct CompiledRule {
    pub name: String,
    /// Set on rules derived by autogen.
    pub autogen_of: Option<String>,
    pub matcher: Matcher,
    pub exclude: Option<Matcher>,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub cel_preconditions: Vec<(String, verno_cel::Expr)>,
    /// `reportProperties`: name → template, in name order.
    pub report_properties: Vec<(String, crate::template::Template)>,
    pub body: RuleBody,
}

impl CompiledRule {
    pub fn rule_type(&self) -> crate::outcome::RuleType {
        use crate::outcome::RuleType;
        match &self.body {
            RuleBody::Validate(_) => RuleType::Validation,
            RuleBody::Mutate(_) => RuleType::Mutation,
            RuleBody::Generate(_) => RuleType::Generation,
            RuleBody::Unsupported { rule_type, .. } => *rule_type,
            RuleBody::Cleanup(_) => RuleType::Deletion,
            RuleBody::VerifyImages(_) => RuleType::ImageVerify,
        }
    }
}

#[derive(Debug, Clone)]
pub enum RuleBody {
    Validate(Box<CompiledValidation>),
    Mutate(Box<CompiledMutation>),
    Generate(Box<CompiledGeneration>),
    /// A cleanup policy's decision (CleanupPolicy, DeletingPolicy and their scoped forms).
    Cleanup(Box<crate::forms::CompiledCleanup>),
    /// `verifyImages`: a verify step (between mutate and validate) and a validate step.
    VerifyImages(Box<crate::forms::CompiledVerifyImages>),
    /// Rule types this build does not evaluate yet; they yield an `error` result saying so.
    Unsupported {
        rule_type: crate::outcome::RuleType,
        what: &'static str,
    },
}

pub use crate::cel_env::ParamRef;

pub(crate) fn cel_expr(v: Option<&Value>, path: &str) -> Result<verno_cel::Expr, CompileError> {
    let src = v.and_then(Value::as_str).ok_or_else(|| CompileError::new(path, "an expression (string) is required"))?;
    verno_cel::Expr::compile(src).map_err(|e| CompileError::new(path, e))
}

/// A CEL policy kind without resource rules, in the words of Kyverno's policy validation.
pub(crate) fn missing_match_constraints() -> CompileError {
    CompileError::new(
        "spec.matchConstraints",
        "Required value: a matchConstraints with at least one resource rule is required",
    )
}

/// `auditAnnotations` (key + valueExpression) of Kyverno's CEL kinds, compiled in order.
pub(crate) fn compile_audit_annotations(
    list: Option<&Value>,
    path: &str,
) -> Result<Vec<(String, verno_cel::Expr)>, CompileError> {
    let mut out = Vec::new();
    for (i, a) in list.and_then(Value::as_array).into_iter().flatten().enumerate() {
        let p = format!("{path}.auditAnnotations[{i}]");
        let key = a.get("key").and_then(Value::as_str).filter(|k| !k.is_empty());
        let key = key.ok_or_else(|| CompileError::new(format!("{p}.key"), "a key is required"))?;
        out.push((key.to_string(), cel_expr(a.get("valueExpression"), &format!("{p}.valueExpression"))?));
    }
    Ok(out)
}

/// Kyverno's CEL engines surface `auditAnnotations` as report result properties: each
/// `valueExpression`'s string, when not empty (null leaves the key out).
pub(crate) fn audit_annotation_values(
    list: &[(String, verno_cel::Expr)],
    vars: &verno_cel::Vars,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (key, e) in list {
        match e.eval(vars) {
            Ok(Value::String(s)) if !s.is_empty() => out.push((key.clone(), s)),
            Ok(Value::String(_) | Value::Null) => {}
            Ok(other) => {
                return Err(format!(
                    "failed to convert auditAnnotation '{key}' expression: expected a string, got {}",
                    verno_jmespath::value::type_name(&other)
                ));
            }
            Err(err) => return Err(format!("failed to evaluate auditAnnotation '{key}': {err}")),
        }
    }
    Ok(out)
}

/// Kubernetes composition `variables` (name + expression), compiled in order.
pub(crate) fn compile_cel_variables(
    list: Option<&Value>,
    path: &str,
) -> Result<Vec<(String, verno_cel::Expr)>, CompileError> {
    let mut variables = Vec::new();
    for (i, v) in list.and_then(Value::as_array).into_iter().flatten().enumerate() {
        let p = format!("{path}.variables[{i}]");
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| CompileError::new(format!("{p}.name"), "a variable needs a name"))?;
        variables.push((name.to_string(), cel_expr(v.get("expression"), &format!("{p}.expression"))?));
    }
    Ok(variables)
}

/// Rule-level `celPreconditions` (match conditions): all must hold.
pub fn compile_cel_preconditions(list: &[Value], path: &str) -> Result<Vec<(String, verno_cel::Expr)>, CompileError> {
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let p = format!("{path}[{i}]");
            Ok((
                c.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                cel_expr(c.get("expression"), &format!("{p}.expression"))?,
            ))
        })
        .collect()
}

/// A compiled PolicyException.
#[derive(Debug, Clone)]
pub struct CompiledException {
    /// `namespace/name` (or `name`).
    pub key: String,
    /// `None` for CEL exceptions (`policies.kyverno.io`), which match by `matchConditions`.
    pub matcher: Option<Matcher>,
    pub conditions: Option<CompiledConditions>,
    /// CEL `matchConditions`: all must hold.
    pub cel_conditions: Vec<(String, verno_cel::Expr)>,
    pub refs: Vec<(String, Vec<String>)>,
    /// A CEL exception's `policyRefs[].kind`, one per entry of `refs`: the policy must be of
    /// that kind too (Kyverno lists a policy's exceptions by name and kind). Empty for
    /// `kyverno.io` exceptions, which name policies alone.
    pub ref_kinds: Vec<String>,
    /// `spec.podSecurity`: for a podSecurity rule, the exception waives only these controls
    /// (added to the rule's own exclusions) rather than the whole rule.
    pub pod_security: Vec<verno_api::PodSecurityStandard>,
    /// A CEL exception's `images` and `allowedValues`: when set, the exception does not exempt
    /// the policy; its CEL reads them as `exceptions.allowedImages` / `.allowedValues`.
    pub allowed_images: Vec<String>,
    pub allowed_values: Vec<String>,
    /// A CEL exception's `reportResult: pass`: the rule passes (reported as such) instead of
    /// being skipped.
    pub report_pass: bool,
    /// The `polex.kyverno.io/priority` label: among several matching CEL exceptions, the
    /// highest decides the result.
    pub priority: i64,
}

impl CompiledException {
    /// Exempts the whole rule (rather than offering allowed images or values).
    pub fn exempts(&self) -> bool {
        self.allowed_images.is_empty() && self.allowed_values.is_empty()
    }
}

pub fn compile_exception(e: &PolicyException) -> Result<CompiledException, CompileError> {
    let key = match &e.metadata.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", e.metadata.name),
        _ => e.metadata.name.clone(),
    };
    // An exception in background mode (the default) cannot match on who made a request.
    if e.spec.background.unwrap_or(true) {
        for (list, name) in [(&e.spec.match_.any, "any"), (&e.spec.match_.all, "all")] {
            for (i, f) in list.iter().flatten().enumerate() {
                let field = if !f.roles.is_empty() {
                    "roles"
                } else if !f.cluster_roles.is_empty() {
                    "clusterRoles"
                } else if !f.subjects.is_empty() {
                    "subjects"
                } else {
                    continue;
                };
                return Err(CompileError::new(
                    format!("spec.match.{name}[{i}].{field}"),
                    "Forbidden: Usage of user info is forbidden",
                ));
            }
        }
    }
    Ok(CompiledException {
        key,
        matcher: Some(Matcher::compile(&e.spec.match_, "spec.match")?),
        conditions: e
            .spec
            .conditions
            .as_ref()
            .map(|c| CompiledConditions::compile(c, "spec.conditions"))
            .transpose()?,
        cel_conditions: Vec::new(),
        refs: e.spec.exceptions.iter().map(|r| (r.policy_name.clone(), r.rule_names.clone())).collect(),
        ref_kinds: Vec::new(),
        pod_security: e.spec.pod_security.clone(),
        allowed_images: Vec::new(),
        allowed_values: Vec::new(),
        report_pass: false,
        priority: 0,
    })
}

/// Compiles a `policies.kyverno.io` PolicyException: `policyRefs` (every rule of the named
/// policies) and CEL `matchConditions`.
pub fn compile_cel_exception(doc: &Value) -> Result<CompiledException, CompileError> {
    let e: verno_api::cel::CelPolicyException = crate::decode::decode(doc)?;
    let key = match e.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", e.metadata.name),
        _ => e.metadata.name.clone(),
    };
    let refs = e.spec.policy_refs.iter().map(|r| (r.name.clone(), vec!["*".to_string()])).collect();
    let ref_kinds = e.spec.policy_refs.iter().map(|r| r.kind.clone().unwrap_or_default()).collect();
    let conds: Vec<Value> = e.spec.match_conditions.iter().map(crate::decode::json_of).collect();
    Ok(CompiledException {
        key,
        matcher: None,
        conditions: None,
        cel_conditions: compile_cel_preconditions(&conds, "spec.matchConditions")?,
        refs,
        ref_kinds,
        pod_security: Vec::new(),
        allowed_images: strings(e.spec.images.as_ref()),
        allowed_values: strings(e.spec.allowed_values.as_ref()),
        report_pass: e.spec.report_result.as_ref().and_then(Value::as_str) == Some("pass"),
        priority: e.metadata.labels.get("polex.kyverno.io/priority").and_then(|p| p.parse().ok()).unwrap_or(0),
    })
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

/// What a policy's labels and annotations say about its report results, read once when the
/// policy is compiled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportMeta {
    /// `reports.kyverno.io/disabled` (any value, Kyverno 1.16): no results at all.
    pub disabled: bool,
    /// `policies.kyverno.io/scored` is not `"false"`: failures stay failures.
    pub scored: bool,
    /// `policies.kyverno.io/severity`, when one of Kyverno's five values.
    pub severity: Option<String>,
    /// `policies.kyverno.io/category`, when not empty.
    pub category: Option<String>,
}

impl ReportMeta {
    pub fn of(document: &Value) -> ReportMeta {
        let annotation =
            |key: &str| document.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str);
        ReportMeta {
            disabled: document.pointer("/metadata/labels").and_then(|l| l.get("reports.kyverno.io/disabled")).is_some(),
            scored: annotation("policies.kyverno.io/scored") != Some("false"),
            severity: annotation("policies.kyverno.io/severity")
                .filter(|s| matches!(*s, "critical" | "high" | "medium" | "low" | "info"))
                .map(str::to_string),
            category: annotation("policies.kyverno.io/category").filter(|c| !c.is_empty()).map(str::to_string),
        }
    }
}
