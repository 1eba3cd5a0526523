//! The background controller: generate rules (ClusterPolicy/Policy `data`, `clone`,
//! `cloneList`, `foreach`; GeneratingPolicy) and mutate-existing rules (ClusterPolicy `targets`,
//! MutatingPolicy `mutateExisting`) applied in the cluster by the leader.
//!
//! How it differs from Kyverno's UpdateRequest pipeline (docs/architecture.md, "In-cluster flow"),
//! whose failure modes users report:
//!
//! - **Level-based, no UpdateRequests.** Nothing is persisted as a work item. The leader
//!   watches the kinds the policies' rules match (the triggers, listed in pages), the objects
//!   it generated (label-selected: `generate.kyverno.io/policy-name`) and the namespaces its
//!   clone sources live in. For each trigger it recomputes through the engine's front door
//!   ([`Scope::APPLY`]) what should exist, compares with what does, and writes only the
//!   difference. A restart or a leader change re-lists and converges; a 1,000-namespace
//!   fan-out interrupted half-way is finished by the next leader, each object exactly once
//!   (creates are by name; an existing one is compared, not created again).
//! - **Bounded.** One in-memory queue of trigger keys (deduplicated), a bounded channel from
//!   the watchers, retries with exponential backoff (1 s → 5 min, at most 10 attempts per
//!   change), writes paced by a token bucket.
//! - **Deletes are narrow.** A downstream is deleted only for its own (policy, rule,
//!   trigger uid): a trigger deleted, a trigger that no longer matches (its conditions or
//!   labels changed — never its operation, so a no-op update deletes nothing), a synchronized
//!   rule or policy removed (unless `orphanDownstreamOnPolicyDelete`), or a clone source gone
//!   (only that source's copies, also for `cloneList`). Nothing is deleted while the watch of
//!   the downstream kind has not finished its first list.
//!
//! When a trigger is acted on, as Kyverno: a trigger admitted while the policy is in force
//! (created or changed after the policy: a watch event, or a creation timestamp not older
//! than the policy's), every existing trigger with `generateExisting` (and, for mutate-
//! existing, `mutateExistingOnPolicyUpdate`; a MutatingPolicy with `mutateExisting` always, as
//! Kyverno queues the whole policy when it is created or changed), and with `synchronize`
//! every trigger that already has downstream objects (so a policy edit reaches them). A
//! synchronized rule whose downstream name is taken by an object no policy generated
//! overwrites it (Kyverno's documented behaviour); without `synchronize` it is left alone.
//!
//! Not yet: downstream kinds this leader has not generated yet are not looked at when a
//! policy is deleted; no failure state beyond logs, metrics and `PolicyError` events (Kyverno
//! keeps it in UpdateRequest status); no PolicyReport results for generate and
//! mutate-existing rules.
//!
//! Its own writes trigger nothing: a watch event of exactly the version this controller wrote
//! is not acted on (Kyverno's rules skip its background controller's requests,
//! `skipBackgroundRequests`, default true; a rule that sets it to false makes them triggers
//! again), and no object is written more than ten times a minute (a `PolicyError` says so), so
//! policies that feed on their own output cannot loop.
//!
//! Sources are followed: clone/cloneList sources and whatever a GeneratingPolicy read with
//! `resource.Get`/`resource.List` are watched, and a change re-evaluates the triggers that
//! read them.
//!
//! Rules that list `DELETE` run on a trigger's deletion with the deleted object (Kyverno's
//! `request.oldObject`); their downstream is not deleted with the trigger.

use crate::metrics::Metrics;
use crate::runtime::{
    DiscoveryCache, EvaluationError, Events, Pace, Shared, Watches, evaluate_blocking, object_hash, resolve,
};
use crate::serving::Serving;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, Discovery, Scope as DiscoveryScope};
use kube::runtime::events::Event;
use kube::runtime::watcher;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use verno_engine::{Kind, PolicySet, Request, RuleType, Scope, Status};

/// How the background controller runs.
#[derive(Debug, Clone, Copy)]
pub struct BackgroundOptions {
    pub page_size: u32,
    /// Sustained writes per second and the burst after a quiet spell.
    pub writes_per_second: f64,
    pub burst: f64,
    /// The longest one trigger's evaluation may take.
    pub deadline: Duration,
    /// Attempts per trigger change before it is given up (logged and counted).
    pub max_attempts: u32,
}

impl Default for BackgroundOptions {
    fn default() -> Self {
        BackgroundOptions {
            page_size: 500,
            writes_per_second: 300.0,
            burst: 300.0,
            deadline: Duration::from_secs(10),
            max_attempts: 10,
        }
    }
}

/// Deleted triggers waiting for their DELETE rules, at most (beyond, a deletion's rules are
/// dropped, logged and counted as failed work).
const MAX_GONE: usize = 10_000;

/// How long a deleted synchronized downstream stays deleted before it is put back.
const RESTORE_DELAY: Duration = Duration::from_secs(1);

/// The field manager of server-side applied generated objects (Kyverno's).
const FIELD_MANAGER: &str = "kyverno-generate";
/// The field manager of mutate-existing patches.
const MUTATE_MANAGER: &str = "kyverno-mutate-existing";

/// The most writes this controller makes to one object within [`WRITE_WINDOW`]: more means
/// policies feed on their own writes (a mutate-existing rule patching its own trigger, two
/// synchronized rules rewriting each other's output); further writes wait for the window to end
/// and the rule reports a `PolicyError`.
const MAX_WRITES_PER_OBJECT: u32 = 10;
const WRITE_WINDOW: Duration = Duration::from_secs(60);
/// Objects whose last write by this controller is remembered (see `own_writes`), at most.
const MAX_OWN_WRITES: usize = 100_000;

/// (apiVersion, kind, namespace, name) of an object.
type Key = (String, String, String, String);

/// An object's key as messages name it: `apiVersion/kind namespace/name`.
fn describe(k: &Key) -> String {
    format!("{}/{} {}/{}", k.0, k.1, k.2, k.3)
}

/// Why the background controller's work on a trigger failed. The texts reach the policies'
/// `PolicyError` events, generate reports and the log.
#[derive(Debug, thiserror::Error)]
enum BackgroundError {
    /// The per-object write cap was reached.
    #[error(
        "{object} was written {MAX_WRITES_PER_OBJECT} times within {} s; further writes wait (do policies feed on their own output?)",
        WRITE_WINDOW.as_secs()
    )]
    TooManyWrites { object: String },
    /// Discovery does not serve the kind.
    #[error("the cluster does not serve {api_version}/{kind}")]
    NotServed { api_version: String, kind: String },
    /// The trigger's evaluation was cancelled or panicked.
    #[error(transparent)]
    Evaluation(#[from] EvaluationError),
    /// Reading an object to adopt failed.
    #[error("reading {name}: {source}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating {object}: {source}")]
    Create {
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating {object}: {source}")]
    Update {
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("patching {object}: {source}")]
    Patch {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// Reading a mutate-existing target failed.
    #[error("{0}")]
    Kube(#[source] kube::Error),
    /// An object did not convert between JSON and the client's type.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// Rules of the trigger's policies failed: each as `policy/rule: message`, the message as
    /// the rule's report and event show it.
    #[error("{}", .0.join("; "))]
    Rules(Vec<String>),
}

fn key_of(o: &Value) -> Key {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    (s("/apiVersion"), s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

fn label<'v>(o: &'v Value, k: &str) -> &'v str {
    o.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str).unwrap_or("")
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Role {
    Trigger,
    Downstream,
    Source,
}

#[derive(Clone)]
struct Watch {
    role: Role,
    synced: bool,
}

/// What a watch event is about: watch id, its generation, the event.
type WatchEvent = (u32, u64, watcher::Event<DynamicObject>);

/// A generated object Verno knows of.
struct Downstream {
    object: Value,
    policy: String,
    rule: String,
    trigger_uid: String,
}

/// Per generate / mutate-existing rule of a policy: what deletion and acting need to know.
#[derive(Clone, Debug, PartialEq)]
struct RuleInfo {
    /// The rule acts when its trigger is deleted (it lists the DELETE operation).
    on_delete: bool,
    synchronize: bool,
    orphan: bool,
    generate_existing: bool,
    mutate_existing_on_update: bool,
    /// A GeneratingPolicy: an existing downstream of its own is updated on every evaluation
    /// (synchronized or not), by server-side apply when `ssa`.
    cel: bool,
    ssa: bool,
}

#[derive(Clone, Debug)]
struct PolicyInfo {
    created: String,
    /// The policy-set generation of this controller in which the policy (with this creation
    /// time) first took part.
    arrived: u64,
    hash: u64,
    rules: BTreeMap<String, RuleInfo>,
}

struct Pending {
    live: bool,
    attempts: u32,
    /// Times the trigger waited for a watch's first list (the wait doubles: a watch that
    /// cannot list, e.g. forbidden, must not make the trigger spin).
    waits: u32,
    at: Instant,
}

/// The leader's state; dropped when leadership is lost.
struct Controller {
    client: kube::Client,
    server: Arc<dyn Serving>,
    metrics: Metrics,
    opts: BackgroundOptions,
    data: crate::cluster_data::ClusterData,
    pace: Pace,
    set: Arc<PolicySet>,
    policies: HashMap<String, PolicyInfo>,
    /// Watch id → (apiVersion, kind, namespace or empty) and its state.
    watch_keys: Vec<(Role, String, String, String)>,
    watches: Watches<u32, Watch, watcher::Event<DynamicObject>>,
    resources: HashMap<(String, String), (ApiResource, bool)>,
    discovery: DiscoveryCache,
    /// Triggers by key, as last seen.
    triggers: HashMap<Key, Arc<Value>>,
    /// Deleted triggers whose DELETE rules have not run yet (at most [`MAX_GONE`]).
    gone: HashMap<Key, Arc<Value>>,
    /// Trigger uid → key.
    trigger_uids: HashMap<String, Key>,
    downstreams: HashMap<Key, Downstream>,
    by_trigger: HashMap<String, HashSet<Key>>,
    /// Clone sources (apiVersion, kind, namespace) → the triggers whose copies came from there.
    sources: HashMap<(String, String, String), HashSet<Key>>,
    queue: VecDeque<Key>,
    pending: HashMap<Key, Pending>,
    /// Trigger uid → the policy-set generation it was last worked on with (successfully) during
    /// this leadership: a re-list (a policy changed) does not count as its admission under the
    /// policies of that set — but a policy that reached this controller later (the admission
    /// controller may well have had it when it admitted the trigger) still counts it as admitted,
    /// once.
    seen: HashMap<String, u64>,
    /// A trigger's version before the update waiting to be worked on (its oldest, when several
    /// arrived meanwhile): rules that match only UPDATE are evaluated against the update.
    previous: HashMap<Key, Arc<Value>>,
    /// Triggers whose latest change the background controller's account made (as its admission
    /// request showed): left to the policies that keep background requests.
    from_background: HashSet<Key>,
    /// The policy-set generation: bumped whenever the set is taken in.
    set_generation: u64,
    /// (trigger uid, policy, rule) this leader generated for: a synchronized downstream deleted
    /// by hand is put back even though none is left to show the link.
    acted: HashSet<(String, String, String)>,
    done: u64,
    failed: u64,
    /// `PolicyError` events on the policy when a rule fails for a trigger (`None` when
    /// `--omit-events` lists `PolicyError`).
    events: Option<FailureEvents>,
    /// The resourceVersion of this controller's last write of each object: a watch event of
    /// exactly that version is its own write, not a change by anyone — as Kyverno's rules skip
    /// requests of its background controller (`skipBackgroundRequests`, default true), it
    /// triggers nothing, so a downstream that matches its own rule's trigger does not make
    /// another (at most [`MAX_OWN_WRITES`]).
    own_writes: HashMap<Key, String>,
    /// Writes per object in the current window (see [`MAX_WRITES_PER_OBJECT`]).
    write_counts: HashMap<Key, (Instant, u32)>,
    /// Some rule in force sets `skipBackgroundRequests: false`: this controller's own writes
    /// trigger rules too (then only the write cap stops a loop).
    own_writes_trigger: bool,
}

/// Kyverno's failure events of the background controller: Warning `PolicyError` on the policy,
/// related to the trigger, note `policy <name>/<rule> error: <message>`, reported by
/// `kyverno-generate` or `kyverno-mutate` as Kyverno's. Paced as the admission events are;
/// what does not fit is dropped and counted.
struct FailureEvents {
    generate: Events,
    mutate: Events,
}

/// One rule's failure for one trigger.
struct Failure {
    policy: Arc<verno_engine::CompiledPolicy>,
    rule: String,
    mutate: bool,
    message: String,
}

/// One trigger's evaluation being acted on: what every policy's answer is applied to, and
/// what the pass comes to.
struct TriggerPass<'t> {
    trigger: &'t Arc<Value>,
    /// A watch event (or a deletion), not a re-list.
    live: bool,
    deleted: bool,
    created: &'t str,
    uid: String,
    key: Key,
    /// Every watch the rules need has listed once (else the trigger is worked on again).
    ok: bool,
    /// `policy/rule: message` of each failure.
    errors: Vec<String>,
    /// The failures, for `PolicyError` events.
    failures: Vec<Failure>,
}

impl<'t> TriggerPass<'t> {
    fn new(trigger: &'t Arc<Value>, live: bool, deleted: bool) -> TriggerPass<'t> {
        TriggerPass {
            trigger,
            live,
            deleted,
            created: trigger.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or(""),
            uid: trigger.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string(),
            key: key_of(trigger),
            ok: true,
            errors: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Records rule `rule` of `p` as failed (`mutate`: a mutate-existing rule).
    fn fail(&mut self, p: &Arc<verno_engine::CompiledPolicy>, rule: &str, mutate: bool, message: String) {
        self.errors.push(format!("{}/{}: {}", p.name, rule, message));
        self.failures.push(Failure { policy: p.clone(), rule: rule.to_string(), mutate, message });
    }
}

/// One policy's answer for the trigger, as it is acted on.
struct PolicyPass<'r> {
    p: Arc<verno_engine::CompiledPolicy>,
    /// Its [`policy_id`].
    pid: String,
    /// The trigger was admitted while the policy was in force.
    admitted: bool,
    /// A GeneratingPolicy (or its namespaced kind).
    cel_generation: bool,
    /// Its results go to the trigger's report: a GeneratingPolicy's, for an admitted trigger
    /// that is not being deleted (errors included).
    reports_generation: bool,
    /// Rules that answered and apply (a skipped rule does not apply to the trigger).
    applying: HashSet<&'r str>,
    /// Results for the trigger's report (Kyverno's generate reports): a GeneratingPolicy's for
    /// admitted triggers, its errors included; a ClusterPolicy's or Policy's generate rules
    /// once they converged (Kyverno reports them after processing the rule's update request
    /// without error, generateExisting included).
    reported: Vec<verno_engine::RuleResponse>,
}

impl FailureEvents {
    fn new(shared: &Shared) -> FailureEvents {
        FailureEvents { generate: shared.events(GENERATE_CONTROLLER), mutate: shared.events(MUTATE_CONTROLLER) }
    }
}

use crate::events::{GENERATE_CONTROLLER, MUTATE_CONTROLLER};

/// The `PolicyError` event of `f` for `trigger`, with the object it is about (the policy).
fn failure_event(f: &Failure, trigger: &Value) -> (Event, ObjectReference) {
    let doc = &f.policy.document;
    let meta = |k: &str| doc.pointer(&format!("/metadata/{k}")).and_then(Value::as_str).map(str::to_string);
    let regarding = ObjectReference {
        api_version: doc.get("apiVersion").and_then(Value::as_str).map(str::to_string),
        kind: Some(f.policy.kind.name().to_string()),
        name: Some(f.policy.name.clone()),
        namespace: f.policy.namespace.clone(),
        uid: meta("uid"),
        ..Default::default()
    };
    let tmeta = |k: &str| trigger.pointer(&format!("/metadata/{k}")).and_then(Value::as_str).map(str::to_string);
    let related = ObjectReference {
        api_version: trigger.get("apiVersion").and_then(Value::as_str).map(str::to_string),
        kind: trigger.get("kind").and_then(Value::as_str).map(str::to_string),
        name: tmeta("name"),
        namespace: tmeta("namespace"),
        uid: tmeta("uid"),
        ..Default::default()
    };
    let rule = if f.rule.is_empty() { String::new() } else { format!("/{}", f.rule) };
    let note = format!("policy {}{rule} error: {}", f.policy.name, f.message);
    let ev = crate::events::policy_error(note, "None", Some(related));
    (ev, regarding)
}

/// Runs the background controller while this replica leads, until Verno stops: reads and
/// writes act as the background account; events are Verno's own (`PolicyError` ones when
/// `error_events`).
pub async fn run(shared: Shared, opts: BackgroundOptions, error_events: bool) {
    let acting = shared.background_client();
    let term = || async {
        let (tx, rx) = mpsc::channel(64);
        let mut c = Controller {
            client: acting.clone(),
            server: shared.server.clone(),
            metrics: shared.metrics.clone(),
            opts,
            data: shared.data_as(&acting),
            pace: Pace::new(opts.writes_per_second, opts.burst),
            set: Arc::new(PolicySet::default()),
            policies: HashMap::new(),
            watch_keys: Vec::new(),
            watches: Watches::new(tx, "background controller"),
            resources: HashMap::new(),
            discovery: DiscoveryCache::new(Duration::from_secs(10)),
            triggers: HashMap::new(),
            gone: HashMap::new(),
            trigger_uids: HashMap::new(),
            downstreams: HashMap::new(),
            by_trigger: HashMap::new(),
            sources: HashMap::new(),
            queue: VecDeque::new(),
            pending: HashMap::new(),
            seen: HashMap::new(),
            previous: HashMap::new(),
            from_background: HashSet::new(),
            set_generation: 0,
            acted: HashSet::new(),
            done: 0,
            failed: 0,
            events: error_events.then(|| FailureEvents::new(&shared)),
            own_writes: HashMap::new(),
            write_counts: HashMap::new(),
            own_writes_trigger: false,
        };
        c.lead(rx, &mut shared.installed.clone()).await
    };
    shared.lead_while("background controller", term, || shared.metrics.set_background_backlog(0)).await;
}

fn policy_infos(set: &PolicySet) -> HashMap<String, PolicyInfo> {
    let mut out = HashMap::new();
    for p in set.policies().iter().filter(|p| p.in_background_apply()) {
        let doc = &p.document;
        let created = doc.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or("").to_string();
        let on_update = doc.pointer("/spec/mutateExistingOnPolicyUpdate").and_then(Value::as_bool).unwrap_or(false);
        let mut rules = BTreeMap::new();
        for r in &p.rules {
            let on_delete = lists_delete(doc, &r.name);
            let info = match &r.body {
                verno_engine::RuleBody::Generate(g) => RuleInfo {
                    on_delete,
                    synchronize: g.synchronize,
                    orphan: g.orphan_downstream,
                    generate_existing: g.generate_existing,
                    mutate_existing_on_update: false,
                    cel: g.cel.is_some(),
                    ssa: g.cel.as_ref().is_some_and(|c| c.use_server_side_apply),
                },
                verno_engine::RuleBody::Mutate(_) => RuleInfo {
                    on_delete,
                    synchronize: false,
                    orphan: true,
                    generate_existing: false,
                    // The rule's own setting wins over the policy's. A MutatingPolicy with
                    // `mutateExisting` is applied to every existing target when it is created
                    // or changed (Kyverno's policy controller queues the whole policy then).
                    mutate_existing_on_update: matches!(p.kind, Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy)
                        || rule_doc(doc, r.autogen_of.as_deref().unwrap_or(&r.name))
                            .and_then(|d| d.pointer("/mutate/mutateExistingOnPolicyUpdate"))
                            .and_then(Value::as_bool)
                            .unwrap_or(on_update),
                    cel: false,
                    ssa: false,
                },
                _ => continue,
            };
            rules.insert(r.name.clone(), info);
        }
        out.insert(policy_id(p), PolicyInfo { created, arrived: 0, hash: object_hash(doc), rules });
    }
    out
}

impl Controller {
    fn backlog(&self) {
        self.metrics.set_background_backlog(self.queue.len());
    }

    async fn lead(&mut self, mut rx: mpsc::Receiver<WatchEvent>, installed: &mut watch::Receiver<u64>) {
        if installed.wait_for(|g| *g > 0).await.is_err() {
            return;
        }
        installed.mark_unchanged();
        self.set = self.server.current();
        self.reconcile_policies(true).await;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Work the queue between events, a few at a time, so watch events keep flowing.
            if !self.queue.is_empty() {
                // A busy queue still takes a new policy set first: a trigger admitted under a
                // policy is evaluated with it.
                if installed.has_changed().unwrap_or(false) {
                    installed.mark_unchanged();
                    self.set = self.server.current();
                    self.reconcile_policies(false).await;
                }
                for _ in 0..16 {
                    let Some(k) = self.queue.pop_front() else { break };
                    self.process(k).await;
                }
                self.backlog();
                while let Ok((id, generation, ev)) = rx.try_recv() {
                    self.on_event(id, generation, ev).await;
                }
                continue;
            }
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some((id, generation, ev)) => self.on_event(id, generation, ev).await,
                    None => return,
                },
                r = installed.changed() => {
                    if r.is_err() { return }
                    self.set = self.server.current();
                    self.reconcile_policies(false).await;
                }
                _ = tick.tick() => self.requeue_due(),
            }
        }
    }

    /// Whether `v` is, at its resourceVersion, what this controller last wrote.
    fn is_own_write(&self, k: &Key, v: &Value) -> bool {
        let rv = v.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
        !rv.is_empty() && self.own_writes.get(k).is_some_and(|w| w == rv)
    }

    /// Counts a write of `k` against the per-object cap; an error once the cap is reached.
    fn may_write(&mut self, k: &Key) -> Result<(), BackgroundError> {
        let now = Instant::now();
        if self.write_counts.len() >= MAX_OWN_WRITES {
            self.write_counts.retain(|_, (at, _)| now.duration_since(*at) < WRITE_WINDOW);
        }
        let (at, n) = self.write_counts.entry(k.clone()).or_insert((now, 0));
        if now.duration_since(*at) >= WRITE_WINDOW {
            *at = now;
            *n = 0;
        }
        if *n >= MAX_WRITES_PER_OBJECT {
            return Err(BackgroundError::TooManyWrites { object: describe(k) });
        }
        *n += 1;
        Ok(())
    }

    /// Remembers the version this controller wrote of an object.
    fn wrote(&mut self, k: &Key, written: &DynamicObject) {
        let Some(rv) = written.metadata.resource_version.as_ref().filter(|rv| !rv.is_empty()) else { return };
        if self.own_writes.len() >= MAX_OWN_WRITES {
            self.own_writes.clear();
        }
        self.own_writes.insert(k.clone(), rv.clone());
    }

    fn requeue_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Key> = self
            .pending
            .iter()
            .filter(|(k, p)| p.attempts > 0 && p.at <= now && !self.queue.contains(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.queue.push_back(k);
        }
        self.backlog();
    }

    /// Queues `k` after `delay` (sooner if it is already waiting for less; at once if queued).
    fn enqueue_after(&mut self, k: Key, delay: Duration) {
        let at = Instant::now() + delay;
        match self.pending.get_mut(&k) {
            Some(p) if p.attempts > 0 => p.at = p.at.min(at),
            Some(_) => {}
            None => {
                // `attempts: 1` makes `requeue_due` pick it up when it is due.
                self.pending.insert(k, Pending { live: false, attempts: 1, waits: 0, at });
                self.backlog();
            }
        }
    }

    fn enqueue(&mut self, k: Key, live: bool) {
        match self.pending.get_mut(&k) {
            Some(p) => {
                p.live |= live;
                p.attempts = 0;
                p.waits = 0;
                p.at = Instant::now();
            }
            None => {
                self.pending.insert(k.clone(), Pending { live, attempts: 0, waits: 0, at: Instant::now() });
            }
        }
        if !self.queue.contains(&k) {
            self.queue.push_back(k);
        }
    }

    async fn discovery(&mut self, fresh: bool) -> Option<Arc<Discovery>> {
        self.discovery.get(&self.client, fresh, "the background controller keeps what it watches").await
    }

    /// The API resource of (apiVersion, kind), from discovery.
    async fn resource(&mut self, api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(r) = self.resources.get(&key) {
            return Some(r.clone());
        }
        for fresh in [false, true] {
            let d = self.discovery(fresh).await?;
            for g in d.groups() {
                for v in g.versions() {
                    for (ar, caps) in g.versioned_resources(v) {
                        // A kind, or (GeneratingPolicy reads) a plural resource.
                        if ar.api_version == api_version && (ar.kind == kind || ar.plural == kind) {
                            let r = (ar, caps.scope == DiscoveryScope::Namespaced);
                            self.resources.insert(key, r.clone());
                            return Some(r);
                        }
                    }
                }
            }
        }
        None
    }

    fn watch_id(&mut self, role: Role, api_version: &str, kind: &str, ns: &str) -> (u32, bool) {
        let key = (role, api_version.to_string(), kind.to_string(), ns.to_string());
        if let Some(i) = self.watch_keys.iter().position(|k| *k == key) {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            return (id, self.watches.contains(&id));
        }
        self.watch_keys.push(key);
        (u32::try_from(self.watch_keys.len() - 1).unwrap_or(u32::MAX), false)
    }

    fn start_watch(&mut self, id: u32, role: Role, ar: &ApiResource, ns: &str) {
        let api: Api<DynamicObject> = if ns.is_empty() {
            Api::all_with(self.client.clone(), ar)
        } else {
            Api::namespaced_with(self.client.clone(), ns, ar)
        };
        let mut cfg = watcher::Config::default().page_size(self.opts.page_size);
        if role == Role::Downstream {
            cfg = cfg.labels("generate.kyverno.io/policy-name");
        }
        if role == Role::Trigger {
            // A re-list evaluates every trigger again (a policy changed): forget what was seen.
            self.triggers.retain(|k, _| !(k.0 == ar.api_version && k.1 == ar.kind));
        }
        let what = format!("{}/{}", ar.api_version, ar.kind);
        let events = crate::poll::watch_or_poll(api, ar, cfg, crate::poll::POLL_EVERY, what);
        tracing::info!(kind = %ar.kind, api_version = %ar.api_version, ?role, namespace = ns, "the background controller watches this kind");
        self.watches.start(id, Watch { role, synced: false }, events);
    }

    /// Starts watching a kind in a role if not watched yet; whether its first list is done.
    async fn ensure_watch(
        &mut self,
        role: Role,
        api_version: &str,
        kind: &str,
        ns: &str,
    ) -> Result<bool, BackgroundError> {
        let (id, running) = self.watch_id(role, api_version, kind, ns);
        if running {
            return Ok(self.watches.get(&id).is_some_and(|w| w.synced));
        }
        match self.resource(api_version, kind).await {
            Some((ar, namespaced)) => {
                let ns = if namespaced { ns } else { "" };
                self.start_watch(id, role, &ar, ns);
                Ok(false)
            }
            None => {
                tracing::warn!(%api_version, %kind, "the background controller cannot watch this kind: discovery does not serve it");
                Err(BackgroundError::NotServed { api_version: api_version.to_string(), kind: kind.to_string() })
            }
        }
    }

    /// Brings the watched trigger kinds in step with the set; deletes what removed synchronized
    /// rules and policies generated; re-lists the triggers of changed policies.
    async fn reconcile_policies(&mut self, first: bool) {
        let infos = policy_infos(&self.set);
        self.own_writes_trigger = self.set.policies().iter().any(|p| keeps_background_requests(&p.document));
        // Removed policies and rules: their synchronized downstreams go (unless orphaned).
        let mut gone: Vec<(String, Option<String>)> = Vec::new();
        for (name, old) in &self.policies {
            match infos.get(name) {
                None => gone.push((name.clone(), None)),
                Some(new) => {
                    for r in old.rules.keys().filter(|r| !new.rules.contains_key(*r)) {
                        gone.push((name.clone(), Some(r.clone())));
                    }
                }
            }
        }
        for (policy, rule) in gone {
            let old = self.policies.get(&policy).cloned();
            let doomed: Vec<Key> = self
                .downstreams
                .iter()
                .filter(|(_, d)| d.policy == policy && rule.as_ref().is_none_or(|r| *r == d.rule))
                .filter(|(_, d)| {
                    old.as_ref().and_then(|o| o.rules.get(&d.rule)).is_some_and(|i| i.synchronize && !i.orphan)
                })
                // Copies of a clone source are kept, as Kyverno keeps them (the source is the
                // user's; only data the policy itself held goes with it).
                .filter(|(_, d)| {
                    label(&d.object, "generate.kyverno.io/source-name").is_empty()
                        && label(&d.object, "generate.kyverno.io/source-uid").is_empty()
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                self.delete(&k).await;
            }
        }
        let changed: Vec<String> = infos
            .iter()
            .filter(|(n, i)| self.policies.get(*n).is_none_or(|o| o.hash != i.hash))
            .map(|(n, _)| n.clone())
            .collect();
        self.set_generation += 1;
        let mut infos = infos;
        for (name, info) in &mut infos {
            info.arrived = match self.policies.get(name) {
                Some(old) if old.created == info.created => old.arrived,
                _ => self.set_generation,
            };
        }
        self.policies = infos;
        // The kinds generate rules name outright: watched from the start, so what they
        // generated is known before any trigger is compared (and orphans can be swept).
        let statics: Vec<(String, String)> = self
            .set
            .policies()
            .iter()
            .filter(|p| p.in_background_apply())
            .flat_map(|p| static_kinds(&p.document))
            .collect();
        for (av, kind) in statics {
            // A kind the cluster does not serve is reported when a trigger needs it.
            let _ = self.ensure_watch(Role::Downstream, &av, &kind, "").await;
        }
        // The trigger kinds.
        let mut wanted: HashSet<(String, String)> = HashSet::new();
        let mut of_changed: HashSet<(String, String)> = HashSet::new();
        let Some(d) = self.discovery(!changed.is_empty() || first).await else { return };
        for p in self.set.policies().iter().filter(|p| p.in_background_apply()) {
            for r in &p.rules {
                for scope in r.matcher.webhook_scope() {
                    if !scope.subresource.is_empty() {
                        continue;
                    }
                    for (ar, caps) in resolve(&d, &scope) {
                        let k = (ar.api_version.clone(), ar.kind.clone());
                        if changed.contains(&policy_id(p)) {
                            of_changed.insert(k.clone());
                        }
                        self.resources.entry(k.clone()).or_insert((ar, caps.scope == DiscoveryScope::Namespaced));
                        wanted.insert(k);
                    }
                }
            }
        }
        for (i, key) in self.watch_keys.clone().into_iter().enumerate() {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            if key.0 == Role::Trigger && !wanted.contains(&(key.1.clone(), key.2.clone())) {
                self.watches.stop(&id);
                self.triggers.retain(|k, _| !(k.0 == key.1 && k.1 == key.2));
            }
        }
        for (av, kind) in wanted {
            let (id, running) = self.watch_id(Role::Trigger, &av, &kind, "");
            if (!running || of_changed.contains(&(av.clone(), kind.clone())))
                && let Some((ar, _)) = self.resource(&av, &kind).await
            {
                self.start_watch(id, Role::Trigger, &ar, "");
            }
        }
    }

    async fn on_event(&mut self, id: u32, generation: u64, ev: watcher::Event<DynamicObject>) {
        let Some(w) = self.watches.current(id, generation) else { return };
        let role = w.role;
        // Listed items may come without their type: put it back from the watch's kind.
        let (wav, wkind) = self.watch_keys.get(id as usize).map(|k| (k.1.clone(), k.2.clone())).unwrap_or_default();
        let typed = |o: &DynamicObject| -> Option<Value> {
            let mut v = serde_json::to_value(o).ok()?;
            if let Some(m) = v.as_object_mut() {
                m.entry("apiVersion").or_insert_with(|| Value::String(wav.clone()));
                m.entry("kind").or_insert_with(|| Value::String(wkind.clone()));
            }
            Some(v)
        };
        match ev {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let live = w.synced;
                let Some(v) = typed(&o) else { return };
                match role {
                    Role::Trigger => self.on_trigger(v, live),
                    Role::Downstream => self.on_downstream(v, false),
                    Role::Source => {
                        if live {
                            self.on_source(&v);
                        }
                    }
                }
            }
            watcher::Event::Delete(o) => {
                let Some(v) = typed(&o) else { return };
                match role {
                    Role::Trigger => self.on_trigger_deleted(&v).await,
                    Role::Downstream => self.on_downstream(v, true),
                    Role::Source => self.on_source(&v),
                }
            }
            watcher::Event::InitDone => {
                w.synced = true;
                if role != Role::Source {
                    self.sweep_orphans().await;
                }
            }
        }
    }

    fn on_trigger(&mut self, v: Value, live: bool) {
        let k = key_of(&v);
        tracing::debug!(kind = %k.1, namespace = %k.2, name = %k.3, live, "trigger event");
        let uid = v.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        if !self.own_writes_trigger && self.is_own_write(&k, &v) {
            // This controller's own write: kept as the trigger's last state, acted on by no rule.
            tracing::debug!(kind = %k.1, namespace = %k.2, name = %k.3, "own write: not a trigger");
            if !uid.is_empty() {
                self.trigger_uids.insert(uid, k.clone());
            }
            self.triggers.insert(k, Arc::new(v));
            return;
        }
        if let Some(old) = self.triggers.get(&k)
            && object_hash(old) == object_hash(&v)
        {
            // Status or bookkeeping only: nothing a policy reads changed.
            return;
        }
        if !uid.is_empty() {
            self.trigger_uids.insert(uid.clone(), k.clone());
        }
        if live {
            let before_rv = self
                .triggers
                .get(&k)
                .and_then(|o| o.pointer("/metadata/resourceVersion"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !uid.is_empty() && self.server.made_by_background(&uid, before_rv) {
                self.from_background.insert(k.clone());
            } else {
                self.from_background.remove(&k);
            }
        }
        let before = self.triggers.insert(k.clone(), Arc::new(v));
        // A live event of a trigger seen before is an update: kept for the rules that match
        // only UPDATE (a new uid under the same name is a new object, not an update).
        if let Some(old) = before.filter(|o| {
            live && o.pointer("/metadata/uid") == self.triggers.get(&k).and_then(|n| n.pointer("/metadata/uid"))
        }) {
            self.previous.entry(k.clone()).or_insert(old);
        }
        self.enqueue(k, live);
    }

    async fn on_trigger_deleted(&mut self, v: &Value) {
        let k = key_of(v);
        self.triggers.remove(&k);
        self.previous.remove(&k);
        self.from_background.remove(&k);
        self.pending.remove(&k);
        let uid = v.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        self.trigger_uids.remove(&uid);
        self.seen.remove(&uid);
        self.acted.retain(|(u, _, _)| *u != uid);
        self.delete_for_trigger(&uid, |_| true).await;
        // Rules that act on the trigger's deletion (they list DELETE) run from the queue, like
        // any other work: they may have to wait for a downstream watch's first list.
        if self.policies.values().any(|p| p.rules.values().any(|r| r.on_delete)) {
            if self.gone.len() >= MAX_GONE {
                tracing::warn!(kind = %k.1, namespace = %k.2, name = %k.3, "too many deleted triggers waiting; this deletion's rules are not run");
                self.metrics.background_work(false);
                return;
            }
            self.gone.insert(k.clone(), Arc::new(v.clone()));
            self.enqueue(k, true);
        }
    }

    /// Downstreams whose trigger is gone (deleted while no leader watched): once the
    /// trigger kind's and every downstream kind's first list is done, a downstream whose
    /// trigger uid no watched trigger has is deleted (synchronized rules only).
    async fn sweep_orphans(&mut self) {
        if self.watches.values().any(|w| w.role == Role::Downstream && !w.synced) {
            return;
        }
        let synced_triggers: HashSet<(String, String)> = self
            .watches
            .iter()
            .filter(|(_, w)| w.role == Role::Trigger && w.synced)
            .filter_map(|(id, _)| self.watch_keys.get(id as usize).map(|k| (k.1.clone(), k.2.clone())))
            .collect();
        let orphans: HashSet<String> = self
            .downstreams
            .values()
            .filter(|d| {
                let (g, v, kind) = (
                    label(&d.object, "generate.kyverno.io/trigger-group"),
                    label(&d.object, "generate.kyverno.io/trigger-version"),
                    label(&d.object, "generate.kyverno.io/trigger-kind"),
                );
                let av = if g.is_empty() { v.to_string() } else { format!("{g}/{v}") };
                synced_triggers.contains(&(av, kind.to_string()))
                    && !d.trigger_uid.is_empty()
                    && !self.trigger_uids.contains_key(&d.trigger_uid)
            })
            .map(|d| d.trigger_uid.clone())
            .collect();
        for uid in orphans {
            self.delete_for_trigger(&uid, |_| true).await;
        }
    }

    /// Deletes the synchronized downstreams of trigger `uid` that `pick` selects.
    async fn delete_for_trigger(&mut self, uid: &str, pick: impl Fn(&Downstream) -> bool) {
        if uid.is_empty() {
            return;
        }
        let doomed: Vec<Key> = self
            .by_trigger
            .get(uid)
            .into_iter()
            .flatten()
            .filter(|k| {
                self.downstreams.get(*k).is_some_and(|d| {
                    pick(d)
                        && self
                            .policies
                            .get(&d.policy)
                            .and_then(|p| p.rules.get(&d.rule))
                            .is_some_and(|r| r.synchronize && !r.on_delete)
                })
            })
            .cloned()
            .collect();
        for k in doomed {
            self.delete(&k).await;
        }
    }

    fn on_downstream(&mut self, v: Value, deleted: bool) {
        let k = key_of(&v);
        let (policy, rule) = (downstream_policy(&v), label(&v, "generate.kyverno.io/rule-name").to_string());
        let uid = label(&v, "generate.kyverno.io/trigger-uid").to_string();
        if deleted {
            self.downstreams.remove(&k);
            if let Some(s) = self.by_trigger.get_mut(&uid) {
                s.remove(&k);
            }
        } else {
            let d = Downstream { policy: policy.clone(), rule: rule.clone(), trigger_uid: uid.clone(), object: v };
            self.by_trigger.entry(uid.clone()).or_default().insert(k.clone());
            self.downstreams.insert(k, d);
        }
        // A synchronized downstream edited or deleted by someone: its trigger puts it back
        // (one that is not synchronized is left as the user made it).
        let synchronized = self.policies.get(&policy).and_then(|p| p.rules.get(&rule)).is_some_and(|r| r.synchronize);
        if synchronized
            && let Some(t) = self.trigger_uids.get(&uid).cloned()
            && self.triggers.contains_key(&t)
        {
            let watched_synced = self.watches.values().all(|w| w.role != Role::Downstream || w.synced);
            if watched_synced && deleted {
                // Put back a moment later, not at once: the client that deleted it sees the
                // deletion finish (`kubectl delete --wait`, a test waiting for NotFound), as
                // with Kyverno, whose update request takes about that long.
                self.enqueue_after(t, RESTORE_DELAY);
            } else if watched_synced {
                self.enqueue(t, false);
            }
        }
    }

    fn on_source(&mut self, v: &Value) {
        let (av, kind, ns, _) = key_of(v);
        let triggers: Vec<Key> = self.sources.get(&(av, kind, ns)).into_iter().flatten().cloned().collect();
        for t in triggers {
            if self.triggers.contains_key(&t) {
                self.enqueue(t, false);
            }
        }
    }

    /// The API of the object `k` names (namespaced or not, as discovery says).
    async fn api_for(&mut self, k: &Key) -> Result<Api<DynamicObject>, BackgroundError> {
        let Some((ar, namespaced)) = self.resource(&k.0, &k.1).await else {
            return Err(BackgroundError::NotServed { api_version: k.0.clone(), kind: k.1.clone() });
        };
        Ok(if namespaced {
            Api::namespaced_with(self.client.clone(), &k.2, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        })
    }

    async fn delete(&mut self, k: &Key) {
        let Ok(api) = self.api_for(k).await else { return };
        self.pace.take().await;
        match api.delete(&k.3, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(kind = %k.1, namespace = %k.2, name = %k.3, "generated object deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(error = %e, kind = %k.1, name = %k.3, "deleting a generated object failed"),
        }
        if let Some(d) = self.downstreams.remove(k)
            && let Some(s) = self.by_trigger.get_mut(&d.trigger_uid)
        {
            s.remove(k);
        }
    }

    /// Evaluates one trigger and converges its downstreams and targets.
    async fn process(&mut self, k: Key) {
        // A deleted trigger's DELETE rules first (the same name may exist again meanwhile).
        let (obj, deleted) = match (self.gone.get(&k), self.triggers.get(&k)) {
            (Some(g), _) => (g.clone(), true),
            (None, Some(t)) => (t.clone(), false),
            (None, None) => {
                self.pending.remove(&k);
                return;
            }
        };
        let live = deleted || self.pending.get(&k).is_some_and(|p| p.live);
        let previous = if deleted { None } else { self.previous.get(&k).cloned() };
        let from_background = !deleted && self.from_background.contains(&k);
        match self.apply(&obj, live, deleted, previous, from_background).await {
            Ok(true) => {
                self.previous.remove(&k);
                self.from_background.remove(&k);
                self.done += 1;
                self.metrics.background_work(true);
                if deleted {
                    self.gone.remove(&k);
                    if self.triggers.contains_key(&k) {
                        // The new object of the same name is next.
                        self.enqueue(k, false);
                        return;
                    }
                }
                self.pending.remove(&k);
            }
            Ok(false) => {
                // Waiting for a watch's first list: again shortly, not counted as a failure.
                if let Some(p) = self.pending.get_mut(&k) {
                    let wait = Duration::from_millis(200u64 << p.waits.min(8)).min(Duration::from_secs(30));
                    p.waits += 1;
                    p.at = Instant::now() + wait;
                    p.attempts = p.attempts.max(1);
                }
            }
            Err(e) => {
                let max = self.opts.max_attempts;
                let attempts = {
                    let p = self.pending.entry(k.clone()).or_insert(Pending {
                        live,
                        attempts: 0,
                        waits: 0,
                        at: Instant::now(),
                    });
                    p.attempts += 1;
                    let backoff = Duration::from_secs(1u64 << p.attempts.min(8)).min(Duration::from_secs(300));
                    p.at = Instant::now() + backoff;
                    p.attempts
                };
                self.metrics.background_work(false);
                self.failed += 1;
                tracing::warn!(error = %e, kind = %k.1, namespace = %k.2, name = %k.3, attempts, "background work failed");
                if attempts >= max {
                    tracing::error!(kind = %k.1, namespace = %k.2, name = %k.3, "background work given up after {max} attempts");
                    self.pending.remove(&k);
                    self.gone.remove(&k);
                    self.previous.remove(&k);
                    self.from_background.remove(&k);
                }
            }
        }
    }

    /// `Ok(false)`: not done yet (a watch has not synced).
    async fn apply(
        &mut self,
        trigger: &Arc<Value>,
        live: bool,
        deleted: bool,
        previous: Option<Arc<Value>>,
        from_background: bool,
    ) -> Result<bool, BackgroundError> {
        let generation = self.set_generation;
        let responses = self.evaluate_trigger(trigger, deleted, previous).await?;
        let mut pass = TriggerPass::new(trigger, live, deleted);
        for (i, pr) in &responses {
            self.apply_policy(&mut pass, *i, pr, from_background).await;
        }
        let TriggerPass { uid, ok, errors, failures, .. } = pass;
        self.publish(trigger, failures).await;
        if deleted {
            return if errors.is_empty() { Ok(ok) } else { Err(BackgroundError::Rules(errors)) };
        }
        self.delete_unanswered(&uid, &responses).await;
        if !errors.is_empty() {
            return Err(BackgroundError::Rules(errors));
        }
        if ok && !uid.is_empty() {
            self.seen.insert(uid, generation);
        }
        Ok(ok)
    }

    /// The policies' answers for `trigger` (its deletion when `deleted`; with `previous`, the
    /// rules that match only UPDATE answer too), on the blocking pool within the deadline.
    async fn evaluate_trigger(
        &self,
        trigger: &Arc<Value>,
        deleted: bool,
        previous: Option<Arc<Value>>,
    ) -> Result<Vec<(usize, verno_engine::PolicyResponse)>, BackgroundError> {
        let set = self.set.clone();
        let data = self.data.clone();
        let object = trigger.clone();
        let out = evaluate_blocking(self.opts.deadline, move |env| {
            let req = if deleted {
                Request { old_object: Some(&object), ..Request::new(verno_engine::Operation::Delete, &Value::Null) }
            } else {
                Request::new(verno_engine::Operation::Create, &object)
            };
            let outcome = set.evaluate(&req, Scope::APPLY, env, &data, &mut ());
            if outcome.cancelled {
                return None;
            }
            let mut responses = outcome.responses;
            // An update (Kyverno's UpdateRequest carries the operation): the rules that match
            // only UPDATE answer too. Every other rule keeps its answer as a trigger seen anew,
            // as before.
            if let Some(old) = previous.as_deref() {
                let req = Request { old_object: Some(old), ..Request::new(verno_engine::Operation::Update, &object) };
                let update = set.evaluate(&req, Scope::APPLY, env, &data, &mut ());
                if update.cancelled {
                    return None;
                }
                for (i, pr) in update.responses {
                    let answered =
                        |name: &str| responses.iter().any(|(j, r)| *j == i && r.rules.iter().any(|x| x.name == name));
                    let extra: Vec<_> = pr.rules.into_iter().filter(|r| !answered(&r.name)).collect();
                    if extra.is_empty() {
                        continue;
                    }
                    match responses.iter_mut().find(|(j, _)| *j == i) {
                        Some((_, r)) => r.rules.extend(extra),
                        None => responses.push((i, verno_engine::PolicyResponse { rules: extra, ..pr })),
                    }
                }
            }
            Some(responses)
        })
        .await;
        out?.ok_or(BackgroundError::Evaluation(EvaluationError::Cancelled))
    }

    /// Acts on policy `i`'s answer for the trigger: its generate rules' downstreams converge,
    /// its mutate-existing targets are patched, its results reported, and the downstreams of
    /// its synchronized rules that no longer apply deleted.
    async fn apply_policy(
        &mut self,
        t: &mut TriggerPass<'_>,
        i: usize,
        pr: &verno_engine::PolicyResponse,
        from_background: bool,
    ) {
        let Some(p) = self.set.policies().get(i).cloned() else { return };
        let pid = policy_id(&p);
        let Some(info) = self.policies.get(&pid).cloned() else { return };
        // A change the background controller's account made is left alone by the policies
        // that skip background requests (Kyverno's default), their downstreams kept.
        if from_background && !keeps_background_requests(&p.document) {
            return;
        }
        // Admitted while the policy is in force: a watch event, or (first time this leader
        // sees it) created after the policy.
        let admitted = t.live
            || (self.seen.get(&t.uid).is_none_or(|g| *g < info.arrived)
                && !info.created.is_empty()
                && t.created >= info.created.as_str());
        let cel_generation = matches!(p.kind, Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy);
        let mut pp = PolicyPass {
            reports_generation: cel_generation && admitted && !t.deleted,
            cel_generation,
            admitted,
            applying: HashSet::new(),
            reported: Vec::new(),
            p,
            pid,
        };
        for r in &pr.rules {
            if t.deleted && !info.rules.get(r.name.as_str()).is_some_and(|ri| ri.on_delete) {
                continue;
            }
            tracing::debug!(policy = %pp.p.name, rule = %r.name, status = ?r.status, message = %r.message, generated = r.generated().len(), targets = r.patched_targets().len(), admitted, policy_created = %info.created, trigger_created = %t.created, "background evaluation");
            let Some(ri) = info.rules.get(r.name.as_str()) else { continue };
            self.watch_clone_sources(r, &t.key).await;
            if r.status != Status::Skip {
                pp.applying.insert(r.name.as_str());
            }
            match r.rule_type {
                RuleType::Generation => self.apply_generation(t, &mut pp, r, ri).await,
                RuleType::Mutation if r.status == Status::Error && info.rules.contains_key(r.name.as_str()) => {
                    t.fail(&pp.p, &r.name, true, r.message.clone());
                }
                RuleType::Mutation if r.status == Status::Pass && !r.patched_targets().is_empty() => {
                    self.patch_targets(t, &mut pp, r, ri).await;
                }
                _ => {}
            }
        }
        let reported = std::mem::take(&mut pp.reported);
        if !reported.is_empty() {
            self.report(t.trigger, &pp.p, reported).await;
        }
        // Synchronized generate rules of this policy that no longer apply to the trigger
        // (its labels or conditions changed — its operation is not looked at).
        for (rule, ri) in &info.rules {
            if !t.deleted && ri.synchronize && !pp.applying.contains(rule.as_str()) {
                let policy = pp.pid.clone();
                let rule = rule.clone();
                self.delete_for_trigger(&t.uid, |d| d.policy == policy && d.rule == rule).await;
            }
        }
    }

    /// Watches the clone sources a rule read (indexed by kind: a GeneratingPolicy names the
    /// plural), so that a change to them re-evaluates the trigger `tkey`.
    async fn watch_clone_sources(&mut self, r: &verno_engine::RuleResponse, tkey: &Key) {
        for (av, kind, ns, _) in r.clone_sources() {
            let av = if av.is_empty() { "v1".to_string() } else { av.clone() };
            let Some((ar, _)) = self.resource(&av, kind).await else { continue };
            // Served (resolved just above), so only "not synced yet" can come back.
            let _ = self.ensure_watch(Role::Source, &av, &ar.kind, ns).await;
            self.sources.entry((av, ar.kind.clone(), ns.clone())).or_default().insert(tkey.clone());
        }
    }

    /// A generate rule's answer: its downstreams made to converge (once their kinds are
    /// watched), those it no longer generates deleted when synchronized, the result reported.
    async fn apply_generation(
        &mut self,
        t: &mut TriggerPass<'_>,
        pp: &mut PolicyPass<'_>,
        r: &verno_engine::RuleResponse,
        ri: &RuleInfo,
    ) {
        let source_gone = r.status == Status::Error && r.message.starts_with("source resource ");
        if r.status == Status::Error && !source_gone {
            if pp.reports_generation {
                pp.reported.push(r.clone());
            }
            t.fail(&pp.p, &r.name, false, r.message.clone());
            return;
        }
        if r.status != Status::Pass && !source_gone {
            return;
        }
        // The downstream kinds must be known before comparing.
        match self.downstream_kinds_synced(r).await {
            Ok(true) => {}
            Ok(false) => {
                t.ok = false;
                return;
            }
            Err(e) => {
                let e = e.to_string();
                if pp.reports_generation {
                    pp.reported.push(verno_engine::RuleResponse::new(&r.name, r.rule_type, Status::Error, e.clone()));
                }
                t.fail(&pp.p, &r.name, false, e);
                return;
            }
        }
        let mine: Vec<Key> = self
            .by_trigger
            .get(&t.uid)
            .into_iter()
            .flatten()
            .filter(|k| self.downstreams.get(*k).is_some_and(|d| d.policy == pp.pid && d.rule == r.name))
            .cloned()
            .collect();
        let link = (t.uid.clone(), pp.pid.clone(), r.name.to_string());
        let act =
            pp.admitted || ri.generate_existing || (ri.synchronize && (!mine.is_empty() || self.acted.contains(&link)));
        if !act {
            return;
        }
        if self.acted.len() < 1_000_000 {
            self.acted.insert(link);
        }
        let wanted: Vec<Key> = r.generated().iter().map(key_of).collect();
        let mut failed = None;
        for g in r.generated() {
            if let Err(e) = self.converge(g, ri, &pp.pid).await {
                failed = Some(e.to_string());
                t.fail(&pp.p, &r.name, false, e.to_string());
            }
        }
        if pp.reports_generation {
            let mut result = r.clone();
            if let Some(e) = failed {
                result = verno_engine::RuleResponse::new(&r.name, r.rule_type, Status::Error, e);
            }
            pp.reported.push(result);
        } else if !pp.cel_generation && !t.deleted && failed.is_none() && r.status == Status::Pass {
            pp.reported.push(r.clone());
        }
        if ri.synchronize {
            for k in mine.iter().filter(|k| !wanted.contains(k)) {
                self.delete(k).await;
            }
        }
    }

    /// Watches the kinds of the objects a generate rule generates: whether every watch has
    /// listed once (`Err`: the last kind the cluster does not serve).
    async fn downstream_kinds_synced(&mut self, r: &verno_engine::RuleResponse) -> Result<bool, BackgroundError> {
        let mut ready = true;
        let mut unserved = None;
        for g in r.generated() {
            let (av, kind, _, _) = key_of(g);
            match self.ensure_watch(Role::Downstream, &av, &kind, "").await {
                Ok(synced) => ready &= synced,
                Err(e) => unserved = Some(e),
            }
        }
        unserved.map_or(Ok(ready), Err)
    }

    /// A mutate-existing rule's patched targets written (when admitted, or on update if the
    /// rule says so), each reported (Kyverno's mutate-existing reports: one result per target).
    async fn patch_targets(
        &mut self,
        t: &mut TriggerPass<'_>,
        pp: &mut PolicyPass<'_>,
        r: &verno_engine::RuleResponse,
        ri: &RuleInfo,
    ) {
        if !(pp.admitted || ri.mutate_existing_on_update) {
            return;
        }
        for target in r.patched_targets() {
            match self.patch_target(target).await {
                Ok(()) if !t.deleted => pp.reported.push(verno_engine::report::patched_target_result(&r.name, target)),
                Ok(()) => {}
                Err(e) => t.fail(&pp.p, &r.name, true, e.to_string()),
            }
        }
    }

    /// Policies that no longer answer for trigger `uid` at all (not matched): their
    /// synchronized copies go.
    async fn delete_unanswered(&mut self, uid: &str, responses: &[(usize, verno_engine::PolicyResponse)]) {
        let answering: HashSet<String> =
            responses.iter().filter_map(|(i, _)| self.set.policies().get(*i).map(|p| policy_id(p))).collect();
        let stale: Vec<String> = self
            .by_trigger
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|k| self.downstreams.get(k))
            .filter(|d| !answering.contains(&d.policy) && self.policies.contains_key(&d.policy))
            .map(|d| d.policy.clone())
            .collect();
        for policy in stale.into_iter().collect::<HashSet<_>>() {
            self.delete_for_trigger(uid, |d| d.policy == policy).await;
        }
    }

    /// Hands a policy's background results for `trigger` to the report writer, as Kyverno's
    /// background controller writes generate and mutate-existing reports (a generate rule's or
    /// GeneratingPolicy's `generated-resources`, a GeneratingPolicy's `process: admission
    /// review` and audit annotations; a mutate-existing rule's `patched-target`, one result per
    /// target).
    async fn report(
        &mut self,
        trigger: &Value,
        p: &Arc<verno_engine::CompiledPolicy>,
        rules: Vec<verno_engine::RuleResponse>,
    ) {
        let (av, kind, namespace, name) = key_of(trigger);
        let uid = trigger.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() || uid.is_empty() {
            return;
        }
        let Some((ar, _)) = self.resource(&av, &kind).await else { return };
        let response = verno_engine::PolicyResponse { policy: p.name.clone(), rules, ..Default::default() };
        let results = verno_engine::report::results(p, &response);
        if results.is_empty() {
            return;
        }
        let rules: Vec<String> = results.iter().filter_map(|r| r["rule"].as_str().map(str::to_string)).collect();
        self.server.submit_report(verno_engine::report::ReportNotice {
            resource: verno_engine::ResourceRef { api_version: av, kind, namespace, name, uid },
            group: ar.group,
            version: ar.version,
            plural: ar.plural,
            evaluated: vec![verno_engine::report::Evaluated {
                policy: verno_engine::report::report_key(p),
                source: verno_engine::report::source(p.kind),
                rules,
            }],
            results,
        });
    }

    /// Writes the `PolicyError` events of `failures` (paced; dropped and counted beyond).
    async fn publish(&mut self, trigger: &Value, failures: Vec<Failure>) {
        let Some(ev) = self.events.as_mut() else { return };
        for f in &failures {
            let (event, regarding) = failure_event(f, trigger);
            let events = if f.mutate { &mut ev.mutate } else { &mut ev.generate };
            events.publish(&event, &regarding).await;
        }
    }

    /// Overwrites an existing object no policy generated with `desired` (a synchronized
    /// rule's downstream), keeping its resourceVersion; `None` when it is some policy's.
    async fn adopt(
        &mut self,
        api: &Api<DynamicObject>,
        desired: &Value,
        name: &str,
    ) -> Result<Option<DynamicObject>, BackgroundError> {
        let cur = match api.get(name).await {
            Ok(c) => serde_json::to_value(&c)?,
            // Gone meanwhile: the next evaluation creates it.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(source) => return Err(BackgroundError::Read { name: name.to_string(), source }),
        };
        if !label(&cur, "generate.kyverno.io/policy-name").is_empty() {
            return Ok(None);
        }
        let obj = replacement(desired, &cur)?;
        self.pace.take().await;
        api.replace(name, &PostParams::default(), &obj)
            .await
            .map(Some)
            .map_err(|source| BackgroundError::Update { object: name.to_string(), source })
    }

    /// Creates a generated object that is missing; with `synchronize` (or for a
    /// GeneratingPolicy) puts back what differs in one this policy generated.
    async fn converge(&mut self, desired: &Value, ri: &RuleInfo, policy: &str) -> Result<(), BackgroundError> {
        let k = key_of(desired);
        let api = self.api_for(&k).await?;
        let existing = self.downstreams.get(&k).map(|d| d.object.clone());
        let obj: DynamicObject = serde_json::from_value(desired.clone())?;
        let written = match existing {
            None => {
                self.may_write(&k)?;
                self.pace.take().await;
                let made = if ri.ssa {
                    api.patch(&k.3, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await
                } else {
                    api.create(&own_post(), &obj).await
                };
                match made {
                    Ok(o) => Some(o),
                    // An object of that name exists. Generated by a policy (this one, and the
                    // watch has not shown it yet, or another one): left alone. Generated by
                    // none: with `synchronize`, Kyverno overwrites it with the rule's content
                    // (and its labels make it this rule's from then on); without, it is left
                    // as it is.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        if ri.synchronize {
                            self.adopt(&api, desired, &k.3).await?
                        } else {
                            None
                        }
                    }
                    Err(source) => return Err(BackgroundError::Create { object: describe(&k), source }),
                }
            }
            Some(cur)
                if (ri.synchronize || ri.cel) && downstream_policy(&cur) == policy && !contains(&cur, desired) =>
            {
                self.may_write(&k)?;
                self.pace.take().await;
                let updated = if ri.ssa {
                    api.patch(&k.3, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await
                } else {
                    api.replace(&k.3, &own_post(), &replacement(desired, &cur)?).await
                };
                Some(updated.map_err(|source| BackgroundError::Update { object: describe(&k), source })?)
            }
            Some(_) => None,
        };
        if let Some(o) = written
            && let Ok(v) = serde_json::to_value(&o)
        {
            self.wrote(&k, &o);
            tracing::info!(kind = %k.1, namespace = %k.2, name = %k.3, "generated");
            self.on_downstream(v, false);
        }
        Ok(())
    }

    /// Writes a mutate-existing target when the patch changed it.
    async fn patch_target(&mut self, patched: &Value) -> Result<(), BackgroundError> {
        let k = key_of(patched);
        let api = self.api_for(&k).await?;
        let current = match api.get(&k.3).await {
            Ok(c) => serde_json::to_value(&c)?,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(BackgroundError::Kube(e)),
        };
        if object_hash(&current) == object_hash(patched) {
            return Ok(());
        }
        let mut body = patched.clone();
        if let Some(m) = body.pointer_mut("/metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        self.may_write(&k)?;
        self.pace.take().await;
        let pp = PatchParams { field_manager: Some(MUTATE_MANAGER.into()), ..PatchParams::default() };
        let done = api
            .patch(&k.3, &pp, &Patch::Merge(&body))
            .await
            .map_err(|source| BackgroundError::Patch { object: describe(&k), source })?;
        tracing::info!(kind = %k.1, namespace = %k.2, name = %k.3, "mutate-existing target patched");
        self.wrote(&k, &done);
        Ok(())
    }
}

/// Create and update options of this controller's writes: its field manager.
fn own_post() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }
}

/// Whether a policy's rules act on requests of the background controller itself
/// (`skipBackgroundRequests: false` on a rule, or in a CEL policy's `evaluation`).
fn keeps_background_requests(doc: &Value) -> bool {
    let off = |v: Option<&Value>| v.and_then(Value::as_bool) == Some(false);
    off(doc.pointer("/spec/evaluation/skipBackgroundRequests"))
        || doc
            .pointer("/spec/rules")
            .and_then(Value::as_array)
            .is_some_and(|rules| rules.iter().any(|r| off(r.get("skipBackgroundRequests"))))
}

/// A policy's identity here: `namespace/name` for the namespaced kinds, else its name.
fn policy_id(p: &verno_engine::CompiledPolicy) -> String {
    match &p.namespace {
        Some(ns) if p.kind.is_namespaced() => format!("{ns}/{}", p.name),
        _ => p.name.clone(),
    }
}

/// The [`policy_id`] of the policy a generated object carries in its labels.
fn downstream_policy(o: &Value) -> String {
    let (ns, name) = (label(o, "generate.kyverno.io/policy-namespace"), label(o, "generate.kyverno.io/policy-name"));
    if ns.is_empty() { name.to_string() } else { format!("{ns}/{name}") }
}

/// `desired` as the replacement of `cur`: with `cur`'s resourceVersion (the update fails if
/// the object changed meanwhile).
fn replacement(desired: &Value, cur: &Value) -> Result<DynamicObject, serde_json::Error> {
    let mut next = desired.clone();
    if let (Some(m), Some(rv)) =
        (next.pointer_mut("/metadata").and_then(Value::as_object_mut), cur.pointer("/metadata/resourceVersion"))
    {
        m.insert("resourceVersion".into(), rv.clone());
    }
    serde_json::from_value(next)
}

/// A ClusterPolicy/Policy rule of a document, by name.
fn rule_doc<'d>(doc: &'d Value, rule: &str) -> Option<&'d Value> {
    doc.pointer("/spec/rules")?.as_array()?.iter().find(|r| r.get("name").and_then(Value::as_str) == Some(rule))
}

/// Whether rule `rule` of a policy document names the DELETE operation (ClusterPolicy match
/// blocks; the CEL kinds' `matchConstraints`, where `*` counts too).
fn lists_delete(doc: &Value, rule: &str) -> bool {
    let has = |ops: Option<&Value>, star: bool| {
        ops.and_then(Value::as_array).into_iter().flatten().any(|o| o == "DELETE" || (star && o == "*"))
    };
    if let Some(rules) = doc.pointer("/spec/rules").and_then(Value::as_array) {
        return rules.iter().filter(|r| r.get("name").and_then(Value::as_str) == Some(rule)).any(|r| {
            let m = r.get("match");
            has(m.and_then(|m| m.pointer("/resources/operations")), false)
                || ["any", "all"].iter().any(|k| {
                    m.and_then(|m| m.get(*k))
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|f| has(f.pointer("/resources/operations"), false))
                })
        });
    }
    doc.pointer("/spec/matchConstraints/resourceRules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| has(r.get("operations"), true))
}

/// The (apiVersion, kind) a ClusterPolicy/Policy's generate rules name without variables.
fn static_kinds(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut add = |g: &Value| {
        let s = |k: &str| g.get(k).and_then(Value::as_str).unwrap_or("");
        let (av, kind) = (s("apiVersion"), s("kind"));
        if !av.is_empty() && !kind.is_empty() && !av.contains("{{") && !kind.contains("{{") {
            out.push((av.to_string(), kind.to_string()));
        }
        for k in g.pointer("/cloneList/kinds").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
        {
            let (av, kind) = k.rsplit_once('/').unwrap_or(("v1", k));
            out.push((av.to_string(), kind.to_string()));
        }
    };
    for r in doc.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten() {
        if let Some(g) = r.get("generate") {
            add(g);
            for f in g.get("foreach").and_then(Value::as_array).into_iter().flatten() {
                add(f);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether `have` holds everything `want` sets (maps compared key by key; lists and scalars
/// whole). The API server adds defaults and bookkeeping; those do not count as a difference.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| match h.get(k) {
            Some(hv) => contains(hv, wv),
            None => wv.is_null() || wv.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(h), Value::Array(w)) => h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b)),
        (h, w) => h == w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_downstream_with_defaults_added_still_counts_as_converged() {
        let want = json!({"kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v"}});
        let mut have = want.clone();
        have["metadata"]["uid"] = json!("u");
        have["metadata"]["resourceVersion"] = json!("7");
        assert!(contains(&have, &want));
        have["data"]["k"] = json!("edited");
        assert!(!contains(&have, &want));
        let mut extra = want.clone();
        extra["data"]["other"] = json!("added by a user");
        assert!(contains(&extra, &want), "keys the policy does not set are left alone");
    }
}
