//! What the scale benchmarks (`reports-scale`, `generate-scale`, `cleanup-scale`) share: their
//! `--flag value` arguments, the fake API server with Verno's CRDs and install, `verno serve
//! --kube` started as Verno's ServiceAccount against it, and Verno's peak RSS.

use anyhow::{Context as _, Result, anyhow, bail};
use fake_apiserver::FakeApiServer;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;
use std::path::Path;
use verno_controller::{crds, manifests};

/// Reads the command line as `--flag value` pairs, handing each to `set`, which answers
/// whether it knows the flag (`unknown argument FLAG` when it does not).
pub fn parse_flags(mut set: impl FnMut(&str, String) -> Result<bool>) -> Result<()> {
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| anyhow!("{k} needs a value"))?;
        if !set(&k, v)? {
            bail!("unknown argument {k}");
        }
    }
    Ok(())
}

/// The peak resident set size of process `pid` in MiB (`VmHWM`; 0 when it cannot be read).
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A fake API server with Verno's CRDs and install (`values`) applied, and a folder for
/// Verno's kubeconfig, certificates and log.
pub struct Bench {
    pub dir: tempfile::TempDir,
    pub fake: FakeApiServer,
    /// A client with every permission.
    pub admin: kube::Client,
    pub values: manifests::Values,
}

impl Bench {
    pub async fn install(values: manifests::Values) -> Result<Bench> {
        let dir = tempfile::tempdir()?;
        let fake = FakeApiServer::start(fake_apiserver::default_resources()).await?;
        let admin = fake.client(None)?;
        for doc in crds::all().into_iter().chain(manifests::render(&values)) {
            fake.apply(&admin, &doc).await.map_err(|e| anyhow!("installing Verno: {e}"))?;
        }
        Ok(Bench { dir, fake, admin, values })
    }

    /// The Namespaces API.
    pub fn namespaces(&self) -> Api<DynamicObject> {
        Api::all_with(self.admin.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()))
    }

    /// Starts `verno serve --kube` as Verno's ServiceAccount, serving the install's Service
    /// on a free local port, with `extra` arguments; its output goes to `verno.log`.
    pub fn start_verno(&self, verno: &Path, extra: &[&str]) -> Result<Verno> {
        let (dir, values) = (self.dir.path(), &self.values);
        let config = dir.join("kubeconfig");
        let user = format!("system:serviceaccount:{}:{}", values.namespace, manifests::SERVICE_ACCOUNT);
        std::fs::write(&config, self.fake.kubeconfig().replace("  user: {}\n", &format!("  user:\n    as: {user}\n")))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(dir.join("verno.log"))?;
        let child = tokio::process::Command::new(verno)
            .args(["serve", "--kube", "--namespace", &values.namespace, "--identity", "verno-0"])
            .args(["--service", manifests::SERVICE, "--deployment", manifests::DEPLOYMENT])
            .args(["--owner-cluster-role", manifests::CLUSTER_ROLE])
            .args(["--addr", &format!("127.0.0.1:{port}"), "--metrics-addr", "off"])
            .args(extra)
            .arg("--tls-dir")
            .arg(dir.join("tls"))
            .env("KUBECONFIG", &config)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", verno.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("verno exited at once"))?;
        self.fake.set_service(&values.namespace, manifests::SERVICE, Some(([127, 0, 0, 1], port).into()));
        Ok(Verno { child, pid })
    }
}

/// Creates the Namespace `name` through `api` (see [`Bench::namespaces`]).
pub async fn create_namespace(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    let ns: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// A running `verno serve`.
pub struct Verno {
    child: tokio::process::Child,
    pid: u32,
}

impl Verno {
    /// Its peak resident set size so far, in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(self.pid)
    }

    /// Kills it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
