//! Rules of one policy see the object as its earlier rules patched it, matching included
//! (Kyverno matches each rule against the policy context's new resource): a label the first
//! rule adds selects the second.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::Arc;
use verno_engine::{Compiled, Filter, Hook, NoData, Observer, PolicySet, Request, Route, Scope, compile};

struct Quiet;
impl Observer for Quiet {}

fn mutated(pod: &Value) -> Value {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "db"},
        "spec": {"rules": [
            {"name": "type", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"type": "database"}},
                    "spec": {"(containers)": [{"(image)": "*postgres*"}]}}}},
            {"name": "backup", "match": {"any": [{"resources": {"kinds": ["Pod"],
                    "selector": {"matchLabels": {"type": "database"}}}}]},
                "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"+(backup)": "yes"}}}}}]}});
    let Ok(Compiled::Policy(p)) = compile(&doc, &[]) else { panic!("does not compile") };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let req = Request::new(verno_engine::Operation::Create, pod);
    let scope = Scope::webhook(Route::Kyverno(Hook::Mutate, Filter::All));
    let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &NoData, &mut Quiet);
    out.patched.unwrap_or_else(|| pod.clone())
}

fn pod(image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "d"},
        "spec": {"containers": [{"name": "c", "image": image}]}})
}

#[test]
fn a_label_an_earlier_rule_adds_selects_a_later_rule() {
    let m = mutated(&pod("postgres:16"));
    assert_eq!(m["metadata"]["labels"], json!({"type": "database", "backup": "yes"}));
    // Not a database: the first rule's condition fails, nothing selects the second.
    let m = mutated(&pod("nginx"));
    assert!(m["metadata"].get("labels").is_none(), "{m}");
}
