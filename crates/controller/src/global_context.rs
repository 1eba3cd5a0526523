//! GlobalContextEntries in the cluster: every replica keeps each entry's data — a resource's
//! objects, fed by a watch, or an API call's answer, made again on its refresh interval — in
//! one store that `globalReference` context entries and CEL's `globalContext.Get` read, as
//! Kyverno's global context controller does in each of its controllers.
//!
//! Kyverno's behaviour kept: an entry is found only once its data is loaded (until then
//! `globalReference` fails with "failed to fetch entry key=NAME" and `globalContext.Get` is
//! null); projections are computed when the data changes and a missing one is an error
//! (`projection "P" not found`); a failed call keeps its error until the next one succeeds;
//! the leader stamps `status.lastRefreshTime` after each successful call.
//!
//! Bounds: at most [`MAX_ENTRIES`] entries are kept (Kyverno's `maxGlobalContextEntries` is
//! unbounded by default); an API call's answer is read up to the server's response limit; a
//! resource entry holds what its watch holds, as Kyverno's informer does. Objects and
//! projections are recomputed lazily, at the first read after a change, so a burst of events
//! costs one pass.

use crate::cluster_data;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersion};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use verno_engine::global_context::{Call, CallTarget, GlobalEntry, GlobalSource};

/// The most entries kept; more are logged and left out.
pub const MAX_ENTRIES: usize = 1000;

/// GlobalContextEntry as Kyverno stores it.
pub fn global_context_entries() -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v2beta1".into(),
        api_version: "kyverno.io/v2beta1".into(),
        kind: "GlobalContextEntry".into(),
        plural: "globalcontextentries".into(),
    }
}

/// Why an entry's data or one of its projections cannot be read (`globalReference` context
/// entries and `globalContext.Get` show the text, as Kyverno words it).
#[derive(Debug, Clone, thiserror::Error)]
pub enum GlobalError {
    /// No projection of that name.
    #[error("projection {projection:?} not found")]
    NoProjection { projection: String },
    /// An API call entry with no answer yet, or without that projection.
    #[error("no data available")]
    NoData,
    /// The projection's query failed on the data (the JMESPath engine's message).
    #[error("{0}")]
    Projection(String),
    /// The entry's last API call failed.
    #[error(transparent)]
    Call(Arc<CallError>),
}

/// Why an API call entry's call failed, in Kyverno's words.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// A call to the Kubernetes API.
    #[error("failed to {method} resource with raw url: {path}: {source}")]
    Raw {
        method: String,
        path: String,
        #[source]
        source: cluster_data::FetchError,
    },
    /// A call to a service.
    #[error(transparent)]
    Service(#[from] crate::service_call::ServiceCallError),
}

/// Why a resource entry's resource could not be found by discovery.
#[derive(Debug, thiserror::Error)]
enum DiscoverError {
    /// The group's discovery failed (`group` is `core` for the core group).
    #[error("{group}/{version}: {source}")]
    Group {
        group: String,
        version: String,
        #[source]
        source: kube::Error,
    },
    /// The group does not serve the resource.
    #[error("the resource {resource} may not exist in the cluster")]
    NotServed { resource: String },
}

/// The clock for projections (`time_now()` and friends); nothing else.
struct ProjectionEnv;

impl verno_jmespath::Env for ProjectionEnv {
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Utc::now().fixed_offset())
    }
}

/// An entry's data with its projections, as of one generation.
struct Snapshot {
    generation: u64,
    data: Value,
    /// Each projection's answer (the engine's message when its query failed).
    projected: HashMap<String, Result<Value, String>>,
}

impl Snapshot {
    fn of(entry: &GlobalEntry, generation: u64, data: Value) -> Snapshot {
        let projected = entry.projections.iter().map(|p| (p.name.clone(), p.apply(&data, &ProjectionEnv))).collect();
        Snapshot { generation, data, projected }
    }

    fn get(&self, projection: &str) -> Result<Value, GlobalError> {
        if projection.is_empty() {
            return Ok(self.data.clone());
        }
        match self.projected.get(projection) {
            Some(r) => r.clone().map_err(GlobalError::Projection),
            None => Err(GlobalError::NoProjection { projection: projection.to_string() }),
        }
    }
}

/// Where an entry's data is.
enum Feed {
    /// A resource's objects: the watch's store, whether it has listed once, and a counter of
    /// its events.
    Objects { store: Store<DynamicObject>, api_version: String, kind: String, synced: AtomicBool, events: AtomicU64 },
    /// An API call's last answer with its projections (`None`: no call has finished yet).
    Answer(Option<Result<Snapshot, Arc<CallError>>>),
}

/// One live entry: its spec, its data, and the task that keeps the data.
pub struct Live {
    entry: GlobalEntry,
    feed: RwLock<Option<Feed>>,
    /// A resource entry's objects and projections as of its last read after a change.
    cache: Mutex<Option<Arc<Snapshot>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Live {
    fn new(entry: GlobalEntry) -> Arc<Live> {
        Arc::new(Live { entry, feed: RwLock::new(None), cache: Mutex::new(None), task: Mutex::new(None) })
    }

    /// The data or a projection of it; `None`: not loaded yet (not found, as in Kyverno).
    fn get(&self, projection: &str) -> Option<Result<Value, GlobalError>> {
        let feed = self.feed.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match feed.as_ref()? {
            Feed::Objects { store, api_version, kind, synced, events } => {
                if !synced.load(Ordering::Acquire) {
                    return None;
                }
                let generation = events.load(Ordering::Acquire);
                let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let fresh = cache.as_ref().filter(|s| s.generation == generation).cloned();
                let snapshot = match fresh {
                    Some(s) => s,
                    None => {
                        let objects: Vec<Value> = store
                            .state()
                            .iter()
                            .filter_map(|o| serde_json::to_value(&**o).ok())
                            .map(|mut o| {
                                if let Some(m) = o.as_object_mut() {
                                    m.entry("apiVersion").or_insert_with(|| json!(api_version));
                                    m.entry("kind").or_insert_with(|| json!(kind));
                                }
                                o
                            })
                            .collect();
                        let s = Arc::new(Snapshot::of(&self.entry, generation, Value::Array(objects)));
                        *cache = Some(s.clone());
                        s
                    }
                };
                Some(snapshot.get(projection))
            }
            Feed::Answer(None) => Some(Err(GlobalError::NoData)),
            Feed::Answer(Some(Err(e))) => Some(Err(GlobalError::Call(e.clone()))),
            // An API call's projections are computed when its answer arrives; a missing one
            // reads as no data (Kyverno's map lookup).
            Feed::Answer(Some(Ok(s))) => Some(if projection.is_empty() || s.projected.contains_key(projection) {
                s.get(projection)
            } else {
                Err(GlobalError::NoData)
            }),
        }
    }

    fn set_feed(&self, feed: Feed) {
        *self.feed.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(feed);
    }

    fn set_answer(&self, answer: Result<Value, CallError>) {
        self.set_feed(Feed::Answer(Some(answer.map(|v| Snapshot::of(&self.entry, 0, v)).map_err(Arc::new))));
    }

    fn stop(&self) {
        if let Some(t) = self.task.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            t.abort();
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every entry, by name.
#[derive(Default)]
pub struct GlobalStore {
    entries: RwLock<HashMap<String, Arc<Live>>>,
}

impl GlobalStore {
    /// Entry `name`'s data (`projection` empty) or one of its projections; `None`: no such
    /// entry, or not loaded yet.
    pub fn get(&self, name: &str, projection: &str) -> Option<Result<Value, GlobalError>> {
        let live = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).cloned()?;
        live.get(projection)
    }

    fn spec_of(&self, name: &str) -> Option<GlobalEntry> {
        self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).map(|l| l.entry.clone())
    }

    fn remove(&self, name: &str) {
        let old = self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
        if let Some(l) = old {
            l.stop();
        }
    }

    fn names(&self) -> Vec<String> {
        self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner).keys().cloned().collect()
    }

    /// Puts `live` under `name` (stopping the entry it replaces); false when the store is full.
    fn insert(&self, name: &str, live: Arc<Live>) -> bool {
        let mut entries = self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !entries.contains_key(name) && entries.len() >= MAX_ENTRIES {
            return false;
        }
        if let Some(old) = entries.insert(name.to_string(), live) {
            old.stop();
        }
        true
    }
}

/// What the entries' tasks share.
#[derive(Clone)]
struct Ctx {
    client: kube::Client,
    leader: watch::Receiver<bool>,
    manager: String,
    max_bytes: usize,
}

/// Keeps `store` in step with the cluster's GlobalContextEntries until `stop` (every replica);
/// the leader stamps the API call entries' refresh times (as field manager `manager`).
pub async fn run(
    client: kube::Client,
    store: Arc<GlobalStore>,
    leader: watch::Receiver<bool>,
    manager: String,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Ctx { client: client.clone(), leader, manager, max_bytes: cluster_data::MAX_BYTES };
    let api: Api<DynamicObject> = Api::all_with(client, &global_context_entries());
    let mut s = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut listed: Option<Vec<String>> = None;
    loop {
        tokio::select! {
            ev = s.next() => match ev {
                Some(Ok(watcher::Event::Init)) => listed = Some(Vec::new()),
                Some(Ok(watcher::Event::InitApply(o))) => {
                    if let (Some(l), Some(n)) = (listed.as_mut(), o.metadata.name.clone()) {
                        l.push(n);
                    }
                    apply(&store, &ctx, &o);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(l) = listed.take() {
                        for gone in store.names().into_iter().filter(|n| !l.contains(n)) {
                            store.remove(&gone);
                        }
                    }
                }
                Some(Ok(watcher::Event::Apply(o))) => apply(&store, &ctx, &o),
                Some(Ok(watcher::Event::Delete(o))) => {
                    if let Some(n) = o.metadata.name.as_deref() {
                        store.remove(n);
                    }
                }
                // No such CRD (a cluster without Kyverno's): the watch retries with backoff.
                Some(Err(e)) => tracing::debug!(error = %e, "GlobalContextEntry watch error (retrying)"),
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Starts (or restarts, when its spec changed) the entry an object describes.
fn apply(store: &Arc<GlobalStore>, ctx: &Ctx, o: &DynamicObject) {
    let Some(name) = o.metadata.name.clone() else { return };
    let obj = serde_json::to_value(o).unwrap_or_default();
    let entry = match GlobalEntry::from_object(&obj) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(entry = %name, error = %e, "GlobalContextEntry is not valid; not loaded");
            store.remove(&name);
            return;
        }
    };
    if store.spec_of(&name).as_ref() == Some(&entry) {
        return;
    }
    let live = Live::new(entry);
    let task = match live.entry.source.clone() {
        GlobalSource::Resource { group, version, resource, namespace } => {
            tokio::spawn(watch_objects(ctx.clone(), Arc::downgrade(&live), group, version, resource, namespace))
        }
        GlobalSource::ApiCall { call, refresh, retry_limit } => {
            tokio::spawn(call_on_interval(ctx.clone(), Arc::downgrade(&live), name.clone(), call, refresh, retry_limit))
        }
    };
    *live.task.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
    if !store.insert(&name, live) {
        tracing::warn!(entry = %name, max = MAX_ENTRIES, "GlobalContextEntry not loaded: the store is full");
    }
    // An entry an older Verno marked as not supported loses that mark (the leader's apply
    // without the fields drops what this manager wrote).
    let marked = obj.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
        cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "False" && c["reason"] == "Unsupported")
    });
    if marked && *ctx.leader.borrow() {
        let ctx = ctx.clone();
        tokio::spawn(async move { write_status(&ctx, &name, None).await });
    }
}

/// Writes the entry's status as this manager (`refreshed`: the time of the last successful
/// call; `None`: nothing of its own).
async fn write_status(ctx: &Ctx, name: &str, refreshed: Option<String>) {
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &global_context_entries());
    let status = match refreshed {
        Some(t) => json!({"lastRefreshTime": t}),
        None => json!({}),
    };
    let body = json!({"apiVersion": "kyverno.io/v2beta1", "kind": "GlobalContextEntry",
        "metadata": {"name": name}, "status": status});
    if let Err(e) = api.patch_status(name, &PatchParams::apply(&ctx.manager).force(), &Patch::Apply(&body)).await {
        tracing::debug!(entry = %name, error = %e, "GlobalContextEntry status not written");
    }
}

/// The resource a `kubernetesResource` names, from discovery (its kind and scope).
async fn discover(
    client: &kube::Client,
    group: &str,
    version: &str,
    resource: &str,
) -> Result<ApiResource, DiscoverError> {
    let gv = GroupVersion { group: group.to_string(), version: version.to_string() };
    let found = kube::discovery::oneshot::pinned_group(client, &gv).await.map_err(|source| DiscoverError::Group {
        group: if group.is_empty() { "core" } else { group }.to_string(),
        version: version.to_string(),
        source,
    })?;
    found
        .resources_by_stability()
        .into_iter()
        .map(|(ar, _)| ar)
        .find(|ar| ar.plural == resource)
        .ok_or_else(|| DiscoverError::NotServed { resource: resource.to_string() })
}

/// Feeds a resource entry from a watch of its objects, for as long as the entry lives.
async fn watch_objects(
    ctx: Ctx,
    live: std::sync::Weak<Live>,
    group: String,
    version: String,
    resource: String,
    namespace: String,
) {
    let mut wait = Duration::from_secs(1);
    let ar = loop {
        match discover(&ctx.client, &group, &version, &resource).await {
            Ok(ar) => break ar,
            Err(e) => {
                tracing::warn!(error = %e, "GlobalContextEntry: failed to sync cache (retrying)");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(60));
                if live.strong_count() == 0 {
                    return;
                }
            }
        }
    };
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    {
        let Some(l) = live.upgrade() else { return };
        l.set_feed(Feed::Objects {
            store,
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
            synced: AtomicBool::new(false),
            events: AtomicU64::new(0),
        });
    }
    let api: Api<DynamicObject> = if namespace.is_empty() {
        Api::all_with(ctx.client.clone(), &ar)
    } else {
        Api::namespaced_with(ctx.client.clone(), &namespace, &ar)
    };
    let mut s = watcher(api, watcher::Config::default()).default_backoff().reflect(writer).boxed();
    while let Some(ev) = s.next().await {
        let Some(l) = live.upgrade() else { return };
        let feed = l.feed.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Feed::Objects { synced, events, .. }) = feed.as_ref() {
            match ev {
                Ok(watcher::Event::InitDone) => {
                    events.fetch_add(1, Ordering::AcqRel);
                    synced.store(true, Ordering::Release);
                }
                Ok(_) => {
                    events.fetch_add(1, Ordering::AcqRel);
                }
                Err(e) => {
                    tracing::debug!(error = %e, resource = %ar.plural, "GlobalContextEntry watch error (retrying)")
                }
            }
        }
    }
}

/// Makes an API call entry's call now and every `refresh`, for as long as the entry lives.
async fn call_on_interval(
    ctx: Ctx,
    live: std::sync::Weak<Live>,
    name: String,
    call: Call,
    refresh: Duration,
    retry_limit: u32,
) {
    if let Some(l) = live.upgrade() {
        l.set_feed(Feed::Answer(None));
    }
    loop {
        let mut answer = execute(&ctx, &call).await;
        for _ in 1..retry_limit.max(1) {
            if answer.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            answer = execute(&ctx, &call).await;
        }
        let Some(l) = live.upgrade() else { return };
        match &answer {
            Ok(_) if *ctx.leader.borrow() => {
                let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
                write_status(&ctx, &name, Some(now)).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(entry = %name, error = %e, "GlobalContextEntry: failed to get data from api caller")
            }
        }
        l.set_answer(answer);
        drop(l);
        tokio::time::sleep(refresh).await;
    }
}

/// One call, in Kyverno's words when it fails.
async fn execute(ctx: &Ctx, call: &Call) -> Result<Value, CallError> {
    match &call.target {
        CallTarget::Path(path) => {
            let body = (call.method == "POST").then(|| call.body.clone().unwrap_or_else(|| json!({})));
            cluster_data::fetch(&ctx.client, &call.method, path, body.as_ref(), ctx.max_bytes)
                .await
                .map_err(|source| CallError::Raw { method: call.method.clone(), path: path.clone(), source })
        }
        CallTarget::Service { url, ca_bundle, headers } => {
            Ok(crate::service_call::call(&call.method, url, ca_bundle, headers, call.body.as_ref(), ctx.max_bytes)
                .await?)
        }
    }
}
