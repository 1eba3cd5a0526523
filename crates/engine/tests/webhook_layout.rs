//! Kyverno's names: with `kyvernoNames` the resource webhook configurations hold the
//! entries Kyverno's webhook controller would write for the same policies — only entries with
//! rules, rules from each rule's kinds and operations, one entry per policy with its own
//! conditions. These fixtures are Verno's own; the expectations follow Kyverno 1.19's
//! controller (`pkg/controllers/webhook`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use verno_engine::webhookgen::{Layout, Settings, layout};
use verno_engine::{Compiled, CompiledPolicy, compile};

fn settings() -> Settings {
    Settings {
        namespace_selector: Some(json!({"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kyverno"]}]})),
        object_selector: None,
        match_conditions: Vec::new(),
        timeout: 10,
        admission_reports: true,
        force_ignore: false,
    }
}

fn policies(docs: &[Value]) -> Vec<CompiledPolicy> {
    docs.iter()
        .map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => p,
            other => panic!("does not compile: {:?}", other.err()),
        })
        .collect()
}

fn plan(docs: &[Value], s: &Settings) -> Layout {
    let ps = policies(docs);
    layout(ps.iter(), s)
}

fn cpol(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name, "annotations": {"pod-policies.kyverno.io/autogen-controllers": "none"}},
        "spec": {"rules": rules}})
}

fn audit_rule(name: &str, resources: Value) -> Value {
    json!({"name": name, "match": {"any": [{"resources": resources}]},
        "validate": {"failureAction": "Audit", "message": "team label", "pattern": {"metadata": {"labels": {"team": "?*"}}}}})
}

fn rule(groups: &[&str], versions: &[&str], ops: &[&str], resources: &[&str], scope: &str) -> Value {
    json!({"apiGroups": groups, "apiVersions": versions, "operations": ops, "resources": resources, "scope": scope})
}

#[test]
fn an_audit_policy_on_pods_is_one_fail_entry_with_every_operation() {
    let l = plan(&[cpol("labels", json!([audit_rule("team", json!({"kinds": ["Pod"]}))]))], &settings());
    assert!(l.mutating.is_empty(), "{:?}", l.mutating);
    assert_eq!(l.validating.len(), 1);
    let e = &l.validating[0];
    assert_eq!((e.name.as_str(), e.path.as_str(), e.ignore), ("validate.kyverno.svc-fail", "/validate/fail", false));
    assert_eq!(
        e.rules,
        vec![rule(
            &[""],
            &["v1"],
            &["CONNECT", "CREATE", "DELETE", "UPDATE"],
            &["pods", "pods/ephemeralcontainers"],
            "Namespaced"
        )]
    );
    assert_eq!(e.namespace_selector, settings().namespace_selector.unwrap());
    assert_eq!(e.object_selector, json!({}));
    assert_eq!(e.timeout, 10);
}

#[test]
fn an_exclude_naming_only_operations_removes_them_and_groups_sort_shorter_first() {
    let mut r = audit_rule("cm", json!({"kinds": ["ConfigMap"]}));
    r["exclude"] = json!({"any": [{"resources": {"operations": ["DELETE"]}}]});
    let scale = audit_rule("scale", json!({"kinds": ["*/scale"], "operations": ["CREATE"]}));
    let l = plan(&[cpol("a", json!([r])), cpol("b", json!([scale]))], &settings());
    assert_eq!(
        l.validating[0].rules,
        vec![
            rule(&[""], &["v1"], &["CONNECT", "CREATE", "UPDATE"], &["configmaps"], "Namespaced"),
            rule(&["*"], &["*"], &["CREATE"], &["*/scale"], "*"),
        ]
    );
}

#[test]
fn wildcards_take_the_policy_scope_and_cluster_kinds_are_any_scope() {
    let l = plan(&[cpol("all", json!([audit_rule("any", json!({"kinds": ["*"]}))]))], &settings());
    assert_eq!(
        l.validating[0].rules,
        vec![rule(&["*"], &["*"], &["CONNECT", "CREATE", "DELETE", "UPDATE"], &["*", "pods/ephemeralcontainers"], "*")]
    );
    let l = plan(
        &[cpol("crd", json!([audit_rule("x", json!({"kinds": ["ConfigMap", "CustomResourceDefinition"]}))]))],
        &settings(),
    );
    let scopes: Vec<&str> = l.validating[0].rules.iter().map(|r| r["scope"].as_str().unwrap()).collect();
    assert_eq!(scopes, ["Namespaced", "*"]);
    let mut ns = cpol("ns", json!([audit_rule("any", json!({"kinds": ["*"]}))]));
    ns["kind"] = json!("Policy");
    ns["metadata"]["namespace"] = json!("team");
    let l = plan(&[ns], &settings());
    assert_eq!(l.validating[0].rules[0]["scope"], "Namespaced");
}

#[test]
fn mutate_rules_go_to_the_mutating_configuration_with_their_subresource() {
    let m = json!([{"name": "shell", "match": {"any": [{"resources": {"kinds": ["Pod/exec"], "operations": ["CONNECT"]}}]},
        "mutate": {"patchesJson6902": "- op: replace\n  path: /command/0\n  value: bash"}}]);
    let l = plan(&[cpol("exec", m)], &settings());
    assert!(l.validating.is_empty());
    let e = &l.mutating[0];
    assert_eq!((e.name.as_str(), e.reinvocation), ("mutate.kyverno.svc-fail", Some("IfNeeded")));
    assert_eq!(e.rules, vec![rule(&[""], &["v1"], &["CONNECT"], &["pods/exec"], "Namespaced")]);
    let all = plan(&[cpol("subs", json!([audit_rule("x", json!({"kinds": ["Pod/*"]}))]))], &settings());
    let res = all.validating[0].rules[0]["resources"].as_array().unwrap().clone();
    for sub in ["pods/exec", "pods/log", "pods/eviction", "pods/ephemeralcontainers", "pods/status"] {
        assert!(res.contains(&json!(sub)), "{sub} missing from {res:?}");
    }
    assert!(!res.contains(&json!("pods")), "Pod/* is the subresources only: {res:?}");
}

#[test]
fn a_policy_with_its_own_match_conditions_gets_its_own_entry() {
    let mut p = cpol("images", json!([audit_rule("tag", json!({"kinds": ["Pod"]}))]));
    p["spec"]["failurePolicy"] = json!("Ignore");
    let conditions = json!([{"name": "not-nodes", "expression": "!('system:nodes' in request.userInfo.groups)"}]);
    p["spec"]["webhookConfiguration"] = json!({"matchConditions": conditions});
    let l = plan(&[p, cpol("other", json!([audit_rule("t", json!({"kinds": ["Secret"]}))]))], &settings());
    let names: Vec<&str> = l.validating.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["validate.kyverno.svc-fail", "validate.kyverno.svc-ignore-finegrained-images"]);
    let fine = &l.validating[1];
    assert_eq!(fine.path, "/validate/ignore/finegrained/images");
    assert!(fine.ignore);
    assert_eq!(Value::Array(fine.match_conditions.clone()), conditions);
    // Forced fail-open (break-glass, forceFailurePolicyIgnore): every entry.
    let mut s = settings();
    s.force_ignore = true;
    let l = plan(&[cpol("other", json!([audit_rule("t", json!({"kinds": ["Secret"]}))]))], &s);
    assert_eq!(l.validating[0].name, "validate.kyverno.svc-ignore");
}

fn vpol(name: &str, extra: Value) -> Value {
    let mut d = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": name},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]},
            "validations": [{"expression": "true", "message": "ok"}]}});
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            d["spec"][k] = v.clone();
        }
    }
    d
}

#[test]
fn cel_policies_share_an_entry_named_after_them_unless_they_need_their_own() {
    let prod = json!([{"name": "prod", "expression": "object.metadata.labels['env'] == 'prod'"}]);
    let l =
        plan(&[vpol("b", json!({})), vpol("a", json!({})), vpol("c", json!({"matchConditions": prod}))], &settings());
    let names: Vec<&str> = l.validating.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["vpol.validate.kyverno.svc-fail", "vpol.validate.kyverno.svc-fail-finegrained-c"]);
    assert_eq!(l.validating[0].path, "/vpol/a/b");
    // Autogen adds the Pod controllers to both, and rewrites the conditions for them.
    let fine = &l.validating[1];
    assert_eq!(fine.path, "/vpol/c");
    assert_eq!(fine.rules.len(), 4, "{:?}", fine.rules);
    let conds: Vec<(&str, &str)> = fine
        .match_conditions
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["expression"].as_str().unwrap()))
        .collect();
    assert_eq!(
        conds[0],
        (
            "autogen-prod",
            "!((object.apiVersion == 'v1' && object.kind =='Pod')) || (object.metadata.labels['env'] == 'prod')"
        )
    );
    assert_eq!(conds[1].0, "autogen-cronjobs-prod");
    assert!(conds[1].1.contains("object.spec.jobTemplate.spec.template.metadata.labels['env']"), "{}", conds[1].1);
    assert_eq!(conds[2].0, "autogen-defaults-prod");
    assert!(
        conds[2].1.starts_with("!((object.apiVersion == 'apps/v1' && object.kind =='DaemonSet') || (object.apiVersion == 'apps/v1' && object.kind =='Deployment')"),
        "{}",
        conds[2].1
    );
}

#[test]
fn conditions_the_api_server_cannot_compile_stay_with_verno() {
    // `variables` and Kyverno's libraries are not bound for a webhook's matchConditions: the
    // API server would refuse them (or fail every call), so the policy shares the common entry.
    for expr in ["variables.env == 'prod'", "json.unmarshal('{}') == {}", "exceptions.allowedImages.size() > 0"] {
        let c = json!([{"name": "c", "expression": expr}]);
        let l = plan(&[vpol("v", json!({"matchConditions": c}))], &settings());
        assert_eq!(l.validating[0].name, "vpol.validate.kyverno.svc-fail", "{expr}");
        assert!(l.validating[0].match_conditions.is_empty(), "{expr}");
    }
    let ok = json!([{"name": "c", "expression": "object.spec.containers.all(c, c.image != '') && request.operation == 'CREATE'"}]);
    let l = plan(&[vpol("v", json!({"matchConditions": ok}))], &settings());
    assert_eq!(l.validating[0].name, "vpol.validate.kyverno.svc-fail-finegrained-v");
}

#[test]
fn generating_policies_are_fail_open_on_every_operation() {
    let g = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "GeneratingPolicy", "metadata": {"name": "zk"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["namespaces"]}]},
            "variables": [{"name": "cm", "expression": "[{'kind': 'ConfigMap', 'apiVersion': 'v1', 'metadata': {'name': 'x', 'namespace': object.metadata.name}}]"}],
            "generate": [{"expression": "generator.Apply(object.metadata.name, variables.cm)"}]}});
    let l = plan(&[g], &settings());
    let e = &l.validating[0];
    assert_eq!((e.name.as_str(), e.path.as_str(), e.ignore), ("gpol.validate.kyverno.svc-ignore", "/gpol/zk", true));
    assert_eq!(e.rules, vec![rule(&[""], &["v1"], &["CONNECT", "CREATE", "DELETE", "UPDATE"], &["namespaces"], "*")]);
}

#[test]
fn a_namespaced_policy_is_pinned_to_its_namespace() {
    let mut d = vpol("team", json!({}));
    d["kind"] = json!("NamespacedValidatingPolicy");
    d["metadata"]["namespace"] = json!("team-a");
    let l = plan(&[d], &settings());
    let e = &l.validating[0];
    assert_eq!(e.name, "nvpol.validate.kyverno.svc-fail");
    assert_eq!(
        e.namespace_selector["matchExpressions"][0],
        json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]})
    );
    assert_eq!(e.namespace_selector["matchExpressions"].as_array().unwrap().len(), 3);
}
