//! The leader's pass: on every change it is kicked for (or each resync period) it checks the
//! serving certificates, writes the webhook configurations for the set in force, generates
//! the admission policies asked for, and writes the policies' statuses (with a `PolicyError`
//! event per distinct compile error). Followers never write.

use crate::policies::{self, PolicyStatus};
use crate::runtime::{Events, Shared};
use crate::{access, admission_policies, certs, webhooks};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often (at most; the resync period if shorter) the leader checks the serving
/// certificates: a Secret deleted by hand is made again within this.
const CERTS_EVERY: Duration = Duration::from_secs(5);

/// What the pass reads.
pub struct Inputs {
    /// Bumped by every watch the leader must look at.
    pub kicks: watch::Receiver<u64>,
    /// The policy loop has built a first set.
    pub synced: watch::Receiver<bool>,
    pub statuses: watch::Receiver<Arc<Vec<PolicyStatus>>>,
    /// The CA certificate (the webhooks' caBundle) once its Secret exists.
    pub ca: watch::Receiver<Option<String>>,
    /// Verno's Deployment is being deleted or scaled to zero: the webhook rules are emptied.
    pub going_down: watch::Receiver<bool>,
    pub certs: certs::CertConfig,
    /// Where MutatingAdmissionPolicies are generated.
    pub map_version: Option<String>,
}

/// Runs the pass whenever this replica leads and something changed, until Verno stops.
/// How long the API server takes to see a webhook configuration Verno wrote (its own watch),
/// generously: policies are shown ready after it.
const WEBHOOK_SETTLE: Duration = Duration::from_secs(1);

pub async fn run(shared: Shared, opts: crate::Options, inputs: Inputs) {
    let Inputs { mut kicks, synced, statuses: status_rx, ca, going_down, certs: certs_cfg, map_version } = inputs;
    let client = shared.client.clone();
    let mut leader = shared.leader.clone();
    let mut stop = shared.stop.clone();
    let mut events = Events::new(&shared, "verno", crate::events::Limits::default());
    let mut reported: HashMap<String, String> = HashMap::new();
    let mut generator = admission_policies::Generator::default();
    let mut last_pass = tokio::time::Instant::now();
    let mut certs_checked: Option<tokio::time::Instant> = None;
    // Statuses wait until this time after a webhook configuration write (see WEBHOOK_SETTLE);
    // webhook writes do not wait.
    let mut settle_until: Option<tokio::time::Instant> = None;
    loop {
        if *leader.borrow() && *synced.borrow() {
            last_pass = tokio::time::Instant::now();
            // The certificates are checked at most every few seconds (or while there is no
            // CA): a pass a policy change asks for goes straight to the webhook configurations
            // (a Pod created right after its policy meets its rules).
            let certs_due =
                ca.borrow().is_none() || certs_checked.is_none_or(|t| t.elapsed() >= CERTS_EVERY.min(opts.resync));
            if certs_due {
                certs_checked = Some(tokio::time::Instant::now());
                if let Err(e) = certs::ensure(&client, &certs_cfg).await {
                    tracing::warn!(error = %e, "certificate check failed");
                }
            }
            let inputs = webhooks::Inputs {
                ca_bundle: ca.borrow().clone(),
                owner_cluster_role: opts.owner_cluster_role.clone(),
                going_down: *going_down.borrow(),
                names: opts.webhook_names,
            };
            // The statuses are read before the set: the policy loop installs a set before it
            // sends its statuses, so the set written into the webhooks is at least as new as
            // the statuses shown ready (never a ready policy without its rules).
            let statuses = status_rx.borrow().clone();
            // Without a CA yet, wait: rules pointing at a server nobody trusts would fail.
            let configured = match &inputs.ca_bundle {
                None => false,
                Some(_) => match webhooks::reconcile(&client, &shared.server.current(), &inputs).await {
                    Ok(writes) => {
                        // The API server reads webhook configurations through its own watch: a
                        // policy shown ready at once could meet a request the API server does
                        // not send yet (a resource created right after the policy is ready
                        // would be admitted unreviewed). Ready waits for the watch to catch up;
                        // the next webhook write does not (the pass is not held).
                        if writes > 0 {
                            settle_until = Some(tokio::time::Instant::now() + WEBHOOK_SETTLE);
                        }
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook configuration update failed");
                        false
                    }
                },
            };
            let statuses = generator
                .reconcile(&client, &statuses, opts.generate_validating_admission_policies, map_version.as_deref())
                .await;
            if settle_until.is_none_or(|t| tokio::time::Instant::now() >= t) {
                settle_until = None;
                write_statuses(&client, &mut events, &statuses, configured, &mut reported).await;
            }
        }
        // Sleep until something changes (or the resync period passes, or statuses are due).
        let settled = settle_until.filter(|t| *t > tokio::time::Instant::now());
        tokio::select! {
            _ = async { if let Some(t) = settled { tokio::time::sleep_until(t).await } }, if settled.is_some() => {}
            _ = kicks.changed() => {}
            _ = leader.changed() => {}
            _ = tokio::time::sleep(opts.resync) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Passes are at least 50 ms apart (kicks in a burst share one pass; the policy loop
        // already coalesces bursts of policy changes); a kick after a quiet spell is served at
        // once.
        let gap = opts.debounce.min(Duration::from_millis(50)).saturating_sub(last_pass.elapsed());
        tokio::select! {
            _ = tokio::time::sleep(gap.max(crate::policy_loop::QUICK.min(opts.debounce))) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        kicks.mark_unchanged();
    }
}

async fn write_statuses(
    client: &kube::Client,
    events: &mut Events,
    statuses: &[PolicyStatus],
    webhooks_configured: bool,
    reported: &mut HashMap<String, String>,
) {
    let mut answers = access::Answers::default();
    for st in statuses {
        // A policy is not shown ready before its webhook rules are in place (as Kyverno's
        // readiness follows its webhook registration); a broken one is reported at once.
        if !webhooks_configured && st.error.is_none() {
            continue;
        }
        let mut st = st.clone();
        if let policies::Reporting::Check(gvrs) = &st.reporting {
            match answers.missing(client, gvrs).await {
                Ok(missing) => st.with_permissions(Some(&missing)),
                Err(e) => {
                    tracing::debug!(policy = %st.name, error = %e, "permission check failed; status not written this time");
                    continue;
                }
            }
        } else {
            st.with_permissions(None);
        }
        let Some(status) = st.to_write() else { continue };
        let ar = policies::resource(st.kind);
        let api: Api<DynamicObject> = match &st.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let body =
            json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": st.name}, "status": status});
        match api.patch_status(&st.name, &PatchParams::apply(webhooks::MANAGER).force(), &Patch::Apply(&body)).await {
            Ok(_) => tracing::debug!(policy = %st.name, "status written"),
            Err(e) => tracing::warn!(policy = %st.name, error = %e, "status write failed"),
        }
        // One Warning event per distinct compile error.
        let key = format!("{}/{}/{}", st.kind, st.namespace.as_deref().unwrap_or(""), st.name);
        if let Some(err) = &st.error {
            if reported.get(&key) != Some(err) {
                reported.insert(key, err.clone());
                let reference = ObjectReference {
                    api_version: Some(ar.api_version.clone()),
                    kind: Some(ar.kind.clone()),
                    name: Some(st.name.clone()),
                    namespace: st.namespace.clone(),
                    ..Default::default()
                };
                let ev = crate::events::policy_error(format!("policy is invalid: {err}"), "Compile", None);
                events.publish(&ev, &reference).await;
            }
        } else {
            reported.remove(&key);
        }
    }
}
