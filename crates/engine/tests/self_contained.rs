//! Which policy sets the server may evaluate on its executor: only those whose
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
    // Background and CLI routes are not the server's question.
    assert!(!set(&[pattern]).self_contained(&Route::All));
}

fn cel_route(hook: Hook, image: bool) -> Route {
    Route::Cel { hook, namespaced: false, names: Vec::new(), filter: Filter::All, image }
}

fn vpol(name: &str, spec: Value) -> Value {
    let mut s = json!({"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
        "operations": ["CREATE"], "resources": ["pods"]}]},
        "validations": [{"expression": "object.spec.containers.all(c, c.image != 'bad')"}]});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": name}, "spec": s})
}

fn mpol(name: &str, spec: Value) -> Value {
    let mut s = json!({"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
        "operations": ["CREATE"], "resources": ["pods"]}]},
        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
            "Object{metadata: Object.metadata{labels: Object.metadata.labels{seen: 'yes'}}}"}}]});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({"apiVersion": "policies.kyverno.io/v1", "kind": "MutatingPolicy", "metadata": {"name": name}, "spec": s})
}

#[test]
fn cel_policies_without_parameters_or_host_libraries_are_self_contained() {
    let validate = cel_route(Hook::Validate, false);
    let mutate = cel_route(Hook::Mutate, false);
    let plain = vpol(
        "plain",
        json!({"variables": [{"name": "images", "expression": "object.spec.containers.map(c, c.image)"}],
            "matchConditions": [{"name": "named", "expression": "has(object.metadata.name)"}],
            "validations": [{"expression": "variables.images.all(i, i != 'bad')",
                "messageExpression": "'bad image in ' + namespaceObject.metadata.name"}]}),
    );
    assert!(set(std::slice::from_ref(&plain)).self_contained(&validate));
    assert!(set(&[mpol("m", json!({}))]).self_contained(&mutate));
    // Each family is judged on its own policies.
    assert!(
        set(&[plain.clone(), mpol("m", json!({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}))])
            .self_contained(&validate)
    );
    // Image verification reaches registries: never.
    assert!(!set(std::slice::from_ref(&plain)).self_contained(&cel_route(Hook::Validate, true)));
    // Anything that reads the world, wherever the expression sits.
    let world = [
        json!({"variables": [{"name": "cm", "expression": "resource.Get('v1', 'configmaps', 'default', 'x')"}]}),
        json!({"validations": [{"expression": "true", "messageExpression": "string(http.Get('https://x'))"}]}),
        json!({"matchConditions": [{"name": "g", "expression": "globalContext.Get('e', '') != null"}]}),
        json!({"validations": [{"expression": "authorizer.group('').resource('pods').check('get').allowed()"}]}),
        json!({"validations": [{"expression": "image.GetMetadata('nginx') != null"}]}),
        json!({"auditAnnotations": [{"key": "k", "valueExpression": "string(time.now())"}]}),
        json!({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}),
    ];
    for spec in world {
        assert!(!set(&[plain.clone(), vpol("reads", spec.clone())]).self_contained(&validate), "{spec}");
    }
    // A MutatingPolicy that patches existing objects lists them from the cluster.
    let existing = mpol(
        "existing",
        json!({"evaluation": {"mutateExisting": {"enabled": true}},
            "targetMatchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["configmaps"]}]}}),
    );
    assert!(!set(&[existing]).self_contained(&mutate));
    // A CEL PolicyException's conditions run with the policies it exempts.
    let exception = |expression: &str| match compile(
        &json!({"apiVersion": "policies.kyverno.io/v1", "kind": "PolicyException", "metadata": {"name": "e", "namespace": "default"},
                "spec": {"policyRefs": [{"name": "plain", "kind": "ValidatingPolicy"}],
                    "matchConditions": [{"name": "c", "expression": expression}]}}),
        &[],
    ) {
        Ok(Compiled::Exception(e)) => e,
        other => panic!("the exception does not compile: {:?}", other.err()),
    };
    let with = |e| {
        let Ok(Compiled::Policy(p)) = compile(&plain, &[]) else { panic!("plain compiles") };
        PolicySet::new(vec![Arc::new(p)], vec![e])
    };
    assert!(with(exception("object.metadata.name == 'x'")).self_contained(&validate));
    assert!(!with(exception("resource.Get('v1', 'namespaces', '', 'x') != null")).self_contained(&validate));
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
        // CEL that reads parameter resources, the authorizer or a library reading the cluster.
        json!({"validate": {"cel": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "expressions": [{"expression": "params.data.x == 'y'"}]}}}),
        json!({"validate": {"cel": {"expressions": [{"expression": "authorizer.group('').resource('pods').check('get').allowed()"}]}}}),
        json!({"celPreconditions": [{"name": "p", "expression": "resource.List('v1', 'pods', '') != null"}],
            "validate": {"cel": {"expressions": [{"expression": "true"}]}}}),
    ];
    for rule in reads {
        let s = set(&[pattern.clone(), cpol("reads", rule.clone())]);
        assert!(!s.self_contained(&KYVERNO), "{rule}");
    }
    // The policy's webhook matchConditions are CEL too.
    let mut conditioned = pattern.clone();
    conditioned["spec"]["webhookConfiguration"] =
        json!({"matchConditions": [{"name": "m", "expression": "http.Get('https://x') != null"}]});
    assert!(!set(&[pattern, conditioned]).self_contained(&KYVERNO));
}

#[test]
fn cel_in_cluster_policies_reading_only_the_request_is_self_contained() {
    let plain = [
        json!({"validate": {"cel": {"expressions": [{"expression": "namespaceObject.metadata.name != 'x'"}]}}}),
        json!({"celPreconditions": [{"name": "p", "expression": "object.metadata.name != 'y'"}],
            "validate": {"cel": {"variables": [{"name": "n", "expression": "object.metadata.name"}],
                "expressions": [{"expression": "variables.n != 'x'", "messageExpression": "'name ' + variables.n"}]}}}),
    ];
    for rule in plain {
        assert!(set(&[cpol("cel", rule.clone())]).self_contained(&KYVERNO), "{rule}");
    }
    let mut conditioned = cpol("p", json!({"validate": {"pattern": {"spec": {"=(hostNetwork)": false}}}}));
    conditioned["spec"]["webhookConfiguration"] =
        json!({"matchConditions": [{"name": "m", "expression": "object.metadata.name != 'x'"}]});
    assert!(set(&[conditioned]).self_contained(&KYVERNO));
}
