//! Verno against a real control plane (etcd, kube-apiserver, kube-controller-manager and kwok
//! from `scripts/install-control-plane.sh`, started by `scripts/cluster.sh`), installed with
//! `verno manifests --server-url` and running with its ServiceAccount's token: the API server's
//! own admission chain calls it, its RBAC is the real one, and the garbage collector is
//! Kubernetes'. The tools are built on first use (minutes on a fresh machine; cached after).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use verno_e2e::real::{RealCluster, RealOptions, install_tools};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn verno_bin() -> std::path::PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_verno-chainsaw"));
    let verno = exe.with_file_name("verno");
    assert!(verno.is_file(), "{} is not built", verno.display());
    verno
}

async fn eventually<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn ar(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Applies a policy and waits until its status says ready and the validating webhook has rules.
async fn policy(c: &kube::Client, doc: Value) {
    let (api_version, kind) = (doc["apiVersion"].as_str().unwrap(), doc["kind"].as_str().unwrap());
    let plural = format!("{}s", kind.to_lowercase()).replace("ys", "ies");
    let r = ar(api_version, kind, &plural);
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(c.clone(), ns, &r),
        None => Api::all_with(c.clone(), &r),
    };
    api.patch(&name, &PatchParams::apply("kubectl").force(), &Patch::Apply(&doc)).await.unwrap();
    eventually(&format!("{name} ready"), 30, || async {
        api.get(&name).await.ok().filter(|p| p.data["status"]["ready"] == true).map(|_| ())
    })
    .await;
}

fn pod(ns: &str, name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "nginx:1.27"}]}}))
    .unwrap()
}

/// Creates `p`, retrying while Verno's new rules reach the API server (it calls a webhook only
/// once the configuration it watches has them): the first answer that is not "allowed because
/// no rule matched yet" is returned.
async fn create_until_judged(pods: &Api<Pod>, p: &Pod, denied_with: &str) -> kube::Error {
    let name = p.metadata.name.clone().unwrap();
    eventually("a denial", 30, || async {
        match pods.create(&PostParams::default(), p).await {
            Err(e) if e.to_string().contains(denied_with) => Some(e),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => {
                // Admitted before the rules were in place: undo and ask again.
                let _ = pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                None
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verno_in_a_real_control_plane() {
    install_tools(repo()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let verno = verno_bin();
    let cluster = RealCluster::start(RealOptions {
        account: verno_controller::manifests::SERVICE_ACCOUNT,
        repo: repo(),
        verno: &verno,
        dir: dir.path(),
        namespace: "verno",
        values_files: &[],
        extra_args: &[],
        runtime_config: None,
        reach: verno_e2e::real::Reach::Url,
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let c = cluster.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(c.clone());
    for ns in ["shop", "tenant-a"] {
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
            .await
            .unwrap();
    }

    // 1. A Pod denied through the API server's own admission chain, with Kyverno's message.
    policy(&c, json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "require-team"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "check-team",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "label 'team' is required", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}}))
    .await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
    let err = create_until_judged(&pods, &pod("shop", "bare", json!({})), "require-team").await;
    let msg = err.to_string();
    assert!(
        msg.contains("admission webhook \"validate.kyverno.svc-fail\" denied the request")
            && msg.contains("resource Pod/shop/bare was blocked due to the following policies")
            && msg.contains("label ''team'' is required"),
        "{msg}\n{}",
        cluster.verno_log_tail(20)
    );

    // 2. A report owned by its Pod goes with the Pod (Kubernetes' garbage collector).
    policy(&c, json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "audit-owner"},
        "spec": {"validationFailureAction": "Audit", "background": true, "rules": [{"name": "owner",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "label 'owner' is recommended", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}}))
    .await;
    let made = pods.create(&PostParams::default(), &pod("shop", "web", json!({"team": "a"}))).await.unwrap();
    let uid = made.metadata.uid.unwrap();
    let reports: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), "shop", &ar("wgpolicyk8s.io/v1alpha2", "PolicyReport", "policyreports"));
    let report = eventually("the Pod's report", 60, || async { reports.get_opt(&uid).await.ok().flatten() }).await;
    assert_eq!(report.metadata.owner_references.as_ref().unwrap()[0].uid, uid);
    pods.delete("web", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    eventually("the report collected", 60, || async { matches!(reports.get_opt(&uid).await, Ok(None)).then_some(()) })
        .await;

    // 3. Withith the real RBAC: a tenant's Policy reads nothing outside its
    // namespace, and Verno's own account may not read Secrets at all.
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "db", "namespace": "kube-system"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(c.clone(), "kube-system").create(&PostParams::default(), &secret).await.unwrap();
    let steal = |kind: &str, ns: Option<&str>| {
        let mut meta = json!({"name": "steal"});
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
        json!({"apiVersion": "kyverno.io/v1", "kind": kind, "metadata": meta,
            "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "read",
                "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "names": ["probe-*"]}}]},
                "context": [{"name": "s", "apiCall": {"urlPath": "/api/v1/namespaces/tenant-a/../kube-system/secrets/db"}}],
                "validate": {"message": "leaked {{ s.data.password }}",
                    "deny": {"conditions": {"any": [{"key": "{{ s.data.password }}", "operator": "NotEquals", "value": ""}]}}}}]}})
    };
    policy(&c, steal("Policy", Some("tenant-a"))).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "tenant-a");
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe-1"}})).unwrap();
    let err = eventually("the tenant's Policy to judge", 30, || async {
        match cms.create(&PostParams::default(), &probe).await {
            Err(e) => Some(e.to_string()),
            Ok(_) => {
                let _ = cms.delete("probe-1", &DeleteParams::default()).await;
                None
            }
        }
    })
    .await;
    assert!(
        err.contains("refers to namespace kube-system, which is different from the policy namespace tenant-a"),
        "{err}"
    );
    assert!(!err.contains("aHVudGVyMg") && !err.contains("hunter2"), "{err}");
    // The same call from a ClusterPolicy reaches the API server, which refuses Verno's account.
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), "tenant-a", &ar("kyverno.io/v1", "Policy", "policies"));
    api.delete("steal", &DeleteParams::default()).await.unwrap();
    policy(&c, steal("ClusterPolicy", None)).await;
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe-2"}})).unwrap();
    let err = eventually("the ClusterPolicy to judge", 30, || async {
        match cms.create(&PostParams::default(), &probe).await {
            Err(e) if e.to_string().contains("steal") => Some(e.to_string()),
            Err(e) => panic!("{e}"),
            Ok(_) => {
                let _ = cms.delete("probe-2", &DeleteParams::default()).await;
                None
            }
        }
    })
    .await;
    assert!(err.contains("forbidden"), "{err}");
    assert!(!err.contains("aHVudGVyMg") && !err.contains("hunter2"), "{err}");
    drop(cluster);
}
