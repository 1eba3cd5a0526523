//! Which policy sets the server may evaluate on its executor (issue 21): only those whose
//! evaluation does no I/O through the data port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, Filter, Hook, PolicySet, Route, compile};

fn set(docs: &[Value]) -> PolicySet {
    let policies = docs
        .iter()
        .map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            other => panic!("{d} does not compile to a policy: {:?}", other.err()),
        })
        .collect();
    PolicySet::new(policies, Vec::new())
}

fn cpol(name: &str, rule: Value) -> Value {
    let mut r = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}});
    if let (Some(r), Some(extra)) = (r.as_object_mut(), rule.as_object()) {
        r.extend(extra.clone());
    }
    json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
        "spec": {"validationFailureAction": "Enforce", "rules": [r]}})
}

const KYVERNO: Route = Route::Kyverno(Hook::Validate, Filter::All);

#[test]
fn patterns_conditions_and_variables_are_self_contained() {
    let pattern = cpol("p", json!({"validate": {"pattern": {"spec": {"=(hostNetwork)": false}}}}));
    let variables = cpol(
        "v",
        json!({"context": [{"name": "n", "variable": {"jmesPath": "request.object.metadata.name"}}],
            "validate": {"foreach": [{"list": "request.object.spec.containers",
                "context": [{"name": "img", "variable": {"value": "{{ element.image }}"}}],
                "deny": {"conditions": {"any": [{"key": "{{ img }}", "operator": "Equals", "value": "bad"}]}}}]}}),
    );
    assert!(set(&[]).self_contained(&KYVERNO), "an empty set");
    assert!(set(&[pattern.clone(), variables]).self_contained(&KYVERNO));
    // The CEL policy routes never are (their libraries may read the cluster).
    let cel =
        Route::Cel { hook: Hook::Validate, namespaced: false, names: Vec::new(), filter: Filter::All, image: false };
    assert!(!set(&[pattern]).self_contained(&cel));
}

#[test]
fn reading_the_cluster_verifying_images_or_generating_is_not() {
    let pattern = cpol("p", json!({"validate": {"pattern": {"spec": {"=(hostNetwork)": false}}}}));
    let reads = [
        json!({"context": [{"name": "cm", "configMap": {"name": "c", "namespace": "n"}}],
            "validate": {"deny": {"conditions": {"any": [{"key": "{{ cm.data.x }}", "operator": "Equals", "value": "y"}]}}}}),
        // Deep in a foreach: still found.
        json!({"validate": {"foreach": [{"list": "request.object.spec.containers",
            "context": [{"name": "n", "apiCall": {"urlPath": "/api/v1/namespaces"}}],
            "deny": {"conditions": {"any": [{"key": "{{ n }}", "operator": "Equals", "value": "x"}]}}}]}}),
        json!({"context": [{"name": "g", "globalReference": {"name": "x"}}],
            "validate": {"deny": {"conditions": {"any": [{"key": "{{ g }}", "operator": "Equals", "value": "y"}]}}}}),
        json!({"context": [{"name": "i", "imageRegistry": {"reference": "nginx"}}],
            "validate": {"deny": {"conditions": {"any": [{"key": "{{ i }}", "operator": "Equals", "value": "y"}]}}}}),
        json!({"verifyImages": [{"imageReferences": ["*"], "attestors": [{"entries": [{"keys": {"publicKeys": "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE8nXRh950IZbRj8Ra/N9sbqOPZrfM\n5/KAQN0/KjHcorm/J5yQtVgOr5BnHa6sEH0o4ZkzCm4jwrwJBGhcuKqYaQ==\n-----END PUBLIC KEY-----"}}]}]}]}),
        json!({"generate": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "namespace": "default", "data": {"data": {"a": "b"}}}}),
        // CEL may read namespaceObject, parameter resources or the authorizer.
        json!({"validate": {"cel": {"expressions": [{"expression": "namespaceObject.metadata.name != 'x'"}]}}}),
        json!({"celPreconditions": [{"name": "p", "expression": "true"}],
            "validate": {"cel": {"expressions": [{"expression": "true"}]}}}),
    ];
    for rule in reads {
        let s = set(&[pattern.clone(), cpol("reads", rule.clone())]);
        assert!(!s.self_contained(&KYVERNO), "{rule}");
    }
    // The policy's webhook matchConditions are CEL too.
    let mut conditioned = pattern.clone();
    conditioned["spec"]["webhookConfiguration"] =
        json!({"matchConditions": [{"name": "m", "expression": "object.metadata.name != 'x'"}]});
    assert!(!set(&[pattern, conditioned]).self_contained(&KYVERNO));
}
