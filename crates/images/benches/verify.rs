//! What a verifyImages rule costs at admission, against a real registry on loopback
//! (docker-registry, started by the test rig; installed by scripts/install-registry.sh):
//!
//! * `signature`: one cosign key signature verified from the registry (resolve the tag,
//!   fetch the `.sig` manifest and payload, check the ECDSA signature and the claim);
//! * `rule_uncached` / `rule_cached`: a ClusterPolicy verifyImages rule on one Pod through the
//!   engine, without and with the verification cache (the second request for an image).
//!
//! Run: `cargo bench -p verno-images --bench verify`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a bench fails by panicking and may read clocks

#[path = "../tests/rig/mod.rs"]
mod rig;

use rig::{Key, Registry, SignOpts, sign};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use verno_api::images::{Attestor, RegistryCredentials, Rekor, StaticKeys};
use verno_engine::verify_images::{ImageVerifier, SignatureCheck};
use verno_engine::{Compiled, PolicySet, Request, Scope};
use verno_images::{Cache, Verifier};

struct Fixture {
    _reg: Registry,
    image: String,
    key: Key,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let reg = Registry::start(None);
        let key = Key::generate();
        let digest = reg.push_image("bench/app", "v1", "bench");
        sign(&reg, "bench/app", &digest, &key, &SignOpts::default());
        let image = format!("{}/bench/app:v1", reg.addr);
        Fixture { _reg: reg, image, key }
    })
}

fn main() {
    divan::main();
    // The fixture is a static, never dropped: stop its registry.
    if let Some(f) = FIXTURE.get() {
        let _ = std::process::Command::new("kill").arg(f._reg.pid().to_string()).status();
    }
}

#[divan::bench]
fn signature(bencher: divan::Bencher) {
    let f = fixture();
    let v = Verifier::new().unwrap();
    let attestor = Attestor {
        keys: Some(StaticKeys {
            public_keys: f.key.pem.clone(),
            rekor: Some(Rekor { ignore_tlog: true, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let creds = RegistryCredentials { allow_insecure_registry: true, ..Default::default() };
    let none = BTreeMap::new();
    let check = SignatureCheck {
        image: &f.image,
        attestor: &attestor,
        repository: "",
        annotations: &none,
        credentials: Some(&creds),
        namespace: "default",
        kind: "Cosign",
        cosign_oci11: false,
        attestation: None,
        cancel: None,
    };
    bencher.bench_local(|| v.verify(&check).unwrap());
}

struct Images(Arc<Verifier>);
impl verno_engine::Data for Images {
    fn image_verifier(&self) -> Option<Arc<dyn ImageVerifier>> {
        Some(self.0.clone())
    }
}

fn policy(f: &Fixture) -> PolicySet {
    let doc = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "signed", "uid": "u", "resourceVersion": "1"},
        "spec": {"validationFailureAction": "Enforce", "rules": [{
            "name": "check", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "verifyImages": [{"imageReferences": ["127.0.0.1:*"], "mutateDigest": false, "verifyDigest": false,
                "imageRegistryCredentials": {"allowInsecureRegistry": true},
                "attestors": [{"entries": [{"keys": {"publicKeys": f.key.pem, "rekor": {"ignoreTlog": true}}}]}]}]}]}
    });
    match verno_engine::compile(&doc, &[]).unwrap() {
        Compiled::Policy(p) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
        _ => panic!("a policy"),
    }
}

fn pod(image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": image}]}})
}

fn rule(bencher: divan::Bencher, cache: Option<Cache>) {
    let f = fixture();
    let set = policy(f);
    let mut v = Verifier::new().unwrap();
    if let Some(c) = cache {
        v = v.with_cache(c);
    }
    let data = Images(Arc::new(v));
    let object = pod(&f.image);
    bencher.bench_local(|| {
        let req = Request::new(verno_engine::Operation::Create, &object);
        let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, &data, &mut ());
        assert!(out.allowed());
    });
}

#[divan::bench]
fn rule_uncached(bencher: divan::Bencher) {
    rule(bencher, None);
}

#[divan::bench]
fn rule_cached(bencher: divan::Bencher) {
    rule(bencher, Some(Cache::new(std::time::Duration::from_secs(3600), 1000)));
}
