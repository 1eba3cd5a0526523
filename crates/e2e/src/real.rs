//! Verno installed in a real control plane: etcd, kube-apiserver, kube-controller-manager and
//! kwok built from the Go module proxy (`scripts/install-control-plane.sh`) and started on
//! loopback by `scripts/cluster.sh`; Verno installed as a user installs it (`verno manifests`
//! applied with kubectl) for a Verno that runs outside the cluster (`--server-url`, Kyverno's
//! `--serverIP`); and `verno serve --kube` run as its own process with its ServiceAccount's
//! token (TokenRequest), so RBAC, admission, garbage collection and watches are the real ones.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What to start.
pub struct RealOptions<'a> {
    /// The repository (for `scripts/` and `.tools/bin`).
    pub repo: &'a Path,
    /// The `verno` binary.
    pub verno: &'a Path,
    /// An empty folder for this cluster (its data, certificates, logs).
    pub dir: &'a Path,
    /// Verno's namespace.
    pub namespace: &'a str,
    /// Verno's own ServiceAccount, as the values name it (`manifests::SERVICE_ACCOUNT` unless
    /// set): its token is Verno's credentials.
    pub account: &'a str,
    /// `verno manifests -f` values files (the chart's shape).
    pub values_files: &'a [PathBuf],
    /// More `verno serve` arguments.
    pub extra_args: &'a [String],
    /// The API server's `--runtime-config` (`None`: `scripts/cluster.sh`'s, which serves
    /// MutatingAdmissionPolicy at v1beta1).
    pub runtime_config: Option<&'a str>,
    /// How the API server reaches Verno's webhooks.
    pub reach: Reach,
}

/// How the API server reaches the webhooks of a Verno that runs on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// `verno manifests --server-url` / `verno serve --server-url` (Kyverno's `--serverIP`):
    /// every webhook entry names a `url` on 127.0.0.1.
    Url,
    /// As an in-cluster install: the entries name Verno's Service (`clientConfig.service`), as
    /// Kyverno's do. Verno listens on a non-loopback address of the host (EndpointSlice
    /// validation refuses loopback) and the Service's EndpointSlice points there; the API
    /// server (`--enable-aggregator-routing`, `scripts/cluster.sh`) calls a Service's
    /// endpoints directly, as there is no kube-proxy. The install is the chart's except its
    /// Deployment (Verno is the host process). Falls back to `Url` on a host without such an
    /// address (the reason is logged in the runner's output).
    ServiceIfPossible,
}

/// A non-loopback IPv4 address of this host (`VERNO_E2E_HOST_IP`, else the first global-scope
/// address `ip` lists, else `hostname -I`'s first IPv4).
pub fn host_address() -> Option<std::net::Ipv4Addr> {
    let usable = |a: &std::net::Ipv4Addr| !a.is_loopback() && !a.is_link_local() && !a.is_unspecified();
    if let Some(a) = std::env::var("VERNO_E2E_HOST_IP").ok().and_then(|s| s.trim().parse().ok()) {
        return Some(a).filter(usable);
    }
    let words = |cmd: &mut Command| -> Vec<String> {
        cmd.stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    // `ip -4 -o addr show scope global`: "2: eth0    inet 192.0.2.2/24 brd …".
    let from_ip = words(Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]));
    let ip_addrs = from_ip.windows(2).filter_map(|w| match w {
        [inet, addr] if inet == "inet" => addr.split('/').next()?.parse().ok(),
        _ => None,
    });
    let hostname = words(Command::new("hostname").arg("-I"));
    let host_addrs = hostname.iter().filter_map(|w| w.parse().ok());
    ip_addrs.chain(host_addrs).find(usable)
}

/// The manifests without their Deployments (Verno runs on the host), and the Service the
/// webhook configurations name (namespace, name), read from the rendered stream.
fn without_deployment(manifests: &str) -> Result<(String, (String, String))> {
    let mut kept = Vec::new();
    let mut service = None;
    for doc in manifests.split("\n---\n") {
        if doc.trim().trim_start_matches("---").trim().is_empty() {
            continue;
        }
        let v: Value = serde_saphyr::from_str(doc).with_context(|| format!("reading a rendered manifest:\n{doc}"))?;
        if v.get("kind").and_then(Value::as_str) == Some("Deployment") {
            continue;
        }
        if service.is_none()
            && let Some(svc) = v.pointer("/webhooks/0/clientConfig/service")
            && let (Some(ns), Some(name)) =
                (svc.get("namespace").and_then(Value::as_str), svc.get("name").and_then(Value::as_str))
        {
            service = Some((ns.to_string(), name.to_string()));
        }
        kept.push(doc);
    }
    let service = service.ok_or_else(|| anyhow!("no webhook configuration of the manifests names a Service"))?;
    Ok((kept.join("\n---\n"), service))
}

/// A running control plane with Verno in it; stopped (processes killed, data removed) on drop.
pub struct RealCluster {
    pub dir: PathBuf,
    /// The administrator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// Verno's own kubeconfig (its ServiceAccount's token).
    pub verno_kubeconfig: PathBuf,
    pub verno_log: PathBuf,
    repo: PathBuf,
    verno: Option<std::process::Child>,
}

/// The tools the real control plane needs, in `.tools/bin`.
const TOOLS: [&str; 5] = ["etcd", "kube-apiserver", "kube-controller-manager", "kwok", "kubectl"];

/// Builds or fetches the pinned tools when missing (the scripts cache by version: a second run
/// takes seconds).
pub fn install_tools(repo: &Path) -> Result<()> {
    if TOOLS.iter().all(|t| repo.join(".tools/bin").join(t).is_file()) {
        return Ok(());
    }
    for (script, args) in [
        ("scripts/install-control-plane.sh", vec!["etcd", "kube-apiserver", "kube-controller-manager", "kwok"]),
        ("scripts/install-kubectl.sh", vec![]),
    ] {
        let out = Command::new("bash").arg(repo.join(script)).args(&args).current_dir(repo).output()?;
        if !out.status.success() {
            bail!("{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Runs a command and returns its stdout; the error carries its stderr.
fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| what.to_string())?;
    if !out.status.success() {
        bail!("{what} failed: {}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies a YAML stream server-side, as `kubectl apply --server-side` (the install's way).
fn apply(kubectl: &Path, kubeconfig: &Path, yaml: &str) -> Result<()> {
    let mut child = Command::new(kubectl)
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("kubectl has no stdin"))?;
        stdin.write_all(yaml.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl RealCluster {
    /// Starts the control plane, installs Verno and starts it; ready when the API server's
    /// webhook configurations carry Verno's CA.
    pub async fn start(o: RealOptions<'_>) -> Result<RealCluster> {
        let mut cluster = RealCluster::bare_with(o.repo, o.dir, o.runtime_config)?;
        let cp = o.dir.join("control-plane");
        let kubeconfig = cluster.kubeconfig.clone();
        let kubectl = o.repo.join(".tools/bin/kubectl");
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let host = match o.reach {
            Reach::Url => None,
            Reach::ServiceIfPossible => {
                let host = host_address();
                if host.is_none() {
                    eprintln!("no non-loopback IPv4 address on this host: webhooks call a url instead of the Service");
                }
                host
            }
        };
        // The install, as a user runs it: CRDs, then the rest — for a Verno outside the cluster
        // (`--server-url`), or the in-cluster install without its Deployment.
        let crds = run(Command::new(o.verno).args(["manifests", "--crds"]), "verno manifests --crds")?;
        apply(&kubectl, &kubeconfig, &crds)?;
        let mut m = Command::new(o.verno);
        m.args(["manifests", "-n", o.namespace]);
        if host.is_none() {
            m.args(["--server-url", &url]);
        }
        for v in o.values_files {
            m.arg("-f").arg(v);
        }
        let manifests = run(&mut m, "verno manifests")?;
        let mut service = None;
        match host {
            None => apply(&kubectl, &kubeconfig, &manifests)?,
            Some(ip) => {
                let (manifests, (ns, name)) = without_deployment(&manifests)?;
                apply(&kubectl, &kubeconfig, &manifests)?;
                // The Service's endpoint: this host, at Verno's port (the Service's port is
                // named `https`).
                let slice = serde_json::json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{name}-host"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "verno-e2e"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                });
                apply(&kubectl, &kubeconfig, &slice.to_string())?;
                service = Some(name);
            }
        }
        // Verno's credentials: its ServiceAccount's token, from the TokenRequest API.
        let token = run(
            Command::new(&kubectl)
                .args(["create", "token", o.account, "-n", o.namespace, "--duration", "24h"])
                .env("KUBECONFIG", &kubeconfig),
            "kubectl create token",
        )?;
        let server = run(
            Command::new(&kubectl)
                .args(["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"])
                .env("KUBECONFIG", &kubeconfig),
            "kubectl config view",
        )?;
        let ca = cp.join("ca.crt");
        std::fs::write(
            &cluster.verno_kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: verno\n  user:\n    token: {}\ncontexts:\n- name: verno\n  context: {{cluster: real, user: verno}}\ncurrent-context: verno\n",
                ca.display(),
                token.trim()
            ),
        )?;
        let log = std::fs::File::create(&cluster.verno_log)?;
        let child = Command::new(o.verno)
            .args(["serve", "--kube", "--namespace", o.namespace, "--identity", "verno-0"])
            .args(["--owner-cluster-role", "verno:admission-controller"])
            .args(match host {
                None => vec!["--server-url".to_string(), url.clone(), "--addr".into(), format!("127.0.0.1:{port}")],
                // The Service as the Deployment names it (its certificate is for that name).
                Some(ip) => vec![
                    "--addr".to_string(),
                    format!("{ip}:{port}"),
                    "--service".into(),
                    service.clone().unwrap_or_default(),
                ],
            })
            .args(["--metrics-addr", "127.0.0.1:0"])
            .arg("--tls-dir")
            .arg(o.dir.join("tls"))
            .args(o.extra_args)
            .env("KUBECONFIG", &cluster.verno_kubeconfig)
            .env("RUST_LOG", std::env::var("VERNO_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", o.verno.display()))?;
        cluster.verno = Some(child);
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// The control plane alone, without Verno (`scripts/cluster.sh up` in `dir`/control-plane):
    /// a baseline to compare with; stopped on drop like the rest.
    pub fn bare(repo: &Path, dir: &Path) -> Result<RealCluster> {
        RealCluster::bare_with(repo, dir, None)
    }

    /// [`RealCluster::bare`] with the API server's `--runtime-config` (`VERNO_RUNTIME_CONFIG`
    /// of `scripts/cluster.sh`).
    pub fn bare_with(repo: &Path, dir: &Path, runtime_config: Option<&str>) -> Result<RealCluster> {
        let cp = dir.join("control-plane");
        let mut up = Command::new("bash");
        up.arg(repo.join("scripts/cluster.sh")).arg("up").arg(&cp);
        if let Some(rc) = runtime_config {
            up.env("VERNO_RUNTIME_CONFIG", rc);
        }
        let up = run(&mut up, "cluster.sh up")?;
        let kubeconfig = cp.join("kubeconfig");
        let cluster = RealCluster {
            dir: dir.to_path_buf(),
            kubeconfig,
            verno_kubeconfig: dir.join("verno-kubeconfig"),
            verno_log: dir.join("verno.log"),
            repo: repo.to_path_buf(),
            verno: None,
        };
        if !up.contains("KUBECONFIG=") || !cluster.kubeconfig.is_file() {
            bail!("cluster.sh up wrote no kubeconfig:\n{up}");
        }
        Ok(cluster)
    }

    /// The process id of `verno serve` (None for a bare cluster).
    pub fn verno_pid(&self) -> Option<u32> {
        self.verno.as_ref().map(std::process::Child::id)
    }

    /// Stops `verno serve` (the webhook configurations it wrote stay as they are).
    pub fn stop_verno(&mut self) {
        if let Some(mut c) = self.verno.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The administrator's client.
    pub async fn client(&self) -> Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// The last lines of Verno's log.
    pub fn verno_log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.verno_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines.get(lines.len().saturating_sub(n)..).unwrap_or_default().join("\n")
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client().await?;
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
            client,
            &kube::api::ApiResource {
                group: "admissionregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "admissionregistration.k8s.io/v1".into(),
                kind: "ValidatingWebhookConfiguration".into(),
                plural: "validatingwebhookconfigurations".into(),
            },
        );
        let start = Instant::now();
        loop {
            // Under Verno's names or Kyverno's (`kyvernoNames`), whichever the install used.
            let names =
                [verno_controller::webhooks::VALIDATING_CONFIG, verno_controller::webhooks::KYVERNO_POLICY_CONFIG];
            let mut found = None;
            for name in names {
                if let Ok(Some(v)) = api.get_opt(name).await {
                    found = Some(v);
                    break;
                }
            }
            if let Some(v) = found
                && serde_json::to_value(&v)
                    .ok()
                    .and_then(|v| v.pointer("/webhooks/0/clientConfig/caBundle").cloned())
                    .is_some_and(|b| matches!(b, Value::String(_)))
            {
                return Ok(());
            }
            if let Some(c) = self.verno.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!("verno exited ({status}); its log ends:\n{}", self.verno_log_tail(30));
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("Verno did not become ready within 60 s; its log ends:\n{}", self.verno_log_tail(30));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.verno.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var_os("VERNO_KEEP_CLUSTER").is_some() {
            eprintln!(
                "kept: KUBECONFIG={} (scripts/cluster.sh down {})",
                self.kubeconfig.display(),
                self.dir.join("control-plane").display()
            );
            return;
        }
        let _ = Command::new("bash")
            .arg(self.repo.join("scripts/cluster.sh"))
            .arg("down")
            .arg(self.dir.join("control-plane"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
