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
pub mod certs;
pub mod cleanup;
pub mod cluster_data;
pub mod crds;
pub mod events;
pub mod global_context;
pub mod leader;
pub mod manifests;
pub mod ops;
pub mod policies;
pub mod poll;
pub mod probe;
pub mod reports;
pub mod scan;
pub mod service_call;
pub mod serving;
pub mod ttl;
pub mod webhooks;

use futures_util::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use serving::{ReadyPart, Serving};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use verno_engine::{Kind, LiveNamespaces};

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

/// The kinds of `wanted` this cluster serves. `kyverno.io` kinds are always kept (their CRDs
/// are Verno's own, and dropping them on a discovery hiccup would empty every rule); a
/// `policies.kyverno.io` kind is kept when discovery lists it, and when discovery keeps
/// failing for another reason than "not found" (the watch then waits, and readiness with it).
async fn served_kinds(client: &kube::Client, wanted: &[Kind]) -> Vec<Kind> {
    let mut listed: std::collections::HashMap<String, Option<Vec<String>>> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for &kind in wanted {
        if kind.group() == verno_api::Group::Kyverno {
            out.push(kind);
            continue;
        }
        let ar = policies::resource(kind);
        if !listed.contains_key(&ar.api_version) {
            let mut found = None;
            for attempt in 0..5u32 {
                match client.list_api_group_resources(&ar.api_version).await {
                    Ok(list) => {
                        found = Some(list.resources.into_iter().map(|r| r.name).collect());
                        break;
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        found = Some(Vec::new());
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, api_version = %ar.api_version, "discovery failed (retrying)");
                        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    }
                }
            }
            listed.insert(ar.api_version.clone(), found);
        }
        match listed.get(&ar.api_version) {
            Some(Some(names)) if !names.contains(&ar.plural) => {
                tracing::info!(kind = %kind, api_version = %ar.api_version, "not served by this cluster (no CRD): not watched until Verno restarts");
            }
            _ => out.push(kind),
        }
    }
    out
}

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

/// A counter any watcher bumps to wake the leader loop.
#[derive(Clone)]
struct Kick(Arc<watch::Sender<u64>>);

impl Kick {
    fn bump(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Watches one kind (optionally one name) and bumps `kick` on every event; `on` sees objects.
fn spawn_watch<K>(
    api: Api<K>,
    name: Option<&str>,
    kick: Kick,
    mut stop: watch::Receiver<bool>,
    mut on: impl FnMut(&K) + Send + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut cfg = watcher::Config::default();
    if let Some(n) = name {
        cfg = cfg.fields(&format!("metadata.name={n}"));
    }
    tokio::spawn(async move {
        let mut s = watcher(api, cfg).default_backoff().boxed();
        loop {
            tokio::select! {
                ev = s.next() => match ev {
                    Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o))) => { on(&o); kick.bump(); }
                    Some(Ok(_)) => kick.bump(),
                    Some(Err(e)) => tracing::debug!(error = %e, "watch error (retrying)"),
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// How long a change after a quiet spell waits for the ones arriving with it.
const QUICK: Duration = Duration::from_millis(5);
/// How often (at most; the resync period if shorter) the leader checks the serving
/// certificates: a Secret deleted by hand is made again within this.
const CERTS_EVERY: Duration = Duration::from_secs(5);

/// Keeps `writer`'s store in step with every object of `api` until `stop`.
fn reflect_all<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut s = watcher(api, watcher::Config::default()).default_backoff().reflect(writer).boxed();
        loop {
            tokio::select! {
                ev = s.next() => match ev {
                    Some(Err(e)) => tracing::debug!(error = %e, kind = what, "watch error (retrying)"),
                    Some(Ok(_)) => {}
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Starts the controller tasks feeding `server`.
pub async fn start(client: kube::Client, server: Arc<dyn Serving>, opts: Options) -> Controller {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (leader_tx, leader_rx) = watch::channel(false);
    let (installed_tx, installed_rx) = watch::channel(0u64);
    let (kick_tx, kick_rx) = watch::channel(0u64);
    let kick = Kick(Arc::new(kick_tx));
    let mut tasks = Vec::new();
    let config_maps = opts.config_map_cache.then(reflector::store::Writer::<ConfigMap>::default);
    // Where MutatingAdmissionPolicies are generated (asked once, as Kyverno at start-up).
    let map_version =
        tokio::time::timeout(Duration::from_secs(10), admission_policies::map_version(&client)).await.ok().flatten();
    tracing::info!(version = ?map_version, "MutatingAdmissionPolicy API");
    let mut data =
        cluster_data::ClusterData::new(client.clone()).with_image_verifier(&opts.namespace, opts.image_verify_cache);
    if let Some(writer) = &config_maps {
        data = data.with_config_map_cache(writer.as_reader());
    }
    let role_bindings = reflector::store::Writer::<k8s_openapi::api::rbac::v1::RoleBinding>::default();
    let cluster_role_bindings = reflector::store::Writer::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::default();
    data = data.with_bindings(role_bindings.as_reader(), cluster_role_bindings.as_reader());
    let global_store: Arc<global_context::GlobalStore> = Arc::default();
    data = data.with_global_context(global_store.clone());
    // Namespaces: labels for namespaceSelectors, objects for CEL's `namespaceObject` (read
    // per request from here instead of the API server, as Kyverno reads its namespace lister).
    let namespaces: Arc<LiveNamespaces> = Arc::default();
    data = data.with_namespaces(namespaces.clone());
    let shared = data.clone();
    server.set_data(Arc::new(data));
    server.set_access(Arc::new(access::PolicyAccess::new(client.clone(), &opts.acting, &opts.namespace)));
    // Requests the background controller's account makes are remembered at admission, so the
    // background controller can leave them to the policies that ask (skipBackgroundRequests).
    if let Some(user) = &opts.acting.background_user {
        server.set_background_user(user.clone());
    }
    // The bindings the requesting users' roles are worked out from (Kyverno's RBAC informers).
    tasks.push(reflect_all(Api::all(client.clone()), role_bindings, stop_rx.clone(), "RoleBinding"));
    tasks.push(reflect_all(Api::all(client.clone()), cluster_role_bindings, stop_rx.clone(), "ClusterRoleBinding"));

    // Leadership.
    tasks.push(tokio::spawn(leader::run(
        client.clone(),
        leader::LeaseConfig {
            namespace: opts.namespace.clone(),
            name: opts.lease_name.clone(),
            identity: opts.identity.clone(),
            duration: opts.lease_duration,
            retry: opts.lease_retry,
        },
        leader_tx,
        stop_rx.clone(),
    )));

    {
        let ns_api: Api<Namespace> = Api::all(client.clone());
        let live = namespaces.clone();
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = watcher(ns_api, watcher::Config::default()).default_backoff().boxed();
            // The names a (re-)list delivered: what it did not list was deleted meanwhile.
            let mut listed: Option<std::collections::HashSet<String>> = None;
            loop {
                tokio::select! {
                    ev = s.next() => match ev {
                        Some(Ok(watcher::Event::Init)) => listed = Some(Default::default()),
                        Some(Ok(watcher::Event::InitApply(ns))) => {
                            if let (Some(l), Some(name)) = (listed.as_mut(), ns.metadata.name.clone()) {
                                l.insert(name);
                            }
                            live.upsert(serde_json::to_value(&ns).unwrap_or_default());
                        }
                        Some(Ok(watcher::Event::InitDone)) => {
                            if let Some(l) = listed.take() {
                                live.retain(|name| l.contains(name));
                            }
                        }
                        Some(Ok(watcher::Event::Apply(ns))) => live.upsert(serde_json::to_value(&ns).unwrap_or_default()),
                        Some(Ok(watcher::Event::Delete(ns))) => {
                            if let Some(name) = ns.metadata.name.as_deref() {
                                live.remove(name);
                            }
                        }
                        Some(Err(e)) => tracing::debug!(error = %e, "namespace watch error (retrying)"),
                        None => return,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }));
    }

    // ConfigMaps labelled for caching (Kyverno's informer with the same label selector).
    if let Some(writer) = config_maps {
        let api: Api<ConfigMap> = Api::all(client.clone());
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let config = watcher::Config::default().labels(cluster_data::CACHE_LABEL);
            let mut s = watcher(api, config).default_backoff().reflect(writer).boxed();
            loop {
                tokio::select! {
                    ev = s.next() => match ev {
                        Some(Err(e)) => tracing::debug!(error = %e, "cached ConfigMap watch error (retrying)"),
                        Some(Ok(_)) => {}
                        None => return,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }));
    }

    // Policies → compiled set (every replica) and desired statuses (for the leader).
    let (status_tx, status_rx) = watch::channel::<Arc<Vec<policies::PolicyStatus>>>(Arc::new(Vec::new()));
    let (synced_tx, synced_rx) = watch::channel(false);
    {
        // One reflector per watched kind (policies and exceptions).
        let mut stores: Vec<(Kind, reflector::Store<DynamicObject>)> = Vec::new();
        let mut streams = Vec::new();
        let mut kinds = opts.kinds.clone();
        if opts.background_scan.is_some() {
            // Admission policies are the API server's; background scans report them.
            kinds.extend([Kind::ValidatingAdmissionPolicy, Kind::ValidatingAdmissionPolicyBinding]);
        }
        let mut served = served_kinds(&client, &kinds).await;
        // MutatingAdmissionPolicies where discovery found them (`map_version`).
        let map_reports = opts.background_scan.is_some() && opts.mutating_admission_policy_reports;
        if map_reports && map_version.is_some() {
            served.extend([Kind::MutatingAdmissionPolicy, Kind::MutatingAdmissionPolicyBinding]);
        } else if map_reports {
            tracing::warn!("mutatingAdmissionPolicyReports: the API server serves no MutatingAdmissionPolicy API");
        }
        for kind in served {
            let ar = policies::resource_at(kind, map_version.as_deref().unwrap_or("v1"));
            let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
            stores.push((kind, writer.as_reader()));
            let stream = watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .map(|_| ());
            streams.push(stream.boxed());
        }
        // PolicyReports for the requests this replica serves.
        if let Some(mut limits) = opts.admission_reports {
            limits.leave_scanned = opts.background_scan.is_some();
            limits.openreports = opts.openreports;
            let (reports_tx, reports_rx) = tokio::sync::mpsc::channel(limits.max_pending.max(1));
            server.report_results(reports_tx);
            tasks.push(tokio::spawn(reports::run(client.clone(), reports_rx, server.clone(), limits, stop_rx.clone())));
        }
        // Kyverno's ConfigMap, followed live in one watch: the requests it says to leave alone
        // (`resourceFilters`, `exclude*`; Kyverno chart's defaults once it is deleted) and, when
        // events are written, its success-event keys.
        let base = events::EventConfig { omit: opts.omit_events.clone(), ..Default::default() };
        let (config_tx, config_rx) = watch::channel(base.clone());
        if let Some(name) = &opts.config_map {
            let server = server.clone();
            tasks.push(spawn_watch(
                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &opts.namespace),
                Some(name),
                kick.clone(),
                stop_rx.clone(),
                move |cm: &k8s_openapi::api::core::v1::ConfigMap| {
                    let live = cm.metadata.deletion_timestamp.is_none();
                    let filters = match (live, &cm.data) {
                        (true, Some(data)) => verno_engine::filters::RequestFilters::from_config_map(data),
                        (true, None) => verno_engine::filters::RequestFilters::default(),
                        (false, _) => verno_engine::filters::RequestFilters::kyverno_defaults(),
                    };
                    server.set_request_filters(filters);
                    let next = base.with_config_map(cm.data.as_ref().filter(|_| live));
                    config_tx.send_if_modified(|cur| std::mem::replace(cur, next.clone()) != next);
                },
            ));
        }
        // PolicyViolation events for the requests this replica serves.
        if opts.max_queued_events > 0 {
            let (notices_tx, notices_rx) = tokio::sync::mpsc::channel(opts.max_queued_events);
            server.report_events(notices_tx);
            let stores = events::PolicyStores(stores.clone());
            tasks.push(tokio::spawn(events::run(
                client.clone(),
                events::REPORTING_CONTROLLER,
                opts.identity.clone(),
                notices_rx,
                events::Sources { stores, config: config_rx },
                server.clone(),
                opts.event_limits,
                stop_rx.clone(),
            )));
        }
        // GlobalContextEntries' data, for `globalReference` and `globalContext.Get` (every
        // replica; the leader stamps refresh times).
        tasks.push(tokio::spawn(global_context::run(
            client.clone(),
            global_store.clone(),
            leader_rx.clone(),
            webhooks::MANAGER.to_string(),
            stop_rx.clone(),
        )));
        // The background controller (leader only): generate and mutate-existing.
        if let Some(bg) = opts.background {
            tasks.push(tokio::spawn(background::run(
                client.clone(),
                opts.acting.background.clone().unwrap_or_else(|| client.clone()),
                server.clone(),
                shared.clone(),
                installed_rx.clone(),
                leader_rx.clone(),
                bg,
                opts.identity.clone(),
                !opts.omit_events.contains("PolicyError"),
                stop_rx.clone(),
            )));
        }
        // The cleanup controller (leader only): cleanup and deleting policies on schedule.
        if let Some(mut c) = opts.cleanup {
            c.applied_events = !opts.omit_events.contains("PolicyApplied");
            c.error_events = !opts.omit_events.contains("PolicyError");
            tasks.push(tokio::spawn(cleanup::run(
                client.clone(),
                opts.acting.cleanup.clone().unwrap_or_else(|| client.clone()),
                server.clone(),
                shared.clone(),
                installed_rx.clone(),
                leader_rx.clone(),
                c,
                opts.identity.clone(),
                stop_rx.clone(),
            )));
        }
        // The TTL label controller (leader only).
        if let Some(t) = opts.ttl {
            tasks.push(tokio::spawn(ttl::run(
                client.clone(),
                opts.acting.cleanup.clone().unwrap_or_else(|| client.clone()),
                server.clone(),
                leader_rx.clone(),
                t,
                opts.identity.clone(),
                stop_rx.clone(),
            )));
        }
        // Background scans (leader only), with their own events (`kyverno-scan`).
        if let Some(mut scan_opts) = opts.background_scan {
            scan_opts.openreports = opts.openreports;
            let scan_events = if opts.max_queued_events > 0 {
                let (tx, rx) = tokio::sync::mpsc::channel(opts.max_queued_events);
                let stores = events::PolicyStores(stores.clone());
                let base = events::EventConfig { omit: opts.omit_events.clone(), ..Default::default() };
                let (_config_tx, config_rx) = watch::channel(base);
                tasks.push(tokio::spawn(events::run(
                    client.clone(),
                    events::SCAN_CONTROLLER,
                    opts.identity.clone(),
                    rx,
                    events::Sources { stores, config: config_rx },
                    server.clone(),
                    opts.event_limits,
                    stop_rx.clone(),
                )));
                Some(tx)
            } else {
                None
            };
            tasks.push(tokio::spawn(scan::run(
                server.clone(),
                shared.clone(),
                installed_rx.clone(),
                leader_rx.clone(),
                scan_events,
                scan_opts,
                stop_rx.clone(),
            )));
        }
        let mut events = futures_util::stream::select_all(streams);
        let server = server.clone();
        let kick = kick.clone();
        let debounce = opts.debounce;
        let force_ignore = opts.force_failure_policy_ignore;
        let mut stop = stop_rx.clone();
        let namespaces = namespaces.clone();
        let map_version = map_version.clone();
        tasks.push(tokio::spawn(async move {
            let mut compiler = policies::Compiler::forcing_ignore(force_ignore).with_map_version(map_version);
            let mut generation = 0u64;
            // Never publish from an unsynced cache: an empty set would drop every rule.
            tokio::select! {
                r = futures_util::future::join_all(stores.iter().map(|(_, s)| s.wait_until_ready())) => { let _ = r; }
                _ = async { while events.next().await.is_some() {} } => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            loop {
                let (mut ps, mut es, mut bs) = (Vec::new(), Vec::new(), Vec::new());
                for (kind, store) in &stores {
                    let into = if kind.is_exception() {
                        &mut es
                    } else if kind.is_binding() {
                        &mut bs
                    } else {
                        &mut ps
                    };
                    into.extend(store.state().into_iter().map(|o| (*kind, o)));
                }
                let (set, statuses) = compiler.build_with(&ps, &es, &bs, namespaces.clone());
                server.install(set);
                server.set_ready(ReadyPart::Policies, true);
                generation += 1;
                let _ = installed_tx.send(generation);
                let _ = status_tx.send(Arc::new(statuses));
                let _ = synced_tx.send(true);
                kick.bump();
                let built = tokio::time::Instant::now();
                // Wait for a change, then gather what arrives with it. A policy applied alone
                // is in force within milliseconds; a stream of changes (a GitOps sync of many
                // policies) is built at most once per `debounce` (50 ms at most), each build
                // taking in everything that arrived meanwhile (compiles are cached per policy).
                tokio::select! {
                    ev = events.next() => if ev.is_none() { return },
                    _ = stop.wait_for(|s| *s) => return,
                }
                let next = (tokio::time::Instant::now() + QUICK.min(debounce))
                    .max(built + debounce.min(Duration::from_millis(50)));
                loop {
                    tokio::select! {
                        ev = events.next() => if ev.is_none() { return },
                        _ = tokio::time::sleep_until(next) => break,
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }
        }));
    }

    // Certificates: every replica serves what the pair Secret holds; the CA Secret is the
    // caBundle.
    let certs_cfg = opts.certs();
    let (ca_tx, ca_rx) = watch::channel::<Option<String>>(None);
    {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &opts.namespace);
        let server = server.clone();
        let pair_name = certs_cfg.pair_secret();
        let mut last: Option<certs::Pem> = None;
        tasks.push(spawn_watch(secrets.clone(), Some(&pair_name), kick.clone(), stop_rx.clone(), move |s: &Secret| {
            let Some(pem) = certs::pem_of(s) else { return };
            if last.as_ref() == Some(&pem) || s.metadata.deletion_timestamp.is_some() {
                return;
            }
            match server.set_certificate(&pem.cert, &pem.key) {
                Ok(()) => {
                    tracing::info!("serving certificate loaded from its Secret");
                    server.set_ready(ReadyPart::Certificate, true);
                    last = Some(pem);
                }
                Err(e) => {
                    tracing::error!(error = %e, "the serving certificate Secret is unusable; keeping the previous one")
                }
            }
        }));
        tasks.push(spawn_watch(
            secrets,
            Some(&certs_cfg.ca_secret()),
            kick.clone(),
            stop_rx.clone(),
            move |s: &Secret| {
                if let Some(pem) = certs::pem_of(s) {
                    let text = String::from_utf8_lossy(&pem.cert).into_owned();
                    ca_tx.send_if_modified(|cur| {
                        let changed = cur.as_deref() != Some(text.as_str());
                        *cur = Some(text.clone());
                        changed
                    });
                }
            },
        ));
    }

    // Objects whose changes the leader must look at.
    let (down_tx, down_rx) = watch::channel(false);
    tasks.push(spawn_watch(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        Some(opts.webhook_names.validating),
        kick.clone(),
        stop_rx.clone(),
        |_| {},
    ));
    tasks.push(spawn_watch(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        Some(opts.webhook_names.mutating),
        kick.clone(),
        stop_rx.clone(),
        |_| {},
    ));
    if let Some(role) = &opts.owner_cluster_role {
        tasks.push(spawn_watch(
            Api::<ClusterRole>::all(client.clone()),
            Some(role),
            kick.clone(),
            stop_rx.clone(),
            |_| {},
        ));
    }
    if let Some(dep) = &opts.deployment {
        tasks.push(spawn_watch(
            Api::<Deployment>::namespaced(client.clone(), &opts.namespace),
            Some(dep),
            kick.clone(),
            stop_rx.clone(),
            move |d: &Deployment| {
                let going = d.metadata.deletion_timestamp.is_some() || d.spec.replicas == Some(0);
                down_tx.send_if_modified(|cur| std::mem::replace(cur, going) != going);
            },
        ));
    }

    // The end-to-end probe (leader only).
    if let Some(interval) = opts.probe_interval {
        tasks.push(tokio::spawn(probe::run(
            client.clone(),
            opts.namespace.clone(),
            opts.identity.clone(),
            interval,
            opts.probe_deadline,
            leader_rx.clone(),
            stop_rx.clone(),
        )));
    }

    // The leader loop.
    {
        let client = client.clone();
        let server = server.clone();
        let mut leader = leader_rx.clone();
        let mut kicks = kick_rx;
        let mut stop = stop_rx.clone();
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            let reporter = Reporter { controller: "verno".into(), instance: Some(opts.identity.clone()) };
            let recorder = Recorder::new(client.clone(), reporter);
            let mut reported: std::collections::HashMap<String, String> = std::collections::HashMap::new();
            let mut generator = admission_policies::Generator::default();
            let mut last_pass = tokio::time::Instant::now();
            let mut certs_checked: Option<tokio::time::Instant> = None;
            loop {
                if *leader.borrow() && *synced_rx.borrow() {
                    last_pass = tokio::time::Instant::now();
                    // The certificates are checked at most every few seconds (or while there
                    // is no CA): a pass a policy change asks for goes straight to the webhook
                    // configurations (a Pod created right after its policy meets its rules).
                    let certs_due = ca_rx.borrow().is_none()
                        || certs_checked.is_none_or(|t| t.elapsed() >= CERTS_EVERY.min(opts.resync));
                    if certs_due {
                        certs_checked = Some(tokio::time::Instant::now());
                        if let Err(e) = certs::ensure(&client, &certs_cfg).await {
                            tracing::warn!(error = %e, "certificate check failed");
                        }
                    }
                    let inputs = webhooks::Inputs {
                        ca_bundle: ca_rx.borrow().clone(),
                        owner_cluster_role: opts.owner_cluster_role.clone(),
                        going_down: *down_rx.borrow(),
                        names: opts.webhook_names,
                    };
                    // The statuses are read before the set: the policy loop installs a set before
                    // it sends its statuses, so the set written into the webhooks is at least as
                    // new as the statuses shown ready (never a ready policy without its rules).
                    let statuses = status_rx.borrow().clone();
                    // Without a CA yet, wait: rules pointing at a server nobody trusts would fail.
                    let configured = match &inputs.ca_bundle {
                        None => false,
                        Some(_) => match webhooks::reconcile(&client, &server.current(), &inputs).await {
                            Ok(_) => true,
                            Err(e) => {
                                tracing::warn!(error = %e, "webhook configuration update failed");
                                false
                            }
                        },
                    };
                    let statuses = generator
                        .reconcile(
                            &client,
                            &statuses,
                            opts.generate_validating_admission_policies,
                            map_version.as_deref(),
                        )
                        .await;
                    write_statuses(&client, &recorder, &statuses, configured, &mut reported).await;
                }
                // Sleep until something changes (or the resync period passes).
                let resync = tokio::time::sleep(opts.resync);
                tokio::select! {
                    _ = kicks.changed() => {}
                    _ = leader.changed() => {}
                    _ = resync => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                // Passes are at least 50 ms apart (kicks in a burst share one pass; the policy
                // loop already coalesces bursts of policy changes); a kick after a quiet spell is
                // served at once.
                let gap = opts.debounce.min(Duration::from_millis(50)).saturating_sub(last_pass.elapsed());
                tokio::select! {
                    _ = tokio::time::sleep(gap.max(QUICK.min(opts.debounce))) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                kicks.mark_unchanged();
            }
        }));
    }

    Controller { stop: stop_tx, tasks, leader: leader_rx, installed: installed_rx }
}

async fn write_statuses(
    client: &kube::Client,
    recorder: &Recorder,
    statuses: &[policies::PolicyStatus],
    webhooks_configured: bool,
    reported: &mut std::collections::HashMap<String, String>,
) {
    let mut answers = access::Answers::default();
    for st in statuses {
        // A policy is not shown ready before its webhook rules are in place (as Kyverno's
        // readiness follows its webhook registration); a broken one is reported at once.
        if !webhooks_configured && st.error.is_none() {
            continue;
        }
        let mut st = st.clone();
        if let policies::Reporting::Check(gvrs) = &st.reporting {
            match answers.missing(client, gvrs).await {
                Ok(missing) => st.with_permissions(Some(&missing)),
                Err(e) => {
                    tracing::debug!(policy = %st.name, error = %e, "permission check failed; status not written this time");
                    continue;
                }
            }
        } else {
            st.with_permissions(None);
        }
        let Some(status) = st.to_write() else { continue };
        let ar = policies::resource(st.kind);
        let api: Api<DynamicObject> = match &st.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let body =
            json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": st.name}, "status": status});
        match api.patch_status(&st.name, &PatchParams::apply(webhooks::MANAGER).force(), &Patch::Apply(&body)).await {
            Ok(_) => tracing::debug!(policy = %st.name, "status written"),
            Err(e) => tracing::warn!(policy = %st.name, error = %e, "status write failed"),
        }
        // One Warning event per distinct compile error.
        let key = format!("{}/{}/{}", st.kind, st.namespace.as_deref().unwrap_or(""), st.name);
        if let Some(err) = &st.error {
            if reported.get(&key) != Some(err) {
                reported.insert(key, err.clone());
                let reference = k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some(ar.api_version.clone()),
                    kind: Some(ar.kind.clone()),
                    name: Some(st.name.clone()),
                    namespace: st.namespace.clone(),
                    ..Default::default()
                };
                let ev = KubeEvent {
                    type_: EventType::Warning,
                    reason: "PolicyError".into(),
                    note: Some(format!("policy is invalid: {err}")),
                    action: "Compile".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&ev, &reference).await {
                    tracing::debug!(error = %e, "event not written");
                }
            }
        } else {
            reported.remove(&key);
        }
    }
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
