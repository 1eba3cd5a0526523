//! PolicyViolation events for admission results, shaped as Kyverno's admission controller
//! writes them (events.k8s.io/v1, reporting controller `kyverno-admission`):
//!
//! - on the policy, for every failed or errored rule: Warning `PolicyViolation`, action
//!   `Resource Blocked` (or `Resource Passed`), related to the resource, note
//!   `Pod ns/name: [rule] fail (blocked); message`;
//! - on the resource as well, when the request went through (Audit):
//!   `policy name/rule fail: message`.
//!
//! Every replica writes the events of the requests it served (each request reaches one
//! replica, so nothing is written twice). The server hands violations over through a bounded
//! channel and never waits; here a token bucket caps the write rate, and whatever does not fit
//! is dropped and counted (`verno_events_dropped_total`) rather than queued without bound.
//!
//! Unlike Kyverno, the resource is not looked up before its event is written (the uid comes
//! from the request), so Verno needs no read access to every kind; if a later webhook refuses
//! the object, its event names an object that never existed.

use crate::serving::Serving;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use verno_engine::{Kind, Violation};

/// Kyverno's reporting controller name for admission events (tools filter on it).
pub const REPORTING_CONTROLLER: &str = "kyverno-admission";

/// How events are paced.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Sustained events written per second.
    pub per_second: f64,
    /// Events that may be written at once after a quiet period.
    pub burst: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { per_second: 20.0, burst: 100.0 }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
    limits: Limits,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.limits.per_second).min(self.limits.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Where a policy's object is found (for the event's `regarding`, which needs its uid): the
/// watch's store of each policy kind.
pub struct PolicyStores(pub Vec<(Kind, Store<DynamicObject>)>);

impl PolicyStores {
    fn reference(&self, v: &Violation) -> Option<ObjectReference> {
        let store = self.0.iter().find(|(k, _)| *k == v.policy_kind).map(|(_, s)| s)?;
        let ar = crate::policies::resource(v.policy_kind);
        let mut key = ObjectRef::<DynamicObject>::new_with(&v.policy_name, ar.clone());
        if let Some(ns) = &v.policy_namespace {
            key = key.within(ns);
        }
        let obj = store.get(&key)?;
        Some(ObjectReference {
            api_version: Some(ar.api_version),
            kind: Some(ar.kind),
            name: obj.metadata.name.clone(),
            namespace: obj.metadata.namespace.clone(),
            uid: obj.metadata.uid.clone(),
            resource_version: obj.metadata.resource_version.clone(),
            ..Default::default()
        })
    }
}

fn related(v: &Violation) -> ObjectReference {
    let r = &v.resource;
    ObjectReference {
        api_version: Some(r.api_version.clone()),
        kind: Some(r.kind.clone()),
        name: Some(r.name.clone()),
        namespace: (!r.namespace.is_empty()).then(|| r.namespace.clone()),
        ..Default::default()
    }
}

/// The event on the policy (`policy` is its reference, with uid) for `v`.
pub fn policy_event(v: &Violation, policy: ObjectReference) -> (Event, ObjectReference) {
    let action = if v.blocked { "Resource Blocked" } else { "Resource Passed" };
    let ev = Event {
        type_: EventType::Warning,
        reason: "PolicyViolation".into(),
        note: Some(v.policy_note()),
        action: action.into(),
        secondary: Some(related(v)),
    };
    (ev, policy)
}

/// Writes events for violations until `stop`.
pub async fn run(
    client: kube::Client,
    identity: String,
    mut rx: mpsc::Receiver<Violation>,
    stores: PolicyStores,
    server: Arc<dyn Serving>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let recorder =
        Recorder::new(client, Reporter { controller: REPORTING_CONTROLLER.into(), instance: Some(identity) });
    let mut bucket = Bucket { tokens: limits.burst, at: Instant::now(), limits };
    loop {
        // Take the next violation first: the stop future must not live across the writes.
        let v = tokio::select! {
            v = rx.recv() => match v { Some(v) => v, None => return },
            _ = stop.wait_for(|s| *s) => return,
        };
        let mut out = Vec::with_capacity(2);
        match stores.reference(&v) {
            Some(policy) => out.push(policy_event(&v, policy)),
            None => tracing::debug!(policy = %v.policy_name, "policy not in the cache; no event"),
        }
        if let Some(e) = resource_event(&v) {
            out.push(e);
        }
        for (ev, regarding) in out {
            if !bucket.take() {
                server.event_dropped();
                continue;
            }
            if let Err(e) = recorder.publish(&ev, &regarding).await {
                tracing::debug!(error = %e, "event not written");
            }
        }
    }
}

/// The event on the resource, for a request that went through. Kyverno skips resources with
/// no name yet; the uid comes from the request (see [`verno_engine::ResourceRef`]).
pub fn resource_event(v: &Violation) -> Option<(Event, ObjectReference)> {
    if v.blocked || v.resource.name.is_empty() {
        return None;
    }
    let mut regarding = related(v);
    regarding.uid = (!v.resource.uid.is_empty()).then(|| v.resource.uid.clone());
    let ev = Event {
        type_: EventType::Warning,
        reason: "PolicyViolation".into(),
        note: Some(v.resource_note()),
        action: "Resource Passed".into(),
        secondary: None,
    };
    Some((ev, regarding))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use verno_engine::ResourceRef;

    fn violation(blocked: bool, name: &str) -> Violation {
        Violation {
            policy_kind: Kind::Policy,
            policy_name: "team".into(),
            policy_namespace: Some("shop".into()),
            rule: "check".into(),
            status: verno_engine::Status::Error,
            message: "boom".into(),
            blocked,
            resource: ResourceRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "shop".into(),
                name: name.into(),
                uid: "u-1".into(),
            },
        }
    }

    #[test]
    fn only_admitted_named_resources_get_an_event_of_their_own() {
        assert!(resource_event(&violation(true, "web")).is_none());
        assert!(resource_event(&violation(false, "")).is_none());
        let (ev, regarding) = resource_event(&violation(false, "web")).unwrap();
        assert_eq!(ev.note.as_deref(), Some("policy team/check error: boom"));
        assert_eq!(ev.action, "Resource Passed");
        assert_eq!(
            (regarding.uid.as_deref(), regarding.namespace.as_deref(), regarding.api_version.as_deref()),
            (Some("u-1"), Some("shop"), Some("apps/v1"))
        );
        let (ev, _) = policy_event(&violation(true, "web"), ObjectReference::default());
        assert_eq!(ev.note.as_deref(), Some("Deployment shop/web: [check] error (blocked); boom"));
        assert_eq!(ev.action, "Resource Blocked");
    }

    #[test]
    fn the_bucket_allows_a_burst_then_drops() {
        let mut b = Bucket { tokens: 2.0, at: Instant::now(), limits: Limits { per_second: 0.0, burst: 2.0 } };
        assert!(b.take());
        assert!(b.take());
        assert!(!b.take());
    }
}
