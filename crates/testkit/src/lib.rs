//! Test support shared by Verno's crates: a dev-dependency only.
//!
//! The corpora the project is measured on (Kyverno's CLI suites, its chainsaw suite, the bench
//! set, Kyverno's CRDs) live in `../shared/` beside the checkout, not in the repository. A test
//! that reads one asks [`corpus`]: where the corpus is absent the test is skipped with a
//! message — unless `VERNO_CORPUS=required` (CI sets it), where an absent corpus fails the
//! test, so that CI can never pass by skipping what it was meant to check.

// Test support: failing a test by panicking is what this crate is for.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};

/// The environment variable that turns an absent corpus into a failure.
pub const REQUIRED_VAR: &str = "VERNO_CORPUS";

/// The workspace's root (where `Cargo.lock` is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `../shared/<rel>` beside the checkout when it is there. When it is not: `None` after saying
/// the test is skipped (`what`: what is not checked), or a panic when `VERNO_CORPUS=required`.
pub fn corpus(rel: &str, what: &str) -> Option<PathBuf> {
    let dir = workspace_root().join("../shared").join(rel);
    if dir.exists() {
        return Some(dir);
    }
    absent(&dir, what, std::env::var(REQUIRED_VAR).ok().as_deref() == Some("required"))
}

fn absent(dir: &Path, what: &str, required: bool) -> Option<PathBuf> {
    if required {
        panic!("{} is not there and {REQUIRED_VAR}=required: {what} cannot be checked", dir.display());
    }
    eprintln!("skipped: {} is not there: {what} is not checked", dir.display());
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_corpus_is_skipped_unless_required() {
        let nowhere = Path::new("/nonexistent/verno-corpus");
        assert_eq!(absent(nowhere, "nothing", false), None);
        let required = std::panic::catch_unwind(|| absent(nowhere, "nothing", true));
        assert!(required.is_err());
    }

    #[test]
    fn the_workspace_root_holds_the_lock_file() {
        assert!(workspace_root().join("Cargo.lock").is_file());
    }
}
