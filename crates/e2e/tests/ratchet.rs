//! The chainsaw ratchet: every case listed in `conformance/chainsaw-passing.txt` must keep
//! passing. Runs the runner (and the Verno built beside it) on Kyverno's suite in
//! `../shared/chainsaw`, four cases at a time (skipped, with a message, when that corpus is not
//! present).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

const JOBS: usize = 4;

fn corpus() -> Option<PathBuf> {
    verno_testkit::corpus("chainsaw/cases", "the chainsaw ratchet").and_then(|c| c.parent().map(Path::to_path_buf))
}

#[test]
fn listed_chainsaw_cases_still_pass() {
    let Some(root) = corpus() else { return };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !repo.join(".tools/bin/kubectl").exists() {
        let out =
            Command::new("bash").arg(repo.join("scripts/install-kubectl.sh")).current_dir(&repo).output().unwrap();
        assert!(out.status.success(), "install-kubectl.sh: {}", String::from_utf8_lossy(&out.stderr));
    }
    common::run_listed(&root, &repo, "conformance/chainsaw-passing.txt", &[], JOBS, "chainsaw ratchet");
}
