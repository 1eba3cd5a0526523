//! No false denials: a ValidatingPolicy's checks are rewritten for Pod controllers
//! only where Kyverno's `CanAutoGen` allows it — the policy matches bare Pods and nothing else.
//! A policy that also names `pods/ephemeralcontainers`, a second resource rule, a wildcard
//! group or an object selector is not applied to Deployments: Kyverno never checks them, so a
//! Deployment denied there would be an outage Kyverno does not have.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

fn policy(constraints: Value) -> PolicySet {
    let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "no-latest"},
        "spec": {"validationActions": ["Deny"], "matchConstraints": constraints,
            "validations": [{"expression": "object.spec.containers.all(c, !c.image.endsWith(':latest'))",
                "message": "no latest tags"}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    PolicySet::new(vec![p], Vec::new())
}

fn deployment_allowed(set: &PolicySet) -> bool {
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "team"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}}}});
    set.evaluate(
        &Request::new(verno_engine::Operation::Create, &deploy),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    )
    .allowed()
}

fn rule(resources: Value) -> Value {
    json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": resources})
}

#[test]
fn a_policy_on_bare_pods_is_applied_to_their_controllers() {
    let set = policy(json!({"resourceRules": [rule(json!(["pods"]))]}));
    assert!(!deployment_allowed(&set), "the autogen rule must check the Deployment's template");
}

#[test]
fn a_policy_on_more_than_bare_pods_is_not_applied_to_controllers() {
    for constraints in [
        json!({"resourceRules": [rule(json!(["pods", "pods/ephemeralcontainers"]))]}),
        json!({"resourceRules": [rule(json!(["pods"])), rule(json!(["configmaps"]))]}),
        json!({"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]}),
        json!({"resourceRules": [rule(json!(["pods"]))], "objectSelector": {"matchLabels": {"app": "web"}}}),
        json!({"resourceRules": [rule(json!(["pods"]))],
            "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "resourceNames": ["x"]}]}),
    ] {
        let set = policy(constraints.clone());
        assert!(
            deployment_allowed(&set),
            "a Deployment was checked by a policy Kyverno does not autogen: {constraints}"
        );
    }
}
