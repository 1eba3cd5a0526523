//! The generate scale benchmark (issue 17): `verno serve --kube` against the fake API server
//! with a ClusterPolicy that clones a Secret into every new namespace and keeps the copies in
//! sync. Creates N namespaces and measures the time until every copy exists, then changes the
//! source and measures the time until every copy has the new data; Verno's peak RSS and the
//! writes to Secrets it made.
//!
//!   generate-scale --verno target/release/verno [--namespaces 1000]
//!
//! Last line: `generate-scale: namespaces=N seconds_create=T1 seconds_sync=T2 peak_rss_mib=M writes=W`.

use anyhow::{Result, bail};
use fake_apiserver::FakeApiServer;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use verno_controller::manifests;
use verno_e2e::scale::{self, Bench};

fn secret_writes(fake: &FakeApiServer) -> usize {
    fake.writes().into_iter().filter(|w| w.path.contains("/secrets")).count()
}

/// How many copies (Secrets `regcred` outside `platform`) have `token`.
fn copies_with(fake: &FakeApiServer, token: &str) -> usize {
    fake.objects("", "secrets")
        .iter()
        .filter(|s| {
            s.pointer("/metadata/name").and_then(Value::as_str) == Some("regcred")
                && s.pointer("/metadata/namespace").and_then(Value::as_str) != Some("platform")
                && s.pointer("/data/token").and_then(Value::as_str) == Some(token)
        })
        .count()
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<f64> {
    let t0 = Instant::now();
    while !done() {
        if t0.elapsed() > limit {
            bail!("{what}: not done after {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(t0.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut verno = PathBuf::new();
    let mut namespaces = 1000usize;
    scale::parse_flags(|k, v| {
        match k {
            "--verno" => verno = v.into(),
            "--namespaces" => namespaces = v.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if verno.as_os_str().is_empty() {
        bail!("usage: generate-scale --verno PATH [--namespaces N]");
    }
    let bench = Bench::install(manifests::Values::default()).await?;
    let (fake, admin) = (&bench.fake, &bench.admin);
    let secret_res = ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    let ns_api = bench.namespaces();
    let create_ns = |name: String| {
        let api = ns_api.clone();
        async move { scale::create_namespace(&api, &name).await }
    };
    create_ns("platform".into()).await?;
    let secrets: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "platform", &secret_res);
    let source = |token: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred", "namespace": "platform"},
            "type": "Opaque", "data": {"token": token}})
    };
    secrets.patch("regcred", &PatchParams::apply("bench").force(), &Patch::Apply(source("djE="))).await?;
    let policy = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "clone-regcred"},
        "spec": {"rules": [{"name": "clone", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
            "exclude": {"any": [{"resources": {"namespaces": ["platform", "kube-system", "kube-public", "kube-node-lease", "default", "verno"]}}]},
            "generate": {"synchronize": true, "apiVersion": "v1", "kind": "Secret", "name": "regcred",
                "namespace": "{{request.object.metadata.name}}", "clone": {"namespace": "platform", "name": "regcred"}}}]}});
    let cpol = Api::<DynamicObject>::all_with(admin.clone(), &verno_controller::policies::cluster_policy_resource());
    cpol.patch("clone-regcred", &PatchParams::apply("bench").force(), &Patch::Apply(&policy)).await?;

    let child = bench.start_verno(&verno, &["--background-scan", "false", "--admission-reports", "false"])?;
    // Verno leads and has the policy in force once it reports it ready.
    wait_for("the policy's Ready status", Duration::from_secs(60), || {
        fake.objects("kyverno.io", "clusterpolicies")
            .iter()
            .any(|p| p.pointer("/status/ready").and_then(Value::as_bool) == Some(true))
    })
    .await?;
    let writes_before = secret_writes(fake);

    let t0 = Instant::now();
    let created = futures_util::stream::iter(0..namespaces)
        .map(|i| create_ns(format!("team-{i}")))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        return Err(e.context("creating namespaces"));
    }
    let limit = Duration::from_secs(600);
    wait_for("every copy created", limit, || copies_with(fake, "djE=") >= namespaces).await?;
    let seconds_create = t0.elapsed().as_secs_f64();
    eprintln!("{namespaces} copies after {seconds_create:.1} s");

    let t1 = Instant::now();
    secrets.patch("regcred", &PatchParams::apply("bench").force(), &Patch::Apply(source("djI="))).await?;
    wait_for("every copy synchronized", limit, || copies_with(fake, "djI=") >= namespaces).await?;
    let seconds_sync = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The bench's own source update is one of the writes.
    let writes = secret_writes(fake) - writes_before - 1;
    // What Verno wrote to Secrets during the run (and the bench's own source update).
    let during: Vec<_> =
        fake.writes().into_iter().filter(|w| w.path.contains("/secrets")).skip(writes_before).collect();
    let mut by_method: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut repeated: std::collections::BTreeMap<(&str, &str), usize> = Default::default();
    for w in &during {
        *by_method.entry(&w.method).or_default() += 1;
        *repeated.entry((&w.method, &w.path)).or_default() += 1;
    }
    eprintln!("writes to Secrets by method (the bench's own source update included): {by_method:?}");
    let elsewhere: Vec<String> = during
        .iter()
        .filter(|w| !w.path.contains("/namespaces/team-"))
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    eprintln!("writes to Secrets outside the copies: {elsewhere:?}");
    repeated.retain(|_, n| *n > 1);
    if !repeated.is_empty() {
        eprintln!("written more than once: {repeated:?}");
    }
    let rss = child.peak_rss_mib();
    child.stop().await;
    println!(
        "generate-scale: namespaces={namespaces} seconds_create={seconds_create:.1} seconds_sync={seconds_sync:.1} peak_rss_mib={rss:.1} writes={writes}"
    );
    Ok(())
}
