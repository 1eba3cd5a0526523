//! Kyverno as the oracle, short: 300 generated policy cases (seed 1: validate and mutate
//! policies on resources, reports and written resources compared) and 300 generated JMESPath
//! expressions through Kyverno's CLI and Verno's must agree, intended differences aside
//! (docs/compat.md). Runs only where the oracle is built (`scripts/install-kyverno-oracle.sh`,
//! or `$VERNO_KYVERNO_CLI`); skips with a message otherwise. The full run is
//! `bench/differential.sh 10000`.

use std::path::{Path, PathBuf};
use verno_differential::{Judged, Tools, apply, generate::Gen, jp, judge, write_yaml};

fn tools() -> Option<Tools> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some(kyverno) = verno_differential::find_oracle(&repo) else {
        eprintln!("skipped: Kyverno's CLI is not built (scripts/install-kyverno-oracle.sh)");
        return None;
    };
    Some(Tools { kyverno, verno: PathBuf::from(env!("CARGO_BIN_EXE_verno")) })
}

#[test]
fn three_hundred_generated_cases_agree_with_kyvernos_cli() {
    let Some(tools) = tools() else { return };
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
    let run = |program: &Path| apply(program, &files, &rfile).unwrap_or_else(|e| panic!("{e}"));
    let found = match judge(run(&tools.kyverno), run(&tools.verno), &policies) {
        Judged::Compared(found) => found,
        Judged::BothRefused => panic!("both refused the generated policies"),
        Judged::OneRefused { by, why } => panic!("{by} refused the generated policies: {why}"),
    };
    let undecided = |name: &str| {
        policies.iter().any(|p| p["metadata"]["name"] == name && verno_differential::intended_for_policy(p).is_some())
    };
    let found: Vec<_> =
        found.into_iter().filter(|d| verno_differential::intended(d).is_none() && !undecided(&d.policy)).collect();
    let lines: Vec<String> =
        found.iter().map(|d| format!("{:?} {} on {:?}: {}", d.kind, d.policy, d.resource, d.detail)).collect();
    assert!(found.is_empty(), "{} of 300 cases disagree:\n{}", found.len(), lines.join("\n"));
}

#[test]
fn three_hundred_generated_jmespath_expressions_agree_with_kyvernos() {
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let input = dir.path().join("input.json");
    std::fs::write(&input, jp::input().to_string()).unwrap_or_else(|e| panic!("{e}"));
    let mut g = jp::JpGen::new(1);
    let exprs: Vec<String> = (0..300).map(|_| g.expression()).collect();
    let batch = |program: &Path, qs: &[String]| jp::query(program, &input, qs).unwrap_or_else(|e| panic!("{e}"));
    let (k, v) = (batch(&tools.kyverno, &exprs), batch(&tools.verno, &exprs));
    let mut bad = Vec::new();
    for ((e, k), v) in exprs.iter().zip(&k).zip(&v) {
        if jp::same(k, v) {
            continue;
        }
        // Kyverno's `jp query` shares state between the expressions of one run: judged alone.
        let one = std::slice::from_ref(e);
        let (k, v) = (batch(&tools.kyverno, one), batch(&tools.verno, one));
        if let (Some(k), Some(v)) = (k.first(), v.first())
            && !jp::same(k, v)
            && jp::intended(e, k, v).is_none()
        {
            bad.push(format!("{e}: kyverno {k:?}, verno {v:?}"));
        }
    }
    assert!(bad.is_empty(), "{} of 300 expressions disagree:\n{}", bad.len(), bad.join("\n"));
}
