//! A ClusterPolicy without rules is valid, as Kyverno's schema and policy validation admit it
//! (before, Verno refused it with "a policy needs at least one rule", so a GitOps sync that
//! Kyverno accepts failed); it does nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::json;
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

#[test]
fn a_policy_without_rules_compiles_and_admits_everything() {
    for rules in [json!([]), serde_json::Value::Null] {
        let mut doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "placeholder"},
            "spec": {"validationFailureAction": "Enforce"}});
        if !rules.is_null() {
            doc["spec"]["rules"] = rules;
        }
        let p = match compile(&doc, &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            other => panic!("a policy without rules must compile: {:?}", other.err()),
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
        let set = PolicySet::new(vec![p], Vec::new());
        let outcome = set.evaluate(
            &Request::new(verno_engine::Operation::Create, &pod),
            Scope::ALL,
            &verno_jmespath::NoEnv,
            &verno_engine::NoData,
            &mut (),
        );
        assert!(outcome.allowed());
    }
}
