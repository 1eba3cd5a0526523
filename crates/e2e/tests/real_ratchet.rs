//! The real-cluster chainsaw ratchet: every case listed in
//! `conformance/chainsaw-real-passing.txt` must keep passing when the real chainsaw runs it
//! against a real control plane (etcd, kube-apiserver, kube-controller-manager, kwok) with
//! Verno installed as a user installs it (`verno-chainsaw --real`, one control plane per case).
//! Two cases at a time: each brings up its own API server. Skipped, with a message, when
//! `../shared/chainsaw` is not present; the tools are built on first use (minutes on a fresh
//! machine, cached after).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

const JOBS: usize = 2;

fn corpus() -> Option<PathBuf> {
    verno_testkit::corpus("chainsaw/cases", "the real-cluster chainsaw ratchet")
        .and_then(|c| c.parent().map(Path::to_path_buf))
}

#[test]
fn listed_chainsaw_cases_still_pass_on_a_real_control_plane() {
    let Some(root) = corpus() else { return };
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
    common::run_listed(
        &root,
        &repo,
        "conformance/chainsaw-real-passing.txt",
        &["--real"],
        JOBS,
        "real chainsaw ratchet",
    );
}
