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
    set.evaluate(
        &Request::new(verno_engine::Operation::Create, &pod),
        scope,
        &verno_jmespath::NoEnv,
        &NoData,
        &mut seen,
    );
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

/// A webhook evaluation skips the rules a request's kind rules out without reading them (the
/// set works out which when it is built); the rules left are the ones that run when every
/// rule is read, whatever their kinds say: exact names, several, wildcards, none, kinds only in
/// `all`, a `Kind` with its group and version, and a policy of more than 64 rules.
#[test]
fn rules_a_kind_rules_out_are_skipped_with_the_same_results() {
    let rule = |name: &str, filter: serde_json::Value| json!({"name": name, "match": filter, "validate": {"pattern": {"metadata": {"name": "?*"}}}});
    let kinds = |ks: &[&str]| json!({"any": [{"resources": {"kinds": ks}}]});
    let policy = |name: &str, rules: Vec<serde_json::Value>| {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name}, "spec": {"validationFailureAction": "Audit", "background": false, "rules": rules}})
    };
    let many: Vec<_> =
        (0..70).map(|i| rule(&format!("r{i}"), kinds(&[if i % 2 == 0 { "Pod" } else { "Deployment" }]))).collect();
    let docs = [
        policy(
            "mixed",
            vec![
                rule("pod", kinds(&["Pod"])),
                rule("deploy", kinds(&["Deployment"])),
                rule("both", kinds(&["Service", "Pod"])),
                rule("star", kinds(&["*"])),
                rule("glob", kinds(&["Po*"])),
                rule("gvk", kinds(&["v1/Pod"])),
                rule("other-gvk", kinds(&["apps/v1/Deployment"])),
                rule("all-of", json!({"all": [{"resources": {"kinds": ["Pod"]}}]})),
                rule("by-name", json!({"any": [{"resources": {"names": ["x"]}}]})),
                rule(
                    "two-filters",
                    json!({"any": [{"resources": {"kinds": ["Deployment"]}}, {"resources": {"kinds": ["Pod"]}}]}),
                ),
            ],
        ),
        policy("deployments", vec![rule("d", kinds(&["Deployment"]))]),
        policy("many", many),
    ];
    let policies = docs
        .iter()
        .map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            Ok(_) => panic!("not a policy: {d}"),
            Err(e) => panic!("compiles: {d}: {e}"),
        })
        .collect();
    let set = PolicySet::new(policies, Vec::new());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"}});
    let route = Route::Kyverno(Hook::Validate, Filter::All);
    let run = |scope: Scope| {
        let mut seen = Seen::default();
        set.evaluate(
            &Request::new(verno_engine::Operation::Create, &pod),
            scope,
            &verno_jmespath::NoEnv,
            &NoData,
            &mut seen,
        );
        seen.0.into_iter().map(|(p, rules, _)| (p, rules)).collect::<Vec<_>>()
    };
    let gated = run(Scope::webhook(route.clone()));
    // Keeping responses (and reasons) reads every rule.
    let read_all = run(Scope::webhook(route).keeping_responses());
    assert_eq!(gated, read_all);
    let pass = |names: &[&str]| names.iter().map(|n| format!("{n}:Pass")).collect::<Vec<_>>();
    let evens: Vec<String> = (0..70).step_by(2).map(|i| format!("r{i}")).collect();
    let evens: Vec<&str> = evens.iter().map(String::as_str).collect();
    assert_eq!(
        gated,
        vec![
            ("mixed".to_string(), pass(&["pod", "both", "star", "glob", "gvk", "all-of", "by-name", "two-filters"])),
            ("deployments".to_string(), vec![]),
            ("many".to_string(), pass(&evens)),
        ]
    );
}

/// A false deny: an Audit-only policy whose rule errors (a context entry
/// that cannot load) refused the request under its default failurePolicy Fail. Kyverno
/// evaluates Audit-only policies after it has answered, so nothing they find refuses a
/// request; in a policy that enforces, an error still refuses under Fail.
#[test]
fn an_audit_only_policys_error_refuses_nothing() {
    let policy = |name: &str, action: &str, failure: &str| {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
            "spec": {"validationFailureAction": action, "failurePolicy": failure, "rules": [{"name": "r",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "context": [{"name": "v", "variable": {"jmesPath": "request.object.metadata.labels.missing"}}],
                "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "{{ v }}", "operator": "Equals", "value": "x"}]}}}}]}})
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    for (action, failure, refused) in
        [("Audit", "Fail", false), ("Audit", "Ignore", false), ("Enforce", "Fail", true), ("Enforce", "Ignore", false)]
    {
        let p = match compile(&policy("p", action, failure), &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            _ => panic!("compiles"),
        };
        let set = PolicySet::new(vec![p], Vec::new());
        let scope = Scope::webhook(Route::Kyverno(Hook::Validate, Filter::All));
        let out = set.evaluate(
            &Request::new(verno_engine::Operation::Create, &pod),
            scope,
            &verno_jmespath::NoEnv,
            &NoData,
            &mut (),
        );
        assert_eq!(out.denial("Pod", "default", "x").is_some(), refused, "{action} / {failure}");
    }
}
