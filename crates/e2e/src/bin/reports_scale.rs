//! The reports scale benchmark (issue 16): `verno serve --kube` against the fake API server
//! holding N Pods across M namespaces, with the Pod Security policies of `../shared/bench`
//! switched to Audit. Measures the time until every Pod has its PolicyReport, Verno's peak
//! RSS, the report writes and their bytes, the writes in a quiet window, and the writes after
//! an edit to one rule of one policy against the reports whose results it changed.
//!
//!   reports-scale --verno target/release/verno --policies DIR [--pods 10000]
//!                 [--namespaces 100] [--quiet-seconds 120]
//!
//! Last line: `reports-scale: resources=N seconds=T peak_rss_mib=M writes=W bytes=B quiet_writes=Q`.

use anyhow::{Context, Result, anyhow, bail};
use fake_apiserver::FakeApiServer;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use verno_controller::manifests;
use verno_e2e::scale::{self, Bench};

struct Args {
    verno: PathBuf,
    policies: PathBuf,
    pods: usize,
    namespaces: usize,
    quiet: u64,
}

fn args() -> Result<Args> {
    let mut a = Args { verno: PathBuf::new(), policies: PathBuf::new(), pods: 10_000, namespaces: 100, quiet: 120 };
    scale::parse_flags(|k, v| {
        match k {
            "--verno" => a.verno = v.into(),
            "--policies" => a.policies = v.into(),
            "--pods" => a.pods = v.parse()?,
            "--namespaces" => a.namespaces = v.parse()?,
            "--quiet-seconds" => a.quiet = v.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if a.verno.as_os_str().is_empty() || a.policies.as_os_str().is_empty() {
        bail!("usage: reports-scale --verno PATH --policies DIR [--pods N] [--namespaces M] [--quiet-seconds S]");
    }
    Ok(a)
}

/// A hardened Pod, or (every third) one that breaks several Pod Security controls.
fn pod(ns: &str, i: usize) -> Value {
    let bad = i.is_multiple_of(3);
    let container_context = if bad {
        json!({"privileged": true})
    } else {
        json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true,
            "seccompProfile": {"type": "RuntimeDefault"}})
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pod-{i}"), "namespace": ns, "labels": {"app": "web"}},
        "spec": {"hostNetwork": bad,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "web", "image": "ghcr.io/example/web:1.2.3", "securityContext": container_context}]}})
}

/// The policies of `dir`, Audit instead of Enforce.
fn audit_policies(dir: &PathBuf) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(&f)?.replace("Enforce", "Audit");
        let v: Value = serde_saphyr::from_str(&text).with_context(|| format!("{}", f.display()))?;
        out.push(v);
    }
    Ok(out)
}

fn report_writes(fake: &FakeApiServer) -> (usize, u64) {
    let w: Vec<_> = fake.writes().into_iter().filter(|w| w.path.contains("/policyreports")).collect();
    (w.len(), w.iter().map(|w| w.bytes).sum())
}

/// uid → results without timestamps.
fn snapshot(fake: &FakeApiServer) -> HashMap<String, Value> {
    fake.objects("wgpolicyk8s.io", "policyreports")
        .into_iter()
        .map(|mut r| {
            let uid = r.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let mut results = r.get_mut("results").map(Value::take).unwrap_or(Value::Null);
            for x in results.as_array_mut().into_iter().flatten() {
                if let Some(m) = x.as_object_mut() {
                    m.remove("timestamp");
                }
            }
            (uid, results)
        })
        .collect()
}

/// Waits until no report write happened for `quiet`.
async fn settle(fake: &FakeApiServer, quiet: Duration) {
    let mut last = report_writes(fake).0;
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = report_writes(fake).0;
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let bench = Bench::install(manifests::Values::default()).await?;
    let (fake, admin) = (&bench.fake, &bench.admin);
    // The objects, before Verno starts: only a background scan can report them.
    let started = Instant::now();
    let ns_api = bench.namespaces();
    for n in 0..a.namespaces {
        scale::create_namespace(&ns_api, &format!("ns-{n}")).await?;
    }
    let pods = a.pods;
    let namespaces = a.namespaces.max(1);
    let created = futures_util::stream::iter(0..pods)
        .map(|i| {
            let admin = admin.clone();
            async move {
                let ns = format!("ns-{}", i % namespaces);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(admin, &ns, &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()));
                let obj: DynamicObject = serde_json::from_value(pod(&ns, i))?;
                api.create(&PostParams::default(), &obj).await.map(|_| ()).map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        return Err(e.context("creating Pods"));
    }
    let policies = audit_policies(&a.policies)?;
    let cpol = Api::<DynamicObject>::all_with(admin.clone(), &verno_controller::policies::cluster_policy_resource());
    for p in &policies {
        let name = p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        cpol.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(p)).await?;
    }
    eprintln!(
        "{} Pods in {} namespaces and {} policies created in {:.1} s",
        pods,
        namespaces,
        policies.len(),
        started.elapsed().as_secs_f64()
    );

    // Verno, as its ServiceAccount.
    let writes_before = report_writes(fake);
    let t0 = Instant::now();
    let child = bench.start_verno(&a.verno, &[])?;
    let limit = Duration::from_secs(600);
    loop {
        let n = fake.count("wgpolicyk8s.io", "policyreports");
        if n >= pods {
            break;
        }
        if t0.elapsed() > limit {
            child.stop().await;
            bail!("only {n} of {pods} reports after {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    eprintln!("every Pod has its report after {seconds:.1} s");
    settle(fake, Duration::from_secs(5)).await;
    let (w_all, b_all) = report_writes(fake);
    let (writes, bytes) = (w_all - writes_before.0, b_all - writes_before.1);

    // Nothing changes: nothing may be written.
    let quiet_start = report_writes(fake).0;
    tokio::time::sleep(Duration::from_secs(a.quiet)).await;
    let quiet_writes = report_writes(fake).0 - quiet_start;

    // One rule of one policy edited (its message): writes at most the reports it changes.
    let before = snapshot(fake);
    let edit_start = report_writes(fake).0;
    let mut edited = policies
        .iter()
        .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some("disallow-privileged-containers"))
        .or(policies.first())
        .cloned()
        .ok_or_else(|| anyhow!("no policy in {}", a.policies.display()))?;
    if let Some(m) = edited.pointer_mut("/spec/rules/0/validate/message") {
        *m = json!(format!("{} (edited)", m.as_str().unwrap_or("")));
    }
    let name = edited.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    cpol.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&edited)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle(fake, Duration::from_secs(10)).await;
    let after = snapshot(fake);
    let changed = after.iter().filter(|(uid, r)| before.get(*uid) != Some(*r)).count()
        + before.keys().filter(|uid| !after.contains_key(*uid)).count();
    let edit_writes = report_writes(fake).0 - edit_start;
    let rss = child.peak_rss_mib();
    child.stop().await;
    println!("edit of rule 0 of {name}: writes={edit_writes} changed_reports={changed}");
    println!(
        "reports-scale: resources={pods} seconds={seconds:.1} peak_rss_mib={rss:.1} writes={writes} bytes={bytes} quiet_writes={quiet_writes}"
    );
    Ok(())
}
