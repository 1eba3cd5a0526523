//! Kyverno's load-test set (`../shared/bench`): the busybox Pod is denied, the hardened
//! requests are allowed. Skipped when the shared directory is not beside this checkout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use std::path::{Path, PathBuf};
use verno_engine::{Filter, Hook, PolicySet, Route};
use verno_server::admission::review;

fn shared() -> Option<PathBuf> {
    verno_testkit::corpus("bench", "Kyverno's load-test set through the server")
}

fn pss17(dir: &Path) -> PolicySet {
    let mut policies = Vec::new();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir.join("policies/pss-17")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for doc in verno_jmespath::yaml::parse_all(&text).unwrap_or_default() {
            if let Ok(verno_engine::Compiled::Policy(c)) = verno_engine::compile(&doc, &[]) {
                policies.push(std::sync::Arc::new(c));
            }
        }
    }
    PolicySet::new(policies, Vec::new())
}

fn request(dir: &Path, name: &str) -> verno_api::AdmissionReview {
    verno_server::admission::parse(&std::fs::read(dir.join("requests").join(name)).unwrap()).unwrap()
}

#[test]
fn busybox_is_denied_and_hardened_requests_are_allowed() {
    let Some(dir) = shared() else { return };
    let set = pss17(&dir);
    assert_eq!(set.policies().len(), 17);
    let o = review(&set, Route::Kyverno(Hook::Validate, Filter::All), &request(&dir, "pod-busybox-create.json"));
    assert!(!o.allowed);
    let msg = o.review.response.as_ref().and_then(|r| r.status.as_ref()).map(|s| s.message.as_str()).unwrap_or("");
    assert!(
        msg.starts_with("\n\nresource Pod/testns/busybox-x7k2p was blocked due to the following policies \n\n"),
        "{msg}"
    );
    for p in ["disallow-privilege-escalation:", "require-run-as-nonroot:", "disallow-capabilities-strict:"] {
        assert!(msg.contains(p), "{p} missing from {msg}");
    }
    for name in ["pod-hardened-create.json", "deployment-hardened-create.json"] {
        let o = review(&set, Route::Kyverno(Hook::Validate, Filter::All), &request(&dir, name));
        assert!(o.allowed, "{name}: {:?}", o.review);
    }
}
