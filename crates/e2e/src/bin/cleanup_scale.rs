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

use anyhow::{Result, bail};
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use verno_controller::manifests;
use verno_e2e::scale::{self, Bench};

const NAMESPACES: usize = 50;

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

struct Args {
    verno: PathBuf,
    objects: usize,
    /// `--deletes-per-second`: Verno's cleanup pace.
    rate: f64,
}

fn args() -> Result<Args> {
    let mut a = Args { verno: PathBuf::new(), objects: 50_000, rate: 100.0 };
    scale::parse_flags(|k, v| {
        match k {
            "--verno" => a.verno = v.into(),
            "--objects" => a.objects = v.parse()?,
            "--deletes-per-second" => a.rate = v.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if a.verno.as_os_str().is_empty() {
        bail!("usage: cleanup-scale --verno PATH [--objects N] [--deletes-per-second R]");
    }
    Ok(a)
}

/// `objects` ConfigMaps across the namespaces.
async fn create_objects(bench: &Bench, objects: usize) -> Result<()> {
    let cm_res = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let t0 = Instant::now();
    let created = futures_util::stream::iter(0..objects)
        .map(|i| {
            let admin = bench.admin.clone();
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
    Ok(())
}

/// The DeletingPolicy, with a last run a day ago at 03:00: its next run is due at once.
async fn apply_policy(admin: &kube::Client) -> Result<()> {
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
    api.patch_status("expired-scratch", &PatchParams::apply("bench").force(), &Patch::Apply(json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "status": {"lastExecutionTime": "2020-01-01T03:00:00Z"}})))
        .await?;
    Ok(())
}

/// Checks that what is left is exactly what the policy does not select.
fn check_left(bench: &Bench, objects: usize, expected: usize) -> Result<()> {
    let left = bench.fake.objects("", "configmaps");
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
    Ok(())
}

/// The lists (GETs of a collection, not watches) among the requests after the first
/// `requests_before`, and those of them without `limit`, printed.
fn lists_made(bench: &Bench, requests_before: usize) -> (usize, usize) {
    let requests: Vec<_> = bench.fake.requests().into_iter().skip(requests_before).collect();
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
    (lists.len(), unpaginated.len())
}

#[tokio::main]
async fn main() -> Result<()> {
    let Args { verno, objects, rate } = args()?;
    let values = manifests::Values {
        cleanup_extra_resources: vec![
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "delete"]}),
        ],
        ..manifests::Values::default()
    };
    let bench = Bench::install(values).await?;
    let ns_api = bench.namespaces();
    for n in 0..NAMESPACES {
        scale::create_namespace(&ns_api, &format!("load-{n}")).await?;
    }
    // The install's own ConfigMaps (Verno's configuration) stay.
    let baseline = bench.fake.count("", "configmaps");
    create_objects(&bench, objects).await?;
    let expected = (0..objects).filter(|i| due(*i)).count();
    apply_policy(&bench.admin).await?;
    let requests_before = bench.fake.requests().len();

    let t1 = Instant::now();
    let verno = bench.start_verno(&verno, &["--cleanup-deletes-per-second", &rate.to_string()])?;
    let target = baseline + objects - expected;
    let limit = Duration::from_secs(60 + (expected as f64 / rate.max(1.0)) as u64 * 3);
    while bench.fake.count("", "configmaps") > target {
        if t1.elapsed() > limit {
            bail!("{} ConfigMaps left after {} s (want {target})", bench.fake.count("", "configmaps"), limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = verno.peak_rss_mib();
    verno.stop().await;
    check_left(&bench, objects, expected)?;
    let (lists, unpaginated) = lists_made(&bench, requests_before);
    println!(
        "cleanup-scale: objects={objects} deleted={expected} seconds={seconds:.1} peak_rss_mib={rss:.1} lists={lists} unpaginated_lists={unpaginated}"
    );
    Ok(())
}
