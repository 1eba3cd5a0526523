//! `webhook-floor`: the least an HTTPS admission webhook can do, as a yardstick for `verno serve`
//! (`bench/webhook.sh` runs both side by side). axum + rustls (ring, TLS 1.3, ALPN h2 and
//! http/1.1), TCP_NODELAY, HTTP/1.1 keep-alive; each AdmissionReview is parsed into a
//! `serde_json::Value` and answered `allowed` with its uid. No policies, no metrics, no logging.
//!
//! `webhook-floor [ADDR] [--cert-out FILE]` (default `127.0.0.1:9443`); a self-signed certificate
//! is made at start, and written as PEM to FILE when asked (a webhook configuration's `caBundle`:
//! `apiserver-load --modes floor` registers the floor with a real API server).

use anyhow::{Context as _, anyhow, bail};
use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;

async fn review(body: Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not an AdmissionReview").into_response();
    };
    let uid = v.pointer("/request/uid").cloned().unwrap_or(Value::Null);
    let api_version = v.get("apiVersion").cloned().unwrap_or_else(|| json!("admission.k8s.io/v1"));
    let out = json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true},
    });
    let body = serde_json::to_vec(&out).unwrap_or_default();
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Exits as a `main` returning its error as a `String` did: `Error: "…"` (the message
/// Debug-quoted) on standard error and exit status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {:?}", format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut addr = None;
    let mut cert_out = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cert-out" => cert_out = Some(args.next().context("--cert-out: a file name")?),
            _ if addr.is_none() => addr = Some(a),
            other => bail!("unexpected argument {other:?} (webhook-floor [ADDR] [--cert-out FILE])"),
        }
    }
    let addr: SocketAddr = addr.as_deref().unwrap_or("127.0.0.1:9443").parse().context("the address")?;
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), addr.ip().to_string()])
        .context("making a certificate")?;
    if let Some(f) = cert_out {
        std::fs::write(&f, cert.cert.pem()).with_context(|| f.clone())?;
    }
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| anyhow!("the key: {e}"))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let app = Router::new().route("/validate", post(review)).route("/health/readiness", get(|| async { "ok" }));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls)),
        )
        .acceptor(axum_server::accept::NoDelayAcceptor::new());
        axum_server::bind(addr).acceptor(acceptor).serve(app.into_make_service()).await?;
        Ok(())
    })
}
