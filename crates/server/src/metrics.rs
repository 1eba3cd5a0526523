//! Prometheus metrics with Kyverno's names and labels, so its Grafana dashboard works.

use crate::admission::{Outcome, RuleResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use verno_engine::{RuleType, Status};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    resource_kind: String,
    resource_namespace: String,
    resource_request_operation: String,
    request_allowed: String,
    request_webhook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy_validation_mode: String,
    policy_type: String,
    policy_background_mode: String,
    policy_namespace: String,
    policy_name: String,
    resource_kind: String,
    resource_namespace: String,
    resource_request_operation: String,
    rule_name: String,
    rule_result: String,
    rule_type: String,
    rule_execution_cause: String,
    dry_run: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyTimeLabels {
    policy_type: String,
    policy_name: String,
    resource_kind: String,
    resource_request_operation: String,
    rule_execution_cause: String,
}

fn duration_histogram() -> Histogram {
    // 50 µs … ~1.6 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<AdmissionLabels, Counter>,
    review_duration: Family<AdmissionLabels, Histogram>,
    results: Family<PolicyLabels, Counter>,
    policy_duration: Family<PolicyTimeLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<AdmissionLabels, Counter>::default();
        let review_duration = Family::<AdmissionLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        let results = Family::<PolicyLabels, Counter>::default();
        let policy_duration = Family::<PolicyTimeLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        registry.register("kyverno_admission_requests", "Admission requests reviewed", requests.clone());
        registry.register("kyverno_admission_review_duration_seconds", "Time to review an admission request", review_duration.clone());
        registry.register("kyverno_policy_results", "Rule results of policies applied to admission requests", results.clone());
        registry.register("kyverno_policy_execution_duration_seconds", "Time to evaluate one policy on a request", policy_duration.clone());
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
    pub fn observe(&self, webhook: &str, o: &Outcome, seconds: f64, dry_run: bool, policy_seconds: &[(String, bool, f64)]) {
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
        for r in &o.results {
            self.results.get_or_create(&self.policy_labels(r, o, &op, dry_run)).inc();
        }
        for (name, namespaced, secs) in policy_seconds {
            let l = PolicyTimeLabels {
                policy_type: if *namespaced { "namespaced" } else { "cluster" }.into(),
                policy_name: name.clone(),
                resource_kind: o.kind.clone(),
                resource_request_operation: op.clone(),
                rule_execution_cause: "admission_request".into(),
            };
            self.policy_duration.get_or_create(&l).observe(*secs);
        }
    }

    fn policy_labels(&self, r: &RuleResult, o: &Outcome, op: &str, dry_run: bool) -> PolicyLabels {
        let (ns, name) = match r.policy.split_once('/') {
            Some((ns, n)) if r.namespaced => (ns.to_string(), n.to_string()),
            _ => (String::new(), r.policy.clone()),
        };
        PolicyLabels {
            policy_validation_mode: if r.enforce { "enforce" } else { "audit" }.into(),
            policy_type: if r.namespaced { "namespaced" } else { "cluster" }.into(),
            policy_background_mode: r.background.to_string(),
            policy_namespace: ns,
            policy_name: name,
            resource_kind: o.kind.clone(),
            resource_namespace: o.namespace.clone(),
            resource_request_operation: op.to_string(),
            rule_name: r.rule.clone(),
            rule_result: status(r.status).into(),
            rule_type: rule_type(r.rule_type).into(),
            rule_execution_cause: "admission_request".into(),
            dry_run: dry_run.to_string(),
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
