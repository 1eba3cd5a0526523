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

/// The webhook path: the mutate webhook verifies and pins the digest, the validate webhook
/// checks `required`; a second request for the same image is answered from the cache (the
/// registry is gone by then). Prints what a verification and a cached answer cost.
#[test]
fn webhook_denies_unsigned_admits_signed_and_caches() {
    use base64::Engine as _;
    use std::sync::Arc;
    use verno_engine::{Compiled, Filter, Hook, PolicySet, Route};
    use verno_server::admission::ReviewOptions;

    struct Images(Arc<verno_images::Verifier>);
    impl verno_engine::Data for Images {
        fn image_verifier(&self) -> Option<Arc<dyn verno_engine::verify_images::ImageVerifier>> {
            Some(self.0.clone())
        }
    }

    let reg = Registry::start(None);
    let key = Key::generate();
    let signed = reg.push_image("acme/web", "v1", "web");
    sign(&reg, "acme/web", &signed, &key, &SignOpts::default());
    reg.push_image("acme/bare", "v1", "bare");
    let doc: serde_json::Value = serde_saphyr::from_str(&policy(&key, true)).unwrap();
    let set = match verno_engine::compile(&doc, &[]).unwrap() {
        Compiled::Policy(p) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        _ => panic!("a policy"),
    };
    let data = Images(Arc::new(
        verno_images::Verifier::new()
            .unwrap()
            .with_cache(verno_images::Cache::new(std::time::Duration::from_secs(3600), 1000)),
    ));
    let review = |object: &serde_json::Value| -> verno_api::AdmissionReview {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "default", "name": "app", "operation": "CREATE",
                "userInfo": {"username": "alice"}, "object": object}
        }))
        .unwrap()
    };
    let call = |hook: Hook, object: &serde_json::Value| {
        verno_server::admission::review_with(
            &set,
            Route::Kyverno(hook, Filter::All),
            &review(object),
            ReviewOptions { data: &data, ..ReviewOptions::default() },
        )
    };
    let pod_of = |image: &str| serde_saphyr::from_str::<serde_json::Value>(&pod(image)).unwrap();

    // Unsigned: refused by the mutate webhook with Kyverno's message.
    let bare = format!("{}/acme/bare:v1", reg.addr);
    let out = call(Hook::Mutate, &pod_of(&bare));
    let resp = out.review.response.clone().unwrap();
    assert!(!resp.allowed);
    let msg = resp.status.map(|s| s.message).unwrap_or_default();
    assert!(msg.contains("resource Pod/default/app was blocked due to the following policies"), "{msg}");
    assert!(
        msg.contains(&format!(
            "check-signature: 'failed to verify image {bare}: .attestors[0].entries[0].keys: no signatures found'"
        )) || msg.contains(&format!("failed to verify image {bare}")),
        "{msg}"
    );

    // Signed: admitted with the digest and the annotations as a JSON patch.
    let image = format!("{}/acme/web:v1", reg.addr);
    let out = call(Hook::Mutate, &pod_of(&image));
    let resp = out.review.response.clone().unwrap();
    assert!(resp.allowed, "{resp:?}");
    let patch =
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(resp.patch.unwrap()).unwrap()).unwrap();
    assert!(patch.contains(&format!("{image}@{signed}")), "{patch}");
    assert!(
        patch.contains("kyverno.io/verify-images-scoped") || patch.contains("kyverno.io~1verify-images-scoped"),
        "{patch}"
    );
    // The validate webhook sees the patched Pod and finds it verified.
    let mut patched = pod_of(&format!("{image}@{signed}"));
    let ops: Vec<serde_json::Value> = serde_json::from_str(&patch).unwrap();
    for op in &ops {
        if op["path"] == "/metadata/annotations" {
            patched["metadata"]["annotations"] = op["value"].clone();
        } else if let Some(k) = op["path"].as_str().and_then(|p| p.strip_prefix("/metadata/annotations/")) {
            patched["metadata"]["annotations"][k.replace("~1", "/")] = op["value"].clone();
        }
    }
    let out = call(Hook::Validate, &patched);
    assert!(out.review.response.unwrap().allowed);
    assert_eq!(data.0.cache().map(|c| c.len()), Some(1));

    // The cache: with mutateDigest off a pass is remembered with the digest it verified. A Pod
    // naming the image by that digest is answered from the cache once the registry is gone; one
    // naming it by tag is not (the tag could have moved to another image).
    let doc: serde_json::Value = serde_saphyr::from_str(&policy(&key, false)).unwrap();
    let set = match verno_engine::compile(&doc, &[]).unwrap() {
        Compiled::Policy(p) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        _ => panic!("a policy"),
    };
    let call = |object: &serde_json::Value| {
        verno_server::admission::review_with(
            &set,
            Route::Kyverno(Hook::Mutate, Filter::All),
            &review(object),
            ReviewOptions { data: &data, ..ReviewOptions::default() },
        )
    };
    let pinned = format!("{image}@{signed}");
    let started = std::time::Instant::now();
    assert!(call(&pod_of(&pinned)).review.response.unwrap().allowed);
    let first = started.elapsed();
    assert!(call(&pod_of(&image)).review.response.unwrap().allowed);
    drop(reg);
    let started = std::time::Instant::now();
    assert!(call(&pod_of(&pinned)).review.response.unwrap().allowed);
    let cached = started.elapsed();
    assert!(!call(&pod_of(&image)).review.response.unwrap().allowed, "a tag is not confirmed without the registry");
    // A different image is not in the cache and cannot be verified now.
    assert!(!call(&pod_of(&bare)).review.response.unwrap().allowed);
    println!("verifyImages webhook: first verification {first:?}, cached {cached:?}");
}

/// `verno test` with an ImageValidatingPolicy against the local registry: a signed image passes,
/// an unsigned one fails with the validation's message, an image the policy does not select is
/// left alone.
#[test]
fn test_command_runs_image_validating_policies() {
    let reg = Registry::start(None);
    let key = Key::generate();
    let signed = reg.push_image("acme/app", "v1", "signed");
    sign(&reg, "acme/app", &signed, &key, &SignOpts::default());
    reg.push_image("acme/unsigned", "v1", "unsigned");
    let dir = tempfile::tempdir().unwrap();
    let indented: String = key.pem.lines().map(|l| format!("            {l}\n")).collect();
    let policy = format!(
        r#"apiVersion: policies.kyverno.io/v1beta1
kind: ImageValidatingPolicy
metadata:
  name: signed-only
spec:
  validationActions: [Deny]
  validationConfigurations:
    verifyDigest: false
  credentials:
    allowInsecureRegistry: true
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
  matchImageReferences:
    - glob: "{addr}/*"
  attestors:
    - name: ours
      cosign:
        key:
          data: |
{indented}        ctlog:
          insecureIgnoreTlog: true
  validations:
    - expression: images.containers.map(i, verifyImageSignatures(i, [attestors.ours])).all(n, n > 0)
      message: not signed by our key
"#,
        addr = reg.addr
    );
    let pods = format!(
        "{}---\n{}---\n{}",
        pod(&format!("{}/acme/app:v1", reg.addr)).replace("name: app\n", "name: good\n"),
        pod(&format!("{}/acme/unsigned:v1", reg.addr)).replace("name: app\n", "name: bad\n"),
        pod("docker.io/library/busybox:1").replace("name: app\n", "name: elsewhere\n"),
    );
    let test = r#"apiVersion: cli.kyverno.io/v1alpha1
kind: Test
metadata:
  name: ivpol
policies: [policy.yaml]
resources: [pods.yaml]
results:
  - {isImageValidatingPolicy: true, kind: Pod, policy: signed-only, resources: [good], result: pass}
  - {isImageValidatingPolicy: true, kind: Pod, policy: signed-only, resources: [bad], result: fail}
  - {isImageValidatingPolicy: true, kind: Pod, policy: signed-only, resources: [elsewhere], result: fail}
"#;
    std::fs::write(dir.path().join("policy.yaml"), policy).unwrap();
    std::fs::write(dir.path().join("pods.yaml"), pods).unwrap();
    std::fs::write(dir.path().join("kyverno-test.yaml"), test).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verno")).args(["test", "."]).current_dir(dir.path()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The busybox Pod: nothing selected, so `required` has nothing to ask and the validation
    // holds vacuously — a pass, which the third row (expecting fail) must report as a mismatch.
    assert!(text.contains("Test Summary: 2 tests passed and 1 tests failed"), "{text}");
    assert!(text.contains("Want fail, got pass"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_verno"))
        .args(["apply", "policy.yaml", "-r", "pods.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("not signed by our key"), "{text}");
    assert!(text.contains("pass: 2, fail: 1"), "{text}");
}

/// `validate.manifests`: a Service signed in sigstore's k8s-manifest format (the YAML gzipped
/// and base64-encoded in `cosign.sigstore.dev/message`, one signature per signer) verifies with
/// both keys; a changed field, a missing second signature or another key does not.
#[test]
fn signed_manifests_verify_with_the_policy_keys() {
    use std::io::Write as _;
    let (alice, bob) = (Key::generate(), Key::generate());
    let manifest = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n    targetPort: 8080\n  selector:\n    app: web\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(manifest.as_bytes()).unwrap();
    let message = rig::b64(&gz.finish().unwrap());
    let sig = |k: &Key| rig::b64(&k.sign(manifest.as_bytes()));
    let signed = |sigs: &[String], selector: &str| {
        let mut ann = format!("    cosign.sigstore.dev/message: {message}\n");
        for (i, s) in sigs.iter().enumerate() {
            let suffix = if i == 0 { String::new() } else { format!("_{i}") };
            ann.push_str(&format!("    cosign.sigstore.dev/signature{suffix}: {s}\n"));
        }
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\n  annotations:\n{ann}spec:\n  type: ClusterIP\n  ports:\n  - port: 80\n    targetPort: 8080\n  selector:\n    app: {selector}\n"
        )
    };
    let keys = |k: &Key| k.pem.lines().map(|l| format!("                    {l}\n")).collect::<String>();
    let policy = format!(
        r#"apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: signed-services
spec:
  background: false
  rules:
    - name: both-signed
      match:
        any:
          - resources:
              kinds: [Service]
      validate:
        failureAction: Enforce
        manifests:
          attestors:
            - entries:
              - keys:
                  publicKeys: |-
{}              - keys:
                  publicKeys: |-
{}"#,
        keys(&alice),
        keys(&bob)
    );
    let dir = tempfile::tempdir().unwrap();
    let run = |resource: &str| {
        std::fs::write(dir.path().join("policy.yaml"), &policy).unwrap();
        std::fs::write(dir.path().join("svc.yaml"), resource).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_verno"))
            .args(["apply", "policy.yaml", "-r", "svc.yaml"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    // Both signatures, the object as admitted (with `type`, which the API server defaults).
    let out = run(&signed(&[sig(&alice), sig(&bob)], "web"));
    assert!(out.contains("pass: 1, fail: 0"), "{out}");
    // A field changed after signing.
    let out = run(&signed(&[sig(&alice), sig(&bob)], "other"));
    assert!(out.contains("pass: 0, fail: 1"), "{out}");
    assert!(out.contains(r#"diff found; {"items":[{"key":"spec.selector.app""#), "{out}");
    // Only one of the two signers.
    let out = run(&signed(&[sig(&alice)], "web"));
    assert!(out.contains("manifest verification failed; verifiedCount 1; requiredCount 2"), "{out}");
    // Signed by someone else.
    let out = run(&signed(&[sig(&Key::generate())], "web"));
    assert!(out.contains("verifiedCount 0; requiredCount 2"), "{out}");
    // No signature at all.
    let out = run("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector:\n    app: web\n");
    assert!(out.contains("YAML manifest not found for this resource"), "{out}");
}

/// ImageValidatingPolicy at admission: the mutating entry pins the digest (tag kept), the
/// validating entry verifies the pinned image; an unsigned image is refused with Kyverno's
/// `Policy <name> failed: <message>`.
#[test]
fn image_validating_policy_webhooks_pin_then_verify() {
    use base64::Engine as _;
    use std::sync::Arc;
    use verno_engine::{Compiled, Filter, Hook, PolicySet, Route};
    use verno_server::admission::ReviewOptions;

    struct Images(Arc<verno_images::Verifier>);
    impl verno_engine::Data for Images {
        fn image_verifier(&self) -> Option<Arc<dyn verno_engine::verify_images::ImageVerifier>> {
            Some(self.0.clone())
        }
    }
    let reg = Registry::start(None);
    let key = Key::generate();
    let signed = reg.push_image("acme/app", "v1", "signed");
    sign(&reg, "acme/app", &signed, &key, &SignOpts::default());
    reg.push_image("acme/unsigned", "v1", "unsigned");
    let doc = serde_json::json!({
        "apiVersion": "policies.kyverno.io/v1beta1", "kind": "ImageValidatingPolicy",
        "metadata": {"name": "signed-only"},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "credentials": {"allowInsecureRegistry": true},
            "matchImageReferences": [{"glob": format!("{}/*", reg.addr)}],
            "attestors": [{"name": "ours", "cosign": {"key": {"data": key.pem}, "ctlog": {"insecureIgnoreTlog": true}}}],
            "validations": [{"expression": "images.containers.all(i, verifyImageSignatures(i, [attestors.ours]) > 0)", "message": "not signed by our key"}],
        }
    });
    let set = match verno_engine::compile(&doc, &[]).unwrap() {
        Compiled::Policy(p) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        _ => panic!("a policy"),
    };
    let data = Images(Arc::new(verno_images::Verifier::new().unwrap()));
    let call = |hook: Hook, object: &serde_json::Value| {
        let review: verno_api::AdmissionReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "default", "name": "app", "operation": "CREATE",
                "userInfo": {"username": "alice"}, "object": object}
        }))
        .unwrap();
        let route = Route::Cel { hook, namespaced: false, names: Vec::new(), filter: Filter::All, image: true };
        verno_server::admission::review_with(
            &set,
            route,
            &review,
            ReviewOptions { data: &data, ..ReviewOptions::default() },
        )
        .review
        .response
        .unwrap()
    };
    let pod_of = |image: &str| serde_saphyr::from_str::<serde_json::Value>(&pod(image)).unwrap();
    let image = format!("{}/acme/app:v1", reg.addr);
    // Mutating entry: the digest pinned, nothing verified yet.
    let resp = call(Hook::Mutate, &pod_of(&image));
    assert!(resp.allowed, "{resp:?}");
    let patch =
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(resp.patch.unwrap()).unwrap()).unwrap();
    assert!(patch.contains(&format!("{image}@{signed}")), "{patch}");
    // Validating entry, on the pinned Pod: verified.
    let resp = call(Hook::Validate, &pod_of(&format!("{image}@{signed}")));
    assert!(resp.allowed, "{resp:?}");
    // Without the pin, verifyDigest refuses.
    let resp = call(Hook::Validate, &pod_of(&image));
    assert!(!resp.allowed);
    assert!(
        resp.status
            .unwrap()
            .message
            .contains(&format!("Policy signed-only failed: image {image} does not have a digest"))
    );
    // An unsigned image, pinned: refused with the validation's message.
    let bare = format!("{}/acme/unsigned:v1", reg.addr);
    let resp = call(Hook::Mutate, &pod_of(&bare));
    let patch =
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(resp.patch.unwrap()).unwrap()).unwrap();
    let pinned = patch.split("\"value\":\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let resp = call(Hook::Validate, &pod_of(&pinned));
    assert!(!resp.allowed);
    assert_eq!(resp.status.unwrap().message, "Policy signed-only failed: not signed by our key");
}

/// Attestor set counts and attestation conditions through `verno apply`, against the registry:
/// one of two keys is enough with `count: 1`, not without it; an attestation's predicate must
/// satisfy the conditions.
#[test]
fn counts_and_attestation_conditions_against_the_registry() {
    let reg = Registry::start(None);
    let (ours, theirs) = (Key::generate(), Key::generate());
    let digest = reg.push_image("acme/app", "v1", "app");
    sign(&reg, "acme/app", &digest, &ours, &SignOpts::default());
    rig::attest(
        &reg,
        "acme/app",
        &digest,
        &ours,
        "https://example.com/scan/v1",
        serde_json::json!({"critical": 0, "high": 2}),
    );
    let image = format!("{}/acme/app@{digest}", reg.addr);
    let keys = format!("{}{}", ours.pem, theirs.pem);
    let block =
        |text: &str, indent: usize| text.lines().map(|l| format!("{}{l}\n", " ".repeat(indent))).collect::<String>();
    let policy = |count: &str, max_high: u32| {
        format!(
            r#"apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: supply-chain
spec:
  validationFailureAction: Enforce
  rules:
    - name: signed-and-scanned
      match:
        any:
          - resources:
              kinds: [Pod]
      verifyImages:
        - imageReferences: ["127.0.0.1:*"]
          imageRegistryCredentials:
            allowInsecureRegistry: true
          attestors:
            - {count}entries:
                - keys:
                    publicKeys: |-
{keys}                    rekor:
                      ignoreTlog: true
          attestations:
            - type: https://example.com/scan/v1
              attestors:
                - entries:
                    - keys:
                        publicKeys: |-
{ours}                        rekor:
                          ignoreTlog: true
              conditions:
                - all:
                    - key: "{{{{ high }}}}"
                      operator: LessThanOrEquals
                      value: {max_high}
"#,
            keys = block(&keys, 22),
            ours = block(&ours.pem, 26),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let run = |policy: &str| {
        std::fs::write(dir.path().join("policy.yaml"), policy).unwrap();
        std::fs::write(dir.path().join("pod.yaml"), pod(&image)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_verno"))
            .args(["apply", "policy.yaml", "--resource", "pod.yaml"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    // count 1: our key is enough; the scan allows 2 high findings.
    let out = run(&policy("count: 1\n              ", 2));
    assert!(out.contains("pass: 2, fail: 0"), "{out}");
    // No count: both keys must have signed.
    let out = run(&policy("", 2));
    assert!(out.contains("failed to verify image"), "{out}");
    assert!(out.contains(".attestors[0].entries[1].keys: no matching signatures"), "{out}");
    // The scan's predicate does not satisfy a stricter condition.
    let out = run(&policy("count: 1\n              ", 1));
    assert!(out.contains("image attestations verification failed, verifiedCount: 0, requiredCount: 1"), "{out}");
    assert!(out.contains("attestation checks failed"), "{out}");
}
