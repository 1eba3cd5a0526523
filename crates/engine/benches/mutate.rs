//! A Pod through a typical mutate policy: default labels with `+()`, a sidecar container and
//! its volume injected by strategic merge, then the RFC 6902 patch the webhook would return.
//! The Pod is the busybox Pod of Kyverno's load test (`../shared/bench/requests`), or an
//! equivalent inline Pod when that directory is absent.
//!
//! Run: `cargo bench -p verno-engine --bench mutate`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

/// The allocator the `verno` binary ships with (`crates/verno/src/main.rs`): the engine is
/// measured as users run it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use verno_engine::{Compiled, Filter, Hook, NoData, PolicySet, Request, Route, Scope, compile, jsonpatch};

const POLICY: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: defaults-and-sidecar
spec:
  rules:
  - name: labels-and-sidecar
    match:
      any:
      - resources:
          kinds: [Pod]
    mutate:
      patchStrategicMerge:
        metadata:
          labels:
            +(team): unknown
            +(cost-center): shared
        spec:
          containers:
          - name: log-shipper
            image: fluent/fluent-bit:3.0
            volumeMounts:
            - name: app-logs
              mountPath: /var/log/app
          volumes:
          - name: app-logs
            emptyDir: {}
"#;

fn policy() -> PolicySet {
    let doc = verno_jmespath::yaml::parse(POLICY).unwrap_or_default();
    let policies = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => vec![Arc::new(p)],
        _ => Vec::new(),
    };
    PolicySet::new(policies, Vec::new())
}

fn pod() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench/requests/pod-busybox-create.json");
    let review: Value = std::fs::read_to_string(p).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    match review.pointer("/request/object") {
        Some(o) => o.clone(),
        None => json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busybox", "namespace": "default"},
            "spec": {"containers": [{"name": "busybox", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}),
    }
}

/// The Pod through the mutating webhook's front door, then the patch it would answer with.
fn run(set: &PolicySet, object: &Value) -> usize {
    let req = Request::new(verno_engine::Operation::Create, object);
    let scope = Scope::webhook(Route::Kyverno(Hook::Mutate, Filter::All));
    let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &NoData, &mut ());
    out.patched.map(|v| jsonpatch::diff(object, &v).len()).unwrap_or(0)
}

fn main() {
    divan::main();
}

#[divan::bench]
fn mutate_pod(bencher: divan::Bencher) {
    let ps = policy();
    let object = pod();
    assert!(run(&ps, &object) > 0, "the policy must patch the Pod");
    bencher.bench(|| run(divan::black_box(&ps), divan::black_box(&object)));
}
