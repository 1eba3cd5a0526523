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

use crate::policies::Gvr;
use crate::serving::{CleanupCounter, Serving};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DeleteParams, Preconditions};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::discovery::{Scope as ApiScope, verbs};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
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

enum Msg {
    Seen(usize, PartialObjectMeta<DynamicObject>),
    Gone(usize, PartialObjectMeta<DynamicObject>),
}

/// Runs the TTL controller while this replica leads, until `stop`.
pub async fn run(
    client: kube::Client,
    acting: kube::Client,
    server: Arc<dyn Serving>,
    mut leader: watch::Receiver<bool>,
    opts: TtlOptions,
    identity: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            r = leader.wait_for(|l| *l) => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        tracing::info!("ttl controller starts (this replica leads)");
        // Watches, access checks and deletes act as the cleanup account; events are Verno's own.
        let mut t = Ttl {
            client: acting.clone(),
            server: server.clone(),
            opts,
            resources: Vec::new(),
            watches: HashMap::new(),
            tracked: HashMap::new(),
            queue: BTreeSet::new(),
            reported: HashSet::new(),
            recorder: Recorder::new(
                client.clone(),
                Reporter { controller: crate::cleanup::CLEANUP_CONTROLLER.into(), instance: Some(identity.clone()) },
            ),
            bucket: crate::scan::Bucket {
                tokens: opts.burst,
                at: tokio::time::Instant::now(),
                per_second: opts.deletes_per_second,
                burst: opts.burst,
            },
            event_bucket: crate::events::Bucket::new(crate::events::Limits::default()),
        };
        tokio::select! {
            _ = t.lead() => {}
            _ = leader.wait_for(|l| !*l) => tracing::info!("ttl controller stops (leadership lost)"),
            _ = stop.wait_for(|s| *s) => {}
        }
        for w in t.watches.values() {
            w.abort();
        }
        if *stop.borrow() {
            return;
        }
    }
}

struct Ttl {
    client: kube::Client,
    server: Arc<dyn Serving>,
    opts: TtlOptions,
    /// Every resource ever watched (indexes stay valid while this replica leads).
    resources: Vec<(ApiResource, bool)>,
    watches: HashMap<usize, JoinHandle<()>>,
    tracked: HashMap<Key, Tracked>,
    queue: BTreeSet<(DateTime<Utc>, Key)>,
    /// (uid, value) of invalid labels already reported.
    reported: HashSet<(String, String)>,
    recorder: Recorder,
    bucket: crate::scan::Bucket,
    event_bucket: crate::events::Bucket,
}

impl Ttl {
    async fn lead(&mut self) {
        let (tx, mut rx) = mpsc::channel::<Msg>(256);
        let mut resync = tokio::time::interval(self.opts.interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wait = self
                .queue
                .first()
                .map(|(t, _)| (*t - Utc::now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                _ = resync.tick() => self.discover(&tx).await,
                m = rx.recv() => match m {
                    Some(m) => self.on(m).await,
                    None => return,
                },
                _ = tokio::time::sleep(wait) => self.expire().await,
            }
        }
    }

    /// Works out the resources to watch and starts or stops their watches.
    async fn discover(&mut self, tx: &mpsc::Sender<Msg>) {
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
            .keys()
            .copied()
            .filter(|i| self.resources.get(*i).is_none_or(|(r, _)| !wanted_keys.contains(&key(r))))
            .collect();
        for i in stale {
            if let Some(w) = self.watches.remove(&i) {
                w.abort();
            }
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
            if self.watches.contains_key(&i) {
                continue;
            }
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &ar);
            let tx = tx.clone();
            let cfg = watcher::Config::default().labels(TTL_LABEL).page_size(500);
            self.watches.insert(
                i,
                tokio::spawn(async move {
                    let mut s = watcher(api, cfg).default_backoff().boxed();
                    while let Some(ev) = s.next().await {
                        let msg = match ev {
                            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => Msg::Seen(i, m),
                            Ok(watcher::Event::Delete(m)) => Msg::Gone(i, m),
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::debug!(error = %e, "ttl watch error (retrying)");
                                continue;
                            }
                        };
                        if tx.send(msg).await.is_err() {
                            return;
                        }
                    }
                }),
            );
        }
        let watched: Vec<(String, String, String)> = self
            .watches
            .keys()
            .filter_map(|i| self.resources.get(*i))
            .map(|(ar, _)| (ar.group.clone(), ar.version.clone(), ar.plural.clone()))
            .collect();
        self.server.set_ttl_watched(watched);
    }

    fn untrack(&mut self, k: &Key) {
        if let Some(t) = self.tracked.remove(k) {
            self.queue.remove(&(t.due, k.clone()));
        }
    }

    async fn on(&mut self, m: Msg) {
        let (i, meta, gone) = match m {
            Msg::Seen(i, m) => (i, m, false),
            Msg::Gone(i, m) => (i, m, true),
        };
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
                self.invalid(&k, &meta, &value, &e).await;
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
        if !self.event_bucket.take() {
            self.server.event_dropped();
            return;
        }
        let regarding = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            name: Some(k.2.clone()),
            namespace: Some(k.1.clone()).filter(|n| !n.is_empty()),
            uid: Some(uid),
            ..Default::default()
        };
        let mut note = format!("{why}; the object is not deleted");
        crate::events::truncate_note(&mut note);
        let ev = Event {
            type_: EventType::Warning,
            reason: "PolicyError".into(),
            note: Some(note),
            action: "None".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &regarding).await {
            tracing::debug!(error = %e, "ttl event not written");
        }
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
            self.bucket.take().await;
            let dp = DeleteParams {
                propagation_policy: t.propagation.map(crate::cleanup::propagation_of),
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
                    self.server.cleanup_counted(CleanupCounter::Ttl, true, labels);
                }
                // Gone, or a new object of that name (uid precondition): nothing to do.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(resource = %ar.plural, namespace = %k.1, name = %k.2, error = %e, "ttl: delete failed; retried in 1 minute");
                    self.server.cleanup_counted(CleanupCounter::Ttl, false, labels);
                    let retry = now + chrono::Duration::minutes(1);
                    self.queue.insert((retry, k.clone()));
                    self.tracked.insert(k, Tracked { due: retry, ..t });
                }
            }
        }
    }
}
