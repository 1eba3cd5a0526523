//! One test's cluster: a fresh fake API server (in this process, plain HTTP on loopback),
//! Verno installed into it as the plain manifests install it (CRDs, webhook configurations,
//! RBAC, Deployment), and `verno serve --kube` as a separate process that reaches the API
//! server over HTTP and is called back by the fake's admission emulation over HTTPS.

use anyhow::{Context, Result, anyhow, bail};
use fake_apiserver::FakeApiServer;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use verno_controller::{crds, manifests, webhooks};

/// Verno is installed as Kyverno's CI installs Kyverno (the suite's scripts read and patch
/// objects there): in namespace `kyverno`, its dynamic configuration in the ConfigMap
/// `kyverno`, and no event reason omitted (the CI's `standard` values).
const NAMESPACE: &str = "kyverno";
const CONFIG_MAP: &str = "kyverno";

fn install_values(rbac: &[(String, serde_json::Value)]) -> Result<manifests::Values> {
    let mut v = manifests::Values {
        namespace: NAMESPACE.into(),
        config_name: CONFIG_MAP.into(),
        omit_events: Vec::new(),
        kyverno_names: true,
        ..manifests::Values::default()
    };
    for (k, name) in verno_e2e::KYVERNO_ACCOUNTS {
        v.apply(k, &serde_json::Value::from(name)).map_err(|e| anyhow!("{k}: {e}"))?;
    }
    for (k, x) in rbac {
        v.apply(k, x).map_err(|e| anyhow!("Kyverno's CI values: {e}"))?;
    }
    Ok(v)
}

/// Where a kind is served.
#[derive(Debug, Clone)]
pub struct Res {
    pub api_version: String,
    pub plural: String,
    pub namespaced: bool,
}

impl Res {
    /// The collection path, in `ns` when namespaced.
    pub fn path(&self, ns: Option<&str>) -> String {
        let base = if self.api_version.contains('/') {
            format!("/apis/{}", self.api_version)
        } else {
            format!("/api/{}", self.api_version)
        };
        match ns {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{ns}/{}", self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }
}

/// An error answered by the API server (`Status`), or a transport failure.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    /// What client-go's error prints: the Status message.
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn not_found(&self) -> bool {
        self.code == 404
    }
    fn other(message: String) -> ApiError {
        ApiError { code: 0, reason: String::new(), message }
    }
}

pub struct Cluster {
    /// The API server, serving as long as the test runs.
    _fake: FakeApiServer,
    client: kube::Client,
    verno: Option<tokio::process::Child>,
    pub kubeconfig: PathBuf,
    pub verno_log: PathBuf,
    discovery: Mutex<HashMap<(String, String), Res>>,
}

pub struct Options<'a> {
    pub verno: &'a Path,
    pub dir: &'a Path,
    /// More `verno serve` arguments (a Kyverno configuration's flags).
    pub extra_args: &'a [String],
    /// The install's RBAC values (`…rbac.clusterRole.extraResources`), by values key.
    pub rbac: &'a [(String, serde_json::Value)],
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Cluster {
    pub async fn start(opts: Options<'_>) -> Result<Cluster> {
        let fake = FakeApiServer::start(fake_apiserver::default_resources()).await?;
        let client = fake.client(None)?;
        let values = install_values(opts.rbac)?;
        for doc in crds::all().into_iter().chain(manifests::render(&values)) {
            fake.apply(&client, &doc).await.map_err(|e| anyhow!("installing Verno: {e}"))?;
        }
        let kubeconfig = opts.dir.join("kubeconfig");
        std::fs::write(&kubeconfig, fake.kubeconfig())?;
        // Verno talks to the API server as its ServiceAccount (impersonated).
        let verno_config = opts.dir.join("verno-kubeconfig");
        let user = format!("system:serviceaccount:{NAMESPACE}:{}", values.admission_account);
        std::fs::write(
            &verno_config,
            fake.kubeconfig().replace("  user: {}\n", &format!("  user:\n    as: {user}\n")),
        )?;
        let port = free_port()?;
        let verno_log = opts.dir.join("verno.log");
        let log = std::fs::File::create(&verno_log)?;
        let mut cmd = tokio::process::Command::new(opts.verno);
        cmd.args(["serve", "--kube", "--namespace", NAMESPACE, "--identity", "verno-0"])
            .args(["--service", values.service(), "--deployment", manifests::DEPLOYMENT])
            .args(["--owner-cluster-role", manifests::CLUSTER_ROLE])
            .args(["--config-map", CONFIG_MAP, "--omit-events", ""])
            .args(verno_e2e::kyverno_account_args())
            .args(["--addr", &format!("127.0.0.1:{port}"), "--metrics-addr", "127.0.0.1:0"])
            .arg("--tls-dir")
            .arg(opts.dir.join("tls"))
            .args(opts.extra_args)
            .env("KUBECONFIG", &verno_config)
            .env("RUST_LOG", std::env::var("VERNO_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {}", opts.verno.display()))?;
        fake.set_service(NAMESPACE, values.service(), Some(([127, 0, 0, 1], port).into()));
        let cluster = Cluster {
            _fake: fake,
            client,
            verno: Some(child),
            kubeconfig,
            verno_log,
            discovery: Mutex::new(HashMap::new()),
        };
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// Verno is ready when the webhook configurations carry its CA and its readiness answers.
    async fn wait_ready(&self) -> Result<()> {
        let start = Instant::now();
        let res = Res {
            api_version: "admissionregistration.k8s.io/v1".into(),
            plural: "validatingwebhookconfigurations".into(),
            namespaced: false,
        };
        loop {
            if let Ok(Some(v)) = self.get(&res, None, webhooks::KYVERNO_POLICY_CONFIG).await
                && v.pointer("/webhooks/0/clientConfig/caBundle").is_some_and(Value::is_string)
            {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(&self.verno_log).unwrap_or_default();
                let tail: String =
                    log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                bail!(
                    "Verno did not become ready within 30 s (no caBundle in its webhook configuration); its log ends:\n{tail}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes so far, leaving out Leases and Events (see `FakeApiServer::activity`).
    pub fn activity(&self) -> usize {
        self._fake.activity()
    }

    /// Whether the cluster holds work Verno does on a clock rather than on a write: a cleanup
    /// or deleting policy (cron schedules) or an object with a `cleanup.kyverno.io/ttl` label.
    /// `--settle` (give up after a quiet spell) cannot apply then: nothing is written until the
    /// time comes.
    pub fn scheduled_work(&self) -> bool {
        [
            ("kyverno.io", "cleanuppolicies"),
            ("kyverno.io", "clustercleanuppolicies"),
            ("policies.kyverno.io", "deletingpolicies"),
            ("policies.kyverno.io", "namespaceddeletingpolicies"),
        ]
        .iter()
        .any(|(g, p)| self._fake.count(g, p) > 0)
            || self._fake.any_labelled("cleanup.kyverno.io/ttl")
    }

    pub async fn stop(&mut self) {
        if let Some(mut c) = self.verno.take() {
            if let Some(pid) = c.id() {
                // SIGTERM first, so Verno can stop cleanly; then kill.
                let _ = std::process::Command::new("kill").arg(pid.to_string()).status();
                if tokio::time::timeout(Duration::from_secs(3), c.wait()).await.is_ok() {
                    return;
                }
            }
            let _ = c.kill().await;
        }
    }

    async fn call(&self, method: http::Method, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<Value, ApiError> {
        let mut req = http::Request::builder().method(method).uri(path);
        let bytes = match body {
            Some((ct, b)) => {
                req = req.header("Content-Type", ct);
                b
            }
            None => Vec::new(),
        };
        let req = req.body(bytes).map_err(|e| ApiError::other(e.to_string()))?;
        match self.client.request::<Value>(req).await {
            Ok(v) => Ok(v),
            Err(kube::Error::Api(s)) => {
                Err(ApiError { code: s.code, reason: s.reason.clone(), message: s.message.clone() })
            }
            Err(e) => Err(ApiError::other(e.to_string())),
        }
    }

    /// Where `apiVersion`/`kind` is served, from the API server's discovery.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<Res> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(r) = self.discovery.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return Ok(r.clone());
        }
        let path =
            if api_version.contains('/') { format!("/apis/{api_version}") } else { format!("/api/{api_version}") };
        let list = self
            .call(http::Method::GET, &path, None)
            .await
            .map_err(|e| anyhow!("no matches for kind \"{kind}\" in version \"{api_version}\" ({e})"))?;
        let found = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["kind"] == kind && r["name"].as_str().is_some_and(|n| !n.contains('/')));
        let Some(r) = found else {
            bail!("no matches for kind \"{kind}\" in version \"{api_version}\"");
        };
        let res = Res {
            api_version: api_version.to_string(),
            plural: r["name"].as_str().unwrap_or_default().to_string(),
            namespaced: r["namespaced"].as_bool().unwrap_or(false),
        };
        self.discovery.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, res.clone());
        Ok(res)
    }

    pub async fn get(&self, res: &Res, ns: Option<&str>, name: &str) -> Result<Option<Value>, ApiError> {
        match self.call(http::Method::GET, &format!("{}/{name}", res.path(ns)), None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn list(&self, res: &Res, ns: Option<&str>, labels: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let mut path = res.path(ns);
        if let Some(l) = labels.filter(|l| !l.is_empty()) {
            path = format!("{path}?labelSelector={}", encode(l));
        }
        let v = self.call(http::Method::GET, &path, None).await?;
        let mut items = v["items"].as_array().cloned().unwrap_or_default();
        // A list's items carry no apiVersion/kind; the assertion reads them.
        let kind = v["kind"].as_str().and_then(|k| k.strip_suffix("List")).unwrap_or_default().to_string();
        for i in &mut items {
            if let Value::Object(m) = i {
                m.entry("apiVersion").or_insert_with(|| json!(res.api_version));
                m.entry("kind").or_insert_with(|| json!(kind));
            }
        }
        Ok(items)
    }

    pub async fn create(&self, res: &Res, ns: Option<&str>, obj: &Value) -> Result<Value, ApiError> {
        let body = serde_json::to_vec(obj).map_err(|e| ApiError::other(e.to_string()))?;
        self.call(http::Method::POST, &res.path(ns), Some(("application/json", body))).await
    }

    pub async fn replace(&self, res: &Res, ns: Option<&str>, name: &str, obj: &Value) -> Result<Value, ApiError> {
        let body = serde_json::to_vec(obj).map_err(|e| ApiError::other(e.to_string()))?;
        self.call(http::Method::PUT, &format!("{}/{name}", res.path(ns)), Some(("application/json", body))).await
    }

    pub async fn merge_patch(&self, res: &Res, ns: Option<&str>, name: &str, patch: &Value) -> Result<Value, ApiError> {
        let body = serde_json::to_vec(patch).map_err(|e| ApiError::other(e.to_string()))?;
        self.call(
            http::Method::PATCH,
            &format!("{}/{name}", res.path(ns)),
            Some(("application/merge-patch+json", body)),
        )
        .await
    }

    pub async fn delete(&self, res: &Res, ns: Option<&str>, name: &str) -> Result<(), ApiError> {
        let body = serde_json::to_vec(&json!({"propagationPolicy": "Background"})).unwrap_or_default();
        match self
            .call(http::Method::DELETE, &format!("{}/{name}", res.path(ns)), Some(("application/json", body)))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
