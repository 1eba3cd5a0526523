//! Background scans: the leader evaluates stored objects against the background-scanned
//! policies (the engine's [`Scope::BACKGROUND`]) and keeps their PolicyReports exact.
//!
//! How it differs from Kyverno's reports controller (docs/architecture.md, "In-cluster flow"),
//! whose failure modes users report:
//!
//! - **Watch-driven and incremental.** Only the kinds background policies match are watched,
//!   listed in pages (the watcher's 500). Per object Verno keeps a hash of what policies read
//!   (the object without `status` and bookkeeping metadata) and, per policy, a hash of the
//!   results in its report — never the object. An event whose hash is unchanged is not
//!   evaluated; a result set whose hashes are unchanged is not written. There are no
//!   intermediate report objects, and no periodic full rescan unless `rescan` is set.
//! - **Whole reports.** The scan results of a report are replaced whole on every write, so an
//!   exclusion, a kind change or a removed rule leaves no stale result (kyverno/kyverno#8519,
//!   #17368). Results of policies that are not background-scanned (admission results of
//!   `background: false` policies, written by [`crate::reports`]) are kept while their policy
//!   exists. Unchanged results keep their timestamp, so Policy Reporter sees no churn.
//! - **Policy changes touch only what they affect.** A changed, added or removed background
//!   policy re-lists the kinds it matches (before and after the change); an unchanged set
//!   writes nothing. A kind no policy matches any more loses its scan results. A policy or
//!   rule that disappears takes its results out of every report. (Exception changes re-list
//!   every watched kind: exceptions name policies loosely enough that a narrower rule would
//!   miss some.)
//! - **Nothing only in memory is needed for correctness.** A new leader lists the existing
//!   reports (in pages, metadata and results only kept as hashes), then the watched kinds:
//!   unchanged results are not rewritten, and reports of objects deleted while no leader ran
//!   are deleted once their kind's list has completed.
//!
//! Writes are paced by a token bucket; failed writes are retried with backoff on the next
//! event or the `retry` pass. Failed rules become PolicyViolation events from the
//! `kyverno-scan` reporting controller, as Kyverno's, but only when a result changes (Kyverno
//! repeats them on every hourly rescan).
//!
//! Scanned kinds: ClusterPolicy and Policy (validate rules), ValidatingPolicy, MutatingPolicy
//! (is the object already mutated?), and the admission policies labelled
//! `reports.kyverno.io/enabled` (ValidatingAdmissionPolicy; MutatingAdmissionPolicy with
//! `--mutating-admission-policy-reports`).
//!
//! Not yet: namespace label changes do not re-evaluate the namespace's objects (a
//! `namespaceSelector` result changes on the object's next update or a rescan);
//! ImageValidatingPolicies are not scanned.

use crate::metrics::Metrics;
use crate::runtime::{DiscoveryCache, Pace, Shared, Watches, evaluate_blocking, object_hash, resolve};
use crate::serving::Serving;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{ApiResource, Discovery, Scope as DiscoveryScope};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use verno_engine::report;
use verno_engine::{Kind, Notice, PolicySet, Request, ResourceRef, Scope};

/// How background scans run.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Objects per page when a kind is listed.
    pub page_size: u32,
    /// Sustained report writes per second, and the burst after a quiet spell.
    pub writes_per_second: f64,
    pub burst: f64,
    /// Every watched kind is listed and evaluated again this often (Kyverno's
    /// `--backgroundScanInterval`, there 1 h); `None`: only changes are evaluated.
    pub rescan: Option<Duration>,
    /// The longest one object's evaluation may take before it is cancelled.
    pub deadline: Duration,
    /// Write `openreports.io` Reports instead of `wgpolicyk8s.io` PolicyReports.
    pub openreports: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            page_size: 500,
            // Kyverno's reports controller allows its client 300 queries per second.
            writes_per_second: 300.0,
            burst: 300.0,
            rescan: None,
            deadline: Duration::from_secs(10),
            openreports: false,
        }
    }
}

/// Kinds a background scan never watches: reports (a report about a report would feed
/// itself) and Events.
fn never_scanned(ar: &ApiResource) -> bool {
    matches!(ar.group.as_str(), "wgpolicyk8s.io" | "reports.kyverno.io" | "openreports.io")
        || (ar.plural == "events" && matches!(ar.group.as_str(), "" | "events.k8s.io"))
}

/// A stable 64-bit hash (within one process: only compared with itself).
fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// The hash of a result's owner: its policy (report key), source and rule.
fn owner_of(r: &Value) -> u64 {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    owner_hash(s("policy"), s("source"), s("rule"))
}

fn owner_hash(policy: &str, source: &str, rule: &str) -> u64 {
    hash_of(&(policy, source, rule))
}

/// Per owner, a hash of its results without their timestamps; sorted by owner.
fn fingerprint(results: &[Value]) -> Vec<(u64, u64)> {
    let mut groups: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for r in results {
        let owner = owner_of(r);
        let mut r = r.clone();
        if let Some(m) = r.as_object_mut() {
            m.remove("timestamp");
        }
        groups.entry(owner).or_default().push(r.to_string());
    }
    groups
        .into_iter()
        .map(|(k, mut v)| {
            v.sort();
            (k, hash_of(&v))
        })
        .collect()
}

/// Which results belong to whom in the set in force, by owner hash (policy, source, rule).
#[derive(Default)]
struct Owners {
    /// Rules background scans evaluate: their results are the scan's.
    scanned: HashSet<u64>,
    /// Every rule of every policy in force (a result of anything else is stale).
    live: HashSet<u64>,
}

impl Owners {
    fn of(set: &PolicySet) -> Owners {
        let mut o = Owners::default();
        for p in set.policies() {
            let (policy, source) = (report::report_key(p), report::source(p.kind));
            // A CEL policy's results may carry no rule, or `exception`.
            o.live.insert(owner_hash(&policy, source, ""));
            if report::is_cel(p.kind) {
                let key = owner_hash(&policy, source, verno_engine::EXCEPTION_RULE);
                o.live.insert(key);
                if report::scanned_rule(p, verno_engine::EXCEPTION_RULE) {
                    o.scanned.insert(key);
                }
            }
            for r in &p.rules {
                let key = owner_hash(&policy, source, &r.name);
                o.live.insert(key);
                if report::scanned_rule(p, &r.name) {
                    o.scanned.insert(key);
                }
            }
        }
        o
    }

    /// Whether a stored result stays when the scan results are replaced: it is an admission
    /// result of a rule still in force that scans do not evaluate.
    fn keeps(&self, r: &Value) -> bool {
        let key = owner_of(r);
        !self.scanned.contains(&key) && self.live.contains(&key)
    }
}

/// What the leader keeps per object (or per report of an object not listed yet).
struct Tracked {
    /// Index into [`Scanner::kinds`]: the object's apiVersion and kind.
    kind: u32,
    namespace: Arc<str>,
    name: Arc<str>,
    /// Hash of the object as last evaluated; 0: to evaluate.
    object: u64,
    /// The list (of its kind) in which it was last seen.
    seen: u64,
    /// Whether its report exists, and per owner the hash of its results there.
    report: bool,
    results: Vec<(u64, u64)>,
    /// The results wait to be written (a write failed or was paced).
    pending: bool,
    /// Failed writes in a row, and when the next retry is due (doubling from
    /// [`RETRY_FIRST`] to [`RETRY_MAX`]): an unwritable report is retried by itself, ever more
    /// rarely, instead of its whole kind being listed again every few seconds.
    failures: u32,
    due: Option<Instant>,
}

/// The first retry of a failed report write, and the longest wait between retries.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(600);
/// Objects retried per pass (each a GET and an evaluation).
const RETRIES_PER_PASS: usize = 64;

/// The wait before the next retry after `failures` failed writes in a row.
fn retry_after(failures: u32) -> Duration {
    RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(10)).min(RETRY_MAX)
}

/// Why a report was not written (it is written again later).
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// Reading or writing the report failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// The report built is not an object the client can send.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// Other writers changed the report at each of five attempts.
    #[error("the report kept changing under five writes")]
    KeptChanging,
}

/// One watched kind.
#[derive(Clone)]
struct Watch {
    ar: ApiResource,
    namespaced: bool,
    /// The current list (`Init` … `InitDone`) number.
    list: u64,
}

type WatchEvent = (u32, u64, watcher::Event<DynamicObject>);

/// The leader's scanner state. Dropped when leadership is lost.
struct Scanner {
    client: kube::Client,
    server: Arc<dyn Serving>,
    metrics: Metrics,
    opts: ScanOptions,
    events: Option<mpsc::Sender<Notice>>,
    data: crate::cluster_data::ClusterData,
    /// (apiVersion, kind) interned; `Tracked::kind` indexes it.
    kinds: Vec<(String, String)>,
    kind_index: HashMap<(String, String), u32>,
    watches: Watches<u32, Watch, watcher::Event<DynamicObject>>,
    tracked: HashMap<String, Tracked>,
    /// Per background policy (owner hash): a hash of its document, and the kinds it matches.
    policies: HashMap<u64, (u64, HashSet<u32>)>,
    /// Hash of the exceptions in force.
    exceptions: u64,
    owners: Owners,
    pace: Pace,
    discovery: DiscoveryCache,
    set: Arc<PolicySet>,
}

/// Runs background scans while this replica leads, until Verno stops; reads as Verno's own
/// account; what becomes events goes to `events` (`kyverno-scan`).
pub async fn run(shared: Shared, opts: ScanOptions, events: Option<mpsc::Sender<Notice>>) {
    let term = || async {
        // Bounded: a watcher waits while the scanner works (each event holds a whole object).
        let (tx, rx) = mpsc::channel(64);
        let mut scanner = Scanner {
            client: shared.client.clone(),
            server: shared.server.clone(),
            metrics: shared.metrics.clone(),
            opts,
            events: events.clone(),
            data: shared.data_as(&shared.client),
            kinds: Vec::new(),
            kind_index: HashMap::new(),
            watches: Watches::new(tx, "background scan"),
            tracked: HashMap::new(),
            policies: HashMap::new(),
            exceptions: 0,
            owners: Owners::default(),
            pace: Pace::new(opts.writes_per_second, opts.burst),
            discovery: DiscoveryCache::new(Duration::from_secs(30)),
            set: Arc::new(PolicySet::default()),
        };
        scanner.lead(rx, &mut shared.installed.clone()).await
    };
    shared.lead_while("background scans", term, || shared.metrics.set_scan_backlog(0)).await;
}

impl Scanner {
    fn kind_id(&mut self, api_version: &str, kind: &str) -> u32 {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(&i) = self.kind_index.get(&key) {
            return i;
        }
        let i = u32::try_from(self.kinds.len()).unwrap_or(u32::MAX);
        self.kinds.push(key.clone());
        self.kind_index.insert(key, i);
        i
    }

    async fn lead(&mut self, mut rx: mpsc::Receiver<WatchEvent>, installed: &mut watch::Receiver<u64>) {
        // Wait for a set: the policy loop installs one once its caches have synced.
        if installed.wait_for(|g| *g > 0).await.is_err() {
            return;
        }
        installed.mark_unchanged();
        self.set = self.server.current();
        self.owners = Owners::of(&self.set);
        // What the previous leader wrote.
        while let Err(e) = self.load_reports().await {
            tracing::warn!(error = %e, "listing the existing reports failed (retrying)");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        self.reconcile_policies(true).await;
        let mut retry = tokio::time::interval(Duration::from_secs(5));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let rescan = self.opts.rescan;
        let mut last_rescan = Instant::now();
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some((kind, generation, ev)) => self.on_event(kind, generation, ev).await,
                    None => return,
                },
                r = installed.changed() => {
                    if r.is_err() { return }
                    self.set = self.server.current();
                    self.reconcile_policies(false).await;
                }
                _ = retry.tick() => {
                    self.retry_pending().await;
                    if let Some(every) = rescan && last_rescan.elapsed() >= every {
                        last_rescan = Instant::now();
                        let all: Vec<u32> = self.watches.ids().collect();
                        self.relist(&all);
                    }
                }
            }
        }
    }

    /// One page of the reports Verno (or Kyverno) manages — namespaced ones first, then
    /// cluster-scoped — from `at` (`None`: the start); also where the next page starts.
    async fn report_page(
        &self,
        at: Option<(bool, String)>,
    ) -> Result<(Vec<Value>, Option<(bool, String)>), kube::Error> {
        let (cluster, token) = at.unwrap_or((false, String::new()));
        let api = crate::reports::all_reports(&self.client, cluster, self.opts.openreports);
        let mut lp = ListParams::default().labels("app.kubernetes.io/managed-by=kyverno").limit(self.opts.page_size);
        if !token.is_empty() {
            lp = lp.continue_token(&token);
        }
        let page = api.list(&lp).await?;
        let items = page.items.iter().filter_map(|r| serde_json::to_value(r).ok()).collect();
        let next = match page.metadata.continue_ {
            Some(c) if !c.is_empty() => Some((cluster, c)),
            _ if !cluster => Some((true, String::new())),
            _ => None,
        };
        Ok((items, next))
    }

    /// Lists every report Verno (or Kyverno) manages, in pages, into the tracked state.
    async fn load_reports(&mut self) -> Result<(), kube::Error> {
        self.tracked.clear();
        let mut at = None;
        loop {
            let (items, next) = self.report_page(at).await?;
            for v in &items {
                self.track_report(v);
            }
            let Some(n) = next else { break };
            at = Some(n);
        }
        tracing::info!(reports = self.tracked.len(), "existing reports read");
        Ok(())
    }

    fn track_report(&mut self, v: &Value) {
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
        let uid = s("/metadata/name");
        if uid.is_empty() || s("/scope/uid") != uid {
            return;
        }
        let results: Vec<Value> = v.get("results").and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(t) = self.tracked.get_mut(uid) {
            t.report = true;
            t.results = fingerprint(&results);
            return;
        }
        let kind = self.kind_id(s("/scope/apiVersion"), s("/scope/kind"));
        self.tracked.insert(
            uid.to_string(),
            Tracked {
                kind,
                namespace: Arc::from(s("/metadata/namespace")),
                name: Arc::from(s("/scope/name")),
                object: 0,
                seen: 0,
                report: true,
                results: fingerprint(&results),
                pending: false,
                failures: 0,
                due: None,
            },
        );
    }

    async fn discovery(&mut self, fresh: bool) -> Option<Arc<Discovery>> {
        self.discovery.get(&self.client, fresh, "background scans keep the kinds they watch").await
    }

    /// The kinds (apiVersion, kind → resource) each background policy matches.
    async fn policy_kinds(&mut self) -> Option<HashMap<u64, (u64, Vec<(ApiResource, bool)>)>> {
        let unknown =
            self.set.policies().iter().any(|p| p.in_background_scan() && !self.policies.contains_key(&key_of(p)));
        let discovery = self.discovery(unknown).await?;
        let mut out = HashMap::new();
        for p in self.set.policies().iter().filter(|p| p.in_background_scan()) {
            let mut kinds: Vec<(ApiResource, bool)> = Vec::new();
            for r in &p.rules {
                for scope in r.matcher.webhook_scope() {
                    if !scope.subresource.is_empty() {
                        continue;
                    }
                    for (ar, caps) in resolve(&discovery, &scope) {
                        if !kinds.iter().any(|(k, _)| k.api_version == ar.api_version && k.kind == ar.kind) {
                            kinds.push((ar, caps.scope == DiscoveryScope::Namespaced));
                        }
                    }
                }
            }
            // An admission policy's binding is compiled into it (its matchResources, paramRef,
            // validationActions and name in the results) without being its document: a binding
            // that arrives or changes after its policy changes the results too.
            let mut fingerprint = p.document.to_string();
            if matches!(p.kind, Kind::ValidatingAdmissionPolicy | Kind::MutatingAdmissionPolicy) {
                fingerprint.push_str(&format!("{:?}{:?}", p.action, p.rules));
            }
            out.insert(key_of(p), (hash_of(&fingerprint), kinds));
        }
        Some(out)
    }

    /// Brings the watched kinds in step with the set in force: starts and stops watches,
    /// re-lists the kinds whose policies changed, strips results nobody owns any more.
    async fn reconcile_policies(&mut self, first: bool) {
        let Some(wanted) = self.policy_kinds().await else { return };
        let previous_owners = std::mem::replace(&mut self.owners, Owners::of(&self.set));
        // The compiled exceptions as a whole (their debug form covers every field).
        let exceptions = hash_of(&self.set.exceptions().iter().map(|e| format!("{e:?}")).collect::<Vec<_>>());
        let exceptions_changed = exceptions != self.exceptions;
        self.exceptions = exceptions;
        let mut policies: HashMap<u64, (u64, HashSet<u32>)> = HashMap::new();
        let mut resources: HashMap<u32, (ApiResource, bool)> = HashMap::new();
        for (key, (doc, kinds)) in wanted {
            let mut ids = HashSet::new();
            for (ar, namespaced) in kinds {
                if never_scanned(&ar) {
                    continue;
                }
                let id = self.kind_id(&ar.api_version, &ar.kind);
                ids.insert(id);
                resources.insert(id, (ar, namespaced));
            }
            policies.insert(key, (doc, ids));
        }
        // Kinds whose results may differ: those of changed, added and removed policies.
        let mut affected: HashSet<u32> = HashSet::new();
        for (key, (doc, ids)) in &policies {
            match self.policies.get(key) {
                Some((old_doc, old_ids)) if old_doc == doc => {
                    if old_ids != ids {
                        affected.extend(ids.iter().copied());
                    }
                }
                Some((_, old_ids)) => {
                    affected.extend(old_ids.iter().copied());
                    affected.extend(ids.iter().copied());
                }
                None => affected.extend(ids.iter().copied()),
            }
        }
        for (key, (_, old_ids)) in &self.policies {
            if !policies.contains_key(key) {
                affected.extend(old_ids.iter().copied());
            }
        }
        self.policies = policies;
        // Stop what no policy matches any more; start what is new.
        let gone: Vec<u32> = self.watches.ids().filter(|k| !resources.contains_key(k)).collect();
        for k in gone {
            if let Some(w) = self.watches.stop(&k) {
                tracing::info!(kind = %w.ar.kind, "no background policy matches this kind any more: not watched");
            }
        }
        let mut relist: Vec<u32> = Vec::new();
        for (id, (ar, namespaced)) in resources {
            match self.watches.get(&id) {
                Some(_) if exceptions_changed || affected.contains(&id) => relist.push(id),
                Some(_) => {}
                None => {
                    self.start_watch(id, ar, namespaced);
                }
            }
        }
        if !first {
            self.relist(&relist);
        }
        // Results of policies (or rules) gone, and scan results of kinds no longer watched.
        let ids: Vec<String> = self
            .tracked
            .iter()
            .filter(|(_, t)| {
                t.report
                    && (t.results.iter().any(|(k, _)| !self.owners.live.contains(k))
                        || (!self.watches.contains(&t.kind)
                            && t.results.iter().any(|(k, _)| self.owners.scanned.contains(k))))
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in ids {
            self.rewrite_without_scan_or_stale(&uid).await;
        }
        // A rule went away: its results go from every report, also those the admission writer
        // wrote since the leader last read them.
        if !first
            && previous_owners.live.iter().any(|k| !self.owners.live.contains(k))
            && let Err(e) = self.sweep_reports().await
        {
            tracing::warn!(error = %e, "reports not swept of deleted rules' results (next policy change retries)");
        }
    }

    /// Lists every report (in pages) and rewrites those holding results of rules gone.
    async fn sweep_reports(&mut self) -> Result<(), kube::Error> {
        let mut at = None;
        loop {
            let (items, next) = self.report_page(at).await?;
            let mut stale = Vec::new();
            for v in &items {
                let dead = v
                    .get("results")
                    .and_then(Value::as_array)
                    .is_some_and(|rs| rs.iter().any(|x| !self.owners.live.contains(&owner_of(x))));
                if dead {
                    self.track_report(v);
                    stale.push(v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string());
                }
            }
            for uid in stale {
                self.rewrite_without_scan_or_stale(&uid).await;
            }
            let Some(n) = next else { break };
            at = Some(n);
        }
        Ok(())
    }

    fn start_watch(&mut self, id: u32, ar: ApiResource, namespaced: bool) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let cfg = watcher::Config::default().page_size(self.opts.page_size);
        tracing::info!(kind = %ar.kind, api_version = %ar.api_version, "background scans watch this kind");
        self.watches.start(id, Watch { ar, namespaced, list: 0 }, watcher(api, cfg).default_backoff());
    }

    /// Lists these kinds again and evaluates every object of them.
    fn relist(&mut self, ids: &[u32]) {
        for id in ids {
            for t in self.tracked.values_mut().filter(|t| t.kind == *id) {
                t.object = 0;
            }
            if let Some(w) = self.watches.get(id) {
                let (ar, namespaced) = (w.ar.clone(), w.namespaced);
                self.start_watch(*id, ar, namespaced);
            }
        }
    }

    async fn on_event(&mut self, kind: u32, generation: u64, ev: watcher::Event<DynamicObject>) {
        let Some(w) = self.watches.current(kind, generation) else { return };
        match ev {
            watcher::Event::Init => {
                w.list += 1;
            }
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let list = w.list;
                self.on_object(kind, list, o).await;
            }
            watcher::Event::InitDone => {
                let list = w.list;
                // Objects of this kind the list did not return are gone: so are their reports.
                let gone: Vec<String> = self
                    .tracked
                    .iter()
                    .filter(|(_, t)| t.kind == kind && t.seen != list)
                    .map(|(u, _)| u.clone())
                    .collect();
                for uid in gone {
                    self.forget(&uid).await;
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(uid) = o.metadata.uid.as_deref() {
                    // The report is owned by the object: the garbage collector removes it. It is
                    // deleted here too, so a cluster whose collector lags keeps no orphans.
                    self.forget(uid).await;
                }
            }
        }
    }

    /// An object is gone: its report goes too.
    async fn forget(&mut self, uid: &str) {
        let Some(t) = self.tracked.remove(uid) else { return };
        if t.report {
            self.pace.take().await;
            let api = crate::reports::report_api(&self.client, &t.namespace, self.opts.openreports);
            match api.delete(uid, &DeleteParams::default()).await {
                Ok(_) => {
                    self.metrics.report_written(0);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => tracing::debug!(error = %e, uid, "report of a deleted object not deleted"),
            }
        }
    }

    async fn on_object(&mut self, kind: u32, list: u64, o: DynamicObject) {
        let Some(uid) = o.metadata.uid.clone() else { return };
        let mut value = match serde_json::to_value(&o) {
            Ok(v) => v,
            Err(_) => return,
        };
        drop(o);
        // A real API server's list items come without their type (the fake's carried it, so
        // scans on a real cluster matched nothing): put it back from the watched kind.
        if let (Some(m), Some((api_version, kind_name))) = (value.as_object_mut(), self.kinds.get(kind as usize)) {
            m.entry("apiVersion").or_insert_with(|| Value::String(api_version.clone()));
            m.entry("kind").or_insert_with(|| Value::String(kind_name.clone()));
        }
        let hash = object_hash(&value);
        if let Some(t) = self.tracked.get_mut(&uid) {
            t.seen = list;
            t.kind = kind;
            if t.object == hash && !t.pending {
                return;
            }
        }
        let (api_version, kind_name) = self.kinds.get(kind as usize).cloned().unwrap_or_default();
        let resource = ResourceRef {
            api_version,
            kind: kind_name,
            namespace: value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string(),
            name: value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string(),
            uid: uid.clone(),
        };
        let Some(scan) = self.evaluate(value, &resource).await else { return };
        let t = self.tracked.entry(uid.clone()).or_insert_with(|| Tracked {
            kind,
            namespace: Arc::from(resource.namespace.as_str()),
            name: Arc::from(resource.name.as_str()),
            object: 0,
            seen: list,
            report: false,
            results: Vec::new(),
            pending: false,
            failures: 0,
            due: None,
        });
        t.object = hash;
        t.seen = list;
        let new = fingerprint(&scan.results);
        let owners = &self.owners;
        let old: Vec<(u64, u64)> = t.results.iter().filter(|(k, _)| owners.scanned.contains(k)).copied().collect();
        let stale = t.results.iter().any(|(k, _)| !owners.live.contains(k));
        if new == old && !stale && !t.pending {
            return;
        }
        // Events for the policies whose results changed.
        let changed: HashSet<u64> = new.iter().filter(|e| !old.contains(e)).map(|(k, _)| *k).collect();
        self.send_events(&scan.notices, &scan.results, &changed);
        let was_pending = self.tracked.get(&uid).is_some_and(|t| t.pending);
        let pending = match self.write(&resource, scan.results).await {
            Ok(results) => {
                if let Some(t) = self.tracked.get_mut(&uid) {
                    t.report = !results.is_empty();
                    t.results = results;
                    t.pending = false;
                    t.failures = 0;
                    t.due = None;
                }
                false
            }
            Err(e) => {
                self.metrics.report_write_failed();
                if let Some(t) = self.tracked.get_mut(&uid) {
                    t.pending = true;
                    t.object = 0;
                    t.failures = t.failures.saturating_add(1);
                    let wait = retry_after(t.failures);
                    t.due = Some(Instant::now() + wait);
                    tracing::warn!(error = %e, uid, retry_in_s = wait.as_secs(), "report not written (retrying)");
                }
                true
            }
        };
        // Counted again only when it moves (a count walks every tracked object).
        if pending != was_pending {
            self.update_backlog();
        }
    }

    fn update_backlog(&self) {
        let n = self.tracked.values().filter(|t| t.pending).count();
        self.metrics.set_scan_backlog(n);
    }

    /// Sends the events of the rules whose results changed (`changed`: owner hashes; a policy's
    /// success event goes when any of its results changed).
    fn send_events(&self, notices: &[Notice], results: &[Value], changed: &HashSet<u64>) {
        let Some(tx) = &self.events else { return };
        let policies: HashSet<u64> = results
            .iter()
            .filter(|r| changed.contains(&owner_of(r)))
            .map(|r| {
                let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
                owner_hash(s("policy"), s("source"), "")
            })
            .collect();
        let key = |kind: verno_engine::Kind, name: &str, namespace: &Option<String>| match namespace {
            Some(ns) if kind.is_namespaced() => format!("{ns}/{name}"),
            _ => name.to_string(),
        };
        for n in notices {
            let due = match n {
                Notice::Violation(v) => changed.contains(&owner_hash(
                    &key(v.policy_kind, &v.policy_name, &v.policy_namespace),
                    report::source(v.policy_kind),
                    &v.rule,
                )),
                Notice::Applied(a) => policies.contains(&owner_hash(
                    &key(a.policy_kind, &a.policy_name, &a.policy_namespace),
                    report::source(a.policy_kind),
                    "",
                )),
            };
            if due && tx.try_send(n.clone()).is_err() {
                self.metrics.event_dropped();
            }
        }
    }

    /// Evaluates one object through the engine's front door, off the async threads (context
    /// entries may read the cluster).
    async fn evaluate(&self, object: Value, resource: &ResourceRef) -> Option<Scanned> {
        let set = self.set.clone();
        let data = self.data.clone();
        let server = self.server.clone();
        let about = resource.clone();
        let out = evaluate_blocking(self.opts.deadline, move |env| {
            let req = Request::new(verno_engine::Operation::Create, &object);
            let outcome = set.evaluate(&req, Scope::BACKGROUND, env, &data, &mut ());
            if outcome.cancelled {
                return None;
            }
            server.scan_results(&about.kind, &about.namespace, &set, &outcome.responses);
            let mut results = Vec::new();
            for (i, r) in &outcome.responses {
                if let Some(p) = set.policies().get(*i) {
                    results.extend(report::results(p, r));
                }
            }
            let mut notices: Vec<Notice> =
                outcome.violations_of(&set, &about).into_iter().map(Notice::Violation).collect();
            notices.extend(outcome.applied_of(&set, &about).into_iter().map(Notice::Applied));
            Some(Scanned { results, notices })
        })
        .await;
        match out {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                tracing::warn!(kind = %resource.kind, name = %resource.name, "a background scan evaluation was cancelled at its deadline");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "a background scan evaluation panicked");
                None
            }
        }
    }

    /// Writes the report of `resource` with these scan results (and the admission results it
    /// keeps); returns the fingerprint of what the report now holds.
    async fn write(&mut self, resource: &ResourceRef, scan: Vec<Value>) -> Result<Vec<(u64, u64)>, WriteError> {
        let api = crate::reports::report_api(&self.client, &resource.namespace, self.opts.openreports);
        // A report the leader knows to be absent (it listed them all, and it writes them) is
        // created without reading it first; a conflict reads it.
        let mut absent = self.tracked.get(&resource.uid).is_some_and(|t| !t.report && !t.pending);
        for _ in 0..5 {
            let stored = if std::mem::take(&mut absent) { None } else { api.get_opt(&resource.uid).await? };
            let stored = stored.map(|s| serde_json::to_value(s).unwrap_or(Value::Null));
            let stored_results: Vec<Value> =
                stored.as_ref().and_then(|s| s.get("results")).and_then(Value::as_array).cloned().unwrap_or_default();
            let now = chrono::Utc::now().timestamp();
            let mut results: Vec<Value> = stored_results.iter().filter(|r| self.owners.keeps(r)).cloned().collect();
            results.extend(scan.iter().cloned().map(|mut r| {
                // An unchanged result keeps its timestamp.
                let same = stored_results.iter().find(|s| same_result(s, &r));
                let ts = same.and_then(|s| s.get("timestamp").cloned()).unwrap_or(json!({"seconds": now, "nanos": 0}));
                if let Some(m) = r.as_object_mut() {
                    m.insert("timestamp".into(), ts);
                }
                r
            }));
            let fp = fingerprint(&results);
            if stored.is_some() && fp == fingerprint(&stored_results) && results.len() == stored_results.len() {
                return Ok(fp);
            }
            self.pace.take().await;
            let outcome = match (report::document(resource, results), &stored) {
                (None, None) => return Ok(Vec::new()),
                (None, Some(_)) => api.delete(&resource.uid, &DeleteParams::default()).await.map(|_| 0),
                (Some(mut doc), stored) => {
                    if self.opts.openreports {
                        report::to_openreports(&mut doc);
                    }
                    if let (Some(rv), Some(m)) = (
                        stored.as_ref().and_then(|s| s.pointer("/metadata/resourceVersion")).cloned(),
                        doc.get_mut("metadata").and_then(Value::as_object_mut),
                    ) {
                        m.insert("resourceVersion".into(), rv);
                    }
                    let bytes = doc.to_string().len() as u64;
                    let obj: DynamicObject = serde_json::from_value(doc)?;
                    if stored.is_some() {
                        api.replace(&resource.uid, &PostParams::default(), &obj).await.map(|_| bytes)
                    } else {
                        api.create(&PostParams::default(), &obj).await.map(|_| bytes)
                    }
                }
            };
            match outcome {
                Ok(bytes) => {
                    self.metrics.report_written(bytes);
                    return Ok(fp);
                }
                // Another writer (an admission writer) got there first: read again.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(WriteError::KeptChanging)
    }

    /// Rewrites a report without results nobody owns (policies or rules gone), and without scan
    /// results when its object's kind is not watched any more.
    async fn rewrite_without_scan_or_stale(&mut self, uid: &str) {
        let Some(t) = self.tracked.get(uid) else { return };
        let (api_version, kind) = self.kinds.get(t.kind as usize).cloned().unwrap_or_default();
        let resource = ResourceRef {
            api_version,
            kind,
            namespace: t.namespace.to_string(),
            name: t.name.to_string(),
            uid: uid.to_string(),
        };
        let watched = self.watches.contains(&t.kind);
        let api = crate::reports::report_api(&self.client, &resource.namespace, self.opts.openreports);
        let stored = match api.get_opt(uid).await {
            Ok(Some(s)) => serde_json::to_value(s).unwrap_or(Value::Null),
            Ok(None) => {
                if let Some(t) = self.tracked.get_mut(uid) {
                    t.report = false;
                    t.results.clear();
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, uid, "report not read");
                return;
            }
        };
        let scan: Vec<Value> = if watched {
            stored
                .get("results")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|r| self.owners.scanned.contains(&owner_of(r)))
                .cloned()
                .map(|mut r| {
                    if let Some(m) = r.as_object_mut() {
                        m.remove("timestamp");
                    }
                    r
                })
                .collect()
        } else {
            Vec::new()
        };
        match self.write(&resource, scan).await {
            Ok(fp) => {
                if let Some(t) = self.tracked.get_mut(uid) {
                    t.report = !fp.is_empty();
                    t.results = fp;
                }
            }
            Err(e) => tracing::debug!(error = %e, uid, "stale results not removed yet"),
        }
    }

    /// Objects whose write failed are evaluated again on their own next event or here, once
    /// their retry is due: each is read again by itself (at most [`RETRIES_PER_PASS`] a pass),
    /// so one unwritable report costs one GET and one evaluation per retry, not a list of its
    /// kind.
    async fn retry_pending(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, u32, Arc<str>, Arc<str>)> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.pending && t.due.is_none_or(|d| d <= now))
            .take(RETRIES_PER_PASS)
            .map(|(uid, t)| (uid.clone(), t.kind, t.namespace.clone(), t.name.clone()))
            .collect();
        for (uid, kind, namespace, name) in due {
            let Some(w) = self.watches.get(&kind) else { continue };
            let (ar, list) = (w.ar.clone(), w.list);
            let api: Api<DynamicObject> = if w.namespaced {
                Api::namespaced_with(self.client.clone(), &namespace, &ar)
            } else {
                Api::all_with(self.client.clone(), &ar)
            };
            match api.get_opt(&name).await {
                Ok(Some(o)) if o.metadata.uid.as_deref() == Some(uid.as_str()) => self.on_object(kind, list, o).await,
                // Gone (or replaced by another object of that name): its watch says so.
                Ok(_) => {
                    if let Some(t) = self.tracked.get_mut(&uid) {
                        t.due = Some(now + RETRY_MAX);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, uid, "re-reading an object whose report was not written");
                    if let Some(t) = self.tracked.get_mut(&uid) {
                        t.due = Some(now + retry_after(t.failures.saturating_add(1)));
                    }
                }
            }
        }
    }
}

fn key_of(p: &verno_engine::CompiledPolicy) -> u64 {
    owner_hash(&report::report_key(p), report::source(p.kind), "")
}

/// The same result but for its timestamp.
fn same_result(a: &Value, b: &Value) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(x), Some(y)) => {
            x.iter().filter(|(k, _)| *k != "timestamp").count() == y.iter().filter(|(k, _)| *k != "timestamp").count()
                && x.iter().filter(|(k, _)| *k != "timestamp").all(|(k, v)| y.get(k) == Some(v))
        }
        _ => false,
    }
}

struct Scanned {
    /// Report results (no timestamps).
    results: Vec<Value>,
    /// What becomes events (the engine marks nothing a scan finds as blocking).
    notices: Vec<Notice>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_unwritable_report_is_retried_ever_more_rarely() {
        let waits: Vec<u64> = (1..=12).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 600, 600, 600, 600, 600]);
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn the_object_hash_ignores_status_and_bookkeeping() {
        let a = json!({"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "1", "labels": {"a": "b"}}, "spec": {"x": 1}, "status": {"phase": "Pending"}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("2");
        b["status"]["phase"] = json!("Running");
        b["metadata"]["managedFields"] = json!([{"manager": "kubelet"}]);
        assert_eq!(object_hash(&a), object_hash(&b));
        b["metadata"]["labels"]["a"] = json!("c");
        assert_ne!(object_hash(&a), object_hash(&b));
        let mut c = a.clone();
        c["spec"]["x"] = json!(2);
        assert_ne!(object_hash(&a), object_hash(&c));
    }

    #[test]
    fn fingerprints_ignore_timestamps_and_order() {
        let r = |policy: &str, rule: &str, result: &str, ts: i64| json!({"source": "kyverno", "policy": policy, "rule": rule, "result": result, "timestamp": {"seconds": ts, "nanos": 0}});
        let a = vec![r("p", "a", "pass", 1), r("p", "b", "fail", 1), r("q", "a", "pass", 1)];
        let b = vec![r("q", "a", "pass", 9), r("p", "b", "fail", 9), r("p", "a", "pass", 9)];
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = vec![r("q", "a", "pass", 9), r("p", "b", "pass", 9), r("p", "a", "pass", 9)];
        let (fa, fc) = (fingerprint(&a), fingerprint(&c));
        assert_eq!(fa.len(), 3);
        // Only the results of p's rule b changed.
        assert_eq!(fa.iter().filter(|e| !fc.contains(e)).count(), 1);
    }

    #[test]
    fn reports_and_events_are_never_scanned() {
        let ar = |group: &str, plural: &str| ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: "x".into(),
            kind: "K".into(),
            plural: plural.into(),
        };
        assert!(never_scanned(&ar("wgpolicyk8s.io", "policyreports")));
        assert!(never_scanned(&ar("", "events")));
        assert!(!never_scanned(&ar("", "pods")));
    }
}
