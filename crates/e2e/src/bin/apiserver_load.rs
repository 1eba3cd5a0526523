//! Load through a real kube-apiserver: Kyverno's published scaling rig, redone
//! without k6. N concurrent clients each create a Pod in their own namespace and delete it
//! (grace period 0), in a loop, for T seconds after a 2 s warm-up, against a real control plane
//! (`scripts/cluster.sh`: etcd, kube-apiserver, kube-controller-manager, kwok; no scheduler, so
//! the Pods name `kwok-node-0`) in up to three configurations, one fresh cluster each, one after
//! the other:
//!
//!   baseline  no webhook (no Verno);
//!   enforce   Verno installed (`verno manifests --server-url`, `verno serve --kube`) with the 17
//!             Pod Security policies of `../shared/bench/policies/pss-17` in Enforce;
//!   audit     the same policies in Audit, admission reports on (the default);
//!   floor     the webhook registrations of `enforce`, served by `webhook-floor` (crates/floor:
//!             parse the review, answer allowed) instead of Verno: what calling any webhook
//!             costs the API server on this machine, so that `enforce` can be read against it.
//!             Its `verno_*` figures are the floor process's.
//!
//! The Pods follow the restricted profile, so every policy passes and Enforce admits them all.
//!
//!   apiserver-load [--clients 100] [--seconds 30] [--modes baseline,enforce,audit,floor]
//!                  [--verno PATH] [--repo DIR] [--policies DIR]
//!
//! One line per configuration on stdout (everything else goes to stderr):
//!
//!   apiserver-load: mode=M clients=N seconds=T requests=R errors=E avg_ms=… p95_ms=… p99_ms=…
//!                   max_ms=… verno_peak_rss_mib=… verno_cpu_s=…
//!
//! `requests` counts the creates started in the measured window, the latencies are theirs (the
//! admission path is on create); `errors` counts the failed creates and deletes of the window
//! (the first few messages are logged). Verno's peak RSS is its VmHWM at the end of the window,
//! its CPU seconds the growth of utime+stime over the window.

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use verno_e2e::real::{RealCluster, RealOptions, install_tools};

const MAX_CLIENTS: usize = 2000;
const MAX_SECONDS: u64 = 3600;
const WARMUP: Duration = Duration::from_secs(2);
/// Workers sharing one `kube::Client` (each client has its own connection pool).
const WORKERS_PER_CLIENT: usize = 25;
/// Error messages logged per configuration.
const LOGGED_ERRORS: usize = 5;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Baseline,
    Enforce,
    Audit,
    Floor,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline",
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
            Mode::Floor => "floor",
        }
    }
}

struct Args {
    clients: usize,
    seconds: u64,
    modes: Vec<Mode>,
    verno: PathBuf,
    floor: PathBuf,
    repo: PathBuf,
    policies: PathBuf,
}

const USAGE: &str = "usage: apiserver-load [--clients N] [--seconds T] [--modes baseline,enforce,audit,floor] \
                     [--verno PATH] [--repo DIR] [--policies DIR]";

fn args() -> Result<Args> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut clients = 100;
    let mut seconds = 30;
    let mut modes = vec![Mode::Baseline, Mode::Enforce, Mode::Audit];
    let mut verno = exe.with_file_name("verno");
    let mut repo = exe.ancestors().find(|d| d.join("scripts/cluster.sh").is_file()).map(Path::to_path_buf);
    let mut policies = None;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--help" || k == "-h" {
            bail!("{USAGE}");
        }
        let v = it.next().ok_or_else(|| anyhow!("{k} needs a value\n{USAGE}"))?;
        match k.as_str() {
            "--clients" => clients = v.parse().with_context(|| format!("--clients {v}"))?,
            "--seconds" => seconds = v.parse().with_context(|| format!("--seconds {v}"))?,
            "--modes" => {
                modes = v
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(|m| match m {
                        "baseline" => Ok(Mode::Baseline),
                        "enforce" => Ok(Mode::Enforce),
                        "audit" => Ok(Mode::Audit),
                        "floor" => Ok(Mode::Floor),
                        other => Err(anyhow!("unknown mode {other} (baseline, enforce, audit, floor)")),
                    })
                    .collect::<Result<_>>()?
            }
            "--verno" => verno = v.into(),
            "--repo" => repo = Some(v.into()),
            "--policies" => policies = Some(PathBuf::from(v)),
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if !(1..=MAX_CLIENTS).contains(&clients) {
        bail!("--clients {clients}: between 1 and {MAX_CLIENTS}");
    }
    if !(1..=MAX_SECONDS).contains(&seconds) {
        bail!("--seconds {seconds}: between 1 and {MAX_SECONDS}");
    }
    if modes.is_empty() {
        bail!("--modes: name at least one of baseline, enforce, audit, floor");
    }
    let repo =
        repo.ok_or_else(|| anyhow!("the repository (scripts/cluster.sh) is not above this binary: pass --repo"))?;
    let policies = policies.unwrap_or_else(|| repo.join("../shared/bench/policies/pss-17"));
    if modes.iter().any(|m| *m != Mode::Baseline) {
        if !verno.is_file() {
            bail!("{} is not built (cargo build -p verno, or pass --verno)", verno.display());
        }
        if !policies.is_dir() {
            bail!("{} not found (pass --policies)", policies.display());
        }
    }
    let floor = exe.with_file_name("webhook-floor");
    if modes.contains(&Mode::Floor) && !floor.is_file() {
        bail!("{} is not built (cargo build --release -p verno-floor)", floor.display());
    }
    Ok(Args { clients, seconds, modes, verno, floor, repo, policies })
}

/// The policies of `dir` with every failure action set to `action` (Enforce or Audit).
fn policies(dir: &Path, action: &str) -> Result<Vec<Value>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let mut out = Vec::new();
    for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "yaml" || e == "yml")) {
        let text = std::fs::read_to_string(&f).with_context(|| format!("{}", f.display()))?;
        let mut p: Value = serde_saphyr::from_str(&text).with_context(|| format!("{}", f.display()))?;
        if let Some(spec) = p.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("validationFailureAction".into(), json!(action));
            for rule in spec.get_mut("rules").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(v) = rule.get_mut("validate").and_then(Value::as_object_mut)
                    && v.contains_key("failureAction")
                {
                    v.insert("failureAction".into(), json!(action));
                }
            }
        }
        out.push(p);
    }
    if out.is_empty() {
        bail!("no policy in {}", dir.display());
    }
    Ok(out)
}

/// A Pod of the restricted profile: passes all 17 Pod Security policies.
fn pod(ns: &str) -> Result<Pod> {
    let restricted = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}});
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "load", "namespace": ns, "labels": {"app": "apiserver-load"}},
        "spec": {
            "nodeName": "kwok-node-0",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "securityContext": restricted}]
        }
    }))?)
}

/// A Pod the policies deny (privileged, host network): the probe that Enforce is in place.
fn bad_pod(ns: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "probe-privileged", "namespace": ns},
        "spec": {"nodeName": "kwok-node-0", "hostNetwork": true,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "securityContext": {"privileged": true}}]}
    }))?)
}

fn log(t0: Instant, msg: &str) {
    eprintln!("[{:7.1} s] {msg}", t0.elapsed().as_secs_f64());
}

fn namespace(i: usize) -> String {
    format!("load-{i}")
}

/// Creates one namespace per client and waits until each has its `default` ServiceAccount
/// (the ServiceAccount admission plugin refuses Pods before).
async fn namespaces(client: &kube::Client, n: usize) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for i in 0..n {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace(i)}}))?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", namespace(i)))?;
    }
    let sas: Api<ServiceAccount> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let list = sas.list(&ListParams::default().fields("metadata.name=default")).await?;
        let ready = list
            .items
            .iter()
            .filter(|sa| sa.metadata.namespace.as_deref().is_some_and(|ns| ns.starts_with("load-")))
            .count();
        if ready >= n {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("only {ready} of {n} namespaces have their default ServiceAccount after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies the policies and waits until each is ready, the validating webhook has Pod rules and
/// (Enforce) a bad Pod is denied through the API server.
async fn install_policies(client: &kube::Client, dir: &Path, mode: Mode) -> Result<()> {
    let enforce = matches!(mode, Mode::Enforce | Mode::Floor);
    let action = if enforce { "Enforce" } else { "Audit" };
    let docs = policies(dir, action)?;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &verno_controller::policies::cluster_policy_resource());
    let mut names = Vec::new();
    for p in &docs {
        let name = p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        api.patch(&name, &PatchParams::apply("apiserver-load").force(), &Patch::Apply(p))
            .await
            .with_context(|| format!("applying policy {name}"))?;
        names.push(name);
    }
    let start = Instant::now();
    for name in &names {
        loop {
            let p = api.get(name).await?;
            if p.data.pointer("/status/ready") == Some(&Value::Bool(true)) {
                break;
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("policy {name} not ready after 120 s: {}", p.data.get("status").unwrap_or(&Value::Null));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let vwc: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: "ValidatingWebhookConfiguration".into(),
            plural: "validatingwebhookconfigurations".into(),
        },
    );
    loop {
        let c = vwc.get(verno_controller::webhooks::VALIDATING_CONFIG).await?;
        let has_pods = c.data.get("webhooks").and_then(Value::as_array).into_iter().flatten().any(|w| {
            w.get("rules").and_then(Value::as_array).into_iter().flatten().any(|r| {
                r.get("resources").and_then(Value::as_array).into_iter().flatten().any(|x| x.as_str() == Some("pods"))
            })
        });
        if has_pods {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the validating webhook has no Pod rules after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if enforce {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace(0));
        let bad = bad_pod(&namespace(0))?;
        loop {
            match pods.create(&PostParams::default(), &bad).await {
                Err(kube::Error::Api(s)) if s.message.contains("denied the request") => break,
                Err(e) => return Err(anyhow!(e).context("the Enforce probe was refused for another reason")),
                Ok(_) => {
                    pods.delete(
                        "probe-privileged",
                        &DeleteParams { grace_period_seconds: Some(0), ..Default::default() },
                    )
                    .await?;
                }
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("a privileged Pod is still admitted 120 s after the policies were applied");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    } else {
        // No denial to wait for: give the API server's webhook configuration cache a moment.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// `webhook-floor`, killed on drop.
struct Floor(std::process::Child);

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn webhook_config_api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
    let ar = if kind == "MutatingWebhookConfiguration" {
        ApiResource::erase::<MutatingWebhookConfiguration>(&())
    } else {
        ApiResource::erase::<ValidatingWebhookConfiguration>(&())
    };
    Api::all_with(client.clone(), &ar)
}

/// Starts `webhook-floor`, copies Verno's resource webhook configurations (every entry, rule,
/// selector, match condition, timeout and failure policy as Verno wrote them for the policies)
/// to configurations that call the floor, stops Verno and deletes its configurations.
async fn switch_to_floor(admin: &kube::Client, cluster: &mut RealCluster, a: &Args) -> Result<Floor> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let pem = cluster.dir.join("floor.pem");
    let child = std::process::Command::new(&a.floor)
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cert-out")
        .arg(&pem)
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", a.floor.display()))?;
    let floor = Floor(child);
    let start = Instant::now();
    while !(pem.is_file() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()) {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("webhook-floor did not listen on 127.0.0.1:{port} within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ByteString serializes as base64, as `caBundle` wants.
    let ca = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(&pem)?))?;
    let configs = [
        ("ValidatingWebhookConfiguration", verno_controller::webhooks::VALIDATING_CONFIG),
        ("MutatingWebhookConfiguration", verno_controller::webhooks::MUTATING_CONFIG),
    ];
    let mut copies = Vec::new();
    for (kind, name) in configs {
        let c = serde_json::to_value(webhook_config_api(admin, kind).get(name).await?)?;
        let mut hooks = c.get("webhooks").cloned().unwrap_or_else(|| json!([]));
        for h in hooks.as_array_mut().into_iter().flatten() {
            let rules = h.get("rules").and_then(Value::as_array).map_or(0, Vec::len);
            if rules > 0 {
                eprintln!("floor: {kind} entry {} ({rules} rules): {}", h["name"], h["rules"]);
            }
            h["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": ca});
        }
        copies.push((
            kind,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": format!("floor-{name}")},
                "webhooks": hooks,
            }),
        ));
    }
    cluster.stop_verno();
    for (kind, doc) in &copies {
        let api = webhook_config_api(admin, kind);
        let obj: DynamicObject = serde_json::from_value(doc.clone())?;
        api.create(&PostParams::default(), &obj).await.with_context(|| format!("creating the floor's {kind}"))?;
        for c in api.list(&ListParams::default()).await? {
            let n = c.metadata.name.unwrap_or_default();
            if !n.starts_with("floor-") {
                api.delete(&n, &DeleteParams::default()).await?;
            }
        }
    }
    // The API server picks configurations up from its informer: give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(floor)
}

/// What one client did.
#[derive(Default)]
struct Tally {
    creates: u64,
    deletes: u64,
    errors: u64,
    warmup_errors: u64,
    create_ms: Vec<f64>,
    delete_ms: Vec<f64>,
    messages: Vec<String>,
}

impl Tally {
    fn error(&mut self, counted: bool, what: String) {
        if counted {
            self.errors += 1;
        } else {
            self.warmup_errors += 1;
        }
        if self.messages.len() < LOGGED_ERRORS {
            self.messages.push(what);
        }
    }

    fn merge(&mut self, o: Tally) {
        self.creates += o.creates;
        self.deletes += o.deletes;
        self.errors += o.errors;
        self.warmup_errors += o.warmup_errors;
        self.create_ms.extend(o.create_ms);
        self.delete_ms.extend(o.delete_ms);
        for m in o.messages {
            if self.messages.len() < LOGGED_ERRORS {
                self.messages.push(m);
            }
        }
    }
}

/// One client: create, delete, until `end`; counts what started at or after `measure`.
async fn worker(client: kube::Client, i: usize, measure: Instant, end: Instant) -> Result<Tally> {
    let ns = namespace(i);
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let mut template = pod(&ns)?;
    let delete = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    let mut t = Tally::default();
    let mut seq = 0u64;
    loop {
        let started = Instant::now();
        if started >= end {
            return Ok(t);
        }
        let counted = started >= measure;
        seq += 1;
        let name = format!("load-{i}-{seq}");
        template.metadata.name = Some(name.clone());
        let created = pods.create(&PostParams::default(), &template).await;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if counted {
            t.creates += 1;
        }
        if let Err(e) = created {
            t.error(counted, format!("create {ns}/{name}: {e}"));
            // Do not spin on an error.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if counted {
            t.create_ms.push(ms);
        }
        let d0 = Instant::now();
        let deleted = pods.delete(&name, &delete).await;
        if counted {
            t.deletes += 1;
            t.delete_ms.push(d0.elapsed().as_secs_f64() * 1e3);
        }
        if let Err(e) = deleted {
            t.error(counted, format!("delete {ns}/{name}: {e}"));
        }
    }
}

/// `p` in 0..=1 of sorted values (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// VmHWM of `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim();
    kb.parse::<f64>().ok().map(|kb| kb / 1024.0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces): state is field 3.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// One configuration on a fresh cluster; returns its output line.
async fn run_mode(a: &Args, mode: Mode, t0: Instant) -> Result<String> {
    let dir = tempfile::Builder::new().prefix("apiserver-load-").tempdir()?;
    log(t0, &format!("{}: starting the control plane in {}", mode.name(), dir.path().display()));
    let mut cluster = match mode {
        Mode::Baseline => RealCluster::bare(&a.repo, dir.path())?,
        Mode::Enforce | Mode::Audit | Mode::Floor => {
            RealCluster::start(RealOptions {
                account: verno_controller::manifests::SERVICE_ACCOUNT,
                repo: &a.repo,
                verno: &a.verno,
                dir: dir.path(),
                namespace: "verno",
                values_files: &[],
                extra_args: &[],
                runtime_config: None,
                reach: verno_e2e::real::Reach::Url,
            })
            .await?
        }
    };
    let result = measure(a, mode, &mut cluster, t0).await;
    if result.is_err() && cluster.verno_pid().is_some() {
        eprintln!("verno's log ends:\n{}", cluster.verno_log_tail(30));
    }
    log(t0, &format!("{}: stopping the control plane", mode.name()));
    drop(cluster);
    result
}

async fn measure(a: &Args, mode: Mode, cluster: &mut RealCluster, t0: Instant) -> Result<String> {
    let admin = cluster.client().await?;
    namespaces(&admin, a.clients).await?;
    log(t0, &format!("{}: {} namespaces ready", mode.name(), a.clients));
    if mode != Mode::Baseline {
        install_policies(&admin, &a.policies, mode).await?;
        log(t0, &format!("{}: policies ready", mode.name()));
    }
    let floor = if mode == Mode::Floor {
        let f = switch_to_floor(&admin, cluster, a).await?;
        log(t0, "floor: Verno stopped, its webhook registrations now call webhook-floor");
        Some(f)
    } else {
        None
    };
    let pid = floor.as_ref().map(|f| f.0.id()).or_else(|| cluster.verno_pid());
    let mut clients = Vec::new();
    for _ in 0..a.clients.div_ceil(WORKERS_PER_CLIENT) {
        clients.push(cluster.client().await?);
    }
    let start = Instant::now();
    let measure = start + WARMUP;
    let end = measure + Duration::from_secs(a.seconds);
    let mut workers = Vec::new();
    for i in 0..a.clients {
        let client = clients.get(i / WORKERS_PER_CLIENT).cloned().ok_or_else(|| anyhow!("no client for worker {i}"))?;
        workers.push(tokio::spawn(worker(client, i, measure, end)));
    }
    tokio::time::sleep_until(measure.into()).await;
    let cpu0 = pid.and_then(cpu_ticks);
    log(t0, &format!("{}: warmed up; measuring {} s with {} clients", mode.name(), a.seconds, a.clients));
    let mut total = Tally::default();
    for w in workers {
        total.merge(w.await.map_err(|e| anyhow!("a client task failed: {e}"))??);
    }
    let window = measure.elapsed().as_secs_f64();
    let cpu1 = pid.and_then(cpu_ticks);
    let rss = pid.and_then(peak_rss_mib);
    if let Some(p) = pid
        && (cpu1.is_none() || rss.is_none())
    {
        bail!("the webhook (pid {p}) is gone: Verno's log ends:\n{}", cluster.verno_log_tail(30));
    }
    for m in &total.messages {
        eprintln!("  error: {m}");
    }
    let mut lat = std::mem::take(&mut total.create_ms);
    lat.sort_by(f64::total_cmp);
    let avg = (!lat.is_empty()).then(|| lat.iter().sum::<f64>() / lat.len() as f64);
    let del_avg =
        (!total.delete_ms.is_empty()).then(|| total.delete_ms.iter().sum::<f64>() / total.delete_ms.len() as f64);
    log(
        t0,
        &format!(
            "{}: {} creates ({:.1}/s), {} deletes (avg {} ms), {} errors (+{} in the warm-up), window {:.1} s",
            mode.name(),
            total.creates,
            total.creates as f64 / window,
            total.deletes,
            fmt_ms(del_avg),
            total.errors,
            total.warmup_errors,
            window
        ),
    );
    let (rss, cpu) = match (rss, cpu0, cpu1) {
        (Some(r), Some(c0), Some(c1)) => {
            (format!("{r:.1}"), format!("{:.2}", c1.saturating_sub(c0) as f64 / clock_ticks_per_second()))
        }
        _ => ("-".to_string(), "-".to_string()),
    };
    Ok(format!(
        "apiserver-load: mode={} clients={} seconds={} requests={} errors={} avg_ms={} p95_ms={} p99_ms={} max_ms={} verno_peak_rss_mib={rss} verno_cpu_s={cpu}",
        mode.name(),
        a.clients,
        a.seconds,
        total.creates,
        total.errors,
        fmt_ms(avg),
        fmt_ms(percentile(&lat, 0.95)),
        fmt_ms(percentile(&lat, 0.99)),
        fmt_ms(lat.last().copied()),
    ))
}

async fn run(a: &Args) -> Result<()> {
    let t0 = Instant::now();
    install_tools(&a.repo)?;
    for mode in &a.modes {
        let line = run_mode(a, *mode, t0).await.with_context(|| format!("mode {}", mode.name()))?;
        println!("{line}");
    }
    log(t0, "done");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // On Ctrl-C or TERM the run is dropped, and with it the cluster (its Drop stops it).
    tokio::select! {
        r = run(&a) => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        _ = term.recv() => bail!("terminated"),
    }
}
