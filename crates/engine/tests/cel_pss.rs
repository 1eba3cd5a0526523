//! The CEL Pod Security set (`bench/cel-pss17.yaml`, our own) gives the verdicts the pattern
//! set gives: checked on the project's example requests, and, when the shared bench corpus is
//! next to the repository, against Kyverno's 17 pattern policies on its three requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use verno_engine::{Compiled, NoData, PolicySet, Request, Scope, Status, compile};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    verno_jmespath::yaml::parse_all(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn set_of(docs: &[Value]) -> PolicySet {
    let policies = docs
        .iter()
        .filter(|d| d.is_object())
        .map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => Arc::new(p),
            other => panic!("{other:?}"),
        })
        .collect();
    PolicySet::new(policies, Vec::new())
}

fn cel_set() -> PolicySet {
    set_of(&docs(&root().join("bench/cel-pss17.yaml")))
}

/// The names of the policies that fail the request's object.
fn failing(set: &PolicySet, review: &Value) -> Vec<String> {
    let r = &review["request"];
    let req = Request {
        asker: verno_engine::Asker {
            user: None,
            info: r.get("userInfo").map_or(verno_engine::UserInfoRef::Unknown, verno_engine::UserInfoRef::Json),
        },
        ..Request::new(
            r["operation"].as_str().and_then(verno_engine::Operation::parse).unwrap_or_default(),
            &r["object"],
        )
    };
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &NoData, &mut ());
    let mut out: Vec<String> = out
        .responses
        .iter()
        .filter(|(_, r)| r.rules.iter().any(|r| r.status == Status::Fail || r.status == Status::Error))
        .filter_map(|(i, _)| set.policies().get(*i).map(|p| p.name.clone()))
        .collect();
    out.sort();
    out
}

fn review(object: Value) -> Value {
    serde_json::json!({"request": {"operation": "CREATE", "object": object}})
}

#[test]
fn the_cel_set_judges_pods_like_the_pod_security_standards() {
    let set = cel_set();
    assert_eq!(set.policies().len(), 17);
    let bare = review(
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    );
    assert_eq!(
        failing(&set, &bare),
        [
            "disallow-capabilities-strict",
            "disallow-privilege-escalation",
            "require-run-as-nonroot",
            "restrict-seccomp-strict"
        ]
    );
    let hardened: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/hardened-pod.json")).unwrap_or_default())
            .unwrap_or_default();
    assert_eq!(failing(&set, &hardened), Vec::<String>::new());
    let privileged: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/privileged-pod.json")).unwrap_or_default())
            .unwrap_or_default();
    assert!(failing(&set, &privileged).contains(&"disallow-privileged-containers".to_string()));
}

#[test]
fn the_cel_set_agrees_with_the_pattern_set_when_the_bench_corpus_is_present() {
    let Some(shared) = verno_testkit::corpus("bench", "the CEL Pod Security set against the pattern set") else {
        return;
    };
    let mut patterns_docs = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(shared.join("policies/pss-17"))
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        patterns_docs.extend(docs(&f));
    }
    let patterns = set_of(&patterns_docs);
    assert_eq!(patterns.policies().len(), 17);
    let set = cel_set();
    for name in ["pod-busybox-create.json", "pod-hardened-create.json", "deployment-hardened-create.json"] {
        let text = std::fs::read_to_string(shared.join("requests").join(name)).unwrap_or_default();
        let review: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(failing(&set, &review), failing(&patterns, &review), "{name}");
    }
}
