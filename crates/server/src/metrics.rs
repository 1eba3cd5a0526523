//! Prometheus metrics with Kyverno's names and labels, so its Grafana dashboard works.

use crate::admission::Outcome;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use verno_engine::{PolicyMeta, PolicyResponse, PolicySet};
use verno_engine::{RuleType, Status};

/// A shared name compared by identity: hashing a pointer instead of the text keeps counting a
/// rule result cheap. Each shard of [`Tallies`] holds its own copies of the names it uses, so
/// counting takes no reference on a name another core also counts with; equal texts behind
/// different pointers (other shards) are merged when the series are spelled out at scrape time.
#[derive(Clone, Debug)]
struct Name(Arc<str>);

impl PartialEq for Name {
    fn eq(&self, o: &Name) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}
impl Eq for Name {}
impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        address(&self.0).hash(h);
    }
}

/// One `kyverno_policy_results_total` series. Labels are spelled out only when Prometheus
/// scrapes; the series is found by its [`ResultId`].
#[derive(Clone, Debug)]
struct ResultKey {
    enforce: bool,
    namespaced: bool,
    background: bool,
    policy_namespace: Name,
    policy_name: Name,
    resource_kind: Name,
    resource_namespace: Name,
    operation: Name,
    rule_name: Name,
    rule_result: &'static str,
    rule_type: &'static str,
    dry_run: bool,
    /// `admission_request` or `background_scan`.
    cause: &'static str,
}

/// A [`ResultKey`] without the references: looking a series up (every rule result of every
/// request) takes no reference counts. The map's value keeps the key, so its names stay alive
/// and no other name can take their addresses while the series exists.
///
/// The label words (result, rule type, cause) are `'static` strings, identified by address as
/// well: hashing their text was most of a lookup. Two copies of one word at two addresses
/// would make two series with the same labels, which the exposition merges by label text.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ResultId {
    /// enforce, namespaced, background, dry run: one bit each.
    flags: u8,
    names: [usize; 6],
    /// Address and length: the same bytes, whatever the linker merged.
    words: [(usize, usize); 3],
}

impl ResultId {
    /// `flags`: enforce, namespaced, background, dry run; `names`: policy namespace and name,
    /// resource kind and namespace, operation, rule; `words`: rule result, rule type, cause.
    fn new(flags: [bool; 4], names: [&Arc<str>; 6], words: [&'static str; 3]) -> ResultId {
        let flags = flags.iter().enumerate().fold(0u8, |acc, (i, &f)| acc | (u8::from(f) << i));
        ResultId { flags, names: names.map(address), words: words.map(|w| (w.as_ptr() as usize, w.len())) }
    }
}

impl ResultKey {
    /// The key of a rule result of policy `p` (described by `meta`) on a resource of the
    /// request labels `[kind, namespace, operation]`; `flags`: enforce, dry run; `words`: rule
    /// result, rule type, cause.
    fn of(
        p: &PolicyNames,
        meta: &PolicyMeta,
        [kind, ns, operation]: [&Arc<str>; 3],
        rule: Arc<str>,
        [enforce, dry_run]: [bool; 2],
        [rule_result, rule_type, cause]: [&'static str; 3],
    ) -> ResultKey {
        ResultKey {
            enforce,
            namespaced: meta.namespaced,
            background: meta.background,
            policy_namespace: Name(p.namespace.clone()),
            policy_name: Name(p.name.clone()),
            resource_kind: Name(kind.clone()),
            resource_namespace: Name(ns.clone()),
            operation: Name(operation.clone()),
            rule_name: Name(rule),
            rule_result,
            rule_type,
            dry_run,
            cause,
        }
    }

    /// The key by identity (its names' addresses, its flags and words), for [`count_result`].
    fn id(&self) -> ResultId {
        ResultId::new(
            [self.enforce, self.namespaced, self.background, self.dry_run],
            [
                &self.policy_namespace.0,
                &self.policy_name.0,
                &self.resource_kind.0,
                &self.resource_namespace.0,
                &self.operation.0,
                &self.rule_name.0,
            ],
            [self.rule_result, self.rule_type, self.cause],
        )
    }
}

/// The place in `list` of the series `id` names, found through `index`; a new series is made
/// (`new`, with its key and references) and appended.
fn series_at<I: std::hash::Hash + Eq, S>(
    index: &mut FastMap<I, usize>,
    list: &mut Vec<S>,
    id: I,
    new: impl FnOnce() -> S,
) -> usize {
    *index.entry(id).or_insert_with(|| {
        list.push(new());
        list.len() - 1
    })
}

/// Looks up a series by a key's identity and adds one, building the key (with its references)
/// only for a new series; returns its place.
fn count_result(
    index: &mut FastMap<ResultId, usize>,
    list: &mut Vec<(ResultKey, u64)>,
    id: ResultId,
    key: impl FnOnce() -> ResultKey,
) -> usize {
    let i = series_at(index, list, id, || (key(), 0));
    if let Some(series) = list.get_mut(i) {
        series.1 += 1;
    }
    i
}

/// One admission series (`kyverno_admission_requests_total` and
/// `kyverno_admission_review_duration_seconds` share their labels).
#[derive(Clone, Debug)]
struct AdmissionKey {
    kind: Arc<str>,
    namespace: Arc<str>,
    operation: Arc<str>,
    allowed: bool,
    webhook: &'static str,
}

/// An [`AdmissionKey`] by its names' addresses and the webhook's `'static` name (address and
/// length).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct AdmissionId {
    names: [usize; 3],
    allowed: bool,
    webhook: (usize, usize),
}

/// One `kyverno_policy_execution_duration_seconds` series, kept like [`ResultKey`].
#[derive(Clone, Debug)]
struct TimeKey {
    namespaced: bool,
    policy_name: Arc<str>,
    resource_kind: Arc<str>,
    operation: Arc<str>,
}

/// A [`TimeKey`] by its names' addresses (see [`ResultId`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct TimeId {
    namespaced: bool,
    names: [usize; 3],
}

/// The upper bounds of the duration histograms: 50 µs … ~1.6 s (then `+Inf`), as
/// prometheus_client computes them.
static DURATION_BOUNDS: std::sync::LazyLock<Vec<f64>> =
    std::sync::LazyLock::new(|| exponential_buckets(0.00005, 2.0, 16).collect());

/// A duration histogram's counts, changed under its shard's lock (see [`Tallies`]).
#[derive(Clone, Debug, Default)]
struct Durations {
    sum: f64,
    count: u64,
    /// Per bucket, not cumulative; the last one is `+Inf`.
    buckets: [u64; 17],
}

impl Durations {
    fn observe(&mut self, seconds: f64) {
        self.sum += seconds;
        self.count += 1;
        // NaN compares false everywhere, so it lands in +Inf, as prometheus_client puts it.
        let i = DURATION_BOUNDS.iter().position(|b| seconds <= *b).unwrap_or(DURATION_BOUNDS.len());
        if let Some(b) = self.buckets.get_mut(i) {
            *b += 1;
        }
    }

    fn add(&mut self, o: &Durations) {
        self.sum += o.sum;
        self.count += o.count;
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    fn encode(&self, encoder: &mut prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> =
            DURATION_BOUNDS.iter().copied().chain(std::iter::once(f64::INFINITY)).zip(self.buckets).collect();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(self.sum, self.count, &buckets, None)
    }
}

/// A policy's names as one shard counts them: its own copies, found again by text when a
/// reloaded set brings new copies, so a reload neither starts new series nor grows the tables.
#[derive(Debug)]
struct PolicyNames {
    /// The set's description of the policy these names were taken from (held: its address
    /// identifies it while the entry exists).
    meta: Arc<PolicyMeta>,
    name: Arc<str>,
    namespace: Arc<str>,
    rules: Vec<Arc<str>>,
}

/// One shard's series and names.
#[derive(Debug, Default)]
struct Table {
    /// Request label values (kinds, namespaces, operations) admitted by [`Metrics::known`]:
    /// this shard's copies.
    labels: FastMap<String, Arc<str>>,
    /// Request operations as sent (`CREATE`) to their label (`create`).
    operations: FastMap<String, Arc<str>>,
    /// Policy, policy namespace and rule names.
    names: FastMap<String, Arc<str>>,
    /// By policy index, the names of the policy last counted at that index.
    policies: Vec<Option<PolicyNames>>,
    admission: FastMap<AdmissionId, (AdmissionKey, Durations)>,
    /// The rule result series (their place in `result_list`), by identity.
    results: FastMap<ResultId, usize>,
    result_list: Vec<(ResultKey, u64)>,
    /// The policy duration series (their place in `time_list`), by identity.
    times: FastMap<TimeId, usize>,
    time_list: Vec<(TimeKey, Durations)>,
    /// Where each class of requests counts, by rule and policy number.
    classes: Classes,
}

/// The rule results of one request, and its policies' times, found without a lookup by
/// identity. Every request of a class (resource kind, namespace, operation, dry run) against
/// one set counts a given rule and status into the same series, so a class keeps, by the rule's
/// number in the set and the status, that series' place in [`Table::result_list`] (and by
/// policy number its duration series' place in [`Table::time_list`]), learned the first time
/// through the lookup by identity. Hashing a [`ResultId`] per rule result was most of the cost
/// of counting a request (11 k instructions of 17 policies' results and times, against ~3 k
/// now).
#[derive(Debug, Default)]
struct Classes {
    /// The set the numbering is for: its policies' descriptions (held, so their addresses
    /// identify them).
    metas: Vec<Arc<PolicyMeta>>,
    /// Per policy, the number of its first rule; one more entry ends the last policy.
    bases: Vec<usize>,
    by_class: FastMap<ClassId, Class>,
    /// Places held by all classes: a bound on the memory (label values are bounded, their
    /// combinations only by this).
    held: usize,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ClassId {
    /// Resource kind, namespace and operation labels (this shard's copies, by address).
    names: [usize; 3],
    dry_run: bool,
}

/// Places plus one (0: not learned yet).
#[derive(Debug)]
struct Class {
    /// By `(rule number × STATUSES + status)`.
    results: Vec<u32>,
    /// By policy number.
    times: Vec<u32>,
}

/// The place learned at `slot` of `places`, if any.
fn known(places: &[u32], slot: usize) -> Option<usize> {
    places.get(slot).and_then(|x| x.checked_sub(1)).map(|x| x as usize)
}

/// Remembers `at` as the place for `slot` (a place past `u32` is not remembered).
fn learn(places: &mut [u32], slot: usize, at: usize) {
    if let (Some(x), Ok(at)) = (places.get_mut(slot), u32::try_from(at + 1)) {
        *x = at;
    }
}

/// The statuses a rule result can have ([`Status`]'s variants).
const STATUSES: usize = 5;
const _: () = assert!(Status::Skip as usize + 1 == STATUSES && Status::Pass as usize == 0);
/// The most places the classes of one shard hold (256 KiB: ~240 classes of a 17-policy Pod
/// Security set, against up to eight shards — a few MiB would be a tenth of the server's
/// resident memory for a cluster with many namespaces); past it they start again, and a
/// request of a class not held learns its places through the lookup by identity once more.
const MAX_CLASS_PLACES: usize = 1 << 16;

impl Classes {
    /// The class `id` of requests against `set`, with the numbering ([`place`]); a different
    /// set renumbers (all classes go).
    fn class(&mut self, set: &PolicySet, id: ClassId) -> Option<(&mut Class, &[usize])> {
        let metas = set.metas();
        let n = metas.len();
        let same = self.metas.len() == n && self.metas.iter().zip(metas).all(|(a, b)| Arc::ptr_eq(a, b));
        if !same {
            self.metas = metas.to_vec();
            self.bases.clear();
            self.by_class.clear();
            self.held = 0;
            let mut next = 0;
            for m in &self.metas {
                self.bases.push(next);
                next += m.rules.len();
            }
            self.bases.push(next);
        }
        let rules = self.bases.last().copied()?;
        if !self.by_class.contains_key(&id) {
            let places = rules * STATUSES + n;
            if self.held + places > MAX_CLASS_PLACES {
                self.by_class.clear();
                self.held = 0;
            }
            self.held += places;
            self.by_class.insert(id, Class { results: vec![0; rules * STATUSES], times: vec![0; n] });
        }
        Some((self.by_class.get_mut(&id)?, &self.bases))
    }
}

/// Where rule `rule` of policy `policy` counts `status` in a [`Class`] numbered by `bases`.
fn place(bases: &[usize], policy: usize, rule: usize, status: Status) -> Option<usize> {
    let (start, end) = (*bases.get(policy)?, *bases.get(policy + 1)?);
    (start + rule < end).then(|| (start + rule) * STATUSES + status as usize)
}

impl Table {
    /// This shard's copy of a policy, namespace or rule name.
    fn name(names: &mut FastMap<String, Arc<str>>, s: &str) -> Arc<str> {
        match names.get(s) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = Arc::from(s);
                names.insert(s.to_string(), a.clone());
                a
            }
        }
    }

    /// The names of policy `i` of the set whose description is `meta`.
    fn policy<'t>(
        policies: &'t mut Vec<Option<PolicyNames>>,
        names: &mut FastMap<String, Arc<str>>,
        i: usize,
        meta: &Arc<PolicyMeta>,
    ) -> Option<&'t PolicyNames> {
        if policies.len() <= i {
            policies.resize_with(i + 1, || None);
        }
        let slot = policies.get_mut(i)?;
        if !slot.as_ref().is_some_and(|p| Arc::ptr_eq(&p.meta, meta)) {
            *slot = Some(PolicyNames {
                meta: meta.clone(),
                name: Table::name(names, &meta.name),
                namespace: Table::name(names, &meta.namespace),
                rules: meta.rules.iter().map(|(r, _)| Table::name(names, r)).collect(),
            });
        }
        slot.as_ref()
    }
}

/// How many tables the request counts are spread over.
const SHARDS: usize = 8;

/// The request counts, in [`SHARDS`] tables, each behind its own lock on its own cache lines.
/// A thread always counts into the same table (given out in turn as threads first count), so
/// the server's worker threads count without waiting for each other and without moving cache
/// lines between the cores — with one shared table that was half the cost of counting a
/// request. A scrape adds the tables up by label text.
#[derive(Debug, Default)]
struct Tallies {
    shards: [Shard; SHARDS],
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<Table>);

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

impl Tallies {
    /// The calling thread's table, locked (`None` only if there were no shards).
    fn mine(&self) -> Option<std::sync::MutexGuard<'_, Table>> {
        let i = SHARD.with(|s| {
            s.get().unwrap_or_else(|| {
                let i = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
                s.set(Some(i));
                i
            })
        });
        Some(match self.shards.get(i)?.0.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        })
    }

    /// Every table in turn (one lock at a time).
    fn each(&self, mut f: impl FnMut(&Table)) {
        for s in &self.shards {
            match s.0.lock() {
                Ok(t) => f(&t),
                Err(p) => f(&p.into_inner()),
            }
        }
    }
}

impl Collector for Tallies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let b = |x: bool| if x { "true" } else { "false" };
        // Spell out and merge series by their label text.
        let mut admission: BTreeMap<[String; 5], Durations> = BTreeMap::new();
        let mut results: BTreeMap<[String; 13], u64> = BTreeMap::new();
        let mut times: BTreeMap<[String; 4], Durations> = BTreeMap::new();
        self.each(|t| {
            for (k, d) in t.admission.values() {
                let labels = [
                    k.kind.to_string(),
                    k.namespace.to_string(),
                    k.operation.to_string(),
                    b(k.allowed).to_string(),
                    k.webhook.to_string(),
                ];
                admission.entry(labels).or_default().add(d);
            }
            for (k, v) in &t.result_list {
                let labels = [
                    if k.enforce { "enforce" } else { "audit" }.to_string(),
                    if k.namespaced { "namespaced" } else { "cluster" }.to_string(),
                    b(k.background).to_string(),
                    k.policy_namespace.0.to_string(),
                    k.policy_name.0.to_string(),
                    k.resource_kind.0.to_string(),
                    k.resource_namespace.0.to_string(),
                    k.operation.0.to_string(),
                    k.rule_name.0.to_string(),
                    k.rule_result.to_string(),
                    k.rule_type.to_string(),
                    k.cause.to_string(),
                    b(k.dry_run).to_string(),
                ];
                *results.entry(labels).or_insert(0) += v;
            }
            for (k, d) in &t.time_list {
                let labels = [
                    if k.namespaced { "namespaced" } else { "cluster" }.to_string(),
                    k.policy_name.to_string(),
                    k.resource_kind.to_string(),
                    k.operation.to_string(),
                ];
                times.entry(labels).or_default().add(d);
            }
        });
        const ADMISSION: [&str; 5] =
            ["resource_kind", "resource_namespace", "resource_request_operation", "request_allowed", "request_webhook"];
        let mut family = encoder.encode_descriptor(
            "kyverno_admission_requests",
            "Admission requests reviewed.",
            None,
            MetricType::Counter,
        )?;
        for (values, d) in &admission {
            ConstCounter::new(d.count).encode(family.encode_family(&pairs(&ADMISSION, values))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "kyverno_admission_review_duration_seconds",
            "Time to review an admission request.",
            None,
            MetricType::Histogram,
        )?;
        for (values, d) in &admission {
            d.encode(&mut family.encode_family(&pairs(&ADMISSION, values))?)?;
        }
        const RESULT: [&str; 13] = [
            "policy_validation_mode",
            "policy_type",
            "policy_background_mode",
            "policy_namespace",
            "policy_name",
            "resource_kind",
            "resource_namespace",
            "resource_request_operation",
            "rule_name",
            "rule_result",
            "rule_type",
            "rule_execution_cause",
            "dry_run",
        ];
        let mut family = encoder.encode_descriptor(
            "kyverno_policy_results",
            "Rule results of policies applied to admission requests and in background scans",
            None,
            MetricType::Counter,
        )?;
        for (values, v) in &results {
            ConstCounter::new(*v).encode(family.encode_family(&pairs(&RESULT, values))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "kyverno_policy_execution_duration_seconds",
            "Time to evaluate one policy on a request",
            None,
            MetricType::Histogram,
        )?;
        for ([ty, name, kind, op], d) in &times {
            let labels: [(&str, &str); 5] = [
                ("policy_type", ty),
                ("policy_name", name),
                ("resource_kind", kind),
                ("resource_request_operation", op),
                ("rule_execution_cause", "admission_request"),
            ];
            d.encode(&mut family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Label names and values side by side, as the encoder takes them.
fn pairs<'a>(names: &[&'static str], values: &'a [String]) -> Vec<(&'static str, &'a str)> {
    names.iter().copied().zip(values.iter().map(String::as_str)).collect()
}

fn address(a: &Arc<str>) -> usize {
    Arc::as_ptr(a) as *const u8 as usize
}

/// The series maps are looked up for every rule result of every request: keys hash by pointer
/// and flags, so a fast non-cryptographic hasher (foldhash, randomly seeded) fits; SipHash was
/// a visible part of a request's cost.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// `kyverno_policy_rule_info_total` (one series per rule in force) and
/// `kyverno_policy_changes_total` (policies created, updated, deleted), kept on set swaps.
#[derive(Debug, Default)]
struct PolicyInfo {
    rules: Mutex<Vec<[String; 8]>>,
    changes: Mutex<BTreeMap<[String; 6], u64>>,
}

impl Collector for PolicyInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        const RULE: [&str; 8] = [
            "policy_validation_mode",
            "policy_type",
            "policy_background_mode",
            "policy_namespace",
            "policy_name",
            "rule_name",
            "rule_type",
            "status_ready",
        ];
        const CHANGE: [&str; 6] = [
            "policy_validation_mode",
            "policy_type",
            "policy_background_mode",
            "policy_namespace",
            "policy_name",
            "policy_change_type",
        ];
        let rules = match self.rules.lock() {
            Ok(m) => m.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let mut family = encoder.encode_descriptor(
            "kyverno_policy_rule_info_total",
            "One series per rule of the policies in force",
            None,
            MetricType::Gauge,
        )?;
        for values in &rules {
            let labels: Vec<(&str, &str)> = RULE.iter().copied().zip(values.iter().map(String::as_str)).collect();
            prometheus_client::metrics::gauge::ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        let changes: Vec<([String; 6], u64)> = match self.changes.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Err(p) => p.into_inner().iter().map(|(k, v)| (k.clone(), *v)).collect(),
        };
        let mut family = encoder.encode_descriptor(
            "kyverno_policy_changes",
            "Policies created, updated and deleted",
            None,
            MetricType::Counter,
        )?;
        for (values, v) in &changes {
            let labels: Vec<(&str, &str)> = CHANGE.iter().copied().zip(values.iter().map(String::as_str)).collect();
            ConstCounter::new(*v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn policy_labels(p: &verno_engine::CompiledPolicy) -> [String; 5] {
    let namespaced = p.kind == verno_engine::Kind::Policy;
    [
        if p.action == verno_engine::Action::Enforce { "enforce" } else { "audit" }.to_string(),
        if namespaced { "namespaced" } else { "cluster" }.to_string(),
        p.background.to_string(),
        if namespaced { p.namespace.clone().unwrap_or_default() } else { "-".to_string() },
        p.name.clone(),
    ]
}

/// Distinct request-derived label values (kinds, namespaces, operations) kept in metrics.
pub const MAX_LABEL_VALUES: usize = 2000;
/// Request operations (as sent) a shard remembers the label of.
const MAX_OPERATIONS: usize = 16;
/// The label value of everything past [`MAX_LABEL_VALUES`].
pub const OVERFLOW_LABEL: &str = "_overflow";

pub struct Metrics {
    /// Locked only to register more metrics (the controllers', once) and to encode.
    registry: Mutex<Registry>,
    policy_info: Arc<PolicyInfo>,
    /// Resource kinds, namespaces and operations taken as label values, at most
    /// [`MAX_LABEL_VALUES`]: the shards copy from here what they use.
    known: Mutex<HashSet<String>>,
    /// The admission series, rule results and policy durations.
    tallies: Arc<Tallies>,
    /// Violation events not handed to the controller because its queue was full.
    pub events_dropped: Counter,
    /// Admission results not written into PolicyReports: the report queue was full, or the
    /// object never appeared.
    pub reports_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let tallies = Arc::new(Tallies::default());
        registry.register_collector(Box::new(tallies.clone()));
        let policy_info = Arc::new(PolicyInfo::default());
        registry.register_collector(Box::new(policy_info.clone()));
        let events_dropped = Counter::default();
        registry.register(
            "verno_events_dropped",
            "PolicyViolation events dropped because the event queue was full",
            events_dropped.clone(),
        );
        let reports_dropped = Counter::default();
        registry.register(
            "verno_reports_dropped",
            "Admission results not written into PolicyReports (queue full, or the object never appeared)",
            reports_dropped.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            policy_info,
            known: Mutex::new(HashSet::new()),
            tallies,
            events_dropped,
            reports_dropped,
        }
    }
}

fn rule_type(t: RuleType) -> &'static str {
    match t {
        RuleType::Validation => "validate",
        RuleType::Mutation => "mutate",
        RuleType::Generation => "generate",
        RuleType::ImageVerify => "imageVerify",
        RuleType::Deletion => "deletion",
    }
}

fn status(s: Status) -> &'static str {
    s.as_str()
}

impl Metrics {
    /// Records a swap of the policy set: the rules now in force, and which policies were
    /// created, updated (their source changed) or deleted.
    pub fn policies_swapped(&self, old: &PolicySet, new: &PolicySet) {
        let mut rules = Vec::new();
        for p in new.policies() {
            let [mode, ty, bg, ns, name] = policy_labels(p);
            for r in &p.rules {
                let rt = match &r.body {
                    verno_engine::RuleBody::Validate(_) => "validate",
                    verno_engine::RuleBody::Mutate(_) => "mutate",
                    verno_engine::RuleBody::Generate(_) => "generate",
                    verno_engine::RuleBody::Unsupported { .. } | verno_engine::RuleBody::VerifyImages(_) => {
                        "imageVerify"
                    }
                    verno_engine::RuleBody::Cleanup(_) => "deletion",
                };
                rules.push([
                    mode.clone(),
                    ty.clone(),
                    bg.clone(),
                    ns.clone(),
                    name.clone(),
                    r.name.clone(),
                    rt.to_string(),
                    "true".to_string(),
                ]);
            }
        }
        match self.policy_info.rules.lock() {
            Ok(mut m) => *m = rules,
            Err(p) => *p.into_inner() = rules,
        }
        let key = |p: &verno_engine::CompiledPolicy| p.key();
        let source = |p: &verno_engine::CompiledPolicy| p.document.get("spec").cloned();
        let olds: HashMap<String, &verno_engine::CompiledPolicy> =
            old.policies().iter().map(|p| (key(p), p.as_ref())).collect();
        let news: HashMap<String, &verno_engine::CompiledPolicy> =
            new.policies().iter().map(|p| (key(p), p.as_ref())).collect();
        let mut changes = match self.policy_info.changes.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let mut count = |p: &verno_engine::CompiledPolicy, what: &str| {
            let [a, b, c, d, e] = policy_labels(p);
            *changes.entry([a, b, c, d, e, what.to_string()]).or_insert(0) += 1;
        };
        for (k, p) in &news {
            match olds.get(k) {
                None => count(p, "created"),
                Some(o) if source(o) != source(p) => count(p, "updated"),
                Some(_) => {}
            }
        }
        for (k, p) in &olds {
            if !news.contains_key(k) {
                count(p, "deleted");
            }
        }
    }

    /// A request label value as `t` counts it: its own copy of the value, or of
    /// [`OVERFLOW_LABEL`] once [`MAX_LABEL_VALUES`] other values are known. An overflowing
    /// value is not kept in the shard (so the shard stays bounded too): it asks every time.
    fn label(&self, labels: &mut FastMap<String, Arc<str>>, s: &str) -> Arc<str> {
        if let Some(a) = labels.get(s) {
            return a.clone();
        }
        let admitted = {
            let mut known = match self.known.lock() {
                Ok(k) => k,
                Err(p) => p.into_inner(),
            };
            known.contains(s) || (known.len() < MAX_LABEL_VALUES && known.insert(s.to_string()))
        };
        let key = if admitted { s } else { OVERFLOW_LABEL };
        Table::name(labels, key)
    }

    /// The label of a request operation (`CREATE` → `create`), as `t` counts it.
    fn operation(&self, t: &mut Table, op: &str) -> Arc<str> {
        if let Some(a) = t.operations.get(op) {
            return a.clone();
        }
        let label = self.label(&mut t.labels, &op.to_lowercase());
        // Kept for the few operations there are; other spellings (`Create`, `cReAtE`, …: as
        // many as a label has letters to case) are lowercased every time instead.
        if *label != *OVERFLOW_LABEL && t.operations.len() < MAX_OPERATIONS {
            t.operations.insert(op.to_string(), label.clone());
        }
        label
    }

    /// Records one reviewed request and its rule results; `set` evaluated it.
    pub fn observe(&self, webhook: &'static str, o: &Outcome, seconds: f64, dry_run: bool, set: &PolicySet) {
        let Some(mut guard) = self.tallies.mine() else { return };
        let t = &mut *guard;
        let kind = self.label(&mut t.labels, &o.kind);
        let ns = self.label(&mut t.labels, &o.namespace);
        let operation = self.operation(t, o.operation.as_str());
        let id = AdmissionId {
            names: [address(&kind), address(&ns), address(&operation)],
            allowed: o.allowed,
            webhook: (webhook.as_ptr() as usize, webhook.len()),
        };
        t.admission
            .entry(id)
            .or_insert_with(|| {
                let key = AdmissionKey {
                    kind: kind.clone(),
                    namespace: ns.clone(),
                    operation: operation.clone(),
                    allowed: o.allowed,
                    webhook,
                };
                (key, Durations::default())
            })
            .1
            .observe(seconds);
        let Table { names, policies, results, result_list, times, time_list, classes, .. } = t;
        let (mut class, bases) =
            match classes.class(set, ClassId { names: [address(&kind), address(&ns), address(&operation)], dry_run }) {
                Some((c, b)) => (Some(c), b),
                None => (None, &[][..]),
            };
        for r in &o.results {
            let (result, kind_of_rule) = (status(r.status), rule_type(r.rule_type));
            let place = match &r.rule {
                Ok(i) => place(bases, r.policy, *i, r.status),
                Err(_) => None,
            };
            // Known to this class: the series is counted by its place. (Its rule type is checked:
            // a rule's results are of its own type, but the place does not say so.)
            if let (Some(c), Some(slot)) = (class.as_deref(), place)
                && let Some(series) = known(&c.results, slot).and_then(|at| result_list.get_mut(at))
                && std::ptr::eq(series.0.rule_type, kind_of_rule)
            {
                series.1 += 1;
                continue;
            }
            let Some(meta) = set.meta(r.policy) else { continue };
            let Some(p) = Table::policy(policies, names, r.policy, meta) else { continue };
            let named;
            let rule = match &r.rule {
                Ok(i) => match p.rules.get(*i) {
                    Some(rule) => rule,
                    None => continue,
                },
                Err(name) => {
                    named = Table::name(names, name);
                    &named
                }
            };
            let id = ResultId::new(
                [r.enforce, meta.namespaced, meta.background, dry_run],
                [&p.namespace, &p.name, &kind, &ns, &operation, rule],
                [result, kind_of_rule, "admission_request"],
            );
            let at = count_result(results, result_list, id, || {
                let words = [result, kind_of_rule, "admission_request"];
                ResultKey::of(p, meta, [&kind, &ns, &operation], rule.clone(), [r.enforce, dry_run], words)
            });
            if let (Some(c), Some(slot)) = (class.as_deref_mut(), place) {
                learn(&mut c.results, slot, at);
            }
        }
        for &(i, secs) in &o.policy_seconds {
            if let Some(c) = class.as_deref()
                && let Some(series) = known(&c.times, i).and_then(|at| time_list.get_mut(at))
            {
                series.1.observe(secs);
                continue;
            }
            let Some(meta) = set.meta(i) else { continue };
            let Some(p) = Table::policy(policies, names, i, meta) else { continue };
            let id =
                TimeId { namespaced: meta.namespaced, names: [address(&p.name), address(&kind), address(&operation)] };
            let at = series_at(times, time_list, id, || {
                let key = TimeKey {
                    namespaced: meta.namespaced,
                    policy_name: p.name.clone(),
                    resource_kind: kind.clone(),
                    operation: operation.clone(),
                };
                (key, Durations::default())
            });
            if let Some(series) = time_list.get_mut(at) {
                series.1.observe(secs);
            }
            if let Some(c) = class.as_deref_mut() {
                learn(&mut c.times, i, at);
            }
        }
    }

    /// Records the rule results of one background scan evaluation of a `kind` object in
    /// `namespace` (`rule_execution_cause="background_scan"`, no request operation).
    pub fn observe_scan(&self, kind: &str, namespace: &str, set: &PolicySet, responses: &[(usize, PolicyResponse)]) {
        let Some(mut guard) = self.tallies.mine() else { return };
        let t = &mut *guard;
        let (kind, ns, operation) =
            (self.label(&mut t.labels, kind), self.label(&mut t.labels, namespace), self.label(&mut t.labels, ""));
        let Table { names, policies, results, result_list, .. } = t;
        for (i, r) in responses {
            let Some(meta) = set.meta(*i) else { continue };
            let Some(p) = Table::policy(policies, names, *i, meta) else { continue };
            for rr in &r.rules {
                let (rule, enforce) = match meta.rule_index(&rr.name) {
                    Some(j) => (p.rules.get(j).cloned(), meta.rules.get(j).is_some_and(|r| r.1)),
                    None => (None, false),
                };
                let rule = rule.unwrap_or_else(|| Table::name(names, &rr.name));
                let words = [status(rr.status), rule_type(rr.rule_type), "background_scan"];
                let key = ResultKey::of(p, meta, [&kind, &ns, &operation], rule, [enforce, false], words);
                count_result(results, result_list, key.id(), || key);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = match self.registry.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// Registers more metrics (another component's) to be served with these.
    pub fn register(&self, add: impl FnOnce(&mut Registry)) {
        match self.registry.lock() {
            Ok(mut g) => add(&mut g),
            Err(p) => add(&mut p.into_inner()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verno_engine::{Filter, Hook, PolicySet, Route};

    /// Label values came from requests without bound (20 000 namespaces made
    /// a 226 MB `/metrics`).
    #[test]
    fn request_label_values_are_bounded_with_an_overflow_label() {
        let metrics = Metrics::default();
        let set = PolicySet::default();
        for i in 0..20_000 {
            let review = serde_json::from_value(serde_json::json!({"request": {"uid": "u", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"}, "namespace": format!("ns-{i}"),
                "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": format!("ns-{i}")}}}}))
            .unwrap_or_default();
            let o = crate::admission::review(&set, Route::Kyverno(Hook::Validate, Filter::All), &review);
            metrics.observe("validate", &o, 0.001, false, &set);
        }
        let text = metrics.encode();
        assert!(text.contains("resource_namespace=\"_overflow\""));
        assert!(text.len() < 8 << 20, "{} bytes", text.len());
    }

    fn require_team() -> PolicySet {
        let doc = serde_json::json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "require-team"},
            "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "team",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"message": "team label", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}});
        match verno_engine::compile(&doc, &[]) {
            Ok(verno_engine::Compiled::Policy(p)) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
            _ => PolicySet::default(),
        }
    }

    /// A shard's classes never hold more places than the bound; past it they start again.
    #[test]
    fn the_classes_of_a_shard_hold_a_bounded_number_of_places() {
        let doc = serde_json::json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p"}, "spec": {"rules": [
                {"name": "a", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "m", "pattern": {"metadata": {"name": "?*"}}}},
                {"name": "b", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "m", "pattern": {"metadata": {"name": "?*"}}}}]}});
        let Ok(verno_engine::Compiled::Policy(p)) = verno_engine::compile(&doc, &[]) else {
            panic!("policy did not compile")
        };
        let set = PolicySet::new(vec![Arc::new(p)], Vec::new());
        // Two rules, and autogen's four for Pod controllers.
        let per_class = 6 * STATUSES + 1;
        let mut classes = Classes::default();
        let mut most = 0;
        // Far more classes (namespaces, say) than the bound holds: the places held never pass
        // it, and a class met again after they started over is numbered afresh (unlearned).
        for n in 0..3 * MAX_CLASS_PLACES / per_class {
            let id = ClassId { names: [n, 1, 2], dry_run: false };
            let (class, bases) = classes.class(&set, id).expect("a class");
            assert_eq!(bases, &[0, 6]);
            assert!(class.results.iter().all(|&x| x == 0), "class {n} came back learned");
            learn(&mut class.results, 0, 7);
            assert!(classes.held <= MAX_CLASS_PLACES, "{} places held", classes.held);
            most = most.max(classes.by_class.len());
        }
        assert_eq!(most, MAX_CLASS_PLACES / per_class);
        // A class still held keeps what it learned.
        let last = ClassId { names: [3 * MAX_CLASS_PLACES / per_class - 1, 1, 2], dry_run: false };
        let (class, _) = classes.class(&set, last).expect("a class");
        assert_eq!(known(&class.results, 0), Some(7));
    }

    /// Results are counted by their place in a class of requests (kind, namespace, operation,
    /// dry run) once a class has seen them: across classes, statuses and a reloaded set that
    /// numbers its policies the other way round, every series still counts exactly its own
    /// results (checked against a tally made from the outcomes themselves).
    #[test]
    fn results_counted_by_class_go_to_their_own_series_across_classes_and_renumbered_sets() {
        let compile = |doc: serde_json::Value| match verno_engine::compile(&doc, &[]) {
            Ok(verno_engine::Compiled::Policy(p)) => Arc::new(p),
            _ => panic!("policy did not compile"),
        };
        let team = compile(serde_json::json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "require-team"}, "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "team",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"message": "team label", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}}));
        let app = compile(serde_json::json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "require-app"}, "spec": {"rules": [
                {"name": "app", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "app label", "pattern": {"metadata": {"labels": {"app": "?*"}}}}},
                {"name": "tier", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "tier label", "pattern": {"metadata": {"labels": {"tier": "?*"}}}}}]}}));
        let sets = [
            PolicySet::new(vec![team.clone(), app.clone()], Vec::new()),
            PolicySet::new(vec![app.clone(), team.clone()], Vec::new()),
        ];
        let metrics = Metrics::default();
        let route = Route::Kyverno(Hook::Validate, Filter::All);
        let mut expected: BTreeMap<String, u64> = BTreeMap::new();
        let labels = [
            serde_json::json!({}),
            serde_json::json!({"team": "a"}),
            serde_json::json!({"app": "x", "tier": "t"}),
            serde_json::json!({"team": "a", "tier": "t"}),
        ];
        for n in 0..48usize {
            let set = &sets[n / 24];
            let ns = ["a", "b"][n % 2];
            let dry_run = n % 3 == 0;
            let review = serde_json::from_value(serde_json::json!({"request": {"uid": "u", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": ns,
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns,
                    "labels": labels[n % 4].clone()}}}}))
            .unwrap_or_default();
            let o = crate::admission::review(set, route.clone(), &review);
            for r in &o.results {
                let meta = set.meta(r.policy).expect("meta");
                let rule = match &r.rule {
                    Ok(i) => meta.rules[*i].0.to_string(),
                    Err(name) => name.to_string(),
                };
                let key = format!("{}/{rule} ns={ns} {} dry_run={dry_run}", meta.name, r.status.as_str());
                *expected.entry(key).or_insert(0) += 1;
            }
            metrics.observe("validate", &o, 0.001, dry_run, set);
        }
        let text = metrics.encode();
        let label = |l: &str, name: &str| {
            let start = l.find(&format!("{name}=\"")).map(|i| i + name.len() + 2)?;
            l.get(start..).and_then(|rest| rest.split('"').next()).map(str::to_string)
        };
        let mut counted: BTreeMap<String, u64> = BTreeMap::new();
        for l in text.lines().filter(|l| l.starts_with("kyverno_policy_results_total{")) {
            let [policy, rule, ns, result, dry_run] =
                ["policy_name", "rule_name", "resource_namespace", "rule_result", "dry_run"].map(|n| label(l, n));
            let v: u64 = l.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let key = format!(
                "{}/{} ns={} {} dry_run={}",
                policy.unwrap_or_default(),
                rule.unwrap_or_default(),
                ns.unwrap_or_default(),
                result.unwrap_or_default(),
                dry_run.unwrap_or_default()
            );
            *counted.entry(key).or_insert(0) += v;
        }
        assert!(expected.len() > 8, "{expected:?}");
        assert_eq!(counted, expected, "{text}");
        // Every policy's times: one series each (kind and operation are the same), 48 apiece.
        let times: Vec<&str> =
            text.lines().filter(|l| l.starts_with("kyverno_policy_execution_duration_seconds_count{")).collect();
        assert_eq!(times.len(), 2, "{text}");
        assert!(times.iter().all(|l| l.ends_with(" 48")), "{text}");
    }

    /// Series are found by their names' identity (no reference counting per lookup): the same
    /// result counts up one series, another result is its own series, and a reloaded set (new
    /// copies of the same names) adds to the same series in the exposition.
    #[test]
    fn rule_results_count_up_their_series_across_requests_and_reloads() {
        let metrics = Metrics::default();
        let pod = |labels: serde_json::Value| {
            serde_json::from_value(serde_json::json!({"request": {"uid": "u", "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "default",
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "labels": labels}}}}))
            .unwrap_or_default()
        };
        let route = Route::Kyverno(Hook::Validate, Filter::All);
        let (bad, good) = (pod(serde_json::json!({})), pod(serde_json::json!({"team": "a"})));
        let first = require_team();
        for review in [&bad, &bad, &good] {
            let o = crate::admission::review(&first, route.clone(), review);
            metrics.observe("validate", &o, 0.001, false, &first);
        }
        let reloaded = require_team();
        let o = crate::admission::review(&reloaded, route, &bad);
        metrics.observe("validate", &o, 0.001, false, &reloaded);
        let text = metrics.encode();
        let count = |result: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("kyverno_policy_results_total{") && l.contains(&format!("rule_result=\"{result}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        assert_eq!(count("fail").as_deref(), Some("3"), "{text}");
        assert_eq!(count("pass").as_deref(), Some("1"), "{text}");
        // The policy's evaluation times: one series for both sets, four observations.
        let times: Vec<&str> =
            text.lines().filter(|l| l.starts_with("kyverno_policy_execution_duration_seconds_count{")).collect();
        assert_eq!(times.len(), 1, "{text}");
        assert!(times.iter().all(|l| l.contains("policy_name=\"require-team\"") && l.ends_with(" 4")), "{text}");
        // The requests by verdict and webhook: one series per label set, counted up.
        let requests = |allowed: &str, webhook: &str| {
            let line = format!(
                "kyverno_admission_requests_total{{resource_kind=\"Pod\",resource_namespace=\"default\",resource_request_operation=\"create\",request_allowed=\"{allowed}\",request_webhook=\"{webhook}\"}} "
            );
            text.lines().find_map(|l| l.strip_prefix(line.as_str())).map(str::to_string)
        };
        assert_eq!(requests("false", "validate").as_deref(), Some("3"), "{text}");
        assert_eq!(requests("true", "validate").as_deref(), Some("1"), "{text}");
        let durations = text
            .lines()
            .filter(|l| {
                l.starts_with("kyverno_admission_review_duration_seconds_count{")
                    && l.contains("request_allowed=\"false\"")
            })
            .collect::<Vec<_>>();
        assert!(durations.len() == 1 && durations.iter().all(|l| l.ends_with(" 3")), "{text}");
        let o = crate::admission::review(&first, Route::Kyverno(Hook::Validate, Filter::All), &good);
        metrics.observe("mutate", &o, 0.001, false, &first);
        let text = metrics.encode();
        let requests = |webhook: &str| {
            let line = format!(
                "kyverno_admission_requests_total{{resource_kind=\"Pod\",resource_namespace=\"default\",resource_request_operation=\"create\",request_allowed=\"true\",request_webhook=\"{webhook}\"}} "
            );
            text.lines().find_map(|l| l.strip_prefix(line.as_str())).map(str::to_string)
        };
        assert_eq!(requests("mutate").as_deref(), Some("1"), "{text}");
        assert_eq!(requests("validate").as_deref(), Some("1"), "{text}");
    }

    fn pod_review(namespace: &str) -> verno_api::admission::AdmissionReview {
        serde_json::from_value(serde_json::json!({"request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": namespace,
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace}}}}))
        .unwrap_or_default()
    }

    /// The series kept in every shard: (admission, results, durations).
    fn series(metrics: &Metrics) -> (usize, usize, usize) {
        let mut n = (0, 0, 0);
        metrics.tallies.each(|t| {
            n.0 += t.admission.len();
            n.1 += t.results.len();
            n.2 += t.times.len();
        });
        n
    }

    /// Every policy change swaps in a new set with new copies of the policies' names; series
    /// were keyed by those copies, so each swap added a full set of series that were never
    /// dropped. The shards key them by their own copies, found again by text.
    #[test]
    fn reloading_the_policies_does_not_grow_the_series() {
        let metrics = Metrics::default();
        let review = pod_review("default");
        let route = Route::Kyverno(Hook::Validate, Filter::All);
        let count = |set: &PolicySet| {
            let o = crate::admission::review(set, route.clone(), &review);
            metrics.observe("validate", &o, 0.001, false, set);
        };
        let first = require_team();
        count(&first);
        let after_one = series(&metrics);
        assert_eq!(after_one, (1, 1, 1));
        for _ in 0..50 {
            count(&require_team());
        }
        assert_eq!(series(&metrics), after_one);
        let text = metrics.encode();
        assert!(text.contains("rule_result=\"fail\",rule_type=\"validate\",rule_execution_cause=\"admission_request\",dry_run=\"false\"} 51"), "{text}");
    }

    /// Threads count into their own shards; the exposition adds the shards up, series by
    /// series, histograms bucket by bucket.
    #[test]
    fn counts_from_several_threads_add_up_in_the_exposition() {
        let metrics = Metrics::default();
        let set = require_team();
        let review = pod_review("default");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        let o = crate::admission::review(&set, Route::Kyverno(Hook::Validate, Filter::All), &review);
                        metrics.observe("validate", &o, 0.0002, false, &set);
                    }
                });
            }
        });
        let text = metrics.encode();
        let value = |prefix: &str| {
            let found: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
            assert_eq!(found.len(), 1, "{prefix}: {text}");
            found.first().and_then(|l| l.rsplit(' ').next()).map(str::to_string)
        };
        assert_eq!(value("kyverno_admission_requests_total{").as_deref(), Some("100"));
        assert_eq!(value("kyverno_policy_results_total{").as_deref(), Some("100"));
        assert_eq!(value("kyverno_policy_execution_duration_seconds_count{").as_deref(), Some("100"));
        assert_eq!(value("kyverno_admission_review_duration_seconds_count{").as_deref(), Some("100"));
        // 0.0002 s is in the bucket of 0.0002 and every one above it, not in those below.
        assert_eq!(
            value("kyverno_admission_review_duration_seconds_bucket{le=\"0.0002\"").as_deref(),
            Some("100"),
            "{text}"
        );
        assert_eq!(
            value("kyverno_admission_review_duration_seconds_bucket{le=\"0.0001\"").as_deref(),
            Some("0"),
            "{text}"
        );
        assert_eq!(
            value("kyverno_admission_review_duration_seconds_bucket{le=\"+Inf\"").as_deref(),
            Some("100"),
            "{text}"
        );
    }
}
