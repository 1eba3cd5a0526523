//! A small OCI distribution client: manifests and blobs over HTTPS (plain HTTP only for
//! registries a policy marks `allowInsecureRegistry`), anonymous, basic or bearer-token auth.
//!
//! Ours rather than `oci-client`: verification needs only three reads (a manifest by tag or
//! digest, a blob, a token), every read must be bounded in size and time, and errors must say
//! whether the registry was unreachable (Kyverno: `error`) or answered no (`fail`), which a
//! general client hides behind its own error type. `oci-client` 0.15 would also bring a second
//! HTTP stack configuration to keep in step with the project's reqwest.

use crate::reference::{Reference, valid_digest};
use base64::Engine as _;
use sha2::Digest as _;
use std::time::Duration;
use verno_engine::verify_images::ImageError;

/// The largest manifest read (registries cap them at 4 MiB too).
pub const MAX_MANIFEST: usize = 4 << 20;
/// The largest blob read (signature payloads and attestation envelopes are small).
pub const MAX_BLOB: usize = 16 << 20;
/// The longest one registry exchange may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest all the exchanges of one session (one image's verification) may take together:
/// a registry that answers each exchange just under [`TIMEOUT`] cannot hold an evaluation for
/// minutes.
pub const BUDGET: Duration = Duration::from_secs(30);

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

/// Basic credentials for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// A manifest as read: its bytes, media type and digest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub digest: String,
}

impl Manifest {
    pub fn json(&self) -> Result<serde_json::Value, ImageError> {
        serde_json::from_slice(&self.bytes)
            .map_err(|e| ImageError::Failed(format!("the manifest {} is not JSON: {e}", self.digest)))
    }
}

/// One registry session: a reference's registry, with its scheme and credentials.
pub struct Session<'a> {
    pub http: &'a reqwest::Client,
    pub runtime: &'a tokio::runtime::Handle,
    pub insecure: bool,
    pub credentials: Option<Credentials>,
    token: std::sync::Mutex<Option<String>>,
    /// When the session's exchanges must be over ([`BUDGET`] from its start, unless given).
    deadline: std::time::Instant,
    /// The caller's cancel flag (the request's deadline passed), checked before each exchange.
    cancel: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> Session<'a> {
    pub fn new(
        http: &'a reqwest::Client,
        runtime: &'a tokio::runtime::Handle,
        insecure: bool,
        credentials: Option<Credentials>,
    ) -> Session<'a> {
        Session {
            http,
            runtime,
            insecure,
            credentials,
            token: std::sync::Mutex::new(None),
            deadline: std::time::Instant::now() + BUDGET,
            cancel: None,
        }
    }

    /// The same session held to `deadline` and stopped by `cancel`.
    pub fn bounded(mut self, deadline: std::time::Instant, cancel: Option<&'a std::sync::atomic::AtomicBool>) -> Self {
        self.deadline = deadline;
        self.cancel = cancel;
        self
    }

    fn base(&self, r: &Reference) -> String {
        format!("{}://{}/v2/{}", if self.insecure { "http" } else { "https" }, r.host(), r.repository)
    }

    /// The manifest of a tag or digest; `Ok(None)` when the registry says it does not exist.
    pub fn manifest(&self, r: &Reference, version: &str) -> Result<Option<Manifest>, ImageError> {
        let url = format!("{}/manifests/{version}", self.base(r));
        let Some((bytes, headers)) = self.get(r, &url, Some(MANIFEST_TYPES), MAX_MANIFEST)? else { return Ok(None) };
        let computed = format!("sha256:{:x}", sha2::Sha256::digest(&bytes));
        if valid_digest(version) && computed != version {
            return Err(ImageError::Failed(format!(
                "the registry answered {url} with a manifest whose digest is {computed}"
            )));
        }
        let media_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        Ok(Some(Manifest { bytes, media_type, digest: computed }))
    }

    /// A blob, checked against its digest.
    pub fn blob(&self, r: &Reference, digest: &str) -> Result<Vec<u8>, ImageError> {
        if !valid_digest(digest) {
            return Err(ImageError::Failed(format!("invalid blob digest {digest:?}")));
        }
        let url = format!("{}/blobs/{digest}", self.base(r));
        let Some((bytes, _)) = self.get(r, &url, None, MAX_BLOB)? else {
            return Err(ImageError::Failed(format!("blob {digest} not found in {}/{}", r.registry, r.repository)));
        };
        let computed = format!("sha256:{:x}", sha2::Sha256::digest(&bytes));
        if computed != digest {
            return Err(ImageError::Failed(format!("blob {digest} has digest {computed}")));
        }
        Ok(bytes)
    }

    /// GET with auth: anonymous (or the session's token), then what a 401 asks for.
    fn get(
        &self,
        r: &Reference,
        url: &str,
        accept: Option<&str>,
        limit: usize,
    ) -> Result<Option<(Vec<u8>, reqwest::header::HeaderMap)>, ImageError> {
        let token = self.token.lock().ok().and_then(|t| t.clone());
        let first = self.send(url, accept, token.as_deref().map(Auth::Bearer).unwrap_or(Auth::None), limit)?;
        let (status, headers, bytes) = match first {
            (401, h, _) => {
                let challenge = h.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let auth = self.answer(r, &challenge)?;
                self.send(url, accept, auth.as_ref(), limit)?
            }
            other => other,
        };
        match status {
            200 => Ok(Some((bytes, headers))),
            404 => Ok(None),
            401 | 403 => Err(ImageError::Failed(format!(
                "GET {url}: {} (UNAUTHORIZED): authentication required{}",
                status,
                if self.credentials.is_some() { " (the credentials were refused)" } else { "" }
            ))),
            s => Err(ImageError::Failed(format!(
                "GET {url}: unexpected status {s}: {}",
                String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>()
            ))),
        }
    }

    /// Works out the credentials a 401 challenge asks for: basic, or a bearer token from the
    /// realm (with basic credentials when we have them).
    fn answer(&self, r: &Reference, challenge: &str) -> Result<Auth<String>, ImageError> {
        let lower = challenge.to_ascii_lowercase();
        if lower.starts_with("basic") {
            return Ok(match &self.credentials {
                Some(c) => Auth::Basic(c.clone()),
                None => Auth::None,
            });
        }
        if !lower.starts_with("bearer") {
            return Ok(Auth::None);
        }
        let params = challenge_params(challenge.get(6..).unwrap_or(""));
        let realm = params.iter().find(|(k, _)| k == "realm").map(|(_, v)| v.clone()).unwrap_or_default();
        if realm.is_empty() {
            return Ok(Auth::None);
        }
        let mut query: Vec<(String, String)> = Vec::new();
        if let Some((_, s)) = params.iter().find(|(k, _)| k == "service") {
            query.push(("service".into(), s.clone()));
        }
        let scope = params
            .iter()
            .find(|(k, _)| k == "scope")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| format!("repository:{}:pull", r.repository));
        query.push(("scope".into(), scope));
        let url = reqwest::Url::parse_with_params(&realm, &query)
            .map_err(|e| ImageError::Failed(format!("the registry's token realm {realm:?} is not a URL: {e}")))?;
        let auth = match &self.credentials {
            Some(c) => Auth::Basic(c.clone()),
            None => Auth::None,
        };
        let (status, _, body) = self.send(url.as_str(), None, auth.as_ref(), 1 << 20)?;
        if status != 200 {
            return Err(ImageError::Failed(format!("GET {realm}: token request answered {status}")));
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let token = v.get("token").or_else(|| v.get("access_token")).and_then(|t| t.as_str()).unwrap_or("").to_string();
        if token.is_empty() {
            return Err(ImageError::Failed(format!("GET {realm}: no token in the answer")));
        }
        if let Ok(mut t) = self.token.lock() {
            *t = Some(token.clone());
        }
        Ok(Auth::Bearer(token))
    }

    fn send(
        &self,
        url: &str,
        accept: Option<&str>,
        auth: Auth<&str>,
        limit: usize,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), ImageError> {
        if self.cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(ImageError::Unreachable(format!("GET {url}: stopped: the request's deadline passed")));
        }
        let left = self.deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(ImageError::Unreachable(format!(
                "GET {url}: the registry is too slow: verifying one image may take {} s",
                BUDGET.as_secs()
            )));
        }
        let mut req = self.http.get(url).timeout(TIMEOUT.min(left));
        if let Some(a) = accept {
            req = req.header("Accept", a);
        }
        req = match auth {
            Auth::None => req,
            Auth::Basic(c) => req.header(
                "Authorization",
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password))
                ),
            ),
            Auth::Bearer(t) => req.bearer_auth(t),
        };
        let url_owned = url.to_string();
        self.runtime.block_on(async move {
            let mut resp = req.send().await.map_err(|e| classify(&url_owned, &e))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| classify(&url_owned, &e))? {
                if body.len() + chunk.len() > limit {
                    return Err(ImageError::Failed(format!("GET {url_owned}: the answer is over {} MiB", limit >> 20)));
                }
                body.extend_from_slice(&chunk);
            }
            Ok((status, headers, body))
        })
    }
}

/// Authorization for one request.
#[derive(Debug, Clone)]
enum Auth<S> {
    None,
    Basic(Credentials),
    Bearer(S),
}

impl Auth<String> {
    fn as_ref(&self) -> Auth<&str> {
        match self {
            Auth::None => Auth::None,
            Auth::Basic(c) => Auth::Basic(c.clone()),
            Auth::Bearer(t) => Auth::Bearer(t.as_str()),
        }
    }
}

/// Connection failures and timeouts mean the registry is unreachable (`error`); anything the
/// registry answered is a verification failure.
fn classify(url: &str, e: &reqwest::Error) -> ImageError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_connect() || e.is_timeout() || e.is_request() {
        ImageError::Unreachable(format!("GET {url}: {msg}"))
    } else {
        ImageError::Failed(format!("GET {url}: {msg}"))
    }
}

/// `key="value", key=value` pairs of a `WWW-Authenticate` challenge.
fn challenge_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest.get(..eq).unwrap_or("").trim().trim_start_matches(',').trim().to_ascii_lowercase();
        rest = rest.get(eq + 1..).unwrap_or("").trim_start();
        let value;
        if let Some(q) = rest.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            value = q.get(..end).unwrap_or("").to_string();
            rest = q.get(end + 1..).unwrap_or("");
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest.get(..end).unwrap_or("").trim().to_string();
            rest = rest.get(end..).unwrap_or("");
        }
        out.push((key, value));
        rest = rest.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn challenges() {
        let p = super::challenge_params(
            r#" realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        );
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[1], ("service".into(), "registry.example".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull".into()));
    }
}
