//! Verno in a cluster: `verno serve --kube`.
//!
//! Every replica watches ClusterPolicy / Policy / PolicyException objects and Namespaces,
//! compiles on generation changes and swaps the compiled set into the admission server; every
//! replica reads the serving certificate from its Secret and hot-swaps it. One replica, the
//! Lease holder, writes: the certificate Secrets, the webhook configurations' rules and
//! caBundle, policy status, and Events. Followers never write.
//!
//! The engine and admission server are unchanged: this crate only feeds them from the API.

pub mod access;
pub mod admission_policies;
pub mod background;
pub mod caches;
pub mod cel_http;
pub mod certs;
pub mod cleanup;
pub mod cluster_data;
pub mod crds;
pub mod events;
pub mod global_context;
pub mod leader;
pub mod leader_pass;
pub mod manifests;
pub mod metrics;
pub mod ops;
pub mod policies;
pub mod policy_loop;
pub mod poll;
pub mod probe;
pub mod reports;
pub mod runtime;
pub mod scan;
pub mod service_call;
pub mod serving;
pub mod ttl;
pub mod webhooks;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use runtime::{Kick, Shared, watch_named};
use serving::Serving;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use verno_engine::Kind;

/// The kinds Verno watches and puts in force by default (ImageValidatingPolicies are watched
/// only to report in their status that Verno does not enforce them yet).
pub const WATCHED: [Kind; 16] = [
    Kind::ClusterPolicy,
    Kind::Policy,
    Kind::PolicyException,
    Kind::ValidatingPolicy,
    Kind::NamespacedValidatingPolicy,
    Kind::MutatingPolicy,
    Kind::NamespacedMutatingPolicy,
    Kind::GeneratingPolicy,
    Kind::NamespacedGeneratingPolicy,
    Kind::DeletingPolicy,
    Kind::NamespacedDeletingPolicy,
    Kind::CleanupPolicy,
    Kind::ClusterCleanupPolicy,
    Kind::CelPolicyException,
    Kind::ImageValidatingPolicy,
    Kind::NamespacedImageValidatingPolicy,
];

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Verno's namespace (Secrets, Lease, Deployment).
    pub namespace: String,
    /// The Service in front of the webhook server (certificate names).
    pub service: String,
    /// More names (DNS or IP) the serving certificate is valid for: the host of
    /// `--server-url` when Verno runs outside the cluster.
    pub serving_names: Vec<String>,
    /// This replica's name (the pod name).
    pub identity: String,
    /// The Deployment running Verno: when it is deleted or scaled to zero the leader empties
    /// the webhook rules.
    pub deployment: Option<String>,
    /// The ClusterRole the webhook configurations name as owner (the chart's).
    pub owner_cluster_role: Option<String>,
    pub lease_name: String,
    pub lease_duration: Duration,
    pub lease_retry: Duration,
    /// Quiet time gathered before acting on a burst of changes.
    pub debounce: Duration,
    /// The leader re-checks everything this often even without events.
    pub resync: Duration,
    pub ca_validity: Duration,
    pub pair_validity: Duration,
    /// Violations waiting to become events (Kyverno's `--maxQueuedEvents`, 1000); more are
    /// dropped and counted. 0 turns admission events off.
    pub max_queued_events: usize,
    /// PolicyReports from admission results (Kyverno's `--admissionReports`); `None` turns
    /// them off.
    pub admission_reports: Option<reports::Limits>,
    /// Background scans by the leader (Kyverno's `--backgroundScan`); `None` turns them off.
    /// With scans on, admission results of background-scanned policies are left to the scan.
    pub background_scan: Option<scan::ScanOptions>,
    /// The background controller (generate, mutate-existing) on the leader; `None` turns it
    /// off.
    pub background: Option<background::BackgroundOptions>,
    /// The cleanup controller (cleanup and deleting policies) on the leader; `None` turns it
    /// off.
    pub cleanup: Option<cleanup::CleanupOptions>,
    /// The TTL label controller on the leader; `None` turns it off.
    pub ttl: Option<ttl::TtlOptions>,
    /// Reports are `openreports.io/v1alpha1` Reports (Kyverno's `--openreportsEnabled`).
    pub openreports: bool,
    /// Event reasons never written (Kyverno's `--omitEvents`).
    pub omit_events: std::collections::BTreeSet<String>,
    /// The ConfigMap in Verno's namespace holding Kyverno's dynamic configuration (its
    /// `kyverno` ConfigMap's keys); read live. `None`: not read.
    pub config_map: Option<String>,
    pub event_limits: events::Limits,
    /// The leader updates the probe Lease this often (end-to-end check through the API
    /// server); `None` turns the probe off.
    pub probe_interval: Option<Duration>,
    /// No webhook call seen for this long counts as unreachable (Kyverno's idle deadline).
    pub probe_deadline: Duration,
    /// The policy and exception kinds watched and put in force (the `policies.kyverno.io`
    /// ones only when the cluster serves them).
    pub kinds: Vec<Kind>,
    /// The image verification cache (Kyverno's `--imageVerifyCacheEnabled`,
    /// `--imageVerifyCacheTTLDuration`, `--imageVerifyCacheMaxSize`): TTL and size; `None`
    /// turns it off.
    pub image_verify_cache: Option<(Duration, usize)>,
    /// Where CEL's `http.*` may go (Kyverno's `--httpBlocklist` and `--httpAllowlist`; its
    /// default blocklist unless set).
    pub http_rules: Arc<cel_http::HttpRules>,
    /// Which PolicyExceptions are put in force (Kyverno's `--enablePolicyException`, off by
    /// default, and `--exceptionNamespace`).
    pub exceptions: policies::ExceptionScope,
    /// Keep ConfigMaps labelled `cache.kyverno.io/enabled` from a watch and answer `configMap`
    /// context entries from it (Kyverno's `--enableConfigMapCaching`, on by default); other
    /// ConfigMaps are read from the API server each time, as Kyverno reads them.
    pub config_map_cache: bool,
    /// Write ValidatingAdmissionPolicies for the ClusterPolicies and ValidatingPolicies that ask
    /// for them (Kyverno's `--generateValidatingAdmissionPolicy`, on by default); see
    /// [`admission_policies`].
    pub generate_validating_admission_policies: bool,
    /// Every policy is fail-open whatever its `failurePolicy` (Kyverno's
    /// `--forceFailurePolicyIgnore`): its webhook entries and the server's paths alike.
    pub force_failure_policy_ignore: bool,
    /// Background scans also report the MutatingAdmissionPolicies labelled
    /// `reports.kyverno.io/enabled: "true"` (Kyverno's `--mutatingAdmissionPolicyReports`, off
    /// by default), at the version the API server serves.
    pub mutating_admission_policy_reports: bool,
    /// The webhook configuration objects' names (Verno's, or Kyverno's with `--kyverno-names`).
    pub webhook_names: webhooks::ConfigNames,
    /// The clients the background and cleanup controllers act through (their own accounts);
    /// by default they act as Verno's account.
    pub acting: Acting,
}

/// The background and cleanup controllers' own identities: Kyverno runs each controller under
/// its own ServiceAccount, so a permission granted for cleanup (delete ConfigMaps) is not one
/// the cleanup controller gains because generate may write ConfigMaps. Verno runs the three in
/// one process and acts as the two controller accounts by impersonation; `None` acts as the
/// process's own client.
#[derive(Clone, Default)]
pub struct Acting {
    pub background: Option<kube::Client>,
    pub cleanup: Option<kube::Client>,
    /// The user the background client acts as (`system:serviceaccount:NAMESPACE:NAME`).
    pub background_user: Option<String>,
}

impl Acting {
    /// Clients impersonating `system:serviceaccount:{namespace}:{account}` for each controller
    /// account named (an empty name acts as `config`'s own user), built from `config`.
    pub fn impersonating(
        config: &kube::Config,
        namespace: &str,
        background: &str,
        cleanup: &str,
    ) -> Result<Acting, kube::Error> {
        let client = |account: &str| -> Result<Option<kube::Client>, kube::Error> {
            if account.is_empty() {
                return Ok(None);
            }
            let mut c = config.clone();
            c.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{account}"));
            // The API server adds the account's groups itself.
            c.auth_info.impersonate_groups = None;
            kube::Client::try_from(c).map(Some)
        };
        Ok(Acting {
            background: client(background)?,
            cleanup: client(cleanup)?,
            background_user: (!background.is_empty())
                .then(|| format!("system:serviceaccount:{namespace}:{background}")),
        })
    }

    /// [`Acting::impersonating`] the chart's default controller accounts in `namespace`.
    pub fn default_accounts(config: &kube::Config, namespace: &str) -> Result<Acting, kube::Error> {
        Acting::impersonating(config, namespace, manifests::BACKGROUND_ACCOUNT, manifests::CLEANUP_ACCOUNT)
    }
}

impl std::fmt::Debug for Acting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acting")
            .field("background", &self.background.is_some())
            .field("cleanup", &self.cleanup.is_some())
            .finish()
    }
}

impl Options {
    pub fn new(namespace: &str, identity: &str) -> Options {
        Options {
            namespace: namespace.to_string(),
            service: "verno-svc".into(),
            serving_names: Vec::new(),
            identity: identity.to_string(),
            deployment: None,
            owner_cluster_role: None,
            lease_name: "verno-controller".into(),
            lease_duration: Duration::from_secs(15),
            lease_retry: Duration::from_secs(2),
            debounce: Duration::from_millis(500),
            resync: Duration::from_secs(300),
            ca_validity: Duration::from_secs(365 * 86400),
            pair_validity: Duration::from_secs(60 * 86400),
            max_queued_events: 1000,
            admission_reports: Some(reports::Limits::default()),
            background_scan: Some(scan::ScanOptions::default()),
            background: Some(background::BackgroundOptions::default()),
            cleanup: Some(cleanup::CleanupOptions::default()),
            ttl: Some(ttl::TtlOptions::default()),
            openreports: false,
            omit_events: ["PolicyApplied", "PolicySkipped"].into_iter().map(str::to_string).collect(),
            config_map: None,
            event_limits: events::Limits::default(),
            probe_interval: Some(Duration::from_secs(30)),
            probe_deadline: probe::IDLE_DEADLINE,
            kinds: WATCHED.to_vec(),
            image_verify_cache: Some((verno_images::DEFAULT_CACHE_TTL, verno_images::DEFAULT_CACHE_SIZE)),
            http_rules: Arc::default(),
            exceptions: policies::ExceptionScope::default(),
            config_map_cache: true,
            generate_validating_admission_policies: true,
            force_failure_policy_ignore: false,
            mutating_admission_policy_reports: false,
            webhook_names: webhooks::ConfigNames::VERNO,
            acting: Acting::default(),
        }
    }

    fn certs(&self) -> certs::CertConfig {
        certs::CertConfig {
            namespace: self.namespace.clone(),
            service: self.service.clone(),
            extra_names: self.serving_names.clone(),
            ca_validity: self.ca_validity,
            pair_validity: self.pair_validity,
        }
    }
}

/// A running controller.
pub struct Controller {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Whether this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    /// Bumped after every compiled set is installed.
    pub installed: watch::Receiver<u64>,
}

impl Controller {
    /// Kills every task at once, as a crashed pod would: nothing is released.
    pub fn abort(self) {
        for t in &self.tasks {
            t.abort();
        }
    }

    /// Stops every task; a leader releases its lease first.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

/// Starts the controller tasks feeding `server`.
pub async fn start(client: kube::Client, server: Arc<dyn Serving>, opts: Options) -> Controller {
    let (stop_tx, stop) = watch::channel(false);
    let (leader_tx, leader) = watch::channel(false);
    let (installed_tx, installed) = watch::channel(0u64);
    let (kick, kicks) = Kick::new();
    // Where MutatingAdmissionPolicies are generated (asked once, as Kyverno at start-up).
    let map_version =
        tokio::time::timeout(Duration::from_secs(10), admission_policies::map_version(&client)).await.ok().flatten();
    tracing::info!(version = ?map_version, "MutatingAdmissionPolicy API");
    let caches = caches::Caches::new(opts.config_map_cache);
    let data =
        caches.cluster_data(&client, &opts.namespace, opts.image_verify_cache).with_http_rules(opts.http_rules.clone());
    server.set_data(Arc::new(data.clone()));
    server.set_access(Arc::new(access::PolicyAccess::new(client.clone(), &opts.acting, &opts.namespace)));
    server.set_exception_scope(opts.exceptions.enabled, &opts.exceptions.namespace);
    // Requests the background controller's account makes are remembered at admission, so the
    // background controller can leave them to the policies that ask (skipBackgroundRequests).
    if let Some(user) = &opts.acting.background_user {
        server.set_background_user(user.clone());
    }
    let shared = Shared {
        client: client.clone(),
        acting: opts.acting.clone(),
        server: server.clone(),
        metrics: server.metrics(),
        data,
        installed,
        leader: leader.clone(),
        stop: stop.clone(),
        identity: opts.identity.clone(),
    };
    let (global, namespaces) = (caches.global.clone(), caches.namespaces.clone());
    let mut tasks = caches.follow(&client, &stop);
    let lease = leader::LeaseConfig {
        namespace: opts.namespace.clone(),
        name: opts.lease_name.clone(),
        identity: opts.identity.clone(),
        duration: opts.lease_duration,
        retry: opts.lease_retry,
    };
    tasks.push(tokio::spawn(leader::run(client.clone(), lease, leader_tx, stop.clone())));

    // Policies → compiled set (every replica) and desired statuses (for the leader).
    let policies = policy_loop::PolicyWatch::new(
        &client,
        watched_kinds(&client, &opts, map_version.as_deref()).await,
        map_version.as_deref(),
    );
    // PolicyReports for the requests this replica serves.
    if let Some(mut limits) = opts.admission_reports {
        limits.leave_scanned = opts.background_scan.is_some();
        limits.openreports = opts.openreports;
        let (reports_tx, reports_rx) = tokio::sync::mpsc::channel(limits.max_pending.max(1));
        server.report_results(reports_tx);
        tasks.push(tokio::spawn(reports::run(shared.clone(), reports_rx, limits)));
    }
    let base = events::EventConfig { omit: opts.omit_events.clone(), ..Default::default() };
    let (config_tx, config_rx) = watch::channel(base.clone());
    if let Some(name) = &opts.config_map {
        tasks.push(follow_config_map(&shared, &opts.namespace, name, base.clone(), config_tx, &kick));
    }
    // PolicyViolation events for the requests this replica serves.
    if opts.max_queued_events > 0 {
        let (notices_tx, notices_rx) = tokio::sync::mpsc::channel(opts.max_queued_events);
        server.report_events(notices_tx);
        let sources = events::Sources { stores: policies.stores(), config: config_rx };
        let run = events::run(shared.clone(), events::REPORTING_CONTROLLER, notices_rx, sources, opts.event_limits);
        tasks.push(tokio::spawn(run));
    }
    // GlobalContextEntries' data (every replica; the leader stamps refresh times).
    let manager = webhooks::MANAGER.to_string();
    tasks.push(tokio::spawn(global_context::run(client.clone(), global, leader.clone(), manager, stop.clone())));
    // The leader's controllers.
    if let Some(bg) = opts.background {
        tasks.push(tokio::spawn(background::run(shared.clone(), bg, !opts.omit_events.contains("PolicyError"))));
    }
    if let Some(mut c) = opts.cleanup {
        c.applied_events = !opts.omit_events.contains("PolicyApplied");
        c.error_events = !opts.omit_events.contains("PolicyError");
        tasks.push(tokio::spawn(cleanup::run(shared.clone(), c)));
    }
    if let Some(t) = opts.ttl {
        tasks.push(tokio::spawn(ttl::run(shared.clone(), t)));
    }
    if let Some(mut scan_opts) = opts.background_scan {
        scan_opts.openreports = opts.openreports;
        // Background scans' own events (`kyverno-scan`).
        let scan_events = (opts.max_queued_events > 0).then(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(opts.max_queued_events);
            let sources = events::Sources { stores: policies.stores(), config: watch::channel(base.clone()).1 };
            let run = events::run(shared.clone(), events::SCAN_CONTROLLER, rx, sources, opts.event_limits);
            tasks.push(tokio::spawn(run));
            tx
        });
        tasks.push(tokio::spawn(scan::run(shared.clone(), scan_opts, scan_events)));
    }
    let (status_tx, status_rx) = watch::channel(Arc::new(Vec::new()));
    let (synced_tx, synced_rx) = watch::channel(false);
    let compiler = policies::Compiler::forcing_ignore(opts.force_failure_policy_ignore)
        .with_map_version(map_version.clone())
        .with_exceptions(opts.exceptions.clone());
    let outputs =
        policy_loop::Outputs { installed: installed_tx, statuses: status_tx, synced: synced_tx, kick: kick.clone() };
    tasks.push(tokio::spawn(policies.run(shared.clone(), compiler, namespaces, outputs, opts.debounce)));

    // Certificates, and the objects whose changes the leader must look at.
    let certs_cfg = opts.certs();
    let (cert_tasks, ca) = certs::follow(&shared, &certs_cfg, &kick);
    tasks.extend(cert_tasks);
    let (down_tx, going_down) = watch::channel(false);
    tasks.extend(follow_own_objects(&shared, &opts, &kick, down_tx));
    // The end-to-end probe (leader only).
    if let Some(interval) = opts.probe_interval {
        tasks.push(tokio::spawn(probe::run(shared.clone(), opts.namespace.clone(), interval, opts.probe_deadline)));
    }
    let inputs = leader_pass::Inputs {
        kicks,
        synced: synced_rx,
        statuses: status_rx,
        ca,
        going_down,
        certs: certs_cfg,
        map_version,
    };
    tasks.push(tokio::spawn(leader_pass::run(shared.clone(), opts, inputs)));
    Controller { stop: stop_tx, tasks, leader, installed: shared.installed.clone() }
}

/// The policy kinds to watch: those asked for the cluster serves, and the API server's
/// admission policies when background scans report them.
async fn watched_kinds(client: &kube::Client, opts: &Options, map_version: Option<&str>) -> Vec<Kind> {
    let mut kinds = opts.kinds.clone();
    if opts.background_scan.is_some() {
        kinds.extend([Kind::ValidatingAdmissionPolicy, Kind::ValidatingAdmissionPolicyBinding]);
    }
    let mut served = policy_loop::served_kinds(client, &kinds).await;
    // MutatingAdmissionPolicies where discovery found them (`map_version`).
    let map_reports = opts.background_scan.is_some() && opts.mutating_admission_policy_reports;
    if map_reports && map_version.is_some() {
        served.extend([Kind::MutatingAdmissionPolicy, Kind::MutatingAdmissionPolicyBinding]);
    } else if map_reports {
        tracing::warn!("mutatingAdmissionPolicyReports: the API server serves no MutatingAdmissionPolicy API");
    }
    served
}

/// Kyverno's ConfigMap `name`, followed live in one watch: the requests it says to leave alone
/// (`resourceFilters`, `exclude*`; Kyverno chart's defaults once it is deleted) and, when events
/// are written, its success-event keys (over `base`, into `config`).
fn follow_config_map(
    shared: &Shared,
    namespace: &str,
    name: &str,
    base: events::EventConfig,
    config: watch::Sender<events::EventConfig>,
    kick: &Kick,
) -> JoinHandle<()> {
    use verno_engine::filters::RequestFilters;
    let server = shared.server.clone();
    let api = Api::<ConfigMap>::namespaced(shared.client.clone(), namespace);
    watch_named(api, Some(name), kick.clone(), shared.stop.clone(), move |cm: &ConfigMap| {
        let live = cm.metadata.deletion_timestamp.is_none();
        let filters = match (live, &cm.data) {
            (true, Some(data)) => RequestFilters::from_config_map(data),
            (true, None) => RequestFilters::default(),
            (false, _) => RequestFilters::kyverno_defaults(),
        };
        server.set_request_filters(filters);
        let next = base.with_config_map(cm.data.as_ref().filter(|_| live));
        config.send_if_modified(|cur| std::mem::replace(cur, next.clone()) != next);
    })
}

/// Watches what the leader pass must look at when it changes: the webhook configurations, the
/// owning ClusterRole, and Verno's Deployment (`going_down` when it is deleted or scaled to
/// zero).
fn follow_own_objects(
    shared: &Shared,
    opts: &Options,
    kick: &Kick,
    going_down: watch::Sender<bool>,
) -> Vec<JoinHandle<()>> {
    let (client, stop) = (&shared.client, &shared.stop);
    let names = opts.webhook_names;
    let mut tasks = vec![
        watch_named(
            Api::<ValidatingWebhookConfiguration>::all(client.clone()),
            Some(names.validating),
            kick.clone(),
            stop.clone(),
            |_| {},
        ),
        watch_named(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            Some(names.mutating),
            kick.clone(),
            stop.clone(),
            |_| {},
        ),
    ];
    if let Some(role) = &opts.owner_cluster_role {
        tasks.push(watch_named(
            Api::<ClusterRole>::all(client.clone()),
            Some(role),
            kick.clone(),
            stop.clone(),
            |_| {},
        ));
    }
    if let Some(dep) = &opts.deployment {
        let api = Api::<Deployment>::namespaced(client.clone(), &opts.namespace);
        tasks.push(watch_named(api, Some(dep), kick.clone(), stop.clone(), move |d: &Deployment| {
            let going = d.metadata.deletion_timestamp.is_some() || d.spec.replicas == Some(0);
            going_down.send_if_modified(|cur| std::mem::replace(cur, going) != going);
        }));
    }
    tasks
}

/// Below Kubernetes 1.28 the API server drops `matchConditions` (alpha, off by default), so the
/// exclusions that rely on them (nodes, CSRs, leases, events, Verno's own service accounts) do
/// not apply; namespace exclusions still do. Returns the warning to log, if any.
pub fn match_conditions_warning(major: &str, minor: &str) -> Option<String> {
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>().parse::<u32>().ok();
    let (major, minor) = (digits(major)?, digits(minor)?);
    (major == 1 && minor < 28).then(|| {
        format!("Kubernetes 1.{minor} ignores webhook matchConditions: nodes, CSRs, leases, events and Verno's own service accounts are not excluded from Verno's webhooks (namespace exclusions still apply); upgrade to 1.28 or later")
    })
}

#[cfg(test)]
mod tests {
    use super::match_conditions_warning;

    #[test]
    fn clusters_below_1_28_are_warned_about_match_conditions() {
        assert!(
            match_conditions_warning("1", "27+")
                .is_some_and(|w| w.starts_with("Kubernetes 1.27 ignores webhook matchConditions"))
        );
        assert!(match_conditions_warning("1", "28").is_none());
        assert!(match_conditions_warning("1", "34").is_none());
        assert!(match_conditions_warning("", "").is_none());
    }
}
