//! Calls to services outside the Kubernetes API (`apiCall.service` of GlobalContextEntries):
//! `GET` or `POST` with a JSON body, headers as given, TLS verified against the entry's CA
//! bundle (or the system's roots when it has none), bounded in time and size. Kyverno's
//! errors: `HTTP <status>: <body>` for a non-2xx answer, and its response-length message.
//!
//! Unlike Kyverno, Verno does not add its own ServiceAccount token to calls that carry no
//! `Authorization` header: a policy author's URL must not receive the controller's identity.

use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The longest a call may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

fn client(ca_bundle: &str) -> Result<reqwest::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    if ca_bundle.trim().is_empty() {
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
    } else {
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_bundle.as_bytes()) {
            let cert = cert.map_err(|e| format!("failed to parse PEM CA bundle: {e}"))?;
            roots.add(cert).map_err(|e| format!("failed to parse PEM CA bundle: {e}"))?;
        }
        if roots.is_empty() {
            return Err("failed to parse PEM CA bundle".into());
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// One call; the answer parsed as JSON.
pub async fn call(
    method: &str,
    url: &str,
    ca_bundle: &str,
    headers: &[(String, String)],
    body: Option<&Value>,
    max_bytes: usize,
) -> Result<Value, String> {
    let method = match method {
        "GET" => reqwest::Method::GET,
        "POST" => reqwest::Method::POST,
        other => return Err(format!("invalid request type {other} for APICall")),
    };
    let mut req = client(ca_bundle)?.request(method, url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if let Some(b) = body {
        req = req.header("Content-Type", "application/json").body(serde_json::to_vec(b).unwrap_or_default());
    }
    let mut resp = req.send().await.map_err(|e| format!("failed to execute HTTP request for APICall: {e}"))?;
    let status = resp.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("failed to read data from APICall: {e}"))? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > max_bytes {
            return Err(format!("response length must be less than max allowed response length of {max_bytes}"));
        }
    }
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("the response of {url} is not JSON: {e}"))
}
