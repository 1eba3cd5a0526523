//! The runner on Verno's own fixture (`testdata/chainsaw/require-team-label`): it passes as
//! written, and fails when one expected value is changed or an `error` step finds a match, so
//! the runner cannot pass what chainsaw would fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/chainsaw")
}

/// The pinned kubectl the runner puts first on scripts' PATH, installed once when missing.
fn ensure_kubectl() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if !root.join(".tools/bin/kubectl").exists() {
            let out =
                Command::new("bash").arg(root.join("scripts/install-kubectl.sh")).current_dir(&root).output().unwrap();
            assert!(out.status.success(), "install-kubectl.sh: {}", String::from_utf8_lossy(&out.stderr));
        }
    });
}

/// Runs the runner on `case` (with Verno built beside it) and returns its JSON and exit code.
fn run(case: &Path) -> (Value, Option<i32>) {
    ensure_kubectl();
    let exe = Path::new(env!("CARGO_BIN_EXE_verno-chainsaw"));
    let verno = exe.with_file_name("verno");
    assert!(verno.is_file(), "{} is not built (cargo test --workspace builds it)", verno.display());
    let out = Command::new(exe).arg("--verno").arg(&verno).arg(case).output().unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (json, out.status.code())
}

/// A copy of the fixture (and the configuration above it) with `edit` applied to one file.
fn variant(file: &str, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures().join(".chainsaw.yaml"), dir.path().join(".chainsaw.yaml")).unwrap();
    let case = dir.path().join("case");
    std::fs::create_dir(&case).unwrap();
    for e in std::fs::read_dir(fixtures().join("require-team-label")).unwrap() {
        let e = e.unwrap();
        let text = std::fs::read_to_string(e.path()).unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        let text = if name == file { edit(&text) } else { text };
        std::fs::write(case.join(&name), text).unwrap();
    }
    dir
}

fn statuses(v: &Value) -> Vec<String> {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}={}", s["name"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect()
}

#[test]
fn the_fixture_passes_as_written() {
    let (v, code) = run(&fixtures().join("require-team-label"));
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["status"], "pass", "{v}");
    assert_eq!(statuses(&v), ["policy=pass", "pods=pass", "kubectl=pass"]);
}

/// The fixture with `from` replaced by `to` in `file` fails in its `pods` step; its JSON.
fn fails_in_the_pods_step(file: &str, from: &str, to: &str) -> Value {
    let dir = variant(file, |t| t.replace(from, to));
    let (v, code) = run(&dir.path().join("case"));
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["status"], "fail", "{v}");
    assert_eq!(statuses(&v), ["policy=pass", "pods=fail", "kubectl=skipped"]);
    v
}

#[test]
fn one_changed_expected_value_fails_the_test() {
    let v = fails_in_the_pods_step("pod-good-assert.yaml", "team: payments", "team: billing");
    assert!(v["reason"].as_str().unwrap().contains("metadata.labels.team"), "{v}");
}

#[test]
fn an_error_step_that_finds_a_match_fails_the_test() {
    fails_in_the_pods_step("pod-bad-assert.yaml", "name: bad", "name: good");
}

#[test]
fn an_expected_denial_that_does_not_come_fails_the_test() {
    fails_in_the_pods_step("policy.yaml", "Enforce", "Audit");
}
