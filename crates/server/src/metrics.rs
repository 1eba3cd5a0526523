//! Prometheus metrics with Kyverno's names and labels, so its Grafana dashboard works.

use crate::admission::{Outcome, PolicyMeta};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use verno_engine::{RuleType, Status};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    resource_kind: String,
    resource_namespace: String,
    resource_request_operation: String,
    request_allowed: String,
    request_webhook: String,
}

/// One `kyverno_policy_results_total` series. Names are shared `Arc<str>`s, so counting a
/// rule result allocates nothing; labels are spelled out only when Prometheus scrapes.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct ResultKey {
    enforce: bool,
    namespaced: bool,
    background: bool,
    policy_namespace: Arc<str>,
    policy_name: Arc<str>,
    resource_kind: Arc<str>,
    resource_namespace: Arc<str>,
    operation: Arc<str>,
    rule_name: Arc<str>,
    rule_result: &'static str,
    rule_type: &'static str,
    dry_run: bool,
}

#[derive(Debug, Default)]
struct Results(Mutex<HashMap<ResultKey, u64>>);

impl Collector for Results {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot: Vec<(ResultKey, u64)> = match self.0.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Err(p) => p.into_inner().iter().map(|(k, v)| (k.clone(), *v)).collect(),
        };
        let mut family = encoder.encode_descriptor("kyverno_policy_results", "Rule results of policies applied to admission requests", None, MetricType::Counter)?;
        for (k, v) in &snapshot {
            let b = |x: bool| if x { "true" } else { "false" };
            let labels: [(&str, &str); 13] = [
                ("policy_validation_mode", if k.enforce { "enforce" } else { "audit" }),
                ("policy_type", if k.namespaced { "namespaced" } else { "cluster" }),
                ("policy_background_mode", b(k.background)),
                ("policy_namespace", &k.policy_namespace),
                ("policy_name", &k.policy_name),
                ("resource_kind", &k.resource_kind),
                ("resource_namespace", &k.resource_namespace),
                ("resource_request_operation", &k.operation),
                ("rule_name", &k.rule_name),
                ("rule_result", k.rule_result),
                ("rule_type", k.rule_type),
                ("rule_execution_cause", "admission_request"),
                ("dry_run", b(k.dry_run)),
            ];
            ConstCounter::new(*v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// One `kyverno_policy_execution_duration_seconds` series, kept like [`ResultKey`].
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TimeKey {
    namespaced: bool,
    policy_name: Arc<str>,
    resource_kind: Arc<str>,
    operation: Arc<str>,
}

#[derive(Debug, Default)]
struct Times(Mutex<HashMap<TimeKey, Histogram>>);

impl Collector for Times {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot: Vec<(TimeKey, Histogram)> = match self.0.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Err(p) => p.into_inner().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let mut family = encoder.encode_descriptor("kyverno_policy_execution_duration_seconds", "Time to evaluate one policy on a request", None, MetricType::Histogram)?;
        for (k, h) in &snapshot {
            let labels: [(&str, &str); 5] = [
                ("policy_type", if k.namespaced { "namespaced" } else { "cluster" }),
                ("policy_name", &k.policy_name),
                ("resource_kind", &k.resource_kind),
                ("resource_request_operation", &k.operation),
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

pub struct Metrics {
    registry: Registry,
    requests: Family<AdmissionLabels, Counter>,
    review_duration: Family<AdmissionLabels, Histogram>,
    results: Arc<Results>,
    policy_duration: Arc<Times>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<AdmissionLabels, Counter>::default();
        let review_duration = Family::<AdmissionLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        let results = Arc::new(Results::default());
        let policy_duration = Arc::new(Times::default());
        registry.register("kyverno_admission_requests", "Admission requests reviewed", requests.clone());
        registry.register("kyverno_admission_review_duration_seconds", "Time to review an admission request", review_duration.clone());
        registry.register_collector(Box::new(results.clone()));
        registry.register_collector(Box::new(policy_duration.clone()));
        Metrics { registry, requests, review_duration, results, policy_duration }
    }
}

fn rule_type(t: RuleType) -> &'static str {
    match t {
        RuleType::Validation => "validate",
        RuleType::Mutation => "mutate",
        RuleType::Generation => "generate",
        RuleType::ImageVerify => "imageVerify",
    }
}

fn status(s: Status) -> &'static str {
    s.as_str()
}

impl Metrics {
    /// Records one reviewed request and its rule results.
    pub fn observe(&self, webhook: &str, o: &Outcome, seconds: f64, dry_run: bool, policy_seconds: &[(Arc<PolicyMeta>, f64)]) {
        let op = o.operation.to_lowercase();
        let labels = AdmissionLabels {
            resource_kind: o.kind.clone(),
            resource_namespace: o.namespace.clone(),
            resource_request_operation: op.clone(),
            request_allowed: o.allowed.to_string(),
            request_webhook: webhook.to_string(),
        };
        self.requests.get_or_create(&labels).inc();
        self.review_duration.get_or_create(&labels).observe(seconds);
        let kind: Arc<str> = Arc::from(o.kind.as_str());
        let operation: Arc<str> = Arc::from(op.as_str());
        if !o.results.is_empty() {
            let ns: Arc<str> = Arc::from(o.namespace.as_str());
            let mut map = match self.results.0.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for r in &o.results {
                let key = ResultKey {
                    enforce: r.enforce,
                    namespaced: r.policy.namespaced,
                    background: r.policy.background,
                    policy_namespace: r.policy.namespace.clone(),
                    policy_name: r.policy.name.clone(),
                    resource_kind: kind.clone(),
                    resource_namespace: ns.clone(),
                    operation: operation.clone(),
                    rule_name: r.rule.clone(),
                    rule_result: status(r.status),
                    rule_type: rule_type(r.rule_type),
                    dry_run,
                };
                *map.entry(key).or_insert(0) += 1;
            }
        }
        if !policy_seconds.is_empty() {
            let mut map = match self.policy_duration.0.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for (m, secs) in policy_seconds {
                let key = TimeKey { namespaced: m.namespaced, policy_name: m.name.clone(), resource_kind: kind.clone(), operation: operation.clone() };
                map.entry(key).or_insert_with(duration_histogram).observe(*secs);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
