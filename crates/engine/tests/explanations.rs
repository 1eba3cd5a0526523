//! Why a rule did not apply (`PolicyResponse::not_applied`) is worked out for callers that
//! keep responses (the CLI, scans, the controllers), not for a webhook call that drops them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::json;
use std::sync::Arc;
use verno_engine::{
    Compiled, Filter, Hook, NoData, NotApplied, Observer, PolicyResponse, PolicySet, Request, Route, Scope, compile,
};

#[derive(Default)]
struct Seen(Vec<Vec<NotApplied>>);

impl Observer for Seen {
    fn policy_finished(&mut self, _policy: usize, r: &PolicyResponse) {
        self.0.push(r.not_applied.clone());
    }
}

#[test]
fn reasons_are_given_to_callers_that_keep_responses() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"validationFailureAction": "Enforce", "rules": [
            {"name": "pods", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
             "validate": {"message": "m", "pattern": {"metadata": {"name": "?*"}}}},
            {"name": "services", "match": {"any": [{"resources": {"kinds": ["Service"]}}]},
             "validate": {"message": "m", "pattern": {"metadata": {"name": "?*"}}}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("compiles") };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"}});
    let req = Request::new(verno_engine::Operation::Create, &pod);
    let route = || Route::Kyverno(Hook::Validate, Filter::All);
    for (scope, explained) in
        [(Scope::ALL, true), (Scope::webhook(route()).keeping_responses(), true), (Scope::webhook(route()), false)]
    {
        let mut seen = Seen::default();
        let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &NoData, &mut seen);
        assert!(out.allowed());
        // Every phase's response (the CLI's scope runs them all; only Validate runs these rules).
        let reasons: Vec<NotApplied> = seen.0.concat();
        if explained {
            // The Service rule, and the Pod rule's autogen rules for Pod controllers.
            let services = reasons.iter().find(|n| n.rule == Some(1)).expect("the Service rule is explained");
            assert_eq!(services.reason, "kind does not match");
        } else {
            assert!(reasons.is_empty(), "{reasons:?}");
        }
    }
}
