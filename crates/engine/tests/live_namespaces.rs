//! The namespaces a cluster's watch keeps ([`LiveNamespaces`]): CEL policies read
//! `namespaceObject` from them instead of asking the data port (an API call per request in a
//! cluster), shaped as Kyverno's namespace lister hands it over; namespaces the watch has not
//! delivered are still read through the port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::Mutex;
use verno_api::AdmissionRequest;
use verno_engine::{Compiled, Data, Filter, Hook, LiveNamespaces, PolicySet, Request, Route, Scope, compile};

/// Answers `namespaceObject` reads with a Namespace labelled `team: from-port`, noting each.
#[derive(Default)]
struct Port(Mutex<Vec<String>>);

impl Data for Port {
    fn namespace_object(&self, name: &str) -> Option<Value> {
        self.0.lock().unwrap().push(name.to_string());
        Some(json!({"metadata": {"name": name, "labels": {"team": "from-port"}}}))
    }
}

fn team_policy() -> Arc<verno_engine::CompiledPolicy> {
    let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "team"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["pods"]}]},
        "validations": [
            {"expression": "namespaceObject.metadata.labels.team == 'a'",
             "messageExpression": "'team ' + namespaceObject.metadata.labels.team"},
            {"expression": "!has(namespaceObject.kind) && !has(namespaceObject.apiVersion)", "message": "typed fields"}]}});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

fn pod(ns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
}

const VPOL: Route =
    Route::Cel { hook: Hook::Validate, namespaced: false, names: Vec::new(), filter: Filter::All, image: false };

/// The denial, if any, of a Pod in `ns`.
fn denial(set: &PolicySet, data: &Port, ns: &str) -> Option<String> {
    let object = pod(ns);
    let out = set.evaluate(
        &Request::new(verno_engine::Operation::Create, &object),
        Scope::webhook(VPOL),
        &verno_jmespath::NoEnv,
        data,
        &mut (),
    );
    out.denial("Pod", ns, "p")
}

fn live() -> Arc<LiveNamespaces> {
    let live = Arc::new(LiveNamespaces::default());
    live.upsert(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "held", "labels": {"team": "a"}}, "status": {"phase": "Active"}}));
    live
}

#[test]
fn cel_reads_a_held_namespace_without_the_data_port() {
    let live = live();
    let set = PolicySet::new(vec![team_policy()], Vec::new()).with_live_namespaces(live.clone());
    let port = Port::default();
    assert_eq!(denial(&set, &port, "held"), None);
    assert!(port.0.lock().unwrap().is_empty(), "the port was asked: {:?}", port.0.lock().unwrap());
    // A namespace the watch has not delivered is read through the port.
    let refused = denial(&set, &port, "fresh").unwrap();
    assert!(refused.contains("team from-port"), "{refused}");
    assert_eq!(*port.0.lock().unwrap(), ["fresh"]);
    // A label change is seen by the next request; a deleted namespace is asked for again.
    live.upsert(json!({"metadata": {"name": "held", "labels": {"team": "b"}}}));
    assert!(denial(&set, &port, "held").unwrap().contains("team b"));
    live.retain(|n| n != "held");
    assert!(denial(&set, &port, "held").unwrap().contains("team from-port"));
    assert_eq!(*port.0.lock().unwrap(), ["fresh", "held"]);
}

#[test]
fn the_labels_of_a_held_namespace_serve_namespace_selectors() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "selected"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "r",
            "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaceSelector": {"matchLabels": {"team": "a"}}}}]},
            "validate": {"message": "no", "deny": {}}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("compiles") };
    let live = live();
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new()).with_live_namespaces(live.clone());
    let blocked = |ns: &str| {
        let object = pod(ns);
        let route = Route::Kyverno(Hook::Validate, Filter::All);
        !set.evaluate(
            &Request::new(verno_engine::Operation::Create, &object),
            Scope::webhook(route),
            &verno_jmespath::NoEnv,
            &Port::default(),
            &mut (),
        )
        .allowed()
    };
    assert!(blocked("held"));
    assert!(!blocked("other"));
    live.remove("held");
    assert!(!blocked("held"));
}

#[test]
fn a_request_is_answerable_without_io_when_its_namespace_is_held() {
    let review = |object: Value, old: Value| -> AdmissionRequest {
        serde_json::from_value(json!({"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
            "userInfo": {}, "object": object, "oldObject": old}))
        .unwrap()
    };
    let set = PolicySet::new(vec![team_policy()], Vec::new()).with_live_namespaces(live());
    assert!(set.holds_namespace_of(&review(pod("held"), Value::Null)));
    assert!(!set.holds_namespace_of(&review(pod("fresh"), Value::Null)));
    // A deletion is about its old object.
    assert!(!set.holds_namespace_of(&review(Value::Null, pod("fresh"))));
    // Cluster-scoped: nothing to read.
    assert!(set.holds_namespace_of(&review(json!({"kind": "Node", "metadata": {"name": "n"}}), Value::Null)));
    // No watch (no cluster): nothing to wait for either.
    let offline = PolicySet::new(vec![team_policy()], Vec::new());
    assert!(offline.holds_namespace_of(&review(pod("fresh"), Value::Null)));
}

#[test]
fn validate_cel_in_a_cluster_policy_reads_a_held_namespace_too() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "team"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "r",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"cel": {"expressions": [{"expression": "namespaceObject.metadata.labels.team == 'a'",
                "messageExpression": "'team ' + namespaceObject.metadata.labels.team"}]}}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("compiles") };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new()).with_live_namespaces(live());
    let port = Port::default();
    let run = |ns: &str| {
        let object = pod(ns);
        let route = Route::Kyverno(Hook::Validate, Filter::All);
        set.evaluate(
            &Request::new(verno_engine::Operation::Create, &object),
            Scope::webhook(route),
            &verno_jmespath::NoEnv,
            &port,
            &mut (),
        )
        .denial("Pod", ns, "p")
    };
    assert_eq!(run("held"), None);
    assert!(port.0.lock().unwrap().is_empty());
    assert!(run("fresh").unwrap().contains("team from-port"));
    assert_eq!(*port.0.lock().unwrap(), ["fresh"]);
}
