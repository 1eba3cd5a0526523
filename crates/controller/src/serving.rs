//! The controller's port to the admission server it feeds. The controller knows the cluster;
//! the server knows HTTPS; neither depends on the other. The binary (`verno serve --kube`)
//! puts a server behind this trait and hands it to [`crate::start`].

use std::sync::Arc;
use verno_engine::{Notice, PolicyResponse, PolicySet};

pub use verno_api::ReadyPart;

/// What the controller asks of the admission server.
pub trait Serving: Send + Sync + 'static {
    /// Puts a new policy set in force (swapped whole).
    fn install(&self, set: PolicySet);
    /// The set in force now.
    fn current(&self) -> Arc<PolicySet>;
    /// Serves with this certificate from now on; an unusable pair is refused and the previous
    /// one kept.
    fn set_certificate(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
    /// Marks a part of readiness done (or not).
    fn set_ready(&self, part: ReadyPart, done: bool);
    /// Where the server hands failed rules and applied policies for events (bounded; the
    /// server never waits).
    fn report_events(&self, tx: tokio::sync::mpsc::Sender<Notice>);
    /// Where the server hands admission results for PolicyReports (bounded; the server never
    /// waits).
    fn report_results(&self, tx: tokio::sync::mpsc::Sender<verno_engine::report::ReportNotice>);
    /// Remembers the requests `user` (the background controller's account) makes.
    fn set_background_user(&self, user: String) {
        let _ = user;
    }
    /// Whether the background controller's account made the change of the object `uid` from
    /// `resource_version` (empty: its creation), as its admission request showed.
    fn made_by_background(&self, uid: &str, resource_version: &str) -> bool {
        let _ = (uid, resource_version);
        false
    }
    /// Results a controller produced for a resource's report, written as admission results
    /// are (nothing when admission reports are off).
    fn submit_report(&self, notice: verno_engine::report::ReportNotice) {
        let _ = notice;
    }
    /// The requests to admit unevaluated, from Kyverno's ConfigMap.
    fn set_request_filters(&self, filters: verno_engine::filters::RequestFilters) {
        let _ = filters;
    }
    /// The rule results of one background scan evaluation of a `kind` object in `namespace`
    /// (Kyverno's policy results metric, `rule_execution_cause="background_scan"`).
    fn scan_results(&self, kind: &str, namespace: &str, set: &PolicySet, responses: &[(usize, PolicyResponse)]);
    /// The controllers' metrics, registered where the server serves its own (handed out once).
    fn metrics(&self) -> crate::metrics::Metrics;
    /// Where context entries (ConfigMaps, API calls) read the cluster.
    fn set_data(&self, data: Arc<dyn verno_engine::Data + Send + Sync>);
    /// Where the policy validation webhook checks the controllers' permissions (set once).
    fn set_access(&self, _access: Arc<dyn verno_engine::access_checks::AccessReview>) {}
    /// Whether PolicyExceptions are in force, and from which namespace (set once).
    fn set_exception_scope(&self, _enabled: bool, _namespace: &str) {}
}
