//! Kyverno as the oracle, short: 300 generated cases (seed 1) through Kyverno's CLI and
//! `verno apply` must agree. Runs only where the oracle is built
//! (`scripts/install-kyverno-oracle.sh`, or `$VERNO_KYVERNO_CLI`); skips with a message
//! otherwise. The full run is `bench/differential.sh 10000`.

use std::path::{Path, PathBuf};
use verno_differential::{Said, Tools, apply, compare, generate::Gen, write_yaml};

#[test]
fn three_hundred_generated_cases_agree_with_kyvernos_cli() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some(kyverno) = verno_differential::find_oracle(&repo) else {
        eprintln!("skipped: Kyverno's CLI is not built (scripts/install-kyverno-oracle.sh)");
        return;
    };
    let tools = Tools { kyverno, verno: PathBuf::from(env!("CARGO_BIN_EXE_verno")) };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut g = Gen::new(1);
    let policies: Vec<_> = (0..12).map(|i| g.policy(&format!("p{i}"))).collect();
    let resources: Vec<_> = (0..25).map(|i| g.resource(&format!("r-{i}"))).collect();
    let files: Vec<PathBuf> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let f = dir.path().join(format!("p{i}.yaml"));
            write_yaml(&f, std::slice::from_ref(p)).unwrap_or_else(|e| panic!("{e}"));
            f
        })
        .collect();
    let rfile = dir.path().join("resources.yaml");
    write_yaml(&rfile, &resources).unwrap_or_else(|e| panic!("{e}"));
    let run = |program: &Path| match apply(program, &files, &rfile).unwrap_or_else(|e| panic!("{e}")) {
        Said::Results(r) => r.results,
        Said::Refused(why) => panic!("{} refused the generated policies: {why}", program.display()),
    };
    let (k, v) = (run(&tools.kyverno), run(&tools.verno));
    assert!(!k.is_empty(), "Kyverno reported nothing");
    // Differences recorded as intended (docs/compat.md) aside.
    let undecided = |name: &str| {
        policies.iter().any(|p| p["metadata"]["name"] == name && verno_differential::intended_for_policy(p).is_some())
    };
    let found: Vec<_> = compare(&k, &v)
        .into_iter()
        .filter(|d| verno_differential::intended(d).is_none() && !undecided(&d.policy))
        .collect();
    let lines: Vec<String> =
        found.iter().map(|d| format!("{:?} {} on {:?}: {}", d.kind, d.policy, d.resource, d.detail)).collect();
    assert!(found.is_empty(), "{} of 300 cases disagree:\n{}", found.len(), lines.join("\n"));
}
