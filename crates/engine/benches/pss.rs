//! The engine on Kyverno's published load-test set: the 17 Pod Security Standards policies
//! (`../shared/bench/policies/pss-17`) against the busybox Pod of
//! `../shared/bench/requests/pod-busybox-create.json`. One iteration = one Pod through all 17.
//!
//! Run: `cargo bench -p verno-engine --bench pss` (`PSS_ONLY=disallow-host-path` for one policy)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

/// The allocator the `verno` binary ships with (`crates/verno/src/main.rs`): the engine is
/// measured as users run it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use verno_engine::{
    Compiled, Filter, Hook, NoData, Observer, PolicyResponse, PolicySet, Request, Route, Scope, compile,
};

fn shared() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench");
    p.is_dir().then_some(p)
}

fn compiled(docs: &[Value]) -> PolicySet {
    let policies = docs
        .iter()
        .filter_map(|d| match compile(d, &[]) {
            Ok(Compiled::Policy(p)) => Some(Arc::new(p)),
            _ => None,
        })
        .collect();
    PolicySet::new(policies, Vec::new())
}

fn policies() -> PolicySet {
    let Some(dir) = shared() else { return PolicySet::default() };
    let mut files: Vec<_> = std::fs::read_dir(dir.join("policies/pss-17"))
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    // `PSS_ONLY=<file stem>` keeps one policy (an unknown stem, none): one policy's cost
    // against an empty set's shows what it adds to a request (docs/benchmarks.md, twelfth pass).
    if let Ok(only) = std::env::var("PSS_ONLY") {
        files.retain(|f| f.file_stem().is_some_and(|s| s.to_string_lossy() == only));
    }
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        docs.extend(verno_jmespath::yaml::parse_all(&text).unwrap_or_default());
    }
    compiled(&docs)
}

/// Our CEL versions of the same 17 checks (`bench/cel-pss17.yaml`), one ValidatingPolicy each.
fn cel_policies() -> PolicySet {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/cel-pss17.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    compiled(&verno_jmespath::yaml::parse_all(&text).unwrap_or_default())
}

fn request(name: &str) -> Value {
    let Some(dir) = shared() else { return Value::Null };
    let text = std::fs::read_to_string(dir.join("requests").join(name)).unwrap_or_default();
    serde_json::from_str::<Value>(&text).unwrap_or_default()
}

/// One Pod through the set's front door, as the validating webhook of its family runs it.
fn run(set: &PolicySet, route: &Route, review: &Value) -> usize {
    let req = &review["request"];
    let req = Request {
        asker: verno_engine::Asker {
            user: None,
            info: req.get("userInfo").map_or(verno_engine::UserInfoRef::Unknown, verno_engine::UserInfoRef::Json),
        },
        ..Request::new(
            req["operation"].as_str().and_then(verno_engine::Operation::parse).unwrap_or_default(),
            &req["object"],
        )
    };
    let mut rules = RuleCount(0);
    let out = set.evaluate(&req, Scope::webhook(route.clone()), &verno_jmespath::NoEnv, &NoData, &mut rules);
    rules.0 + usize::from(out.allowed())
}

/// Counts rule results as each policy ends (what the server's metrics do).
struct RuleCount(usize);

impl Observer for RuleCount {
    fn policy_finished(&mut self, _policy: usize, r: &PolicyResponse) {
        self.0 += r.rules.len();
    }
}

fn kyverno_route() -> Route {
    Route::Kyverno(Hook::Validate, Filter::All)
}

fn cel_route() -> Route {
    Route::Cel { hook: Hook::Validate, namespaced: false, names: Vec::new(), filter: Filter::All, image: false }
}

fn main() {
    divan::main();
}

#[divan::bench(args = ["pod-busybox-create.json", "pod-hardened-create.json", "deployment-hardened-create.json"])]
fn pss17(bencher: divan::Bencher, file: &str) {
    let ps = policies();
    let review = request(file);
    if ps.policies().len() != 17 {
        eprintln!("skipping: expected the 17 PSS policies in ../shared/bench, found {}", ps.policies().len());
    }
    let route = kyverno_route();
    bencher.bench(|| run(divan::black_box(&ps), &route, divan::black_box(&review)));
}

/// The same Pods through the CEL set, for the ratio CEL / patterns measured in one run.
#[divan::bench(args = ["pod-busybox-create.json", "pod-hardened-create.json", "deployment-hardened-create.json"])]
fn cel_pss17(bencher: divan::Bencher, file: &str) {
    let ps = cel_policies();
    let review = request(file);
    if ps.policies().len() != 17 {
        eprintln!("skipping: expected 17 CEL policies in bench/cel-pss17.yaml, found {}", ps.policies().len());
    }
    let route = cel_route();
    bencher.bench(|| run(divan::black_box(&ps), &route, divan::black_box(&review)));
}

#[divan::bench]
fn compile_pss17(bencher: divan::Bencher) {
    bencher.bench(policies);
}

/// Each of the 17 policies alone on the busybox Pod: where the time of `pss17` goes.
#[divan::bench(args = [
    "disallow-capabilities-strict", "disallow-capabilities", "disallow-host-namespaces", "disallow-host-path",
    "disallow-host-ports", "disallow-host-process", "disallow-privilege-escalation",
    "disallow-privileged-containers", "disallow-proc-mount", "disallow-selinux", "require-run-as-non-root-user",
    "require-run-as-nonroot", "restrict-apparmor-profiles", "restrict-seccomp-strict", "restrict-seccomp",
    "restrict-sysctls", "restrict-volume-types",
])]
fn pss17_each(bencher: divan::Bencher, name: &str) {
    let all = policies();
    let one: Vec<_> = all.policies().iter().filter(|p| p.name == name).cloned().collect();
    let ps = PolicySet::new(one, Vec::new());
    let review = request("pod-busybox-create.json");
    let route = kyverno_route();
    bencher.bench(|| run(divan::black_box(&ps), &route, divan::black_box(&review)));
}

/// `pss17` with the caches overwritten before each iteration (a 4 MiB buffer written, twice a
/// 2 MiB L2) and the review then parsed from its text: closer to the engine in a server, where
/// TLS, HTTP and the kernel run between two requests and the request was just parsed. The
/// overwrite and the parse are setup, not timed.
#[divan::bench(args = ["pod-busybox-create.json"])]
fn pss17_cold(bencher: divan::Bencher, file: &str) {
    let ps = policies();
    let text = request(file).to_string();
    let route = kyverno_route();
    let mut junk = vec![0u8; 4 << 20];
    let mut round = 0u8;
    bencher
        .with_inputs(|| {
            round = round.wrapping_add(1);
            junk.iter_mut().step_by(64).for_each(|b| *b = round);
            serde_json::from_str::<Value>(&text).unwrap_or_default()
        })
        .bench_local_values(|review| (run(divan::black_box(&ps), &route, &review), review));
}
