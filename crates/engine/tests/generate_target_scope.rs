//! No false denials: a generate rule's target namespace is checked against the
//! target's scope only where that scope is known without the cluster. A custom kind (here a
//! Crossplane `Role`, cluster-scoped, which shares its name with RBAC's namespaced one) is
//! neither refused for a missing namespace nor for a set one: Kyverno asks discovery, and a
//! guess must not refuse a good policy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};

fn policy(api_version: &str, kind: &str, namespace: Option<&str>) -> Value {
    let mut generate = json!({"apiVersion": api_version, "kind": kind, "name": "superuser", "synchronize": true,
        "data": {"rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}});
    if let Some(ns) = namespace {
        generate["namespace"] = json!(ns);
    }
    json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "rbac-policy"},
        "spec": {"rules": [{"name": "rbac-rule", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
            "generate": generate}]}})
}

/// As the cluster compiles a stored policy (the policy validation webhook and the controller).
fn compiles(p: &Value) -> Result<(), String> {
    verno_engine::compile_stored(verno_engine::Kind::ClusterPolicy, "kyverno.io/v1", p)
        .map(|_| ())
        .map_err(|e| e.with_path())
}

#[test]
fn a_custom_kind_is_not_refused_for_its_target_namespace() {
    compiles(&policy("iam.aws.crossplane.io/v1beta1", "Role", None)).unwrap();
    compiles(&policy("iam.aws.crossplane.io/v1beta1", "Role", Some("{{request.object.metadata.name}}"))).unwrap();
}

#[test]
fn a_built_in_kind_still_needs_the_right_target_namespace() {
    let err = compiles(&policy("rbac.authorization.k8s.io/v1", "Role", None)).unwrap_err();
    assert!(err.contains("Forbidden: target namespace must be set for a namespaced resource"), "{err}");
    compiles(&policy("rbac.authorization.k8s.io/v1", "Role", Some("team-a"))).unwrap();
    let err = compiles(&policy("rbac.authorization.k8s.io/v1", "ClusterRole", Some("team-a"))).unwrap_err();
    assert!(err.contains("Forbidden: target namespace must not be set for a cluster-wide resource"), "{err}");
}
