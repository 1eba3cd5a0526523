//! Cosign's formats, read from a registry: signatures under the tag `sha256-<hex>.sig`
//! (simple-signing payloads, one per layer, the signature and certificates in the layer
//! annotations), attestations under `sha256-<hex>.att` (DSSE envelopes of in-toto statements),
//! and Rekor bundles (`dev.sigstore.cosign/bundle`, the signed entry timestamp checked against a
//! given Rekor key).
//!
//! Ours, on the project's ring / webpki / x509-parser: see crypto.rs for why not sigstore-rs.

use crate::SecretError;
use crate::crypto::{Certificate, CryptoError, PublicKey, certificates, verify_chain};
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

/// Why an attestor could not be built, or a signature, attestation or blob was refused.
#[derive(Debug, thiserror::Error)]
pub enum CosignError {
    /// A key, certificate, chain or signature check, with its own text.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error("failed to load Rekor public keys: {0}")]
    RekorKey(#[source] CryptoError),
    #[error("failed to load public key from k8s://{namespace}/{name}: {source}")]
    SecretRead { namespace: String, name: String, source: SecretError },
    #[error("failed to load public key from k8s://{namespace}/{name}: {source}")]
    SecretKey { namespace: String, name: String, source: CryptoError },
    /// The KMS reference.
    #[error("failed to load public key from {0}: KMS keys are not supported by this build of verno")]
    Kms(String),
    #[error("failed to load certificate from cert: {0}")]
    Certificate(#[source] CryptoError),
    #[error("failed to load certificate chain: {0}")]
    CertificateChain(#[source] CryptoError),
    #[error("failed to load validate certificate chain: {0}")]
    ChainValidation(#[source] CryptoError),
    #[error("failed to get roots from fulcio: the trusted root holds no Fulcio certificate")]
    NoFulcioRoots,
    #[error("failed to load Root certificates: {0}")]
    Roots(#[source] CryptoError),
    /// `field`: `subjectRegExp` or `issuerRegExp`.
    #[error("invalid {field} {pattern:?}: {source}")]
    Regex { field: &'static str, pattern: String, source: regex::Error },
    #[error("the signature annotation is not base64: {0}")]
    SignatureBase64(#[source] base64::DecodeError),
    #[error("failed to unmarshal JSON payload: {0}")]
    Payload(#[source] serde_json::Error),
    /// The digest the payload claims.
    #[error("invalid or missing digest in claim: {0}")]
    ClaimDigest(String),
    #[error("missing or incorrect annotation: {key}={value}")]
    Annotation { key: String, value: String },
    #[error("no certificate found on signature")]
    NoCertificate,
    #[error("failed to verify embedded SCT: {0}")]
    Sct(#[source] crate::sct::SctError),
    #[error("failed to load the ctlog public key: {0}")]
    CtKey(#[source] CryptoError),
    #[error("no attestor to verify the signature with")]
    NoAttestor,
    #[error("no certificate found with the signature")]
    NoBlobCertificate,
    /// `got`: the certificate's subject alternative names.
    #[error("subject mismatch: expected {expected}, got {}", .got.join(", "))]
    Subject { expected: String, got: Vec<String> },
    #[error("subject mismatch: expected a match of {pattern}, got {}", .got.join(", "))]
    SubjectRegexp { pattern: String, got: Vec<String> },
    #[error("issuer mismatch: expected {expected}, got {got}")]
    Issuer { expected: String, got: String },
    #[error("issuer mismatch: expected a match of {pattern}, got {got}")]
    IssuerRegexp { pattern: String, got: String },
    #[error("extension {name} mismatch: expected {expected}, got {got:?}")]
    Extension { name: String, expected: String, got: String },
    #[error("signature not found in transparency log (no Rekor bundle; set rekor.ignoreTlog to skip the check)")]
    NoBundle,
    /// A Rekor other than the public-good one, without its key.
    #[error(
        "no Rekor public key to check the transparency log entry with: verno knows the key of rekor.sigstore.dev only, give rekor.pubkey for {0}"
    )]
    NoRekorKey(String),
    #[error("invalid Rekor bundle: {0}")]
    BundleJson(#[source] serde_json::Error),
    #[error("invalid Rekor bundle: {0}")]
    BundleBase64(#[source] base64::DecodeError),
    #[error("invalid Rekor bundle: no Payload")]
    BundleNoPayload,
    /// The bundle's payload could not be written as canonical JSON.
    #[error("{0}")]
    Canonical(#[source] serde_json::Error),
    /// Rekor's key does not vouch for the signed entry timestamp.
    #[error("unable to verify the Rekor bundle: invalid signed entry timestamp")]
    BundleTimestamp(#[source] CryptoError),
    #[error("invalid Rekor bundle body: {0}")]
    BundleBodyBase64(#[source] base64::DecodeError),
    #[error("invalid Rekor bundle body: {0}")]
    BundleBodyJson(#[source] serde_json::Error),
    #[error("the Rekor bundle is about another signature")]
    BundleMismatch,
    #[error("failed to decode envelope: {0}")]
    Envelope(#[source] serde_json::Error),
    #[error("failed to decode payload: {0}")]
    EnvelopePayload(#[source] base64::DecodeError),
    #[error("no signatures in the envelope")]
    NoEnvelopeSignatures,
    #[error("failed to decode statement: {0}")]
    Statement(#[source] serde_json::Error),
    /// The image digest no subject has.
    #[error("no subject of the statement has the digest {0}")]
    StatementSubject(String),
}

/// A certificate transparency log: its id (SHA-256 of its key's DER) and key.
pub type CtLogKey = (Vec<u8>, PublicKey);

/// Who must have signed: built from one leaf attestor entry.
pub enum Signer {
    /// A public key (`keys`, or `certificates.cert` alone).
    Key(PublicKey),
    /// Certificates embedded in each signature, checked up to `roots` (keyless, or
    /// `certificates.certChain` alone), with an identity for keyless.
    /// `ct_logs`: the logs whose signed certificate timestamp a keyless certificate must
    /// carry (`ctlog.pubkey`, else Sigstore's public logs); `None` with `ctlog.ignoreSCT`.
    Roots { roots: Vec<Certificate>, identity: Option<IdentityRule>, ct_logs: Option<Vec<CtLogKey>> },
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

/// The transparency log requirement of an attestor: the keys an entry's signed timestamp is
/// checked with (`rekor.pubkey`, else the public-good Rekor's, as cosign trusts by default),
/// and, when there are none, the Rekor they were not given for.
pub struct Tlog {
    pub required: bool,
    pub keys: Vec<PublicKey>,
    pub url: String,
}

impl Tlog {
    pub fn of(rekor: Option<&Rekor>) -> Result<Tlog, CosignError> {
        let default = || Tlog {
            required: true,
            keys: crate::public_good::rekor_keys().to_vec(),
            url: crate::public_good::REKOR_URL.into(),
        };
        let Some(r) = rekor else { return Ok(default()) };
        let url = r.url.trim().trim_end_matches('/');
        let keys = if !r.pubkey.trim().is_empty() {
            vec![PublicKey::from_pem(&r.pubkey).map_err(CosignError::RekorKey)?]
        } else if url.is_empty() || url == crate::public_good::REKOR_URL {
            default().keys
        } else {
            Vec::new()
        };
        Ok(Tlog { required: !r.ignore_tlog, keys, url: if url.is_empty() { default().url } else { url.to_string() } })
    }

    /// No log to check.
    pub fn none() -> Tlog {
        Tlog { required: false, keys: Vec::new(), url: String::new() }
    }
}

/// The `Signer` of a leaf attestor entry; `secret_key` reads `keys.secret` (`cosign.pub`).
pub fn signer(
    a: &Attestor,
    secret_key: &dyn Fn(&str, &str) -> Result<String, SecretError>,
) -> Result<(Signer, Tlog, String), CosignError> {
    if let Some(k) = &a.keys {
        let alg = if k.signature_algorithm.is_empty() {
            a.signature_algorithm.clone()
        } else {
            k.signature_algorithm.clone()
        };
        let key = if !k.public_keys.trim().is_empty() {
            PublicKey::from_pem(&k.public_keys)?
        } else if let Some(s) = &k.secret {
            let pem = secret_key(&s.namespace, &s.name).map_err(|source| CosignError::SecretRead {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                source,
            })?;
            PublicKey::from_pem(&pem).map_err(|source| CosignError::SecretKey {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                source,
            })?
        } else {
            return Err(CosignError::Kms(k.kms.clone()));
        };
        return Ok((Signer::Key(key), Tlog::of(k.rekor.as_ref())?, alg));
    }
    if let Some(c) = &a.certificates {
        let tlog = Tlog::of(c.rekor.as_ref())?;
        if !c.certificate.trim().is_empty() {
            let cert = certificates(&c.certificate).map_err(CosignError::Certificate)?;
            let leaf = cert.into_iter().next().ok_or(CryptoError::NoCertificates)?;
            if !c.certificate_chain.trim().is_empty() {
                let chain = certificates(&c.certificate_chain).map_err(CosignError::CertificateChain)?;
                let (roots, inter) = split_chain(chain);
                verify_chain(&leaf, &inter, &roots, now()).map_err(CosignError::ChainValidation)?;
            }
            return Ok((Signer::Key(leaf.public_key()?), tlog, a.signature_algorithm.clone()));
        }
        let chain = certificates(&c.certificate_chain).map_err(CosignError::CertificateChain)?;
        let ct_logs = ct_logs(c.ctlog.as_ref())?;
        return Ok((Signer::Roots { roots: chain, identity: None, ct_logs }, tlog, a.signature_algorithm.clone()));
    }
    if let Some(k) = &a.keyless {
        // No roots given: Fulcio's, as cosign trusts by default.
        let roots = if k.roots.trim().is_empty() {
            let chain = crate::public_good::fulcio_chain().to_vec();
            if chain.is_empty() {
                return Err(CosignError::NoFulcioRoots);
            }
            chain
        } else {
            certificates(&k.roots).map_err(CosignError::Roots)?
        };
        let re = |s: &str, field: &'static str| -> Result<Option<regex::Regex>, CosignError> {
            if s.is_empty() {
                Ok(None)
            } else {
                regex::RegexBuilder::new(s).size_limit(1 << 20).build().map(Some).map_err(|source| CosignError::Regex {
                    field,
                    pattern: s.to_string(),
                    source,
                })
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
            Signer::Roots { roots, identity: Some(identity), ct_logs: ct_logs(k.ctlog.as_ref())? },
            Tlog::of(k.rekor.as_ref())?,
            a.signature_algorithm.clone(),
        ));
    }
    Ok((Signer::Anyone, Tlog::none(), String::new()))
}

/// The certificate transparency logs an attestor's certificates must have SCTs of: its
/// `ctlog.pubkey`, else Sigstore's public logs; none with `ctlog.ignoreSCT`.
fn ct_logs(c: Option<&CtLog>) -> Result<Option<Vec<CtLogKey>>, CosignError> {
    match c {
        Some(l) if l.ignore_sct => Ok(None),
        Some(l) if !l.pubkey.trim().is_empty() => {
            let block = ::pem::parse(l.pubkey.trim()).map_err(|e| CosignError::CtKey(CryptoError::KeyPem(e)))?;
            let key = PublicKey::from_spki_der(block.contents()).map_err(CosignError::CtKey)?;
            Ok(Some(vec![(sha2::Sha256::digest(block.contents()).to_vec(), key)]))
        }
        _ => Ok(Some(crate::public_good::ct_log_keys().iter().map(|l| (l.id.clone(), l.key.clone())).collect())),
    }
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
            Err(e) => last = e.to_string(),
        }
    }
    Err(ImageError::Failed(format!("no matching signatures: {last}")))
}

fn check_signature_layer(
    payload: &[u8],
    ann: &BTreeMap<String, String>,
    digest: &str,
    expect: &Expect,
) -> Result<(), CosignError> {
    let sig = b64(ann.get(SIGNATURE).map(String::as_str).unwrap_or("")).map_err(CosignError::SignatureBase64)?;
    let time = check_signer(expect, ann, payload, &sig)?;
    let _ = time;
    let v: Value = serde_json::from_slice(payload).map_err(CosignError::Payload)?;
    let claimed = v.pointer("/critical/image/docker-manifest-digest").and_then(Value::as_str).unwrap_or("");
    if claimed != digest {
        return Err(CosignError::ClaimDigest(claimed.to_string()));
    }
    for (k, want) in expect.annotations {
        let got = v.pointer("/optional").and_then(|o| o.get(k));
        let got = match got {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        if &got != want {
            return Err(CosignError::Annotation { key: k.clone(), value: want.clone() });
        }
    }
    Ok(())
}

/// Checks who signed `msg` with `sig` (and the transparency log entry): the key, or the
/// certificate in the annotations up to the roots, with its identity.
fn check_signer(expect: &Expect, ann: &BTreeMap<String, String>, msg: &[u8], sig: &[u8]) -> Result<i64, CosignError> {
    let mut at = now();
    if expect.tlog.required {
        at = check_bundle(expect.tlog, ann, msg, sig)?;
    }
    let key = match expect.signer {
        Signer::Anyone => return Ok(at),
        Signer::Key(k) => k.clone(),
        Signer::Roots { roots, identity, ct_logs } => {
            let leaf_pem = ann.get(CERTIFICATE).filter(|s| !s.is_empty()).ok_or(CosignError::NoCertificate)?;
            let leaf = certificates(leaf_pem)?.into_iter().next().ok_or(CosignError::NoCertificate)?;
            let inter = match ann.get(CHAIN).filter(|s| !s.trim().is_empty()) {
                Some(c) => certificates(c)?,
                None => Vec::new(),
            };
            verify_chain(&leaf, &inter, roots, at)?;
            leaf.valid_at(at)?;
            if let Some(rule) = identity {
                check_identity(&leaf, rule)?;
                // Keyless certificates carry the logs' SCTs (cosign checks them for keyless).
                if let Some(logs) = ct_logs {
                    let chain: Vec<Certificate> = inter.iter().chain(roots.iter()).cloned().collect();
                    crate::sct::verify_embedded(&leaf, &chain, logs).map_err(CosignError::Sct)?;
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
) -> Result<String, CosignError> {
    match signer {
        Signer::Anyone => Err(CosignError::NoAttestor),
        Signer::Key(k) => k.verify(algorithm, msg, sig).map(|()| String::new()).map_err(CosignError::from),
        Signer::Roots { roots, identity, .. } => {
            let pem = certificate.filter(|c| !c.trim().is_empty()).ok_or(CosignError::NoBlobCertificate)?;
            let leaf = certificates(pem)?.into_iter().next().ok_or(CosignError::NoBlobCertificate)?;
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

fn check_identity(leaf: &Certificate, rule: &IdentityRule) -> Result<(), CosignError> {
    let id = leaf.identity()?;
    if !rule.subject.is_empty() && !id.sans.iter().any(|s| verno_jmespath::wildcard::matches(&rule.subject, s)) {
        return Err(CosignError::Subject { expected: rule.subject.clone(), got: id.sans });
    }
    if let Some(re) = &rule.subject_regexp
        && !id.sans.iter().any(|s| re.is_match(s))
    {
        return Err(CosignError::SubjectRegexp { pattern: re.as_str().to_string(), got: id.sans });
    }
    if !rule.issuer.is_empty() && !verno_jmespath::wildcard::matches(&rule.issuer, &id.issuer) {
        return Err(CosignError::Issuer { expected: rule.issuer.clone(), got: id.issuer });
    }
    if let Some(re) = &rule.issuer_regexp
        && !re.is_match(&id.issuer)
    {
        return Err(CosignError::IssuerRegexp { pattern: re.as_str().to_string(), got: id.issuer });
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
            return Err(CosignError::Extension { name: name.clone(), expected: want.clone(), got: got.to_string() });
        }
    }
    Ok(())
}

/// Checks the Rekor bundle of a signature: the signed entry timestamp (Rekor's signature over
/// the canonical JSON of the entry) with the configured Rekor key, and that the entry is about
/// this signature and payload. Returns the entry's integrated time.
fn check_bundle(tlog: &Tlog, ann: &BTreeMap<String, String>, msg: &[u8], sig: &[u8]) -> Result<i64, CosignError> {
    let raw = ann.get(BUNDLE).filter(|s| !s.is_empty()).ok_or(CosignError::NoBundle)?;
    if tlog.keys.is_empty() {
        return Err(CosignError::NoRekorKey(tlog.url.clone()));
    }
    let bundle: Value = serde_json::from_str(raw).map_err(CosignError::BundleJson)?;
    let set = b64(bundle.get("SignedEntryTimestamp").and_then(Value::as_str).unwrap_or(""))
        .map_err(CosignError::BundleBase64)?;
    let payload = bundle.get("Payload").ok_or(CosignError::BundleNoPayload)?;
    // Canonical JSON: keys sorted, no spaces (serde_json's map is ordered by key here).
    let canonical = serde_json::to_vec(&canonical(payload)).map_err(CosignError::Canonical)?;
    // Any of the log's keys (the public-good Rekor has had more than one).
    let mut checked = Err(CryptoError::NoCertificates);
    for key in &tlog.keys {
        checked = key.verify("sha256", &canonical, &set);
        if checked.is_ok() {
            break;
        }
    }
    checked.map_err(CosignError::BundleTimestamp)?;
    let body = b64(payload.get("body").and_then(Value::as_str).unwrap_or("")).map_err(CosignError::BundleBodyBase64)?;
    let entry: Value = serde_json::from_slice(&body).map_err(CosignError::BundleBodyJson)?;
    let hash = entry.pointer("/spec/data/hash/value").and_then(Value::as_str).unwrap_or("");
    let content = entry.pointer("/spec/signature/content").and_then(Value::as_str).unwrap_or("");
    if hash != format!("{:x}", sha2::Sha256::digest(msg)) || b64(content).ok().as_deref() != Some(sig) {
        return Err(CosignError::BundleMismatch);
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
            Err(e) => last = e.to_string(),
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
) -> Result<Value, CosignError> {
    let env: Value = serde_json::from_slice(envelope).map_err(CosignError::Envelope)?;
    let payload_type = env.get("payloadType").and_then(Value::as_str).unwrap_or("");
    let body = b64(env.get("payload").and_then(Value::as_str).unwrap_or("")).map_err(CosignError::EnvelopePayload)?;
    // DSSE's pre-authentication encoding is what is signed.
    let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), body.len()).into_bytes();
    pae.extend_from_slice(&body);
    let sigs: Vec<Vec<u8>> = env
        .get("signatures")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|s| s.get("sig").and_then(Value::as_str)).filter_map(|s| b64(s).ok()).collect())
        .unwrap_or_default();
    if !matches!(expect.signer, Signer::Anyone) {
        let mut last = CosignError::NoEnvelopeSignatures;
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
    let statement: Value = serde_json::from_slice(&body).map_err(CosignError::Statement)?;
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let about = statement
        .get("subject")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|s| s.pointer("/digest/sha256").and_then(Value::as_str) == Some(hex)));
    if !about {
        return Err(CosignError::StatementSubject(digest.to_string()));
    }
    Ok(statement)
}

fn b64(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(s.trim())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // a test fails by panicking

    use super::*;
    use verno_api::images::{SecretRef, StaticKeys};

    fn key_attestor(keys: StaticKeys) -> Attestor {
        Attestor { keys: Some(keys), ..Default::default() }
    }

    #[test]
    fn attestor_errors_keep_their_cause_and_their_text() {
        let not_pem = key_attestor(StaticKeys { public_keys: "not a key".into(), ..Default::default() });
        match signer(&not_pem, &|_, _| Ok(String::new())) {
            Err(e @ CosignError::Crypto(CryptoError::KeyPem(_))) => {
                assert!(e.to_string().starts_with("failed to load public key from PEM: "), "{e}");
            }
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("not a key was accepted"),
        }
        let secret = key_attestor(StaticKeys {
            secret: Some(SecretRef { namespace: "ns".into(), name: "keys".into() }),
            ..Default::default()
        });
        let no_cluster =
            |ns: &str, name: &str| Err(SecretError::NoCluster { namespace: ns.to_string(), name: name.to_string() });
        match signer(&secret, &no_cluster) {
            Err(e @ CosignError::SecretRead { source: SecretError::NoCluster { .. }, .. }) => assert_eq!(
                e.to_string(),
                "failed to load public key from k8s://ns/keys: secret ns/keys cannot be read here (no cluster)"
            ),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a secret was read without a cluster"),
        }
        let kms = key_attestor(StaticKeys { kms: "gcpkms://k".into(), ..Default::default() });
        assert_eq!(
            signer(&kms, &|_, _| Ok(String::new())).err().map(|e| e.to_string()).as_deref(),
            Some("failed to load public key from gcpkms://k: KMS keys are not supported by this build of verno")
        );
        let bad_regexp = Attestor {
            keyless: Some(verno_api::images::Keyless {
                subject_regexp: "(".into(),
                roots: rcgen::generate_simple_self_signed(vec!["root".into()]).unwrap().cert.pem(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match signer(&bad_regexp, &|_, _| Ok(String::new())) {
            Err(e @ CosignError::Regex { field: "subjectRegExp", .. }) => {
                assert!(e.to_string().starts_with("invalid subjectRegExp \"(\": "), "{e}");
            }
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a broken regexp was accepted"),
        }
    }

    #[test]
    fn identity_mismatches_read_as_before() {
        let sans = vec!["a@example.com".to_string(), "b@example.com".to_string()];
        let e = CosignError::Subject { expected: "c@example.com".into(), got: sans.clone() };
        assert_eq!(e.to_string(), "subject mismatch: expected c@example.com, got a@example.com, b@example.com");
        let e = CosignError::SubjectRegexp { pattern: "^c@".into(), got: sans };
        assert_eq!(e.to_string(), "subject mismatch: expected a match of ^c@, got a@example.com, b@example.com");
        let e = CosignError::Extension { name: "githubWorkflowRef".into(), expected: "main".into(), got: "dev".into() };
        assert_eq!(e.to_string(), "extension githubWorkflowRef mismatch: expected main, got \"dev\"");
    }

    #[test]
    fn a_signature_that_does_not_verify_is_told_from_an_unusable_key() {
        let pair = rcgen::KeyPair::generate().unwrap();
        let key = PublicKey::from_pem(&pair.public_key_pem()).unwrap();
        let signer = Signer::Key(key);
        match verify_blob(&signer, "", b"message", b"not a signature", None) {
            Err(e @ CosignError::Crypto(CryptoError::BadSignature)) => {
                assert_eq!(e.to_string(), "invalid signature when validating ASN.1 encoded signature");
            }
            other => panic!("{other:?}"),
        }
        match verify_blob(&signer, "sha1", b"message", b"not a signature", None) {
            Err(e @ CosignError::Crypto(CryptoError::SignatureAlgorithm(_))) => {
                assert_eq!(e.to_string(), "signature algorithm sha1 is not supported for this key type");
            }
            other => panic!("{other:?}"),
        }
    }
}
