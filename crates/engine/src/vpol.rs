//! `policies.kyverno.io` ValidatingPolicy / NamespacedValidatingPolicy, compiled into the same
//! [`CompiledPolicy`] as ClusterPolicies: one CEL rule (named `""`, as the CLI reports it) whose
//! match is the policy's Kubernetes `matchConstraints`, with `matchConditions` as CEL
//! preconditions, plus autogen rules for Pod controllers.

use crate::autogen::{Shift, shift_cel};
use crate::cel_kind::{
    Shape, admission_rule_identity, cel_policy, constraints, controller_rules, controllers, policy_name,
};
use crate::decode::{decode, json_of};
use crate::error::CompileError;
use crate::forms::CompiledValidation;
use crate::matching::{Constraints, Matcher, ResourceRule};
use crate::policy::{Action, CompiledPolicy, CompiledRule, RuleBody, compile_cel_preconditions};
use crate::validate::compile_cel;
use serde_json::{Value, json};
use verno_api::{Kind, cel};

fn rule(
    name: &str,
    matcher: Matcher,
    cel: &Value,
    conditions: &[Value],
    action: Action,
) -> Result<CompiledRule, CompileError> {
    Ok(CompiledRule {
        name: name.to_string(),
        autogen_of: if name.is_empty() { None } else { Some(String::new()) },
        matcher,
        exclude: None,
        context: Vec::new(),
        preconditions: None,
        cel_preconditions: compile_cel_preconditions(conditions, "spec.matchConditions")?,
        report_properties: Vec::new(),
        body: RuleBody::Validate(Box::new(CompiledValidation {
            message: None,
            failure_action: Some(action),
            overrides: Vec::new(),
            allow_existing_violations: true,
            numbered_elements: false,
            check: match compile_cel(cel, "spec")? {
                // An expression that cannot be evaluated is an `error` result here.
                crate::forms::Check::Cel(mut c) => {
                    c.on_error = crate::outcome::Status::Error;
                    crate::forms::Check::Cel(c)
                }
                other => other,
            },
        })),
    })
}

/// Compiles a ValidatingPolicy or NamespacedValidatingPolicy document.
pub fn compile_validating_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    policy_name(doc)?;
    let kind = match Kind::of_document(doc) {
        Some(Kind::NamespacedValidatingPolicy) => Kind::NamespacedValidatingPolicy,
        _ => Kind::ValidatingPolicy,
    };
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let actions = &spec.validation_actions;
    // No validationActions means [Deny] (Kyverno's `ValidationActions()` default).
    let action =
        if actions.is_empty() || actions.iter().any(|a| a == "Deny") { Action::Enforce } else { Action::Audit };
    let base = constraints(spec.match_constraints.as_ref());
    // JSON mode evaluates arbitrary JSON payloads: there are no Kubernetes resources to match.
    let mode = spec.evaluation.as_ref().and_then(|e| e.mode.as_deref());
    let json_mode = mode == Some("JSON");
    if mode == Some("Envoy") {
        return compile_authz_policy(doc, kind, &policy, true);
    }
    if mode == Some("HTTP") {
        return compile_authz_policy(doc, kind, &policy, false);
    }
    if base.rules.is_empty() && !json_mode {
        return Err(crate::policy::missing_match_constraints());
    }
    // The CEL part has the same shape as ClusterPolicy `validate.cel`.
    let cel = json!({"variables": json_of(&spec.variables), "expressions": json_of(&spec.validations)});
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let matcher = if json_mode { Matcher::all_constraints(Vec::new()) } else { Matcher::constraints(base.clone()) };
    let mut rules_out = vec![rule("", matcher, &cel, &conditions, action)?];
    let ctrls = controllers(spec.autogen.as_ref(), &base);
    let shift = |v: &Value, s: Shift| {
        shift_cel(v, s).ok_or_else(|| CompileError::new("spec", "autogen could not rewrite the expressions"))
    };
    if ctrls.iter().any(|c| *c != "cronjobs") {
        let cel_t = shift(&cel, Shift::Template)?;
        let cond_t = shift(&Value::Array(conditions.clone()), Shift::Template)?;
        rules_out.push(rule(
            "autogen-",
            Matcher::constraints(controller_rules(&ctrls, false, &base)),
            &cel_t,
            cond_t.as_array().map(Vec::as_slice).unwrap_or_default(),
            action,
        )?);
    }
    if ctrls.contains(&"cronjobs") {
        let cel_c = shift(&shift(&cel, Shift::Template)?, Shift::JobTemplate)?;
        let cond_c = shift(&shift(&Value::Array(conditions.clone()), Shift::Template)?, Shift::JobTemplate)?;
        rules_out.push(rule(
            "autogen-cronjob-",
            Matcher::constraints(controller_rules(&ctrls, true, &base)),
            &cel_c,
            cond_c.as_array().map(Vec::as_slice).unwrap_or_default(),
            action,
        )?);
    }
    // Kyverno's engine: its messages, validation index and audit annotations (moved into the
    // pod template for the autogen rules, as their expressions are).
    let annotations = spec.audit_annotations.clone().unwrap_or(Value::Null);
    for r in &mut rules_out {
        let list = match r.name.as_str() {
            "" => annotations.clone(),
            "autogen-" => shift(&annotations, Shift::Template)?,
            _ => shift(&shift(&annotations, Shift::Template)?, Shift::JobTemplate)?,
        };
        let audit_annotations = crate::policy::compile_audit_annotations(Some(&list), "spec")?;
        if let RuleBody::Validate(v) = &mut r.body
            && let crate::forms::Check::Cel(c) = &mut v.check
        {
            c.kyverno = Some(Box::new(crate::forms::KyvernoCel { audit_annotations }));
        }
    }
    let background =
        spec.evaluation.as_ref().and_then(|e| e.background.as_ref()).and_then(|b| b.enabled).unwrap_or(true);
    cel_policy(doc, kind, Shape { action, emit_warning: actions.iter().any(|a| a == "Warn"), background }, rules_out)
}

/// What an Envoy-mode ValidatingPolicy is about: Envoy's external authorization
/// `CheckRequest` (callers evaluate such payloads with this kind, never a Kubernetes object).
pub const ENVOY_CHECK_REQUEST: (&str, &str, &str) = ("envoy.service.auth", "v3", "CheckRequest");
/// What an HTTP-mode ValidatingPolicy is about: Kyverno's HTTP authorization `CheckRequest`.
pub const HTTP_CHECK_REQUEST: (&str, &str, &str) = ("http.authz.kyverno.io", "v1", "CheckRequest");

impl CompiledPolicy {
    /// The request kind an Envoy- or HTTP-mode ValidatingPolicy is about
    /// ([`ENVOY_CHECK_REQUEST`] or [`HTTP_CHECK_REQUEST`]); `None` for every other policy.
    pub fn authz_request(&self) -> Option<(&'static str, &'static str, &'static str)> {
        self.rules.iter().find_map(|r| match &r.body {
            RuleBody::Validate(v) => match &v.check {
                crate::forms::Check::Cel(c) => {
                    c.authz.map(|a| if a.envoy { ENVOY_CHECK_REQUEST } else { HTTP_CHECK_REQUEST })
                }
                _ => None,
            },
            _ => None,
        })
    }
}

/// A ValidatingPolicy in `Envoy` or `HTTP` evaluation mode: one rule (named after the policy,
/// as Kyverno's CLI reports it) over the mode's `CheckRequest`s, its `matchConditions` as CEL
/// preconditions, its validations returning responses (`envoy.Allowed()...Response()`,
/// `http.Denied(reason).Response()`, …) or null.
fn compile_authz_policy(
    doc: &Value,
    kind: Kind,
    policy: &cel::CelPolicy,
    envoy: bool,
) -> Result<CompiledPolicy, CompileError> {
    let spec = &policy.spec;
    let (group, version, request_kind) = if envoy { ENVOY_CHECK_REQUEST } else { HTTP_CHECK_REQUEST };
    let matcher = Matcher::constraints(Constraints {
        rules: vec![ResourceRule {
            api_groups: vec![group.into()],
            api_versions: vec![version.into()],
            resources: vec![crate::matching::plural(request_kind)],
            operations: vec!["*".into()],
            resource_names: Vec::new(),
            scope: None,
        }],
        exclude: Vec::new(),
        namespace_selector: None,
        object_selector: None,
    });
    let cel = json!({"variables": json_of(&spec.variables), "expressions": json_of(&spec.validations)});
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let mut r = rule(policy_name(doc)?, matcher, &cel, &conditions, Action::Enforce)?;
    r.autogen_of = None;
    let ignore = doc.pointer("/spec/failurePolicy").and_then(Value::as_str) == Some("Ignore");
    if let RuleBody::Validate(v) = &mut r.body
        && let crate::forms::Check::Cel(c) = &mut v.check
    {
        c.authz = Some(crate::forms::Authz { envoy, ignore_errors: ignore });
    }
    cel_policy(doc, kind, Shape { action: Action::Enforce, emit_warning: false, background: false }, vec![r])
}

/// Compiles a Kubernetes ValidatingAdmissionPolicy with its binding (the first one naming it):
/// the binding's `validationActions`, `matchResources` (narrowing the policy's match) and
/// `paramRef` apply. Without a binding the policy denies, as Kyverno's CLI assumes.
pub fn compile_admission_policy(doc: &Value, binding: Option<&Value>) -> Result<CompiledPolicy, CompileError> {
    policy_name(doc)?;
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let binding: cel::PolicyBinding = binding.map(decode).transpose()?.unwrap_or_default();
    let bspec = &binding.spec;
    let actions = &bspec.validation_actions;
    let action =
        if actions.is_empty() || actions.iter().any(|a| a == "Deny") { Action::Enforce } else { Action::Audit };
    let mut matchers = vec![constraints(spec.match_constraints.as_ref())];
    if let Some(mr) = &bspec.match_resources {
        matchers.push(constraints(Some(mr)));
    }
    let cel = json!({"variables": json_of(&spec.variables), "expressions": json_of(&spec.validations)});
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let mut r = rule("", Matcher::all_constraints(matchers), &cel, &conditions, action)?;
    admission_rule_identity(&mut r, policy_name(doc)?, "binding", &binding)?;
    if let (Some(pk), Some(pr)) = (&spec.param_kind, &bspec.param_ref)
        && let RuleBody::Validate(v) = &mut r.body
        && let crate::forms::Check::Cel(c) = &mut v.check
    {
        c.params = Some(crate::policy::ParamRef::from_binding(pk, pr));
    }
    cel_policy(
        doc,
        Kind::ValidatingAdmissionPolicy,
        Shape { action, emit_warning: actions.iter().any(|a| a == "Warn"), background: true },
        vec![r],
    )
}

/// `status.autogen` of a ValidatingPolicy as Kyverno writes it: for the Pod controllers autogen
/// covers, one config per replacement set (`cronjobs`, `defaults`), each with its `targets`
/// (sorted by group, version, resource) and the whole spec rewritten for them — match
/// constraints on the controllers (first rule's operations, resources grouped by group and
/// version, sorted) and every `object.spec` / `object.metadata` path moved into the pod
/// template. `{}` when autogen does not apply.
pub fn autogen_status(doc: &Value) -> Value {
    let Ok(policy) = decode::<cel::CelPolicy>(doc) else { return json!({}) };
    let base = constraints(policy.spec.match_constraints.as_ref());
    let ctrls = controllers(policy.spec.autogen.as_ref(), &base);
    if ctrls.is_empty() {
        return json!({});
    }
    let spec = doc.get("spec").cloned().unwrap_or(Value::Null);
    let operations = spec.pointer("/matchConstraints/resourceRules/0/operations").cloned().unwrap_or(json!([]));
    let namespace_selector = spec.pointer("/matchConstraints/namespaceSelector").cloned();
    let target = |c: &str| -> (&'static str, &'static str) {
        match c {
            "jobs" | "cronjobs" => ("batch", if c == "jobs" { "Job" } else { "CronJob" }),
            "deployments" => ("apps", "Deployment"),
            "replicasets" => ("apps", "ReplicaSet"),
            "statefulsets" => ("apps", "StatefulSet"),
            _ => ("apps", "DaemonSet"),
        }
    };
    let mut configs = serde_json::Map::new();
    for (config, cron) in [("cronjobs", true), ("defaults", false)] {
        let mut mine: Vec<&str> = ctrls.iter().copied().filter(|c| (*c == "cronjobs") == cron).collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by_key(|c| (target(c).0, *c));
        let targets: Vec<Value> = mine
            .iter()
            .map(|c| json!({"group": target(c).0, "version": "v1", "resource": c, "kind": target(c).1}))
            .collect();
        let mut groups: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
        for c in &mine {
            groups.entry(target(c).0).or_default().push(c);
        }
        let rules: Vec<Value> = groups
            .iter()
            .map(|(g, rs)| json!({"apiGroups": [g], "apiVersions": ["v1"], "operations": operations, "resources": rs}))
            .collect();
        let mut s = spec.clone();
        let mut mc = json!({"resourceRules": rules});
        if let (Some(sel), Some(m)) = (namespace_selector.clone(), mc.as_object_mut()) {
            m.insert("namespaceSelector".into(), sel);
        }
        if let Some(m) = s.as_object_mut() {
            m.insert("matchConstraints".into(), mc);
        }
        let Some(mut s) = shift_cel(&s, Shift::Template) else { continue };
        if cron {
            let Some(c) = shift_cel(&s, Shift::JobTemplate) else { continue };
            s = c;
        }
        configs.insert(config.to_string(), json!({"targets": targets, "spec": s}));
    }
    json!({"configs": configs})
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod autogen_status_tests {
    use super::*;

    fn policy(autogen: Option<Value>) -> Value {
        let mut p = json!({
            "apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "team"},
            "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]},
                "matchConditions": [{"name": "labelled", "expression": "has(object.metadata.labels) && object.metadata.namespace != 'kube-system'"}],
                "validations": [{"expression": "object.spec.containers.all(c, has(c.image))", "message": "images are required"}],
            },
        });
        if let Some(a) = autogen {
            p["spec"]["autogen"] = a;
        }
        p
    }

    #[test]
    fn the_status_lists_each_config_with_sorted_targets_and_a_rewritten_spec() {
        let s = autogen_status(&policy(None));
        let defaults = &s["configs"]["defaults"];
        let resources: Vec<&str> =
            defaults["targets"].as_array().unwrap().iter().map(|t| t["resource"].as_str().unwrap()).collect();
        assert_eq!(resources, ["daemonsets", "deployments", "replicasets", "statefulsets", "jobs"]);
        assert_eq!(
            defaults["spec"]["matchConstraints"]["resourceRules"],
            json!([
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"]},
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]},
            ])
        );
        // The namespace stays the controller's own.
        assert_eq!(
            defaults["spec"]["matchConditions"][0]["expression"],
            "has(object.spec.template.metadata.labels) && object.metadata.namespace != 'kube-system'"
        );
        assert_eq!(
            s["configs"]["cronjobs"]["spec"]["validations"][0]["expression"],
            "object.spec.jobTemplate.spec.template.spec.containers.all(c, has(c.image))"
        );
        // Autogen turned off, or limited.
        assert_eq!(autogen_status(&policy(Some(json!({"podControllers": {"controllers": []}})))), json!({}));
        let only = autogen_status(&policy(Some(json!({"podControllers": {"controllers": ["deployments"]}}))));
        assert!(only["configs"].get("cronjobs").is_none());
        assert_eq!(
            only["configs"]["defaults"]["targets"],
            json!([{"group": "apps", "version": "v1", "resource": "deployments", "kind": "Deployment"}])
        );
    }
}
