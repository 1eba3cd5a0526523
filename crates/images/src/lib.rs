//! Image verification for `verifyImages` rules: the engine's [`ImageVerifier`] port on a real
//! OCI registry. The engine decides which images, attestor set counts, conditions and
//! messages; this crate reads signatures and attestations (cosign's formats) and checks them.
//!
//! Built here: cosign signatures and in-toto attestations (DSSE) with public keys (PEM, or a
//! Secret's `cosign.pub`), certificates (with a chain), keyless certificates against given
//! roots with subject / issuer / extension rules, Rekor bundles against a given Rekor key,
//! registry auth from docker config Secrets, plain HTTP for `allowInsecureRegistry`, and a
//! cache of passes (Kyverno's `--imageVerifyCacheTTLDuration` / `--imageVerifyCacheMaxSize`).
//! Not built: KMS keys, Notary, Sigstore bundles (`type: SigstoreBundle`, `cosignOCI11`),
//! certificate transparency (SCT) checks, Sigstore's TUF trust root (public Fulcio roots and
//! Rekor key), cloud credential providers; each is refused with a message saying so.

mod cosign;
pub mod crypto;
pub mod public_good;
pub mod reference;
pub mod registry;
pub mod sct;

use base64::Engine as _;
use reference::Reference;
use registry::{Credentials, Session};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verno_api::images::RegistryCredentials;
use verno_engine::verify_images::{ImageError, ImageVerifier, SignatureCheck, Verified};

/// Reads a Secret (`namespace` empty: Verno's own namespace) as the API returns it. The error
/// is the reader's message (the API call's), shown verbatim.
pub type SecretReader = Arc<dyn Fn(&str, &str) -> Result<Value, String> + Send + Sync>;

/// Why the registry client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TLS configuration (rustls refused the protocol versions).
    #[error("{0}")]
    Tls(#[source] rustls::Error),
    #[error("cannot start the registry client: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the registry client: {0}")]
    Build(#[source] reqwest::Error),
}

/// Why a Secret (registry credentials, `cosign.pub`) could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// No [`SecretReader`] (the CLI).
    #[error("secret {namespace}/{name} cannot be read here (no cluster)")]
    NoCluster { namespace: String, name: String },
    /// The [`SecretReader`]'s message (the API call's), shown verbatim.
    #[error("{0}")]
    Read(String),
    #[error("the secret has no cosign.pub")]
    NoCosignPub,
    #[error("cosign.pub is not base64: {0}")]
    CosignPubBase64(#[source] base64::DecodeError),
    #[error("cosign.pub is not text")]
    CosignPubText(#[source] std::string::FromUtf8Error),
}

/// Kyverno's cache defaults.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60 * 60);
pub const DEFAULT_CACHE_SIZE: usize = 1000;

/// The verification cache: passes only, by Kyverno's key, each with the digest it verified,
/// for a TTL, at most `size` entries.
pub struct Cache {
    ttl: Duration,
    size: usize,
    entries: Mutex<HashMap<String, (Instant, String)>>,
}

impl Cache {
    pub fn new(ttl: Duration, size: usize) -> Cache {
        Cache { ttl: if ttl.is_zero() { DEFAULT_CACHE_TTL } else { ttl }, size, entries: Mutex::new(HashMap::new()) }
    }

    fn get(&self, key: &str) -> Option<String> {
        let Ok(mut m) = self.entries.lock() else { return None };
        match m.get(key) {
            Some((t, digest)) if t.elapsed() < self.ttl => Some(digest.clone()),
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&self, key: &str, digest: &str) {
        if self.size == 0 {
            return;
        }
        let Ok(mut m) = self.entries.lock() else { return };
        if m.len() >= self.size && !m.contains_key(key) {
            let ttl = self.ttl;
            m.retain(|_, (t, _)| t.elapsed() < ttl);
            if m.len() >= self.size
                && let Some(oldest) = m.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone())
            {
                m.remove(&oldest);
            }
        }
        m.insert(key.to_string(), (Instant::now(), digest.to_string()));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

enum Exec {
    /// Kept in an Option so that drop can shut it down without blocking (a verifier may be
    /// dropped inside another runtime, where a blocking drop panics).
    Own(Option<tokio::runtime::Runtime>, tokio::runtime::Handle),
    Handle(tokio::runtime::Handle),
}

impl Drop for Exec {
    fn drop(&mut self) {
        if let Exec::Own(rt, _) = self
            && let Some(rt) = rt.take()
        {
            rt.shutdown_background();
        }
    }
}

/// Verifies images against their registries.
pub struct Verifier {
    http: reqwest::Client,
    exec: Exec,
    secrets: Option<SecretReader>,
    cache: Option<Cache>,
    failures: Failures,
}

/// Checks that failed lately, by image digest and check ([`failure_key`]): a definite "no"
/// (bad or missing signatures) is kept [`FAILED_FOR`], a registry that could not be reached
/// or was too slow only [`UNREACHABLE_FOR`]: long enough that a burst of Pods of one image
/// (a Deployment's replicas) waits on the registry once, short enough that an image signed
/// just after a refusal, or a registry blip, refuses little more. At most
/// [`MAX_FAILURES`] are kept.
#[derive(Default)]
struct Failures(std::sync::Mutex<HashMap<u64, (std::time::Instant, ImageError)>>);

const FAILED_FOR: Duration = Duration::from_secs(10);
const UNREACHABLE_FOR: Duration = Duration::from_secs(5);
const MAX_FAILURES: usize = 1024;

impl Failures {
    fn get(&self, key: u64) -> Option<ImageError> {
        let map = self.0.lock().ok()?;
        map.get(&key).filter(|(until, _)| *until > std::time::Instant::now()).map(|(_, e)| e.clone())
    }

    fn put(&self, key: u64, e: ImageError) {
        let Ok(mut map) = self.0.lock() else { return };
        let now = std::time::Instant::now();
        if map.len() >= MAX_FAILURES {
            map.retain(|_, (until, _)| *until > now);
            if map.len() >= MAX_FAILURES {
                map.clear();
            }
        }
        let ttl = match e {
            ImageError::Failed(_) => FAILED_FOR,
            ImageError::Unreachable(_) => UNREACHABLE_FOR,
        };
        map.insert(key, (now + ttl, e));
    }
}

/// What makes two checks the same: the digest and everything of the check but its image name.
fn failure_key(digest: &str, check: &SignatureCheck) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    digest.hash(&mut h);
    format!(
        "{:?}|{}|{:?}|{:?}|{}|{}|{:?}|{}",
        check.attestor,
        check.repository,
        check.annotations,
        check.credentials,
        check.namespace,
        check.kind,
        check.attestation,
        check.cosign_oci11
    )
    .hash(&mut h);
    h.finish()
}

impl Verifier {
    /// A verifier with its own single-thread runtime (the CLI): no cache, as Kyverno's CLI.
    pub fn new() -> Result<Verifier, ClientError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("verno-registry")
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        let handle = rt.handle().clone();
        Ok(Verifier {
            http: client()?,
            exec: Exec::Own(Some(rt), handle),
            secrets: None,
            cache: None,
            failures: Failures::default(),
        })
    }

    /// A verifier on a running runtime (the server); its calls block the calling thread, which
    /// must not be one of the runtime's workers (the server evaluates on the blocking pool).
    pub fn on(handle: tokio::runtime::Handle) -> Result<Verifier, ClientError> {
        Ok(Verifier {
            http: client()?,
            exec: Exec::Handle(handle),
            secrets: None,
            cache: None,
            failures: Failures::default(),
        })
    }

    pub fn with_secrets(mut self, reader: SecretReader) -> Verifier {
        self.secrets = Some(reader);
        self
    }

    pub fn with_cache(mut self, cache: Cache) -> Verifier {
        self.cache = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        match &self.exec {
            Exec::Own(_, h) => h,
            Exec::Handle(h) => h,
        }
    }

    fn secret(&self, namespace: &str, name: &str) -> Result<Value, SecretError> {
        match &self.secrets {
            Some(read) => read(namespace, name).map_err(SecretError::Read),
            None => Err(SecretError::NoCluster { namespace: namespace.to_string(), name: name.to_string() }),
        }
    }

    /// `cosign.pub` of a Secret.
    fn secret_key(&self, namespace: &str, name: &str) -> Result<String, SecretError> {
        let s = self.secret(namespace, name)?;
        let raw = s.pointer("/data/cosign.pub").and_then(Value::as_str).ok_or(SecretError::NoCosignPub)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(raw).map_err(SecretError::CosignPubBase64)?;
        String::from_utf8(bytes).map_err(SecretError::CosignPubText)
    }

    /// Credentials for `registry` from the docker config Secrets the policy names.
    fn credentials(
        &self,
        creds: Option<&RegistryCredentials>,
        registry: &str,
    ) -> Result<Option<Credentials>, ImageError> {
        let Some(c) = creds else { return Ok(None) };
        for p in &c.providers {
            if p != "default" {
                tracing::debug!(provider = %p, "image registry credential providers other than `default` are not supported");
            }
        }
        for s in &c.secrets {
            let (ns, name) = s.split_once('/').unwrap_or(("", s));
            let secret =
                self.secret(ns, name).map_err(|e| ImageError::Failed(format!("failed to fetch secrets: {e}")))?;
            if let Some(found) = docker_config_auth(&secret, registry) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    fn session(&self, creds: Option<&RegistryCredentials>, registry: &str) -> Result<Session<'_>, ImageError> {
        let insecure = creds.is_some_and(|c| c.allow_insecure_registry);
        Ok(Session::new(&self.http, self.handle(), insecure, self.credentials(creds, registry)?))
    }
}

/// Whether a manifest is an index (a manifest list) rather than one image's.
fn is_index(m: &registry::Manifest, json: &Value) -> bool {
    let media = if m.media_type.is_empty() {
        json.get("mediaType").and_then(Value::as_str).unwrap_or("")
    } else {
        &m.media_type
    };
    media.contains("index") || media.contains("manifest.list") || (media.is_empty() && json.get("manifests").is_some())
}

/// Kyverno's image data for `image` (`imageRegistry` context entries): the reference's parts
/// as go-containerregistry names them (Docker Hub is `index.docker.io`), the digest it
/// resolves to, and for an index the linux/amd64 image's manifest (Kyverno's default
/// platform) with the index itself as `manifestList`.
fn image_data(session: &Session, image: &str, r: &Reference) -> Result<Value, ImageError> {
    let not_found = || ImageError::Failed(format!("image {image} not found"));
    let top = session.manifest(r, r.version())?.ok_or_else(not_found)?;
    let top_json = top.json()?;
    let (manifest, list) = if is_index(&top, &top_json) {
        let entries = top_json.get("manifests").and_then(Value::as_array).cloned().unwrap_or_default();
        let platform = |e: &Value, os: &str, arch: &str| {
            e.pointer("/platform/os").and_then(Value::as_str) == Some(os)
                && e.pointer("/platform/architecture").and_then(Value::as_str) == Some(arch)
        };
        let chosen = entries
            .iter()
            .find(|e| platform(e, "linux", "amd64"))
            .ok_or_else(|| ImageError::Failed(format!("no child with platform linux/amd64 in index {image}")))?;
        let digest = chosen.get("digest").and_then(Value::as_str).unwrap_or("");
        let m = session.manifest(r, digest)?.ok_or_else(not_found)?;
        let j = m.json()?;
        (j, Some(top_json))
    } else {
        (top_json, None)
    };
    let config_digest = manifest.pointer("/config/digest").and_then(Value::as_str).unwrap_or("");
    let config: Value = serde_json::from_slice(&session.blob(r, config_digest)?)
        .map_err(|e| ImageError::Failed(format!("failed to decode config for image reference: {image}, error: {e}")))?;
    let registry = if r.registry == "docker.io" { "index.docker.io" } else { r.registry.as_str() };
    // go-containerregistry's identifier: the digest (after its tag when both are written), or
    // the tag.
    let identifier = match (r.digest.is_empty(), image.split_once('@').map(|(before, _)| before)) {
        (false, Some(before)) => match before.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
            Some((_, tag)) => format!("{tag}@{}", r.digest),
            None => r.digest.clone(),
        },
        _ => r.tag.clone(),
    };
    Ok(serde_json::json!({
        "image": image,
        "resolvedImage": format!("{registry}/{}@{}", r.repository, top.digest),
        "registry": registry,
        "repository": r.repository,
        "identifier": identifier,
        "manifestList": list,
        "manifest": manifest,
        "configData": config,
    }))
}

/// A reqwest client builder on rustls with ring, trusting `roots` (the system's when `None`):
/// the registry client's, and the controller's for calls to services.
pub fn https_client(roots: Option<rustls::RootCertStore>) -> Result<reqwest::ClientBuilder, ClientError> {
    let roots = roots.unwrap_or_else(|| {
        let mut system = rustls::RootCertStore::empty();
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = system.add(c);
        }
        system
    });
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(reqwest::Client::builder().use_preconfigured_tls(tls))
}

/// The registry client: the system's roots.
fn client() -> Result<reqwest::Client, ClientError> {
    https_client(None)?
        .connect_timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .map_err(ClientError::Build)
}

/// The basic credentials a docker config Secret holds for `registry`.
fn docker_config_auth(secret: &Value, registry: &str) -> Option<Credentials> {
    let data = secret.get("data")?;
    let raw = data.get(".dockerconfigjson").or_else(|| data.get(".dockercfg"))?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
    let cfg: Value = serde_json::from_slice(&bytes).ok()?;
    let auths = cfg.get("auths").unwrap_or(&cfg).as_object()?;
    let hub = registry == "docker.io" || registry == "index.docker.io";
    let entry = auths.iter().find_map(|(k, v)| {
        let host = k.trim_start_matches("https://").trim_start_matches("http://").split('/').next().unwrap_or("");
        (host == registry || (hub && (host == "index.docker.io" || host == "docker.io"))).then_some(v)
    })?;
    if let (Some(u), Some(p)) =
        (entry.get("username").and_then(Value::as_str), entry.get("password").and_then(Value::as_str))
    {
        return Some(Credentials { username: u.into(), password: p.into() });
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(entry.get("auth")?.as_str()?).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some(Credentials { username: u.into(), password: p.into() })
}

/// The engine's port carries messages: a check that was answered and refused, as text.
fn failed(e: impl std::fmt::Display) -> ImageError {
    ImageError::Failed(e.to_string())
}

impl ImageVerifier for Verifier {
    fn verify(&self, check: &SignatureCheck) -> Result<Verified, ImageError> {
        match check.kind {
            "Notary" => {
                return Err(ImageError::Failed("Notary signatures are not supported by this build of verno".into()));
            }
            "SigstoreBundle" => {
                return Err(ImageError::Failed("Sigstore bundles are not supported by this build of verno".into()));
            }
            _ => {}
        }
        if check.cosign_oci11 {
            return Err(ImageError::Failed(
                "cosignOCI11 (OCI 1.1 referrers) is not supported by this build of verno".into(),
            ));
        }
        let image = Reference::parse(check.image).map_err(failed)?;
        let deadline = std::time::Instant::now() + registry::BUDGET;
        let session = self.session(check.credentials, &image.registry)?.bounded(deadline, check.cancel);
        let digest = cosign::resolve(&session, &image)?;
        // A check that just failed on this digest fails again without the registry.
        let key = failure_key(&digest, check);
        if let Some(e) = self.failures.get(key) {
            return Err(e);
        }
        let (signer, tlog, algorithm) =
            cosign::signer(check.attestor, &|ns, name| self.secret_key(ns, name)).map_err(failed)?;
        let expect =
            cosign::Expect { signer: &signer, tlog: &tlog, algorithm: &algorithm, annotations: check.annotations };
        let (sigs, sig_session) = if check.repository.is_empty() {
            (image.clone(), None)
        } else {
            let r = image.in_repository(check.repository).map_err(|e| {
                ImageError::Failed(format!("failed to parse signature repository {}: {e}", check.repository))
            })?;
            let s = self.session(check.credentials, &r.registry)?.bounded(deadline, check.cancel);
            (r, Some(s))
        };
        let session = sig_session.as_ref().unwrap_or(&session);
        let out = match check.attestation {
            None => cosign::verify_signatures(session, &sigs, &digest, &expect),
            Some(_) => cosign::verify_attestations(session, &sigs, &digest, &expect),
        };
        if let Err(e) = &out {
            self.failures.put(key, e.clone());
        }
        out
    }

    fn digest(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
        _namespace: &str,
    ) -> Result<String, ImageError> {
        let r = Reference::parse(image).map_err(failed)?;
        let session = self.session(credentials, &r.registry)?;
        cosign::resolve(&session, &r)
    }

    fn image_data(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
        _namespace: &str,
    ) -> Result<Value, ImageError> {
        let r = Reference::parse(image).map_err(failed)?;
        let session = self.session(credentials, &r.registry)?;
        image_data(&session, image, &r)
    }

    fn verify_blob(
        &self,
        attestor: &verno_api::images::Attestor,
        message: &[u8],
        signature: &[u8],
        certificate: Option<&str>,
    ) -> Result<String, ImageError> {
        let (signer, _tlog, algorithm) =
            cosign::signer(attestor, &|ns, name| self.secret_key(ns, name)).map_err(failed)?;
        cosign::verify_blob(&signer, &algorithm, message, signature, certificate).map_err(failed)
    }

    fn cached(&self, key: &str) -> Option<String> {
        self.cache.as_ref().and_then(|c| c.get(key))
    }

    fn remember(&self, key: &str, digest: &str) {
        if let Some(c) = &self.cache {
            c.put(key, digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_secrets() {
        let cfg = serde_json::json!({"auths": {"127.0.0.1:5000": {"auth": base64::engine::general_purpose::STANDARD.encode("u:p")}}});
        let secret = serde_json::json!({"data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(cfg.to_string())}});
        assert_eq!(
            docker_config_auth(&secret, "127.0.0.1:5000"),
            Some(Credentials { username: "u".into(), password: "p".into() })
        );
        assert_eq!(docker_config_auth(&secret, "ghcr.io"), None);
    }

    #[test]
    fn cache_keeps_passes_for_a_while_and_is_bounded() {
        let c = Cache::new(Duration::from_secs(60), 2);
        c.put("a", "sha256:a");
        c.put("b", "sha256:b");
        c.put("c", "sha256:c");
        assert_eq!(c.len(), 2);
        assert_eq!(c.get("c").as_deref(), Some("sha256:c"));
        let short = Cache::new(Duration::from_millis(1), 10);
        short.put("a", "sha256:a");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(short.get("a"), None);
    }
}
