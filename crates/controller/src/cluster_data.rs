//! The engine's data port in a cluster: `configMap` context entries and `apiCall`s to the
//! Kubernetes API read the API server, as Verno's own ServiceAccount.
//!
//! The engine is synchronous and runs on the server's blocking pool, so each read blocks that
//! thread on the runtime (`Handle::block_on`) for at most [`TIMEOUT`]; the admission deadline
//! and the evaluation slots bound how many wait at once. Responses over [`MAX_BYTES`] are
//! refused. Reads are not cached yet: every evaluation that needs a ConfigMap GETs it (Kyverno
//! keeps an informer cache; ours is future work, see docs/architecture.md).

use serde_json::{Value, json};
use std::time::Duration;
use verno_engine::{Data, Loaded};

/// The longest one read may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest response accepted.
pub const MAX_BYTES: usize = 16 << 20;

pub struct ClusterData {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
}

impl ClusterData {
    /// Reads through `client`; must be created inside the runtime whose threads it will block.
    pub fn new(client: kube::Client) -> ClusterData {
        ClusterData { client, runtime: tokio::runtime::Handle::current() }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let mut req = http::Request::builder().method(method).uri(path);
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default()).unwrap_or_default();
        let req = req.body(bytes).map_err(|e| format!("{method} {path}: {e}"))?;
        let client = self.client.clone();
        let text = self
            .runtime
            .block_on(async move { tokio::time::timeout(TIMEOUT, client.request_text(req)).await })
            .map_err(|_| format!("{method} {path}: no answer within {} s", TIMEOUT.as_secs()))?
            .map_err(|e| match e {
                kube::Error::Api(s) => s.message.clone(),
                other => other.to_string(),
            })?;
        if text.len() > MAX_BYTES {
            return Err(format!("{method} {path}: the response is over {} MiB", MAX_BYTES >> 20));
        }
        serde_json::from_str(&text).map_err(|e| format!("{method} {path}: the response is not JSON: {e}"))
    }
}

impl Data for ClusterData {
    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        match self.call("GET", &format!("/api/v1/namespaces/{namespace}/configmaps/{name}"), None) {
            Ok(cm) => Loaded::Value(json!({
                "data": cm.get("data").cloned().unwrap_or(json!({})),
                "metadata": cm.get("metadata").cloned().unwrap_or(json!({})),
            })),
            Err(e) => Loaded::Error(e),
        }
    }

    fn api_call(&self, method: &str, url_path: &str, data: Option<&Value>) -> Loaded {
        if !url_path.starts_with('/') {
            // Service URLs (`apiCall.service.url`) are not called yet.
            return Loaded::Unavailable;
        }
        match self.call(if method.is_empty() { "GET" } else { method }, url_path, data) {
            Ok(v) => Loaded::Value(v),
            Err(e) => Loaded::Error(e),
        }
    }
}
