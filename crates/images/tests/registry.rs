//! verno-images against a real registry (docker-registry on loopback, images pushed by
//! skopeo, signatures and attestations made by the rig): what Kyverno's verifyImages asks of
//! cosign, entry by entry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

mod rig;

use rig::{Key, Registry, SignOpts, attest, ca, sign};
use serde_json::json;
use std::collections::BTreeMap;
use verno_api::images::{Attestor, Certificates, CtLog, Keyless, RegistryCredentials, Rekor, StaticKeys};
use verno_engine::verify_images::{ImageError, ImageVerifier, SignatureCheck, Verified};
use verno_images::Verifier;

fn insecure() -> RegistryCredentials {
    RegistryCredentials { allow_insecure_registry: true, ..Default::default() }
}

fn keys(pem: &str) -> Attestor {
    Attestor {
        keys: Some(StaticKeys {
            public_keys: pem.to_string(),
            rekor: Some(Rekor { ignore_tlog: true, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn check<'a>(
    image: &'a str,
    attestor: &'a Attestor,
    creds: &'a RegistryCredentials,
    ann: &'a BTreeMap<String, String>,
) -> SignatureCheck<'a> {
    SignatureCheck {
        image,
        attestor,
        repository: "",
        annotations: ann,
        credentials: Some(creds),
        namespace: "default",
        kind: "Cosign",
        cosign_oci11: false,
        attestation: None,
        cancel: None,
    }
}

fn failed(r: Result<Verified, ImageError>) -> String {
    match r {
        Err(ImageError::Failed(m)) => m,
        other => panic!("expected a verification failure, got {other:?}"),
    }
}

#[test]
fn keys_signed_unsigned_wrong_key_tampered_wrong_digest() {
    let reg = Registry::start(None);
    let key = Key::generate();
    let other = Key::generate();
    let digest = reg.push_image("acme/app", "v1", "signed");
    sign(&reg, "acme/app", &digest, &key, &SignOpts { optional: Some(json!({"env": "prod"})), ..Default::default() });
    let unsigned = reg.push_image("acme/plain", "v1", "unsigned");
    let v = Verifier::new().unwrap();
    let creds = insecure();
    let none = BTreeMap::new();
    let image = format!("{}/acme/app:v1", reg.addr);
    let att = keys(&key.pem);

    let ok = v.verify(&check(&image, &att, &creds, &none)).unwrap();
    assert_eq!(ok.digest, digest);
    // By digest too.
    let by_digest = format!("{}/acme/app@{digest}", reg.addr);
    assert_eq!(v.verify(&check(&by_digest, &att, &creds, &none)).unwrap().digest, digest);
    // The digest alone (mutateDigest).
    assert_eq!(v.digest(&image, Some(&creds), "default").unwrap(), digest);
    assert_eq!(v.digest(&format!("{}/acme/plain:v1", reg.addr), Some(&creds), "default").unwrap(), unsigned);

    // Annotations must match the payload's optional fields.
    let prod: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())].into();
    assert!(v.verify(&check(&image, &att, &creds, &prod)).is_ok());
    let dev: BTreeMap<String, String> = [("env".to_string(), "dev".to_string())].into();
    assert_eq!(
        failed(v.verify(&check(&image, &att, &creds, &dev))),
        "no matching signatures: missing or incorrect annotation: env=dev"
    );

    // Unsigned.
    let plain = format!("{}/acme/plain:v1", reg.addr);
    assert_eq!(failed(v.verify(&check(&plain, &att, &creds, &none))), "no signatures found");
    // Wrong key.
    let wrong = keys(&other.pem);
    assert_eq!(
        failed(v.verify(&check(&image, &wrong, &creds, &none))),
        "no matching signatures: invalid signature when validating ASN.1 encoded signature"
    );

    // A tampered payload and a payload claiming another digest.
    let t = reg.push_image("acme/tampered", "v1", "tampered");
    sign(&reg, "acme/tampered", &t, &key, &SignOpts { tamper: true, ..Default::default() });
    assert!(
        failed(v.verify(&check(&format!("{}/acme/tampered:v1", reg.addr), &att, &creds, &none)))
            .contains("invalid signature")
    );
    let w = reg.push_image("acme/wrongdigest", "v1", "wrongdigest");
    sign(&reg, "acme/wrongdigest", &w, &key, &SignOpts { claim_digest: Some(unsigned.clone()), ..Default::default() });
    assert_eq!(
        failed(v.verify(&check(&format!("{}/acme/wrongdigest:v1", reg.addr), &att, &creds, &none))),
        format!("no matching signatures: invalid or missing digest in claim: {unsigned}")
    );
    // A missing image.
    assert!(
        failed(v.verify(&check(&format!("{}/acme/nothing:v1", reg.addr), &att, &creds, &none))).contains("not found")
    );

    // The transparency log is required unless ignored.
    let tlog = Attestor {
        keys: Some(StaticKeys { public_keys: key.pem.clone(), ..Default::default() }),
        ..Default::default()
    };
    assert!(failed(v.verify(&check(&image, &tlog, &creds, &none))).contains("signature not found in transparency log"));

    // A second signer appended to the same image: each key verifies on its own. (A verifier
    // that saw the wrong key fail a moment ago answers from that failure for a few seconds:
    // a fresh one asks.)
    sign(&reg, "acme/app", &digest, &other, &SignOpts::default());
    assert!(v.verify(&check(&image, &wrong, &creds, &none)).is_err());
    let v = Verifier::new().unwrap();
    assert!(v.verify(&check(&image, &wrong, &creds, &none)).is_ok());
    assert!(v.verify(&check(&image, &att, &creds, &none)).is_ok());
}

#[test]
fn certificates_chains_keyless_and_expired_leaves() {
    let reg = Registry::start(None);
    let digest = reg.push_image("acme/keyless", "v1", "keyless");
    let good = ca("signer@example.com", "https://issuer.example.com", false);
    sign(
        &reg,
        "acme/keyless",
        &digest,
        &good.leaf,
        &SignOpts { cert: Some(good.leaf_pem.clone()), chain: Some(good.root_pem.clone()), ..Default::default() },
    );
    let v = Verifier::new().unwrap();
    let creds = insecure();
    let none = BTreeMap::new();
    let image = format!("{}/acme/keyless:v1", reg.addr);
    let no_tlog = Some(Rekor { ignore_tlog: true, ..Default::default() });
    let no_sct = Some(CtLog { ignore_sct: true, ..Default::default() });
    let keyless = |subject: &str, issuer: &str| Attestor {
        keyless: Some(Keyless {
            subject: subject.into(),
            issuer: issuer.into(),
            roots: good.root_pem.clone(),
            rekor: no_tlog.clone(),
            ctlog: no_sct.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(
        v.verify(&check(&image, &keyless("signer@example.com", "https://issuer.example.com"), &creds, &none)).is_ok()
    );
    assert!(v.verify(&check(&image, &keyless("*@example.com", "https://issuer.*"), &creds, &none)).is_ok());
    assert!(
        failed(v.verify(&check(&image, &keyless("other@example.com", ""), &creds, &none))).contains("subject mismatch")
    );
    assert!(
        failed(v.verify(&check(&image, &keyless("", "https://evil.example.com"), &creds, &none)))
            .contains("issuer mismatch")
    );
    // Other roots.
    let stranger = ca("signer@example.com", "https://issuer.example.com", false);
    let other_roots = Attestor {
        keyless: Some(Keyless {
            roots: stranger.root_pem.clone(),
            rekor: no_tlog.clone(),
            ctlog: no_sct.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(
        failed(v.verify(&check(&image, &other_roots, &creds, &none))).contains("certificate chain verification failed")
    );
    // SCTs checked unless ignored: this leaf carries none (tests/sct.rs has one that does).
    let with_sct = Attestor {
        keyless: Some(Keyless { roots: good.root_pem.clone(), rekor: no_tlog.clone(), ..Default::default() }),
        ..Default::default()
    };
    let e = failed(v.verify(&check(&image, &with_sct, &creds, &none)));
    assert!(e.contains("failed to verify embedded SCT: the certificate has no embedded SCT"), "{e}");
    // certificates: the leaf's key, with and without the chain.
    let cert = |chain: &str| Attestor {
        certificates: Some(Certificates {
            certificate: good.leaf_pem.clone(),
            certificate_chain: chain.into(),
            rekor: no_tlog.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(v.verify(&check(&image, &cert(""), &creds, &none)).is_ok());
    assert!(v.verify(&check(&image, &cert(&good.root_pem), &creds, &none)).is_ok());
    assert!(failed(v.verify(&check(&image, &cert(&stranger.root_pem), &creds, &none))).contains("chain"));

    // An expired leaf fails.
    let old = ca("signer@example.com", "https://issuer.example.com", true);
    let d2 = reg.push_image("acme/expired", "v1", "expired");
    sign(
        &reg,
        "acme/expired",
        &d2,
        &old.leaf,
        &SignOpts { cert: Some(old.leaf_pem.clone()), chain: Some(old.root_pem.clone()), ..Default::default() },
    );
    let expired = Attestor {
        keyless: Some(Keyless {
            roots: old.root_pem.clone(),
            rekor: no_tlog.clone(),
            ctlog: no_sct.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let msg = failed(v.verify(&check(&format!("{}/acme/expired:v1", reg.addr), &expired, &creds, &none)));
    assert!(msg.contains("expired") || msg.contains("Expired"), "{msg}");
}

#[test]
fn attestations_are_read_from_dsse_envelopes() {
    let reg = Registry::start(None);
    let key = Key::generate();
    let digest = reg.push_image("acme/attested", "v1", "attested");
    attest(&reg, "acme/attested", &digest, &key, "https://slsa.dev/provenance/v0.2", json!({"builder": {"id": "ci"}}));
    let v = Verifier::new().unwrap();
    let creds = insecure();
    let none = BTreeMap::new();
    let image = format!("{}/acme/attested:v1", reg.addr);
    let att = keys(&key.pem);
    let mut c = check(&image, &att, &creds, &none);
    c.attestation = Some("https://slsa.dev/provenance/v0.2");
    let got = v.verify(&c).unwrap();
    assert_eq!(got.statements.len(), 1);
    assert_eq!(got.statements[0]["predicate"]["builder"]["id"], "ci");
    // Another key's attestations do not count.
    let other = keys(&Key::generate().pem);
    let mut c2 = check(&image, &other, &creds, &none);
    c2.attestation = Some("https://slsa.dev/provenance/v0.2");
    assert!(failed(v.verify(&c2)).starts_with("no matching attestations"));
    // No attestor: read without checking the signer.
    let anyone = Attestor::default();
    let mut c3 = check(&image, &anyone, &creds, &none);
    c3.attestation = Some("https://slsa.dev/provenance/v0.2");
    assert_eq!(v.verify(&c3).unwrap().statements.len(), 1);
}

#[test]
fn auth_required_and_registry_down() {
    let reg = Registry::start(Some(("alice", "s3cret")));
    let key = Key::generate();
    let digest = reg.push_image("private/app", "v1", "private");
    sign(&reg, "private/app", &digest, &key, &SignOpts::default());
    let image = format!("{}/private/app:v1", reg.addr);
    let none = BTreeMap::new();
    let att = keys(&key.pem);
    let creds =
        RegistryCredentials { allow_insecure_registry: true, secrets: vec!["regcred".into()], ..Default::default() };
    // Without the secret's credentials: refused.
    let anonymous = Verifier::new().unwrap();
    let msg = failed(anonymous.verify(&check(&image, &att, &insecure(), &none)));
    assert!(msg.contains("401"), "{msg}");
    // With a docker config Secret.
    let cfg = json!({"auths": {reg.addr.clone(): {"auth": rig::b64(b"alice:s3cret")}}});
    let secret = json!({"data": {".dockerconfigjson": rig::b64(cfg.to_string().as_bytes())}});
    let reader: verno_images::SecretReader = std::sync::Arc::new(move |_ns: &str, name: &str| {
        if name == "regcred" { Ok(secret.clone()) } else { Err(format!("secrets \"{name}\" not found")) }
    });
    let v = Verifier::new().unwrap().with_secrets(reader);
    assert_eq!(v.verify(&check(&image, &att, &creds, &none)).unwrap().digest, digest);
    // A missing secret is a failure saying so.
    let missing =
        RegistryCredentials { allow_insecure_registry: true, secrets: vec!["nope".into()], ..Default::default() };
    assert!(failed(v.verify(&check(&image, &att, &missing, &none))).contains("failed to fetch secrets"));

    // The registry goes away: unreachable, an error and not a failure.
    drop(reg);
    match v.verify(&check(&image, &att, &creds, &none)) {
        Err(ImageError::Unreachable(m)) => assert!(m.contains("GET http://"), "{m}"),
        other => panic!("expected unreachable, got {other:?}"),
    }
    // Plain HTTP is used only where allowed: without allowInsecureRegistry the client speaks TLS.
    let secure = RegistryCredentials::default();
    assert!(v.verify(&check(&image, &att, &secure, &none)).is_err());
}

#[test]
fn rekor_bundles_are_checked_against_the_given_log_key() {
    let reg = Registry::start(None);
    let key = Key::generate();
    let log = std::sync::Arc::new(Key::generate());
    let digest = reg.push_image("acme/logged", "v1", "logged");
    sign(&reg, "acme/logged", &digest, &key, &SignOpts { rekor: Some(log.clone()), ..Default::default() });
    let plain = reg.push_image("acme/unlogged", "v1", "unlogged");
    sign(&reg, "acme/unlogged", &plain, &key, &SignOpts::default());
    let v = Verifier::new().unwrap();
    let creds = insecure();
    let none = BTreeMap::new();
    let with_log = |pubkey: &str| Attestor {
        keys: Some(StaticKeys {
            public_keys: key.pem.clone(),
            rekor: Some(Rekor { pubkey: pubkey.to_string(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let image = format!("{}/acme/logged:v1", reg.addr);
    // The log's key: verified, tlog included.
    assert!(v.verify(&check(&image, &with_log(&log.pem), &creds, &none)).is_ok());
    // Another log's key: the signed entry timestamp does not verify.
    let other = Key::generate();
    assert!(
        failed(v.verify(&check(&image, &with_log(&other.pem), &creds, &none)))
            .contains("invalid signed entry timestamp")
    );
    // A signature that was never logged.
    let unlogged = format!("{}/acme/unlogged:v1", reg.addr);
    assert!(
        failed(v.verify(&check(&unlogged, &with_log(&log.pem), &creds, &none)))
            .contains("signature not found in transparency log")
    );
    // No log key: the public-good Rekor's keys, as cosign's default (they did not sign this
    // test log's entry).
    assert!(failed(v.verify(&check(&image, &with_log(""), &creds, &none))).contains("invalid signed entry timestamp"));
    // Another Rekor without its key: said, not skipped.
    let private_log = Attestor {
        keys: Some(StaticKeys {
            public_keys: key.pem.clone(),
            rekor: Some(Rekor { url: "https://rekor.internal.example".into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let said = failed(v.verify(&check(&image, &private_log, &creds, &none)));
    assert!(said.contains("give rekor.pubkey for https://rekor.internal.example"), "{said}");
}

/// A registry of our own on loopback, for what docker-registry cannot be made to do: it waits
/// `delay` before each answer, answers a manifest for `acme/app:v1`, 404 for anything else
/// under `/v2/acme/app/`, and 401 with a token challenge for `acme/locked`. Returns its
/// address and the number of requests it answered.
fn scripted_registry(delay: std::time::Duration) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (seen, me) = (count.clone(), addr.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (seen, me) = (seen.clone(), me.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    std::thread::sleep(delay);
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let manifest = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#;
                    let answer = if path == "/v2/acme/app/manifests/v1" {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: {}\r\n\r\n{manifest}",
                            manifest.len()
                        )
                    } else if path.starts_with("/v2/acme/locked/") {
                        format!(
                            "HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Bearer realm=\"http://{me}/token\",service=\"x\"\r\nContent-Length: 0\r\n\r\n"
                        )
                    } else {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
                    };
                    if conn.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

/// A slow registry does not hold an evaluation past its request's end: the
/// caller's cancel flag is read before every exchange.
#[test]
fn a_cancelled_verification_stops_before_its_next_registry_exchange() {
    let (addr, count) = scripted_registry(std::time::Duration::from_millis(1500));
    let v = Verifier::new().unwrap();
    let (creds, none, att) = (insecure(), BTreeMap::new(), keys("unused"));
    let image = format!("{addr}/acme/locked:v1");
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let start = std::time::Instant::now();
    let out = v.verify(&SignatureCheck { cancel: Some(&cancel), ..check(&image, &att, &creds, &none) });
    match out {
        Err(ImageError::Unreachable(m)) => assert!(m.contains("stopped: the request's deadline passed"), "{m}"),
        other => panic!("expected the verification to stop, got {other:?}"),
    }
    // The challenge was answered; the token exchange it asks for was never made.
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
}

/// A check that failed on a digest fails again for a while without asking the
/// registry for its signatures (a burst of Pods of one unsigned image asks once).
#[test]
fn a_failed_check_is_remembered_briefly_per_digest() {
    let (addr, count) = scripted_registry(std::time::Duration::ZERO);
    let v = Verifier::new().unwrap();
    let (creds, none, att) = (insecure(), BTreeMap::new(), keys(&Key::generate().pem));
    let image = format!("{addr}/acme/app:v1");
    assert_eq!(failed(v.verify(&check(&image, &att, &creds, &none))), "no signatures found");
    let asked = count.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(asked, 2, "the tag, then the signatures");
    assert_eq!(failed(v.verify(&check(&image, &att, &creds, &none))), "no signatures found");
    // Only the tag was resolved again: the digest it names failed a moment ago.
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), asked + 1);
    // Another check of the same digest is not answered from that failure.
    let other = keys(&Key::generate().pem);
    assert_eq!(failed(v.verify(&check(&image, &other, &creds, &none))), "no signatures found");
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), asked + 3);
}

/// Kyverno's `imageRegistry` context entry: an image's parts, its resolved digest, manifest and
/// config, by tag and by digest; an index resolves to its linux/amd64 image.
#[test]
fn image_data_is_read_as_kyvernos_image_registry_entry_reads_it() {
    let reg = Registry::start(None);
    let digest = reg.push_image("acme/app", "v1", "data");
    let v = Verifier::new().unwrap();
    let creds = insecure();
    let image = format!("{}/acme/app:v1", reg.addr);
    let d = v.image_data(&image, Some(&creds), "").unwrap();
    assert_eq!(d["image"], json!(image));
    assert_eq!(d["registry"], json!(reg.addr));
    assert_eq!(d["repository"], "acme/app");
    assert_eq!(d["identifier"], "v1");
    assert_eq!(d["resolvedImage"], json!(format!("{}/acme/app@{digest}", reg.addr)));
    assert_eq!(d["configData"]["architecture"], "amd64");
    assert_eq!(d["manifest"]["schemaVersion"], 2);
    assert!(d["manifestList"].is_null());
    // By tag and digest: the identifier keeps both.
    let pinned = format!("{}/acme/app:v1@{digest}", reg.addr);
    assert_eq!(v.image_data(&pinned, Some(&creds), "").unwrap()["identifier"], json!(format!("v1@{digest}")));
    // An index: the linux/amd64 image, and the index as the manifest list.
    let m = v.image_data(&image, Some(&creds), "").unwrap()["manifest"].clone();
    let size = serde_json::to_vec(&m).unwrap().len();
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
            "platform": {"os": "linux", "architecture": "amd64"}}]});
    let index_digest = reg.put_manifest("acme/app", "multi", &index);
    let d = v.image_data(&format!("{}/acme/app:multi", reg.addr), Some(&creds), "").unwrap();
    assert_eq!(d["manifestList"]["manifests"][0]["digest"], json!(digest));
    assert_eq!(d["manifest"], m);
    assert_eq!(d["resolvedImage"], json!(format!("{}/acme/app@{index_digest}", reg.addr)));
    // Missing: an error naming the image.
    let e = v.image_data(&format!("{}/acme/none:v1", reg.addr), Some(&creds), "").unwrap_err();
    assert!(e.message().contains("not found"), "{}", e.message());
}
