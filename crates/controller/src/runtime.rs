//! What every controller of `verno serve --kube` runs on: the handles they share, the
//! "while this replica leads" loop, the watches a controller starts and stops at run time, one
//! pace for writes and events, an event recorder per reporting component, a discovery cache,
//! and evaluations on the blocking pool with a deadline.
//!
//! kube-runtime's `Controller` reconciles one kind whose watch is fixed when it starts; Verno's
//! controllers watch whatever the policies in force name, so the watch set changes while they
//! run. This module holds what they have in common; each controller module imports it and never
//! another controller.

use crate::cluster_data::ClusterData;
use crate::metrics::Metrics;
use crate::serving::Serving;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, verbs};
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::Value;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The handles every controller is given once.
#[derive(Clone)]
pub struct Shared {
    /// Verno's own account: statuses, events, reports.
    pub client: kube::Client,
    /// The accounts the background and cleanup controllers act as.
    pub acting: crate::Acting,
    pub server: Arc<dyn Serving>,
    /// The controllers' metrics (served by the server).
    pub metrics: Metrics,
    /// Context entries' view of the cluster (as Verno's account; see [`Shared::data_as`]).
    pub data: ClusterData,
    /// Bumped after every compiled set is installed.
    pub installed: watch::Receiver<u64>,
    /// Whether this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
    /// This replica's name (events' reporting instance).
    pub identity: String,
}

impl Shared {
    /// The client the background controller acts through.
    pub fn background_client(&self) -> kube::Client {
        self.acting.background.clone().unwrap_or_else(|| self.client.clone())
    }

    /// The client the cleanup and TTL controllers act through.
    pub fn cleanup_client(&self) -> kube::Client {
        self.acting.cleanup.clone().unwrap_or_else(|| self.client.clone())
    }

    /// Context entries reading the cluster as `client`'s account.
    pub fn data_as(&self, client: &kube::Client) -> ClusterData {
        self.data.acting_as(client.clone())
    }

    /// Events reported by `component` (Kyverno's reporting controller name), written as
    /// Verno's account, paced at the default event limits.
    pub fn events(&self, component: &'static str) -> Events {
        Events::new(self, component, EventLimits::default())
    }

    /// Runs one term of `what` each time this replica becomes the leader: `term()` is polled
    /// until it returns, leadership is lost or Verno stops (its state is dropped then, which
    /// stops its watches); `ended` runs after every term.
    pub async fn lead_while<F, Fut>(&self, what: &str, mut term: F, mut ended: impl FnMut())
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut leader = self.leader.clone();
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                r = leader.wait_for(|l| *l) => if r.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            tracing::info!("{what} starts (this replica leads)");
            tokio::select! {
                _ = term() => {}
                _ = leader.wait_for(|l| !*l) => tracing::info!("{what} stops (leadership lost)"),
                _ = stop.wait_for(|s| *s) => {}
            }
            ended();
            if *stop.borrow() {
                return;
            }
        }
    }
}

/// A counter any watcher bumps to wake the leader pass.
#[derive(Clone)]
pub struct Kick(Arc<watch::Sender<u64>>);

impl Kick {
    /// A kick and the receiver the leader pass waits on.
    pub fn new() -> (Kick, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0u64);
        (Kick(Arc::new(tx)), rx)
    }

    pub fn bump(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Watches one kind (optionally one name) until Verno stops, bumping `kick` on every event;
/// `on` sees the objects.
pub fn watch_named<K>(
    api: kube::Api<K>,
    name: Option<&str>,
    kick: Kick,
    mut stop: watch::Receiver<bool>,
    mut on: impl FnMut(&K) + Send + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::WatchStreamExt;
    let mut cfg = watcher::Config::default();
    if let Some(n) = name {
        cfg = cfg.fields(&format!("metadata.name={n}"));
    }
    tokio::spawn(async move {
        let mut s = watcher(api, cfg).default_backoff().boxed();
        loop {
            tokio::select! {
                ev = s.next() => match ev {
                    Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o))) => { on(&o); kick.bump(); }
                    Some(Ok(_)) => kick.bump(),
                    Some(Err(e)) => tracing::debug!(error = %e, "watch error (retrying)"),
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Keeps `writer`'s store in step with the objects of `api` that `config` selects until Verno
/// stops.
pub fn reflect<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    writer: kube::runtime::reflector::store::Writer<K>,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) -> JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    use kube::runtime::WatchStreamExt;
    tokio::spawn(async move {
        let mut s = watcher(api, config).default_backoff().reflect(writer).boxed();
        loop {
            tokio::select! {
                ev = s.next() => match ev {
                    Some(Err(e)) => tracing::debug!(error = %e, kind = what, "watch error (retrying)"),
                    Some(Ok(_)) => {}
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// A token bucket: `per_second` sustained, `burst` after a quiet spell. Writes wait for a
/// token ([`Pace::take`]); events never wait ([`Pace::try_take`]: dropped and counted beyond).
pub struct Pace {
    tokens: f64,
    at: Instant,
    per_second: f64,
    burst: f64,
}

impl Pace {
    pub fn new(per_second: f64, burst: f64) -> Pace {
        Pace { tokens: burst, at: Instant::now(), per_second, burst }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.per_second).min(self.burst);
        self.at = now;
    }

    /// Waits until a write may go.
    pub async fn take(&mut self) {
        loop {
            if self.try_take() {
                return;
            }
            let wait = (1.0 - self.tokens) / self.per_second.max(0.001);
            tokio::time::sleep(Duration::from_secs_f64(wait.min(1.0))).await;
        }
    }

    /// Whether a write may go now (never waits).
    pub fn try_take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How events are paced.
#[derive(Debug, Clone, Copy)]
pub struct EventLimits {
    /// Sustained events written per second.
    pub per_second: f64,
    /// Events that may be written at once after a quiet period.
    pub burst: f64,
}

impl Default for EventLimits {
    fn default() -> Self {
        EventLimits { per_second: 20.0, burst: 100.0 }
    }
}

/// One reporting component's events (`reportingController` = Kyverno's name for it), paced;
/// what does not fit is dropped and counted (`verno_events_dropped_total`).
pub struct Events {
    recorder: Recorder,
    pace: Pace,
    metrics: Metrics,
}

impl Events {
    pub fn new(shared: &Shared, component: &'static str, limits: EventLimits) -> Events {
        let reporter = Reporter { controller: component.into(), instance: Some(shared.identity.clone()) };
        Events {
            recorder: Recorder::new(shared.client.clone(), reporter),
            pace: Pace::new(limits.per_second, limits.burst),
            metrics: shared.metrics.clone(),
        }
    }

    /// Writes `ev` about `regarding` unless the pace is exceeded (then counts it dropped).
    pub async fn publish(&mut self, ev: &Event, regarding: &ObjectReference) {
        if !self.pace.try_take() {
            self.metrics.event_dropped();
            return;
        }
        if let Err(e) = self.recorder.publish(ev, regarding).await {
            tracing::debug!(error = %e, "event not written");
        }
    }
}

/// A watch's running task: aborted when dropped.
struct Running<M> {
    meta: M,
    generation: u64,
    task: JoinHandle<()>,
}

impl<M> Drop for Running<M> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watches a controller runs, each under an id with the controller's own data `M` about
/// it. Every event reaches the controller's channel as `(id, generation, event)`; a restarted
/// watch gets a new generation, so the events an older one left in the channel are told apart
/// ([`Watches::current`]). Dropping the set stops every watch.
pub struct Watches<I, M, E> {
    running: HashMap<I, Running<M>>,
    tx: mpsc::Sender<(I, u64, E)>,
    next: u64,
    /// What the watch errors are logged as.
    what: &'static str,
}

impl<I, M, E> Watches<I, M, E>
where
    I: Copy + Eq + Hash + Send + 'static,
    E: Send + 'static,
{
    pub fn new(tx: mpsc::Sender<(I, u64, E)>, what: &'static str) -> Watches<I, M, E> {
        Watches { running: HashMap::new(), tx, next: 0, what }
    }

    /// Starts (or restarts) the watch `id` on `stream` with `meta`; returns its generation.
    pub fn start<S>(&mut self, id: I, meta: M, stream: S) -> u64
    where
        S: Stream<Item = Result<E, watcher::Error>> + Send + 'static,
    {
        self.running.remove(&id);
        self.next += 1;
        let generation = self.next;
        let tx = self.tx.clone();
        let what = self.what;
        let task = tokio::spawn(async move {
            let mut s = std::pin::pin!(stream);
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send((id, generation, ev)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "{what} watch error (retrying)"),
                }
            }
        });
        self.running.insert(id, Running { meta, generation, task });
        generation
    }

    /// The data of watch `id` when `generation` is its current one (an event to act on).
    pub fn current(&mut self, id: I, generation: u64) -> Option<&mut M> {
        self.running.get_mut(&id).filter(|r| r.generation == generation).map(|r| &mut r.meta)
    }

    pub fn get(&self, id: &I) -> Option<&M> {
        self.running.get(id).map(|r| &r.meta)
    }

    pub fn contains(&self, id: &I) -> bool {
        self.running.contains_key(id)
    }

    /// Stops watch `id`; its data.
    pub fn stop(&mut self, id: &I) -> Option<M>
    where
        M: Clone,
    {
        self.running.remove(id).map(|r| r.meta.clone())
    }

    pub fn ids(&self) -> impl Iterator<Item = I> + '_ {
        self.running.keys().copied()
    }

    pub fn values(&self) -> impl Iterator<Item = &M> + '_ {
        self.running.values().map(|r| &r.meta)
    }

    pub fn iter(&self) -> impl Iterator<Item = (I, &M)> + '_ {
        self.running.iter().map(|(i, r)| (*i, &r.meta))
    }
}

/// The API server's discovery, kept and refreshed at most once per `max_age` (a leader's
/// controllers resolve kinds often; discovery is dozens of requests).
pub struct DiscoveryCache {
    cached: Option<(Instant, Arc<Discovery>)>,
    max_age: Duration,
}

impl DiscoveryCache {
    pub fn new(max_age: Duration) -> DiscoveryCache {
        DiscoveryCache { cached: None, max_age }
    }

    /// The cached discovery; with `fresh`, run again unless younger than `max_age`. On failure
    /// the last one (logged with `keeps`, what the caller goes on with).
    pub async fn get(&mut self, client: &kube::Client, fresh: bool, keeps: &str) -> Option<Arc<Discovery>> {
        if let Some((at, d)) = &self.cached
            && (!fresh || at.elapsed() < self.max_age)
        {
            return Some(d.clone());
        }
        match Discovery::new(client.clone()).run().await {
            Ok(d) => {
                let d = Arc::new(d);
                self.cached = Some((Instant::now(), d.clone()));
                Some(d)
            }
            Err(e) => {
                tracing::warn!(error = %e, "discovery failed; {keeps}");
                self.cached.as_ref().map(|(_, d)| d.clone())
            }
        }
    }
}

/// The listable, watchable resources of `scope` (a policy's match): its group (any with `*`),
/// its version (the group's preferred one with `*`), its kind or resource (globs allowed).
pub fn resolve(d: &Discovery, scope: &verno_engine::WebhookScope) -> Vec<(ApiResource, ApiCapabilities)> {
    let mut out = Vec::new();
    for g in d.groups() {
        if scope.group != "*" && scope.group != g.name() {
            continue;
        }
        let resources =
            if scope.version == "*" { g.recommended_resources() } else { g.versioned_resources(&scope.version) };
        for (ar, caps) in resources {
            if !caps.supports_operation(verbs::LIST) || !caps.supports_operation(verbs::WATCH) {
                continue;
            }
            let hit = match (&scope.resource, &scope.kind) {
                (Some(r), _) => r == "*" || *r == ar.plural,
                (None, Some(k)) => verno_jmespath::wildcard::matches(k, &ar.kind),
                (None, None) => false,
            };
            if hit {
                out.push((ar, caps));
            }
        }
    }
    out
}

/// The clock, randomness and deadline of an evaluation on the blocking pool.
pub struct Deadline {
    cancel: Arc<AtomicBool>,
}

impl verno_jmespath::Env for Deadline {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
    fn cancel_flag(&self) -> Option<Arc<AtomicBool>> {
        Some(self.cancel.clone())
    }
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Utc::now().fixed_offset())
    }
    fn random_seed(&self) -> Option<u64> {
        Some(fresh_seed())
    }
}

/// A fresh seed for `random()` (JMESPath's and CEL's): a randomly keyed hasher's output, random
/// enough for generated names without another crate.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// Why an evaluation on the blocking pool gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum EvaluationError {
    /// The evaluation saw its cancel flag raised (its deadline passed).
    #[error("the evaluation was cancelled at its deadline")]
    Cancelled,
    /// The evaluation panicked.
    #[error("the evaluation panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
}

/// Runs `work` on the blocking pool (evaluations may read the cluster through context entries)
/// with an environment whose cancel flag is raised after `deadline`; `Err` when it panicked.
pub async fn evaluate_blocking<R>(
    deadline: Duration,
    work: impl FnOnce(&Deadline) -> R + Send + 'static,
) -> Result<R, EvaluationError>
where
    R: Send + 'static,
{
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let timer = tokio::spawn(async move {
        tokio::time::sleep(deadline).await;
        flag.store(true, Ordering::Relaxed);
    });
    let out = tokio::task::spawn_blocking(move || work(&Deadline { cancel })).await;
    timer.abort();
    out.map_err(EvaluationError::Panicked)
}

/// The API's deletion propagation for a policy's or annotation's word (Kyverno's default,
/// foreground, for anything else).
pub fn propagation_of(p: &str) -> kube::api::PropagationPolicy {
    use kube::api::PropagationPolicy;
    match p {
        "Orphan" => PropagationPolicy::Orphan,
        "Background" => PropagationPolicy::Background,
        _ => PropagationPolicy::Foreground,
    }
}

/// Hashes a JSON value; with `top` the object's `status` and bookkeeping metadata are left
/// out (what Kyverno's resource hash leaves out: policies see neither).
fn hash_json(v: &Value, h: &mut DefaultHasher, top: bool) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(a) => {
            (4u8, a.len()).hash(h);
            for x in a {
                hash_json(x, h, false);
            }
        }
        Value::Object(m) => {
            5u8.hash(h);
            for (k, x) in m {
                if top && k == "status" {
                    continue;
                }
                k.hash(h);
                if top && k == "metadata" {
                    if let Value::Object(meta) = x {
                        6u8.hash(h);
                        for (mk, mv) in meta {
                            if matches!(mk.as_str(), "resourceVersion" | "managedFields" | "generation") {
                                continue;
                            }
                            mk.hash(h);
                            hash_json(mv, h, false);
                        }
                    }
                    continue;
                }
                hash_json(x, h, false);
            }
        }
    }
}

/// A hash of what policies see of an object (not its status or bookkeeping metadata); never 0
/// (callers use 0 for "not evaluated yet"). Stable within one process only.
pub fn object_hash(o: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    hash_json(o, &mut h, true);
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_hash_ignores_status_and_bookkeeping() {
        let a = serde_json::json!({"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "1", "labels": {"a": "b"}}, "spec": {"x": 1}, "status": {"phase": "Pending"}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = serde_json::json!("2");
        b["status"]["phase"] = serde_json::json!("Running");
        b["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubelet"}]);
        assert_eq!(object_hash(&a), object_hash(&b));
        b["metadata"]["labels"]["a"] = serde_json::json!("c");
        assert_ne!(object_hash(&a), object_hash(&b));
        let mut c = a.clone();
        c["spec"]["x"] = serde_json::json!(2);
        assert_ne!(object_hash(&a), object_hash(&c));
    }

    #[tokio::test]
    async fn the_pace_gives_a_burst_then_waits_for_a_token() {
        let mut p = Pace::new(50.0, 3.0);
        assert!(p.try_take() && p.try_take() && p.try_take());
        assert!(!p.try_take());
        let mut never = Pace::new(0.0, 2.0);
        assert!(never.try_take() && never.try_take() && !never.try_take());
        let before = Instant::now();
        p.take().await;
        // A token comes every 20 ms at 50 per second.
        assert!(before.elapsed() >= Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_restarted_watch_tells_its_old_events_apart() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut w: Watches<u32, &'static str, u8> = Watches::new(tx, "test");
        let first = w.start(1, "one", futures_util::stream::iter([Ok(1u8)]));
        let (id, generation, ev) = rx.recv().await.expect("an event");
        assert_eq!((id, generation, ev), (1, first, 1));
        let second = w.start(1, "again", futures_util::stream::pending());
        assert_ne!(first, second);
        assert!(w.current(1, first).is_none());
        assert_eq!(w.current(1, second).copied(), Some("again"));
        assert_eq!(w.stop(&1), Some("again"));
        assert!(w.get(&1).is_none());
    }

    #[tokio::test]
    async fn the_deadline_cancels_a_long_evaluation() {
        let out = evaluate_blocking(Duration::from_millis(20), |env| {
            let start = std::time::Instant::now();
            while !verno_jmespath::Env::cancelled(env) {
                if start.elapsed() > Duration::from_secs(10) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        })
        .await;
        assert!(matches!(out, Ok(true)), "{out:?}");
    }
}
