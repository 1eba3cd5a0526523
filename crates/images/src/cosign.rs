//! Cosign's formats, read from a registry: signatures under the tag `sha256-<hex>.sig`
//! (simple-signing payloads, one per layer, the signature and certificates in the layer
//! annotations), attestations under `sha256-<hex>.att` (DSSE envelopes of in-toto statements),
//! and Rekor bundles (`dev.sigstore.cosign/bundle`, the signed entry timestamp checked against a
//! given Rekor key).
//!
//! Ours, on the project's ring / webpki / x509-parser: see crypto.rs for why not sigstore-rs.

use crate::crypto::{Certificate, PublicKey, certificates, verify_chain};
use crate::reference::Reference;
use crate::registry::Session;
use base64::Engine as _;
use serde_json::Value;
use sha2::Digest as _;
use std::collections::BTreeMap;
use verno_api::images::{Attestor, CtLog, Rekor};
use verno_engine::verify_images::{ImageError, Verified};

const SIGNATURE: &str = "dev.cosignproject.cosign/signature";
const CERTIFICATE: &str = "dev.sigstore.cosign/certificate";
const CHAIN: &str = "dev.sigstore.cosign/chain";
const BUNDLE: &str = "dev.sigstore.cosign/bundle";
/// The most signature or attestation layers looked at for one image.
const MAX_LAYERS: usize = 64;

/// Who must have signed: built from one leaf attestor entry.
pub enum Signer {
    /// A public key (`keys`, or `certificates.cert` alone).
    Key(PublicKey),
    /// Certificates embedded in each signature, checked up to `roots` (keyless, or
    /// `certificates.certChain` alone), with an identity for keyless.
    Roots { roots: Vec<Certificate>, identity: Option<IdentityRule>, check_sct: bool },
    /// No attestor: attestations are read without checking who signed them.
    Anyone,
}

/// Keyless identity rules (`subject`, `subjectRegExp`, `issuer`, `issuerRegExp`,
/// `additionalExtensions`).
pub struct IdentityRule {
    pub subject: String,
    pub subject_regexp: Option<regex::Regex>,
    pub issuer: String,
    pub issuer_regexp: Option<regex::Regex>,
    pub extensions: BTreeMap<String, String>,
}

/// The transparency log requirement of an attestor.
pub struct Tlog {
    pub required: bool,
    pub key: Option<PublicKey>,
}

impl Tlog {
    pub fn of(rekor: Option<&Rekor>) -> Result<Tlog, String> {
        match rekor {
            None => Ok(Tlog { required: true, key: None }),
            Some(r) => Ok(Tlog {
                required: !r.ignore_tlog,
                key: if r.pubkey.trim().is_empty() {
                    None
                } else {
                    Some(PublicKey::from_pem(&r.pubkey).map_err(|e| format!("failed to load Rekor public keys: {e}"))?)
                },
            }),
        }
    }
}

/// The `Signer` of a leaf attestor entry; `secret_key` reads `keys.secret` (`cosign.pub`).
pub fn signer(
    a: &Attestor,
    secret_key: &dyn Fn(&str, &str) -> Result<String, String>,
) -> Result<(Signer, Tlog, String), String> {
    if let Some(k) = &a.keys {
        let alg = if k.signature_algorithm.is_empty() {
            a.signature_algorithm.clone()
        } else {
            k.signature_algorithm.clone()
        };
        let key = if !k.public_keys.trim().is_empty() {
            PublicKey::from_pem(&k.public_keys)?
        } else if let Some(s) = &k.secret {
            let pem = secret_key(&s.namespace, &s.name)
                .map_err(|e| format!("failed to load public key from k8s://{}/{}: {e}", s.namespace, s.name))?;
            PublicKey::from_pem(&pem)
                .map_err(|e| format!("failed to load public key from k8s://{}/{}: {e}", s.namespace, s.name))?
        } else {
            return Err(format!(
                "failed to load public key from {}: KMS keys are not supported by this build of verno",
                k.kms
            ));
        };
        return Ok((Signer::Key(key), Tlog::of(k.rekor.as_ref())?, alg));
    }
    if let Some(c) = &a.certificates {
        let tlog = Tlog::of(c.rekor.as_ref())?;
        if !c.certificate.trim().is_empty() {
            let cert =
                certificates(&c.certificate).map_err(|e| format!("failed to load certificate from {}: {e}", "cert"))?;
            let leaf = cert.into_iter().next().ok_or("no certs found in pem file")?;
            if !c.certificate_chain.trim().is_empty() {
                let chain =
                    certificates(&c.certificate_chain).map_err(|e| format!("failed to load certificate chain: {e}"))?;
                let (roots, inter) = split_chain(chain);
                verify_chain(&leaf, &inter, &roots, now())
                    .map_err(|e| format!("failed to load validate certificate chain: {e}"))?;
            }
            return Ok((Signer::Key(leaf.public_key()?), tlog, a.signature_algorithm.clone()));
        }
        let chain = certificates(&c.certificate_chain).map_err(|e| format!("failed to load certificate chain: {e}"))?;
        let check_sct = !c.ctlog.as_ref().is_some_and(|l| l.ignore_sct);
        return Ok((Signer::Roots { roots: chain, identity: None, check_sct }, tlog, a.signature_algorithm.clone()));
    }
    if let Some(k) = &a.keyless {
        if k.roots.trim().is_empty() {
            return Err("failed to get roots from fulcio: Sigstore's public Fulcio roots come from its TUF repository, which this build of verno does not fetch; give keyless.roots".into());
        }
        let roots = certificates(&k.roots).map_err(|e| format!("failed to load Root certificates: {e}"))?;
        let re = |s: &str, what: &str| -> Result<Option<regex::Regex>, String> {
            if s.is_empty() {
                Ok(None)
            } else {
                regex::RegexBuilder::new(s)
                    .size_limit(1 << 20)
                    .build()
                    .map(Some)
                    .map_err(|e| format!("invalid {what} {s:?}: {e}"))
            }
        };
        let identity = IdentityRule {
            subject: k.subject.clone(),
            subject_regexp: re(&k.subject_regexp, "subjectRegExp")?,
            issuer: k.issuer.clone(),
            issuer_regexp: re(&k.issuer_regexp, "issuerRegExp")?,
            extensions: k.additional_extensions.clone(),
        };
        return Ok((
            Signer::Roots { roots, identity: Some(identity), check_sct: !sct_ignored(k.ctlog.as_ref()) },
            Tlog::of(k.rekor.as_ref())?,
            a.signature_algorithm.clone(),
        ));
    }
    Ok((Signer::Anyone, Tlog { required: false, key: None }, String::new()))
}

fn sct_ignored(c: Option<&CtLog>) -> bool {
    c.is_some_and(|l| l.ignore_sct)
}

/// A chain as written (leaf side first): the self-signed end is the root.
fn split_chain(mut chain: Vec<Certificate>) -> (Vec<Certificate>, Vec<Certificate>) {
    match chain.pop() {
        Some(root) => (vec![root], chain),
        None => (Vec::new(), Vec::new()),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Where signatures of `digest` live: `sha256-<hex>.sig` (or `.att`).
fn tag_for(digest: &str, suffix: &str) -> String {
    format!("{}.{suffix}", digest.replacen(':', "-", 1))
}

/// The digest a reference names: its own, or the registry's for its tag.
pub fn resolve(session: &Session, r: &Reference) -> Result<String, ImageError> {
    if !r.digest.is_empty() {
        return Ok(r.digest.clone());
    }
    match session.manifest(r, &r.tag)? {
        Some(m) => Ok(m.digest),
        None => Err(ImageError::Failed(format!("image {}/{}:{} not found", r.registry, r.repository, r.tag))),
    }
}

/// A signature or attestation layer: (mediaType, blob digest, annotations).
type Layer = (String, String, BTreeMap<String, String>);

/// The layers of the signature (or attestation) manifest of `digest`: (mediaType, digest,
/// annotations). `None`: there is no such manifest.
fn layers(session: &Session, sigs: &Reference, digest: &str, suffix: &str) -> Result<Option<Vec<Layer>>, ImageError> {
    let Some(m) = session.manifest(sigs, &tag_for(digest, suffix))? else { return Ok(None) };
    let v = m.json()?;
    let list = v.get("layers").and_then(Value::as_array).cloned().unwrap_or_default();
    Ok(Some(
        list.iter()
            .take(MAX_LAYERS)
            .map(|l| {
                let s = |k: &str| l.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                let ann = l
                    .get("annotations")
                    .and_then(Value::as_object)
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                    .unwrap_or_default();
                (s("mediaType"), s("digest"), ann)
            })
            .collect(),
    ))
}

/// What one signature layer must satisfy.
pub struct Expect<'a> {
    pub signer: &'a Signer,
    pub tlog: &'a Tlog,
    pub algorithm: &'a str,
    pub annotations: &'a BTreeMap<String, String>,
}

/// Verifies the cosign signatures of `image` (digest `digest`), read from `sigs` (the image's
/// repository or the policy's `repository`): one signature that verifies is enough.
pub fn verify_signatures(
    session: &Session,
    sigs: &Reference,
    digest: &str,
    expect: &Expect,
) -> Result<Verified, ImageError> {
    let Some(layers) = layers(session, sigs, digest, "sig")? else {
        return Err(ImageError::Failed("no signatures found".into()));
    };
    if layers.is_empty() {
        return Err(ImageError::Failed("no signatures found".into()));
    }
    let mut last = String::new();
    for (_, blob_digest, ann) in &layers {
        let payload = session.blob(sigs, blob_digest)?;
        match check_signature_layer(&payload, ann, digest, expect) {
            Ok(()) => return Ok(Verified { digest: digest.to_string(), statements: Vec::new() }),
            Err(e) => last = e,
        }
    }
    Err(ImageError::Failed(format!("no matching signatures: {last}")))
}

fn check_signature_layer(
    payload: &[u8],
    ann: &BTreeMap<String, String>,
    digest: &str,
    expect: &Expect,
) -> Result<(), String> {
    let sig = b64(ann.get(SIGNATURE).map(String::as_str).unwrap_or(""))
        .map_err(|e| format!("the signature annotation is not base64: {e}"))?;
    let time = check_signer(expect, ann, payload, &sig)?;
    let _ = time;
    let v: Value = serde_json::from_slice(payload).map_err(|e| format!("failed to unmarshal JSON payload: {e}"))?;
    let claimed = v.pointer("/critical/image/docker-manifest-digest").and_then(Value::as_str).unwrap_or("");
    if claimed != digest {
        return Err(format!("invalid or missing digest in claim: {claimed}"));
    }
    for (k, want) in expect.annotations {
        let got = v.pointer("/optional").and_then(|o| o.get(k));
        let got = match got {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        if &got != want {
            return Err(format!("missing or incorrect annotation: {k}={want}"));
        }
    }
    Ok(())
}

/// Checks who signed `msg` with `sig` (and the transparency log entry): the key, or the
/// certificate in the annotations up to the roots, with its identity.
fn check_signer(expect: &Expect, ann: &BTreeMap<String, String>, msg: &[u8], sig: &[u8]) -> Result<i64, String> {
    let mut at = now();
    if expect.tlog.required {
        at = check_bundle(expect.tlog, ann, msg, sig)?;
    }
    let key = match expect.signer {
        Signer::Anyone => return Ok(at),
        Signer::Key(k) => k.clone(),
        Signer::Roots { roots, identity, check_sct } => {
            let leaf_pem = ann.get(CERTIFICATE).filter(|s| !s.is_empty()).ok_or("no certificate found on signature")?;
            let leaf = certificates(leaf_pem)?.into_iter().next().ok_or("no certificate found on signature")?;
            let inter = match ann.get(CHAIN).filter(|s| !s.trim().is_empty()) {
                Some(c) => certificates(c)?,
                None => Vec::new(),
            };
            verify_chain(&leaf, &inter, roots, at)?;
            leaf.valid_at(at)?;
            if let Some(rule) = identity {
                check_identity(&leaf, rule)?;
                if *check_sct {
                    return Err("the certificate's SCT cannot be checked: certificate transparency verification is not supported by this build of verno (set ctlog.ignoreSCT)".into());
                }
            }
            leaf.public_key()?
        }
    };
    key.verify(expect.algorithm, msg, sig)?;
    Ok(at)
}

/// A detached signature over a blob (signed Kubernetes manifests). The transparency log is not
/// consulted: manifest signatures carry no Rekor bundle Verno reads (as k8s-manifest-sigstore,
/// which skips the log for key signatures). Returns the signer's name (a certificate's first
/// identity; empty for a key).
pub fn verify_blob(
    signer: &Signer,
    algorithm: &str,
    msg: &[u8],
    sig: &[u8],
    certificate: Option<&str>,
) -> Result<String, String> {
    match signer {
        Signer::Anyone => Err("no attestor to verify the signature with".into()),
        Signer::Key(k) => k.verify(algorithm, msg, sig).map(|_| String::new()),
        Signer::Roots { roots, identity, .. } => {
            let pem = certificate.filter(|c| !c.trim().is_empty()).ok_or("no certificate found with the signature")?;
            let leaf = certificates(pem)?.into_iter().next().ok_or("no certificate found with the signature")?;
            verify_chain(&leaf, &[], roots, now())?;
            leaf.valid_at(now())?;
            if let Some(rule) = identity {
                check_identity(&leaf, rule)?;
            }
            leaf.public_key()?.verify(algorithm, msg, sig)?;
            Ok(leaf.identity().map(|i| i.sans.join(",")).unwrap_or_default())
        }
    }
}

fn check_identity(leaf: &Certificate, rule: &IdentityRule) -> Result<(), String> {
    let id = leaf.identity()?;
    if !rule.subject.is_empty() && !id.sans.iter().any(|s| verno_jmespath::wildcard::matches(&rule.subject, s)) {
        return Err(format!("subject mismatch: expected {}, got {}", rule.subject, id.sans.join(", ")));
    }
    if let Some(re) = &rule.subject_regexp
        && !id.sans.iter().any(|s| re.is_match(s))
    {
        return Err(format!("subject mismatch: expected a match of {}, got {}", re.as_str(), id.sans.join(", ")));
    }
    if !rule.issuer.is_empty() && !verno_jmespath::wildcard::matches(&rule.issuer, &id.issuer) {
        return Err(format!("issuer mismatch: expected {}, got {}", rule.issuer, id.issuer));
    }
    if let Some(re) = &rule.issuer_regexp
        && !re.is_match(&id.issuer)
    {
        return Err(format!("issuer mismatch: expected a match of {}, got {}", re.as_str(), id.issuer));
    }
    for (name, want) in &rule.extensions {
        let oid = match name.as_str() {
            "githubWorkflowTrigger" => "1.3.6.1.4.1.57264.1.2",
            "githubWorkflowSha" => "1.3.6.1.4.1.57264.1.3",
            "githubWorkflowName" => "1.3.6.1.4.1.57264.1.4",
            "githubWorkflowRepository" => "1.3.6.1.4.1.57264.1.5",
            "githubWorkflowRef" => "1.3.6.1.4.1.57264.1.6",
            other => other,
        };
        let got = id.extensions.iter().find(|(o, _)| o == oid).map(|(_, v)| v.as_str()).unwrap_or("");
        if !verno_jmespath::wildcard::matches(want, got) {
            return Err(format!("extension {name} mismatch: expected {want}, got {got:?}"));
        }
    }
    Ok(())
}

/// Checks the Rekor bundle of a signature: the signed entry timestamp (Rekor's signature over
/// the canonical JSON of the entry) with the configured Rekor key, and that the entry is about
/// this signature and payload. Returns the entry's integrated time.
fn check_bundle(tlog: &Tlog, ann: &BTreeMap<String, String>, msg: &[u8], sig: &[u8]) -> Result<i64, String> {
    let raw = ann
        .get(BUNDLE)
        .filter(|s| !s.is_empty())
        .ok_or("signature not found in transparency log (no Rekor bundle; set rekor.ignoreTlog to skip the check)")?;
    let key = tlog.key.as_ref().ok_or("no Rekor public key to check the transparency log entry with: this build of verno does not fetch Sigstore's trust root, give rekor.pubkey")?;
    let bundle: Value = serde_json::from_str(raw).map_err(|e| format!("invalid Rekor bundle: {e}"))?;
    let set = b64(bundle.get("SignedEntryTimestamp").and_then(Value::as_str).unwrap_or(""))
        .map_err(|e| format!("invalid Rekor bundle: {e}"))?;
    let payload = bundle.get("Payload").ok_or("invalid Rekor bundle: no Payload")?;
    // Canonical JSON: keys sorted, no spaces (serde_json's map is ordered by key here).
    let canonical = serde_json::to_vec(&canonical(payload)).map_err(|e| e.to_string())?;
    key.verify("sha256", &canonical, &set)
        .map_err(|_| "unable to verify the Rekor bundle: invalid signed entry timestamp".to_string())?;
    let body = b64(payload.get("body").and_then(Value::as_str).unwrap_or(""))
        .map_err(|e| format!("invalid Rekor bundle body: {e}"))?;
    let entry: Value = serde_json::from_slice(&body).map_err(|e| format!("invalid Rekor bundle body: {e}"))?;
    let hash = entry.pointer("/spec/data/hash/value").and_then(Value::as_str).unwrap_or("");
    let content = entry.pointer("/spec/signature/content").and_then(Value::as_str).unwrap_or("");
    if hash != format!("{:x}", sha2::Sha256::digest(msg)) || b64(content).ok().as_deref() != Some(sig) {
        return Err("the Rekor bundle is about another signature".into());
    }
    Ok(payload.get("integratedTime").and_then(Value::as_i64).unwrap_or(0))
}

fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, canonical(v))).collect();
            serde_json::to_value(sorted).unwrap_or(Value::Null)
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Fetches the attestations of `digest` and verifies their envelopes: the statements of
/// envelopes a signer vouches for (all of them for [`Signer::Anyone`]), about this digest.
pub fn verify_attestations(
    session: &Session,
    sigs: &Reference,
    digest: &str,
    expect: &Expect,
) -> Result<Verified, ImageError> {
    let Some(layers) = layers(session, sigs, digest, "att")? else {
        return Err(ImageError::Failed("no signatures found".into()));
    };
    let mut statements = Vec::new();
    let mut last = String::from("no attestations found");
    for (_, blob_digest, ann) in &layers {
        let envelope = session.blob(sigs, blob_digest)?;
        match check_envelope(&envelope, ann, digest, expect) {
            Ok(s) => statements.push(s),
            Err(e) => last = e,
        }
    }
    if statements.is_empty() {
        return Err(ImageError::Failed(format!("no matching attestations: {last}")));
    }
    Ok(Verified { digest: digest.to_string(), statements })
}

fn check_envelope(
    envelope: &[u8],
    ann: &BTreeMap<String, String>,
    digest: &str,
    expect: &Expect,
) -> Result<Value, String> {
    let env: Value = serde_json::from_slice(envelope).map_err(|e| format!("failed to decode envelope: {e}"))?;
    let payload_type = env.get("payloadType").and_then(Value::as_str).unwrap_or("");
    let body = b64(env.get("payload").and_then(Value::as_str).unwrap_or(""))
        .map_err(|e| format!("failed to decode payload: {e}"))?;
    // DSSE's pre-authentication encoding is what is signed.
    let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), body.len()).into_bytes();
    pae.extend_from_slice(&body);
    let sigs: Vec<Vec<u8>> = env
        .get("signatures")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|s| s.get("sig").and_then(Value::as_str)).filter_map(|s| b64(s).ok()).collect())
        .unwrap_or_default();
    if !matches!(expect.signer, Signer::Anyone) {
        let mut last = String::from("no signatures in the envelope");
        let mut ok = false;
        for sig in &sigs {
            match check_signer(expect, ann, &pae, sig) {
                Ok(_) => {
                    ok = true;
                    break;
                }
                Err(e) => last = e,
            }
        }
        if !ok {
            return Err(last);
        }
    }
    let statement: Value = serde_json::from_slice(&body).map_err(|e| format!("failed to decode statement: {e}"))?;
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let about = statement
        .get("subject")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|s| s.pointer("/digest/sha256").and_then(Value::as_str) == Some(hex)));
    if !about {
        return Err(format!("no subject of the statement has the digest {digest}"));
    }
    Ok(statement)
}

fn b64(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(s.trim())
}
