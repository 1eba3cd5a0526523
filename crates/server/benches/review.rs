//! The admission path without HTTP: parse + review + metrics for the busybox AdmissionReview,
//! with the 17 PSS policies and with none (`../shared/bench`).
//!
//! Run: `cargo bench -p verno-server --bench review`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

/// The allocator the `verno` binary ships with: measured as users run it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use verno_engine::{Filter, Hook, PolicySet, Route};
use verno_server::admission::{answer_json, parse, review};
use verno_server::metrics::Metrics;

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench")
}

fn pss17() -> PolicySet {
    let mut policies = Vec::new();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(shared().join("policies/pss-17")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for doc in verno_jmespath::yaml::parse_all(&text).unwrap_or_default() {
            if let Ok(verno_engine::Compiled::Policy(c)) = verno_engine::compile(&doc, &[]) {
                policies.push(std::sync::Arc::new(c));
            }
        }
    }
    PolicySet::new(policies, Vec::new())
}

fn body() -> Vec<u8> {
    std::fs::read(shared().join("requests/pod-busybox-create.json")).unwrap_or_default()
}

fn main() {
    divan::main();
}

#[divan::bench(args = ["pss17", "empty"])]
fn parse_review_metrics(bencher: divan::Bencher, set: &str) {
    let set = if set == "pss17" { pss17() } else { PolicySet::default() };
    let body = body();
    let metrics = Metrics::default();
    bencher.bench(|| {
        let Ok(r) = parse(divan::black_box(&body)) else { return false };
        let o = review(&set, Route::Kyverno(Hook::Validate, Filter::All), &r);
        metrics.observe("validate", &o, 0.001, false, &set);
        !answer_json(&o.review).is_empty()
    });
}

#[divan::bench(args = ["pss17", "empty"])]
fn review_only(bencher: divan::Bencher, set: &str) {
    let set = if set == "pss17" { pss17() } else { PolicySet::default() };
    let Ok(r) = parse(&body()) else { return };
    bencher.bench(|| review(&set, Route::Kyverno(Hook::Validate, Filter::All), divan::black_box(&r)).allowed);
}

#[divan::bench(args = ["pss17", "empty"])]
fn parse_review_serialize(bencher: divan::Bencher, set: &str) {
    let set = if set == "pss17" { pss17() } else { PolicySet::default() };
    let body = body();
    bencher.bench(|| {
        let Ok(r) = parse(divan::black_box(&body)) else { return false };
        let o = review(&set, Route::Kyverno(Hook::Validate, Filter::All), &r);
        !answer_json(&o.review).is_empty()
    });
}

/// The envelope alone: the body into the typed AdmissionReview.
#[divan::bench]
fn parse_only(bencher: divan::Bencher) {
    let body = body();
    bencher.bench(|| parse(divan::black_box(&body)).is_ok());
}

/// Counting one reviewed request (17 policies' results and durations) in the metrics.
#[divan::bench]
fn metrics_only(bencher: divan::Bencher) {
    let set = pss17();
    let Ok(r) = parse(&body()) else { return };
    let o = review(&set, Route::Kyverno(Hook::Validate, Filter::All), &r);
    let metrics = Metrics::default();
    bencher.bench(|| metrics.observe("validate", divan::black_box(&o), 0.001, false, &set));
}
