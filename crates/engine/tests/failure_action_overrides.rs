//! No false denials: whether a failed rule refuses a request is decided per rule and
//! per namespace, as Kyverno decides it — the rule's `validate.failureActionOverrides`, its
//! `failureAction`, the policy's `validationFailureActionOverrides` (by `namespaces`, with
//! wildcards, and by `namespaceSelector`), then the policy's action. An Enforce policy that a
//! namespace overrides to Audit refuses nothing there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope, compile};

fn policy(action: &str, overrides: Value, rule_extra: Value) -> Arc<verno_engine::CompiledPolicy> {
    let mut validate = json!({"message": "a team label is required",
        "pattern": {"metadata": {"labels": {"team": "?*"}}}});
    if let Value::Object(m) = rule_extra {
        validate.as_object_mut().unwrap().extend(m);
    }
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "team"},
        "spec": {"validationFailureAction": action, "validationFailureActionOverrides": overrides,
            "background": false, "rules": [{"name": "need-team",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": validate}]}});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

/// Whether a Pod without a team label is admitted in `ns`, a namespace labelled `labels`.
fn admitted(p: &Arc<verno_engine::CompiledPolicy>, ns: &str, labels: &[(&str, &str)]) -> bool {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let set = PolicySet::new(vec![p.clone()], Vec::new());
    let req = Request { namespace_labels: Some(&labels), ..Request::new(verno_engine::Operation::Create, &pod) };
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &verno_engine::NoData, &mut ());
    out.allowed()
}

#[test]
fn an_enforce_policy_overridden_to_audit_in_a_namespace_refuses_nothing_there() {
    let p = policy("Enforce", json!([{"action": "Audit", "namespaces": ["dev-*", "sandbox"]}]), json!({}));
    assert!(admitted(&p, "dev-1", &[]));
    assert!(admitted(&p, "sandbox", &[]));
    assert!(!admitted(&p, "prod", &[]));
    // By the namespace's labels.
    let p = policy(
        "Enforce",
        json!([{"action": "audit", "namespaceSelector": {"matchLabels": {"env": "dev"}}}]),
        json!({}),
    );
    assert!(admitted(&p, "anything", &[("env", "dev")]));
    assert!(!admitted(&p, "anything", &[("env", "prod")]));
    // Both: the namespace must be listed and selected.
    let p = policy(
        "Enforce",
        json!([{"action": "Audit", "namespaces": ["team-*"], "namespaceSelector": {"matchLabels": {"env": "dev"}}}]),
        json!({}),
    );
    assert!(admitted(&p, "team-a", &[("env", "dev")]));
    assert!(!admitted(&p, "team-a", &[("env", "prod")]));
    assert!(!admitted(&p, "other", &[("env", "dev")]));
}

#[test]
fn an_audit_policy_overridden_to_enforce_refuses_only_where_it_is() {
    let p = policy("Audit", json!([{"action": "Enforce", "namespaces": ["prod"]}]), json!({}));
    assert!(!admitted(&p, "prod", &[]));
    assert!(admitted(&p, "dev", &[]));
    // The first override that matches decides; one with an invalid action is passed over.
    let p = policy(
        "Audit",
        json!([{"action": "Block", "namespaces": ["prod"]}, {"action": "Audit", "namespaces": ["prod"]},
            {"action": "Enforce", "namespaces": ["*"]}]),
        json!({}),
    );
    assert!(admitted(&p, "prod", &[]));
    assert!(!admitted(&p, "dev", &[]));
}

#[test]
fn a_rules_own_overrides_and_action_come_before_the_policys() {
    let p = policy(
        "Enforce",
        json!([]),
        json!({"failureAction": "Enforce", "failureActionOverrides": [{"action": "Audit", "namespaces": ["dev"]}]}),
    );
    assert!(admitted(&p, "dev", &[]));
    assert!(!admitted(&p, "prod", &[]));
    // The rule's failureAction wins over the policy's overrides.
    let p = policy("Audit", json!([{"action": "Enforce", "namespaces": ["prod"]}]), json!({"failureAction": "Audit"}));
    assert!(admitted(&p, "prod", &[]));
}

#[test]
fn an_error_in_a_rule_that_does_not_enforce_here_refuses_nothing() {
    // Rule `team` enforces; rule `quota` audits and errors (its variable cannot be resolved).
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "mixed"},
        "spec": {"validationFailureAction": "Audit", "background": false, "rules": [
            {"name": "team", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
             "validate": {"failureAction": "Enforce", "message": "team", "pattern": {"metadata": {"labels": {"team": "?*"}}}}},
            {"name": "quota", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
             "validate": {"message": "quota", "deny": {"conditions": {"any": [
                {"key": "{{ parse_json('x') }}", "operator": "Equals", "value": "y"}]}}}}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": {"team": "a"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let set = PolicySet::new(vec![p.clone()], Vec::new());
    let out = set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    );
    assert!(out.allowed());
    // The same error in the enforcing rule refuses (failurePolicy Fail).
    let mut enforcing = doc.clone();
    enforcing["spec"]["rules"][1]["validate"]["failureAction"] = json!("Enforce");
    let p = match compile(&enforcing, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    let set = PolicySet::new(vec![p], Vec::new());
    let out = set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    );
    assert!(!out.allowed());
}

#[test]
fn a_verify_images_rule_enforces_when_any_entry_does_else_as_its_first_entry_that_says() {
    let rule = |entries: Value| {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "img"},
            "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "r",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "verifyImages": entries}]}});
        match compile(&doc, &[]) {
            Ok(Compiled::Policy(p)) => p.rule_action("r"),
            other => panic!("the policy does not compile: {:?}", other.err()),
        }
    };
    let key = json!([{"entries": [{"keys": {"publicKeys": "k"}}]}]);
    let entry = |refs: &str, action: Option<&str>| {
        let mut e = json!({"imageReferences": [refs], "attestors": key, "mutateDigest": false});
        if let Some(a) = action {
            e["failureAction"] = json!(a);
        }
        e
    };
    use verno_engine::Action;
    assert_eq!(rule(json!([entry("a/*", None), entry("b/*", Some("Audit"))])), Action::Audit);
    assert_eq!(rule(json!([entry("a/*", Some("Audit")), entry("b/*", Some("Enforce"))])), Action::Enforce);
    assert_eq!(rule(json!([entry("a/*", None), entry("b/*", None)])), Action::Enforce);
}

#[test]
fn a_cluster_scoped_resource_takes_only_overrides_for_every_namespace() {
    let doc = |overrides: Value| {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "roles"},
            "spec": {"validationFailureAction": "Audit", "validationFailureActionOverrides": overrides,
                "background": false, "rules": [{"name": "owner",
                    "match": {"any": [{"resources": {"kinds": ["ClusterRole"]}}]},
                    "validate": {"message": "owner", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}})
    };
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
    let admitted = |overrides: Value| {
        let p = match compile(&doc(overrides), &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            other => panic!("the policy does not compile: {:?}", other.err()),
        };
        let set = PolicySet::new(vec![p], Vec::new());
        set.evaluate(
            &Request::new(verno_engine::Operation::Create, &role),
            Scope::ALL,
            &verno_jmespath::NoEnv,
            &verno_engine::NoData,
            &mut (),
        )
        .allowed()
    };
    assert!(admitted(json!([{"action": "Enforce", "namespaces": ["*"]}])));
    assert!(admitted(json!([{"action": "Enforce", "namespaceSelector": {"matchLabels": {}}}])));
    assert!(!admitted(json!([{"action": "Enforce"}])));
}

#[test]
fn a_namespaced_policys_denial_and_warnings_name_it_without_its_namespace() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "Policy", "metadata": {"name": "team", "namespace": "shop"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "need-team",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "a team label is required", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let set = PolicySet::new(vec![p], Vec::new());
    let out = set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    );
    let message = out.denial("Pod", "shop", "web").unwrap();
    assert!(message.contains("\n\nteam:\n  need-team:"), "{message}");
    assert!(!message.contains("shop/team"), "{message}");
}
