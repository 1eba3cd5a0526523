//! Kyverno's load-test set (`../shared/bench`): the busybox Pod is denied, the hardened
//! requests are allowed. Skipped when the shared directory is not beside this checkout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::Value;
use std::path::{Path, PathBuf};
use verno_server::admission::{Filter, Hook, PolicySet, review};

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench");
    p.is_dir().then_some(p)
}

fn pss17(dir: &Path) -> PolicySet {
    let mut set = PolicySet::default();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir.join("policies/pss-17")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for doc in verno_jmespath::yaml::parse_all(&text).unwrap_or_default() {
            if let Some(c) = serde_json::from_value(doc).ok().and_then(|p| verno_engine::compile_policy(&p).ok()) {
                set.policies.push(c);
            }
        }
    }
    set
}

fn request(dir: &Path, name: &str) -> Value {
    std::fs::read_to_string(dir.join("requests").join(name))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

#[test]
fn busybox_is_denied_and_hardened_requests_are_allowed() {
    let Some(dir) = shared() else {
        eprintln!("skipping: ../shared/bench not found");
        return;
    };
    let set = pss17(&dir);
    assert_eq!(set.policies.len(), 17);
    let o = review(&set, Hook::Validate, Filter::All, &request(&dir, "pod-busybox-create.json"));
    assert!(!o.allowed);
    let msg = o.review["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with("\n\nresource Pod/testns/busybox-x7k2p was blocked due to the following policies \n\n"),
        "{msg}"
    );
    for p in ["disallow-privilege-escalation:", "require-run-as-nonroot:", "disallow-capabilities-strict:"] {
        assert!(msg.contains(p), "{p} missing from {msg}");
    }
    for name in ["pod-hardened-create.json", "deployment-hardened-create.json"] {
        let o = review(&set, Hook::Validate, Filter::All, &request(&dir, name));
        assert!(o.allowed, "{name}: {}", o.review);
    }
}
