//! A false deny: the Roles and ClusterRoles bound to the requesting user feed
//! `roles`/`clusterRoles` in match and exclude and `request.roles`/`request.clusterRoles`, as
//! Kyverno works them out for every admission request. A policy that excludes cluster admins
//! does not refuse them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, Data, Filter, Hook, PolicySet, Route, compile};

/// `admin` is bound to cluster-admin (through the `system:masters` group) and to Role
/// `shop:editor`; nobody else is bound to anything.
struct Rbac;

impl Data for Rbac {
    fn user_roles(&self, username: &str, groups: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        if username == "admin" || groups.iter().any(|g| g == "system:masters") {
            Some((vec!["shop:editor".into()], vec!["cluster-admin".into()]))
        } else {
            Some((Vec::new(), Vec::new()))
        }
    }
}

fn review(set: &PolicySet, username: &str, groups: &[&str]) -> (bool, String) {
    let req: verno_api::admission::AdmissionRequest = serde_json::from_value(json!({
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "shop", "name": "web", "userInfo": {"username": username, "groups": groups},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"containers": [{"name": "c", "image": "nginx", "securityContext": {"privileged": true}}]}}}))
    .unwrap();
    let out = set.review(&req, Route::Kyverno(Hook::Validate, Filter::All), &verno_jmespath::NoEnv, &Rbac, &mut ());
    let messages: Vec<String> = out.violations.iter().map(|v| v.message.clone()).collect();
    (out.allowed(), messages.join("\n"))
}

fn set(rule: Value) -> PolicySet {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "no-privileged"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [rule]}});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

#[test]
fn cluster_admins_excluded_by_cluster_role_are_not_refused() {
    let s = set(json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
        "exclude": {"any": [{"clusterRoles": ["cluster-admin"]}]},
        "validate": {"message": "no privileged containers",
            "pattern": {"spec": {"containers": [{"=(securityContext)": {"=(privileged)": false}}]}}}}));
    assert!(review(&s, "kubernetes-admin", &["system:masters", "system:authenticated"]).0);
    assert!(!review(&s, "alice", &["system:authenticated"]).0);
}

#[test]
fn request_roles_and_cluster_roles_are_the_users() {
    let s = set(json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
        "validate": {"message": "roles {{ request.roles }} cluster roles {{ request.clusterRoles }}",
            "deny": {"conditions": {"all": [{"key": "cluster-admin", "operator": "AnyNotIn", "value": "{{ request.clusterRoles }}"}]}}}}));
    let (allowed, _) = review(&s, "admin", &[]);
    assert!(allowed);
    let (allowed, message) = review(&s, "alice", &[]);
    assert!(!allowed);
    assert!(message.contains("roles [] cluster roles []"), "{message}");
}
