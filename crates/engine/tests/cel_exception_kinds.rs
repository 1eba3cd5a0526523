//! A CEL PolicyException names policies by name and kind, and Kyverno lists a policy's
//! exceptions by both (before, Verno matched the name alone, so an exception written for a
//! MutatingPolicy also waived a ValidatingPolicy of the same name).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::json;
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

fn allowed(exception_kind: &str) -> bool {
    let policy = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "no-pods"},
        "spec": {"validationActions": ["Deny"],
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "validations": [{"expression": "false", "message": "no pods"}]}});
    let exception = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "PolicyException", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"policyRefs": [{"name": "no-pods", "kind": exception_kind}],
            "matchConditions": [{"name": "web", "expression": "object.metadata.name == 'web'"}]}});
    let Ok(Compiled::Policy(p)) = compile(&policy, &[]) else { panic!("policy") };
    let Ok(Compiled::Exception(e)) = compile(&exception, &[]) else { panic!("exception") };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    PolicySet::new(vec![Arc::new(p)], vec![e])
        .evaluate(
            &Request::new(verno_engine::Operation::Create, &pod),
            Scope::ALL,
            &verno_jmespath::NoEnv,
            &verno_engine::NoData,
            &mut (),
        )
        .allowed()
}

#[test]
fn an_exception_waives_only_a_policy_of_the_kind_it_names() {
    assert!(allowed("ValidatingPolicy"));
    assert!(!allowed("MutatingPolicy"));
    assert!(!allowed("NamespacedValidatingPolicy"));
}
