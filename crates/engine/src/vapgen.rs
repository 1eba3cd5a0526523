//! Kyverno's `generateValidatingAdmissionPolicy` feature, as a pure plan: whether a
//! ClusterPolicy or a ValidatingPolicy becomes a Kubernetes ValidatingAdmissionPolicy and its
//! binding, and those two objects. The controller writes them; the API server then enforces the
//! policy, and Verno no longer evaluates it (its live status says `generated`).
//!
//! A ClusterPolicy qualifies when it has exactly one rule, a `validate.cel` rule with
//! `generate: true`, and nothing a ValidatingAdmissionPolicy cannot say: user or role criteria,
//! annotations, wildcards in names or namespaces, selectors across several resource filters or in
//! an exclude block, namespaces in an exclude of kinds, more than one `all` filter, failure action
//! overrides by namespace; its PolicyExceptions (those naming its rule) must have one rule name
//! each, no conditions, and the same kind of filters. Otherwise the plan says why, in Kyverno's
//! words. A ValidatingPolicy qualifies when `spec.autogen.validatingAdmissionPolicy.enabled` and
//! no Pod-controller autogen applies; its CEL PolicyExceptions become negated match conditions.

use crate::matching::KindSelector;
use serde_json::{Map, Value, json};

/// What becomes of one policy.
#[derive(Debug, Clone, PartialEq)]
pub enum VapPlan {
    /// The ValidatingAdmissionPolicy and its binding to write (complete objects).
    Generate { policy: Value, binding: Value },
    /// No admission policy (any earlier one is removed), and why.
    Skip(String),
}

/// Where a kind is served: `(group, version, kind, subresource)` of a selector (`*` where open)
/// to every `(group, version, plural)` that serves it. Generation needs exactly one.
pub type Resolve<'a> = &'a dyn Fn(&str, &str, &str, &str) -> Vec<(String, String, String)>;

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kyverno");
const EXCLUDE_REPORTING: &str = "reports.kyverno.io/disabled";

fn skip(why: &str) -> VapPlan {
    VapPlan::Skip(format!("skip generating ValidatingAdmissionPolicy{why}"))
}

fn arr(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

fn non_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn wild(s: &str) -> bool {
    s.contains('*') || s.contains('?')
}

/// The user criteria of a match/exclude block or filter.
fn check_user(block: &Value) -> Result<(), VapPlan> {
    if ["roles", "clusterRoles", "subjects"].iter().any(|k| non_empty(block.get(*k))) {
        return Err(skip(": Roles / ClusterRoles / Subjects in `any/all` is not applicable."));
    }
    Ok(())
}

fn check_resources(res: &Value, is_match: bool) -> Result<(), VapPlan> {
    if !is_match && non_empty(res.get("kinds")) && non_empty(res.get("namespaces")) {
        return Err(skip(": excluding a resource within a namespace is not applicable."));
    }
    if non_empty(res.get("annotations")) {
        return Err(skip(": Annotations in resource description is not applicable."));
    }
    let name = res.get("name").and_then(Value::as_str).into_iter();
    if name.chain(arr(res.get("names")).iter().filter_map(Value::as_str)).any(wild) {
        return Err(skip(": wildcards in resource name is not applicable."));
    }
    if arr(res.get("namespaces")).iter().filter_map(Value::as_str).any(wild) {
        return Err(skip(": wildcards in namespace name is not applicable."));
    }
    Ok(())
}

fn check_filters(filters: &[Value], is_match: bool) -> Result<(), VapPlan> {
    let mut selectors = false;
    for f in filters {
        check_user(f)?;
        let res = f.get("resources").unwrap_or(&Value::Null);
        check_resources(res, is_match)?;
        selectors |= non_empty(res.get("namespaceSelector")) || non_empty(res.get("selector"));
    }
    if !is_match && selectors {
        return Err(skip(": NamespaceSelector / ObjectSelector in the exclude block is not applicable."));
    }
    if is_match && filters.len() > 1 && selectors {
        return Err(skip(
            ": NamespaceSelector / ObjectSelector across multiple resources in the match block are not applicable.",
        ));
    }
    Ok(())
}

fn check_block(block: &Value, is_match: bool, what: &str) -> Result<(), VapPlan> {
    check_user(block)?;
    check_resources(block.get("resources").unwrap_or(&Value::Null), is_match)?;
    check_filters(arr(block.get("any")), is_match)?;
    let all = arr(block.get("all"));
    if all.len() > 1 {
        return Err(skip(&format!(": multiple 'all' in the {what} is not applicable.")));
    }
    check_filters(all, is_match)
}

fn check_overrides(overrides: &[Value]) -> Result<(), VapPlan> {
    if overrides.len() > 1 {
        return Err(skip(": multiple validationFailureActionOverrides are not applicable."));
    }
    if overrides.first().is_some_and(|o| non_empty(o.get("namespaces"))) {
        return Err(skip(": Namespaces in validationFailureActionOverrides is not applicable."));
    }
    Ok(())
}

/// The exceptions of `policy`'s rule `rule` among kyverno.io PolicyExceptions.
fn exceptions_of<'e>(exceptions: &'e [Value], policy: &str, rule: &str) -> Vec<&'e Value> {
    exceptions
        .iter()
        .filter(|e| {
            arr(e.pointer("/spec/exceptions")).iter().any(|x| {
                x.get("policyName").and_then(Value::as_str) == Some(policy)
                    && arr(x.get("ruleNames")).iter().any(|r| r.as_str() == Some(rule))
            })
        })
        .collect()
}

fn check_exceptions(exceptions: &[&Value]) -> Result<(), VapPlan> {
    for e in exceptions {
        if arr(e.pointer("/spec/exceptions")).iter().any(|x| arr(x.get("ruleNames")).len() > 1) {
            return Err(skip(": multiple ruleNames in PolicyException is not applicable."));
        }
        if e.pointer("/spec/conditions").is_some_and(|c| !c.is_null()) {
            return Err(skip(": Conditions in PolicyException is not applicable."));
        }
        let m = e.pointer("/spec/match").unwrap_or(&Value::Null);
        check_filters(arr(m.get("any")), false)?;
        let all = arr(m.get("all"));
        if all.len() > 1 {
            return Err(skip(": multiple 'all' in the PolicyException's match block is not applicable."));
        }
        check_filters(all, false)?;
    }
    Ok(())
}

/// Kyverno's operations as admission operations; none named means all four.
fn operations(res: &Value) -> Vec<Value> {
    let named: Vec<Value> = arr(res.get("operations"))
        .iter()
        .filter_map(Value::as_str)
        .filter(|o| ["CREATE", "UPDATE", "CONNECT", "DELETE"].contains(o))
        .map(|o| json!(o))
        .collect();
    if named.is_empty() { vec![json!("CREATE"), json!("UPDATE"), json!("CONNECT"), json!("DELETE")] } else { named }
}

fn rule(names: &[Value], group: &str, version: &str, ops: &[Value], mut resources: Vec<String>) -> Value {
    resources.sort();
    let mut r = Map::new();
    if !names.is_empty() {
        r.insert("resourceNames".into(), Value::Array(names.to_vec()));
    }
    r.insert("apiGroups".into(), json!([group]));
    r.insert("apiVersions".into(), json!([version]));
    r.insert("operations".into(), Value::Array(ops.to_vec()));
    r.insert("resources".into(), json!(resources));
    Value::Object(r)
}

/// One resource description into admission rules (appended to `rules`, merged by group and
/// version as Kyverno merges them).
fn add_rules(rules: &mut Vec<Value>, res: &Value, is_match: bool, resolve: Resolve<'_>) -> Result<(), String> {
    let ops = operations(res);
    let mut names: Vec<Value> = arr(res.get("names")).to_vec();
    if let Some(n) = res.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        names.push(json!(n));
    }
    for kind in arr(res.get("kinds")).iter().filter_map(Value::as_str) {
        if kind == "*" {
            rules.push(rule(&names, "*", "*", &ops, vec!["*".into()]));
            continue;
        }
        let sel = KindSelector::parse(kind);
        let (g, v, k, sub) = sel.parts();
        let found = resolve(g, v, k, sub);
        let [(group, version, plural)] = found.as_slice() else {
            return Err(format!("no unique match for kind {k}"));
        };
        let mut resources = vec![plural.clone()];
        if plural == "pods" {
            resources.push("pods/ephemeralcontainers".into());
        }
        let same = rules.iter_mut().find(|r| {
            arr(r.get("apiGroups")).iter().any(|x| x.as_str() == Some(group))
                && arr(r.get("apiVersions")).iter().any(|x| x.as_str() == Some(version))
        });
        match same {
            Some(r) => {
                if let Some(list) = r.get_mut("resources").and_then(Value::as_array_mut) {
                    list.extend(resources.into_iter().map(Value::String));
                    list.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
                }
            }
            None => rules.push(rule(&names, group, version, &ops, resources)),
        }
    }
    let namespaces = arr(res.get("namespaces"));
    if !is_match && !namespaces.is_empty() && !non_empty(res.get("kinds")) {
        let mut r = Map::new();
        r.insert("resourceNames".into(), Value::Array(namespaces.to_vec()));
        r.insert("apiGroups".into(), json!([""]));
        r.insert("apiVersions".into(), json!(["v1"]));
        r.insert("operations".into(), Value::Array(ops));
        r.insert("resources".into(), json!(["namespaces"]));
        rules.push(Value::Object(r));
    }
    Ok(())
}

/// The match constraints being built: Kyverno's translation writes the rules so far, and the
/// selectors of the last match description, at each step.
#[derive(Default)]
struct Constraints {
    rules: Vec<Value>,
    exclude: Vec<Value>,
    namespace_selector: Option<Value>,
    object_selector: Option<Value>,
}

impl Constraints {
    fn add(&mut self, res: &Value, is_match: bool, resolve: Resolve<'_>) -> Result<(), String> {
        if is_match {
            add_rules(&mut self.rules, res, true, resolve)?;
            let namespaces = arr(res.get("namespaces"));
            self.namespace_selector = if namespaces.is_empty() {
                res.get("namespaceSelector").filter(|v| !v.is_null()).cloned()
            } else {
                Some(
                    json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}),
                )
            };
            self.object_selector = res.get("selector").filter(|v| !v.is_null()).cloned();
        } else {
            add_rules(&mut self.exclude, res, false, resolve)?;
        }
        Ok(())
    }

    fn block(&mut self, block: &Value, is_match: bool, resolve: Resolve<'_>) -> Result<(), String> {
        if let Some(res) = block.get("resources").filter(|r| non_empty(Some(r))) {
            self.add(res, is_match, resolve)?;
        }
        for f in arr(block.get("any")).iter().chain(arr(block.get("all"))) {
            self.add(f.get("resources").unwrap_or(&Value::Null), is_match, resolve)?;
        }
        Ok(())
    }

    fn into_value(self) -> Value {
        let mut m = Map::new();
        if !self.exclude.is_empty() {
            m.insert("excludeResourceRules".into(), Value::Array(self.exclude));
        }
        if let Some(s) = self.namespace_selector {
            m.insert("namespaceSelector".into(), s);
        }
        if let Some(s) = self.object_selector {
            m.insert("objectSelector".into(), s);
        }
        m.insert("resourceRules".into(), Value::Array(self.rules));
        Value::Object(m)
    }
}

/// The owner reference to the policy, at the version Kyverno's controller reads it (the
/// stored version may differ: any served version names the same object).
fn owner(policy: &Value) -> Value {
    let kind = policy.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = if kind == "ClusterPolicy" { "kyverno.io/v1" } else { "policies.kyverno.io/v1beta1" };
    let mut o = Map::new();
    o.insert("apiVersion".into(), json!(api_version));
    o.insert("kind".into(), json!(kind));
    o.insert("name".into(), policy.pointer("/metadata/name").cloned().unwrap_or(Value::Null));
    o.insert("uid".into(), policy.pointer("/metadata/uid").cloned().unwrap_or(json!("")));
    Value::Array(vec![Value::Object(o)])
}

fn metadata(name: &str, policy: &Value, reporting_label: bool) -> Value {
    let mut labels = Map::new();
    labels.insert(MANAGED_BY.0.into(), json!(MANAGED_BY.1));
    if reporting_label && policy.pointer("/metadata/labels").and_then(|l| l.get(EXCLUDE_REPORTING)).is_some() {
        labels.insert(EXCLUDE_REPORTING.into(), json!("true"));
    }
    json!({"name": name, "labels": labels, "ownerReferences": owner(policy)})
}

/// Copies the fields of `from` named in `keys` into `to` where they are set.
fn copy(to: &mut Map<String, Value>, from: &Value, keys: &[(&str, &str)]) {
    for (src, dst) in keys {
        if let Some(v) = from.get(*src).filter(|v| non_empty(Some(v))) {
            to.insert((*dst).into(), v.clone());
        }
    }
}

fn objects(name: &str, policy: &Value, spec: Map<String, Value>, binding_spec: Value) -> VapPlan {
    admission_objects(("ValidatingAdmissionPolicy", "v1"), name, policy, spec, binding_spec)
}

/// A generated admission policy of `kind` at `version` of admissionregistration.k8s.io, and its
/// binding `{name}-binding`, with Kubernetes' defaults written out.
fn admission_objects(
    (kind, version): (&str, &str),
    name: &str,
    policy: &Value,
    spec: Map<String, Value>,
    binding_spec: Value,
) -> VapPlan {
    let mut spec = spec;
    // Kubernetes' defaults, written out so the object reads the same on every API server.
    spec.entry("failurePolicy").or_insert(json!("Fail"));
    if let Some(Value::Object(mc)) = spec.get_mut("matchConstraints") {
        mc.entry("matchPolicy").or_insert(json!("Equivalent"));
        mc.entry("namespaceSelector").or_insert(json!({}));
        mc.entry("objectSelector").or_insert(json!({}));
        for list in ["resourceRules", "excludeResourceRules"] {
            for r in mc.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(r) = r.as_object_mut() {
                    r.entry("scope").or_insert(json!("*"));
                }
            }
        }
    }
    let api_version = format!("admissionregistration.k8s.io/{version}");
    VapPlan::Generate {
        policy: json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": metadata(name, policy, true), "spec": spec,
        }),
        binding: json!({
            "apiVersion": api_version, "kind": format!("{kind}Binding"),
            "metadata": metadata(&format!("{name}-binding"), policy, false), "spec": binding_spec,
        }),
    }
}

/// The plan for a ClusterPolicy, with the cluster's kyverno.io PolicyExceptions (those naming
/// its rule are used). `Err`: a kind could not be resolved (Kyverno retries later).
pub fn plan_cluster_policy(policy: &Value, exceptions: &[Value], resolve: Resolve<'_>) -> Result<VapPlan, String> {
    let rules = arr(policy.pointer("/spec/rules"));
    let [rule] = rules else {
        return Ok(skip(if rules.is_empty() { ": no rules found." } else { ": multiple rules are not applicable." }));
    };
    let Some(cel) = rule.pointer("/validate/cel").filter(|c| c.is_object()) else {
        return Ok(skip(" for non CEL rules."));
    };
    if cel.get("generate").and_then(Value::as_bool) != Some(true) {
        return Ok(skip(": validate.cel.generate is not set to true."));
    }
    let name = policy.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let rule_name = rule.get("name").and_then(Value::as_str).unwrap_or_default();
    let mine = exceptions_of(exceptions, name, rule_name);
    let checks = || -> Result<(), VapPlan> {
        check_overrides(arr(policy.pointer("/spec/validationFailureActionOverrides")))?;
        check_overrides(arr(rule.pointer("/validate/failureActionOverrides")))?;
        check_block(rule.get("match").unwrap_or(&Value::Null), true, "match block")?;
        if let Some(ex) = rule.get("exclude").filter(|e| !e.is_null()) {
            check_block(ex, false, "exclude block")?;
        }
        check_exceptions(&mine)
    };
    if let Err(plan) = checks() {
        return Ok(plan);
    }
    let mut c = Constraints::default();
    c.block(rule.get("match").unwrap_or(&Value::Null), true, resolve)?;
    if let Some(ex) = rule.get("exclude").filter(|e| !e.is_null()) {
        c.block(ex, false, resolve)?;
    }
    for e in &mine {
        let m = e.pointer("/spec/match").unwrap_or(&Value::Null);
        for f in arr(m.get("any")).iter().chain(arr(m.get("all"))) {
            c.add(f.get("resources").unwrap_or(&Value::Null), false, resolve)?;
        }
    }
    let mut spec = Map::new();
    spec.insert("matchConstraints".into(), c.into_value());
    copy(&mut spec, cel, &[("paramKind", "paramKind"), ("variables", "variables"), ("expressions", "validations")]);
    copy(&mut spec, cel, &[("auditAnnotations", "auditAnnotations")]);
    copy(&mut spec, rule, &[("celPreconditions", "matchConditions")]);
    let action = rule
        .pointer("/validate/failureAction")
        .or_else(|| policy.pointer("/spec/validationFailureAction"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let actions = if action == "Enforce" || action == "enforce" { json!(["Deny"]) } else { json!(["Audit", "Warn"]) };
    let vap = format!("cpol-{name}");
    let mut binding = Map::new();
    binding.insert("policyName".into(), json!(vap));
    copy(&mut binding, cel, &[("paramRef", "paramRef")]);
    binding.insert("validationActions".into(), actions);
    Ok(objects(&vap, policy, spec, Value::Object(binding)))
}

/// The plan for a ValidatingPolicy, with the cluster's policies.kyverno.io PolicyExceptions
/// (those whose `policyRefs` name it are used). `autogen`: whether Pod-controller autogen
/// derives rules for it (then no admission policy, as Kyverno).
pub fn plan_validating_policy(policy: &Value, exceptions: &[Value], autogen: bool) -> VapPlan {
    if policy.pointer("/spec/autogen/validatingAdmissionPolicy/enabled").and_then(Value::as_bool) != Some(true) {
        return skip(": not enabled.");
    }
    if autogen {
        return skip(": pod controllers autogen is enabled.");
    }
    let name = policy.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let spec = policy.get("spec").unwrap_or(&Value::Null);
    let mut conditions: Vec<Value> = arr(spec.get("matchConditions")).to_vec();
    conditions.extend(negated_exception_conditions(exceptions, name));
    let mut variables: Vec<Value> = arr(spec.get("variables")).to_vec();
    let quoted = |list: &[Value]| {
        let items: Vec<String> = list.iter().filter_map(Value::as_str).map(|s| format!("'{s}'")).collect();
        format!("[{}]", items.join(", "))
    };
    for e in exceptions_naming(exceptions, name) {
        for (field, var) in [("images", "allowedImages"), ("allowedValues", "allowedValues")] {
            let list = arr(e.pointer(&format!("/spec/{field}")));
            if !list.is_empty() {
                variables.push(json!({"name": var, "expression": quoted(list)}));
            }
        }
    }
    let validations: Vec<Value> = arr(spec.get("validations"))
        .iter()
        .map(|v| {
            let mut v = v.clone();
            if let Some(Value::String(e)) = v.get_mut("expression") {
                *e = e
                    .replace("exceptions.allowedImages", "variables.allowedImages")
                    .replace("exceptions.allowedValues", "variables.allowedValues");
            }
            v
        })
        .collect();
    let mut out = Map::new();
    copy(&mut out, spec, &[("matchConstraints", "matchConstraints")]);
    for (k, list) in [("matchConditions", conditions), ("variables", variables), ("validations", validations)] {
        if !list.is_empty() {
            out.insert(k.into(), Value::Array(list));
        }
    }
    copy(&mut out, spec, &[("auditAnnotations", "auditAnnotations")]);
    let actions = match arr(spec.get("validationActions")) {
        [] => json!(["Deny"]),
        a => Value::Array(a.to_vec()),
    };
    let vap = format!("vpol-{name}");
    objects(&vap, policy, out, json!({"policyName": vap, "validationActions": actions}))
}

/// The API versions of MutatingAdmissionPolicy in Kyverno's order of preference.
pub const MAP_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// The CEL PolicyExceptions naming `name` in their `policyRefs` (Kyverno matches the name
/// only).
fn exceptions_naming<'e>(exceptions: &'e [Value], name: &str) -> impl Iterator<Item = &'e Value> {
    exceptions.iter().filter(move |e| {
        arr(e.pointer("/spec/policyRefs")).iter().any(|r| r.get("name").and_then(Value::as_str) == Some(name))
    })
}

/// The match conditions of the CEL PolicyExceptions naming `name`, negated.
fn negated_exception_conditions(exceptions: &[Value], name: &str) -> Vec<Value> {
    exceptions_naming(exceptions, name)
        .flat_map(|e| arr(e.pointer("/spec/matchConditions")))
        .map(|mc| {
            let expr = mc.get("expression").and_then(Value::as_str).unwrap_or_default();
            json!({"name": mc.get("name").cloned().unwrap_or(Value::Null), "expression": format!("!({expr})")})
        })
        .collect()
}

/// The plan for a MutatingPolicy (Kyverno's `generateMutatingAdmissionPolicy`): a
/// MutatingAdmissionPolicy `mpol-NAME` at `version` (the preferred one the API server serves,
/// `None`: it serves none) and its binding, when `spec.autogen.mutatingAdmissionPolicy.enabled`,
/// server-side apply is not asked for and no Pod-controller autogen applies (`autogen`). The
/// cluster's CEL PolicyExceptions naming it become negated match conditions, before its own.
pub fn plan_mutating_policy(policy: &Value, exceptions: &[Value], autogen: bool, version: Option<&str>) -> VapPlan {
    const SKIP: &str = "skip generating MutatingAdmissionPolicy";
    let spec = policy.get("spec").unwrap_or(&Value::Null);
    let enabled = spec.pointer("/autogen/mutatingAdmissionPolicy/enabled").and_then(Value::as_bool) == Some(true);
    if !enabled {
        return VapPlan::Skip(format!("{SKIP}: not enabled."));
    }
    let Some(version) = version else {
        return VapPlan::Skip(format!("{SKIP}: requested but no MutatingAdmissionPolicy API/informers are available."));
    };
    if spec.pointer("/evaluation/useServerSideApply").and_then(Value::as_bool) == Some(true) {
        return VapPlan::Skip(format!(
            "{SKIP}: useServerSideApply is enabled, which mutates atomic fields that a native MutatingAdmissionPolicy rejects."
        ));
    }
    if autogen {
        return VapPlan::Skip(format!("{SKIP}: pod controllers autogen is enabled."));
    }
    let name = policy.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let mut conditions = negated_exception_conditions(exceptions, name);
    conditions.extend(arr(spec.get("matchConditions")).iter().cloned());
    // Each element with only the fields an admission policy has.
    let picked = |list: Option<&Value>, keys: &[&str]| -> Vec<Value> {
        let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (*k, *k)).collect();
        arr(list)
            .iter()
            .map(|item| {
                let mut out = Map::new();
                copy(&mut out, item, &pairs);
                Value::Object(out)
            })
            .collect()
    };
    let rules = picked(
        spec.pointer("/matchConstraints/resourceRules"),
        &["resourceNames", "operations", "apiGroups", "apiVersions", "resources", "scope"],
    );
    let mutations = picked(spec.get("mutations"), &["patchType", "applyConfiguration", "jsonPatch"]);
    let mut out = Map::new();
    out.insert("matchConstraints".into(), json!({"resourceRules": rules}));
    if !conditions.is_empty() {
        out.insert("matchConditions".into(), Value::Array(conditions));
    }
    out.insert("mutations".into(), Value::Array(mutations));
    copy(&mut out, spec, &[("variables", "variables"), ("failurePolicy", "failurePolicy")]);
    let reinvocation = spec.get("reinvocationPolicy").and_then(Value::as_str).filter(|s| !s.is_empty());
    out.insert("reinvocationPolicy".into(), json!(reinvocation.unwrap_or("Never")));
    let map = format!("mpol-{name}");
    admission_objects(("MutatingAdmissionPolicy", version), &map, policy, out, json!({"policyName": map}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(_g: &str, _v: &str, kind: &str, _sub: &str) -> Vec<(String, String, String)> {
        let (g, p) = match kind {
            "Pod" => ("", "pods"),
            "Namespace" => ("", "namespaces"),
            "Deployment" => ("apps", "deployments"),
            "StatefulSet" => ("apps", "statefulsets"),
            _ => return vec![],
        };
        vec![(g.to_string(), "v1".to_string(), p.to_string())]
    }

    fn cpol(rule: Value) -> Value {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "no-host-path", "uid": "u-1"},
            "spec": {"validationFailureAction": "Enforce", "rules": [rule]}})
    }

    fn cel_rule(matching: Value) -> Value {
        json!({"name": "host-path", "match": matching, "validate": {"cel": {"generate": true,
            "expressions": [{"expression": "!has(object.spec.volumes)", "message": "no volumes"}]}}})
    }

    #[test]
    fn a_single_cel_rule_becomes_a_policy_and_a_binding() {
        let p = cpol(cel_rule(json!({"any": [{"resources": {"kinds": ["Deployment", "StatefulSet", "Pod"],
            "operations": ["CREATE", "UPDATE"], "namespaceSelector": {"matchLabels": {"t": "x"}}}}]})));
        let VapPlan::Generate { policy, binding } = plan_cluster_policy(&p, &[], &resolve).unwrap() else {
            panic!("not generated")
        };
        assert_eq!(policy["metadata"]["name"], "cpol-no-host-path");
        assert_eq!(policy["metadata"]["labels"]["app.kubernetes.io/managed-by"], "kyverno");
        assert_eq!(policy["metadata"]["ownerReferences"][0]["kind"], "ClusterPolicy");
        assert_eq!(
            policy["spec"]["matchConstraints"],
            json!({"namespaceSelector": {"matchLabels": {"t": "x"}}, "objectSelector": {}, "matchPolicy": "Equivalent", "resourceRules": [
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments", "statefulsets"], "scope": "*"},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods", "pods/ephemeralcontainers"], "scope": "*"}]})
        );
        assert_eq!(policy["spec"]["validations"][0]["message"], "no volumes");
        assert_eq!(binding["metadata"]["name"], "cpol-no-host-path-binding");
        assert_eq!(binding["spec"], json!({"policyName": "cpol-no-host-path", "validationActions": ["Deny"]}));
    }

    #[test]
    fn what_an_admission_policy_cannot_say_is_skipped_with_kyvernos_reason() {
        let plan = |rule: Value| plan_cluster_policy(&cpol(rule), &[], &resolve).unwrap();
        let mut no_generate = cel_rule(json!({"any": [{"resources": {"kinds": ["Pod"]}}]}));
        no_generate["validate"]["cel"]["generate"] = json!(false);
        assert_eq!(
            plan(no_generate),
            VapPlan::Skip(
                "skip generating ValidatingAdmissionPolicy: validate.cel.generate is not set to true.".into()
            )
        );
        let pattern = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": {"pattern": {"x": 1}}});
        assert_eq!(plan(pattern), VapPlan::Skip("skip generating ValidatingAdmissionPolicy for non CEL rules.".into()));
        let two_selectors = cel_rule(json!({"any": [
            {"resources": {"kinds": ["Pod"], "selector": {"matchLabels": {"a": "b"}}}},
            {"resources": {"kinds": ["Deployment"]}}]}));
        assert_eq!(
            plan(two_selectors),
            VapPlan::Skip("skip generating ValidatingAdmissionPolicy: NamespaceSelector / ObjectSelector across multiple resources in the match block are not applicable.".into())
        );
        let wildcard = cel_rule(json!({"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["team-*"]}}]}));
        assert_eq!(
            plan(wildcard),
            VapPlan::Skip(
                "skip generating ValidatingAdmissionPolicy: wildcards in namespace name is not applicable.".into()
            )
        );
        let mut roles = cel_rule(json!({"any": [{"resources": {"kinds": ["Pod"]}, "clusterRoles": ["admin"]}]}));
        roles["name"] = json!("host-path");
        assert!(matches!(plan(roles), VapPlan::Skip(m) if m.contains("Roles / ClusterRoles / Subjects")));
        let mut two = cpol(cel_rule(json!({"any": [{"resources": {"kinds": ["Pod"]}}]})));
        two["spec"]["rules"] = json!([two["spec"]["rules"][0], two["spec"]["rules"][0]]);
        assert_eq!(
            plan_cluster_policy(&two, &[], &resolve).unwrap(),
            VapPlan::Skip("skip generating ValidatingAdmissionPolicy: multiple rules are not applicable.".into())
        );
    }

    #[test]
    fn excludes_and_exceptions_become_exclude_rules() {
        let mut rule = cel_rule(json!({"any": [{"resources": {"kinds": ["Deployment"], "operations": ["CREATE"]}}]}));
        rule["exclude"] = json!({"any": [{"resources": {"namespaces": ["kube-system"]}}]});
        let p = cpol(rule);
        let exception = json!({"apiVersion": "kyverno.io/v2", "kind": "PolicyException", "metadata": {"name": "e"},
            "spec": {"exceptions": [{"policyName": "no-host-path", "ruleNames": ["host-path"]}],
                "match": {"any": [{"resources": {"kinds": ["Deployment"], "names": ["tool"], "operations": ["CREATE"]}}]}}});
        let VapPlan::Generate { policy, .. } = plan_cluster_policy(&p, &[exception], &resolve).unwrap() else {
            panic!("not generated")
        };
        assert_eq!(
            policy["spec"]["matchConstraints"]["excludeResourceRules"],
            json!([
                {"resourceNames": ["kube-system"], "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "CONNECT", "DELETE"], "resources": ["namespaces"], "scope": "*"},
                {"resourceNames": ["tool"], "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"], "scope": "*"}])
        );
        let with_conditions = json!({"spec": {"exceptions": [{"policyName": "no-host-path", "ruleNames": ["host-path"]}],
            "conditions": {"any": []}, "match": {"any": []}}});
        assert_eq!(
            plan_cluster_policy(&p, &[with_conditions], &resolve).unwrap(),
            VapPlan::Skip(
                "skip generating ValidatingAdmissionPolicy: Conditions in PolicyException is not applicable.".into()
            )
        );
    }

    #[test]
    fn an_unknown_kind_is_an_error_to_retry() {
        let p = cpol(cel_rule(json!({"any": [{"resources": {"kinds": ["Widget"]}}]})));
        assert_eq!(plan_cluster_policy(&p, &[], &resolve), Err("no unique match for kind Widget".into()));
    }

    #[test]
    fn a_validating_policy_with_generation_enabled_and_its_exceptions() {
        let vpol = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "ValidatingPolicy",
            "metadata": {"name": "labels", "uid": "u-2"},
            "spec": {"autogen": {"validatingAdmissionPolicy": {"enabled": true}},
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}]},
                "validations": [{"expression": "object.spec.template.spec.containers.all(c, c.image in exceptions.allowedImages)"}]}});
        let exception = json!({"spec": {"policyRefs": [{"name": "labels", "kind": "ValidatingPolicy"}],
            "matchConditions": [{"name": "skip-test", "expression": "object.metadata.name == 'test'"}], "images": ["nginx"]}});
        let VapPlan::Generate { policy, binding } = plan_validating_policy(&vpol, &[exception], false) else {
            panic!("not generated")
        };
        assert_eq!(policy["metadata"]["name"], "vpol-labels");
        assert_eq!(
            policy["spec"]["matchConditions"],
            json!([{"name": "skip-test", "expression": "!(object.metadata.name == 'test')"}])
        );
        assert_eq!(policy["spec"]["variables"], json!([{"name": "allowedImages", "expression": "['nginx']"}]));
        assert!(policy["spec"]["validations"][0]["expression"].as_str().unwrap().contains("variables.allowedImages"));
        assert_eq!(binding["spec"], json!({"policyName": "vpol-labels", "validationActions": ["Deny"]}));
        assert_eq!(
            plan_validating_policy(&vpol, &[], true),
            VapPlan::Skip("skip generating ValidatingAdmissionPolicy: pod controllers autogen is enabled.".into())
        );
        let mut off = vpol.clone();
        off["spec"]["autogen"] = json!({});
        assert_eq!(
            plan_validating_policy(&off, &[], false),
            VapPlan::Skip("skip generating ValidatingAdmissionPolicy: not enabled.".into())
        );
    }

    #[test]
    fn a_mutating_policy_with_generation_enabled_becomes_a_mutating_admission_policy() {
        let mpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "MutatingPolicy",
            "metadata": {"name": "add-label", "uid": "u-1", "labels": {"reports.kyverno.io/disabled": ""}},
            "spec": {"autogen": {"mutatingAdmissionPolicy": {"enabled": true}},
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["deployments"]}]},
                "matchConditions": [{"name": "dev", "expression": "request.namespace == 'dev'"}],
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": "[]"}}]}});
        let exception = json!({"spec": {"policyRefs": [{"name": "add-label", "kind": "MutatingPolicy"}],
            "matchConditions": [{"name": "skip", "expression": "object.metadata.name == 'x'"}]}});
        let other = json!({"spec": {"policyRefs": [{"name": "another"}],
            "matchConditions": [{"name": "no", "expression": "true"}]}});
        let VapPlan::Generate { policy, binding } =
            plan_mutating_policy(&mpol, &[exception, other], false, Some("v1beta1"))
        else {
            panic!("not generated")
        };
        assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1beta1");
        assert_eq!(policy["kind"], "MutatingAdmissionPolicy");
        assert_eq!(policy["metadata"]["name"], "mpol-add-label");
        assert_eq!(policy["metadata"]["labels"]["reports.kyverno.io/disabled"], "true");
        assert_eq!(policy["metadata"]["ownerReferences"][0]["kind"], "MutatingPolicy");
        assert_eq!(
            policy["spec"]["matchConditions"],
            json!([{"name": "skip", "expression": "!(object.metadata.name == 'x')"},
                {"name": "dev", "expression": "request.namespace == 'dev'"}])
        );
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(policy["spec"]["reinvocationPolicy"], "Never");
        assert_eq!(policy["spec"]["matchConstraints"]["matchPolicy"], "Equivalent");
        assert_eq!(policy["spec"]["mutations"][0]["patchType"], "JSONPatch");
        assert_eq!(binding["kind"], "MutatingAdmissionPolicyBinding");
        assert_eq!(binding["metadata"]["name"], "mpol-add-label-binding");
        assert_eq!(binding["spec"], json!({"policyName": "mpol-add-label"}));
        let skip = |p: &Value, autogen: bool, v: Option<&str>| match plan_mutating_policy(p, &[], autogen, v) {
            VapPlan::Skip(why) => why,
            VapPlan::Generate { .. } => "generated".into(),
        };
        assert_eq!(
            skip(&mpol, true, Some("v1")),
            "skip generating MutatingAdmissionPolicy: pod controllers autogen is enabled."
        );
        assert!(skip(&mpol, false, None).contains("no MutatingAdmissionPolicy API"));
        let mut ssa = mpol.clone();
        ssa["spec"]["evaluation"] = json!({"useServerSideApply": true});
        assert!(skip(&ssa, false, Some("v1")).contains("useServerSideApply is enabled"));
        let mut off = mpol.clone();
        off["spec"]["autogen"] = json!({});
        assert_eq!(skip(&off, false, None), "skip generating MutatingAdmissionPolicy: not enabled.");
    }
}
