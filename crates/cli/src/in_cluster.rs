//! `verno serve --kube`: the admission server (`verno-server`) fed by the controller
//! (`verno-controller`). Neither crate knows the other; this puts the server behind the
//! controller's [`Serving`] port.

use std::sync::Arc;
use std::time::Duration;
use verno_controller::serving::{ReadyPart, Serving};
use verno_controller::{Options, certs, match_conditions_warning};
use verno_engine::{Notice, PolicySet};
use verno_server::Running;

/// The running admission server as the controller sees it.
pub struct Webhook(pub Arc<Running>);

impl Serving for Webhook {
    fn install(&self, set: PolicySet) {
        self.0.install(set);
    }
    fn current(&self) -> Arc<PolicySet> {
        self.0.current()
    }
    fn set_certificate(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0.set_certificate(cert_pem, key_pem)?)
    }
    fn set_ready(&self, part: ReadyPart, done: bool) {
        let part = match part {
            ReadyPart::Policies => verno_server::ReadyPart::Policies,
            ReadyPart::Certificate => verno_server::ReadyPart::Certificate,
        };
        self.0.set_ready_part(part, done);
    }
    fn report_events(&self, tx: tokio::sync::mpsc::Sender<Notice>) {
        self.0.report_events(tx);
    }
    fn event_dropped(&self) {
        self.0.event_dropped();
    }
    fn report_results(&self, tx: tokio::sync::mpsc::Sender<verno_engine::report::ReportNotice>) {
        self.0.report_results(tx);
    }
    fn report_dropped(&self) {
        self.0.report_dropped();
    }
    fn submit_report(&self, notice: verno_engine::report::ReportNotice) {
        self.0.submit_report(notice);
    }
    fn set_background_user(&self, user: String) {
        self.0.set_background_user(user);
    }
    fn made_by_background(&self, uid: &str, resource_version: &str) -> bool {
        self.0.made_by_background(uid, resource_version)
    }
    fn set_report_backlog(&self, n: usize) {
        self.0.set_report_backlog(n);
    }
    fn report_written(&self, bytes: u64) {
        self.0.report_written(bytes);
    }
    fn set_scan_backlog(&self, n: usize) {
        self.0.set_scan_backlog(n);
    }
    fn report_write_failed(&self) {
        self.0.report_write_failed();
    }
    fn set_request_filters(&self, filters: verno_engine::filters::RequestFilters) {
        self.0.set_request_filters(filters);
    }
    fn set_background_backlog(&self, n: usize) {
        self.0.set_background_backlog(n);
    }
    fn background_work(&self, ok: bool) {
        self.0.background_work(ok);
    }
    fn cleanup_counted(
        &self,
        counter: verno_controller::serving::CleanupCounter,
        ok: bool,
        labels: Vec<(&'static str, String)>,
    ) {
        use verno_controller::serving::CleanupCounter as C;
        let i = match counter {
            C::Cleanup => 0,
            C::Deleting => 1,
            C::Ttl => 2,
        };
        self.0.cleanup_counted(i, ok, labels);
    }
    fn set_ttl_watched(&self, resources: Vec<(String, String, String)>) {
        self.0.set_ttl_watched(resources);
    }
    fn scan_results(
        &self,
        kind: &str,
        namespace: &str,
        set: &PolicySet,
        responses: &[(usize, verno_engine::PolicyResponse)],
    ) {
        self.0.scan_results(kind, namespace, set, responses);
    }
    fn set_access(&self, access: Arc<dyn verno_engine::access_checks::AccessReview>) {
        self.0.set_access(access);
    }
    fn set_data(&self, data: Arc<dyn verno_engine::Data + Send + Sync>) {
        self.0.set_data(data);
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
    let controller = verno_controller::start(client, Arc::new(Webhook(server.clone())), opts).await;
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
