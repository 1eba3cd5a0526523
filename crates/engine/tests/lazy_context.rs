//! No false denials: context entries load as Kyverno's deferred loaders do. An entry
//! that cannot be loaded (a ConfigMap that does not exist, an API call that fails) is an error
//! only for an expression that reads it; a rule that never reads it — or reads it only where
//! its preconditions do not let it go — is decided as if the entry were not there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, Data, Loaded, PolicySet, Request, Scope, Status, compile};

/// A cluster with one ConfigMap, `default/present`; every API call fails.
struct Cluster;

impl Data for Cluster {
    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        if (namespace, name) == ("default", "present") {
            Loaded::Value(json!({"metadata": {"name": name}, "data": {"team": "shop"}}))
        } else {
            Loaded::Error(format!("configmaps \"{name}\" not found"))
        }
    }
    fn api_call(&self, _method: &str, url_path: &str, _data: Option<&Value>) -> Loaded {
        Loaded::Error(format!("failed to GET {url_path}: the server is unavailable"))
    }
}

fn run(context: Value, validate: Value, preconditions: Option<Value>) -> (Status, String) {
    let mut rule = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
        "context": context, "validate": validate});
    if let Some(p) = preconditions {
        rule["preconditions"] = p;
    }
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [rule]}});
    let policy = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"team": "shop"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let set = PolicySet::new(vec![policy], Vec::new());
    let out = set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        Scope::ALL,
        &verno_jmespath::NoEnv,
        &Cluster,
        &mut (),
    );
    let rules: Vec<_> = out.into_responses().into_iter().flat_map(|r| r.rules).collect();
    assert_eq!(rules.len(), 1, "{rules:?}");
    (rules[0].status, rules[0].message.clone())
}

fn team_pattern() -> Value {
    json!({"message": "a team label is required", "pattern": {"metadata": {"labels": {"team": "?*"}}}})
}

#[test]
fn a_missing_config_map_that_no_expression_reads_refuses_nothing() {
    let context = json!([
        {"name": "settings", "configMap": {"name": "missing", "namespace": "default"}},
        {"name": "remote", "apiCall": {"urlPath": "/api/v1/namespaces/default/configmaps/x"}},
        {"name": "derived", "variable": {"jmesPath": "settings.data.team"}},
    ]);
    assert_eq!(run(context, team_pattern(), None).0, Status::Pass);
}

#[test]
fn an_expression_that_reads_a_failed_entry_gets_its_error() {
    let context = json!([{"name": "settings", "configMap": {"name": "missing", "namespace": "default"}}]);
    let deny = json!({"message": "team {{ settings.data.team }}",
        "deny": {"conditions": {"any": [{"key": "{{ settings.data.team }}", "operator": "NotEquals", "value": "shop"}]}}});
    let (status, message) = run(context, deny, None);
    assert_eq!(status, Status::Error, "{message}");
    assert!(message.contains(r#"configmaps "missing" not found"#), "{message}");
    // A variable that reads the failed entry fails in turn when it is read.
    let context = json!([
        {"name": "settings", "configMap": {"name": "missing", "namespace": "default"}},
        {"name": "team", "variable": {"jmesPath": "settings.data.team"}},
    ]);
    let deny = json!({"message": "no",
        "deny": {"conditions": {"any": [{"key": "{{ team }}", "operator": "NotEquals", "value": "shop"}]}}});
    let (status, message) = run(context, deny, None);
    assert_eq!(status, Status::Error, "{message}");
}

#[test]
fn a_failed_entry_read_only_behind_unmet_preconditions_refuses_nothing() {
    let context = json!([{"name": "remote", "apiCall": {"urlPath": "/api/v1/namespaces/default/configmaps/x"}}]);
    let deny = json!({"message": "no",
        "deny": {"conditions": {"any": [{"key": "{{ remote.data.x }}", "operator": "Equals", "value": "y"}]}}});
    let pre =
        json!({"all": [{"key": "{{ request.object.metadata.labels.team }}", "operator": "Equals", "value": "other"}]});
    assert_eq!(run(context, deny, Some(pre)).0, Status::Skip);
}

#[test]
fn only_a_name_at_the_root_of_an_expression_reads_an_entry() {
    // `team` failed to load; `request.object.metadata.labels.team` is not a read of it.
    let context = json!([
        {"name": "team", "configMap": {"name": "missing", "namespace": "default"}},
        {"name": "present", "configMap": {"name": "present", "namespace": "default"}},
    ]);
    let deny = json!({"message": "no", "deny": {"conditions": {"any": [
        {"key": "{{ request.object.metadata.labels.team }}", "operator": "NotEquals", "value": "{{ present.data.team }}"}]}}});
    assert_eq!(run(context.clone(), deny, None).0, Status::Pass);
    // Inside a function call it is read.
    let deny = json!({"message": "no", "deny": {"conditions": {"any": [
        {"key": "{{ to_string(team) }}", "operator": "Equals", "value": "x"}]}}});
    assert_eq!(run(context, deny, None).0, Status::Error);
}
