//! The cleanup controller (leader only): CleanupPolicy, ClusterCleanupPolicy, DeletingPolicy
//! and NamespacedDeletingPolicy run on their cron schedules.
//!
//! A policy's next run is the first schedule time after its `status.lastExecutionTime` (its
//! creation when it never ran), as Kyverno computes it, so a restart neither skips nor repeats
//! a run. A run lists each kind or resource the policy names in pages (500 objects, the
//! policy's label selector pushed down to the API server; a namespaced policy lists its own
//! namespace only), asks the engine's front door about each page (`Scope::cleanup`, on the
//! blocking pool), and deletes what is due with the policy's propagation policy, paced by a
//! token bucket. Memory is one page, whatever the cluster holds (Kyverno lists every kind
//! whole, kyverno#17208). Each deletion is an event on the policy (`kyverno-cleanup`,
//! `PolicyApplied` / `PolicyError`) and counts in Kyverno's metrics; a run that met errors
//! is tried again (10 s, 30 s, … 5 min, at most 5 times) before the schedule moves on, and
//! `lastExecutionTime` is written after each completed run.

use crate::metrics::{CleanupCounter, Metrics};
use crate::runtime::{DiscoveryCache, EvaluationError, Events, Pace, Shared, evaluate_blocking, resolve};
use crate::serving::Serving;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::Scope as ApiScope;
use kube::runtime::events::{Event, EventType};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use verno_engine::{CompiledPolicy, Kind, PolicySet, Request, Scope, Status};

/// Field manager of `status.lastExecutionTime`.
const STATUS_MANAGER: &str = "verno-cleanup";
/// Kyverno's label on what it manages (`--protect-managed-resources`).
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// How the cleanup controller runs.
#[derive(Debug, Clone, Copy)]
pub struct CleanupOptions {
    /// Objects per list page.
    pub page_size: u32,
    /// Sustained deletions per second and the burst after a quiet spell.
    pub deletes_per_second: f64,
    pub burst: f64,
    /// The longest one page's evaluation may take.
    pub deadline: Duration,
    /// Kyverno's `--protectManagedResources`: objects labelled `app.kubernetes.io/managed-by:
    /// kyverno` are never deleted.
    pub protect_managed: bool,
    /// Whether success events may be written (Kyverno's `--omitEvents` without PolicyApplied).
    pub applied_events: bool,
    /// Whether failure events may be written.
    pub error_events: bool,
}

impl Default for CleanupOptions {
    fn default() -> Self {
        CleanupOptions {
            page_size: 500,
            deletes_per_second: 100.0,
            burst: 200.0,
            deadline: Duration::from_secs(30),
            protect_managed: false,
            applied_events: false,
            error_events: true,
        }
    }
}

/// Attempts of a run that met errors before the schedule moves on.
const MAX_ATTEMPTS: u32 = 5;

/// (kind, namespace, name) of a cleanup policy.
type PolicyId = (Kind, Option<String>, String);

fn id_of(p: &CompiledPolicy) -> PolicyId {
    (p.kind, if p.kind.is_namespaced() { p.namespace.clone() } else { None }, p.name.clone())
}

/// What the controller keeps per policy.
struct Entry {
    uid: String,
    generation: i64,
    next: Option<DateTime<Utc>>,
    attempts: u32,
}

/// Runs the cleanup controller while this replica leads, until Verno stops: lists and deletes
/// act as the cleanup account; statuses and events are Verno's own.
pub async fn run(shared: Shared, opts: CleanupOptions) {
    let acting = shared.cleanup_client();
    let term = || async {
        let mut c = Controller {
            client: shared.client.clone(),
            acting: acting.clone(),
            server: shared.server.clone(),
            metrics: shared.metrics.clone(),
            opts,
            data: shared.data_as(&acting),
            pace: Pace::new(opts.deletes_per_second, opts.burst),
            discovery: DiscoveryCache::new(Duration::from_secs(30)),
            entries: HashMap::new(),
            events: shared.events(crate::events::CLEANUP_CONTROLLER),
        };
        c.lead(&mut shared.installed.clone()).await
    };
    shared.lead_while("cleanup controller", term, || {}).await;
}

struct Controller {
    /// Verno's account: the policies' status and events.
    client: kube::Client,
    /// The cleanup account: lists and deletes what policies select.
    acting: kube::Client,
    server: Arc<dyn Serving>,
    metrics: Metrics,
    opts: CleanupOptions,
    data: crate::cluster_data::ClusterData,
    pace: Pace,
    discovery: DiscoveryCache,
    entries: HashMap<PolicyId, Entry>,
    events: Events,
}

/// The outcome of one run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunCounts {
    pub listed: usize,
    pub deleted: usize,
    pub errors: usize,
    /// Objects that changed after they were listed and, judged again, were no longer due
    /// (or changed again while judged): kept.
    pub kept_changed: usize,
}

impl Controller {
    async fn lead(&mut self, installed: &mut watch::Receiver<u64>) {
        if installed.wait_for(|g| *g > 0).await.is_err() {
            return;
        }
        loop {
            installed.mark_unchanged();
            let set = self.server.current();
            self.refresh(&set).await;
            // Sleep until the earliest run is due or the set changes.
            let now = Utc::now();
            let due: Vec<PolicyId> =
                self.entries.iter().filter(|(_, e)| e.next.is_some_and(|t| t <= now)).map(|(k, _)| k.clone()).collect();
            for id in due {
                let Some(p) = set.policies().iter().find(|p| id_of(p) == id).cloned() else { continue };
                self.run_due(&set, &p).await;
            }
            let now = Utc::now();
            let wait = self
                .entries
                .values()
                .filter_map(|e| e.next)
                .min()
                .map(|t| (t - now).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(Duration::from_secs(3600))
                .max(Duration::from_millis(200));
            tokio::select! {
                r = installed.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Takes in the cleanup policies of `set`: new ones (or a new uid or generation) are
    /// scheduled from their stored `lastExecutionTime`; removed ones are forgotten.
    async fn refresh(&mut self, set: &PolicySet) {
        let mut present = HashSet::new();
        for p in set.policies().iter().filter(|p| p.cleanup().is_some()) {
            let id = id_of(p);
            present.insert(id.clone());
            let uid = p.document.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
            let generation = p.document.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            if self.entries.get(&id).is_some_and(|e| e.uid == uid && e.generation == generation) {
                continue;
            }
            let last = self.last_execution(p).await;
            let next = p.cleanup().and_then(|c| c.schedule.next_after(last));
            tracing::info!(policy = %p.name, kind = %p.kind, next = ?next, "cleanup policy scheduled");
            self.entries.insert(id, Entry { uid, generation, next, attempts: 0 });
        }
        self.entries.retain(|id, _| present.contains(id));
    }

    /// The policy's `status.lastExecutionTime` (read from the API server: the compiled set
    /// drops status), else its creation time.
    async fn last_execution(&self, p: &CompiledPolicy) -> DateTime<Utc> {
        let parse = |v: Option<&Value>| {
            v.and_then(Value::as_str).and_then(|s| DateTime::parse_from_rfc3339(s).ok()).map(|t| t.with_timezone(&Utc))
        };
        let api = self.policy_api(p);
        if let Ok(o) = api.get(&p.name).await
            && let Ok(v) = serde_json::to_value(&o)
            && let Some(t) = parse(v.pointer("/status/lastExecutionTime"))
        {
            return t;
        }
        parse(p.document.pointer("/metadata/creationTimestamp")).unwrap_or_else(Utc::now)
    }

    fn policy_api(&self, p: &CompiledPolicy) -> Api<DynamicObject> {
        let ar = crate::policies::resource(p.kind);
        match (&p.namespace, p.kind.is_namespaced()) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn run_due(&mut self, set: &Arc<PolicySet>, p: &Arc<CompiledPolicy>) {
        let started = Utc::now();
        let mut sink = Sink { metrics: &self.metrics, events: &mut self.events, opts: &self.opts };
        let counts = run_policy(
            &self.acting,
            set,
            p,
            &mut self.discovery,
            &self.data,
            &self.opts,
            Act::Delete { pace: &mut self.pace, sink: &mut sink },
        )
        .await;
        tracing::info!(policy = %p.name, kind = %p.kind, listed = counts.listed, deleted = counts.deleted, errors = counts.errors, "cleanup policy ran");
        let id = id_of(p);
        let Some(schedule) = p.cleanup().map(|c| c.schedule.clone()) else { return };
        let Some(e) = self.entries.get_mut(&id) else { return };
        if counts.errors > 0 && e.attempts + 1 < MAX_ATTEMPTS {
            e.attempts += 1;
            let backoff = Duration::from_secs((10u64 << (e.attempts - 1)).min(300));
            e.next = Some(Utc::now() + chrono::Duration::from_std(backoff).unwrap_or_default());
            return;
        }
        e.attempts = 0;
        let now = Utc::now();
        e.next = schedule.next_after(now.max(started));
        let body = json!({"apiVersion": p.document.get("apiVersion").cloned().unwrap_or(Value::Null), "kind": p.kind.name(),
            "status": {"lastExecutionTime": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}});
        let api = self.policy_api(p);
        if let Err(err) =
            api.patch_status(&p.name, &PatchParams::apply(STATUS_MANAGER).force(), &Patch::Apply(&body)).await
        {
            tracing::warn!(policy = %p.name, error = %err, "lastExecutionTime not written");
        }
    }
}

/// Where a run reports deletions: metrics and events.
pub(crate) struct Sink<'a> {
    pub(crate) metrics: &'a Metrics,
    pub(crate) events: &'a mut Events,
    pub(crate) opts: &'a CleanupOptions,
}

impl Sink<'_> {
    async fn deleted(&mut self, p: &CompiledPolicy, ar: &ApiResource, obj: &Value, err: Option<&str>) {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let deleting = matches!(p.kind, Kind::DeletingPolicy | Kind::NamespacedDeletingPolicy);
        let mut labels: Vec<(&'static str, String)> = vec![
            ("policy_type", p.kind.name().to_string()),
            ("policy_namespace", p.namespace.clone().filter(|_| p.kind.is_namespaced()).unwrap_or_default()),
            ("policy_name", p.name.clone()),
        ];
        if deleting {
            labels.push(("resource", ar.plural.clone()));
        } else {
            labels.push(("resource_kind", ar.kind.clone()));
        }
        labels.push(("resource_namespace", ns.clone()));
        if let Some(prop) = p.cleanup().and_then(|c| c.propagation) {
            labels.push(("deletion_propagation", prop.to_string()));
        }
        let counter = if deleting { CleanupCounter::Deleting } else { CleanupCounter::Cleanup };
        self.metrics.cleanup_counted(counter, err.is_none(), labels);
        if (err.is_none() && !self.opts.applied_events) || (err.is_some() && !self.opts.error_events) {
            return;
        }
        let verb = if deleting { "delete" } else { "clean up" };
        let (type_, reason, action, note) = match err {
            None => (
                EventType::Normal,
                "PolicyApplied",
                "Resource Cleaned Up",
                format!(
                    "successfully {} the target resource {}/{ns}/{name}",
                    if deleting { "deleted" } else { "cleaned up" },
                    ar.kind
                ),
            ),
            Some(e) => (
                EventType::Warning,
                "PolicyError",
                "None",
                format!("failed to {verb} the target resource {}/{ns}/{name}: {e}", ar.kind),
            ),
        };
        let doc = &p.document;
        let regarding = ObjectReference {
            api_version: doc.get("apiVersion").and_then(Value::as_str).map(str::to_string),
            kind: Some(p.kind.name().to_string()),
            name: Some(p.name.clone()),
            namespace: p.namespace.clone().filter(|_| p.kind.is_namespaced()),
            uid: doc.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string),
            ..Default::default()
        };
        let related = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            name: Some(name),
            namespace: Some(ns).filter(|n| !n.is_empty()),
            uid: obj.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string),
            ..Default::default()
        };
        let mut note = note;
        crate::events::truncate_note(&mut note);
        let ev =
            Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: Some(related) };
        self.events.publish(&ev, &regarding).await;
    }
}

/// The API resources a policy's candidates are listed from (deduplicated; cluster-scoped ones
/// dropped for a namespaced policy, as Kyverno skips them).
fn resources(d: &kube::Discovery, p: &CompiledPolicy) -> Vec<(ApiResource, bool)> {
    let Some(targets) = p.cleanup_targets() else { return Vec::new() };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for scope in &targets.scopes {
        // Subresources are not objects one deletes.
        if !scope.subresource.is_empty() && scope.subresource != "*" {
            continue;
        }
        for (ar, caps) in resolve(d, scope) {
            if !caps.supports_operation(kube::discovery::verbs::DELETE) {
                continue;
            }
            let namespaced = caps.scope == ApiScope::Namespaced;
            if p.kind.is_namespaced() && !namespaced {
                tracing::warn!(policy = %p.name, resource = %ar.plural, "a namespaced cleanup policy cannot select a cluster-scoped kind; skipped");
                continue;
            }
            if seen.insert((ar.group.clone(), ar.plural.clone())) {
                out.push((ar, namespaced));
            }
        }
    }
    out
}

/// What a run does with the objects that are due.
pub(crate) enum Act<'a, 'b> {
    /// Deletes them (paced), reporting to `sink`.
    Delete { pace: &'a mut Pace, sink: &'a mut Sink<'b> },
    /// Only collects them (`verno cleanup --dry-run`).
    Preview(&'a mut Found),
}

/// What a preview found.
#[derive(Debug, Default)]
pub struct Found {
    pub listed: usize,
    pub due: Vec<Value>,
    pub undecided: Vec<(Value, String)>,
}

/// Why `verno cleanup --dry-run` could not say what a policy would delete.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// Some candidates could not be listed (the reasons are logged).
    #[error("listing the candidates of {policy} failed (see the log)")]
    Listing { policy: String },
}

/// Why the objects carrying the TTL label could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum TtlListError {
    #[error("discovery: {0}")]
    Discovery(#[source] kube::Error),
    /// Listing one resource failed (other than by being forbidden or not served).
    #[error("listing {plural}: {source}")]
    List {
        plural: String,
        #[source]
        source: kube::Error,
    },
}

/// What `policy` would delete now in the cluster: the controller's run without deletions.
pub async fn preview(
    client: &kube::Client,
    set: &Arc<PolicySet>,
    p: &Arc<CompiledPolicy>,
) -> Result<Found, PreviewError> {
    let mut found = Found::default();
    let mut discovery = DiscoveryCache::new(Duration::from_secs(30));
    let data = crate::cluster_data::ClusterData::new(client.clone());
    let counts =
        run_policy(client, set, p, &mut discovery, &data, &CleanupOptions::default(), Act::Preview(&mut found)).await;
    found.listed = counts.listed;
    if counts.errors > found.undecided.len() {
        return Err(PreviewError::Listing { policy: p.name.clone() });
    }
    Ok(found)
}

/// Every object (metadata only) carrying the TTL label, over every listable resource, in
/// label-selected pages.
pub async fn ttl_labelled(client: &kube::Client) -> Result<Vec<Value>, TtlListError> {
    use kube::core::PartialObjectMeta;
    let d = kube::Discovery::new(client.clone()).run().await.map_err(TtlListError::Discovery)?;
    let mut out = Vec::new();
    for g in d.groups() {
        for (ar, caps) in g.recommended_resources() {
            if !caps.supports_operation(kube::discovery::verbs::LIST) || ar.plural.contains('/') {
                continue;
            }
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &ar);
            let mut lp = ListParams::default().limit(500).labels(verno_engine::ttl::TTL_LABEL);
            loop {
                let page = match api.list_metadata(&lp).await {
                    Ok(p) => p,
                    Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 || e.code == 405 => break,
                    Err(source) => return Err(TtlListError::List { plural: ar.plural.clone(), source }),
                };
                let token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
                for o in page.items {
                    let mut v = json!({"apiVersion": ar.api_version, "kind": ar.kind});
                    if let (Some(m), Ok(meta)) = (v.as_object_mut(), serde_json::to_value(&o.metadata)) {
                        m.insert("metadata".into(), meta);
                    }
                    out.push(v);
                }
                match token {
                    Some(t) => lp = lp.continue_token(&t),
                    None => break,
                }
            }
        }
    }
    Ok(out)
}

/// One run of one cleanup policy: list, evaluate, and delete (or collect) what is due.
pub(crate) async fn run_policy(
    client: &kube::Client,
    set: &Arc<PolicySet>,
    p: &Arc<CompiledPolicy>,
    discovery: &mut DiscoveryCache,
    data: &crate::cluster_data::ClusterData,
    opts: &CleanupOptions,
    mut act: Act<'_, '_>,
) -> RunCounts {
    let mut run = PolicyRun {
        client,
        set,
        p,
        data,
        opts,
        selector: p.cleanup_targets().and_then(|t| t.label_selector).filter(|s| !s.is_empty()),
        propagation: p.cleanup().and_then(|c| c.propagation),
        counts: RunCounts::default(),
    };
    let Some(d) = discovery.get(client, true, "using the last discovery").await else {
        run.counts.errors += 1;
        return run.counts;
    };
    for (ar, namespaced) in resources(&d, p) {
        run.resource(&ar, namespaced, &mut act).await;
    }
    run.counts
}

/// What one run of one cleanup policy works with, and what it counts.
struct PolicyRun<'a> {
    client: &'a kube::Client,
    set: &'a Arc<PolicySet>,
    p: &'a Arc<CompiledPolicy>,
    data: &'a crate::cluster_data::ClusterData,
    opts: &'a CleanupOptions,
    /// The label selector the policy's match pushes down to the API server's lists.
    selector: Option<String>,
    /// The policy's deletion propagation (Kyverno's default when `None`).
    propagation: Option<&'static str>,
    counts: RunCounts,
}

impl PolicyRun<'_> {
    /// Lists resource `ar`'s objects page by page (those the policy's label selector selects)
    /// and acts on the ones that are due.
    async fn resource(&mut self, ar: &ApiResource, namespaced: bool, act: &mut Act<'_, '_>) {
        let p = self.p;
        let api: Api<DynamicObject> = match (&p.namespace, p.kind.is_namespaced(), namespaced) {
            (Some(ns), true, _) => Api::namespaced_with(self.client.clone(), ns, ar),
            _ => Api::all_with(self.client.clone(), ar),
        };
        let mut lp = ListParams::default().limit(self.opts.page_size.max(1));
        if let Some(s) = &self.selector {
            lp = lp.labels(s);
        }
        let mut token: Option<String> = None;
        loop {
            let mut page_params = lp.clone();
            if let Some(t) = &token {
                page_params = page_params.continue_token(t);
            }
            let page = match api.list(&page_params).await {
                Ok(l) => l,
                Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 || e.code == 405 => {
                    tracing::info!(policy = %p.name, resource = %ar.plural, reason = %e.message, "skipping a resource the cleanup controller may not list");
                    break;
                }
                Err(e) => {
                    tracing::warn!(policy = %p.name, resource = %ar.plural, error = %e, "list failed");
                    self.counts.errors += 1;
                    break;
                }
            };
            token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
            let objects = self.candidates(page.items, ar);
            self.counts.listed += objects.len();
            let due = match due_objects(self.set, p, objects, self.data, self.opts.deadline).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(policy = %p.name, error = %e, "evaluation failed");
                    self.counts.errors += 1;
                    Vec::new()
                }
            };
            for (obj, verdict) in due {
                self.act_on(ar, namespaced, obj, verdict, act).await;
            }
            if token.is_none() {
                break;
            }
        }
    }

    /// A page's objects as the policy judges them: typed, not being deleted already, and (when
    /// protected) not managed by Kyverno.
    fn candidates(&self, items: Vec<DynamicObject>, ar: &ApiResource) -> Vec<Value> {
        items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .map(|mut v| {
                if let Some(m) = v.as_object_mut() {
                    m.insert("apiVersion".into(), json!(ar.api_version));
                    m.insert("kind".into(), json!(ar.kind));
                }
                v
            })
            .filter(|v| v.pointer("/metadata/deletionTimestamp").is_none())
            .filter(|v| {
                !(self.opts.protect_managed
                    && v.pointer(&format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1")))
                        .and_then(Value::as_str)
                        == Some("kyverno"))
            })
            .collect()
    }

    /// One judged object: collected (a preview), deleted (paced), or counted as undecided.
    async fn act_on(
        &mut self,
        ar: &ApiResource,
        namespaced: bool,
        obj: Value,
        verdict: Result<(), String>,
        act: &mut Act<'_, '_>,
    ) {
        if let Err(e) = verdict {
            tracing::debug!(policy = %self.p.name, error = %e, "object not evaluated");
            self.counts.errors += 1;
            if let Act::Preview(found) = act {
                found.undecided.push((obj, e));
            }
            return;
        }
        let (pace, sink) = match act {
            Act::Preview(found) => {
                found.due.push(obj);
                return;
            }
            Act::Delete { pace, sink } => (&mut **pace, &mut **sink),
        };
        pace.take().await;
        self.delete(ar, namespaced, &obj, sink).await;
    }

    /// Deletes a due object as it was listed and judged: one changed since (relabelled) is read
    /// again and judged again before it is deleted; one re-created under the same name is
    /// another object, left for the next run to judge.
    async fn delete(&mut self, ar: &ApiResource, namespaced: bool, obj: &Value, sink: &mut Sink<'_>) {
        let p = self.p;
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
        let target: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(self.client.clone(), ns, ar)
        } else {
            Api::all_with(self.client.clone(), ar)
        };
        let mut result = target.delete(name, &self.params(obj)).await.map(|_| ());
        if matches!(&result, Err(kube::Error::Api(e)) if e.code == 409) {
            let uid = |o: &Value| o.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string);
            result = match target.get_opt(name).await {
                Ok(Some(fresh)) if fresh.metadata.uid != uid(obj) => {
                    tracing::debug!(policy = %p.name, object = %name, "re-created since listed; kept");
                    self.counts.kept_changed += 1;
                    return;
                }
                Ok(Some(fresh)) => {
                    let mut fresh = serde_json::to_value(fresh).unwrap_or_default();
                    if let Some(m) = fresh.as_object_mut() {
                        m.insert("apiVersion".into(), json!(ar.api_version));
                        m.insert("kind".into(), json!(ar.kind));
                    }
                    let again = due_objects(self.set, p, vec![fresh.clone()], self.data, self.opts.deadline).await;
                    let still_due = matches!(again.as_deref(), Ok([(_, Ok(()))]))
                        && fresh.pointer("/metadata/deletionTimestamp").is_none();
                    if still_due {
                        target.delete(name, &self.params(&fresh)).await.map(|_| ())
                    } else {
                        tracing::debug!(policy = %p.name, object = %name, "changed since listed and no longer due; kept");
                        self.counts.kept_changed += 1;
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(()) => {
                self.counts.deleted += 1;
                sink.deleted(p, ar, obj, None).await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Changed again while judged: left for the next run.
                self.counts.kept_changed += 1;
            }
            Err(e) => {
                self.counts.errors += 1;
                let msg = match e {
                    kube::Error::Api(s) => s.message,
                    other => other.to_string(),
                };
                sink.deleted(p, ar, obj, Some(&msg)).await;
            }
        }
    }

    /// The delete options for `o`: the policy's propagation, and preconditions that hold only
    /// for `o` as read ([`unchanged`]).
    fn params(&self, o: &Value) -> DeleteParams {
        DeleteParams {
            propagation_policy: self.propagation.map(crate::runtime::propagation_of),
            preconditions: Some(unchanged(o)),
            ..DeleteParams::default()
        }
    }
}

/// Delete preconditions that hold only for this very object: its uid (not one re-created
/// under the same name) at this resourceVersion (not changed since it was read).
fn unchanged(o: &Value) -> kube::api::Preconditions {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).map(str::to_string);
    kube::api::Preconditions { uid: s("/metadata/uid"), resource_version: s("/metadata/resourceVersion") }
}

/// The objects of one page the policy says are due (`Ok`), or could not decide on (`Err`, the
/// rule's message as reported): one trip to the blocking pool per page, cancelled at `deadline`.
pub(crate) async fn due_objects(
    set: &Arc<PolicySet>,
    p: &Arc<CompiledPolicy>,
    objects: Vec<Value>,
    data: &crate::cluster_data::ClusterData,
    deadline: Duration,
) -> Result<Vec<(Value, Result<(), String>)>, EvaluationError> {
    let (set, data) = (set.clone(), data.clone());
    let id = (p.kind, p.namespace.clone(), p.name.clone());
    evaluate_blocking(deadline, move |env| {
        let scope = || Scope::cleanup(id.0, id.1.as_deref(), &id.2);
        let mut out = Vec::new();
        for obj in objects {
            let outcome =
                set.evaluate(&Request::new(verno_engine::Operation::Create, &obj), scope(), env, &data, &mut ());
            if outcome.cancelled {
                return Err(EvaluationError::Cancelled);
            }
            let verdict = outcome.responses.into_iter().flat_map(|(_, r)| r.rules).next();
            match verdict {
                Some(r) if r.status == Status::Pass => out.push((obj, Ok(()))),
                Some(r) if r.status == Status::Error => out.push((obj, Err(r.message))),
                _ => {}
            }
        }
        Ok(out)
    })
    .await?
}
