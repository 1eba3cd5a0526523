//! Requests written by an attacker: what a resource carries is data, never code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Asker, Compiled, Filter, Hook, NoData, PolicySet, Request, Route, Scope, UserInfoRef, compile};

/// An Enforce policy whose message quotes the resource, as many real ones do.
fn registry_policy(message: &str) -> PolicySet {
    let doc = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "registry"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{
            "name": "approved",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": message, "pattern": {"spec": {"containers": [{"image": "registry.example.com/*"}]}}}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("the policy compiles") };
    PolicySet::new(vec![Arc::new(p)], Vec::new())
}

fn pod(image: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "shop", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": image}]}})
}

/// The message of the refusal, or `None` when the Pod is admitted.
fn denial(set: &PolicySet, object: &Value) -> Option<String> {
    let user = json!({"username": "alice", "groups": ["system:authenticated"]});
    let req = Request {
        asker: Asker { user: None, info: UserInfoRef::Json(&user) },
        ..Request::new(verno_engine::Operation::Create, object)
    };
    let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All));
    let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &NoData, &mut ());
    out.blocked.get("registry").and_then(|rules| rules.get("approved")).cloned()
}

#[test]
fn a_template_in_an_image_is_not_evaluated_when_the_message_quotes_it() {
    let set = registry_policy("Image {{ request.object.spec.containers[0].image }} is not from an approved registry");
    // 6 000 segments of JMESPath in the image: once evaluated, they overflowed the stack.
    let hostile = format!("{{{{request.object{}}}}}", ".a".repeat(6000));
    let msg = denial(&set, &pod(&hostile, json!({}))).expect("denied");
    assert!(msg.contains(&hostile), "the image is quoted as written");
    assert!(msg.starts_with("validation error: Image {{request.object.a.a"), "{}", &msg[..80]);
}

#[test]
fn user_info_named_in_a_resource_does_not_leak_into_the_denial() {
    let set = registry_policy("Image {{ request.object.spec.containers[0].image }} is not from an approved registry");
    let msg = denial(&set, &pod("{{request.userInfo}}", json!({}))).expect("denied");
    assert!(msg.contains("Image {{request.userInfo}} is not"), "{msg}");
    assert!(!msg.contains("alice"), "{msg}");
}

#[test]
fn a_self_referencing_annotation_is_quoted_once_not_doubled() {
    let set = registry_policy("bad image for {{ request.object.metadata.annotations.owner }}");
    let twice = "{{request.object.metadata.annotations.owner}}{{request.object.metadata.annotations.owner}}";
    let msg = denial(&set, &pod("nginx", json!({"owner": twice}))).expect("denied");
    assert!(msg.contains(&format!("bad image for {twice}")), "{msg}");
    assert!(msg.len() < 300, "no growth: {} bytes", msg.len());
}

#[test]
fn variables_the_policy_nests_in_its_own_text_still_resolve() {
    // `"{{element.name}}"` inside a larger variable: resolved innermost first, as Kyverno does.
    let set = registry_policy(
        "container {{ request.object.spec.containers[?name == '{{request.object.metadata.name}}'] | length(@) }} of {{ request.object.metadata.name }}",
    );
    let mut object = pod("nginx", json!({}));
    object["spec"]["containers"][0]["name"] = json!("p");
    let msg = denial(&set, &object).expect("denied");
    assert!(msg.starts_with("validation error: container 1 of p."), "{msg}");
}

/// A nested foreach over every container pair: quadratic work that a Pod with thousands of
/// containers turns into seconds.
fn pairwise_policy() -> PolicySet {
    let doc = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "pairs"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{
            "name": "distinct",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"foreach": [{"list": "request.object.spec.containers", "foreach": [{
                "list": "request.object.spec.containers",
                "deny": {"conditions": {"any": [{"key": "{{ element.name }}", "operator": "Equals", "value": "never"}]}}}]}]}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("the policy compiles") };
    PolicySet::new(vec![Arc::new(p)], Vec::new())
}

/// An environment whose caller gives up after `after` checks, counting them.
struct GivesUp {
    after: usize,
    checks: std::sync::atomic::AtomicUsize,
}
impl verno_jmespath::Env for GivesUp {
    fn cancelled(&self) -> bool {
        self.checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= self.after
    }
}

/// The deadline stopped the answer, not the work: an evaluation ran to its end
/// after the failure policy had answered. The engine now asks its caller between policies and
/// foreach elements and stops; the outcome says so and is not allowed.
#[test]
fn a_cancelled_evaluation_stops_at_the_next_element_and_is_not_allowed() {
    let containers: Vec<Value> = (0..300).map(|i| json!({"name": format!("c{i}"), "image": "nginx"})).collect();
    let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
        "spec": {"containers": containers}});
    let set = pairwise_policy();
    let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All));
    // Not cancelled: every pair is checked and the Pod is admitted.
    let never = GivesUp { after: usize::MAX, checks: Default::default() };
    let out = set.evaluate(&Request::new(verno_engine::Operation::Create, &object), scope, &never, &NoData, &mut ());
    assert!(out.allowed() && !out.cancelled);
    let full = never.checks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(full >= 300 * 300, "asked at every element: {full}");
    // Cancelled after 1 000 checks: it stops there, is marked, and is not allowed.
    let soon = GivesUp { after: 1_000, checks: Default::default() };
    let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All)).keeping_responses();
    let out = set.evaluate(&Request::new(verno_engine::Operation::Create, &object), scope, &soon, &NoData, &mut ());
    let asked = soon.checks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(asked < 1_000 + 400, "stopped soon after the caller gave up: {asked} checks");
    assert!(!out.allowed());
    let rule = &out.responses[0].1.rules[0];
    assert!(rule.message.contains("cancelled"), "{}", rule.message);
}
