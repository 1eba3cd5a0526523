//! Compiling `kyverno.io` ClusterPolicies and Policies: each rule through the compiler of its
//! kind ([`crate::validate`], [`crate::mutate`], [`crate::generate`],
//! [`crate::verify_images`]), the autogen rules, and the checks Kyverno's policy validation
//! makes on the whole policy.

use crate::autogen;
use crate::condition::CompiledConditions;
use crate::context_entry::compile_context;
use crate::error::CompileError;
use crate::generate::compile_generation;
use crate::matching::Matcher;
use crate::mutate::compile_mutation;
use crate::policy::{Action, CompiledPolicy, CompiledRule, ReportMeta, RuleBody, compile_cel_preconditions};
use crate::validate::compile_validation;
use serde_json::Value;
use verno_api::{ClusterPolicy, Kind, Rule};

fn compile_rule(
    r: &Rule,
    path: &str,
    autogen_of: Option<String>,
    policy_action: Option<&str>,
) -> Result<CompiledRule, CompileError> {
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
    } else if let Some(v) = &r.verify_images {
        let mut compiled = crate::verify_images::compile(v, &format!("{path}.verifyImages"), policy_action)?;
        // Kyverno's `validateWildcard`: a rule matching every kind cannot verify images.
        let m = &r.match_;
        let kinds = m
            .any
            .iter()
            .chain(m.all.iter())
            .flatten()
            .map(|f| &f.resources)
            .chain(m.resources.iter())
            .flat_map(|d| d.kinds.iter());
        if kinds.into_iter().any(|k| k == "*") {
            return Err(CompileError::new(format!("{path}.match"), "wildcard policy does not support rule type"));
        }
        if let Some(x) = &r.image_extractors {
            compiled.extractors = Some(crate::images::compile_extractors(x, &format!("{path}.imageExtractors"))?);
        }
        RuleBody::VerifyImages(Box::new(compiled))
    } else {
        return Err(CompileError::new(path, "a rule needs one of validate, mutate, generate or verifyImages"));
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
        preconditions: CompiledConditions::compile_optional(
            r.preconditions.as_ref(),
            &format!("{path}.preconditions"),
        )?,
        cel_preconditions: compile_cel_preconditions(&r.cel_preconditions, &format!("{path}.celPreconditions"))?,
        report_properties: r
            .report_properties
            .iter()
            .flatten()
            .map(|(k, v)| {
                crate::template::Template::compile(v)
                    .map(|t| (k.clone(), t))
                    .map_err(|e| CompileError::new(format!("{path}.reportProperties.{k}"), e))
            })
            .collect::<Result<_, _>>()?,
        body,
    })
}

/// A mutate-existing rule reads `target.…` only where a target is known — its patch and the
/// targets' own context and preconditions; the rule's context and preconditions, and the
/// targets' identity (apiVersion, kind, name, namespace, uid, selector), are worked out before
/// any target, so Kyverno refuses the policy (`hasInvalidVariables`, "invalid variables
/// defined at mutate.targets[N]").
fn target_variables_outside_patch(p: &ClusterPolicy) -> Option<CompileError> {
    use std::sync::LazyLock;
    // `target.…` as a variable's root inside `{{ }}` (not `x.target.…`).
    static TARGET: LazyLock<Option<regex::Regex>> =
        LazyLock::new(|| regex::Regex::new(r"\{\{(?:[^{}]*?[^\w.{}])?(target\.[\w.\[\]*-]*)").ok());
    let re = TARGET.as_ref()?;
    for (i, r) in p.spec.rules.iter().enumerate() {
        let Some(m) = r.mutate.as_ref().filter(|m| !m.targets.is_empty()) else { continue };
        let mut places: Vec<(String, Value)> = Vec::new();
        places.push(("context".into(), serde_json::to_value(&r.context).unwrap_or_default()));
        places.push(("preconditions".into(), serde_json::to_value(&r.preconditions).unwrap_or_default()));
        for (j, t) in m.targets.iter().enumerate() {
            let spec = serde_json::json!({"apiVersion": t.api_version, "kind": t.kind, "namespace": t.namespace,
                "name": t.name, "uid": t.uid, "selector": t.selector});
            places.push((format!("mutate.targets[{j}]"), spec));
        }
        for (place, v) in places {
            let text = v.to_string();
            if let Some(var) = re.captures(&text).and_then(|c| c.get(1)) {
                return Some(CompileError::new(
                    format!("spec.rules[{i}].{place}"),
                    format!(
                        "policy contains invalid variables: invalid variables defined at mutate.targets[0]: variable {} is not known before a target is chosen: only the patch and the targets' own context and preconditions read target",
                        var.as_str()
                    ),
                ));
            }
        }
    }
    None
}

/// Kyverno's refusal of a policy in background mode (the default) that reads who made the
/// request — a background scan has no request: `roles`, `clusterRoles` or `subjects` in a
/// match or exclude block (rules after autogen), or, unless a rule mutates existing resources,
/// a `{{…}}` variable naming `request.userInfo`, `request.roles`, `request.clusterRoles`,
/// `serviceAccountName` or `serviceAccountNamespace`. The messages are Kyverno's.
fn background_violation(p: &ClusterPolicy, generated: &[verno_api::Rule]) -> Option<CompileError> {
    use std::sync::LazyLock;
    static VARIABLES: LazyLock<Option<regex::Regex>> =
        LazyLock::new(|| regex::Regex::new(r"(?:^|[^\\])(\{\{(?:\{[^{}]*\}|[^{}])*\}\})").ok());
    static FORBIDDEN: LazyLock<Vec<regex::Regex>> = LazyLock::new(|| {
        ["serviceAccountName", "serviceAccountNamespace", "request.userInfo", "request.roles", "request.clusterRoles"]
            .iter()
            .filter_map(|v| regex::Regex::new(&format!(r"[^\.]({v})\b")).ok())
            .collect()
    });
    fn user(roles: &[String], cluster_roles: &[String], subjects: usize) -> Option<&'static str> {
        if !roles.is_empty() {
            Some("roles")
        } else if !cluster_roles.is_empty() {
            Some("clusterRoles")
        } else if subjects > 0 {
            Some("subjects")
        } else {
            None
        }
    }
    fn in_block(m: &verno_api::MatchResources, block: &str) -> Option<String> {
        if let Some(f) = user(&m.roles, &m.cluster_roles, m.subjects.len()) {
            return Some(format!("{block}/{f}"));
        }
        for (list, name) in [(&m.any, "any"), (&m.all, "all")] {
            for (i, r) in list.iter().flatten().enumerate() {
                if let Some(f) = user(&r.roles, &r.cluster_roles, r.subjects.len()) {
                    return Some(format!("{block}/{name}[{i}]/{f}"));
                }
            }
        }
        None
    }
    let rules = p.spec.rules.iter().filter(|r| !r.name.starts_with("autogen-")).chain(generated);
    for (i, r) in rules.enumerate() {
        let found = in_block(&r.match_, "match").or_else(|| r.exclude.as_ref().and_then(|e| in_block(e, "exclude")));
        if let Some(path) = found {
            return Some(CompileError::new(
                format!("spec.rules[{i}]"),
                format!(
                    "only select variables are allowed in background mode. Set spec.background=false to disable background mode for this policy rule: invalid variable used at path: spec/rules[{i}]/{path} "
                ),
            ));
        }
    }
    if p.spec.rules.iter().any(|r| r.mutate.as_ref().is_some_and(|m| !m.targets.is_empty())) {
        return None;
    }
    let mut doc = serde_json::to_value(p).ok()?;
    if let Some(Value::Object(a)) = doc.pointer_mut("/metadata/annotations") {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    let text = doc.to_string();
    for c in VARIABLES.as_ref()?.captures_iter(&text) {
        let var = c.get(1).map_or("", |m| m.as_str());
        if FORBIDDEN.iter().any(|f| f.is_match(var)) {
            return Some(CompileError::new(
                "spec.background",
                format!(
                    "only select variables are allowed in background mode. Set spec.background=false to disable background mode for this policy rule: variable {var} is not allowed "
                ),
            ));
        }
    }
    None
}

/// Kyverno's programmatic checks of the spec (its `Spec.Validate` and policy validation).
fn spec_checks(spec: &verno_api::policy::Spec) -> Result<(), CompileError> {
    for (path, t) in [
        ("spec.webhookTimeoutSeconds", spec.webhook_timeout_seconds),
        (
            "spec.webhookConfiguration.timeoutSeconds",
            spec.webhook_configuration.as_ref().and_then(|w| w.timeout_seconds),
        ),
    ] {
        if let Some(t) = t.filter(|t| !(1..=30).contains(t)) {
            return Err(CompileError::new(
                path,
                format!("Invalid value: {t}: the timeout value must be between 1 and 30 seconds"),
            ));
        }
    }
    if spec.admission == Some(false) {
        if spec.background == Some(false) {
            return Err(CompileError::new("spec", "disabling both admission and background processing is not allowed"));
        }
        if spec.rules.iter().any(|r| r.mutate.is_some() || r.generate.is_some() || r.verify_images.is_some()) {
            return Err(CompileError::new(
                "spec.admission",
                "disabling admission processing is only allowed with validation policies",
            ));
        }
    }
    Ok(())
}

/// The rules as written (not autogen's), compiled; names are unique, `celPreconditions` only
/// with `validate.cel`.
fn written_rules(spec: &verno_api::policy::Spec) -> Result<Vec<CompiledRule>, CompileError> {
    crate::rule_checks::pod_security(&spec.rules)?;
    let mut rules = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, r) in spec.rules.iter().enumerate() {
        if r.name.starts_with("autogen-") {
            continue;
        }
        if !r.cel_preconditions.is_empty() && r.validate.as_ref().is_none_or(|v| v.cel.is_none()) {
            return Err(CompileError::new(
                format!("spec.rules[{i}].celPreconditions"),
                "celPrecondition can only be used with validate.cel",
            ));
        }
        if !seen.insert(r.name.clone()) {
            return Err(CompileError::new(
                format!("spec.rules[{i}].name"),
                format!("duplicate rule name {:?}", r.name),
            ));
        }
        crate::rule_checks::conditions(r, i)?;
        rules.push(compile_rule(r, &format!("spec.rules[{i}]"), None, spec.validation_failure_action.as_deref())?);
        crate::rule_checks::label_values(r)?;
    }
    Ok(rules)
}

/// Compiles a ClusterPolicy or Policy, adding its autogen rules.
pub fn compile_policy(p: &ClusterPolicy) -> Result<CompiledPolicy, CompileError> {
    let spec = &p.spec;
    if p.metadata.name.is_empty() {
        return Err(CompileError::new("metadata.name", "a policy needs a name"));
    }
    // A policy without rules is valid (Kyverno's schema and validation admit it): it does
    // nothing.
    let action = match &spec.validation_failure_action {
        Some(a) => Action::parse(a).ok_or_else(|| {
            CompileError::new(
                "spec.validationFailureAction",
                format!("unknown action {a:?}, expected Audit or Enforce"),
            )
        })?,
        None => Action::Audit,
    };
    spec_checks(spec)?;
    let mut rules = written_rules(spec)?;
    let generated = autogen::rules(p);
    if spec.background.unwrap_or(true)
        && let Some(e) = background_violation(p, &generated)
    {
        return Err(e);
    }
    if let Some(e) = target_variables_outside_patch(p) {
        return Err(e);
    }
    for r in generated {
        let origin = r.name.trim_start_matches("autogen-cronjob-").trim_start_matches("autogen-").to_string();
        let path = format!("status.autogen.rules[{}]", r.name);
        rules.push(compile_rule(&r, &path, Some(origin), spec.validation_failure_action.as_deref())?);
    }
    let generate_existing = spec.generate_existing.or(spec.generate_existing_on_policy_update).unwrap_or(false);
    for r in &mut rules {
        if let RuleBody::Generate(g) = &mut r.body
            && !g.generate_existing_set
        {
            g.generate_existing = generate_existing;
        }
    }
    let failure_policy = spec
        .webhook_configuration
        .as_ref()
        .and_then(|w| w.failure_policy.clone())
        .or_else(|| spec.failure_policy.clone())
        .unwrap_or_else(|| "Fail".into());
    let document = serde_json::to_value(p).unwrap_or(Value::Null);
    let kind = if p.kind == "Policy" { Kind::Policy } else { Kind::ClusterPolicy };
    let cache_id = crate::verify_images::cache_id(&document, kind, p.metadata.namespace.as_deref(), &p.metadata.name);
    for r in &mut rules {
        if let RuleBody::VerifyImages(v) = &mut r.body {
            v.cache_id = cache_id.clone();
        }
    }
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
        admission: spec.admission.unwrap_or(true),
        apply_one: spec.apply_rules.as_deref() == Some("One"),
        scored: p.metadata.annotations.get("policies.kyverno.io/scored").map(String::as_str) != Some("false"),
        emit_warning: spec.emit_warning.unwrap_or(false),
        failure_policy_ignore: failure_policy == "Ignore",
        match_conditions: compile_cel_preconditions(
            spec.webhook_configuration.as_ref().map(|w| w.match_conditions.as_slice()).unwrap_or(&[]),
            "spec.webhookConfiguration.matchConditions",
        )?,
        report_meta: ReportMeta::of(&document),
        rules,
        document,
        self_contained_memo: std::sync::OnceLock::new(),
    })
}
