//! The verify and validate steps against a scripted verifier (no registry): which images are
//! checked, attestor set counts, attestation conditions, digests, annotations, the cache and
//! the messages.

use super::*;
use crate::{Compiled, NoData, PolicySet, Scope, compile};
use std::sync::{Arc, Mutex};
use verno_api::images::RegistryCredentials;

/// Answers per (image, key or attestation type); records what it was asked.
#[derive(Default)]
struct Scripted {
    answers: Vec<(String, String, Result<Verified, ImageError>)>,
    digests: Vec<(String, String)>,
    asked: Mutex<Vec<String>>,
    cache: Mutex<Vec<(String, String)>>,
}

impl Scripted {
    fn answer(mut self, image: &str, who: &str, r: Result<Verified, ImageError>) -> Self {
        self.answers.push((image.into(), who.into(), r));
        self
    }
}

fn who(check: &SignatureCheck) -> String {
    if let Some(t) = check.attestation {
        return t.to_string();
    }
    check.attestor.keys.as_ref().map(|k| k.public_keys.clone()).unwrap_or_default()
}

impl ImageVerifier for Scripted {
    fn verify(&self, check: &SignatureCheck) -> Result<Verified, ImageError> {
        let w = who(check);
        self.asked.lock().map(|mut a| a.push(format!("{} {w}", check.image))).ok();
        self.answers
            .iter()
            .find(|(i, k, _)| i == check.image && *k == w)
            .map(|(_, _, r)| r.clone())
            .unwrap_or_else(|| Err(ImageError::Failed("no signatures found".into())))
    }
    fn digest(&self, image: &str, _: Option<&RegistryCredentials>, _: &str) -> Result<String, ImageError> {
        self.digests
            .iter()
            .find(|(i, _)| i == image)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| ImageError::Unreachable(format!("dial tcp: lookup for {image}")))
    }
    fn image_data(&self, image: &str, _: Option<&RegistryCredentials>, _: &str) -> Result<Value, ImageError> {
        match image {
            "ghcr.io/acme/app:v1" => {
                Ok(json!({"image": image, "registry": "ghcr.io", "configData": {"config": {"User": "1000"}}}))
            }
            "ghcr.io/acme/root:v1" => Ok(json!({"image": image, "registry": "ghcr.io", "configData": {"config": {}}})),
            _ => Err(ImageError::Unreachable(format!("dial tcp: lookup for {image}"))),
        }
    }
    fn cached(&self, key: &str) -> Option<String> {
        self.cache.lock().ok()?.iter().find(|(k, _)| k == key).map(|(_, d)| d.clone())
    }
    fn remember(&self, key: &str, digest: &str) {
        self.cache.lock().map(|mut c| c.push((key.to_string(), digest.to_string()))).ok();
    }
}

/// A data port whose verifier is the scripted one (shared, so the test can look at it after).
struct WithVerifier(Arc<Scripted>);
impl Data for WithVerifier {
    fn image_verifier(&self) -> Option<Arc<dyn ImageVerifier>> {
        Some(self.0.clone())
    }
    fn image_data(&self, image: &str, credentials: Option<&RegistryCredentials>) -> crate::Loaded {
        match self.0.image_data(image, credentials, "") {
            Ok(v) => crate::Loaded::Value(v),
            Err(e) => crate::Loaded::Error(e.message().to_string()),
        }
    }
}

const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn policy(verify: Value) -> PolicySet {
    let doc = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "check-images", "uid": "u1", "resourceVersion": "7"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{
            "name": "signed",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "verifyImages": verify,
        }]}
    });
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("compile: {other:?}"),
    }
}

fn pod(images: &[&str]) -> Value {
    let containers: Vec<Value> =
        images.iter().enumerate().map(|(i, im)| json!({"name": format!("c{i}"), "image": im})).collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers}})
}

/// (status, message) of every response of the rule, verify phase first.
fn run(set: &PolicySet, object: &Value, data: &dyn Data) -> (Vec<(Status, String)>, crate::Outcome) {
    let req = Request::new(crate::Operation::Create, object);
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, data, &mut ());
    let rows = out.responses.iter().flat_map(|(_, r)| r.rules.iter().map(|x| (x.status, x.message.clone()))).collect();
    (rows, out)
}

fn keyed(key: &str) -> Value {
    json!({"entries": [{"keys": {"publicKeys": key, "rekor": {"ignoreTlog": true}}}]})
}

#[test]
fn required_without_any_verification_fails_as_unverified() {
    let set =
        policy(json!([{"imageReferences": ["*"], "mutateDigest": false, "verifyDigest": false, "required": true}]));
    let (rows, out) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &NoData);
    assert_eq!(rows, vec![(Status::Fail, "unverified image ghcr.io/acme/app:v1".to_string())]);
    assert!(!out.allowed());
}

#[test]
fn a_signed_image_gets_its_digest_and_the_annotations() {
    let set = policy(json!([{"imageReferences": ["ghcr.io/acme/*"], "attestors": [keyed("K1")]}]));
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        "K1",
        Ok(Verified { digest: D.into(), statements: vec![] }),
    ));
    let (rows, out) = run(&set, &pod(&["ghcr.io/acme/app:v1", "docker.io/library/busybox"]), &WithVerifier(v.clone()));
    assert_eq!(
        rows,
        vec![
            (Status::Pass, "verified image signatures for ghcr.io/acme/app:v1".to_string()),
            (Status::Pass, "image verified".to_string()),
        ]
    );
    let patched = out.patched.clone().expect("patched");
    assert_eq!(patched.pointer("/spec/containers/0/image"), Some(&json!(format!("ghcr.io/acme/app:v1@{D}"))));
    assert_eq!(patched.pointer("/spec/containers/1/image"), Some(&json!("docker.io/library/busybox")));
    let ann = patched.pointer("/metadata/annotations").expect("annotations");
    let image = format!("ghcr.io/acme/app@{D}");
    assert_eq!(ann[ANNOTATION], json!(json!({image.clone(): "pass"}).to_string()));
    assert_eq!(
        ann[ANNOTATION_SCOPED],
        json!(format!(r#"{{"version":1,"policies":{{"/check-images":{{"signed":{{"{image}":"pass"}}}}}}}}"#))
    );
    assert!(out.allowed());
}

#[test]
fn wrong_key_fails_and_blocks_with_the_attestor_path() {
    let set = policy(json!([{"imageReferences": ["*"], "attestors": [keyed("K2")]}]));
    let v = Arc::new(Scripted::default());
    let (rows, out) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    // As Kyverno: the digest is still looked up for mutateDigest, and its error comes first.
    assert_eq!(rows[0].1, "failed to update digest: dial tcp: lookup for ghcr.io/acme/app:v1");
    assert_eq!(
        rows[1],
        (
            Status::Fail,
            "failed to verify image ghcr.io/acme/app:v1: .attestors[0].entries[0].keys: no signatures found"
                .to_string()
        )
    );
    assert!(!out.allowed());
    assert!(out.blocked.contains_key("check-images"));
}

#[test]
fn an_unreachable_registry_is_an_error_not_a_failure() {
    let set = policy(json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": false}]));
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        "K1",
        Err(ImageError::Unreachable("connection refused".into())),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0].0, Status::Error);
    assert_eq!(
        rows[0].1,
        "failed to verify image ghcr.io/acme/app:v1: .attestors[0].entries[0].keys: connection refused"
    );
    // Without a verifier at all (no registry access): an error too.
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &NoData);
    assert_eq!(rows[0].0, Status::Error);
}

#[test]
fn count_one_of_two_keys_passes_when_either_signed() {
    let keys = "-----BEGIN PUBLIC KEY-----\nAAA\n-----END PUBLIC KEY-----\n-----BEGIN PUBLIC KEY-----\nBBB\n-----END PUBLIC KEY-----";
    let set = policy(json!([{"imageReferences": ["*"], "mutateDigest": false, "verifyDigest": false,
        "attestors": [{"count": 1, "entries": [{"keys": {"publicKeys": keys}}]}]}]));
    let second = "-----BEGIN PUBLIC KEY-----\nBBB\n-----END PUBLIC KEY-----";
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        second,
        Ok(Verified { digest: D.into(), statements: vec![] }),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0].0, Status::Pass, "{rows:?}");
    // Without a count both must verify.
    let set = policy(json!([{"imageReferences": ["*"], "mutateDigest": false, "verifyDigest": false,
        "attestors": [{"entries": [{"keys": {"publicKeys": keys}}]}]}]));
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        second,
        Ok(Verified { digest: D.into(), statements: vec![] }),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0].0, Status::Fail, "{rows:?}");
}

#[test]
fn attestation_conditions_read_the_predicate() {
    let set = policy(json!([{"imageReferences": ["*"], "mutateDigest": false, "verifyDigest": false,
        "attestations": [{"type": "https://example.com/scan/v1", "name": "scan",
            "conditions": [{"all": [{"key": "{{ vulnerabilities }}", "operator": "Equals", "value": 0}]}]}]}]));
    let statement = |n: i64| {
        Ok(Verified {
            digest: D.into(),
            statements: vec![
                json!({"predicateType": "https://example.com/scan/v1", "predicate": {"vulnerabilities": n}}),
            ],
        })
    };
    let v = Arc::new(Scripted::default().answer("ghcr.io/acme/app:v1", "https://example.com/scan/v1", statement(0)));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0], (Status::Pass, format!("verified image attestations for ghcr.io/acme/app@{D}")));
    let v = Arc::new(Scripted::default().answer("ghcr.io/acme/app:v1", "https://example.com/scan/v1", statement(3)));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0].0, Status::Fail);
    assert!(
        rows[0].1.starts_with("image attestations verification failed, verifiedCount: 0, requiredCount: 1, error: .attestations[0].attestors[0].entries[0]: attestation checks failed for ghcr.io/acme/app@sha256:"),
        "{}",
        rows[0].1
    );
    // A statement of another type is not there.
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        "https://example.com/scan/v1",
        Ok(Verified { digest: D.into(), statements: vec![json!({"predicateType": "https://other", "predicate": {}})] }),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert!(rows[0].1.contains("attestions not found for predicate type https://example.com/scan/v1"), "{}", rows[0].1);
}

#[test]
fn skipped_references_and_digest_checks() {
    let set = policy(json!([{"imageReferences": ["*"], "skipImageReferences": ["ghcr.io/trusted/*"],
        "attestors": [keyed("K1")], "mutateDigest": false}]));
    let v = Arc::new(Scripted::default());
    let (rows, _) = run(&set, &pod(&["ghcr.io/trusted/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(
        rows[0],
        (
            Status::Skip,
            "skipping image reference image ghcr.io/trusted/app:v1, policy check-images ruleName signed".to_string()
        )
    );
    // verifyDigest: an image without a digest fails validation.
    assert_eq!(rows[1], (Status::Fail, "missing digest for ghcr.io/trusted/app:v1".to_string()));
}

#[test]
fn the_cache_answers_the_second_request() {
    let set = policy(
        json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": false, "verifyDigest": false}]),
    );
    let mut v =
        Scripted::default().answer("ghcr.io/acme/app:v1", "K1", Ok(Verified { digest: D.into(), statements: vec![] }));
    v.digests.push(("ghcr.io/acme/app:v1".into(), D.into()));
    let v = Arc::new(v);
    let (first, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    let (second, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(first[0].1, "verified image signatures for ghcr.io/acme/app:v1");
    assert_eq!(second[0], (Status::Pass, "verified from cache".to_string()));
    assert_eq!(v.asked.lock().map(|a| a.len()).unwrap_or(0), 1);
    assert_eq!(
        v.cache.lock().map(|c| c.clone()).unwrap_or_default(),
        vec![("u1;7;signed;ghcr.io/acme/app:v1".to_string(), D.to_string())]
    );
    // useCache: false never asks the cache.
    let set = policy(
        json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": false, "verifyDigest": false, "useCache": false}]),
    );
    let (third, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(third[0].1, "verified image signatures for ghcr.io/acme/app:v1");
}

#[test]
fn an_unchanged_image_verified_before_is_not_checked_again() {
    let set = policy(
        json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": false, "verifyDigest": false}]),
    );
    let mut old = pod(&["ghcr.io/acme/app:v1"]);
    old["metadata"]["annotations"] = json!({ANNOTATION_SCOPED: json!({"version": 1, "policies": {"/check-images": {"signed": {"ghcr.io/acme/app:v1": "pass"}}}}).to_string()});
    let new = old.clone();
    let v = Arc::new(Scripted::default());
    let req = Request { old_object: Some(&old), ..Request::new(crate::Operation::Update, &new) };
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &WithVerifier(v.clone()), &mut ());
    assert!(out.allowed(), "{:?}", out.responses);
    assert!(v.asked.lock().map(|a| a.is_empty()).unwrap_or(false));
}

#[test]
fn policy_checks_as_kyverno() {
    let bad = |verify: Value| {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "x"},
            "spec": {"validationFailureAction": "Audit", "rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "verifyImages": verify}]}});
        match compile(&doc, &[]) {
            Err(e) => e.to_string(),
            Ok(_) => String::new(),
        }
    };
    assert!(
        bad(json!([{"imageReferences": ["*"]}]))
            .contains("mutateDigest must be set to false for ‘Audit’ failure action")
    );
    assert!(bad(json!([{"mutateDigest": false}])).contains("An image reference is required"));
    assert!(bad(json!([{"imageReferences": ["*"], "mutateDigest": false, "attestors": [{"count": 2, "entries": [{"keys": {"publicKeys": "k"}}]}]}])).contains("Count cannot exceed length of entries"));
    assert!(
        bad(json!([{"imageReferences": ["*"], "mutateDigest": false, "attestors": [{"entries": [{}]}]}]))
            .contains("keys, certificates, keyless, or a nested attestor is required")
    );
    assert!(bad(json!([{"imageReferences": ["*"], "mutateDigest": false, "bogus": 1}])).contains("bogus"));
    assert_eq!(bad(json!([{"imageReferences": ["*"], "mutateDigest": false}])), "");
    // No validationFailureAction is Audit too; a rule matching every kind cannot verify images.
    let doc = |kinds: Value, action: Value| {
        let mut d = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "x"},
            "spec": {"background": false, "rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": kinds}}]},
                "verifyImages": [{"imageReferences": ["*"]}]}]}});
        if !action.is_null() {
            d["spec"]["validationFailureAction"] = action;
        }
        compile(&d, &[]).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(doc(json!(["Pod"]), Value::Null).contains("mutateDigest must be set to false"));
    assert_eq!(doc(json!(["Pod"]), json!("Enforce")), "");
    assert!(doc(json!(["*"]), json!("Enforce")).contains("wildcard policy does not support rule type"));
}

#[test]
fn nested_attestor_sets() {
    let nested = json!({"count": 1, "entries": [{"keys": {"publicKeys": "K1"}}, {"keys": {"publicKeys": "K2"}}]});
    let set = policy(json!([{"imageReferences": ["*"], "mutateDigest": false, "verifyDigest": false,
        "attestors": [{"entries": [{"attestor": nested}]}]}]));
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        "K2",
        Ok(Verified { digest: D.into(), statements: vec![] }),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows[0].0, Status::Pass, "{rows:?}");
}

#[test]
fn image_extractors_find_images_in_custom_resources() {
    let doc = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "tasks"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{
            "name": "signed-steps",
            "match": {"any": [{"resources": {"kinds": ["tekton.dev/v1beta1/Task"]}}]},
            "imageExtractors": {"Task": [
                {"path": "/spec/steps/*/image", "name": "steps"},
                {"path": "/spec/sidecars/*", "value": "ref", "key": "name", "jmesPath": "trim_prefix(@, 'oci://')"}
            ]},
            "verifyImages": [{"imageReferences": ["ghcr.io/*"], "verifyDigest": false, "attestors": [keyed("K1")]}],
        }]}
    });
    let set = match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("compile: {other:?}"),
    };
    let task = json!({"apiVersion": "tekton.dev/v1beta1", "kind": "Task", "metadata": {"name": "t", "namespace": "ci"},
        "spec": {"steps": [{"name": "a", "image": "ghcr.io/acme/step:v1"}, {"name": "b", "image": "docker.io/library/alpine"}],
                 "sidecars": [{"name": "s", "ref": "oci://ghcr.io/acme/side:v2"}]}});
    let v = Arc::new(
        Scripted::default()
            .answer("ghcr.io/acme/step:v1", "K1", Ok(Verified { digest: D.into(), statements: vec![] }))
            .answer("ghcr.io/acme/side:v2", "K1", Ok(Verified { digest: D.into(), statements: vec![] })),
    );
    let (rows, out) = run(&set, &task, &WithVerifier(v.clone()));
    assert_eq!(rows.iter().filter(|r| r.0 == Status::Pass).count(), 3, "{rows:?}");
    let patched = out.patched.clone().expect("patched");
    assert_eq!(patched.pointer("/spec/steps/0/image"), Some(&json!(format!("ghcr.io/acme/step:v1@{D}"))));
    assert_eq!(patched.pointer("/spec/steps/1/image"), Some(&json!("docker.io/library/alpine")));
    // The sidecar's image came through jmesPath: its digest goes where the reference was read.
    assert_eq!(patched.pointer("/spec/sidecars/0/ref"), Some(&json!(format!("ghcr.io/acme/side:v2@{D}"))));
}

// ---- ImageValidatingPolicy ----

fn ivpol(spec: Value) -> PolicySet {
    let mut spec = spec;
    spec["matchConstraints"] = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]});
    let doc = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "ImageValidatingPolicy",
        "metadata": {"name": "signed"}, "spec": spec});
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        other => panic!("compile: {other:?}"),
    }
}

fn cosign_key(key: &str) -> Value {
    json!({"name": "k", "cosign": {"key": {"data": key}, "ctlog": {"insecureIgnoreTlog": true}}})
}

#[test]
fn image_validating_policy_verifies_through_the_port() {
    let set = ivpol(json!({
        "validationConfigurations": {"verifyDigest": false},
        "matchImageReferences": [{"glob": "ghcr.io/*"}],
        "attestors": [cosign_key("K1")],
        "validations": [{"expression": "images.containers.map(i, verifyImageSignatures(i, [attestors.k])).all(n, n > 0)",
            "message": "unsigned"}],
    }));
    let v = Arc::new(Scripted::default().answer(
        "ghcr.io/acme/app:v1",
        "K1",
        Ok(Verified { digest: D.into(), statements: vec![] }),
    ));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1", "docker.io/library/busybox:1"]), &WithVerifier(v.clone()));
    assert_eq!(rows, vec![(Status::Pass, "success".to_string())]);
    let (rows, out) = run(&set, &pod(&["ghcr.io/acme/other:v1"]), &WithVerifier(v.clone()));
    assert_eq!(rows, vec![(Status::Fail, "unsigned".to_string())]);
    assert!(!out.allowed());
    // No registry access at all: an error, not a failure.
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &NoData);
    assert_eq!(rows[0].0, Status::Error, "{rows:?}");
    assert!(rows[0].1.contains("failed to get imagedata"), "{rows:?}");
}

#[test]
fn image_validating_policy_digests_required_and_attestations() {
    // verifyDigest (the default): a tag is not enough.
    let set = ivpol(json!({"attestors": [cosign_key("K1")], "validations": [{"expression": "true"}]}));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &NoData);
    assert_eq!(rows, vec![(Status::Fail, "image ghcr.io/acme/app:v1 does not have a digest".to_string())]);
    // required (the default): validations that verify nothing do not pass an image.
    let set =
        ivpol(json!({"validationConfigurations": {"verifyDigest": false}, "validations": [{"expression": "true"}]}));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &NoData);
    assert_eq!(
        rows,
        vec![(
            Status::Fail,
            "image ghcr.io/acme/app:v1 is not verified: no policy performed a signature or attestation check on it"
                .to_string()
        )]
    );
    // Attestations: verified, then their payload read.
    let set = ivpol(json!({
        "validationConfigurations": {"verifyDigest": false},
        "attestors": [cosign_key("K1")],
        "attestations": [{"name": "sbom", "intoto": {"type": "https://cyclonedx.org/bom"}}],
        "validations": [
            {"expression": "images.containers.all(i, verifyAttestationSignatures(i, attestations.sbom, [attestors.k]) > 0)", "message": "no sbom"},
            {"expression": "images.containers.all(i, extractPayload(i, attestations.sbom).bomFormat == 'CycloneDX')", "message": "not cyclonedx"},
        ],
    }));
    let stmt = |fmt: &str| {
        Ok(Verified {
            digest: D.into(),
            statements: vec![json!({"predicateType": "https://cyclonedx.org/bom", "predicate": {"bomFormat": fmt}})],
        })
    };
    let v = Arc::new(Scripted::default().answer("ghcr.io/acme/app:v1", "https://cyclonedx.org/bom", stmt("CycloneDX")));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v));
    assert_eq!(rows, vec![(Status::Pass, "success".to_string())]);
    let v = Arc::new(Scripted::default().answer("ghcr.io/acme/app:v1", "https://cyclonedx.org/bom", stmt("SPDX")));
    let (rows, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(v));
    assert_eq!(rows, vec![(Status::Fail, "not cyclonedx".to_string())]);
}

#[test]
fn image_validating_policy_checks() {
    let bad = |spec: Value| {
        let mut spec = spec;
        spec["matchConstraints"] = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]});
        let doc = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "ImageValidatingPolicy", "metadata": {"name": "x"}, "spec": spec});
        compile(&doc, &[]).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(bad(json!({"attestors": [{"name": "a"}]})).contains("exactly one of cosign or notary"));
    assert!(bad(json!({"matchImageReferences": [{}]})).contains("exactly one of glob or expression"));
    assert!(bad(json!({"bogus": 1})).contains("unknown field"));
    assert_eq!(bad(json!({"validations": [{"expression": "true"}]})), "");
}

/// A tag moved to an unsigned image after a pass was cached. The cached pass
/// holds only for the digest it verified: with mutateDigest the Pod is pinned to the verified
/// digest (not the tag's new one); without it, the tag is resolved and, having moved, the
/// image is verified again — and fails.
#[test]
fn a_retagged_unsigned_image_is_not_passed_from_the_cache() {
    const UNSIGNED: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    // The registry while the tag names the signed image.
    let signed = || {
        let mut v = Scripted::default().answer(
            "ghcr.io/acme/app:v1",
            "K1",
            Ok(Verified { digest: D.into(), statements: vec![] }),
        );
        v.digests.push(("ghcr.io/acme/app:v1".into(), D.into()));
        Arc::new(v)
    };
    // The same registry after the tag moved to an unsigned image: no signatures for it, and
    // the cache the first verifier filled.
    let moved = |before: &Scripted| {
        let mut m = Scripted::default();
        m.digests.push(("ghcr.io/acme/app:v1".into(), UNSIGNED.into()));
        *m.cache.lock().unwrap() = before.cache.lock().unwrap().clone();
        Arc::new(m)
    };
    let image_of = |out: &crate::Outcome| out.patched.as_ref().map(|p| p["spec"]["containers"][0]["image"].clone());
    let pinned = json!(format!("ghcr.io/acme/app:v1@{D}"));

    // Pinned: the second Pod gets the verified digest, never the tag's new one.
    let set = policy(
        json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": true, "verifyDigest": false}]),
    );
    let before = signed();
    let (first, out) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(before.clone()));
    assert_eq!(first[0].0, Status::Pass, "{first:?}");
    assert_eq!(image_of(&out), Some(pinned.clone()));
    let after = moved(&before);
    let (second, out) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(after.clone()));
    assert_eq!(second[0], (Status::Pass, "verified from cache".to_string()));
    assert_eq!(image_of(&out), Some(pinned));

    // Not pinned: the moved tag is verified again, and the unsigned image fails.
    let set = policy(
        json!([{"imageReferences": ["*"], "attestors": [keyed("K1")], "mutateDigest": false, "verifyDigest": false}]),
    );
    let before = signed();
    let (first, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(before.clone()));
    assert_eq!(first[0].0, Status::Pass, "{first:?}");
    let after = moved(&before);
    let (second, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &WithVerifier(after.clone()));
    assert_eq!(second[0].0, Status::Fail, "{second:?}");
    assert_eq!(after.asked.lock().unwrap().len(), 1, "verified again");
}

/// Kyverno's `imageRegistry` context entry reads the image's data through the port: a
/// non-root image passes, a root one is denied, an unreachable registry is an error naming the
/// image (before, the entry was never loaded and every such policy errored).
#[test]
fn image_registry_context_entries_read_the_registry_through_the_port() {
    let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "no-root"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "user",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "root image", "foreach": [{"list": "request.object.spec.containers",
                "context": [{"name": "imageData", "imageRegistry": {"reference": "{{ element.image }}",
                    "jmesPath": "{user: configData.config.User || '', registry: registry}"}}],
                "deny": {"conditions": {"any": [{"key": "{{ imageData.user }}", "operator": "Equals", "value": ""}]}}}]}}]}});
    let Compiled::Policy(p) = compile(&doc, &[]).unwrap() else { panic!() };
    let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
    let data = WithVerifier(Arc::new(Scripted::default()));
    let (results, _) = run(&set, &pod(&["ghcr.io/acme/app:v1"]), &data);
    assert_eq!(results[0].0, Status::Pass, "{results:?}");
    let (results, _) = run(&set, &pod(&["ghcr.io/acme/root:v1"]), &data);
    assert_eq!(results[0].0, Status::Fail, "{results:?}");
    let (results, _) = run(&set, &pod(&["ghcr.io/acme/gone:v1"]), &data);
    assert_eq!(results[0].0, Status::Error, "{results:?}");
    assert!(results[0].1.contains("failed to fetch image descriptor: ghcr.io/acme/gone:v1"), "{results:?}");
}
