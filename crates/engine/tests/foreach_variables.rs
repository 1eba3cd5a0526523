//! Foreach variables: `element`, `elementIndex` and the numbered forms of nested loops
//! (`element0`, `elementIndex1`, …), which are only set for rules that name them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, Filter, Hook, NoData, Observer, PolicySet, Request, Route, Scope, compile};

struct Quiet;
impl Observer for Quiet {}

fn blocked(rule: Value, pod: &Value) -> Vec<String> {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "r",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": rule}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("does not compile") };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let req = Request::new(verno_engine::Operation::Create, pod);
    let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All));
    let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &NoData, &mut Quiet);
    out.blocked.values().flat_map(|m| m.values().cloned()).collect()
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "d"},
        "spec": {"containers": [
            {"name": "a", "ports": [{"containerPort": 80}]},
            {"name": "b", "ports": [{"containerPort": 8080}, {"containerPort": 9090}]}]}})
}

#[test]
fn a_nested_loop_reads_the_outer_element_by_its_number() {
    // The inner deny names the outer container through `element0` and its position through
    // `elementIndex0`, the port through `element1`.
    let rule = json!({"message": "{{ element0.name }}", "foreach": [{"list": "request.object.spec.containers",
        "foreach": [{"list": "element.ports", "deny": {"conditions": {"all": [
            {"key": "{{ element0.name }}", "operator": "Equals", "value": "b"},
            {"key": "{{ elementIndex0 }}", "operator": "Equals", "value": 1},
            {"key": "{{ element1.containerPort }}", "operator": "Equals", "value": 9090}]}}}]}]});
    let b = blocked(rule, &pod());
    assert_eq!(b.len(), 1, "{b:?}");
    assert!(b[0].contains("validation failure: b"), "{b:?}");
}

#[test]
fn a_loop_that_names_no_number_reads_element() {
    let rule = json!({"message": "port {{ element.containerPort }}", "foreach": [{"list": "request.object.spec.containers[].ports[]",
        "deny": {"conditions": {"any": [{"key": "{{ element.containerPort }}", "operator": "GreaterThan", "value": 9000}]}}}]});
    let b = blocked(rule, &pod());
    assert_eq!(b.len(), 1, "{b:?}");
    assert!(b[0].contains("port 9090"), "{b:?}");
    // `element0` is not set for such a rule: a message that does not name it sees nothing else.
    let quiet = json!({"foreach": [{"list": "request.object.spec.containers",
        "deny": {"conditions": {"any": [{"key": "{{ element.name }}", "operator": "Equals", "value": "z"}]}}}]});
    assert!(blocked(quiet, &pod()).is_empty());
}
