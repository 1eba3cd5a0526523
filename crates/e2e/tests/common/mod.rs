//! The body both chainsaw ratchets share: every case a list names must pass when the runner
//! beside this test (with `extra` arguments) runs it, `jobs` at a time; a failure is run once
//! more before it counts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

pub fn run_listed(root: &Path, repo: &Path, list: &str, extra: &[&str], jobs: usize, label: &str) {
    let manifest: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("manifest.json")).unwrap()).unwrap();
    let by_case: HashMap<String, Value> =
        manifest.into_iter().map(|c| (c["case"].as_str().unwrap().to_string(), c)).collect();
    let text = std::fs::read_to_string(repo.join(list)).unwrap_or_default();
    let cases: Vec<String> =
        text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.is_empty()).map(str::to_string).collect();
    assert!(!cases.is_empty(), "{list} lists no cases", list = list);
    let exe = Path::new(env!("CARGO_BIN_EXE_verno-chainsaw"));
    let verno = exe.with_file_name("verno");
    assert!(verno.is_file(), "{} is not built", verno.display());
    let queue = Mutex::new(cases.iter());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let Some(case) = queue.lock().unwrap().next() else { return };
                    let Some(entry) = by_case.get(case) else {
                        failures.lock().unwrap().push(format!("{case}: not in the corpus manifest"));
                        continue;
                    };
                    // A case that fails is run once more before it counts as a regression:
                    // Verno's readiness has a known race (a policy can report Ready before its
                    // webhook rules are in place), which a fresh run
                    // usually misses. A retry is reported on stderr so flakiness stays visible.
                    let mut last = String::new();
                    let passed = (0..2).any(|attempt| {
                        let out = Command::new(exe)
                            .args(extra)
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
                                eprintln!("{label}: {last} — running it once more");
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
        "{} of {} cases of {list} regressed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
