//! No false denials: a CEL policy's matchConditions are evaluated as Kubernetes
//! evaluates them — a condition that is false decides whatever failed before it, and only when
//! none is false does an error count (a refusal under failurePolicy Fail).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::json;
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

fn allowed(conditions: serde_json::Value, namespace: &str) -> bool {
    let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "vp"},
        "spec": {"validationActions": ["Deny"], "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": conditions,
            "validations": [{"expression": "false", "message": "no pods here"}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let set = PolicySet::new(vec![p], Vec::new());
    set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    )
    .allowed()
}

#[test]
fn a_false_condition_wins_over_one_that_failed_before_it() {
    let conditions = json!([
        {"name": "tier", "expression": "object.metadata.labels['tier'] == 'web'"},
        {"name": "prod", "expression": "object.metadata.namespace == 'prod'"},
    ]);
    // No labels at all: the first condition fails; the second is false: no match.
    assert!(allowed(conditions.clone(), "dev"));
    // In prod the error stands: failurePolicy Fail refuses.
    assert!(!allowed(conditions, "prod"));
}
