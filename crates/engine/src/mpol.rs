//! CEL mutations: `policies.kyverno.io` MutatingPolicy and Kubernetes MutatingAdmissionPolicy.
//!
//! Both hold a list of `mutations`, each an `ApplyConfiguration` (a CEL expression building a
//! partial object, merged into the resource the way server-side apply merges) or a `JSONPatch`
//! (a CEL expression building RFC 6902 operations). They run in order, each seeing the object
//! the previous one produced as `object`. They compile into the same [`CompiledPolicy`] as
//! ClusterPolicies: one mutate rule named `""` (as Kyverno's CLI reports it) whose match is the
//! Kubernetes `matchConstraints`, with `matchConditions` as CEL preconditions.

use crate::cel_kind::{Shape, cel_policy, constraints, policy_name};
use crate::decode::{decode, json_of};
use crate::error::CompileError;
use crate::forms::{CelPatch, CelTargets, CompiledCelMutation};
use crate::forms::{CompiledMutation, Patches};
use crate::matching::Matcher;
use crate::policy::{
    CompiledPolicy, CompiledRule, ParamRef, RuleBody, cel_expr, compile_cel_preconditions, compile_cel_variables,
};
use crate::smp::{Field, ListKind, Ty};
#[cfg(test)]
use serde_json::json;
use serde_json::{Map, Value};
use verno_api::cel;

fn compile_targets(spec: &cel::CelPolicySpec) -> Result<Option<Box<CelTargets>>, CompileError> {
    let enabled = spec.evaluation.as_ref().and_then(|e| e.mutate_existing.as_ref()).and_then(|s| s.enabled);
    if enabled != Some(true) {
        return Ok(None);
    }
    let tmc = spec.target_match_constraints.clone().unwrap_or(Value::Null);
    let expression = match tmc.get("expression") {
        Some(e) => Some(cel_expr(Some(e), "spec.targetMatchConstraints.expression")?),
        None => None,
    };
    let mut declared: Option<cel::MatchResources> = None;
    if tmc.is_object() {
        let mut m = tmc.clone();
        if let Some(o) = m.as_object_mut() {
            o.remove("expression");
        }
        declared = Some(
            serde_json::from_value(m).map_err(|e| CompileError::new("spec.targetMatchConstraints", e.to_string()))?,
        );
    }
    let mr = match declared.filter(|d| !d.resource_rules.is_empty()) {
        Some(d) => d,
        None => spec.match_constraints.clone().unwrap_or_default(),
    };
    let mut c = constraints(Some(&mr));
    // Operations say nothing about a target (it is not being admitted).
    for r in &mut c.rules {
        r.operations = vec!["*".into()];
    }
    let mut resources = Vec::new();
    for r in &mr.resource_rules {
        for g in &r.api_groups {
            for v in &r.api_versions {
                for res in &r.resources {
                    resources.push((g.clone(), v.clone(), res.clone()));
                }
            }
        }
    }
    let conditions = match &spec.target_match_conditions {
        Some(Value::Array(a)) => compile_cel_preconditions(a, "spec.targetMatchConditions")?,
        _ => Vec::new(),
    };
    Ok(Some(Box::new(CelTargets { matcher: Matcher::constraints(c), resources, expression, conditions })))
}

fn compile_mutations(spec: &cel::CelPolicySpec) -> Result<CompiledCelMutation, CompileError> {
    let variables = compile_cel_variables(Some(&json_of(&spec.variables)), "spec")?;
    let mut mutations = Vec::new();
    for (i, m) in spec.mutations.iter().enumerate() {
        let p = format!("spec.mutations[{i}]");
        let patch = match m.patch_type.as_deref() {
            Some("ApplyConfiguration") => CelPatch::ApplyConfiguration(cel_expr(
                m.apply_configuration.as_ref().map(|e| &e.expression),
                &format!("{p}.applyConfiguration.expression"),
            )?),
            Some("JSONPatch") => CelPatch::JsonPatch(cel_expr(
                m.json_patch.as_ref().map(|e| &e.expression),
                &format!("{p}.jsonPatch.expression"),
            )?),
            Some(other) => {
                return Err(CompileError::new(
                    format!("{p}.patchType"),
                    format!("unknown patch type {other:?}: expected ApplyConfiguration or JSONPatch"),
                ));
            }
            None => {
                return Err(CompileError::new(
                    format!("{p}.patchType"),
                    "a mutation needs a patchType (ApplyConfiguration or JSONPatch)",
                ));
            }
        };
        mutations.push(patch);
    }
    if mutations.is_empty() {
        return Err(CompileError::new("spec.mutations", "at least one mutation is required"));
    }
    Ok(CompiledCelMutation {
        variables,
        mutations,
        params: None,
        targets: compile_targets(spec)?,
        audit_annotations: Vec::new(),
    })
}

fn rule(matcher: Matcher, conditions: &[Value], cel: CompiledCelMutation) -> Result<CompiledRule, CompileError> {
    Ok(CompiledRule {
        name: String::new(),
        autogen_of: None,
        matcher,
        exclude: None,
        context: Vec::new(),
        preconditions: None,
        cel_preconditions: compile_cel_preconditions(conditions, "spec.matchConditions")?,
        report_properties: Vec::new(),
        body: RuleBody::Mutate(Box::new(CompiledMutation {
            patches: Patches::default(),
            foreach: Vec::new(),
            targets: Vec::new(),
            cel: Some(Box::new(cel)),
        })),
    })
}

/// Compiles a MutatingPolicy or NamespacedMutatingPolicy document.
pub fn compile_mutating_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    policy_name(doc)?;
    let kind = match verno_api::Kind::of_document(doc) {
        Some(verno_api::Kind::NamespacedMutatingPolicy) => verno_api::Kind::NamespacedMutatingPolicy,
        _ => verno_api::Kind::MutatingPolicy,
    };
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let base = constraints(spec.match_constraints.as_ref());
    if base.rules.is_empty() {
        return Err(crate::policy::missing_match_constraints());
    }
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let audit_annotations = crate::policy::compile_audit_annotations(spec.audit_annotations.as_ref(), "spec")?;
    let mut cel = compile_mutations(spec)?;
    cel.audit_annotations = audit_annotations.clone();
    let mutate_existing = cel.targets.is_some();
    let mut rules = vec![rule(Matcher::constraints(base.clone()), &conditions, cel)?];
    // Pod controllers, as Kyverno's MutatingPolicy autogen derives them: a policy on Pods alone
    // also mutates the Pod templates of every controller (or those
    // `autogen.podControllers.controllers` names), its match conditions and apply
    // configurations rewritten by [`pod_to_template`]. (Mutate-existing policies are left
    // alone: their match is about the trigger.)
    let ctrls = if mutate_existing { Vec::new() } else { crate::cel_kind::controllers(spec.autogen.as_ref(), &base) };
    for (name, cron) in [("autogen-", false), ("autogen-cronjob-", true)] {
        if !ctrls.iter().any(|c| (*c == "cronjobs") == cron) {
            continue;
        }
        let mut s = spec.clone();
        let rewrite = |e: &mut Value| {
            if let Value::String(text) = e {
                *text = pod_to_template(text, cron);
            }
        };
        s.match_conditions.iter_mut().for_each(|c| rewrite(&mut c.expression));
        s.mutations.iter_mut().filter_map(|m| m.apply_configuration.as_mut()).for_each(|a| rewrite(&mut a.expression));
        let conditions: Vec<Value> = s.match_conditions.iter().map(json_of).collect();
        let mut cel = compile_mutations(&s)?;
        cel.audit_annotations = audit_annotations.clone();
        let matcher = Matcher::constraints(crate::cel_kind::controller_rules(&ctrls, cron, &base));
        let mut r = rule(matcher, &conditions, cel)?;
        r.name = name.to_string();
        r.autogen_of = Some(String::new());
        rules.push(r);
    }
    // Background scans report a MutatingPolicy unless `evaluation.background.enabled` is false.
    let background = doc.pointer("/spec/evaluation/background/enabled").and_then(Value::as_bool).unwrap_or(true);
    cel_policy(doc, kind, Shape::audit(background), rules)
}

/// A MutatingPolicy expression written for Pods, rewritten for Pod templates as Kyverno's
/// autogen does it (textually): `object.spec`, `object.metadata.labels` and
/// `object.metadata.annotations` (also `oldObject.` and the `Object.` type names) move under
/// `spec.template` (`spec.jobTemplate.spec.template` for CronJobs), and an expression that is
/// one `Object{…}` is wrapped in the controller's `Object{spec: …{template: …{…}}}`.
/// Anything else (variables, JSON patches, a conditional apply configuration) is left as
/// Kyverno leaves it.
fn pod_to_template(expression: &str, cron: bool) -> String {
    static RES: std::sync::OnceLock<Option<[regex::Regex; 3]>> = std::sync::OnceLock::new();
    let Some([spec, labels, annotations]) = RES
        .get_or_init(|| {
            Some([
                regex::Regex::new(r"\b(object|oldObject|Object)\.spec").ok()?,
                regex::Regex::new(r"\b(object|oldObject|Object)\.metadata\.labels").ok()?,
                regex::Regex::new(r"\b(object|oldObject|Object)\.metadata\.annotations").ok()?,
            ])
        })
        .as_ref()
    else {
        return expression.to_string();
    };
    let template = if cron { "spec.jobTemplate.spec.template" } else { "spec.template" };
    let mut out = spec.replace_all(expression, format!("${{1}}.{template}.spec").as_str()).into_owned();
    out = labels.replace_all(&out, format!("${{1}}.{template}.metadata.labels").as_str()).into_owned();
    out = annotations.replace_all(&out, format!("${{1}}.{template}.metadata.annotations").as_str()).into_owned();
    let Some(content) = out.trim().strip_prefix("Object").map(|r| r.trim_start_matches([' ', '\t', '\r', '\n'])) else {
        return out;
    };
    let Some(content) = content.strip_prefix('{') else { return out };
    // The root constructor's closing brace (braces in strings are counted too, as Kyverno's).
    let mut depth = 1usize;
    let mut end = None;
    for (i, c) in content.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(end) = end.filter(|e| *e > 0) else { return out };
    let (inner, rest) = (&content[..end], &content[end + 1..]);
    let (open, close) = if cron {
        (
            "Object{spec: Object.spec{jobTemplate: Object.spec.jobTemplate{spec: Object.spec.jobTemplate.spec{template: Object.spec.jobTemplate.spec.template{",
            "}}}}}",
        )
    } else {
        ("Object{spec: Object.spec{template: Object.spec.template{", "}}}")
    };
    format!("{open}{inner}{close}{rest}")
}

/// Compiles a Kubernetes MutatingAdmissionPolicy with its binding (`matchResources` narrows the
/// match, `paramRef` names the params object).
pub fn compile_mutating_admission_policy(doc: &Value, binding: Option<&Value>) -> Result<CompiledPolicy, CompileError> {
    policy_name(doc)?;
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let binding: cel::PolicyBinding = binding.map(decode).transpose()?.unwrap_or_default();
    let bspec = &binding.spec;
    let mut matchers = vec![constraints(spec.match_constraints.as_ref())];
    if let Some(mr) = &bspec.match_resources {
        matchers.push(constraints(Some(mr)));
    }
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let mut cel = compile_mutations(spec)?;
    if let (Some(pk), Some(pr)) = (&spec.param_kind, &bspec.param_ref) {
        cel.params = Some(ParamRef::from_binding(pk, pr));
    }
    let mut r = rule(Matcher::all_constraints(matchers), &conditions, cel)?;
    crate::cel_kind::admission_rule_identity(&mut r, policy_name(doc)?, "mapBinding", &binding)?;
    cel_policy(doc, verno_api::Kind::MutatingAdmissionPolicy, Shape::audit(true), vec![r])
}

/// Runs the mutations on `object` with `vars` (object, request, params, ... already set).
/// `Ok(None)` when nothing changed.
pub fn run(m: &CompiledCelMutation, object: &Value, vars: &mut verno_cel::Vars) -> Result<Option<Value>, String> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    let mut cur = object.clone();
    for (i, p) in m.mutations.iter().enumerate() {
        vars.set("object", &cur);
        // Variables see the object as it is before this mutation; lazy as in Kubernetes: one
        // that fails only matters where it is read.
        for (name, e) in &m.variables {
            let _ = e.eval_into_variable(name, vars);
        }
        match p {
            CelPatch::ApplyConfiguration(e) => {
                let patch = e.eval(vars).map_err(|err| {
                    format!("mutation {i}: applyConfiguration expression '{}' failed: {err}", e.source().trim())
                })?;
                if !patch.is_object() {
                    return Err(format!(
                        "mutation {i}: applyConfiguration must return an Object, got {}",
                        verno_jmespath::value::type_name(&patch)
                    ));
                }
                cur = apply_configuration(&cur, &patch, &kind);
            }
            CelPatch::JsonPatch(e) => {
                let ops = e.eval(vars).map_err(|err| {
                    format!("mutation {i}: jsonPatch expression '{}' failed: {err}", e.source().trim())
                })?;
                let ops = crate::jsonpatch::parse_ops(&ops)
                    .map_err(|err| format!("mutation {i}: invalid JSONPatch: {err}"))?;
                crate::jsonpatch::apply(&mut cur, &ops)
                    .map_err(|err| format!("mutation {i}: JSONPatch could not be applied: {err}"))?;
            }
        }
    }
    Ok(if crate::equal(&cur, object) { None } else { Some(cur) })
}

/// Mutate-existing: the objects `t` selects for the trigger in `vars`, each patched by the
/// mutations (with the target as `object`). Every selected target is returned, changed or not
/// (Kyverno's CLI shows each); callers write only the changed ones.
pub fn run_targets(
    m: &CompiledCelMutation,
    t: &CelTargets,
    vars: &verno_cel::Vars,
    data: &dyn crate::ports::Data,
) -> Result<Vec<Value>, String> {
    let candidates: Vec<Value> = match &t.expression {
        Some(e) => {
            let found =
                e.eval(vars).map_err(|err| format!("failed to evaluate targetMatchConstraints.expression: {err}"))?;
            match found {
                Value::Object(mut o) if o.get("items").is_some_and(Value::is_array) => match o.remove("items") {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                },
                Value::Null => Vec::new(),
                other => vec![other],
            }
        }
        None => {
            let mut all: Vec<Value> = Vec::new();
            for (g, v, res) in &t.resources {
                let api_version = if g.is_empty() { v.clone() } else { format!("{g}/{v}") };
                for o in data.resource_objects(&api_version, res, "") {
                    let key = |x: &Value| {
                        (
                            x.pointer("/apiVersion").cloned(),
                            x.pointer("/kind").cloned(),
                            x.pointer("/metadata/namespace").cloned(),
                            x.pointer("/metadata/name").cloned(),
                        )
                    };
                    if !all.iter().any(|a| key(a) == key(&o)) {
                        all.push(o);
                    }
                }
            }
            all.retain(|o| target_matches(&t.matcher, o, data));
            all
        }
    };
    let mut out = Vec::new();
    for target in candidates {
        let mut vars = vars.clone();
        vars.set("object", &target);
        vars.set("oldObject", &Value::Null);
        let mut holds = true;
        for (name, c) in &t.conditions {
            match c.eval_bool(&vars) {
                Ok(true) => {}
                Ok(false) => {
                    holds = false;
                    break;
                }
                Err(e) => return Err(format!("failed to evaluate targetMatchConditions {name}: {e}")),
            }
        }
        if !holds {
            continue;
        }
        out.push(run(m, &target, &mut vars)?.unwrap_or(target));
    }
    Ok(out)
}

fn target_matches(matcher: &Matcher, o: &Value, data: &dyn crate::ports::Data) -> bool {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (group, version) = s("/apiVersion").rsplit_once('/').unwrap_or(("", s("/apiVersion")));
    let ns = s("/metadata/namespace");
    let ns_labels = if ns.is_empty() { None } else { data.namespace_labels(ns) };
    let input = crate::matching::MatchInput {
        group,
        version,
        kind: s("/kind"),
        subresource: "",
        name: s("/metadata/name"),
        namespace: ns,
        labels: o.pointer("/metadata/labels").and_then(Value::as_object),
        annotations: o.pointer("/metadata/annotations").and_then(Value::as_object),
        operation: verno_api::Operation::Update,
        namespace_labels: ns_labels.as_ref(),
        user: None,
    };
    matcher.matches(&input).is_ok()
}

/// Merges an apply configuration into `obj` the way server-side apply merges (structured merge):
/// maps merge field by field (`null` removes), lists of known Kubernetes types with a key merge
/// element by element, `finalizers` is a set, every other list and scalar is replaced. Merged
/// lists keep the object's order; new elements go before the next element the two share, or at
/// the end. The list keys are the table in [`crate::smp::field`].
pub fn apply_configuration(obj: &Value, patch: &Value, kind: &str) -> Value {
    merge(Some(obj), patch, Field { ty: crate::smp::root(kind), list: ListKind::Atomic })
}

fn merge(dst: Option<&Value>, patch: &Value, f: Field) -> Value {
    match patch {
        Value::Object(pm) => {
            let mut out: Map<String, Value> = dst.and_then(Value::as_object).cloned().unwrap_or_default();
            for (k, pv) in pm {
                if pv.is_null() {
                    out.remove(k);
                    continue;
                }
                let merged = merge(out.get(k), pv, crate::smp::field(f.ty, k));
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        Value::Array(items) => match (f.list, dst.and_then(Value::as_array)) {
            (ListKind::Merge(key), Some(existing)) => Value::Array(merge_keyed(existing, items, key, f.ty)),
            (ListKind::Set, Some(existing)) => {
                let mut out = existing.clone();
                for x in items {
                    if !out.contains(x) {
                        out.push(x.clone());
                    }
                }
                Value::Array(out)
            }
            _ => patch.clone(),
        },
        other => other.clone(),
    }
}

fn merge_keyed(existing: &[Value], items: &[Value], key: &str, ty: Ty) -> Vec<Value> {
    let key_of = |v: &Value| v.get(key).filter(|k| !k.is_null()).cloned();
    let elem = Field { ty, list: ListKind::Atomic };
    let mut used = vec![false; items.len()];
    let find = |k: &Value| items.iter().position(|x| key_of(x).as_ref() == Some(k));
    let mut out = Vec::with_capacity(existing.len() + items.len());
    for e in existing {
        match key_of(e).and_then(|k| find(&k)).and_then(|pi| Some((pi, items.get(pi)?))) {
            Some((pi, item)) => {
                // New elements written before this shared one go first.
                for (j, x) in items.iter().enumerate().take(pi) {
                    let new = key_of(x).is_none_or(|k| !existing.iter().any(|y| key_of(y).as_ref() == Some(&k)));
                    if let Some(u) = used.get_mut(j).filter(|u| new && !**u) {
                        *u = true;
                        out.push(merge(None, x, elem));
                    }
                }
                if let Some(u) = used.get_mut(pi) {
                    *u = true;
                }
                out.push(merge(Some(e), item, elem));
            }
            None => out.push(e.clone()),
        }
    }
    for (x, u) in items.iter().zip(&used) {
        if !u {
            out.push(merge(None, x, elem));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_configuration_merges_like_server_side_apply() {
        let pod = json!({"kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1"}}, "spec": {
            "containers": [{"name": "app", "image": "nginx", "args": ["x"]}, {"name": "side", "image": "envoy"}],
            "tolerations": [{"key": "k"}]}});
        let patch = json!({"metadata": {"labels": {"b": "2"}}, "spec": {
            "containers": [{"name": "new", "image": "busybox"}, {"name": "side", "image": "envoy:2", "args": ["y"]}],
            "tolerations": [{"key": "other"}]}});
        let out = apply_configuration(&pod, &patch, "Pod");
        assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        // Keyed list: the object's order, new elements before the next shared one, fields merged.
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "app", "image": "nginx", "args": ["x"]}, {"name": "new", "image": "busybox"}, {"name": "side", "image": "envoy:2", "args": ["y"]}])
        );
        // Atomic list: replaced.
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "other"}]));
        // null removes.
        let out = apply_configuration(&pod, &json!({"metadata": {"labels": null}}), "Pod");
        assert!(out["metadata"].get("labels").is_none());
    }

    #[test]
    fn mutations_run_in_order_and_report_errors_with_the_expression() {
        let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "MutatingPolicy", "metadata": {"name": "m"}, "spec": {
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
        "mutations": [
            {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{metadata: Object.metadata{labels: Object.metadata.labels{team: 'a'}}}"}},
            {"patchType": "JSONPatch", "jsonPatch": {"expression": "[JSONPatch{op: 'add', path: '/metadata/labels/copy', value: object.metadata.labels.team}]"}}
        ]}});
        let p = compile_mutating_policy(&doc).expect("compiles");
        let RuleBody::Mutate(m) = &p.rules[0].body else { panic!("a mutate rule") };
        let cel = m.cel.as_deref().expect("cel mutation");
        let pod = json!({"kind": "Pod", "metadata": {"name": "p"}});
        let out = run(cel, &pod, &mut verno_cel::Vars::default()).expect("runs").expect("changed");
        assert_eq!(out["metadata"]["labels"], json!({"team": "a", "copy": "a"}));
        let mut replace = doc.clone();
        replace["spec"]["mutations"][1]["jsonPatch"]["expression"] =
            json!("[JSONPatch{op: 'replace', path: '/spec/missing', value: 1}]");
        let p = compile_mutating_policy(&replace).expect("compiles");
        let RuleBody::Mutate(m) = &p.rules[0].body else { panic!("a mutate rule") };
        let err = run(m.cel.as_deref().expect("cel"), &pod, &mut verno_cel::Vars::default()).expect_err("an error");
        assert!(err.starts_with("mutation 1: JSONPatch could not be applied"), "{err}");
        let mut broken = doc.clone();
        broken["spec"]["mutations"][1]["jsonPatch"]["expression"] = json!("[JSONPatch{");
        let err = compile_mutating_policy(&broken).expect_err("compile error");
        assert!(err.to_string().contains("spec.mutations[1].jsonPatch.expression"), "{err}");
    }

    /// Kyverno's textual rewrite of a Pod expression for Pod templates.
    #[test]
    fn pod_expressions_are_moved_into_the_template_as_kyverno_moves_them() {
        assert_eq!(
            pod_to_template("Object{spec: Object.spec{nodeSelector: {\"a\": \"b\"}}}", false),
            "Object{spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{nodeSelector: {\"a\": \"b\"}}}}}"
        );
        assert_eq!(
            pod_to_template("Object {metadata: Object.metadata{labels: {\"x\": \"y\"}}}", true),
            "Object{spec: Object.spec{jobTemplate: Object.spec.jobTemplate{spec: Object.spec.jobTemplate.spec{template: Object.spec.jobTemplate.spec.template{metadata: Object.metadata{labels: {\"x\": \"y\"}}}}}}}"
        );
        assert_eq!(
            pod_to_template("has(object.metadata.labels) && object.spec.hostNetwork", false),
            "has(object.spec.template.metadata.labels) && object.spec.template.spec.hostNetwork"
        );
        // Not one constructor: only the paths move.
        assert_eq!(pod_to_template("true ? Object{} : Object{}", false), "true ? Object{} : Object{}");
    }

    /// A MutatingPolicy on Pods also mutates the Pod templates of Deployments and CronJobs,
    /// unless `autogen.podControllers.controllers` leaves them out.
    #[test]
    fn a_pod_mutating_policy_mutates_controller_templates() {
        let policy = |autogen: Value| {
            json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "MutatingPolicy", "metadata": {"name": "add-label"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}]},
                "matchConditions": [{"name": "unlabelled", "expression": "!has(object.metadata.labels) || !('team' in object.metadata.labels)"}],
                "autogen": autogen,
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    "Object{metadata: Object.metadata{labels: {\"team\": \"a\"}}}"}}]}})
        };
        let run = |doc: &Value, object: &Value| {
            let p = match crate::compile(doc, &[]).expect("compiles") {
                crate::Compiled::Policy(p) => p,
                crate::Compiled::Exception(_) => panic!("a policy"),
            };
            let set = crate::PolicySet::new(vec![std::sync::Arc::new(p)], Vec::new());
            let req = crate::Request::new(crate::Operation::Create, object);
            set.evaluate(&req, crate::Scope::ALL, &verno_jmespath::NoEnv, &crate::NoData, &mut ()).patched
        };
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "n"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        let out = run(&policy(Value::Null), &deployment).expect("the template is mutated");
        assert_eq!(out["spec"]["template"]["metadata"]["labels"], json!({"app": "x", "team": "a"}));
        assert!(out["metadata"].get("labels").is_none(), "{out}");
        let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "n"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"metadata": {},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}}});
        let out = run(&policy(Value::Null), &cronjob).expect("the job template is mutated");
        assert_eq!(out["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"], json!({"team": "a"}));
        // Already labelled in the template: the match condition, rewritten, says no.
        let mut labelled = deployment.clone();
        labelled["spec"]["template"]["metadata"]["labels"]["team"] = json!("b");
        assert!(run(&policy(Value::Null), &labelled).is_none());
        // Only Deployments asked for: CronJobs are left alone.
        let only = policy(json!({"podControllers": {"controllers": ["deployments"]}}));
        assert!(run(&only, &cronjob).is_none());
        assert!(run(&only, &deployment).is_some());
    }
}
