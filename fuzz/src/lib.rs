//! Helpers shared by the fuzz targets: splitting one input into parts, and the policy set the
//! end-to-end targets evaluate against (Verno's bundled Pod Security policies and the project's
//! own `testdata/` policies, embedded so a target needs no files at run time).

pub mod properties;

use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use verno_engine::{Compiled, PolicySet};

/// The input's parts between NUL bytes, as text (invalid UTF-8 is replaced, not refused, so the
/// fuzzer does not waste its time there). Missing parts are empty.
pub fn parts<const N: usize>(data: &[u8]) -> [String; N] {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    let mut it = data.splitn(N, |b| *b == 0);
    for slot in out.iter_mut() {
        if let Some(p) = it.next() {
            *slot = String::from_utf8_lossy(p).into_owned();
        }
    }
    out
}

/// A part read as YAML (JSON is YAML): the first document, if any parses.
pub fn yaml(text: &str) -> Option<Value> {
    verno_jmespath::yaml::parse_all(text).ok()?.into_iter().next()
}

const POLICY_FILES: &[&str] = &[
    include_str!("../../policies/pod-security-baseline.yaml"),
    include_str!("../../policies/pod-security-restricted.yaml"),
    include_str!("../../testdata/mutate/inject-sidecar/policy.yaml"),
    include_str!("../../testdata/mutate/foreach-json6902/policies.yaml"),
    include_str!("../../testdata/validate/deny-conditions/policy.yaml"),
    include_str!("../../testdata/validate/foreach-images/policy.yaml"),
    include_str!("../../testdata/validate/require-labels/policy.yaml"),
    include_str!("../../testdata/cel/validating-policy/policy.yaml"),
    include_str!("../../testdata/cel/validating-policy/exception.yaml"),
    include_str!("../../testdata/cel/mutating-policy/policy.yaml"),
    include_str!("../../testdata/generate/namespace-defaults/policy.yaml"),
];

/// Every policy and exception of [`POLICY_FILES`], compiled once.
pub fn policy_set() -> &'static PolicySet {
    static SET: OnceLock<PolicySet> = OnceLock::new();
    SET.get_or_init(|| {
        let docs: Vec<Value> =
            POLICY_FILES.iter().flat_map(|t| verno_jmespath::yaml::parse_all(t).unwrap_or_default()).collect();
        let (mut policies, mut exceptions) = (Vec::new(), Vec::new());
        for d in &docs {
            match verno_engine::compile(d, &docs) {
                Ok(Compiled::Policy(p)) => policies.push(Arc::new(p)),
                Ok(Compiled::Exception(e)) => exceptions.push(e),
                Err(_) => {}
            }
        }
        PolicySet::new(policies, exceptions)
    })
}

/// Compiles `policy` (a fuzz target's own) and runs `object` through it as a CREATE, all
/// phases; a policy the input made invalid is skipped.
pub fn evaluate_one(policy: &Value, object: &Value) {
    let Ok(Compiled::Policy(p)) = verno_engine::compile(policy, &[]) else { return };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let _ = set.evaluate(
        &verno_engine::Request::new(verno_engine::Operation::Create, object),
        verno_engine::Scope::ALL,
        &verno_jmespath::NoEnv,
        &verno_engine::NoData,
        &mut (),
    );
}

/// A small Pod to evaluate compiled policies on.
pub fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "annotations": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27", "securityContext": {"privileged": false}}]}
    })
}
