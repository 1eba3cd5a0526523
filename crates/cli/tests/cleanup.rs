//! The cleanup controller and the TTL label against the fake API server: scheduled runs list in
//! pages with the policy's selector pushed down, delete only what the policy says, with its
//! propagation policy, write `lastExecutionTime` and events; the TTL label deletes on time and
//! never on a value it cannot read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking

use fake_apiserver::{FakeApiServer, default_resources};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use verno_controller::{Controller, Options, manifests};
use verno_server::{Config, Running};

const NS: &str = "verno";

async fn install(fake: &FakeApiServer, c: &kube::Client, values: &manifests::Values) {
    for doc in verno_controller::crds::all().into_iter().chain(manifests::render(values)) {
        fake.apply(c, &doc).await.unwrap();
    }
}

async fn start(fake: &FakeApiServer, tweak: impl FnOnce(&mut Options)) -> (Arc<Running>, Controller) {
    let cfg = Config {
        // The certificate is replaced by start_server.
        body_limit: 3 << 20,
        deadline: Duration::from_secs(5),
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let server = verno_cli::in_cluster::start_server(cfg).await.unwrap();
    let mut opts = Options::new(NS, "verno-0");
    opts.service = manifests::SERVICE.into();
    opts.deployment = Some(manifests::DEPLOYMENT.into());
    opts.owner_cluster_role = Some(manifests::CLUSTER_ROLE.into());
    opts.lease_duration = Duration::from_secs(2);
    opts.lease_retry = Duration::from_millis(300);
    opts.debounce = Duration::from_millis(100);
    opts.probe_interval = None;
    opts.omit_events = Default::default();
    opts.acting = verno_controller::Acting::default_accounts(&fake.config(None).unwrap(), NS).unwrap();
    tweak(&mut opts);
    let user = format!("system:serviceaccount:{NS}:{}", manifests::SERVICE_ACCOUNT);
    let c = fake.client(Some(&user)).unwrap();
    let controller =
        verno_controller::start(c, Arc::new(verno_cli::in_cluster::Webhook::new(server.clone())), opts).await;
    fake.set_service(NS, manifests::SERVICE, Some(server.addr));
    (server, controller)
}

async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    fake_apiserver::eventually(what, f).await.unwrap()
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

fn pods(c: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.clone(), ns, &ar("v1", "Pod", "pods"))
}

async fn apply(fake: &FakeApiServer, c: &kube::Client, doc: Value) {
    fake.apply(c, &doc).await.unwrap();
}

fn pod(ns: &str, name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}})
}

async fn names(c: &kube::Client, ns: &str) -> Vec<String> {
    let mut v: Vec<String> = pods(c, ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    v.sort();
    v
}

async fn event_note(c: &kube::Client, needle: &str) -> Value {
    let events: Api<DynamicObject> = Api::all_with(c.clone(), &ar("events.k8s.io/v1", "Event", "events"));
    eventually(needle, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.data["note"].as_str().is_some_and(|n| n.contains(needle)))
            .map(|e| serde_json::to_value(e).unwrap())
    })
    .await
}

#[tokio::test]
async fn a_due_deleting_policy_deletes_only_what_it_selects_in_pages_with_its_selector_pushed_down() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = fake.client(None).unwrap();
    install(&fake, &admin, &manifests::Values::default()).await;
    apply(&fake, &admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})).await;
    for (name, labels) in [
        ("tmp-a", json!({"tier": "scratch"})),
        ("tmp-b", json!({"tier": "scratch"})),
        ("keep", json!({"tier": "scratch"})),
        ("tmp-unlabelled", json!({})),
    ] {
        apply(&fake, &admin, pod("scratch", name, labels)).await;
    }
    let dpol = ar("policies.kyverno.io/v1", "DeletingPolicy", "deletingpolicies");
    apply(
        &fake,
        &admin,
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "tmp-pods"},
        "spec": {"schedule": "*/1 * * * *", "deletionPropagationPolicy": "Orphan",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"tier": "scratch"}}},
            "conditions": [{"name": "temporary", "expression": "object.metadata.name.startsWith('tmp-')"}]}}),
    )
    .await;
    // It last ran long ago: the next run is due at once.
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &dpol);
    api.patch_status("tmp-pods", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "status": {"lastExecutionTime": "2020-01-01T00:00:00Z"}})))
        .await
        .unwrap();
    let (_server, controller) = start(&fake, |o| {
        o.cleanup = Some(verno_controller::cleanup::CleanupOptions { page_size: 2, ..Default::default() });
    })
    .await;
    eventually("tmp-a and tmp-b deleted", || async {
        let n = names(&admin, "scratch").await;
        (n == ["keep", "tmp-unlabelled"]).then_some(())
    })
    .await;
    // lastExecutionTime written (as Kyverno: RFC 3339), so a restart does not run it again.
    let st = eventually("lastExecutionTime", || async {
        let p = api.get("tmp-pods").await.ok()?;
        let t = p.data["status"]["lastExecutionTime"].as_str()?.to_string();
        (!t.starts_with("2020")).then_some(t)
    })
    .await;
    assert!(chrono::DateTime::parse_from_rfc3339(&st).is_ok(), "{st}");
    // An event per deletion, on the policy, with Kyverno's words.
    let ev = event_note(&admin, "successfully deleted the target resource Pod/scratch/tmp-a").await;
    assert_eq!(ev["reason"], "PolicyApplied");
    assert_eq!(ev["action"], "Resource Cleaned Up");
    assert_eq!(ev["reportingController"], "kyverno-cleanup");
    assert_eq!(ev["regarding"]["kind"], "DeletingPolicy");
    assert_eq!(ev["related"]["name"], "tmp-a");
    // Every list of pods was paged and carried the objectSelector; the deletes said Orphan.
    let requests = fake.requests();
    let lists: Vec<_> = requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/pods") && r.query.contains("labelSelector=tier"))
        .collect();
    assert!(lists.len() >= 2, "paged lists: {lists:?}");
    assert!(lists.iter().all(|r| r.query.contains("limit=2")), "{lists:?}");
    let deletes: Vec<_> = requests.iter().filter(|r| r.method == "DELETE" && r.path.contains("/pods/")).collect();
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    controller.stop().await;
}

#[tokio::test]
async fn a_cleanup_policy_reads_targets_and_a_namespaced_one_stays_in_its_namespace() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = fake.client(None).unwrap();
    install(&fake, &admin, &manifests::Values::default()).await;
    for ns in ["a", "b"] {
        apply(&fake, &admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await;
        for name in ["old", "new"] {
            apply(&fake, &admin, pod(ns, name, json!({}))).await;
        }
    }
    let cpol = ar("kyverno.io/v2", "CleanupPolicy", "cleanuppolicies");
    apply(
        &fake,
        &admin,
        json!({"apiVersion": "kyverno.io/v2", "kind": "CleanupPolicy", "metadata": {"name": "olds", "namespace": "a"},
        "spec": {"schedule": "0 * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "conditions": {"all": [{"key": "{{ target.metadata.name }}", "operator": "Equals", "value": "old"}]}}}),
    )
    .await;
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "a", &cpol);
    api.patch_status("olds", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "kyverno.io/v2", "kind": "CleanupPolicy", "status": {"lastExecutionTime": "2020-01-01T00:00:00Z"}})))
        .await
        .unwrap();
    let (_server, controller) = start(&fake, |_| {}).await;
    eventually("a/old deleted", || async { (names(&admin, "a").await == ["new"]).then_some(()) }).await;
    event_note(&admin, "successfully cleaned up the target resource Pod/a/old").await;
    // Namespace b is another's: untouched, and never listed.
    assert_eq!(names(&admin, "b").await, ["new", "old"]);
    assert!(!fake.requests().iter().any(|r| r.method == "DELETE" && r.path.contains("/namespaces/b/")));
    // Its status: the run's time, and Ready (Verno's addition; written by the status pass,
    // which waits a second after a webhook configuration write, so it may come after the run).
    eventually("status", || async {
        let p = api.get("olds").await.ok()?;
        p.data["status"]["lastExecutionTime"].as_str().filter(|t| !t.starts_with("2020"))?;
        (p.data["status"]["conditions"][0]["type"] == "Ready").then_some(())
    })
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn the_ttl_label_deletes_on_time_and_never_on_a_value_it_cannot_read() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = fake.client(None).unwrap();
    // The install lets the cleanup controller list, watch and delete Pods (as the chart's
    // cleanupController.rbac.clusterRole.extraResources); ConfigMaps it may not delete.
    let values = manifests::Values {
        cleanup_extra_resources: vec![
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "delete"]}),
        ],
        ..manifests::Values::default()
    };
    install(&fake, &admin, &values).await;
    apply(&fake, &admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}})).await;
    apply(&fake, &admin, pod("t", "short", json!({"cleanup.kyverno.io/ttl": "2s"}))).await;
    apply(&fake, &admin, pod("t", "past", json!({"cleanup.kyverno.io/ttl": "2023-07-19T120000Z"}))).await;
    apply(&fake, &admin, pod("t", "future", json!({"cleanup.kyverno.io/ttl": "2099-01-01"}))).await;
    apply(&fake, &admin, pod("t", "garbage", json!({"cleanup.kyverno.io/ttl": "soon"}))).await;
    apply(&fake, &admin, pod("t", "plain", json!({}))).await;
    apply(&fake, &admin, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "t", "labels": {"cleanup.kyverno.io/ttl": "1s"}}})).await;
    let started = std::time::Instant::now();
    let (_server, controller) = start(&fake, |_| {}).await;
    eventually("past deleted", || async { (!names(&admin, "t").await.contains(&"past".to_string())).then_some(()) })
        .await;
    eventually("short deleted", || async { (!names(&admin, "t").await.contains(&"short".to_string())).then_some(()) })
        .await;
    assert!(started.elapsed() >= Duration::from_secs(1), "deleted before its time");
    assert_eq!(names(&admin, "t").await, ["future", "garbage", "plain"]);
    let ev = event_note(&admin, "\"soon\", is neither a duration").await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["name"], "garbage");
    // The cleanup account may not delete ConfigMaps, so the labelled ConfigMap stays — though
    // the background account may (Kyverno's background core role): each controller acts with
    // its own permissions, not the union (separate identities).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cms: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "t", &ar("v1", "ConfigMap", "configmaps"));
    assert!(cms.get_opt("cm").await.unwrap().is_some());
    // Pods were watched label-selected, never listed whole.
    let requests = fake.requests();
    let pod_reads: Vec<_> = requests.iter().filter(|r| r.method == "GET" && r.path == "/api/v1/pods").collect();
    assert!(!pod_reads.is_empty());
    assert!(pod_reads.iter().all(|r| r.query.contains("labelSelector=cleanup.kyverno.io")), "{pod_reads:?}");
    controller.stop().await;
}

/// Objects that changed after the list, before their paced delete — one
/// relabelled out of the selection, one deleted and re-created — are not deleted: deletes
/// carry the listed uid and resourceVersion as preconditions; a relabelled object is judged
/// again, a re-created one is left for the next run.
#[tokio::test]
async fn cleanup_never_deletes_an_object_that_changed_after_it_was_listed() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = fake.client(None).unwrap();
    install(&fake, &admin, &manifests::Values::default()).await;
    apply(&fake, &admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})).await;
    let all: Vec<String> = (0..8).map(|i| format!("tmp-{i}")).collect();
    for name in &all {
        apply(&fake, &admin, pod("scratch", name, json!({"tmp": "yes"}))).await;
    }
    let dpol = ar("policies.kyverno.io/v1", "DeletingPolicy", "deletingpolicies");
    apply(
        &fake,
        &admin,
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "tmp"},
        "spec": {"schedule": "0 0 1 1 *",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
            "conditions": [{"name": "tmp", "expression": "object.metadata.labels.tmp == 'yes'"}]}}),
    )
    .await;
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &dpol);
    api.patch_status("tmp", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "status": {"lastExecutionTime": "2020-01-01T00:00:00Z"}})))
        .await
        .unwrap();
    // One delete per second, so the run is under way while the objects change.
    let (_server, controller) = start(&fake, |o| {
        o.cleanup = Some(verno_controller::cleanup::CleanupOptions {
            deletes_per_second: 1.0,
            burst: 1.0,
            ..Default::default()
        });
    })
    .await;
    let first = eventually("the first delete", || async {
        let n = names(&admin, "scratch").await;
        (n.len() < all.len()).then_some(n)
    })
    .await;
    // Every remaining Pod but one is relabelled out; that one is deleted and re-created.
    let (recreated, relabelled) = first.split_first().unwrap();
    for name in relabelled {
        pods(&admin, "scratch")
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tmp": "no"}}})))
            .await
            .unwrap();
    }
    pods(&admin, "scratch").delete(recreated, &Default::default()).await.unwrap();
    apply(&fake, &admin, pod("scratch", recreated, json!({"tmp": "yes"}))).await;
    // The run ends (lastExecutionTime written) with all of them kept.
    eventually("the run ends", || async {
        let p = api.get("tmp").await.ok()?;
        (!p.data["status"]["lastExecutionTime"].as_str()?.starts_with("2020")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(names(&admin, "scratch").await, first, "objects changed after the list were deleted");
    controller.stop().await;
}
