//! Kinds Verno installs but does not run yet, told so where their users look: every
//! GlobalContextEntry gets `Ready: False` (reason `Unsupported`) in its status and one warning
//! in the log. A cluster moving from Kyverno keeps its entries (the CRD is Verno's too); the
//! policies that read them (`globalReference` context entries, `globalContext.Get`) report the
//! entry as not available instead of acting on stale or missing data silently.
//!
//! Runs on the leader; lists the entries page by page every [`INTERVAL`] (a handful of objects
//! in any cluster, so no watch is kept), and writes a status only where it is not already
//! Verno's, so a steady cluster costs one list per interval.

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::watch;

/// How often the entries are listed.
pub const INTERVAL: Duration = Duration::from_secs(60);

/// The reason in the condition Verno writes.
pub const REASON: &str = "Unsupported";

/// What the condition says.
pub const MESSAGE: &str = "GlobalContextEntry is not supported by Verno yet: it is not refreshed, and policies that read it (globalReference context entries, globalContext.Get) report it as not available";

pub fn global_context_entries() -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v2beta1".into(),
        api_version: "kyverno.io/v2beta1".into(),
        kind: "GlobalContextEntry".into(),
        plural: "globalcontextentries".into(),
    }
}

/// Whether an entry's status already says what Verno would write.
fn marked(o: &DynamicObject) -> bool {
    o.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "False" && c["reason"] == REASON))
}

/// One pass: marks every entry not marked yet. Returns how many were written.
pub async fn mark_all(client: &kube::Client, manager: &str) -> Result<usize, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &global_context_entries());
    let mut written = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        for o in page.items.iter().filter(|o| !marked(o)) {
            let Some(name) = o.metadata.name.as_deref() else { continue };
            tracing::warn!(entry = %name, "{MESSAGE}");
            let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
            let body = json!({
                "apiVersion": "kyverno.io/v2beta1", "kind": "GlobalContextEntry", "metadata": {"name": name},
                "status": {"ready": false, "conditions": [{
                    "type": "Ready", "status": "False", "reason": REASON, "message": MESSAGE,
                    "lastTransitionTime": now,
                }]},
            });
            match api.patch_status(name, &PatchParams::apply(manager).force(), &Patch::Apply(&body)).await {
                Ok(_) => written += 1,
                Err(e) => tracing::debug!(entry = %name, error = %e, "GlobalContextEntry status not written"),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(written),
        }
    }
}

/// The leader's loop.
pub async fn run(
    client: kube::Client,
    mut leader: watch::Receiver<bool>,
    manager: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            r = leader.wait_for(|l| *l) => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        match mark_all(&client, &manager).await {
            Ok(_) => {}
            // No such CRD (a cluster without Kyverno's): nothing to tell.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::debug!(error = %e, "GlobalContextEntries not listed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
