//! Prometheus metrics with Kyverno's names and labels, so its Grafana dashboard works.

use crate::admission::Outcome;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use verno_engine::{PolicyResponse, PolicySet};
use verno_engine::{RuleType, Status};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    resource_kind: String,
    resource_namespace: String,
    resource_request_operation: String,
    request_allowed: String,
    request_webhook: String,
}

/// A shared name compared by identity: hashing a pointer instead of the text keeps counting a
/// rule result cheap. Equal texts behind different pointers (after a policy reload) are merged
/// when the series are spelled out at scrape time.
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

impl ResultKey {
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

/// A [`ResultKey`] without the references: looking a series up (every rule result of every
/// request) takes no reference counts — on two threads those were shared cache lines bouncing
/// between the cores. The map's value keeps the key, so its names stay alive and no other name
/// can take their addresses while the series exists.
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

/// An admission request's label set by its interned names' addresses (kind, namespace,
/// operation; never removed from the table, so an address names one text), the verdict and the
/// webhook's `'static` name (address and length).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct AdmissionId {
    names: [usize; 3],
    allowed: bool,
    webhook: (usize, usize),
}

/// Looks up a series by a key's identity and adds one, building the key (with its references)
/// only for a new series.
fn count_result(map: &mut FastMap<ResultId, (ResultKey, u64)>, id: ResultId, key: impl FnOnce() -> ResultKey) {
    map.entry(id).or_insert_with(|| (key(), 0)).1 += 1;
}

#[derive(Debug, Default)]
struct Results(Mutex<FastMap<ResultId, (ResultKey, u64)>>);

/// The address of `s`'s shared copy (made if need be), without taking a reference: it
/// identifies the name while the table keeps it (names are never removed).
fn interned_address(names: &mut FastMap<String, Arc<str>>, s: &str) -> usize {
    match names.get(s) {
        Some(a) => address(a),
        None => address(&intern_in(names, s)),
    }
}

fn address(a: &Arc<str>) -> usize {
    Arc::as_ptr(a) as *const u8 as usize
}

/// [`Metrics::intern`] with the table already locked (one lock for a request's policies).
fn intern_in(names: &mut FastMap<String, Arc<str>>, s: &str) -> Arc<str> {
    if let Some(a) = names.get(s) {
        return a.clone();
    }
    let key = if names.len() >= MAX_LABEL_VALUES { OVERFLOW_LABEL } else { s };
    if let Some(a) = names.get(key) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(key);
    names.insert(key.to_string(), a.clone());
    a
}

/// The series maps are looked up for every rule result of every request: keys hash by pointer
/// and flags, so a fast non-cryptographic hasher (foldhash, randomly seeded) fits; SipHash was
/// a visible part of a request's cost.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

impl Collector for Results {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let b = |x: bool| if x { "true" } else { "false" };
        // Spell out and merge series by their label text.
        let mut series: std::collections::BTreeMap<[String; 13], u64> = std::collections::BTreeMap::new();
        {
            let map = match self.0.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for (k, v) in map.values() {
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
                *series.entry(labels).or_insert(0) += v;
            }
        }
        const NAMES: [&str; 13] = [
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
        for (values, v) in &series {
            let labels: Vec<(&str, &str)> = NAMES.iter().copied().zip(values.iter().map(String::as_str)).collect();
            ConstCounter::new(*v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// One `kyverno_policy_execution_duration_seconds` series, kept like [`ResultKey`].
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TimeKey {
    namespaced: bool,
    policy_name: Name,
    resource_kind: Name,
    operation: Name,
}

/// A [`TimeKey`] by its names' addresses (see [`ResultId`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct TimeId {
    namespaced: bool,
    names: [usize; 3],
}

#[derive(Debug, Default)]
struct Times(Mutex<FastMap<TimeId, (TimeKey, Histogram)>>);

impl Collector for Times {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot: Vec<(TimeKey, Histogram)> = match self.0.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(p) => p.into_inner().values().cloned().collect(),
        };
        let mut family = encoder.encode_descriptor(
            "kyverno_policy_execution_duration_seconds",
            "Time to evaluate one policy on a request",
            None,
            MetricType::Histogram,
        )?;
        for (k, h) in &snapshot {
            let labels: [(&str, &str); 5] = [
                ("policy_type", if k.namespaced { "namespaced" } else { "cluster" }),
                ("policy_name", &k.policy_name.0),
                ("resource_kind", &k.resource_kind.0),
                ("resource_request_operation", &k.operation.0),
                ("rule_execution_cause", "admission_request"),
            ];
            h.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn duration_histogram() -> Histogram {
    // 50 µs … ~1.6 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// `kyverno_policy_rule_info_total` (one series per rule in force) and
/// `kyverno_policy_changes_total` (policies created, updated, deleted), kept on set swaps.
#[derive(Debug, Default)]
struct PolicyInfo {
    rules: Mutex<Vec<[String; 8]>>,
    changes: Mutex<HashMap<[String; 6], u64>>,
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
/// The label value of everything past [`MAX_LABEL_VALUES`].
pub const OVERFLOW_LABEL: &str = "_overflow";

pub struct Metrics {
    registry: Registry,
    policy_info: Arc<PolicyInfo>,
    /// Resource kinds, namespaces and operations seen, shared so keys compare by pointer.
    names: Mutex<FastMap<String, Arc<str>>>,
    requests: Family<AdmissionLabels, Counter>,
    review_duration: Family<AdmissionLabels, Histogram>,
    /// The two admission series of a label set, found by the names' addresses: a request
    /// neither spells its labels out nor hashes their text (see [`ResultId`]).
    admission: Mutex<FastMap<AdmissionId, (Counter, Histogram)>>,
    results: Arc<Results>,
    policy_duration: Arc<Times>,
    /// Violation events not handed to the controller because its queue was full.
    pub events_dropped: Counter,
    /// Admission results not written into PolicyReports: the report queue was full, or the
    /// object never appeared.
    pub reports_dropped: Counter,
    /// Admission results waiting to be written into PolicyReports.
    pub reports_backlog: prometheus_client::metrics::gauge::Gauge,
    /// PolicyReport creates, replaces and deletes, and their request bytes.
    pub report_writes: Counter,
    pub report_write_bytes: Counter,
    /// Objects whose background scan results wait to be written.
    pub scan_backlog: prometheus_client::metrics::gauge::Gauge,
    /// Triggers the background controller has yet to work on (generate, mutate-existing).
    pub background_backlog: prometheus_client::metrics::gauge::Gauge,
    /// Triggers the background controller worked on, by result (`done`, `failed`).
    pub background_work: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Kyverno's cleanup counters: `[cleanup, deleting, ttl]` × `[deleted objects, errors]`.
    pub cleanup: [[CleanupFamily; 2]; 3],
    /// `kyverno_ttl_controller_info`: 1 per resource the TTL controller watches.
    pub ttl_info: Family<Vec<(&'static str, String)>, prometheus_client::metrics::gauge::Gauge>,
}

/// A cleanup counter family, labelled as Kyverno labels it.
pub type CleanupFamily = Family<Vec<(&'static str, String)>, Counter>;

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<AdmissionLabels, Counter>::default();
        let review_duration =
            Family::<AdmissionLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        let results = Arc::new(Results::default());
        let policy_duration = Arc::new(Times::default());
        registry.register("kyverno_admission_requests", "Admission requests reviewed", requests.clone());
        registry.register(
            "kyverno_admission_review_duration_seconds",
            "Time to review an admission request",
            review_duration.clone(),
        );
        registry.register_collector(Box::new(results.clone()));
        registry.register_collector(Box::new(policy_duration.clone()));
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
        let reports_backlog = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "verno_reports_backlog",
            "Admission results waiting to be written into PolicyReports",
            reports_backlog.clone(),
        );
        let report_writes = Counter::default();
        registry.register(
            "verno_report_writes",
            "PolicyReport creates, replaces and deletes (admission results and background scans)",
            report_writes.clone(),
        );
        let report_write_bytes = Counter::default();
        registry.register(
            "verno_report_write_bytes",
            "Request bytes of PolicyReport writes",
            report_write_bytes.clone(),
        );
        let scan_backlog = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "verno_background_scan_backlog",
            "Objects whose background scan results wait to be written (failed or paced writes)",
            scan_backlog.clone(),
        );
        let background_backlog = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "verno_background_backlog",
            "Triggers whose generate or mutate-existing work waits (queued or backing off)",
            background_backlog.clone(),
        );
        let background_work = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
        registry.register(
            "verno_background_work",
            "Triggers the background controller converged (result=done) or failed to (result=failed)",
            background_work.clone(),
        );
        let family = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<Vec<(&'static str, String)>, Counter>::default();
            registry.register(name, help, f.clone());
            f
        };
        let cleanup = [
            [
                family(
                    &mut registry,
                    "kyverno_cleanup_controller_deletedobjects",
                    "Objects deleted by cleanup policies",
                ),
                family(&mut registry, "kyverno_cleanup_controller_errors", "Objects cleanup policies failed to delete"),
            ],
            [
                family(
                    &mut registry,
                    "kyverno_deleting_controller_deletedobjects",
                    "Objects deleted by deleting policies",
                ),
                family(
                    &mut registry,
                    "kyverno_deleting_controller_errors",
                    "Objects deleting policies failed to delete",
                ),
            ],
            [
                family(
                    &mut registry,
                    "kyverno_ttl_controller_deletedobjects",
                    "Objects deleted for their cleanup.kyverno.io/ttl label",
                ),
                family(
                    &mut registry,
                    "kyverno_ttl_controller_errors",
                    "Objects whose cleanup.kyverno.io/ttl deletion failed",
                ),
            ],
        ];
        let ttl_info = Family::<Vec<(&'static str, String)>, prometheus_client::metrics::gauge::Gauge>::default();
        registry.register("kyverno_ttl_controller_info", "Resources the TTL controller watches", ttl_info.clone());
        Metrics {
            registry,
            cleanup,
            ttl_info,
            background_backlog,
            background_work,
            policy_info,
            names: Mutex::new(FastMap::default()),
            requests,
            review_duration,
            admission: Mutex::new(FastMap::default()),
            results,
            policy_duration,
            events_dropped,
            reports_dropped,
            reports_backlog,
            report_writes,
            report_write_bytes,
            scan_backlog,
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

    /// Records one reviewed request and its rule results; `set` evaluated it.
    pub fn observe(&self, webhook: &'static str, o: &Outcome, seconds: f64, dry_run: bool, set: &PolicySet) {
        let op = o.operation.to_lowercase();
        let (kind, operation, ns) = {
            let mut names = match self.names.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            (intern_in(&mut names, &o.kind), intern_in(&mut names, &op), intern_in(&mut names, &o.namespace))
        };
        {
            let id = AdmissionId {
                names: [address(&kind), address(&ns), address(&operation)],
                allowed: o.allowed,
                webhook: (webhook.as_ptr() as usize, webhook.len()),
            };
            let mut series = match self.admission.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            let (count, duration) = series.entry(id).or_insert_with(|| {
                let labels = AdmissionLabels {
                    resource_kind: kind.to_string(),
                    resource_namespace: ns.to_string(),
                    resource_request_operation: operation.to_string(),
                    request_allowed: o.allowed.to_string(),
                    request_webhook: webhook.to_string(),
                };
                (self.requests.get_or_create(&labels).clone(), self.review_duration.get_or_create(&labels).clone())
            });
            count.inc();
            duration.observe(seconds);
        }
        if !o.results.is_empty() {
            let mut map = match self.results.0.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for r in &o.results {
                let Some((policy, rule)) = r.names(set) else { continue };
                let (result, kind_of_rule) = (status(r.status), rule_type(r.rule_type));
                let id = ResultId::new(
                    [r.enforce, policy.namespaced, policy.background, dry_run],
                    [&policy.namespace, &policy.name, &kind, &ns, &operation, rule],
                    [result, kind_of_rule, "admission_request"],
                );
                count_result(&mut map, id, || ResultKey {
                    enforce: r.enforce,
                    namespaced: policy.namespaced,
                    background: policy.background,
                    policy_namespace: Name(policy.namespace.clone()),
                    policy_name: Name(policy.name.clone()),
                    resource_kind: Name(kind.clone()),
                    resource_namespace: Name(ns.clone()),
                    operation: Name(operation.clone()),
                    rule_name: Name(rule.clone()),
                    rule_result: result,
                    rule_type: kind_of_rule,
                    dry_run,
                    cause: "admission_request",
                });
            }
        }
        if !o.policy_seconds.is_empty() {
            let mut names = match self.names.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            let mut map = match self.policy_duration.0.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for &(i, secs) in &o.policy_seconds {
                let Some(m) = set.meta(i) else { continue };
                // Series found by the names' addresses; the key (with references) is made only
                // for a new series.
                let id = TimeId {
                    namespaced: m.namespaced,
                    names: [interned_address(&mut names, &m.name), address(&kind), address(&operation)],
                };
                map.entry(id)
                    .or_insert_with(|| {
                        let key = TimeKey {
                            namespaced: m.namespaced,
                            policy_name: Name(intern_in(&mut names, &m.name)),
                            resource_kind: Name(kind.clone()),
                            operation: Name(operation.clone()),
                        };
                        (key, duration_histogram())
                    })
                    .1
                    .observe(secs);
            }
        }
    }

    /// Records the rule results of one background scan evaluation of a `kind` object in
    /// `namespace` (`rule_execution_cause="background_scan"`, no request operation).
    pub fn observe_scan(&self, kind: &str, namespace: &str, set: &PolicySet, responses: &[(usize, PolicyResponse)]) {
        let (kind, ns, operation) = (self.intern(kind), self.intern(namespace), self.intern(""));
        let mut map = match self.results.0.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        for (i, r) in responses {
            let Some(m) = set.meta(*i) else { continue };
            for rr in &r.rules {
                let (rule, enforce) = m.rule(&rr.name);
                let key = ResultKey {
                    enforce,
                    namespaced: m.namespaced,
                    background: m.background,
                    policy_namespace: Name(m.namespace.clone()),
                    policy_name: Name(m.name.clone()),
                    resource_kind: Name(kind.clone()),
                    resource_namespace: Name(ns.clone()),
                    operation: Name(operation.clone()),
                    rule_name: Name(rule),
                    rule_result: status(rr.status),
                    rule_type: rule_type(rr.rule_type),
                    dry_run: false,
                    cause: "background_scan",
                };
                count_result(&mut map, key.id(), || key);
            }
        }
    }

    /// The one shared copy of a name, so series keys compare by pointer.
    /// Bounded: past [`MAX_LABEL_VALUES`] distinct values, a new one is counted as
    /// [`OVERFLOW_LABEL`], so requests (any kind, namespace or operation a caller makes up)
    /// cannot grow `/metrics` without bound.
    fn intern(&self, s: &str) -> Arc<str> {
        let mut names = match self.names.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        intern_in(&mut names, s)
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verno_engine::{Filter, Hook, PolicySet, Route};

    /// Issue 14, item 9: label values came from requests without bound (20 000 namespaces made
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
}
