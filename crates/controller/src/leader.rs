//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's leaderelection
//! works: take a free or expired lease, renew it with updates guarded by resourceVersion, and
//! step down when a renewal has not succeeded within the lease duration. Expiry is judged by
//! when *we* last saw the record change, not by the holder's timestamps, so clock skew between
//! replicas does not matter.
//!
//! Written here rather than taken from `kube-lease-manager` to keep the fencing rule visible
//! (followers never write) and to need nothing from the API server beyond optimistic
//! concurrency; the fake API server tests it the same way.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (the pod name).
    pub identity: String,
    /// How long a lease lasts without renewal (whole seconds on the wire, at least 1).
    pub duration: Duration,
    /// How often the holder renews and followers retry.
    pub retry: Duration,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Runs until `stop` turns true, publishing leadership on `leader`. A leader releases the
/// lease on stop so that another replica can take over at once.
pub async fn run(client: kube::Client, cfg: LeaseConfig, leader: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let secs = cfg.duration.as_secs().max(1) as i32;
    // The record we last observed and when it last changed.
    let mut observed: Option<(String, Instant)> = None;
    let mut last_renewal: Option<Instant> = None;
    loop {
        let am_leader = *leader.borrow();
        let outcome = step(&api, &cfg, secs, &mut observed).await;
        match outcome {
            Ok(true) => {
                last_renewal = Some(Instant::now());
                if !am_leader {
                    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                    let _ = leader.send(true);
                }
            }
            Ok(false) => {
                if am_leader {
                    tracing::warn!(identity = %cfg.identity, "lost the lease to another replica");
                    let _ = leader.send(false);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease update failed");
                // Step down before the lease can expire for the others.
                if am_leader && last_renewal.is_none_or(|t| t.elapsed() + cfg.retry >= cfg.duration) {
                    tracing::warn!(identity = %cfg.identity, "could not renew the lease in time; stepping down");
                    let _ = leader.send(false);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.retry) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    if *leader.borrow() {
        let _ = leader.send(false);
        release(&api, &cfg).await;
    }
}

/// One round: `Ok(true)` when we hold the lease afterwards.
async fn step(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    secs: i32,
    observed: &mut Option<(String, Instant)>,
) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let mut l = Lease::default();
        l.metadata.name = Some(cfg.name.clone());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(now_micro()),
            renew_time: Some(now_micro()),
            lease_transitions: Some(0),
            ..Default::default()
        });
        return match api.create(&PostParams::default(), &l).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let record = format!("{holder}|{:?}", spec.renew_time.as_ref().map(|t| t.0));
    let changed = observed.as_ref().is_none_or(|(r, _)| *r != record);
    if changed {
        *observed = Some((record, Instant::now()));
    }
    let held_by_me = holder == cfg.identity;
    let their_duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(secs).max(1) as u64);
    let expired = observed.as_ref().is_some_and(|(_, at)| at.elapsed() > their_duration);
    if !held_by_me && !holder.is_empty() && !expired {
        return Ok(false);
    }
    let mut next = spec;
    if !held_by_me {
        next.acquire_time = Some(now_micro());
        next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
    }
    next.holder_identity = Some(cfg.identity.clone());
    next.lease_duration_seconds = Some(secs);
    next.renew_time = Some(now_micro());
    lease.spec = Some(next);
    // The resourceVersion we read guards the update: two contenders cannot both win.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else { return };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    spec.lease_duration_seconds = Some(1);
    if api.replace(&cfg.name, &PostParams::default(), &lease).await.is_ok() {
        tracing::info!(identity = %cfg.identity, "lease released");
    }
}
