//! The responses a webhook evaluation hands its observer, one policy after another: each holds
//! its own policy's name and rules only (the engine reuses one response's storage for the
//! next policy when the caller keeps none).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::json;
use std::sync::Arc;
use verno_engine::{
    Compiled, Filter, Hook, NoData, Observer, PolicyResponse, PolicySet, Request, Route, Scope, compile,
};

/// Per finished policy: its name, its rules as `name:Status`, and how many it explains.
#[derive(Default)]
struct Seen(Vec<(String, Vec<String>, usize)>);

impl Observer for Seen {
    fn policy_finished(&mut self, _policy: usize, r: &PolicyResponse) {
        let rules = r.rules.iter().map(|x| format!("{}:{:?}", x.name, x.status)).collect();
        self.0.push((r.policy.clone(), rules, r.not_applied.len()));
    }
}

#[test]
fn each_policy_response_holds_its_own_rules_only() {
    let rule = |name: &str, kind: &str, pattern: serde_json::Value| json!({"name": name, "match": {"any": [{"resources": {"kinds": [kind]}}]}, "validate": {"pattern": pattern}});
    let policy = |name: &str, namespace: Option<&str>, rules: Vec<serde_json::Value>| {
        let mut meta = json!({"name": name});
        if let Some(ns) = namespace {
            meta["namespace"] = json!(ns);
        }
        json!({"apiVersion": "kyverno.io/v1", "kind": if namespace.is_some() { "Policy" } else { "ClusterPolicy" },
            "metadata": meta, "spec": {"validationFailureAction": "Audit", "rules": rules}})
    };
    let docs = [
        policy(
            "three",
            None,
            vec![
                rule("a", "Pod", json!({"metadata": {"name": "?*"}})),
                rule("b", "Pod", json!({"spec": {"containers": [{"name": "nope"}]}})),
                rule("c", "Pod", json!({"metadata": {"labels": {"team": "?*"}}})),
            ],
        ),
        policy("none-apply", None, vec![rule("d", "Service", json!({"spec": "?*"}))]),
        policy("one", Some("default"), vec![rule("e", "Pod", json!({"spec": {"containers": [{"name": "c"}]}}))]),
    ];
    let policies = docs
        .iter()
        .map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            _ => panic!("compiles: {d}"),
        })
        .collect();
    let set = PolicySet::new(policies, Vec::new());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let mut seen = Seen::default();
    let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All));
    set.evaluate(&Request::new("CREATE", &pod), scope, &verno_jmespath::NoEnv, &NoData, &mut seen);
    assert_eq!(
        seen.0,
        vec![
            ("three".to_string(), vec!["a:Pass".to_string(), "b:Fail".into(), "c:Fail".into()], 0),
            ("none-apply".to_string(), vec![], 0),
            ("default/one".to_string(), vec!["e:Pass".to_string()], 0),
        ]
    );
}

/// A webhook request's `userInfo` reaches the policies that read it (as a whole, field by field
/// and as the service account variables) although the engine makes it JSON only when read.
#[test]
fn a_webhook_request_user_info_reads_as_the_api_server_sent_it() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "who"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "asker",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "{{ request.userInfo.username }} in {{ request.userInfo.groups | join(',', @) }} as {{ serviceAccountNamespace }}/{{ serviceAccountName }}; {{ request.userInfo }}",
                "deny": {"conditions": {"any": [{"key": "x", "operator": "Equals", "value": "x"}]}}}}]}});
    let p = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => p,
        Ok(_) => panic!("not a policy"),
        Err(e) => panic!("compiles: {e}"),
    };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let review: verno_api::admission::AdmissionReview = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default", "name": "x", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:ci:builder", "groups": ["a", "b"]},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"}}}}))
    .unwrap();
    let req = review.request.as_ref().unwrap();
    let route = Route::Kyverno(Hook::Validate, Filter::All);
    let out = set.review(req, route, &verno_jmespath::NoEnv, &NoData, &mut Seen::default());
    let said = &out.blocked["who"]["asker"];
    assert_eq!(
        said,
        r#"system:serviceaccount:ci:builder in a,b as ci/builder; {"groups":["a","b"],"username":"system:serviceaccount:ci:builder"}"#
    );
}
