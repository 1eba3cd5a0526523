//! No false denials: Kyverno's `validate.allowExistingViolations` (on unless set to
//! `false`). An UPDATE of an object that already broke an Enforce rule before the update — a
//! Deployment created before the policy, then labelled, annotated or re-applied — is not
//! refused for it; an update that brings a new violation is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Asker, Compiled, PolicySet, Request, Scope, Status, compile};

fn set(validate: Value) -> PolicySet {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "r",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": validate}]}});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

fn pod(labels: Value, privileged: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "nginx", "securityContext": {"privileged": privileged}}]}})
}

/// (allowed, the rule's status and message) for an UPDATE from `old` to `new`.
fn update(set: &PolicySet, old: &Value, new: &Value) -> (bool, Status, String) {
    let req = Request { old_object: Some(old), ..Request::new(verno_engine::Operation::Update, new) };
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &verno_engine::NoData, &mut ());
    let allowed = out.allowed();
    let r = out.into_responses().into_iter().flat_map(|r| r.rules).next().unwrap();
    (allowed, r.status, r.message)
}

fn team() -> Value {
    json!({"message": "a team label is required", "pattern": {"metadata": {"labels": {"team": "?*"}}}})
}

#[test]
fn an_update_of_an_object_that_already_violated_is_not_refused() {
    let s = set(team());
    let (allowed, status, message) = update(&s, &pod(json!({"app": "a"}), false), &pod(json!({"app": "b"}), false));
    assert!(allowed);
    assert_eq!(
        (status, message.as_str()),
        (Status::Skip, "skipping the rule evaluation as pre-existing violations are allowed")
    );
    // An update that brings the violation is refused.
    let (allowed, status, _) = update(&s, &pod(json!({"team": "x"}), false), &pod(json!({}), false));
    assert!(!allowed);
    assert_eq!(status, Status::Fail);
    // So are creations, whatever came before.
    let out = s.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod(json!({}), false)),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    );
    assert!(!out.allowed());
}

#[test]
fn allow_existing_violations_false_refuses_the_update_and_deny_and_pod_security_rules_allow_it_too() {
    let mut strict = team();
    strict["allowExistingViolations"] = json!(false);
    let (allowed, _, _) = update(&set(strict), &pod(json!({}), false), &pod(json!({"app": "b"}), false));
    assert!(!allowed);
    let deny = json!({"message": "no privileged", "deny": {"conditions": {"any": [
        {"key": "{{ request.object.spec.containers[0].securityContext.privileged }}", "operator": "Equals", "value": true}]}}});
    assert!(update(&set(deny.clone()), &pod(json!({}), true), &pod(json!({"app": "b"}), true)).0);
    assert!(!update(&set(deny), &pod(json!({}), false), &pod(json!({}), true)).0);
    let pss = json!({"podSecurity": {"level": "baseline", "version": "latest"}});
    assert!(update(&set(pss.clone()), &pod(json!({}), true), &pod(json!({"app": "b"}), true)).0);
    assert!(!update(&set(pss), &pod(json!({}), false), &pod(json!({}), true)).0);
}

fn set_matching(matcher: Value, validate: Value) -> PolicySet {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "r",
            "match": {"any": [matcher]}, "validate": validate}]}});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

/// The old object is matched as Kyverno matches it — as itself, with no subresource and by no
/// user — so a rule that only a subresource request or a given requester matches keeps its
/// violation: `kubectl debug` (an UPDATE of `pods/ephemeralcontainers`) is refused by a
/// `Pod/ephemeralcontainers` deny rule although the Pod before it "failed" the same rule.
#[test]
fn rules_matching_a_subresource_or_a_requester_are_not_waived_by_the_old_object() {
    let debug = set_matching(json!({"resources": {"kinds": ["Pod/ephemeralcontainers"]}}), json!({"deny": {}}));
    let old = pod(json!({}), false);
    let mut new = old.clone();
    new["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox"}]);
    let req = Request {
        old_object: Some(&old),
        subresource: "ephemeralcontainers",
        ..Request::new(verno_engine::Operation::Update, &new)
    };
    let out = debug.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &verno_engine::NoData, &mut ());
    assert!(!out.allowed(), "kubectl debug must be refused");

    let alice = verno_engine::RequestUser { username: "alice".into(), ..Default::default() };
    let by_alice =
        set_matching(json!({"subjects": [{"kind": "User", "name": "alice"}], "resources": {"kinds": ["Pod"]}}), team());
    let (old, new) = (pod(json!({"app": "a"}), false), pod(json!({"app": "b"}), false));
    let req = Request {
        old_object: Some(&old),
        asker: Asker { user: Some(&alice), ..Asker::default() },
        ..Request::new(verno_engine::Operation::Update, &new)
    };
    let out = by_alice.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &verno_engine::NoData, &mut ());
    assert!(!out.allowed(), "a rule for alice's requests keeps its violation");
    // A rule for everyone still waives the violation that was there before.
    let (allowed, ..) = update(&set(team()), &old, &new);
    assert!(allowed);
}
