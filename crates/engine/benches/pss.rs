//! The engine on Kyverno's published load-test set: the 17 Pod Security Standards policies
//! (`../shared/bench/policies/pss-17`) against the busybox Pod of
//! `../shared/bench/requests/pod-busybox-create.json`. One iteration = one Pod through all 17.
//!
//! Run: `cargo bench -p verno-engine --bench pss`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::Value;
use std::path::Path;
use verno_engine::{CompiledPolicy, NoData, Request, build_context, compile_policy, evaluate_policy};

fn shared() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench");
    p.is_dir().then_some(p)
}

fn policies() -> Vec<CompiledPolicy> {
    let Some(dir) = shared() else { return Vec::new() };
    let mut files: Vec<_> = std::fs::read_dir(dir.join("policies/pss-17"))
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for doc in verno_jmespath::yaml::parse_all(&text).unwrap_or_default() {
            if let Ok(p) = serde_json::from_value(doc)
                && let Ok(c) = compile_policy(&p)
            {
                out.push(c);
            }
        }
    }
    out
}

/// Our CEL versions of the same 17 checks (`bench/cel-pss17.yaml`), one ValidatingPolicy each.
fn cel_policies() -> Vec<CompiledPolicy> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/cel-pss17.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    verno_jmespath::yaml::parse_all(&text)
        .unwrap_or_default()
        .iter()
        .filter_map(|d| verno_engine::vpol::compile_validating_policy(d).ok())
        .collect()
}

fn request(name: &str) -> Value {
    let Some(dir) = shared() else { return Value::Null };
    let text = std::fs::read_to_string(dir.join("requests").join(name)).unwrap_or_default();
    serde_json::from_str::<Value>(&text).unwrap_or_default()
}

fn run(policies: &[CompiledPolicy], review: &Value) -> usize {
    let req = &review["request"];
    let req = Request {
        operation: req["operation"].as_str().unwrap_or("CREATE"),
        object: &req["object"],
        old_object: None,
        user: None,
        user_info: req.get("userInfo"),
        namespace_labels: None,
        subresource: "",
        variables: &[],
    };
    let env = verno_jmespath::NoEnv;
    let mut ctx = build_context(&req, &env);
    let mut n = 0;
    for p in policies {
        n += evaluate_policy(p, &[], &req, &mut ctx, &NoData).rules.len();
    }
    n
}

fn main() {
    divan::main();
}

#[divan::bench(args = ["pod-busybox-create.json", "pod-hardened-create.json", "deployment-hardened-create.json"])]
fn pss17(bencher: divan::Bencher, file: &str) {
    let ps = policies();
    let review = request(file);
    if ps.len() != 17 {
        eprintln!("skipping: expected the 17 PSS policies in ../shared/bench, found {}", ps.len());
    }
    bencher.bench(|| run(divan::black_box(&ps), divan::black_box(&review)));
}

/// The same Pods through the CEL set, for the ratio CEL / patterns measured in one run.
#[divan::bench(args = ["pod-busybox-create.json", "pod-hardened-create.json", "deployment-hardened-create.json"])]
fn cel_pss17(bencher: divan::Bencher, file: &str) {
    let ps = cel_policies();
    let review = request(file);
    if ps.len() != 17 {
        eprintln!("skipping: expected 17 CEL policies in bench/cel-pss17.yaml, found {}", ps.len());
    }
    bencher.bench(|| run(divan::black_box(&ps), divan::black_box(&review)));
}

#[divan::bench]
fn compile_pss17(bencher: divan::Bencher) {
    bencher.bench(policies);
}
