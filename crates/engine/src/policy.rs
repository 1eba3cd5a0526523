//! Compiling `kyverno.io` policies and exceptions into immutable, shareable structures.
//! Everything that can be parsed ahead of time is: templates, JMESPath, conditions, matchers,
//! autogen rules. Errors name the field path.

use crate::autogen;
use crate::condition::CompiledConditions;
use crate::error::CompileError;
use crate::matching::Matcher;
use crate::template::{TValue, Template};
use serde_json::Value;
use verno_api::{
    ClusterPolicy, ContextEntry, FailureActionOverride, ForEachValidation, Kind, PolicyException, Rule, Validation,
};
use verno_jmespath::Expression;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Audit,
    Enforce,
}

impl Action {
    fn parse(s: &str) -> Option<Action> {
        match s {
            "Audit" | "audit" => Some(Action::Audit),
            "Enforce" | "enforce" => Some(Action::Enforce),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub name: String,
    pub namespace: Option<String>,
    pub kind: Kind,
    pub action: Action,
    pub overrides: Vec<FailureActionOverride>,
    pub background: bool,
    pub apply_one: bool,
    pub scored: bool,
    pub emit_warning: bool,
    pub failure_policy_ignore: bool,
    pub rules: Vec<CompiledRule>,
    /// The document as it was compiled (`status` dropped): what changed between two versions,
    /// and the autogen rules a ClusterPolicy's status lists.
    pub document: Value,
}

impl CompiledPolicy {
    /// `name`, or `namespace/name` for a namespaced Policy.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) if self.kind == Kind::Policy => format!("{ns}/{}", self.name),
            _ => self.name.clone(),
        }
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

    /// A rule's effective failure action: its own `failureAction`, else the policy's.
    pub fn rule_action(&self, rule: &str) -> Action {
        self.rules
            .iter()
            .find(|r| r.name == rule)
            .and_then(|r| match &r.body {
                RuleBody::Validate(v) => v.failure_action,
                _ => None,
            })
            .unwrap_or(self.action)
    }

    /// Whether a rule response blocks an admission request: a mutation that failed or errored
    /// (unless failurePolicy is Ignore), a failure of an Enforce rule, or an error under
    /// failurePolicy Fail.
    pub fn blocks(&self, r: &crate::outcome::RuleResponse) -> bool {
        use crate::outcome::{RuleType, Status};
        match (r.rule_type, r.status) {
            (RuleType::Mutation, Status::Fail | Status::Error) => !self.failure_policy_ignore,
            (_, Status::Fail) => self.rule_action(&r.name) == Action::Enforce,
            (_, Status::Error) => !self.failure_policy_ignore,
            _ => false,
        }
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
    pub body: RuleBody,
}

#[derive(Debug, Clone)]
pub enum RuleBody {
    Validate(Box<CompiledValidation>),
    Mutate(Box<CompiledMutation>),
    Generate(Box<CompiledGeneration>),
    /// Rule types this build does not evaluate yet; they yield an `error` result saying so.
    Unsupported {
        rule_type: crate::outcome::RuleType,
        what: &'static str,
    },
}

#[derive(Debug, Clone)]
pub struct CompiledValidation {
    pub message: Option<Template>,
    pub failure_action: Option<Action>,
    pub overrides: Vec<FailureActionOverride>,
    pub allow_existing_violations: bool,
    pub check: Check,
}

#[derive(Debug, Clone)]
pub enum Check {
    Pattern(TValue),
    AnyPattern(Vec<TValue>),
    /// `anyPattern` that is not a list: an error at evaluation, as Kyverno reports it.
    BadAnyPattern(String),
    Deny(CompiledConditions),
    Foreach(Vec<CompiledForeach>),
    PodSecurity(crate::pss::PodSecurityCheck),
    Cel(Box<CompiledCel>),
    Unsupported(&'static str),
    Nothing,
}

/// `validate.cel`: Kubernetes-style variables and expressions, compiled once.
#[derive(Debug, Clone)]
pub struct CompiledCel {
    pub variables: Vec<(String, verno_cel::Expr)>,
    pub expressions: Vec<CelValidation>,
    /// `paramKind` / `paramRef` are set.
    pub uses_params: bool,
    /// Where `params` comes from (a ValidatingAdmissionPolicy's paramKind + its binding's paramRef).
    pub params: Option<ParamRef>,
}

/// The object a policy reads as `params`.
#[derive(Debug, Clone, Default)]
pub struct ParamRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// A binding's `paramRef.selector`: every matching object, read as `params.items`, as
    /// Kyverno's CLI presents them.
    pub selector: Option<verno_api::LabelSelector>,
}

impl ParamRef {
    /// From an admission policy's `paramKind` and its binding's `paramRef`.
    pub fn from_binding(param_kind: &Value, param_ref: &Value) -> ParamRef {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        ParamRef {
            api_version: s(param_kind, "apiVersion"),
            kind: s(param_kind, "kind"),
            namespace: s(param_ref, "namespace"),
            name: s(param_ref, "name"),
            selector: param_ref.get("selector").and_then(|v| serde_json::from_value(v.clone()).ok()),
        }
    }

    /// The `params` value, or why there is none.
    pub fn resolve(&self, data: &dyn crate::evaluate::Data) -> Result<Value, String> {
        if self.name.is_empty()
            && let Some(sel) = &self.selector
        {
            let items: Vec<Value> = data
                .list(&self.api_version, &self.kind, &self.namespace)
                .into_iter()
                .filter(|o| crate::matching::selector_matches(sel, &crate::matching::labels_of(o), false))
                .collect();
            return Ok(serde_json::json!({ "items": items }));
        }
        data.resource(&self.api_version, &self.kind, &self.namespace, &self.name).ok_or_else(|| {
            format!("params {}/{} {}/{} not found", self.api_version, self.kind, self.namespace, self.name)
        })
    }
}

#[derive(Debug, Clone)]
pub struct CelValidation {
    pub expr: verno_cel::Expr,
    pub message: Option<String>,
    pub message_expression: Option<verno_cel::Expr>,
}

pub(crate) fn cel_expr(v: Option<&Value>, path: &str) -> Result<verno_cel::Expr, CompileError> {
    let src = v.and_then(Value::as_str).ok_or_else(|| CompileError::new(path, "an expression (string) is required"))?;
    verno_cel::Expr::compile(src).map_err(|e| CompileError::new(path, e))
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

pub(crate) fn compile_cel(c: &Value, path: &str) -> Result<Check, CompileError> {
    let variables = compile_cel_variables(c.get("variables"), path)?;
    let mut expressions = Vec::new();
    for (i, e) in c.get("expressions").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let p = format!("{path}.expressions[{i}]");
        expressions.push(CelValidation {
            expr: cel_expr(e.get("expression"), &format!("{p}.expression"))?,
            message: e.get("message").and_then(Value::as_str).map(str::to_string),
            message_expression: e
                .get("messageExpression")
                .map(|m| cel_expr(Some(m), &format!("{p}.messageExpression")))
                .transpose()?,
        });
    }
    Ok(Check::Cel(Box::new(CompiledCel {
        variables,
        expressions,
        uses_params: c.get("paramKind").is_some() || c.get("paramRef").is_some(),
        params: None,
    })))
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

#[derive(Debug, Clone)]
pub struct CompiledForeach {
    pub list: Query,
    pub element_scope: Option<bool>,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub check: Check,
}

/// A JMESPath with its DELETE variant (`request.object` read as `request.oldObject`).
#[derive(Debug, Clone)]
pub struct Query {
    pub expr: Expression,
    pub delete: Option<Expression>,
}

impl Query {
    pub fn compile(src: &str, path: &str) -> Result<Query, CompileError> {
        let s = src.trim();
        let s = s.strip_prefix("{{").and_then(|x| x.strip_suffix("}}")).map(str::trim).unwrap_or(s);
        let expr = Expression::compile(s).map_err(|e| CompileError::new(path, format!("invalid JMESPath: {e}")))?;
        let delete = if s.contains("request.object") {
            Expression::compile(&s.replace("request.object", "request.oldObject")).ok()
        } else {
            None
        };
        Ok(Query { expr, delete })
    }

    pub fn pick(&self, delete: bool) -> &Expression {
        if delete { self.delete.as_ref().unwrap_or(&self.expr) } else { &self.expr }
    }
}

#[derive(Debug, Clone)]
pub struct CompiledContextEntry {
    pub name: String,
    pub source: ContextSource,
}

#[derive(Debug, Clone)]
pub enum ContextSource {
    Variable {
        value: Option<TValue>,
        jmes_path: Option<JmesField>,
        default: Option<TValue>,
    },
    ConfigMap {
        name: TValue,
        namespace: Option<TValue>,
    },
    ApiCall {
        url_path: Option<TValue>,
        method: String,
        data: Option<TValue>,
        service_url: Option<TValue>,
        jmes_path: Option<JmesField>,
        default: Option<TValue>,
    },
    GlobalReference {
        name: String,
        jmes_path: Option<JmesField>,
    },
    ImageRegistry,
}

/// A `jmesPath` field: compiled once unless it holds `{{ }}` variables itself.
#[derive(Debug, Clone)]
pub enum JmesField {
    /// Compiled once, with its DELETE reading (`request.object` as `request.oldObject`).
    Static {
        expr: Expression,
        delete: Option<Expression>,
    },
    Templated(Template),
}

impl JmesField {
    fn compile(s: &str, path: &str) -> Result<JmesField, CompileError> {
        if crate::template::has_vars(s) {
            return Template::compile(s).map(JmesField::Templated).map_err(|e| CompileError::new(path, e));
        }
        let q = Query::compile(s, path)?;
        Ok(JmesField::Static { expr: q.expr, delete: q.delete })
    }
}

fn tv(v: &Value, path: &str) -> Result<TValue, CompileError> {
    TValue::compile(v).map_err(|e| CompileError::new(path, e))
}

fn compile_context(entries: &[ContextEntry], path: &str) -> Result<Vec<CompiledContextEntry>, CompileError> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let source = if let Some(v) = &e.variable {
            ContextSource::Variable {
                value: v.value.as_ref().map(|x| tv(x, &format!("{p}.variable.value"))).transpose()?,
                jmes_path: v
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.variable.jmesPath")))
                    .transpose()?,
                default: v.default.as_ref().map(|x| tv(x, &format!("{p}.variable.default"))).transpose()?,
            }
        } else if let Some(c) = &e.config_map {
            ContextSource::ConfigMap {
                name: tv(&Value::String(c.name.clone()), &format!("{p}.configMap.name"))?,
                namespace: c
                    .namespace
                    .as_ref()
                    .map(|n| tv(&Value::String(n.clone()), &format!("{p}.configMap.namespace")))
                    .transpose()?,
            }
        } else if let Some(a) = &e.api_call {
            ContextSource::ApiCall {
                url_path: a
                    .url_path
                    .as_ref()
                    .map(|u| tv(&Value::String(u.clone()), &format!("{p}.apiCall.urlPath")))
                    .transpose()?,
                method: a.method.clone().unwrap_or_else(|| "GET".into()),
                data: a.data.as_ref().map(|d| tv(d, &format!("{p}.apiCall.data"))).transpose()?,
                service_url: a
                    .service
                    .as_ref()
                    .and_then(|s| s.get("url"))
                    .map(|u| tv(u, &format!("{p}.apiCall.service.url")))
                    .transpose()?,
                jmes_path: a
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.apiCall.jmesPath")))
                    .transpose()?,
                default: a.default.as_ref().map(|x| tv(x, &format!("{p}.apiCall.default"))).transpose()?,
            }
        } else if let Some(g) = &e.global_reference {
            ContextSource::GlobalReference {
                name: g.name.clone(),
                jmes_path: g
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.globalReference.jmesPath")))
                    .transpose()?,
            }
        } else if e.image_registry.is_some() {
            ContextSource::ImageRegistry
        } else {
            return Err(CompileError::new(
                p,
                "a context entry needs one of variable, configMap, apiCall, imageRegistry or globalReference",
            ));
        };
        out.push(CompiledContextEntry { name: e.name.clone(), source });
    }
    Ok(out)
}

fn compile_check_parts(
    pattern: Option<&Value>,
    any_pattern: Option<&Value>,
    deny: Option<&verno_api::Deny>,
    foreach: Option<&Vec<ForEachValidation>>,
    path: &str,
) -> Result<Option<Check>, CompileError> {
    // Kyverno's order: deny, then pattern / anyPattern, then foreach.
    if let Some(d) = deny {
        let c = match &d.conditions {
            Some(c) => CompiledConditions::compile(c, &format!("{path}.deny.conditions"))?,
            None => CompiledConditions::default(),
        };
        return Ok(Some(Check::Deny(c)));
    }
    if let Some(p) = pattern {
        return Ok(Some(Check::Pattern(tv(p, &format!("{path}.pattern"))?)));
    }
    if let Some(ap) = any_pattern {
        return Ok(Some(match ap {
            Value::Array(a) => Check::AnyPattern(
                a.iter()
                    .enumerate()
                    .map(|(i, x)| tv(x, &format!("{path}.anyPattern[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            other => Check::BadAnyPattern(format!(
                "json: cannot unmarshal {} into Go value of type []interface {{}}",
                verno_jmespath::value::type_name(other)
            )),
        }));
    }
    if let Some(fs) = foreach {
        return Ok(Some(Check::Foreach(compile_foreach(fs, &format!("{path}.foreach"))?)));
    }
    Ok(None)
}

fn compile_foreach(fs: &[ForEachValidation], path: &str) -> Result<Vec<CompiledForeach>, CompileError> {
    let mut out = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let check =
            compile_check_parts(f.pattern.as_ref(), f.any_pattern.as_ref(), f.deny.as_ref(), f.foreach.as_ref(), &p)?
                .unwrap_or(Check::Nothing);
        out.push(CompiledForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            element_scope: f.element_scope,
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: f
                .preconditions
                .as_ref()
                .map(|c| CompiledConditions::compile(c, &format!("{p}.preconditions")))
                .transpose()?,
            check,
        });
    }
    Ok(out)
}

fn compile_validation(v: &Validation, path: &str) -> Result<CompiledValidation, CompileError> {
    let check = if let Some(ps) = &v.pod_security {
        Check::PodSecurity(crate::pss::PodSecurityCheck::compile(ps, &format!("{path}.podSecurity"))?)
    } else if let Some(c) = &v.cel {
        compile_cel(c, &format!("{path}.cel"))?
    } else if v.manifests.is_some() {
        Check::Unsupported("validate.manifests (signed manifests) is not supported by this build of verno yet")
    } else {
        compile_check_parts(v.pattern.as_ref(), v.any_pattern.as_ref(), v.deny.as_ref(), v.foreach.as_ref(), path)?
            .unwrap_or(Check::Nothing)
    };
    let failure_action = match &v.failure_action {
        Some(a) => Some(Action::parse(a).ok_or_else(|| {
            CompileError::new(
                format!("{path}.failureAction"),
                format!("unknown action {a:?}, expected Audit or Enforce"),
            )
        })?),
        None => None,
    };
    Ok(CompiledValidation {
        message: v
            .message
            .as_deref()
            .map(|m| Template::compile(m).map_err(|e| CompileError::new(format!("{path}.message"), e)))
            .transpose()?,
        failure_action,
        overrides: v.failure_action_overrides.clone(),
        allow_existing_violations: v.allow_existing_violations.unwrap_or(true),
        check,
    })
}

fn compile_rule(r: &Rule, path: &str, autogen_of: Option<String>) -> Result<CompiledRule, CompileError> {
    let kinds = [r.validate.is_some(), r.mutate.is_some(), r.generate.is_some(), r.verify_images.is_some()];
    let n = kinds.iter().filter(|b| **b).count();
    if n == 0 {
        return Err(CompileError::new(
            path,
            format!(
                "No operation defined in the rule '{}'.(supported operations: mutate,validate,generate,verifyImages)",
                r.name
            ),
        ));
    }
    if n > 1 {
        return Err(CompileError::new(
            path,
            format!(
                "Multiple operations defined in the rule '{}', only one operation (mutate,validate,generate,verifyImages) is allowed per rule",
                r.name
            ),
        ));
    }
    let body = if let Some(v) = &r.validate {
        RuleBody::Validate(Box::new(compile_validation(v, &format!("{path}.validate"))?))
    } else if let Some(m) = &r.mutate {
        RuleBody::Mutate(Box::new(compile_mutation(m, &format!("{path}.mutate"))?))
    } else if let Some(g) = &r.generate {
        RuleBody::Generate(Box::new(compile_generation(g, &format!("{path}.generate"))?))
    } else {
        RuleBody::Unsupported {
            rule_type: crate::outcome::RuleType::ImageVerify,
            what: "verifyImages rules are not supported by this build of verno yet",
        }
    };
    let matcher = Matcher::compile(&r.match_, &format!("{path}.match"))?;
    if matcher.is_empty() {
        return Err(CompileError::new(format!("{path}.match"), "match cannot be empty"));
    }
    Ok(CompiledRule {
        name: r.name.clone(),
        autogen_of,
        matcher,
        exclude: r.exclude.as_ref().map(|e| Matcher::compile(e, &format!("{path}.exclude"))).transpose()?,
        context: compile_context(&r.context, &format!("{path}.context"))?,
        preconditions: r
            .preconditions
            .as_ref()
            .map(|c| CompiledConditions::compile(c, &format!("{path}.preconditions")))
            .transpose()?,
        cel_preconditions: compile_cel_preconditions(&r.cel_preconditions, &format!("{path}.celPreconditions"))?,
        body,
    })
}

/// A compiled `mutate` rule.
#[derive(Debug, Clone)]
pub struct CompiledMutation {
    pub patches: Patches,
    pub foreach: Vec<CompiledMutateForeach>,
    pub targets: Vec<CompiledTarget>,
    /// A MutatingPolicy's / MutatingAdmissionPolicy's CEL mutations.
    pub cel: Option<Box<crate::mpol::CompiledCelMutation>>,
}

/// A strategic merge patch and/or RFC 6902 patches, with their variables.
#[derive(Debug, Clone, Default)]
pub struct Patches {
    pub strategic_merge: Option<TValue>,
    pub json6902: Option<Json6902>,
}

/// `patchesJson6902`: parsed at compile time unless it holds variables.
#[derive(Debug, Clone)]
pub enum Json6902 {
    Static(Vec<crate::jsonpatch::Op>),
    /// The string, a template until rendered and parsed.
    Templated(TValue),
}

impl Patches {
    fn compile(smp: Option<&Value>, json6902: Option<&String>, path: &str) -> Result<Patches, CompileError> {
        let json6902 = match json6902 {
            Some(s) => {
                let p = format!("{path}.patchesJson6902");
                if crate::template::has_vars(s) {
                    Some(Json6902::Templated(tv(&Value::String(s.clone()), &p)?))
                } else {
                    // Parsed once, so a broken policy fails at load.
                    let doc = verno_jmespath::yaml::parse(s)
                        .map_err(|e| CompileError::new(&p, format!("invalid YAML: {e}")))?;
                    Some(Json6902::Static(crate::jsonpatch::parse_ops(&doc).map_err(|e| CompileError::new(&p, e))?))
                }
            }
            None => None,
        };
        Ok(Patches {
            strategic_merge: smp.map(|v| tv(v, &format!("{path}.patchStrategicMerge"))).transpose()?,
            json6902,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.strategic_merge.is_none() && self.json6902.is_none()
    }
}

#[derive(Debug, Clone)]
pub struct CompiledMutateForeach {
    pub list: Query,
    pub list_source: String,
    /// Descending iteration (the default for strategic merge patches).
    pub reverse: bool,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub patches: Patches,
    pub nested: Vec<CompiledMutateForeach>,
}

/// A mutate-existing target: which objects to fetch and patch.
#[derive(Debug, Clone)]
pub struct CompiledTarget {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<TValue>,
    pub name: Option<TValue>,
    pub selector: Option<verno_api::LabelSelector>,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
}

fn compile_mutate_foreach(
    fs: &[verno_api::ForEachMutation],
    path: &str,
) -> Result<Vec<CompiledMutateForeach>, CompileError> {
    let mut out = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let reverse = match f.order.as_deref() {
            Some("Descending") => true,
            Some("Ascending") => false,
            Some(o) => {
                return Err(CompileError::new(
                    format!("{p}.order"),
                    format!("unknown order {o:?}, expected Ascending or Descending"),
                ));
            }
            None => f.patch_strategic_merge.is_some(),
        };
        let patches = Patches::compile(f.patch_strategic_merge.as_ref(), f.patches_json6902.as_ref(), &p)?;
        let nested = compile_mutate_foreach(f.foreach.as_deref().unwrap_or_default(), &format!("{p}.foreach"))?;
        if patches.is_empty() && nested.is_empty() {
            return Err(CompileError::new(
                &p,
                "a mutate foreach needs patchStrategicMerge, patchesJson6902 or a nested foreach",
            ));
        }
        out.push(CompiledMutateForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            list_source: f.list.clone(),
            reverse,
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: f
                .preconditions
                .as_ref()
                .map(|c| CompiledConditions::compile(c, &format!("{p}.preconditions")))
                .transpose()?,
            patches,
            nested,
        });
    }
    Ok(out)
}

fn compile_mutation(m: &verno_api::Mutation, path: &str) -> Result<CompiledMutation, CompileError> {
    let patches = Patches::compile(m.patch_strategic_merge.as_ref(), m.patches_json6902.as_ref(), path)?;
    let foreach = compile_mutate_foreach(m.foreach.as_deref().unwrap_or_default(), &format!("{path}.foreach"))?;
    if patches.is_empty() && foreach.is_empty() {
        return Err(CompileError::new(path, "a mutate rule needs patchStrategicMerge, patchesJson6902 or foreach"));
    }
    let mut targets = Vec::new();
    for (i, t) in m.targets.iter().enumerate() {
        let p = format!("{path}.targets[{i}]");
        let s = |x: &Option<String>, f: &str| {
            x.as_ref().map(|v| tv(&Value::String(v.clone()), &format!("{p}.{f}"))).transpose()
        };
        targets.push(CompiledTarget {
            api_version: t.api_version.clone(),
            kind: t.kind.clone(),
            namespace: s(&t.namespace, "namespace")?,
            name: s(&t.name, "name")?,
            selector: t.selector.clone(),
            context: compile_context(&t.context, &format!("{p}.context"))?,
            preconditions: t
                .preconditions
                .as_ref()
                .map(|c| CompiledConditions::compile(c, &format!("{p}.preconditions")))
                .transpose()?,
        });
    }
    Ok(CompiledMutation { patches, foreach, targets, cel: None })
}

/// A compiled `generate` rule. The object is built at evaluation; the cluster controller acts
/// on `synchronize` and `orphan_downstream`.
#[derive(Debug, Clone)]
pub struct CompiledGeneration {
    pub target: GenerateTarget,
    pub synchronize: bool,
    pub orphan_downstream: bool,
    pub foreach: Vec<CompiledGenerateForeach>,
}

#[derive(Debug, Clone)]
pub struct GenerateTarget {
    pub api_version: Option<TValue>,
    pub kind: Option<TValue>,
    pub name: Option<TValue>,
    pub namespace: Option<TValue>,
    pub source: GenerateSource,
}

#[derive(Debug, Clone)]
pub enum GenerateSource {
    Data(TValue),
    Clone {
        namespace: TValue,
        name: TValue,
    },
    CloneList {
        namespace: TValue,
        kinds: Vec<String>,
        selector: Option<verno_api::LabelSelector>,
    },
    /// Only foreach entries (the rule itself generates nothing directly).
    None,
}

#[derive(Debug, Clone)]
pub struct CompiledGenerateForeach {
    pub list: Query,
    pub list_source: String,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub target: GenerateTarget,
}

#[allow(clippy::too_many_arguments)]
fn compile_generate_target(
    api_version: &Option<String>,
    kind: &Option<String>,
    name: &Option<String>,
    namespace: &Option<String>,
    data: Option<&Value>,
    clone: Option<&verno_api::CloneFrom>,
    clone_list: Option<&verno_api::CloneList>,
    path: &str,
) -> Result<GenerateTarget, CompileError> {
    let s = |x: &Option<String>, f: &str| {
        x.as_ref().map(|v| tv(&Value::String(v.clone()), &format!("{path}.{f}"))).transpose()
    };
    let n = [data.is_some(), clone.is_some(), clone_list.is_some()].iter().filter(|b| **b).count();
    if n > 1 {
        return Err(CompileError::new(path, "only one of data, clone and cloneList may be set"));
    }
    let source = if let Some(d) = data {
        GenerateSource::Data(tv(d, &format!("{path}.data"))?)
    } else if let Some(c) = clone {
        GenerateSource::Clone {
            namespace: tv(&Value::String(c.namespace.clone()), &format!("{path}.clone.namespace"))?,
            name: tv(&Value::String(c.name.clone()), &format!("{path}.clone.name"))?,
        }
    } else if let Some(c) = clone_list {
        GenerateSource::CloneList {
            namespace: tv(&Value::String(c.namespace.clone()), &format!("{path}.cloneList.namespace"))?,
            kinds: c.kinds.clone(),
            selector: c.selector.clone(),
        }
    } else {
        GenerateSource::None
    };
    Ok(GenerateTarget {
        api_version: s(api_version, "apiVersion")?,
        kind: s(kind, "kind")?,
        name: s(name, "name")?,
        namespace: s(namespace, "namespace")?,
        source,
    })
}

fn compile_generation(g: &verno_api::Generation, path: &str) -> Result<CompiledGeneration, CompileError> {
    let target = compile_generate_target(
        &g.api_version,
        &g.kind,
        &g.name,
        &g.namespace,
        g.data.as_ref(),
        g.clone.as_ref(),
        g.clone_list.as_ref(),
        path,
    )?;
    let mut foreach = Vec::new();
    for (i, f) in g.foreach.iter().flatten().enumerate() {
        let p = format!("{path}.foreach[{i}]");
        foreach.push(CompiledGenerateForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            list_source: f.list.clone(),
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: f
                .preconditions
                .as_ref()
                .map(|c| CompiledConditions::compile(c, &format!("{p}.preconditions")))
                .transpose()?,
            target: compile_generate_target(
                &f.api_version,
                &f.kind,
                &f.name,
                &f.namespace,
                f.data.as_ref(),
                f.clone.as_ref(),
                f.clone_list.as_ref(),
                &p,
            )?,
        });
    }
    let mut target = target;
    if matches!(target.source, GenerateSource::None) && foreach.is_empty() {
        // Only the identity: Kyverno generates the bare object.
        target.source = GenerateSource::Data(tv(&Value::Object(serde_json::Map::new()), &format!("{path}.data"))?);
    }
    Ok(CompiledGeneration {
        target,
        synchronize: g.synchronize.unwrap_or(false),
        orphan_downstream: g.orphan_downstream_on_policy_delete.unwrap_or(false),
        foreach,
    })
}

/// Compiles a ClusterPolicy or Policy, adding its autogen rules.
pub fn compile_policy(p: &ClusterPolicy) -> Result<CompiledPolicy, CompileError> {
    let spec = &p.spec;
    if p.metadata.name.is_empty() {
        return Err(CompileError::new("metadata.name", "a policy needs a name"));
    }
    if spec.rules.is_empty() {
        return Err(CompileError::new("spec.rules", "a policy needs at least one rule"));
    }
    let action = match &spec.validation_failure_action {
        Some(a) => Action::parse(a).ok_or_else(|| {
            CompileError::new(
                "spec.validationFailureAction",
                format!("unknown action {a:?}, expected Audit or Enforce"),
            )
        })?,
        None => Action::Audit,
    };
    let mut rules = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, r) in spec.rules.iter().enumerate() {
        if r.name.starts_with("autogen-") {
            continue;
        }
        if !seen.insert(r.name.clone()) {
            return Err(CompileError::new(
                format!("spec.rules[{i}].name"),
                format!("duplicate rule name {:?}", r.name),
            ));
        }
        rules.push(compile_rule(r, &format!("spec.rules[{i}]"), None)?);
    }
    for r in autogen::rules(p) {
        let origin = r.name.trim_start_matches("autogen-cronjob-").trim_start_matches("autogen-").to_string();
        let path = format!("status.autogen.rules[{}]", r.name);
        rules.push(compile_rule(&r, &path, Some(origin))?);
    }
    let failure_policy = spec
        .webhook_configuration
        .as_ref()
        .and_then(|w| w.failure_policy.clone())
        .or_else(|| spec.failure_policy.clone())
        .unwrap_or_else(|| "Fail".into());
    let kind = if p.kind == "Policy" { Kind::Policy } else { Kind::ClusterPolicy };
    let namespace = match kind {
        // A Policy without a namespace lives in `default`, as the API server would put it.
        Kind::Policy => {
            Some(p.metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()))
        }
        _ => p.metadata.namespace.clone(),
    };
    Ok(CompiledPolicy {
        name: p.metadata.name.clone(),
        namespace,
        kind,
        action,
        overrides: spec.validation_failure_action_overrides.clone(),
        background: spec.background.unwrap_or(true),
        apply_one: spec.apply_rules.as_deref() == Some("One"),
        scored: p.metadata.annotations.get("policies.kyverno.io/scored").map(String::as_str) != Some("false"),
        emit_warning: spec.emit_warning.unwrap_or(false),
        failure_policy_ignore: failure_policy == "Ignore",
        rules,
        document: serde_json::to_value(p).unwrap_or(Value::Null),
    })
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
}

pub fn compile_exception(e: &PolicyException) -> Result<CompiledException, CompileError> {
    let key = match &e.metadata.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", e.metadata.name),
        _ => e.metadata.name.clone(),
    };
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
    })
}

/// Compiles a `policies.kyverno.io` PolicyException: `policyRefs` (every rule of the named
/// policies) and CEL `matchConditions`.
pub fn compile_cel_exception(doc: &Value) -> Result<CompiledException, CompileError> {
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let key = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    };
    let refs = doc
        .pointer("/spec/policyRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("name").and_then(Value::as_str))
        .map(|n| (n.to_string(), vec!["*".to_string()]))
        .collect();
    let conds: Vec<Value> = doc.pointer("/spec/matchConditions").and_then(Value::as_array).cloned().unwrap_or_default();
    Ok(CompiledException {
        key,
        matcher: None,
        conditions: None,
        cel_conditions: compile_cel_preconditions(&conds, "spec.matchConditions")?,
        refs,
    })
}
