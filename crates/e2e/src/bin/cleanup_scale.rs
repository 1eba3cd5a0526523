//! The cleanup scale benchmark (issue 18): `verno serve --kube` against the fake API server
//! holding N ConfigMaps (50,000 by default, in 50 namespaces), of which a DeletingPolicy that
//! is due at once selects a fifth: its `objectSelector` (pushed down to the API server) picks
//! 2/5 of them and its CEL condition half of those. Measures the time until every selected
//! object is gone, Verno's peak RSS, and checks the fake's request log: every list Verno made
//! was paginated (`limit`), nothing else was deleted.
//!
//!   cleanup-scale --verno target/release/verno [--objects 50000] [--deletes-per-second 100]
//!
//! Last line: `cleanup-scale: objects=N deleted=D seconds=T peak_rss_mib=M lists=L unpaginated_lists=U`.

use anyhow::{Context, Result, anyhow, bail};
use fake_apiserver::FakeApiServer;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use verno_controller::{crds, manifests};

const NAMESPACES: usize = 50;

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Object `i`: its namespace, name and `tier` label (every 5th `scratch`, the next `temp`,
/// the rest `keep`). The policy deletes `scratch` and `temp` objects whose index is even… of
/// the selected: half. Selected: 2/5; deleted: 1/5.
fn object(i: usize) -> (String, String, &'static str) {
    let tier = match i % 5 {
        0 => "scratch",
        1 => "temp",
        _ => "keep",
    };
    (format!("load-{}", i % NAMESPACES), format!("cm-{i}"), tier)
}

fn due(i: usize) -> bool {
    i % 5 < 2 && (i / 5).is_multiple_of(2)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut verno = PathBuf::new();
    let mut objects = 50_000usize;
    let mut rate = 100.0f64;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| anyhow!("{k} needs a value"))?;
        match k.as_str() {
            "--verno" => verno = v.into(),
            "--objects" => objects = v.parse()?,
            "--deletes-per-second" => rate = v.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if verno.as_os_str().is_empty() {
        bail!("usage: cleanup-scale --verno PATH [--objects N] [--deletes-per-second R]");
    }
    let dir = tempfile::tempdir()?;
    let fake = FakeApiServer::start(fake_apiserver::default_resources()).await?;
    let admin = fake.client(None).map_err(|e| anyhow!(e))?;
    let values = manifests::Values {
        cleanup_extra_resources: vec![
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "delete"]}),
        ],
        ..manifests::Values::default()
    };
    for doc in crds::all().into_iter().chain(manifests::render(&values)) {
        fake.apply(&admin, &doc).await.map_err(|e| anyhow!("installing Verno: {e}"))?;
    }
    let ns_api: Api<DynamicObject> =
        Api::all_with(admin.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()));
    for n in 0..NAMESPACES {
        let ns: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("load-{n}")}}),
        )?;
        ns_api.create(&PostParams::default(), &ns).await?;
    }
    let cm_res = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    // The install's own ConfigMaps (Verno's configuration) stay.
    let baseline = fake.count("", "configmaps");
    let t0 = Instant::now();
    let created = futures_util::stream::iter(0..objects)
        .map(|i| {
            let admin = admin.clone();
            let cm_res = cm_res.clone();
            async move {
                let (ns, name, tier) = object(i);
                let api: Api<DynamicObject> = Api::namespaced_with(admin, &ns, &cm_res);
                let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"tier": tier, "batch": format!("b{}", (i / 5) % 2)}},
                    "data": {"payload": "x".repeat(200)}}))?;
                api.create(&PostParams::default(), &cm).await.map(|_| ()).map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        return Err(e.context("creating ConfigMaps"));
    }
    eprintln!("{objects} ConfigMaps created in {:.1} s", t0.elapsed().as_secs_f64());
    let expected = (0..objects).filter(|i| due(*i)).count();

    let dpol = ApiResource {
        group: "policies.kyverno.io".into(),
        version: "v1".into(),
        api_version: "policies.kyverno.io/v1".into(),
        kind: "DeletingPolicy".into(),
        plural: "deletingpolicies".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &dpol);
    let policy = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "expired-scratch"},
        "spec": {"schedule": "0 3 * * *",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
                "objectSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["scratch", "temp"]}]}},
            "conditions": [{"name": "first-batch", "expression": "object.metadata.labels['batch'] == 'b0'"}]}});
    api.patch("expired-scratch", &PatchParams::apply("bench").force(), &Patch::Apply(&policy)).await?;
    // It last ran a day ago at 03:00: the next run is due at once.
    api.patch_status("expired-scratch", &PatchParams::apply("bench").force(), &Patch::Apply(json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "status": {"lastExecutionTime": "2020-01-01T03:00:00Z"}})))
        .await?;
    let requests_before = fake.requests().len();

    let config = dir.path().join("kubeconfig");
    let user = format!("system:serviceaccount:{}:{}", values.namespace, manifests::SERVICE_ACCOUNT);
    std::fs::write(&config, fake.kubeconfig().replace("  user: {}\n", &format!("  user:\n    as: {user}\n")))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = std::fs::File::create(dir.path().join("verno.log"))?;
    let t1 = Instant::now();
    let mut child = tokio::process::Command::new(&verno)
        .args(["serve", "--kube", "--namespace", &values.namespace, "--identity", "verno-0"])
        .args(["--service", manifests::SERVICE, "--deployment", manifests::DEPLOYMENT])
        .args(["--owner-cluster-role", manifests::CLUSTER_ROLE])
        .args(["--addr", &format!("127.0.0.1:{port}"), "--metrics-addr", "off"])
        .args(["--cleanup-deletes-per-second", &rate.to_string()])
        .arg("--tls-dir")
        .arg(dir.path().join("tls"))
        .env("KUBECONFIG", &config)
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", verno.display()))?;
    let pid = child.id().ok_or_else(|| anyhow!("verno exited at once"))?;
    fake.set_service(&values.namespace, manifests::SERVICE, Some(([127, 0, 0, 1], port).into()));
    let target = baseline + objects - expected;
    let limit = Duration::from_secs(60 + (expected as f64 / rate.max(1.0)) as u64 * 3);
    while fake.count("", "configmaps") > target {
        if t1.elapsed() > limit {
            bail!("{} ConfigMaps left after {} s (want {target})", fake.count("", "configmaps"), limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = peak_rss_mib(pid);
    let _ = child.kill().await;
    // What is left is exactly what the policy does not select.
    let left = fake.objects("", "configmaps");
    let wrong = left
        .iter()
        .filter(|o| {
            let name = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            name.strip_prefix("cm-").and_then(|i| i.parse::<usize>().ok()).is_some_and(due)
        })
        .count();
    let kept = left
        .iter()
        .filter(|o| o.pointer("/metadata/name").and_then(Value::as_str).is_some_and(|n| n.starts_with("cm-")))
        .count();
    if wrong > 0 || kept != objects - expected {
        bail!("after the run: {kept} ConfigMaps kept (want {}), {wrong} of them due", objects - expected);
    }
    let requests: Vec<_> = fake.requests().into_iter().skip(requests_before).collect();
    let lists: Vec<_> = requests
        .iter()
        .filter(|r| r.method == "GET" && !r.query.contains("watch=true") && !r.query.contains("watch=1"))
        .filter(|r| {
            // A collection: /api/v1/<plural>, /api/v1/namespaces/<ns>/<plural>, /apis/<g>/<v>/…
            let segs: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
            match segs.first() {
                Some(&"api") => segs.len() == 3 || (segs.len() == 5 && segs.get(2) == Some(&"namespaces")),
                Some(&"apis") => segs.len() == 4 || (segs.len() == 6 && segs.get(3) == Some(&"namespaces")),
                _ => false,
            }
        })
        .collect();
    let unpaginated: Vec<String> =
        lists.iter().filter(|r| !r.query.contains("limit=")).map(|r| format!("{}?{}", r.path, r.query)).collect();
    if !unpaginated.is_empty() {
        eprintln!("unpaginated lists: {unpaginated:?}");
    }
    let cm_lists = lists.iter().filter(|r| r.path.ends_with("/configmaps")).count();
    eprintln!("ConfigMap list pages: {cm_lists}; all lists: {}", lists.len());
    println!(
        "cleanup-scale: objects={objects} deleted={expected} seconds={seconds:.1} peak_rss_mib={rss:.1} lists={} unpaginated_lists={}",
        lists.len(),
        unpaginated.len()
    );
    Ok(())
}
