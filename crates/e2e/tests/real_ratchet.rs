//! The real-cluster chainsaw ratchet: every case listed in
//! `conformance/chainsaw-real-passing.txt` must keep passing when the real chainsaw runs it
//! against a real control plane (etcd, kube-apiserver, kube-controller-manager, kwok) with
//! Verno installed as a user installs it (`verno-chainsaw --real`, one control plane per case).
//! Two cases at a time: each brings up its own API server. Skipped, with a message, when
//! `../shared/chainsaw` is not present; the tools are built on first use (minutes on a fresh
//! machine, cached after).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const JOBS: usize = 2;

fn corpus() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/chainsaw");
    root.join("cases").is_dir().then_some(root)
}

#[test]
fn listed_chainsaw_cases_still_pass_on_a_real_control_plane() {
    let Some(root) = corpus() else {
        eprintln!("skipping the real-cluster chainsaw ratchet: ../shared/chainsaw is not present");
        return;
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    verno_e2e::real::install_tools(&repo).unwrap();
    if !repo.join(".tools/bin/chainsaw").is_file() {
        let out = Command::new("bash")
            .arg(repo.join("scripts/install-control-plane.sh"))
            .arg("chainsaw")
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "install-control-plane.sh chainsaw: {}", String::from_utf8_lossy(&out.stderr));
    }
    let manifest: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("manifest.json")).unwrap()).unwrap();
    let by_case: HashMap<String, Value> =
        manifest.into_iter().map(|c| (c["case"].as_str().unwrap().to_string(), c)).collect();
    let text = std::fs::read_to_string(repo.join("conformance/chainsaw-real-passing.txt")).unwrap_or_default();
    let cases: Vec<String> =
        text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.is_empty()).map(str::to_string).collect();
    assert!(!cases.is_empty(), "conformance/chainsaw-real-passing.txt lists no cases");
    let exe = Path::new(env!("CARGO_BIN_EXE_verno-chainsaw"));
    let verno = exe.with_file_name("verno");
    assert!(verno.is_file(), "{} is not built", verno.display());
    let queue = Mutex::new(cases.iter());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..JOBS {
            s.spawn(|| {
                loop {
                    let Some(case) = queue.lock().unwrap().next() else { return };
                    let Some(entry) = by_case.get(case) else {
                        failures.lock().unwrap().push(format!("{case}: not in the corpus manifest"));
                        continue;
                    };
                    // As in the fake ratchet, a failure is run once more before it counts (a
                    // policy can report Ready a moment before the API server calls its webhook
                    // rules); a retry is reported on stderr so flakiness stays visible.
                    let mut last = String::new();
                    let passed = (0..2).any(|attempt| {
                        let out = Command::new(exe)
                            .arg("--real")
                            .arg("--verno")
                            .arg(&verno)
                            .arg(root.join("cases").join(case))
                            .current_dir(root.join("cases"))
                            .env("CHAINSAW_CASE", case)
                            .env("CHAINSAW_CASE_JSON", entry.to_string())
                            .output()
                            .unwrap();
                        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                        let steps_ok = v["steps"].as_array().is_some_and(|s| {
                            s.len() == entry["steps"].as_u64().unwrap_or(0) as usize
                                && s.iter().all(|x| x["status"] == "pass")
                        });
                        let ok = out.status.code() == Some(0) && v["status"] == "pass" && steps_ok;
                        if !ok {
                            last = format!("{case}: {} {}", v["status"], v["reason"]);
                            if attempt == 0 {
                                eprintln!("real chainsaw ratchet: {last} — running it once more");
                            }
                        }
                        ok
                    });
                    if !passed {
                        failures.lock().unwrap().push(last);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} ratcheted real-cluster chainsaw cases regressed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
