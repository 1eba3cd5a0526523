//! The controllers' own metrics: made once, registered in the registry the admission server
//! serves at `/metrics` ([`Metrics::register`]), and counted by the controllers directly — a
//! new controller metric is declared here and nowhere else.
//!
//! Two counters are the admission server's as well (it drops notices and report results when
//! its queues are full): [`Metrics::new`] takes the server's handles to them, so each is one
//! series whoever counts.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A cleanup counter family, labelled as Kyverno labels it.
pub type CleanupFamily = Family<Vec<(&'static str, String)>, Counter>;

/// Kyverno's three families of cleanup metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupCounter {
    /// `kyverno_cleanup_controller_*` (CleanupPolicy, ClusterCleanupPolicy).
    Cleanup,
    /// `kyverno_deleting_controller_*` (DeletingPolicy, NamespacedDeletingPolicy).
    Deleting,
    /// `kyverno_ttl_controller_*` (the `cleanup.kyverno.io/ttl` label).
    Ttl,
}

/// Every controller metric (cheap to clone: handles to shared values).
#[derive(Clone, Default)]
pub struct Metrics {
    /// Events not written: the queue or the pace was exceeded (shared with the server).
    events_dropped: Counter,
    /// Admission results not written into reports (shared with the server).
    reports_dropped: Counter,
    reports_backlog: Gauge,
    report_writes: Counter,
    report_write_bytes: Counter,
    report_write_failures: Counter,
    scan_backlog: Gauge,
    background_backlog: Gauge,
    background_work: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// `[cleanup, deleting, ttl]` × `[deleted objects, errors]`.
    cleanup: [[CleanupFamily; 2]; 3],
    ttl_info: Family<Vec<(&'static str, String)>, Gauge>,
}

impl Metrics {
    /// The controllers' metrics, counting dropped events and report results into the server's
    /// counters.
    pub fn new(events_dropped: Counter, reports_dropped: Counter) -> Metrics {
        Metrics { events_dropped, reports_dropped, ..Metrics::default() }
    }

    /// Registers every metric but the two counters that are the server's.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "verno_reports_backlog",
            "Admission results waiting to be written into PolicyReports",
            self.reports_backlog.clone(),
        );
        registry.register(
            "verno_report_writes",
            "PolicyReport creates, replaces and deletes (admission results and background scans)",
            self.report_writes.clone(),
        );
        registry.register(
            "verno_report_write_bytes",
            "Request bytes of PolicyReport writes",
            self.report_write_bytes.clone(),
        );
        registry.register(
            "verno_report_write_failures",
            "PolicyReport writes the API server refused (retried per object with backoff)",
            self.report_write_failures.clone(),
        );
        registry.register(
            "verno_background_scan_backlog",
            "Objects whose background scan results wait to be written (failed or paced writes)",
            self.scan_backlog.clone(),
        );
        registry.register(
            "verno_background_backlog",
            "Triggers whose generate or mutate-existing work waits (queued or backing off)",
            self.background_backlog.clone(),
        );
        registry.register(
            "verno_background_work",
            "Triggers the background controller converged (result=done) or failed to (result=failed)",
            self.background_work.clone(),
        );
        let names = [
            ("cleanup", "Objects deleted by cleanup policies", "Objects cleanup policies failed to delete"),
            ("deleting", "Objects deleted by deleting policies", "Objects deleting policies failed to delete"),
            (
                "ttl",
                "Objects deleted for their cleanup.kyverno.io/ttl label",
                "Objects whose cleanup.kyverno.io/ttl deletion failed",
            ),
        ];
        for ((name, deleted, errors), [ok, failed]) in names.into_iter().zip(&self.cleanup) {
            registry.register(format!("kyverno_{name}_controller_deletedobjects"), deleted, ok.clone());
            registry.register(format!("kyverno_{name}_controller_errors"), errors, failed.clone());
        }
        registry.register("kyverno_ttl_controller_info", "Resources the TTL controller watches", self.ttl_info.clone());
    }

    /// An event was not written (queue full or pace exceeded).
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// Admission results were not written into a report.
    pub fn report_dropped(&self) {
        self.reports_dropped.inc();
    }

    /// Admission results waiting to be written into reports.
    pub fn set_report_backlog(&self, n: usize) {
        self.reports_backlog.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One report write (admission results or a scan) and its request bytes.
    pub fn report_written(&self, bytes: u64) {
        self.report_writes.inc();
        self.report_write_bytes.inc_by(bytes);
    }

    /// A report write the API server refused (retried with backoff).
    pub fn report_write_failed(&self) {
        self.report_write_failures.inc();
    }

    /// Objects whose background scan results wait to be written.
    pub fn set_scan_backlog(&self, n: usize) {
        self.scan_backlog.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Triggers waiting for the background controller.
    pub fn set_background_backlog(&self, n: usize) {
        self.background_backlog.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One trigger converged (`true`) or failed (`false`) by the background controller.
    pub fn background_work(&self, ok: bool) {
        let result = if ok { "done" } else { "failed" };
        self.background_work.get_or_create(&vec![("result", result)]).inc();
    }

    /// One object deleted (`ok`) or not by the cleanup or TTL controller, with Kyverno's labels.
    pub fn cleanup_counted(&self, counter: CleanupCounter, ok: bool, labels: Vec<(&'static str, String)>) {
        let [deleted, failed] = match counter {
            CleanupCounter::Cleanup => &self.cleanup[0],
            CleanupCounter::Deleting => &self.cleanup[1],
            CleanupCounter::Ttl => &self.cleanup[2],
        };
        let family = if ok { deleted } else { failed };
        family.get_or_create(&labels).inc();
    }

    /// The resources (group, version, resource) the TTL controller watches (Kyverno's
    /// `kyverno_ttl_controller_info`).
    pub fn set_ttl_watched(&self, resources: Vec<(String, String, String)>) {
        self.ttl_info.clear();
        for (g, v, r) in resources {
            self.ttl_info
                .get_or_create(&vec![("resource_group", g), ("resource_version", v), ("resource_resource", r)])
                .set(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controllers_metrics_are_served_with_kyverno_names() {
        let events = Counter::default();
        let m = Metrics::new(events.clone(), Counter::default());
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.event_dropped();
        m.report_written(10);
        m.cleanup_counted(CleanupCounter::Ttl, false, vec![("resource_kind", "Pod".into())]);
        m.set_ttl_watched(vec![("".into(), "v1".into(), "configmaps".into())]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert_eq!(events.get(), 1, "the server's counter counts the controllers' drops");
        assert!(text.contains("verno_report_write_bytes_total 10"), "{text}");
        assert!(text.contains("kyverno_ttl_controller_errors_total{resource_kind=\"Pod\"} 1"), "{text}");
        assert!(text.contains("kyverno_ttl_controller_info{resource_group=\"\",resource_version=\"v1\",resource_resource=\"configmaps\"} 1"), "{text}");
        assert!(!text.contains("verno_events_dropped"), "the server registers its own counters: {text}");
    }
}
