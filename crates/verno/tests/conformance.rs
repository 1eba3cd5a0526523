//! The conformance ratchet: every case listed in `conformance/passing.txt` must keep passing.
//! Runs the real binary on the development corpus in `../shared/conformance` (skipped, with a
//! message, when that corpus is not present).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus() -> Option<PathBuf> {
    verno_testkit::corpus("conformance/cases", "the conformance ratchet")
}

#[test]
fn listed_conformance_cases_still_pass() {
    let Some(cases) = corpus() else { return };
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/passing.txt");
    let text = std::fs::read_to_string(&list).unwrap_or_default();
    let mut failures = Vec::new();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (case, file) = line.split_once('\t').unwrap_or((line, "kyverno-test.yaml"));
        n += 1;
        let out = Command::new(env!("CARGO_BIN_EXE_verno"))
            .current_dir(&cases)
            .args(["test", case, "--file-name", file, "-o", "json"])
            .output();
        let Ok(out) = out else {
            failures.push(format!("{case}: could not run verno"));
            continue;
        };
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let rows = json["results"].as_array().cloned().unwrap_or_default();
        if out.status.code() != Some(0) || rows.is_empty() || rows.iter().any(|r| r["pass"] != true) {
            let bad: Vec<String> = rows
                .iter()
                .filter(|r| r["pass"] != true)
                .map(|r| format!("{} {} {}: {}", r["policy"], r["rule"], r["resource"], r["reason"]))
                .collect();
            failures.push(format!("{case} (exit {:?}): {}", out.status.code(), bad.join("; ")));
        }
    }
    assert!(n > 0, "conformance/passing.txt lists no cases");
    assert!(failures.is_empty(), "{} of {n} ratcheted cases regressed:\n{}", failures.len(), failures.join("\n"));
}
