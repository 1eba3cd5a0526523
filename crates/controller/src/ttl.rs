//! The TTL label controller (leader only): an object labelled `cleanup.kyverno.io/ttl` is
//! deleted when its time comes (`engine::ttl::expiry`: a duration from its creation, or a
//! time), with the propagation policy of its `cleanup.kyverno.io/propagation-policy`
//! annotation.
//!
//! As Kyverno's TTL manager: every `interval` discovery is run again, and each resource Verno
//! may list, watch and delete (asked with SelfSubjectAccessReviews) is watched — metadata only
//! and label-selected, so the API server sends only labelled objects and only their metadata.
//! Deadlines are kept in one ordered map (bounded by `max_tracked`); the loop sleeps until the
//! earliest. A value that is not a TTL is logged and reported once per object as a Warning
//! event; such an object is never deleted. Deletion carries the object's uid as a
//! precondition, so an object recreated under the same name is not taken for the old one.

use crate::metrics::{CleanupCounter, Metrics};
use crate::policies::Gvr;
use crate::runtime::{Events, Pace, Shared, Watches};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DeleteParams, Preconditions};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::discovery::{Scope as ApiScope, verbs};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use verno_engine::ttl::{PROPAGATION_ANNOTATION, TTL_LABEL, expiry};

/// How the TTL controller runs.
#[derive(Debug, Clone, Copy)]
pub struct TtlOptions {
    /// Kyverno's `--ttlReconciliationInterval` (1 minute): how often the watched resources are
    /// worked out again.
    pub interval: Duration,
    /// Labelled objects tracked at most; beyond, new ones wait for the next resync.
    pub max_tracked: usize,
    /// Sustained deletions per second and the burst.
    pub deletes_per_second: f64,
    pub burst: f64,
}

impl Default for TtlOptions {
    fn default() -> Self {
        TtlOptions { interval: Duration::from_secs(60), max_tracked: 200_000, deletes_per_second: 100.0, burst: 200.0 }
    }
}

/// (resource index, namespace, name).
type Key = (usize, String, String);

struct Tracked {
    uid: String,
    due: DateTime<Utc>,
    propagation: Option<&'static str>,
}

/// A watch event of resource index `usize` (metadata only).
type WatchEvent = (usize, u64, watcher::Event<PartialObjectMeta<DynamicObject>>);

/// Runs the TTL controller while this replica leads, until Verno stops: watches, access
/// checks and deletes act as the cleanup account; events are Verno's own.
pub async fn run(shared: Shared, opts: TtlOptions) {
    let acting = shared.cleanup_client();
    let term = || async {
        let (tx, rx) = mpsc::channel(256);
        let mut t = Ttl {
            client: acting.clone(),
            metrics: shared.metrics.clone(),
            opts,
            resources: Vec::new(),
            watches: Watches::new(tx, "ttl"),
            tracked: HashMap::new(),
            queue: BTreeSet::new(),
            reported: HashSet::new(),
            pace: Pace::new(opts.deletes_per_second, opts.burst),
            events: shared.events(crate::events::CLEANUP_CONTROLLER),
        };
        t.lead(rx).await
    };
    shared.lead_while("ttl controller", term, || {}).await;
}

struct Ttl {
    client: kube::Client,
    metrics: Metrics,
    opts: TtlOptions,
    /// Every resource ever watched (indexes stay valid while this replica leads).
    resources: Vec<(ApiResource, bool)>,
    watches: Watches<usize, (), watcher::Event<PartialObjectMeta<DynamicObject>>>,
    tracked: HashMap<Key, Tracked>,
    queue: BTreeSet<(DateTime<Utc>, Key)>,
    /// (uid, value) of invalid labels already reported.
    reported: HashSet<(String, String)>,
    pace: Pace,
    events: Events,
}

impl Ttl {
    async fn lead(&mut self, mut rx: mpsc::Receiver<WatchEvent>) {
        let mut resync = tokio::time::interval(self.opts.interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wait = self
                .queue
                .first()
                .map(|(t, _)| (*t - Utc::now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                _ = resync.tick() => self.discover().await,
                m = rx.recv() => match m {
                    Some((i, generation, ev)) => {
                        if self.watches.current(i, generation).is_none() {
                            continue;
                        }
                        match ev {
                            watcher::Event::Apply(m) | watcher::Event::InitApply(m) => self.on(i, m, false).await,
                            watcher::Event::Delete(m) => self.on(i, m, true).await,
                            _ => {}
                        }
                    }
                    None => return,
                },
                _ = tokio::time::sleep(wait) => self.expire().await,
            }
        }
    }

    /// Works out the resources to watch and starts or stops their watches.
    async fn discover(&mut self) {
        let d = match kube::Discovery::new(self.client.clone()).run().await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "ttl: discovery failed; the watched resources stay as they are");
                return;
            }
        };
        let mut wanted = Vec::new();
        for g in d.groups() {
            for (ar, caps) in g.recommended_resources() {
                let ok = [verbs::LIST, verbs::WATCH, verbs::DELETE].iter().all(|v| caps.supports_operation(v));
                if !ok || ar.plural.contains('/') || (ar.group == "events.k8s.io" || ar.plural == "events") {
                    continue;
                }
                let gvr = Gvr { group: ar.group.clone(), version: ar.version.clone(), resource: ar.plural.clone() };
                let mut permitted = true;
                // `delete` first: it is the one usually missing, so most resources cost one review.
                for verb in ["delete", "list", "watch"] {
                    match crate::access::allowed(&self.client, verb, &gvr).await {
                        Ok(true) => {}
                        Ok(false) => {
                            permitted = false;
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, resource = %gvr, "ttl: access review failed");
                            permitted = false;
                            break;
                        }
                    }
                }
                if permitted {
                    wanted.push((ar, caps.scope == ApiScope::Namespaced));
                }
            }
        }
        let key = |ar: &ApiResource| (ar.group.clone(), ar.version.clone(), ar.plural.clone());
        let wanted_keys: HashSet<_> = wanted.iter().map(|(ar, _)| key(ar)).collect();
        // Stop watches of resources no longer wanted, and forget their objects.
        let stale: Vec<usize> = self
            .watches
            .ids()
            .filter(|i| self.resources.get(*i).is_none_or(|(r, _)| !wanted_keys.contains(&key(r))))
            .collect();
        for i in stale {
            self.watches.stop(&i);
            let gone: Vec<Key> = self.tracked.keys().filter(|k| k.0 == i).cloned().collect();
            for k in gone {
                self.untrack(&k);
            }
        }
        for (ar, namespaced) in wanted {
            let i = match self.resources.iter().position(|(r, _)| key(r) == key(&ar)) {
                Some(i) => i,
                None => {
                    self.resources.push((ar.clone(), namespaced));
                    self.resources.len() - 1
                }
            };
            if self.watches.contains(&i) {
                continue;
            }
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &ar);
            let cfg = watcher::Config::default().labels(TTL_LABEL).page_size(500);
            self.watches.start(i, (), watcher(api, cfg).default_backoff());
        }
        let watched: Vec<(String, String, String)> = self
            .watches
            .ids()
            .filter_map(|i| self.resources.get(i))
            .map(|(ar, _)| (ar.group.clone(), ar.version.clone(), ar.plural.clone()))
            .collect();
        self.metrics.set_ttl_watched(watched);
    }

    fn untrack(&mut self, k: &Key) {
        if let Some(t) = self.tracked.remove(k) {
            self.queue.remove(&(t.due, k.clone()));
        }
    }

    /// Object `meta` of resource `i` seen (or `gone`).
    async fn on(&mut self, i: usize, meta: PartialObjectMeta<DynamicObject>, gone: bool) {
        let ns = meta.metadata.namespace.clone().unwrap_or_default();
        let name = meta.metadata.name.clone().unwrap_or_default();
        let k: Key = (i, ns, name);
        self.untrack(&k);
        if gone || meta.metadata.deletion_timestamp.is_some() {
            return;
        }
        let Some(value) = meta.metadata.labels.as_ref().and_then(|l| l.get(TTL_LABEL)).cloned() else { return };
        let uid = meta.metadata.uid.clone().unwrap_or_default();
        let created = meta
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32))
            .unwrap_or_else(Utc::now);
        let due = match expiry(&value, created) {
            Ok(d) => d,
            Err(e) => {
                self.invalid(&k, &meta, &value, &e.to_string()).await;
                return;
            }
        };
        let propagation = meta
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROPAGATION_ANNOTATION))
            .and_then(|p| verno_engine::ttl::propagation(p).ok());
        if self.tracked.len() >= self.opts.max_tracked {
            tracing::warn!(
                limit = self.opts.max_tracked,
                "ttl: too many labelled objects tracked; this one waits for the next resync"
            );
            return;
        }
        self.queue.insert((due, k.clone()));
        self.tracked.insert(k, Tracked { uid, due, propagation });
    }

    /// Logs and reports (once per object and value) a label that is not a TTL.
    async fn invalid(&mut self, k: &Key, meta: &PartialObjectMeta<DynamicObject>, value: &str, why: &str) {
        let uid = meta.metadata.uid.clone().unwrap_or_default();
        if !self.reported.insert((uid.clone(), value.to_string())) {
            return;
        }
        if self.reported.len() > 100_000 {
            self.reported.clear();
        }
        let Some((ar, _)) = self.resources.get(k.0) else { return };
        tracing::warn!(resource = %ar.plural, namespace = %k.1, name = %k.2, error = %why, "ttl: invalid label; the object is not deleted");
        let regarding = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            name: Some(k.2.clone()),
            namespace: Some(k.1.clone()).filter(|n| !n.is_empty()),
            uid: Some(uid),
            ..Default::default()
        };
        let ev = crate::events::policy_error(format!("{why}; the object is not deleted"), "None", None);
        self.events.publish(&ev, &regarding).await;
    }

    /// Deletes every object whose time has come.
    async fn expire(&mut self) {
        let now = Utc::now();
        while let Some((due, k)) = self.queue.first().cloned() {
            if due > now {
                break;
            }
            self.queue.remove(&(due, k.clone()));
            let Some(t) = self.tracked.remove(&k) else { continue };
            let Some((ar, namespaced)) = self.resources.get(k.0).cloned() else { continue };
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(self.client.clone(), &k.1, &ar)
            } else {
                Api::all_with(self.client.clone(), &ar)
            };
            self.pace.take().await;
            let dp = DeleteParams {
                propagation_policy: t.propagation.map(crate::runtime::propagation_of),
                preconditions: Some(Preconditions { uid: Some(t.uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            let labels = vec![
                ("resource_namespace", k.1.clone()),
                ("resource_group", ar.group.clone()),
                ("resource_version", ar.version.clone()),
                ("resource_resource", ar.plural.clone()),
            ];
            match api.delete(&k.2, &dp).await {
                Ok(_) => {
                    tracing::info!(resource = %ar.plural, namespace = %k.1, name = %k.2, "ttl: deleted");
                    self.metrics.cleanup_counted(CleanupCounter::Ttl, true, labels);
                }
                // Gone, or a new object of that name (uid precondition): nothing to do.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(resource = %ar.plural, namespace = %k.1, name = %k.2, error = %e, "ttl: delete failed; retried in 1 minute");
                    self.metrics.cleanup_counted(CleanupCounter::Ttl, false, labels);
                    let retry = now + chrono::Duration::minutes(1);
                    self.queue.insert((retry, k.clone()));
                    self.tracked.insert(k, Tracked { due: retry, ..t });
                }
            }
        }
    }
}
