//! PolicyViolation events for admission results, shaped as Kyverno's admission controller
//! writes them (events.k8s.io/v1, reporting controller `kyverno-admission`):
//!
//! - on the policy, for every failed or errored rule: Warning `PolicyViolation`, action
//!   `Resource Blocked` (or `Resource Passed`), related to the resource, note
//!   `Pod ns/name: [rule] fail (blocked); message`;
//! - on the resource as well, when the request went through (Audit):
//!   `policy name/rule fail: message`.
//!
//! - with the Kyverno ConfigMap's `generateSuccessEvents: "true"` (optionally narrowed by
//!   `successEventActions`), Normal `PolicyApplied` on the policy for each policy that ran and
//!   failed no rule: `Pod ns/name: pass` / `… is successfully mutated`;
//! - for rules PolicyExceptions made skip (requests that went through): Normal `PolicySkipped`
//!   on each exception and on the policy;
//! - reasons listed in `--omit-events` (Kyverno's `--omitEvents`) are never written.
//!
//! Every replica writes the events of the requests it served (each request reaches one
//! replica, so nothing is written twice). The server hands violations over through a bounded
//! channel and never waits; here a token bucket caps the write rate, and whatever does not fit
//! is dropped and counted (`verno_events_dropped_total`) rather than queued without bound.
//!
//! Unlike Kyverno, the resource is not looked up before its event is written (the uid comes
//! from the request), so Verno needs no read access to every kind; if a later webhook refuses
//! the object, its event names an object that never existed.

use crate::runtime::{Events, Shared};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::BTreeSet;
use tokio::sync::{mpsc, watch};
use verno_engine::{Applied, Kind, Notice, Violation};

/// Kyverno's reporting controller name for admission events (tools filter on it).
pub const REPORTING_CONTROLLER: &str = "kyverno-admission";
/// Kyverno's reporting controller name for background scan events.
pub const SCAN_CONTROLLER: &str = "kyverno-scan";
/// Kyverno's reporting controller name for cleanup (policies and the TTL label).
pub const CLEANUP_CONTROLLER: &str = "kyverno-cleanup";
/// Kyverno's reporting controller names for the two halves of its background controller.
pub const GENERATE_CONTROLLER: &str = "kyverno-generate";
pub const MUTATE_CONTROLLER: &str = "kyverno-mutate";

pub use crate::runtime::EventLimits as Limits;

/// Where a policy's object is found (for the event's `regarding`, which needs its uid): the
/// watch's store of each policy kind.
pub struct PolicyStores(pub Vec<(Kind, Store<DynamicObject>)>);

impl PolicyStores {
    fn reference(&self, kind: Kind, name: &str, namespace: Option<&str>) -> Option<ObjectReference> {
        let store = self.0.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)?;
        let ar = crate::policies::resource(kind);
        let mut key = ObjectRef::<DynamicObject>::new_with(name, ar.clone());
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        let obj = store.get(&key)?;
        // The `policies.kyverno.io` kinds at the version Kyverno stores and names them in its
        // events (v1beta1); Verno reads them at v1, the same object.
        let api_version = if kind.group() == verno_api::Group::Policies {
            "policies.kyverno.io/v1beta1".to_string()
        } else {
            ar.api_version
        };
        Some(ObjectReference {
            api_version: Some(api_version),
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
    related_to(&v.resource)
}

fn related_to(r: &verno_engine::ResourceRef) -> ObjectReference {
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

/// Which events are written: Kyverno's `--omitEvents` (fixed at start) and the success events
/// of its ConfigMap (`generateSuccessEvents`, `successEventActions`; followed live).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventConfig {
    /// Reasons never written (`PolicyViolation`, `PolicyApplied`, `PolicyError`, `PolicySkipped`).
    pub omit: BTreeSet<String>,
    pub success_events: bool,
    /// When not empty, success events only for these actions (`Resource Passed`, …).
    pub success_actions: BTreeSet<String>,
}

impl EventConfig {
    /// Reads the success-event keys of a Kyverno ConfigMap's `data` (absent or unparsable
    /// values keep Kyverno's defaults: off, every action), keeping `omit`.
    pub fn with_config_map(&self, data: Option<&std::collections::BTreeMap<String, String>>) -> EventConfig {
        let get = |k: &str| data.and_then(|d| d.get(k)).map(|s| s.trim());
        let success_events = match get("generateSuccessEvents") {
            Some(v) => match parse_go_bool(v) {
                Some(b) => b,
                None => {
                    tracing::warn!(value = v, "generateSuccessEvents is not a boolean; success events stay off");
                    false
                }
            },
            None => false,
        };
        let success_actions = get("successEventActions")
            .map(|v| v.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        EventConfig { omit: self.omit.clone(), success_events, success_actions }
    }

    fn writes(&self, reason: &str) -> bool {
        !self.omit.contains(reason)
    }

    fn writes_success(&self, action: &str) -> bool {
        self.success_events
            && self.writes("PolicyApplied")
            && (self.success_actions.is_empty() || self.success_actions.contains(action))
    }
}

/// Go's `strconv.ParseBool`, which Kyverno reads ConfigMap booleans with.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The events one notice becomes under `cfg`, each with the object it is about.
fn events_of(n: &Notice, stores: &PolicyStores, cfg: &EventConfig) -> Vec<(Event, ObjectReference)> {
    let mut out = Vec::with_capacity(2);
    match n {
        Notice::Violation(v) => {
            if !cfg.writes("PolicyViolation") {
                return out;
            }
            match stores.reference(v.policy_kind, &v.policy_name, v.policy_namespace.as_deref()) {
                Some(policy) => out.push(policy_event(v, policy)),
                None => tracing::debug!(policy = %v.policy_name, "policy not in the cache; no event"),
            }
            out.extend(resource_event(v));
        }
        Notice::Applied(a) => {
            if a.resource.name.is_empty() {
                return out;
            }
            let policy = || stores.reference(a.policy_kind, &a.policy_name, a.policy_namespace.as_deref());
            if a.exempted.is_empty() {
                if cfg.writes_success(a.action())
                    && let Some(policy) = policy()
                {
                    out.push(applied_event(a, policy));
                }
            } else if cfg.writes("PolicySkipped") && matches!(a.policy_kind, Kind::ClusterPolicy | Kind::Policy) {
                out.extend(skipped_events(a, policy(), |ns, name| stores.reference(Kind::PolicyException, name, ns)));
            }
        }
    }
    out
}

/// The PolicyApplied event on the policy.
pub fn applied_event(a: &Applied, policy: ObjectReference) -> (Event, ObjectReference) {
    let ev = Event {
        type_: EventType::Normal,
        reason: "PolicyApplied".into(),
        note: Some(a.applied_note()),
        action: a.action().into(),
        secondary: Some(related_to(&a.resource)),
    };
    (ev, policy)
}

/// The PolicySkipped events of rules PolicyExceptions made skip: one on each exception
/// (`kyverno.io/v2` PolicyException, found through `exception` for its uid) and one on the
/// policy per rule.
pub fn skipped_events(
    a: &Applied,
    policy: Option<ObjectReference>,
    exception: impl Fn(Option<&str>, &str) -> Option<ObjectReference>,
) -> Vec<(Event, ObjectReference)> {
    let mut out = Vec::new();
    let event = |note: String| Event {
        type_: EventType::Normal,
        reason: "PolicySkipped".into(),
        note: Some(note),
        action: "Resource Passed".into(),
        secondary: Some(related_to(&a.resource)),
    };
    for (rule, exceptions) in &a.exempted {
        for key in exceptions {
            let (ns, name) = match key.split_once('/') {
                Some((ns, name)) => (Some(ns), name),
                None => (None, key.as_str()),
            };
            let regarding = exception(ns, name).unwrap_or_else(|| ObjectReference {
                api_version: Some("kyverno.io/v2".into()),
                kind: Some("PolicyException".into()),
                name: Some(name.to_string()),
                namespace: ns.map(str::to_string),
                ..Default::default()
            });
            out.push((event(a.exception_note(rule)), regarding));
        }
        if let Some(p) = &policy {
            out.push((event(a.policy_skip_note(rule, exceptions)), p.clone()));
        }
    }
    out
}

/// What the event writer reads besides the notices: the policies' objects (for their uids)
/// and which events to write.
pub struct Sources {
    pub stores: PolicyStores,
    pub config: watch::Receiver<EventConfig>,
}

/// Writes events reported by `controller` for what the server (or a scan) hands over, until
/// Verno stops.
pub async fn run(
    shared: Shared,
    controller: &'static str,
    mut rx: mpsc::Receiver<Notice>,
    Sources { stores, config }: Sources,
    limits: Limits,
) {
    let mut events = Events::new(&shared, controller, limits);
    let mut stop = shared.stop.clone();
    loop {
        // Take the next notice first: the stop future must not live across the writes.
        let n = tokio::select! {
            n = rx.recv() => match n { Some(n) => n, None => return },
            _ = stop.wait_for(|s| *s) => return,
        };
        let out = events_of(&n, &stores, &config.borrow());
        for (ev, regarding) in out {
            events.publish(&ev, &regarding).await;
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

/// A `PolicyError` warning: `note` cut to the API server's bound, `action` as Kyverno names it
/// (`None`, `Compile`), `secondary` the object the error is about when the event is on another.
pub(crate) fn policy_error(mut note: String, action: &str, secondary: Option<ObjectReference>) -> Event {
    truncate_note(&mut note);
    Event {
        type_: EventType::Warning,
        reason: "PolicyError".into(),
        note: Some(note),
        action: action.into(),
        secondary,
    }
}

/// Cuts an event note to the API server's bound (1 kB for events.k8s.io), on a character
/// boundary.
pub(crate) fn truncate_note(note: &mut String) {
    if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
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

    fn applied(exempted: Vec<(String, Vec<String>)>) -> Applied {
        Applied {
            policy_kind: Kind::ClusterPolicy,
            policy_name: "disallow-latest".into(),
            policy_namespace: None,
            mutated: false,
            exempted,
            resource: violation(false, "web").resource,
        }
    }

    #[test]
    fn success_events_follow_the_config_map_and_omit_events() {
        let base = EventConfig::default();
        let data = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(!base.with_config_map(None).writes_success("Resource Passed"));
        let on = base.with_config_map(Some(&data(&[("generateSuccessEvents", "True")])));
        assert!(on.writes_success("Resource Passed") && on.writes_success("Resource Mutated"));
        let narrowed = base.with_config_map(Some(&data(&[
            ("generateSuccessEvents", "true"),
            ("successEventActions", "Resource Mutated, Resource Generated"),
        ])));
        assert!(narrowed.writes_success("Resource Mutated") && !narrowed.writes_success("Resource Passed"));
        // Not a Go boolean: off, as Kyverno.
        assert!(!base.with_config_map(Some(&data(&[("generateSuccessEvents", "yes")]))).success_events);
        // --omit-events PolicyApplied wins over the ConfigMap.
        let omitting = EventConfig { omit: ["PolicyApplied".to_string()].into(), ..Default::default() }
            .with_config_map(Some(&data(&[("generateSuccessEvents", "true")])));
        assert!(!omitting.writes_success("Resource Passed"));
        assert!(omitting.writes("PolicyViolation"));
    }

    #[test]
    fn exceptions_get_policy_skipped_events_on_the_exception_and_the_policy() {
        let a = applied(vec![("no-latest".into(), vec!["team-a/allow-latest".into(), "team-b/legacy".into()])]);
        let policy = ObjectReference { name: Some("disallow-latest".into()), ..Default::default() };
        let out = skipped_events(&a, Some(policy), |_, _| None);
        assert_eq!(out.len(), 3);
        let (ev, regarding) = &out[0];
        assert_eq!(ev.reason, "PolicySkipped");
        assert_eq!(
            ev.note.as_deref(),
            Some("resource Deployment/shop/web was skipped from policy rule disallow-latest/no-latest")
        );
        assert_eq!(
            (
                regarding.api_version.as_deref(),
                regarding.kind.as_deref(),
                regarding.namespace.as_deref(),
                regarding.name.as_deref()
            ),
            (Some("kyverno.io/v2"), Some("PolicyException"), Some("team-a"), Some("allow-latest"))
        );
        assert_eq!(
            out[2].0.note.as_deref(),
            Some(
                "resource Deployment/shop/web was skipped from rule no-latest due to policy exceptions team-a/allow-latest, team-b/legacy"
            )
        );
        assert_eq!(out[2].1.name.as_deref(), Some("disallow-latest"));
        let (ev, _) = applied_event(&applied(Vec::new()), ObjectReference::default());
        assert_eq!((ev.reason.as_str(), ev.action.as_str()), ("PolicyApplied", "Resource Passed"));
        assert_eq!(ev.note.as_deref(), Some("Deployment shop/web: pass"));
    }
}
