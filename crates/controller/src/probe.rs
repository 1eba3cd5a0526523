//! The end-to-end probe, after Kyverno's verify webhook.
//!
//! Readiness only says a replica is up; it cannot say whether the API server can reach it
//! (Service, endpoints, network policy, caBundle). So the leader updates a Lease in Verno's
//! namespace every `probe_interval`; the API server routes that update through the fail-open
//! `monitor-webhooks.kyverno.svc` entry to Verno, whose answer stamps
//! `verno.io/last-request-time` on the Lease. The stored object then tells anyone — the leader,
//! `verno doctor` — how long ago the API server last reached Verno. The probe costs one Lease
//! write per interval (excluded from the other entries, like every Lease).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;

pub use verno_api::admission::LAST_REQUEST_ANNOTATION;

/// The Lease the probe updates.
pub const PROBE_LEASE: &str = "verno-health";
/// The label the monitor entry's objectSelector matches.
pub const PROBE_LABEL: &str = "verno.io/probe";
/// Kyverno's idle deadline: no webhook call through the API server for this long is a problem
/// (the leader's default and `verno doctor`'s threshold).
pub const IDLE_DEADLINE: Duration = Duration::from_secs(100);
/// The server path of the monitor entry.
pub const VERIFY_PATH: &str = "/verifymutate";

/// When the API server last reached Verno, as stamped on the probe Lease.
pub fn last_request(lease: &Lease) -> Option<Timestamp> {
    lease.metadata.annotations.as_ref()?.get(LAST_REQUEST_ANNOTATION)?.parse().ok()
}

/// One probe: create the Lease if needed, update it, and read the stamp from the stored result.
pub async fn probe_once(
    client: &kube::Client,
    namespace: &str,
    identity: &str,
) -> Result<Option<Timestamp>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let mut lease = match api.get_opt(PROBE_LEASE).await? {
        Some(l) => l,
        None => {
            let fresh: Lease = serde_json::from_value(json!({
                "metadata": {"name": PROBE_LEASE, "namespace": namespace, "labels": {PROBE_LABEL: "true", "app.kubernetes.io/name": "verno", "app.kubernetes.io/part-of": "verno"}},
                "spec": {"holderIdentity": identity},
            }))
            .map_err(kube::Error::SerdeError)?;
            match api.create(&PostParams::default(), &fresh).await {
                Ok(l) => l,
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(PROBE_LEASE).await?,
                Err(e) => return Err(e),
            }
        }
    };
    // Only an update goes through the monitor entry; renewTime makes every update a change.
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(identity.to_string());
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    let stored = api.replace(PROBE_LEASE, &PostParams::default(), &lease).await?;
    Ok(last_request(&stored))
}

/// Probes every `interval` while this replica leads; logs when the API server has not reached
/// Verno for longer than `deadline` (Kyverno's idle deadline), and when it does again.
pub async fn run(shared: crate::runtime::Shared, namespace: String, interval: Duration, deadline: Duration) {
    let (client, identity) = (shared.client.clone(), shared.identity.clone());
    let (mut leader, mut stop) = (shared.leader.clone(), shared.stop.clone());
    let mut healthy = true;
    // Since when this replica leads: a new leader gives the path one deadline to work.
    let mut leading_since: Option<tokio::time::Instant> = None;
    loop {
        let leads = *leader.borrow_and_update();
        if !leads {
            leading_since = None;
        }
        if leads {
            let since = *leading_since.get_or_insert_with(tokio::time::Instant::now);
            match probe_once(&client, &namespace, &identity).await {
                Ok(last) => {
                    let age = last.map(|t| Timestamp::now().duration_since(t).as_secs_f64().max(0.0));
                    let ok = age.is_some_and(|a| a <= deadline.as_secs_f64()) || since.elapsed() < deadline;
                    if ok != healthy {
                        match age {
                            _ if ok => tracing::info!("the API server reaches the webhook again"),
                            Some(a) => tracing::warn!(
                                seconds = a as u64,
                                "the API server has not reached the webhook for longer than the probe deadline: check the Service, its endpoints, network policies and the caBundle"
                            ),
                            None => {
                                tracing::warn!("the API server has never reached the webhook through the probe entry")
                            }
                        }
                    }
                    healthy = ok;
                }
                Err(e) => tracing::debug!(error = %e, "probe write failed"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = leader.changed() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
