//! `verno apply` with verifyImages rules against a real registry (plain HTTP on loopback,
//! allowed by the policy's `imageRegistryCredentials.allowInsecureRegistry`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

#[path = "../../images/tests/rig/mod.rs"]
mod rig;

use rig::{Key, Registry, SignOpts, sign};
use std::path::Path;
use std::process::Command;

fn policy(key: &Key, mutate_digest: bool) -> String {
    let indented: String = key.pem.lines().map(|l| format!("                      {l}\n")).collect();
    format!(
        r#"apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: signed-images
spec:
  validationFailureAction: Enforce
  webhookTimeoutSeconds: 30
  rules:
    - name: check-signature
      match:
        any:
          - resources:
              kinds: [Pod]
      verifyImages:
        - imageReferences: ["127.0.0.1:*"]
          mutateDigest: {mutate_digest}
          verifyDigest: false
          imageRegistryCredentials:
            allowInsecureRegistry: true
          attestors:
            - entries:
                - keys:
                    publicKeys: |-
{indented}                    rekor:
                      ignoreTlog: true
"#
    )
}

fn pod(image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\n  namespace: default\nspec:\n  containers:\n    - name: app\n      image: {image}\n"
    )
}

fn apply(dir: &Path, policy: &str, pod: &str) -> (Option<i32>, String) {
    std::fs::write(dir.join("policy.yaml"), policy).unwrap();
    std::fs::write(dir.join("pod.yaml"), pod).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verno"))
        .args(["apply", "policy.yaml", "--resource", "pod.yaml"])
        .current_dir(dir)
        .output()
        .unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn apply_verifies_signatures_in_a_local_registry() {
    let reg = Registry::start(None);
    let key = Key::generate();
    let signed = reg.push_image("acme/app", "v1", "signed");
    sign(&reg, "acme/app", &signed, &key, &SignOpts::default());
    reg.push_image("acme/unsigned", "v1", "unsigned");
    let dir = tempfile::tempdir().unwrap();
    let image = format!("{}/acme/app:v1", reg.addr);

    // Signed with the policy's key: pass, and the digest is pinned (tag kept).
    let (code, out) = apply(dir.path(), &policy(&key, true), &pod(&image));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pass: 2, fail: 0, warn: 0, error: 0, skip: 0"), "{out}");
    // (the printed YAML may fold the long image line)
    let flat: String = out.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(flat.contains(&format!("{image}@{signed}")), "{out}");
    assert!(out.contains("kyverno.io/verify-images"), "{out}");

    // Without mutateDigest the image is left as written.
    let (code, out) = apply(dir.path(), &policy(&key, false), &pod(&image));
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains(&format!("{image}@")), "{out}");

    // Another key: fail, with Kyverno's message.
    let (code, out) = apply(dir.path(), &policy(&Key::generate(), false), &pod(&image));
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("failed to verify image {image}: .attestors[0].entries[0].keys: no matching signatures")),
        "{out}"
    );

    // Unsigned: fail.
    let (code, out) = apply(dir.path(), &policy(&key, false), &pod(&format!("{}/acme/unsigned:v1", reg.addr)));
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains(".attestors[0].entries[0].keys: no signatures found"), "{out}");
}
