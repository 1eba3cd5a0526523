//! `verno serve --kube`: the admission server (`verno-server`) fed by the controller
//! (`verno-controller`). Neither crate knows the other; this puts the server behind the
//! controller's [`Serving`] port.

use std::sync::Arc;
use std::time::Duration;
use verno_controller::serving::{ReadyPart, Serving};
use verno_controller::{Options, certs, match_conditions_warning};
use verno_engine::{Notice, PolicySet};
use verno_server::Running;

/// The running admission server as the controller sees it, with the controllers' metrics
/// registered where it serves its own.
pub struct Webhook {
    server: Arc<Running>,
    metrics: verno_controller::metrics::Metrics,
}

impl Webhook {
    pub fn new(server: Arc<Running>) -> Webhook {
        let (events_dropped, reports_dropped) = server.dropped_counters();
        let metrics = verno_controller::metrics::Metrics::new(events_dropped, reports_dropped);
        server.register_metrics(|registry| metrics.register(registry));
        Webhook { server, metrics }
    }
}

impl Serving for Webhook {
    fn install(&self, set: PolicySet) {
        self.server.install(set);
    }
    fn current(&self) -> Arc<PolicySet> {
        self.server.current()
    }
    fn set_certificate(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.server.set_certificate(cert_pem, key_pem)?)
    }
    fn set_ready(&self, part: ReadyPart, done: bool) {
        self.server.set_ready_part(part, done);
    }
    fn report_events(&self, tx: tokio::sync::mpsc::Sender<Notice>) {
        self.server.report_events(tx);
    }
    fn report_results(&self, tx: tokio::sync::mpsc::Sender<verno_engine::report::ReportNotice>) {
        self.server.report_results(tx);
    }
    fn submit_report(&self, notice: verno_engine::report::ReportNotice) {
        self.server.submit_report(notice);
    }
    fn set_background_user(&self, user: String) {
        self.server.set_background_user(user);
    }
    fn made_by_background(&self, uid: &str, resource_version: &str) -> bool {
        self.server.made_by_background(uid, resource_version)
    }
    fn set_request_filters(&self, filters: verno_engine::filters::RequestFilters) {
        self.server.set_request_filters(filters);
    }
    fn scan_results(
        &self,
        kind: &str,
        namespace: &str,
        set: &PolicySet,
        responses: &[(usize, verno_engine::PolicyResponse)],
    ) {
        self.server.scan_results(kind, namespace, set, responses);
    }
    fn metrics(&self) -> verno_controller::metrics::Metrics {
        self.metrics.clone()
    }
    fn set_exception_scope(&self, enabled: bool, namespace: &str) {
        self.server.set_exception_scope(enabled, namespace);
    }
    fn set_access(&self, access: Arc<dyn verno_engine::access_checks::AccessReview>) {
        self.server.set_access(access);
    }
    fn set_data(&self, data: Arc<dyn verno_engine::Data + Send + Sync>) {
        self.server.set_data(data);
    }
}

/// The admission server for in-cluster mode: an empty policy set, no watched files, and a
/// throwaway certificate until the controller loads the real one (readiness says so).
pub async fn start_server(mut cfg: verno_server::Config) -> anyhow::Result<Arc<Running>> {
    let ca = certs::new_ca(Duration::from_secs(3600))?;
    let placeholder = certs::new_pair(&ca, &["verno-starting".to_string()], Duration::from_secs(3600))?;
    cfg.tls = verno_server::TlsSource::Pem { cert: placeholder.cert, key: placeholder.key };
    cfg.watch.clear();
    Ok(Arc::new(verno_server::start(cfg, Arc::new(|| Ok(PolicySet::default()))).await?))
}

/// The admission server and the controller feeding it, as one replica runs them.
pub async fn start_replica(
    client: kube::Client,
    cfg: verno_server::Config,
    opts: Options,
) -> anyhow::Result<(Arc<Running>, verno_controller::Controller)> {
    let server = start_server(cfg).await?;
    if opts.webhook_names.kyverno_layout() {
        server.use_kyverno_layout();
    }
    let controller = verno_controller::start(client, Arc::new(Webhook::new(server.clone())), opts).await;
    Ok((server, controller))
}

/// The ServiceAccounts (in Verno's namespace) the background and cleanup controllers act as;
/// an empty name acts as Verno's own account.
pub struct Accounts {
    pub background: String,
    pub cleanup: String,
}

/// `verno serve --kube` until SIGTERM. The server starts on a throwaway certificate and
/// reports not-ready until the controller has loaded the real one from its Secret and synced
/// the policies.
pub async fn run(cfg: verno_server::Config, mut opts: Options, accounts: Accounts) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let config =
        kube::Config::infer().await.context("cannot reach the Kubernetes API (in-cluster config or kubeconfig)")?;
    opts.acting =
        verno_controller::Acting::impersonating(&config, &opts.namespace, &accounts.background, &accounts.cleanup)
            .context("cannot build the controller accounts' clients")?;
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    match client.apiserver_version().await {
        Ok(v) => {
            if let Some(w) = match_conditions_warning(&v.major, &v.minor) {
                tracing::warn!("{w}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the Kubernetes version"),
    }
    let identity = opts.identity.clone();
    let namespace = opts.namespace.clone();
    let (server, controller) = start_replica(client, cfg, opts).await?;
    tracing::info!(addr = %server.addr, identity = %identity, namespace = %namespace, "verno admission server listening (in-cluster)");
    verno_server::shutdown_signal().await;
    tracing::info!("shutting down: releasing the lease, draining in-flight requests");
    controller.stop().await;
    match Arc::try_unwrap(server) {
        Ok(s) => s.shutdown(Duration::from_secs(10)).await,
        Err(_) => tracing::warn!("server still referenced at shutdown; exiting without a drain"),
    }
    Ok(())
}
