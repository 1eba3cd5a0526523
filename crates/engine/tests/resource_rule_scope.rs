//! No false denials: a CEL policy's `resourceRules[].scope` limits it to namespaced or to
//! cluster-scoped objects, as the API server's matcher does (before, the scope was read and
//! ignored, so a policy written for namespaced objects judged cluster-scoped ones too).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

/// Whether `object` is admitted by a policy denying every `resource` of `scope`.
fn allowed(scope: &str, resource: &str, object: &Value) -> bool {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), object["apiVersion"].as_str().unwrap().to_string()),
    };
    let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "vp"},
        "spec": {"validationActions": ["Deny"],
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": [version],
                "operations": ["CREATE"], "resources": [resource], "scope": scope}]},
            "validations": [{"expression": "false", "message": "denied"}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    PolicySet::new(vec![p], Vec::new())
        .evaluate(
            &Request::new(verno_engine::Operation::Create, object),
            Scope::ALL,
            &verno_jmespath::NoEnv,
            &verno_engine::NoData,
            &mut (),
        )
        .allowed()
}

#[test]
fn a_namespaced_scope_leaves_cluster_scoped_objects_alone_and_the_other_way_round() {
    let namespaced_role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r", "namespace": "team"}});
    let cluster_role =
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
    // `*` resources in one group: the scope alone decides.
    assert!(!allowed("Namespaced", "*", &namespaced_role));
    assert!(allowed("Namespaced", "*", &cluster_role));
    assert!(allowed("Cluster", "*", &namespaced_role));
    assert!(!allowed("Cluster", "*", &cluster_role));
    assert!(!allowed("*", "*", &cluster_role) && !allowed("*", "*", &namespaced_role));
    // A Namespace is cluster-scoped.
    assert!(allowed("Namespaced", "namespaces", &namespace));
    assert!(!allowed("Cluster", "namespaces", &namespace));
}
