//! Validate rules: the compiled checks (`pattern`, `anyPattern`, `deny`, `foreach`,
//! `podSecurity`, `cel`) and their evaluation with Kyverno's messages and failure paths.
use crate::cel_env::cel_env;
use crate::condition::CompiledConditions;
use crate::context::{Context, ForeachElement, Saved};
use crate::context_entry::{Stop, compile_context, enter};
use crate::error::CompileError;
use crate::forms::{Authz, CelValidation, Check, CompiledCel, CompiledForeach, CompiledValidation, PatternCheck};
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::pattern;
use crate::policy::{Action, CompiledPolicy, cel_expr, compile_cel_variables};
use crate::ports::Data;
use crate::template::{Query, tv};
use crate::template::{TValue, Template};
use serde_json::Value;
use std::collections::BTreeMap;
use verno_api::{ForEachValidation, Validation};

/// A rule whose caller gave up on the request (see [`verno_jmespath::Env::cancelled`]).
pub(crate) const CANCELLED: &str = "the evaluation was cancelled (its deadline passed)";

/// `validation rule '<rule>' passed.` (written without the formatting machinery: every passing
/// rule of every request says it), unless nobody reads it ([`Context::quiet_passes`]).
fn passed(rule: &str, ctx: &Context) -> String {
    if ctx.quiet_passes() {
        return String::new();
    }
    let mut m = String::with_capacity(rule.len() + 26);
    m.push_str("validation rule '");
    m.push_str(rule);
    m.push_str("' passed.");
    m
}

/// Whether `text` names `element<N>` or `elementIndex<N>`.
pub(crate) fn names_numbered_element(text: &str) -> bool {
    text.match_indices("element").any(|(i, _)| {
        let rest = text.get(i + "element".len()..).unwrap_or("");
        let rest = rest.strip_prefix("Index").unwrap_or(rest);
        rest.as_bytes().first().is_some_and(u8::is_ascii_digit)
    })
}

impl PatternCheck {
    fn new(value: TValue) -> PatternCheck {
        let compiled = match &value {
            TValue::Static(v) => Some(pattern::Pattern::compile(v)),
            _ => None,
        };
        PatternCheck { value, compiled }
    }

    /// Matches `target`; `Err` when a variable could not be substituted (`at`: where).
    fn matches(
        &self,
        target: &Value,
        ctx: &Context,
        at: impl FnOnce() -> String,
    ) -> Result<Result<(), pattern::PatternError>, crate::error::EvalError> {
        match &self.compiled {
            Some(p) => Ok(p.matches(target)),
            None => Ok(pattern::match_pattern(target, &*self.value.render(ctx, &at())?)),
        }
    }
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
        // `validate.cel.paramKind` + `paramRef`: the params object, read through the data port.
        params: match (c.get("paramKind"), c.get("paramRef")) {
            (Some(kind), Some(r)) => Some(crate::policy::ParamRef::from_binding(kind, r)),
            _ => None,
        },
        on_error: Status::Fail,
        authz: None,
        image: None,
        kyverno: None,
    })))
}

pub(crate) fn compile_check_parts(
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
        return Ok(Some(Check::Pattern(PatternCheck::new(tv(p, &format!("{path}.pattern"))?))));
    }
    if let Some(ap) = any_pattern {
        return Ok(Some(match ap {
            Value::Array(a) => Check::AnyPattern(
                a.iter()
                    .enumerate()
                    .map(|(i, x)| tv(x, &format!("{path}.anyPattern[{i}]")).map(PatternCheck::new))
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

pub(crate) fn compile_foreach(fs: &[ForEachValidation], path: &str) -> Result<Vec<CompiledForeach>, CompileError> {
    let mut out = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if f.list.is_empty() {
            return Err(CompileError::new(format!("{p}.list"), "foreach.list is required"));
        }
        let count = [f.pattern.is_some(), f.any_pattern.is_some(), f.deny.is_some(), f.foreach.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if count == 0 {
            return Err(CompileError::new(
                &p,
                "one of pattern, anyPattern, deny, or a nested foreach must be specified",
            ));
        }
        if count > 1 {
            return Err(CompileError::new(
                &p,
                "only one of pattern, anyPattern, deny, or a nested foreach can be specified",
            ));
        }
        let check =
            compile_check_parts(f.pattern.as_ref(), f.any_pattern.as_ref(), f.deny.as_ref(), f.foreach.as_ref(), &p)?
                .unwrap_or(Check::Nothing);
        out.push(CompiledForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            element_scope: f.element_scope,
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: CompiledConditions::compile_optional(
                f.preconditions.as_ref(),
                &format!("{p}.preconditions"),
            )?,
            check,
        });
    }
    Ok(out)
}

pub(crate) fn compile_validation(v: &Validation, path: &str) -> Result<CompiledValidation, CompileError> {
    // As Kyverno's policy validation: exactly one way to validate. A typo (`patern:`) or a
    // rule with both `pattern` and `deny` is refused rather than enforcing less than it says.
    let attestors = v.manifests.as_ref().and_then(|m| m.get("attestors")).and_then(Value::as_array);
    let count = [
        v.pattern.is_some(),
        v.any_pattern.is_some(),
        v.deny.is_some(),
        v.foreach.is_some(),
        v.pod_security.is_some(),
        v.cel.is_some(),
        attestors.is_some_and(|a| !a.is_empty()),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if count == 0 && v.manifests.is_none() && v.assert.is_none() {
        return Err(CompileError::new(path, "one of pattern, anyPattern, deny, foreach, cel must be specified"));
    }
    if count > 1 {
        return Err(CompileError::new(path, "only one of pattern, anyPattern, deny, foreach, cel can be specified"));
    }
    let check = if let Some(ps) = &v.pod_security {
        Check::PodSecurity(crate::pss::PodSecurityCheck::compile(ps, &format!("{path}.podSecurity"))?)
    } else if let Some(c) = &v.cel {
        let mut check = compile_cel(c, &format!("{path}.cel"))?;
        // Kyverno gives an expression without its own message the rule's `validate.message`.
        if let (Check::Cel(cel), Some(m)) = (&mut check, v.message.as_ref().filter(|m| !m.is_empty())) {
            for x in cel.expressions.iter_mut().filter(|x| x.message.as_deref().is_none_or(str::is_empty)) {
                x.message = Some(m.clone());
            }
        }
        check
    } else if let Some(m) = &v.manifests {
        Check::Manifests(Box::new(crate::manifests::compile(m, &format!("{path}.manifests"))?))
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
        numbered_elements: serde_json::to_string(v).map_or(true, |t| names_numbered_element(&t)),
    })
}

pub(crate) struct ValidateCtx<'a> {
    pub(crate) rule: &'a str,
    pub(crate) v: &'a CompiledValidation,
    pub(crate) foreach_values: &'a BTreeMap<String, Vec<Value>>,
    pub(crate) data: &'a dyn Data,
    pub(crate) policy: &'a CompiledPolicy,
    pub(crate) provided: &'a [String],
    /// The resource under validation (`request.object`, or the old object on DELETE).
    pub(crate) subject: &'a Value,
}

impl ValidateCtx<'_> {
    fn resp(&self, status: Status, msg: impl Into<String>) -> RuleResponse {
        RuleResponse::new(self.rule, RuleType::Validation, status, msg)
    }

    /// An Envoy- or HTTP-mode ValidatingPolicy, as Kyverno's authorization engine runs it:
    /// expressions in order, the first that returns a response decides (allowed: pass, denied:
    /// fail); null goes on to the next; none deciding is a skip. An expression that fails is an
    /// error, or (`failurePolicy: Ignore`) decides nothing.
    fn authz(&self, c: &CompiledCel, vars: &verno_cel::Vars, a: Authz) -> RuleResponse {
        use verno_cel::envoy::{Decision, decision, http_decision};
        for x in &c.expressions {
            let decided = x.expr.eval(vars).and_then(|v| match v {
                Value::Null => Ok(None),
                v if a.envoy => decision(&v).map(Some),
                v => http_decision(&v).map(Some),
            });
            match decided {
                Ok(None) => {}
                Ok(Some(Decision::Allowed)) => return self.resp(Status::Pass, "request allowed"),
                Ok(Some(Decision::Denied(why))) => return self.resp(Status::Fail, why),
                Err(_) if a.ignore_errors => break,
                Err(e) => return self.resp(Status::Error, e.to_string()),
            }
        }
        self.resp(Status::Skip, "request does not match")
    }

    /// The rule's message rendered (borrowed when it has no variables: most messages).
    fn message(&self, ctx: &Context) -> Result<Option<std::borrow::Cow<'_, str>>, String> {
        match &self.v.message {
            None => Ok(None),
            Some(t) if let Some(plain) = t.plain() => Ok(Some(plain.into())),
            Some(t) => match t.render(ctx, "") {
                Ok(Value::String(s)) => Ok(Some(s.into())),
                Ok(Value::Null) => Ok(Some("".into())),
                Ok(other) => Ok(Some(other.to_string().into())),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    fn error_message(&self, ctx: &Context, err: &str, path: &str) -> String {
        use crate::cat;
        let (err_or_path, what) =
            if path.is_empty() { (err, " execution error: ") } else { (path, " failed at path ") };
        match self.message(ctx) {
            Ok(Some(m)) if !m.is_empty() => {
                let dot = if m.ends_with('.') { "" } else { "." };
                cat(&["validation error: ", &m, dot, " rule ", self.rule, what, err_or_path])
            }
            Ok(_) => cat(&["validation error: rule ", self.rule, what, err_or_path]),
            Err(_) => {
                cat(&["validation error: variables substitution error in rule ", self.rule, " execution error: ", err])
            }
        }
    }

    /// Runs one check on `target`; `None` means the rule yields no result (DELETE pattern, empty foreach).
    pub(crate) fn validate(
        &mut self,
        check: &Check,
        target: &Value,
        ctx: &mut Context,
        nesting: usize,
        delete: bool,
    ) -> Option<RuleResponse> {
        match check {
            Check::Nothing => None,
            Check::Unsupported(what) => Some(self.resp(Status::Error, *what)),
            Check::BadAnyPattern(e) => {
                Some(self.resp(Status::Error, format!("failed to deserialize anyPattern, expected type array: {e}")))
            }
            Check::Deny(conds) => Some(self.deny(conds, ctx)),
            Check::Pattern(p) => {
                if delete {
                    return None;
                }
                let matched = match p.matches(target, ctx, || "/validate/pattern".to_string()) {
                    Ok(m) => m,
                    Err(e) => return Some(self.resp(Status::Error, format!("variable substitution failed: {e}"))),
                };
                match matched {
                    Ok(()) => Some(self.resp(Status::Pass, passed(self.rule, ctx))),
                    Err(pe) if pe.skip => Some(self.resp(Status::Skip, pe.message)),
                    Err(pe) if pe.path.is_empty() => {
                        Some(self.resp(Status::Error, self.error_message(ctx, &pe.message, "")))
                    }
                    Err(pe) => Some(self.resp(Status::Fail, self.error_message(ctx, &pe.message, &pe.path))),
                }
            }
            Check::AnyPattern(ps) => {
                if delete {
                    return None;
                }
                self.any_pattern(ps, target, ctx)
            }
            Check::Cel(c) => self.cel(c, target, ctx, delete),
            Check::Manifests(m) => {
                if delete {
                    return None;
                }
                Some(match m.verify(target, self.data) {
                    Err(e) => self.resp(Status::Error, format!("error occurred during manifest verification: {e}")),
                    Ok((true, reason)) => self.resp(Status::Pass, reason),
                    Ok((false, reason)) => self.resp(Status::Fail, reason),
                })
            }
            Check::PodSecurity(pss) => {
                if delete {
                    return None;
                }
                if !crate::pss::PodSecurityCheck::supports(target) {
                    return Some(self.resp(Status::Error, crate::pss::UNSUPPORTED_KIND.to_string()));
                }
                let v = pss.violations(target);
                if v.is_empty() {
                    Some(self.resp(Status::Pass, format!("Validation rule '{}' passed.", self.rule)))
                } else {
                    let mut r = self.resp(Status::Fail, pss.message(self.rule, &v));
                    r.extra_mut().properties = pss.properties(target);
                    Some(r)
                }
            }
            Check::Foreach(fs) => self.foreach(fs, ctx, nesting, delete),
        }
    }

    /// `deny`: the rule fails when the conditions hold, with its message and theirs.
    fn deny(&self, conds: &CompiledConditions, ctx: &Context) -> RuleResponse {
        match conds.evaluate(ctx) {
            Err(e) => self.resp(Status::Error, format!("failed to check deny conditions: {e}")),
            Ok((false, _)) => self.resp(Status::Pass, passed(self.rule, ctx)),
            Ok((true, cond_msg)) => {
                let base = match self.message(ctx) {
                    Ok(m) => m.map(std::borrow::Cow::into_owned).unwrap_or_default(),
                    // As Kyverno: a message whose variables cannot be substituted is dropped,
                    // and only the conditions' own messages are left (maybe none).
                    Err(_) => return self.resp(Status::Fail, cond_msg),
                };
                let msg = if base.is_empty() && cond_msg.is_empty() {
                    crate::cat(&["validation error: rule ", self.rule, " failed"])
                } else if cond_msg.is_empty() {
                    base
                } else if base.is_empty() {
                    cond_msg
                } else {
                    crate::cat(&[&base, "; ", &cond_msg])
                };
                self.resp(Status::Fail, msg)
            }
        }
    }

    /// `anyPattern`: the first alternative that matches passes; each one's failure is spelled
    /// out only when none does.
    fn any_pattern(&self, ps: &[PatternCheck], target: &Value, ctx: &Context) -> Option<RuleResponse> {
        // Each alternative's failure is spelled out only when none passes.
        let mut failures = Vec::new();
        for (i, p) in ps.iter().enumerate() {
            let matched = match p.matches(target, ctx, || format!("/validate/anyPattern/{i}")) {
                Ok(m) => m,
                Err(e) => return Some(self.resp(Status::Error, format!("variable substitution failed: {e}"))),
            };
            match matched {
                Ok(()) => {
                    return Some(
                        self.resp(Status::Pass, format!("validation rule '{}' anyPattern[{i}] passed.", self.rule)),
                    );
                }
                Err(pe) => failures.push((i, pe)),
            }
        }
        if failures.is_empty() {
            return None;
        }
        let all_skip = failures.iter().all(|(_, pe)| pe.skip);
        // `rule <name>[<i>] failed at path <path>` (or `failed: <why>`, `skipped: <why>`)
        // for each alternative, space-separated, after the rule's message.
        // A message whose variables cannot be substituted gives way to Kyverno's words for that.
        let (rule_message, unsubstituted) = match all_skip {
            true => (None, false),
            false => match self.message(ctx) {
                Ok(m) => (m.filter(|m| !m.is_empty()), false),
                Err(_) => (None, true),
            },
        };
        // Sized up front: growing it piece by piece was a reallocation per alternative.
        let parts: usize = failures.iter().map(|(_, pe)| self.rule.len() + 32 + pe.message.len() + pe.path.len()).sum();
        let mut msg = String::with_capacity(parts + 64 + rule_message.as_ref().map_or(0, |m| m.len()));
        if unsubstituted {
            msg.push_str("validation error: variables substitution error in rule ");
            msg.push_str(self.rule);
            msg.push_str(" execution error: ");
        } else if !all_skip {
            msg.push_str("validation error: ");
            if let Some(m) = &rule_message {
                msg.push_str(m);
                msg.push_str(if m.ends_with('.') { " " } else { ". " });
            }
        }
        // A failing rule lists only the alternatives that failed (skipped ones are left out, as
        // Kyverno's message does); a skipping one lists them all.
        let listed = failures.iter().filter(|(_, pe)| all_skip || !pe.skip);
        for (n, (i, pe)) in listed.enumerate() {
            if n > 0 {
                msg.push(' ');
            }
            msg.push_str("rule ");
            msg.push_str(self.rule);
            msg.push('[');
            crate::push_index(&mut msg, *i);
            msg.push(']');
            if pe.skip {
                msg.push_str(" skipped: ");
                msg.push_str(&pe.message);
            } else if pe.path.is_empty() {
                msg.push_str(" failed: ");
                msg.push_str(&pe.message);
            } else {
                msg.push_str(" failed at path ");
                msg.push_str(&pe.path);
            }
        }
        Some(self.resp(if all_skip { Status::Skip } else { Status::Fail }, msg))
    }

    /// `cel` (and the CEL kinds' validations): variables, then each expression in order; an
    /// authorization policy's responses; an ImageValidatingPolicy's images and verifications.
    fn cel(&self, c: &CompiledCel, target: &Value, ctx: &Context, delete: bool) -> Option<RuleResponse> {
        #[allow(unused_mut)]
        let mut vars = match cel_env(ctx, self.data, c.params.as_ref(), &c.variables) {
            Ok(v) => v,
            Err(e) => return Some(self.resp(Status::Error, e)),
        };
        if let Some(a) = c.authz {
            return Some(self.authz(c, &vars, a));
        }
        let mut images_seen = None;
        if let Some(img) = &c.image {
            if delete {
                return None;
            }
            let images = match img.images(target, &vars) {
                Ok(i) => i,
                Err(e) => return Some(self.resp(Status::Error, e)),
            };
            if let Some(i) = img.missing_digest(&images) {
                return Some(self.resp(Status::Fail, format!("image {i} does not have a digest")));
            }
            let namespace = crate::ports::str_at(target, "/metadata/namespace");
            let host = std::sync::Arc::new(crate::image_cel::ImageHost::new(
                self.data.cel_host(),
                self.data.image_verifier(),
                img.clone(),
                namespace,
            ));
            vars.set_host(host.clone());
            img.set_vars(&mut vars, &images);
            images_seen = Some((img, host, images));
        }
        // Kyverno's ValidatingPolicy engine: the audit annotations as properties (an
        // annotation that cannot be evaluated is the rule's error), and on a failure
        // or an error the index of the validation that decided.
        let with_props = |mut r: RuleResponse, index: Option<usize>| -> RuleResponse {
            let Some(k) = c.kyverno.as_deref() else { return r };
            let mut props = match crate::policy::audit_annotation_values(&k.audit_annotations, &vars) {
                Ok(p) => p,
                Err(e) if r.status != Status::Error => {
                    r.status = c.on_error;
                    r.message = e;
                    Vec::new()
                }
                Err(_) => Vec::new(),
            };
            if let Some(i) = index {
                props.push(("cel.validationIndex".to_string(), i.to_string()));
            }
            if !props.is_empty() {
                r.extra_mut().properties = props;
            }
            r
        };
        for (i, x) in c.expressions.iter().enumerate() {
            match x.expr.eval_bool(&vars) {
                Ok(true) => {}
                Ok(false) => {
                    let fallback = || match c.kyverno {
                        Some(_) => format!("CEL expression validation failed at index {i}"),
                        None => format!("failed expression: {}", x.expr.source()),
                    };
                    let msg = match (&x.message_expression, &x.message) {
                        // Kyverno's engine says why a message expression gave no message; an
                        // empty one falls back to the index.
                        (Some(me), _) if c.kyverno.is_some() => match me.eval(&vars) {
                            Ok(Value::String(s)) if !s.is_empty() => s,
                            Ok(Value::String(_)) => fallback(),
                            Ok(other) => format!(
                                "failed to convert message expression to string: type conversion error from '{}' to 'string'",
                                cel_type_name(&other)
                            ),
                            Err(e) => format!("failed to evaluate message expression: {e}"),
                        },
                        (Some(me), _) => match me.eval(&vars) {
                            Ok(Value::String(s)) if !s.is_empty() => s,
                            _ => x.message.clone().filter(|m| !m.is_empty()).unwrap_or_else(fallback),
                        },
                        (None, Some(m)) if !m.is_empty() => m.clone(),
                        (None, _) => fallback(),
                    };
                    return Some(with_props(self.resp(Status::Fail, msg), Some(i)));
                }
                Err(err) => {
                    // Kyverno's engine words it as any rule error ("error: …"); the API
                    // server's admission policies name the expression.
                    let msg = match c.kyverno {
                        Some(_) => format!("error: {err}"),
                        None => format!("expression '{}' resulted in error: {err}", x.expr.source()),
                    };
                    let r = self.resp(c.on_error, msg);
                    return Some(match c.kyverno {
                        Some(_) => {
                            let mut r = r;
                            r.extra_mut().properties = vec![("cel.validationIndex".into(), i.to_string())];
                            r
                        }
                        None => r,
                    });
                }
            }
        }
        if let Some((img, host, images)) = &images_seen {
            if let Some(why) = img.unverified(host, images) {
                return Some(self.resp(Status::Fail, why));
            }
            // Kyverno's ImageValidatingPolicy engine says `success`.
            return Some(self.resp(Status::Pass, "success"));
        }
        Some(with_props(self.resp(Status::Pass, ""), None))
    }

    /// `foreach`: each list's elements in turn; the first element that does not pass decides.
    fn foreach(
        &mut self,
        fs: &[CompiledForeach],
        ctx: &mut Context,
        nesting: usize,
        delete: bool,
    ) -> Option<RuleResponse> {
        let mut applied = 0usize;
        for f in fs {
            let list = match ctx.query_list(f.list.pick(delete)) {
                Ok(v) => v,
                Err(_) => continue,
            };
            let (resp, count) = self.foreach_elements(f, &list.elements(), ctx, nesting, delete);
            if let Some(r) = resp
                && r.status != Status::Pass
            {
                return Some(r);
            }
            applied += count;
        }
        if applied == 0 {
            return None;
        }
        Some(self.resp(Status::Pass, "rule passed"))
    }

    fn foreach_elements<'e>(
        &mut self,
        f: &CompiledForeach,
        elements: &[ForeachElement<'_, 'e>],
        ctx: &mut Context<'e>,
        nesting: usize,
        delete: bool,
    ) -> (Option<RuleResponse>, usize) {
        let mut applied = 0;
        let n = elements.len();
        for (index, &lendable) in elements.iter().enumerate() {
            let element = lendable.value();
            if element.is_null() {
                continue;
            }
            if ctx.env().cancelled() {
                return (Some(self.resp(Status::Error, CANCELLED)), applied);
            }
            let mut saved = ctx.enter_element(lendable, index, nesting, self.v.numbered_elements);
            for (k, vals) in self.foreach_values {
                if let Some(v) = vals.get(index) {
                    saved.absorb(ctx.set_path(k, v.clone()));
                }
            }
            let is_map = element.is_object();
            let scoped = match f.element_scope {
                Some(true) if !is_map => {
                    ctx.restore(saved);
                    return (
                        Some(self.resp(Status::Error, format!("failed to process foreach: cannot use elementScope=true foreach rules for elements that are not maps, expected type=map got type={}", verno_jmespath::value::type_name(element)))),
                        applied,
                    );
                }
                Some(s) => s,
                None => is_map,
            };
            let r = self.foreach_one(f, element, scoped, ctx, nesting, delete, &mut saved);
            ctx.restore(saved);
            match r {
                None => continue,
                Some(r) if r.status == Status::Skip => continue,
                Some(r) if r.status == Status::Pass => applied += 1,
                Some(r) if r.status == Status::Error => {
                    if index + 1 < n {
                        continue;
                    }
                    return (Some(self.resp(Status::Error, format!("validation failure: {}", r.message))), applied);
                }
                Some(r) => {
                    return (Some(self.resp(Status::Fail, format!("validation failure: {}", r.message))), applied);
                }
            }
        }
        (Some(self.resp(Status::Pass, "")), applied)
    }

    #[allow(clippy::too_many_arguments)]
    fn foreach_one(
        &mut self,
        f: &CompiledForeach,
        element: &Value,
        scoped: bool,
        ctx: &mut Context,
        nesting: usize,
        delete: bool,
        saved: &mut Saved,
    ) -> Option<RuleResponse> {
        match enter(
            &f.context,
            f.preconditions.as_ref(),
            ctx,
            self.data,
            self.provided,
            self.policy.confined_to(),
            saved,
        ) {
            Ok(()) => {}
            Err(Stop::Preconditions(e)) => {
                return Some(self.resp(Status::Skip, format!("failed to evaluate preconditions: {e}")));
            }
            Err(Stop::NotMet) => return Some(self.resp(Status::Skip, "preconditions not met")),
        }
        let target: &Value = if scoped { element } else { self.subject };
        self.validate(&f.check, target, ctx, nesting + 1, delete)
    }
}

/// A value's CEL type name, as cel-go's conversion errors print it.
fn cel_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null_type",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "double",
        Value::Number(n) if n.is_u64() && !n.is_i64() => "uint",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

#[cfg(test)]
mod tests {
    use super::names_numbered_element;

    #[test]
    fn numbered_foreach_variables_are_found_in_the_rule_text() {
        assert!(names_numbered_element("{{ element0.name }}"));
        assert!(names_numbered_element("x {{ elementIndex1 }}"));
        assert!(names_numbered_element("element.name element2"));
        assert!(!names_numbered_element("{{ element.name }} {{ elementIndex }}"));
        assert!(!names_numbered_element("elements elementIndexes element_0"));
        assert!(!names_numbered_element(""));
    }

    #[test]
    fn the_pass_message_names_the_rule() {
        let mut ctx = crate::context::Context::new(serde_json::Map::new(), false, &verno_jmespath::NoEnv);
        assert_eq!(super::passed("r-1", &ctx), "validation rule 'r-1' passed.");
        ctx.set_quiet_passes(true);
        assert_eq!(super::passed("r-1", &ctx), "");
    }
}
