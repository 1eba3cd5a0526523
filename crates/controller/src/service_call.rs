//! Calls to services outside the Kubernetes API (`apiCall.service` of GlobalContextEntries):
//! `GET` or `POST` with a JSON body, headers as given, TLS verified against the entry's CA
//! bundle (or the system's roots when it has none), bounded in time and size. Kyverno's
//! errors: `HTTP <status>: <body>` for a non-2xx answer, and its response-length message.
//!
//! Unlike Kyverno, Verno does not add its own ServiceAccount token to calls that carry no
//! `Authorization` header: a policy author's URL must not receive the controller's identity.

use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use std::time::Duration;

/// The longest a call may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a service call failed, in Kyverno's words where Kyverno has them (the texts reach
/// policies' context errors and GlobalContextEntry logs).
#[derive(Debug, thiserror::Error)]
pub enum ServiceCallError {
    /// A certificate of the CA bundle is not PEM.
    #[error("failed to parse PEM CA bundle: {0}")]
    CaPem(#[source] rustls_pki_types::pem::Error),
    /// A certificate of the CA bundle is not one rustls accepts as a root.
    #[error("failed to parse PEM CA bundle: {0}")]
    CaCertificate(#[source] rustls::Error),
    /// The CA bundle holds no certificate.
    #[error("failed to parse PEM CA bundle")]
    EmptyCaBundle,
    /// The TLS set-up of the HTTPS client failed.
    #[error("{0}")]
    Tls(#[source] verno_images::ClientError),
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    /// A method other than GET and POST.
    #[error("invalid request type {method} for APICall")]
    Method { method: String },
    #[error("failed to execute HTTP request for APICall: {0}")]
    Send(#[source] reqwest::Error),
    #[error("failed to read data from APICall: {0}")]
    Read(#[source] reqwest::Error),
    /// The answer is over the response limit.
    #[error("response length must be less than max allowed response length of {max}")]
    TooLarge { max: usize },
    /// A non-2xx answer, with its body.
    #[error("HTTP {status}: {body}")]
    Status { status: reqwest::StatusCode, body: String },
    #[error("the response of {url} is not JSON: {source}")]
    NotJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The roots of a PEM CA bundle (at least one certificate).
pub fn ca_roots(ca_bundle: &str) -> Result<rustls::RootCertStore, ServiceCallError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_bundle.as_bytes()) {
        let cert = cert.map_err(ServiceCallError::CaPem)?;
        roots.add(cert).map_err(ServiceCallError::CaCertificate)?;
    }
    if roots.is_empty() {
        return Err(ServiceCallError::EmptyCaBundle);
    }
    Ok(roots)
}

fn client(ca_bundle: &str) -> Result<reqwest::Client, ServiceCallError> {
    let roots = if ca_bundle.trim().is_empty() { None } else { Some(ca_roots(ca_bundle)?) };
    verno_images::https_client(roots)
        .map_err(ServiceCallError::Tls)?
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(ServiceCallError::Build)
}

/// One call (`body`: what a POST sends); the answer parsed as JSON.
pub async fn call(
    method: &str,
    url: &str,
    ca_bundle: &str,
    headers: &[(String, String)],
    body: Option<&Value>,
    max_bytes: usize,
) -> Result<Value, ServiceCallError> {
    let method = match method {
        "GET" => reqwest::Method::GET,
        "POST" => reqwest::Method::POST,
        other => return Err(ServiceCallError::Method { method: other.to_string() }),
    };
    // Kyverno sends a body with POST only (an empty object when the call has no data).
    let body =
        (method == reqwest::Method::POST).then(|| body.cloned().unwrap_or_else(|| Value::Object(Default::default())));
    let mut req = client(ca_bundle)?.request(method, url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if let Some(b) = body {
        req = req.header("Content-Type", "application/json").body(serde_json::to_vec(&b).unwrap_or_default());
    }
    let mut resp = req.send().await.map_err(ServiceCallError::Send)?;
    let status = resp.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(ServiceCallError::Read)? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > max_bytes {
            return Err(ServiceCallError::TooLarge { max: max_bytes });
        }
    }
    if !status.is_success() {
        return Err(ServiceCallError::Status { status, body: String::from_utf8_lossy(&bytes).into_owned() });
    }
    serde_json::from_slice(&bytes).map_err(|source| ServiceCallError::NotJson { url: url.to_string(), source })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection-at-a-time HTTP server: `/missing` is a 404, anything else echoes the
    /// request's `X-Team` header and body size as JSON; `/big` answers 1 MB.
    async fn server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let team = req
                        .lines()
                        .find_map(|l| l.strip_prefix("x-team: ").or_else(|| l.strip_prefix("X-Team: ")))
                        .unwrap_or("")
                        .to_string();
                    let body_len = req.split("\r\n\r\n").nth(1).map_or(0, str::len);
                    let (status, body) = if req.starts_with("GET /missing") {
                        ("404 Not Found", "no such thing".to_string())
                    } else if req.starts_with("GET /big") {
                        ("200 OK", format!("\"{}\"", "x".repeat(1 << 20)))
                    } else {
                        ("200 OK", json!({"team": team, "body": body_len}).to_string())
                    };
                    let head =
                        format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn service_calls_send_headers_and_bodies_and_fail_in_kyvernos_words() {
        let url = server().await;
        let headers = vec![("X-Team".to_string(), "a".to_string())];
        let v = call("POST", &format!("{url}/check"), "", &headers, Some(&json!({"k": "v"})), 1 << 20).await.unwrap();
        assert_eq!(v["team"], "a");
        assert_eq!(v["body"], json!(json!({"k": "v"}).to_string().len()));
        let e = call("GET", &format!("{url}/missing"), "", &[], None, 1 << 20).await.unwrap_err();
        assert!(matches!(e, ServiceCallError::Status { status, .. } if status == 404), "{e:?}");
        assert_eq!(e.to_string(), "HTTP 404 Not Found: no such thing");
        let e = call("GET", &format!("{url}/big"), "", &[], None, 1000).await.unwrap_err();
        assert_eq!(e.to_string(), "response length must be less than max allowed response length of 1000");
        let e = call("GET", &url, "not a certificate", &[], None, 1000).await.unwrap_err().to_string();
        assert!(e.starts_with("failed to parse PEM CA bundle"), "{e}");
    }
}
