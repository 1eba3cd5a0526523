//! Verno in a (fake) cluster: the real admission server and controller against the fake API
//! server, with admission emulation calling Verno over HTTPS with the caBundle Verno wrote.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking

use fake_apiserver::{FakeApiServer, default_resources};
use futures_util::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use verno_controller::{Controller, Options, manifests, policies, webhooks};
use verno_server::{Config, Running};
// The in-cluster path is the server and the controller wired by the binary (verno_cli).

const NS: &str = "verno";

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

async fn client(fake: &FakeApiServer, user: Option<&str>) -> kube::Client {
    fake.client(user).unwrap()
}

/// Applies every object of the plain install, as `kubectl apply --server-side` would.
async fn install(fake: &FakeApiServer, c: &kube::Client, values: &manifests::Values) {
    for doc in verno_controller::crds::all().into_iter().chain(manifests::render(values)) {
        fake.apply(c, &doc).await.unwrap();
    }
    // What these tests' generate and mutate-existing rules write beyond the chart's defaults,
    // granted as a Kyverno user grants it (policy validation checks the background account).
    let grant = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "tests:background-writes", "labels": {"rbac.kyverno.io/aggregate-to-background-controller": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["secrets", "configmaps", "namespaces", "serviceaccounts"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]});
    fake.apply(c, &grant).await.unwrap();
}

struct Replica {
    server: Arc<Running>,
    controller: Controller,
}

async fn start_replica(fake: &FakeApiServer, identity: &str) -> Replica {
    start_replica_with(fake, identity, |_| {}).await
}

/// A replica with short lease and debounce times, after `tweak` adjusts its options.
async fn start_replica_with(fake: &FakeApiServer, identity: &str, tweak: impl FnOnce(&mut Options)) -> Replica {
    let cfg = Config {
        // The certificate is replaced by start_server.
        body_limit: 3 << 20,
        deadline: Duration::from_secs(5),
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let server = verno_cli::in_cluster::start_server(cfg).await.unwrap();
    let mut opts = Options::new(NS, identity);
    opts.service = manifests::SERVICE.into();
    opts.deployment = Some(manifests::DEPLOYMENT.into());
    opts.owner_cluster_role = Some(manifests::CLUSTER_ROLE.into());
    opts.lease_duration = Duration::from_secs(2);
    opts.lease_retry = Duration::from_millis(300);
    opts.debounce = Duration::from_millis(100);
    opts.resync = Duration::from_secs(2);
    opts.probe_interval = Some(Duration::from_millis(300));
    opts.acting = verno_controller::Acting::default_accounts(&fake.config(None).unwrap(), NS).unwrap();
    tweak(&mut opts);
    let c = client(fake, Some(&format!("system:serviceaccount:{NS}:{}", manifests::SERVICE_ACCOUNT))).await;
    let controller =
        verno_controller::start(c, Arc::new(verno_cli::in_cluster::Webhook::new(server.clone())), opts).await;
    Replica { server, controller }
}

/// Polls `f` until it returns `Some`, for up to 20 s.
async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    fake_apiserver::eventually(what, f).await.unwrap()
}

const REQUIRE_TEAM: &str = r#"{
  "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "require-team"},
  "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{
    "name": "check-team",
    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
    "validate": {"message": "label 'team' is required", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}}"#;

fn policy_api(c: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &policies::cluster_policy_resource())
}

async fn apply_policy(c: &kube::Client, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap();
    let name = v["metadata"]["name"].as_str().unwrap().to_string();
    policy_api(c).patch(&name, &PatchParams::apply("kubectl").force(), &Patch::Apply(&v)).await.unwrap();
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}})).unwrap()
}

async fn vwc(c: &kube::Client) -> Option<Value> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(c.clone());
    api.get_opt(webhooks::VALIDATING_CONFIG).await.unwrap().map(|o| serde_json::to_value(o).unwrap())
}

fn entry_rules(cfg: &Value, entry: &str) -> Option<Value> {
    cfg["webhooks"].as_array()?.iter().find(|w| w["name"] == entry)?.get("rules").cloned()
}

async fn setup() -> (FakeApiServer, kube::Client, Replica) {
    setup_with(|_| {}).await
}

async fn setup_with(tweak: impl FnOnce(&mut Options)) -> (FakeApiServer, kube::Client, Replica) {
    init_logs();
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = client(&fake, None).await;
    install(&fake, &admin, &manifests::Values::default()).await;
    let replica = start_replica_with(&fake, "verno-0", tweak).await;
    fake.set_service(NS, manifests::SERVICE, Some(replica.server.addr));
    // The leader made the certificates and wrote the caBundle; the replica serves the pair.
    eventually("the caBundle", || async {
        vwc(&admin).await.filter(|v| v["webhooks"][0]["clientConfig"]["caBundle"].is_string())
    })
    .await;
    (fake, admin, replica)
}

#[tokio::test]
async fn a_policy_becomes_webhook_rules_and_violating_pods_are_denied_with_kyvernos_message() {
    let (fake, admin, replica) = setup().await;
    // A fresh install matches nothing.
    assert!(entry_rules(&vwc(&admin).await.unwrap(), webhooks::VALIDATE_FAIL).is_none());
    apply_policy(&admin, REQUIRE_TEAM).await;
    let rules =
        eventually("rules for pods", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    assert_eq!(
        rules,
        // A validate rule naming no operations is asked about every one (Kyverno's registration).
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"], "resources": ["pods", "pods/ephemeralcontainers", "replicationcontrollers"], "scope": "*"},
        {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"], "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"], "scope": "*"},
        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"], "resources": ["cronjobs", "jobs"], "scope": "*"}])
    );
    // Status: ready, with rule counts and the autogen rules.
    let p = eventually("policy status", || async {
        policy_api(&admin).get("require-team").await.ok().filter(|p| p.data["status"]["ready"] == true)
    })
    .await;
    assert_eq!(p.data["status"]["conditions"][0]["reason"], "Succeeded");
    assert_eq!(p.data["status"]["rulecount"]["validate"], 1);
    assert!(p.data["status"]["autogen"]["rules"].as_array().is_some_and(|r| r.len() == 2));

    // Through admission emulation: the API server calls Verno with the caBundle Verno wrote.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let err = pods.create(&PostParams::default(), &pod("web", json!({"app": "web"}))).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert_eq!(
        status.message,
        "admission webhook \"validate.kyverno.svc-fail\" denied the request: \n\nresource Pod/shop/web was blocked due to the following policies \n\nrequire-team:\n  check-team: 'validation error: label ''team'' is required. rule check-team failed at path /metadata/labels/team/'\n"
    );
    assert_eq!(status.code, 400);
    pods.create(&PostParams::default(), &pod("ok", json!({"team": "a"}))).await.unwrap();
    // kube-system is never sent to Verno.
    let sys: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    sys.create(&PostParams::default(), &pod("sys", json!({}))).await.unwrap();
    assert!(fake.admission_calls().iter().all(|c| !c.object.starts_with("kube-system/")));

    // Steady state: nothing is written but the lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = fake.writes().iter().filter(|w| !w.path.contains("/leases/")).count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after: Vec<_> = fake.writes().into_iter().filter(|w| !w.path.contains("/leases/")).collect();
    assert_eq!(after.len(), before, "writes at steady state: {:?}", &after[before..]);

    // Delete the policy: the rules go and Pods are admitted again.
    policy_api(&admin).delete("require-team", &DeleteParams::default()).await.unwrap();
    eventually("rules removed", || async {
        vwc(&admin).await.filter(|v| entry_rules(v, webhooks::VALIDATE_FAIL).is_none())
    })
    .await;
    pods.create(&PostParams::default(), &pod("web", json!({"app": "web"}))).await.unwrap();
    replica.controller.stop().await;
}

fn events_api(c: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        c.clone(),
        &kube::discovery::ApiResource {
            group: "events.k8s.io".into(),
            version: "v1".into(),
            api_version: "events.k8s.io/v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
        },
    )
}

async fn event_with_note(c: &kube::Client, note: &str) -> Value {
    let events = events_api(c);
    eventually(note, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.data["note"] == note)
            .map(|e| serde_json::to_value(e).unwrap())
    })
    .await
}

#[tokio::test]
async fn failed_rules_become_policy_violation_events_as_kyverno_writes_them() {
    let (_fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    let audit = REQUIRE_TEAM
        .replace("require-team", "audit-owner")
        .replace("check-team", "check-owner")
        .replace("Enforce", "Audit")
        .replace("'team' is required", "'owner' is recommended")
        .replace("\"team\"", "\"owner\"");
    apply_policy(&admin, &audit).await;
    eventually("both entries", || async {
        let v = vwc(&admin).await?;
        entry_rules(&v, webhooks::VALIDATE_FAIL).and(entry_rules(&v, webhooks::VALIDATE_IGNORE))
    })
    .await;
    let enforce_uid = policy_api(&admin).get("require-team").await.unwrap().metadata.uid.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    pods.create(&PostParams::default(), &pod("web", json!({}))).await.unwrap_err();
    let admitted = pods.create(&PostParams::default(), &pod("ok", json!({"team": "a"}))).await.unwrap();

    // Blocked: an event on the policy (a ClusterPolicy's go to `default`), related to the Pod.
    let blocked = event_with_note(&admin, "Pod shop/web: [check-team] fail (blocked); validation error: label 'team' is required. rule check-team failed at path /metadata/labels/team/").await;
    assert_eq!(blocked["metadata"]["namespace"], "default");
    assert_eq!(
        (&blocked["type"], &blocked["reason"], &blocked["action"]),
        (&json!("Warning"), &json!("PolicyViolation"), &json!("Resource Blocked"))
    );
    assert_eq!(blocked["reportingController"], "kyverno-admission");
    assert_eq!(blocked["regarding"]["kind"], "ClusterPolicy");
    assert_eq!(blocked["regarding"]["uid"], enforce_uid.as_str());
    assert_eq!(blocked["related"], json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "shop"}));
    // Admitted with an Audit failure: on the policy, and on the Pod itself (with its uid, so
    // `kubectl describe pod` shows it).
    let passed = event_with_note(&admin, "Pod shop/ok: [check-owner] fail; validation error: label 'owner' is recommended. rule check-owner failed at path /metadata/labels/owner/").await;
    assert_eq!(passed["action"], "Resource Passed");
    let on_pod = event_with_note(&admin, "policy audit-owner/check-owner fail: validation error: label 'owner' is recommended. rule check-owner failed at path /metadata/labels/owner/").await;
    assert_eq!(on_pod["metadata"]["namespace"], "shop");
    assert_eq!(on_pod["regarding"]["uid"], admitted.metadata.uid.unwrap().as_str());
    assert_eq!(on_pod["regarding"]["kind"], "Pod");
    // The refused Pod never existed, so it has no event of its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let list = events_api(&admin).list(&Default::default()).await.unwrap();
    assert!(list.items.iter().all(|e| e.data["regarding"]["name"] != "web"), "{:?}", list.items);
    replica.controller.stop().await;
}

#[tokio::test]
async fn the_probe_sees_the_api_server_reach_verno_and_doctor_reports_its_age() {
    let (fake, admin, replica) = setup().await;
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let monitor = serde_json::to_value(mwc.get(webhooks::MUTATING_CONFIG).await.unwrap()).unwrap();
    assert_eq!(
        entry_rules(&monitor, webhooks::MONITOR),
        Some(
            json!([{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["leases"], "scope": "Namespaced"}])
        )
    );
    // The leader's Lease update went through admission and came back stamped by Verno.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), NS);
    let first = eventually("a stamped probe Lease", || async {
        verno_controller::probe::last_request(&leases.get_opt(verno_controller::probe::PROBE_LEASE).await.ok()??)
    })
    .await;
    eventually("a newer stamp", || async {
        verno_controller::probe::last_request(&leases.get(verno_controller::probe::PROBE_LEASE).await.ok()?)
            .filter(|t| *t > first)
    })
    .await;
    let doctor = verno_controller::ops::doctor(&admin, NS, "verno-controller").await.unwrap();
    assert!(doctor.contains("probe: the API server last reached Verno "), "{doctor}");
    assert!(!doctor.contains("cannot reach Verno"), "{doctor}");
    assert!(doctor.contains("monitor-webhooks.kyverno.svc: failurePolicy Ignore"), "{doctor}");

    // The Service loses its endpoints: probe writes still succeed (fail-open) but the stamp stops.
    fake.set_service(NS, manifests::SERVICE, None);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let frozen = leases.get(verno_controller::probe::PROBE_LEASE).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let later = leases.get(verno_controller::probe::PROBE_LEASE).await.unwrap();
    assert_eq!(verno_controller::probe::last_request(&later), verno_controller::probe::last_request(&frozen));
    assert_ne!(
        later.spec.as_ref().unwrap().renew_time,
        frozen.spec.as_ref().unwrap().renew_time,
        "the leader kept probing"
    );
    // Past the deadline, doctor says what is wrong.
    let stamp = verno_controller::probe::last_request(&later).unwrap();
    let line =
        verno_controller::ops::probe_line(Some(&later), stamp + k8s_openapi::jiff::SignedDuration::from_secs(150), 100);
    assert_eq!(
        line,
        "probe: the API server last reached Verno 150s ago  ← over 100s: the API server cannot reach Verno (Service, endpoints, network policy or caBundle)\n"
    );
    replica.controller.stop().await;
}

#[tokio::test]
async fn an_invalid_policy_reports_the_error_and_path_and_the_previous_version_stays_in_force() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    // Break it: an unknown failure action in the rule (the CRD's enum covers only the spec's,
    // which the API server refuses itself). The policy validation webhook refuses it at apply
    // time, with the error and its path.
    let mut broken: Value = serde_json::from_str(REQUIRE_TEAM).unwrap();
    broken["spec"]["rules"][0]["validate"]["failureAction"] = json!("Block");
    let err = policy_api(&admin)
        .patch("require-team", &PatchParams::apply("kubectl").force(), &Patch::Apply(&broken))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.message == "admission webhook \"validate-policy.kyverno.svc\" denied the request: spec.rules[0].validate.failureAction: unknown action \"Block\", expected Audit or Enforce"),
        "{err:?}"
    );
    // An exception that does not compile is refused too.
    let exceptions: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "shop", &policies::exception_resource());
    let bad_exception = json!({"apiVersion": "kyverno.io/v2", "kind": "PolicyException", "metadata": {"name": "x", "namespace": "shop"}, "spec": {"exceptions": "all", "match": {}}});
    let err =
        exceptions.create(&PostParams::default(), &serde_json::from_value(bad_exception).unwrap()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.message.starts_with("admission webhook \"validate-policy.kyverno.svc\" denied the request: ")),
        "{err:?}"
    );
    // While Verno is unreachable the entry fails open: the broken version is stored, and once
    // Verno is back its status says what is wrong.
    fake.set_service(NS, manifests::SERVICE, None);
    policy_api(&admin)
        .patch("require-team", &PatchParams::apply("kubectl").force(), &Patch::Apply(&broken))
        .await
        .unwrap();
    fake.set_service(NS, manifests::SERVICE, Some(replica.server.addr));
    let p = eventually("failed status", || async {
        policy_api(&admin).get("require-team").await.ok().filter(|p| p.data["status"]["ready"] == false)
    })
    .await;
    let cond = &p.data["status"]["conditions"][0];
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["observedGeneration"], 2);
    let msg = cond["message"].as_str().unwrap();
    assert!(msg.contains("spec.rules[0].validate.failureAction: unknown action \"Block\""), "{msg}");
    assert!(msg.contains("previous version stays in force"), "{msg}");
    // The previous version still denies.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let err = pods.create(&PostParams::default(), &pod("web", json!({}))).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.message.contains("rule check-team failed")), "{err:?}");
    // A Warning event says so.
    let events = events_api(&admin);
    eventually("a PolicyError event", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.data["reason"] == "PolicyError" && e.data["type"] == "Warning")
    })
    .await;
    replica.controller.stop().await;
}

#[tokio::test]
async fn with_verno_dead_only_what_an_enforce_policy_matches_is_refused() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    // Kill Verno: the controller stops and the Service loses its endpoints.
    replica.controller.stop().await;
    fake.set_service(NS, manifests::SERVICE, None);
    // kube-system, Verno's namespace and objects no policy matches are untouched.
    Api::<Pod>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &pod("dns", json!({})))
        .await
        .unwrap();
    Api::<Pod>::namespaced(admin.clone(), NS).create(&PostParams::default(), &pod("verno-1", json!({}))).await.unwrap();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("settings".into());
    Api::<ConfigMap>::namespaced(admin.clone(), "shop").create(&PostParams::default(), &cm).await.unwrap();
    // Pods elsewhere hit the fail-closed entry.
    let err = Api::<Pod>::namespaced(admin.clone(), "shop")
        .create(&PostParams::default(), &pod("web", json!({"team": "a"})))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 500 && s.message.contains("failed calling webhook \"validate.kyverno.svc-fail\"") && s.message.contains("no endpoints available for service \"verno-svc\"")),
        "{err:?}"
    );
    // An opted-out namespace is not sent either.
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "batch", "labels": {manifests::OPT_OUT_LABEL: "true"}}}))
            .unwrap(),
    )
    .await
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), "batch")
        .create(&PostParams::default(), &pod("job", json!({})))
        .await
        .unwrap();
}

#[tokio::test]
async fn audit_only_policies_are_fail_open() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, &REQUIRE_TEAM.replace("Enforce", "Audit")).await;
    let rules = eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_IGNORE) }).await;
    assert!(rules.as_array().is_some_and(|r| !r.is_empty()));
    assert!(entry_rules(&vwc(&admin).await.unwrap(), webhooks::VALIDATE_FAIL).is_none());
    replica.controller.stop().await;
    fake.set_service(NS, manifests::SERVICE, None);
    Api::<Pod>::namespaced(admin.clone(), "shop").create(&PostParams::default(), &pod("web", json!({}))).await.unwrap();
}

#[tokio::test]
async fn uninstall_in_helms_order_leaves_nothing_behind_and_the_owner_collects_configurations() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    let cfg = eventually("rules", || async {
        vwc(&admin).await.filter(|v| entry_rules(v, webhooks::VALIDATE_FAIL).is_some())
    })
    .await;
    // The backstop owner is the chart's ClusterRole.
    assert_eq!(cfg["metadata"]["ownerReferences"][0]["name"], manifests::CLUSTER_ROLE);
    // Helm's UninstallOrder: webhook configurations first, while the leader keeps running.
    let v: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let m: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    v.delete(webhooks::VALIDATING_CONFIG, &DeleteParams::default()).await.unwrap();
    m.delete(webhooks::MUTATING_CONFIG, &DeleteParams::default()).await.unwrap();
    // A policy change makes the leader reconcile: it must not re-create anything.
    apply_policy(&admin, &REQUIRE_TEAM.replace("require-team", "require-team-2")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(vwc(&admin).await.is_none(), "re-created after uninstall");
    assert!(m.get_opt(webhooks::MUTATING_CONFIG).await.unwrap().is_none());
    replica.controller.stop().await;
    let _ = fake;
}

#[tokio::test]
async fn deleting_the_owning_cluster_role_garbage_collects_the_configurations() {
    let (_fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("owner", || async { vwc(&admin).await.filter(|v| v["metadata"]["ownerReferences"].is_array()) }).await;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    roles.delete(manifests::CLUSTER_ROLE, &DeleteParams::default()).await.unwrap();
    assert!(vwc(&admin).await.is_none());
    let m: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    assert!(m.get_opt(webhooks::MUTATING_CONFIG).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(vwc(&admin).await.is_none(), "resurrected");
    replica.controller.stop().await;
}

#[tokio::test]
async fn scaling_to_zero_empties_the_rules() {
    let (_fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin.clone(), NS);
    deps.patch(manifests::DEPLOYMENT, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
        .await
        .unwrap();
    eventually("rules emptied", || async {
        vwc(&admin).await.filter(|v| entry_rules(v, webhooks::VALIDATE_FAIL).is_none())
    })
    .await;
    // Every entry is emptied, policy validation included; the entries themselves stay (the
    // installer owns them).
    let cfg = eventually("all rules emptied", || async {
        vwc(&admin).await.filter(|v| entry_rules(v, webhooks::POLICY_VALIDATE).is_none())
    })
    .await;
    let names: Vec<&str> = cfg["webhooks"].as_array().unwrap().iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(names, webhooks::VALIDATING_ENTRIES);
    assert!(cfg["webhooks"].as_array().unwrap().iter().all(|w| w.get("rules").is_none()));
    replica.controller.stop().await;
}

#[tokio::test]
async fn break_glass_with_a_live_leader_stays_ignore_and_restore_puts_fail_back() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let report = verno_controller::ops::break_glass(&admin, verno_controller::ops::Mode::Ignore, false).await.unwrap();
    assert!(report.iter().any(|l| l.contains("verno-resource-validating-webhook-cfg")), "{report:?}");
    // The leader keeps reconciling (a policy change, a resync) and leaves failurePolicy alone.
    apply_policy(&admin, &REQUIRE_TEAM.replace("require-team", "require-team-2")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cfg = vwc(&admin).await.unwrap();
    assert!(cfg["webhooks"].as_array().unwrap().iter().all(|w| w["failurePolicy"] == "Ignore"), "{cfg}");
    assert!(entry_rules(&cfg, webhooks::VALIDATE_FAIL).is_some(), "rules still managed");
    // With Verno dead, Pods are admitted.
    replica.controller.stop().await;
    fake.set_service(NS, manifests::SERVICE, None);
    Api::<Pod>::namespaced(admin.clone(), "shop").create(&PostParams::default(), &pod("web", json!({}))).await.unwrap();
    let doctor = verno_controller::ops::doctor(&admin, NS, "verno-controller").await.unwrap();
    assert!(doctor.contains("break-glass since"), "{doctor}");
    verno_controller::ops::break_glass(&admin, verno_controller::ops::Mode::Restore, false).await.unwrap();
    let cfg = vwc(&admin).await.unwrap();
    assert_eq!(cfg["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(cfg["webhooks"][1]["failurePolicy"], "Ignore");
    assert!(cfg["metadata"]["annotations"].get(webhooks::BREAK_GLASS_ANNOTATION).is_none());
}

fn leaders(rs: &[&Replica]) -> usize {
    rs.iter().filter(|r| *r.controller.leader.borrow()).count()
}

#[tokio::test]
async fn two_replicas_one_leader_no_churn_and_failover_when_the_leader_dies() {
    let (fake, admin, a) = setup().await;
    let b = start_replica(&fake, "verno-1").await;
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    // Both replicas serve admission with the same set.
    eventually("b has the policy", || async { (b.server.current().policies().len() == 1).then_some(()) }).await;
    assert_eq!(leaders(&[&a, &b]), 1);
    assert!(*a.controller.leader.borrow(), "the first replica took the lease");
    // Steady state: no writes but lease renewals, and the lease does not change hands. The
    // policy's status is written last (a moment after its webhook entry): wait for it.
    eventually("the policy's status", || async {
        let p = policy_api(&admin).get("require-team").await.ok()?;
        (p.data.pointer("/status/conditions/0/status").and_then(Value::as_str) == Some("True")).then_some(())
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), NS);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let transitions = leases.get("verno-controller").await.unwrap().spec.unwrap().lease_transitions;
    let before = fake.writes().iter().filter(|w| !w.path.contains("/leases/")).count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after: Vec<_> = fake.writes().into_iter().filter(|w| !w.path.contains("/leases/")).collect();
    assert_eq!(after.len(), before, "writes at steady state: {:?}", &after[before..]);
    let lease = leases.get("verno-controller").await.unwrap().spec.unwrap();
    assert_eq!(lease.lease_transitions, transitions);
    assert_eq!(lease.holder_identity.as_deref(), Some("verno-0"));
    assert_eq!(leaders(&[&a, &b]), 1);

    // The leader crashes without releasing: after the lease expires the other takes over and
    // keeps the webhook rules in step.
    a.controller.abort();
    fake.set_service(NS, manifests::SERVICE, Some(b.server.addr));
    eventually("failover", || async { b.controller.leader.borrow().then_some(()) }).await;
    apply_policy(
        &admin,
        &REQUIRE_TEAM.replace("require-team", "require-configmap-team").replace("\"Pod\"", "\"ConfigMap\""),
    )
    .await;
    eventually("rules from the new leader", || async {
        entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL).filter(|r| r.to_string().contains("configmaps"))
    })
    .await;
    assert_eq!(leases.get("verno-controller").await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("verno-1"));
    b.controller.stop().await;
    // A stopping leader releases its lease at once.
    let released = leases.get("verno-controller").await.unwrap().spec.unwrap();
    assert!(released.holder_identity.is_none());
}

#[tokio::test]
async fn certificate_rotation_with_requests_in_flight_fails_no_request() {
    init_logs();
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = client(&fake, None).await;
    install(&fake, &admin, &manifests::Values::default()).await;
    // A serving certificate that lasts 3 s is renewed after 2 s; the CA (4 s) is re-issued
    // (same key, appended to the bundle) while requests run.
    let Replica { server, controller } = start_replica_with(&fake, "verno-0", |o| {
        o.deployment = None;
        o.resync = Duration::from_millis(500);
        o.pair_validity = Duration::from_secs(3);
        o.ca_validity = Duration::from_secs(4);
    })
    .await;
    fake.set_service(NS, manifests::SERVICE, Some(server.addr));
    apply_policy(&admin, REQUIRE_TEAM).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), NS);
    let pair = format!("{}.{NS}.svc.verno-tls-pair", manifests::SERVICE);
    let first = secrets.get(&pair).await.unwrap().metadata.resource_version;
    // Requests through admission, concurrently, across at least two renewals.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(7);
    let mut n = 0;
    while tokio::time::Instant::now() < deadline {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let pods = pods.clone();
                let name = format!("p-{n}-{i}");
                async move { pods.create(&PostParams::default(), &pod(&name, json!({"team": "a"}))).await }
            })
            .collect();
        for r in futures_util::future::join_all(batch).await {
            r.expect("no request fails during rotation");
        }
        n += 1;
    }
    let last = secrets.get(&pair).await.unwrap().metadata.resource_version;
    assert_ne!(first, last, "the serving certificate was renewed");
    // The CA was re-issued, the bundle keeps the previous certificate, and the webhook
    // configuration trusts the same bundle.
    use base64::Engine as _;
    let ca_name = format!("{}.{NS}.svc.verno-tls-ca", manifests::SERVICE);
    eventually("the caBundle to follow the CA Secret", || async {
        let ca = secrets.get(&ca_name).await.ok()?;
        let bundle = String::from_utf8(ca.data?.get("tls.crt")?.0.clone()).ok()?;
        let in_vwc = vwc(&admin).await?["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .map(|b| base64::engine::general_purpose::STANDARD.decode(b).unwrap_or_default())?;
        (bundle.matches("BEGIN CERTIFICATE").count() == 2 && in_vwc == bundle.as_bytes()).then_some(())
    })
    .await;
    assert!(fake.admission_calls().iter().filter(|c| c.outcome == "allowed").count() >= n * 4);
    controller.stop().await;
}

/// In a cluster, a `configMap` context entry reads the ConfigMap from the API server (as
/// Verno's ServiceAccount), at each admission: changing the ConfigMap changes the verdict.
#[tokio::test]
async fn config_map_context_reads_the_cluster() {
    let (_fake, admin, replica) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "shop");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "allowed"}, "data": {"team": "a"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let policy = r#"{
      "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "allowed-team"},
      "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{
        "name": "team-from-configmap",
        "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
        "context": [{"name": "allowed", "configMap": {"name": "allowed", "namespace": "shop"}}],
        "validate": {"message": "team must be {{ allowed.data.team }}",
          "deny": {"conditions": {"any": [{"key": "{{ request.object.metadata.labels.team || '' }}", "operator": "NotEquals", "value": "{{ allowed.data.team }}"}]}}}}]}}"#;
    apply_policy(&admin, policy).await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    pods.create(&PostParams::default(), &pod("a", json!({"team": "a"}))).await.unwrap();
    let err = pods.create(&PostParams::default(), &pod("b", json!({"team": "b"}))).await.unwrap_err();
    assert!(err.to_string().contains("team must be a"), "{err}");
    cms.patch("allowed", &PatchParams::default(), &Patch::Merge(json!({"data": {"team": "b"}}))).await.unwrap();
    pods.create(&PostParams::default(), &pod("b", json!({"team": "b"}))).await.unwrap();
    replica.controller.stop().await;
}

const AUDIT_OWNER: &str = r#"{
  "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "audit-owner",
    "annotations": {"policies.kyverno.io/severity": "medium"}},
  "spec": {"validationFailureAction": "Audit", "rules": [{
    "name": "check-owner",
    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
    "validate": {"message": "label 'owner' is recommended", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}}"#;

/// The PolicyReport of the object with this uid, if any.
fn report_of(fake: &FakeApiServer, ns: &str, uid: &str) -> Option<Value> {
    fake.get("wgpolicyk8s.io", "policyreports", ns, uid)
}

fn results_of(report: &Value) -> Vec<(String, String, String)> {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
            (s("policy"), s("rule"), s("result"))
        })
        .collect()
}

fn report_writes(fake: &FakeApiServer) -> usize {
    fake.writes().iter().filter(|w| w.path.contains("policyreports")).count()
}

#[tokio::test]
async fn background_scans_keep_reports_exact_and_write_only_changes() {
    let (fake, admin, replica) = setup().await;
    // Objects that exist before the policy: only a scan can report them.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let bare = pods.create(&PostParams::default(), &pod("bare", json!({"app": "web"}))).await.unwrap();
    let owned = pods.create(&PostParams::default(), &pod("owned", json!({"owner": "me"}))).await.unwrap();
    let (bare_uid, owned_uid) = (bare.metadata.uid.unwrap(), owned.metadata.uid.unwrap());
    apply_policy(&admin, AUDIT_OWNER).await;
    let report = eventually("bare's report", || async { report_of(&fake, "shop", &bare_uid) }).await;
    assert_eq!(results_of(&report), [("audit-owner".into(), "check-owner".into(), "fail".into())]);
    assert_eq!(report["scope"]["name"], "bare");
    assert_eq!(report["results"][0]["properties"]["process"], "background scan");
    assert_eq!(report["results"][0]["severity"], "medium");
    assert_eq!(report["summary"]["fail"], 1);
    let ok = eventually("owned's report", || async { report_of(&fake, "shop", &owned_uid) }).await;
    assert_eq!(results_of(&ok)[0].2, "pass");
    // The failure is an event from the scan, on the Pod.
    let ev = event_with_note(&admin, "policy audit-owner/check-owner fail: validation error: label 'owner' is recommended. rule check-owner failed at path /metadata/labels/owner/").await;
    assert_eq!(ev["reportingController"], "kyverno-scan");

    // Quiet: nothing changes, nothing is written (an object update that policies cannot see
    // — its status — is not evaluated again either).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = report_writes(&fake);
    let mut with_status = pods.get("bare").await.unwrap();
    with_status.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    pods.replace_status("bare", &PostParams::default(), &with_status).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(report_writes(&fake), before, "writes with nothing changed");

    // A fixed object: its result turns to pass (one write).
    let mut fixed = pods.get("bare").await.unwrap();
    fixed.metadata.labels.get_or_insert_default().insert("owner".into(), "you".into());
    pods.replace("bare", &PostParams::default(), &fixed).await.unwrap();
    eventually("bare passes", || async {
        report_of(&fake, "shop", &bare_uid).filter(|r| results_of(r)[0].2 == "pass")
    })
    .await;

    // The policy now excludes Pods labelled app=web: bare's result goes, and with it the
    // report (kyverno/kyverno#8519: Kyverno keeps the stale result).
    let excluding: Value = {
        let mut v: Value = serde_json::from_str(AUDIT_OWNER).unwrap();
        v["spec"]["rules"][0]["exclude"] =
            json!({"any": [{"resources": {"selector": {"matchLabels": {"app": "web"}}}}]});
        v
    };
    apply_policy(&admin, &excluding.to_string()).await;
    eventually("bare's report deleted", || async { report_of(&fake, "shop", &bare_uid).is_none().then_some(()) }).await;
    assert!(report_of(&fake, "shop", &owned_uid).is_some());

    // A renamed rule: the old rule's results disappear, the new one's appear.
    apply_policy(&admin, &AUDIT_OWNER.replace("check-owner", "owner-label")).await;
    eventually("renamed rule", || async {
        report_of(&fake, "shop", &owned_uid)
            .filter(|r| results_of(r) == [("audit-owner".to_string(), "owner-label".to_string(), "pass".to_string())])
    })
    .await;

    // Kyverno's results metric counts the scan's results; Verno's counts its writes.
    let metrics = replica.server.metrics_text();
    assert!(
        metrics.lines().any(|l| l.starts_with("kyverno_policy_results_total{")
            && l.contains(r#"rule_execution_cause="background_scan""#)
            && l.contains(r#"policy_name="audit-owner""#)),
        "{metrics}"
    );
    assert!(metrics.lines().any(|l| l.starts_with("verno_report_writes_total ") && !l.ends_with(" 0")), "{metrics}");
    // A Pod deleted while no leader runs has no report once a new leader has listed Pods.
    replica.controller.abort();
    pods.delete("owned", &DeleteParams::default()).await.unwrap();
    // (The fake collects owned objects at once; put the orphan back as a lagging collector
    // would have left it.)
    let orphan = report_of(&fake, "shop", &owned_uid);
    if orphan.is_none() {
        let mut r = ok.clone();
        r["metadata"].as_object_mut().unwrap().retain(|k, _| k == "name" || k == "namespace" || k == "labels");
        fake.apply(&admin, &r).await.unwrap();
    }
    assert!(report_of(&fake, "shop", &owned_uid).is_some());
    let next = start_replica(&fake, "verno-1").await;
    eventually("the orphan report deleted", || async { report_of(&fake, "shop", &owned_uid).is_none().then_some(()) })
        .await;
    next.controller.stop().await;
}

/// A false deny: the requesting user's ClusterRoles come from the cluster's
/// bindings, so a policy that excludes a cluster role does not refuse its holders.
#[tokio::test]
async fn a_user_bound_to_an_excluded_cluster_role_is_not_refused() {
    let (fake, admin, replica) = setup().await;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "ops-break-glass"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "break-glass"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ops"}]});
    fake.apply(&admin, &binding).await.unwrap();
    let policy = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "owner"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "owner",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "exclude": {"any": [{"clusterRoles": ["break-glass"]}]},
            "validate": {"message": "an owner label is required", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}});
    apply_policy(&admin, &policy.to_string()).await;
    eventually("rules for pods", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let as_user = |name: &'static str| {
        let fake = &fake;
        async move { Api::<Pod>::namespaced(client(fake, Some(name)).await, "shop") }
    };
    let dev = as_user("dev").await;
    let err = dev.create(&PostParams::default(), &pod("by-dev", json!({}))).await.unwrap_err();
    assert!(err.to_string().contains("an owner label is required"), "{err}");
    // The binding may arrive a moment after the policy: the excluded user is admitted then.
    let ops = as_user("ops").await;
    eventually("ops is admitted", || async {
        ops.create(&PostParams::default(), &pod("by-ops", json!({}))).await.ok()
    })
    .await;
    replica.controller.stop().await;
}

/// Reports have a size cap. Three Audit rules quoting a 700 KB annotation in
/// their messages would make a 2.1 MB report, which etcd refuses (and the fake, as it does);
/// the messages are cut instead, the report is written, and its summary stays true.
#[tokio::test]
async fn a_report_too_large_for_etcd_is_written_with_its_messages_cut() {
    let (fake, admin, replica) = setup().await;
    let rules: Vec<Value> = (0..3)
        .map(|i| {
            json!({"name": format!("quote-{i}"), "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"message": "owner missing; note: {{ request.object.metadata.annotations.note }}",
                    "pattern": {"metadata": {"labels": {"owner": "?*"}}}}})
        })
        .collect();
    let policy = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "quoting"},
        "spec": {"validationFailureAction": "Audit", "rules": rules}});
    apply_policy(&admin, &policy.to_string()).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let mut p = pod("chatty", json!({"app": "web"}));
    p.metadata.annotations = Some([("note".to_string(), "n".repeat(700 * 1024))].into());
    let uid = pods.create(&PostParams::default(), &p).await.unwrap().metadata.uid.unwrap();
    let report = eventually("the report", || async {
        report_of(&fake, "shop", &uid).filter(|r| r["results"].as_array().is_some_and(|a| a.len() == 3))
    })
    .await;
    assert_eq!(report["summary"]["fail"], 3);
    for r in report["results"].as_array().unwrap() {
        let m = r["message"].as_str().unwrap();
        assert!(m.contains("owner missing; note: nnn") && m.ends_with("… (truncated)"), "{}", &m[..80]);
        assert!(m.len() < 4096);
    }
    replica.controller.stop().await;
}

#[tokio::test]
async fn mutations_at_admission_are_reported_beside_the_scans_results() {
    let (fake, admin, replica) = setup().await;
    // One policy with a mutate rule (reported at admission: scans do not mutate) and a
    // validate rule (reported by the scan).
    apply_policy(
        &admin,
        r#"{"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "label-and-check"},
          "spec": {"rules": [
            {"name": "add-foo", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
             "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"foo": "bar"}}}}},
            {"name": "check-foo", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
             "validate": {"failureAction": "Audit", "message": "foo", "pattern": {"metadata": {"labels": {"foo": "bar"}}}}}]}}"#,
    )
    .await;
    eventually("rules", || async {
        let cfg = entry_rules(&mutating(&admin).await?, webhooks::MUTATE_FAIL)?;
        Some(cfg)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let created = pods.create(&PostParams::default(), &pod("web", json!({}))).await.unwrap();
    assert_eq!(created.metadata.labels.as_ref().unwrap()["foo"], "bar");
    let uid = created.metadata.uid.unwrap();
    let report = eventually("both results", || async {
        report_of(&fake, "shop", &uid).filter(|r| r["results"].as_array().is_some_and(|a| a.len() == 2))
    })
    .await;
    assert_eq!(
        results_of(&report),
        [
            ("label-and-check".to_string(), "add-foo".to_string(), "pass".to_string()),
            ("label-and-check".to_string(), "check-foo".to_string(), "pass".to_string())
        ]
    );
    assert_eq!(report["results"][0]["message"], "mutated Pod/web in namespace shop");
    // The scan leaves the mutation's result alone when it rewrites its own.
    let mut unlabelled = pods.get("web").await.unwrap();
    unlabelled.metadata.labels.as_mut().unwrap().insert("foo".into(), "baz".into());
    // (The mutating webhook sets foo=bar again on UPDATE; the object stays passing.)
    pods.replace("web", &PostParams::default(), &unlabelled).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = report_of(&fake, "shop", &uid).unwrap();
    assert_eq!(results_of(&report).len(), 2, "{report}");
    replica.controller.stop().await;
}

async fn mutating(c: &kube::Client) -> Option<Value> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    api.get_opt(webhooks::MUTATING_CONFIG).await.unwrap().map(|o| serde_json::to_value(o).unwrap())
}

#[tokio::test]
async fn labelled_admission_policies_are_reported_by_scans() {
    let (fake, admin, replica) = setup().await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin.clone(), "shop");
    let deployment = |name: &str, replicas: i32| -> k8s_openapi::api::apps::v1::Deployment {
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}))
        .unwrap()
    };
    let small = deployments.create(&PostParams::default(), &deployment("small", 2)).await.unwrap();
    let big = deployments.create(&PostParams::default(), &deployment("big", 9)).await.unwrap();
    let vap = |name: &str, labelled: bool| {
        let labels = if labelled { json!({"reports.kyverno.io/enabled": "true"}) } else { json!({}) };
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
                "validations": [{"expression": "object.spec.replicas <= 5"}]}})
    };
    let binding = |name: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": format!("{name}-binding")}, "spec": {"policyName": name, "validationActions": ["Audit"]}})
    };
    for doc in [vap("max-replicas", true), binding("max-replicas"), vap("unreported", false), binding("unreported")] {
        fake.apply(&admin, &doc).await.unwrap();
    }
    let report = |uid: String| {
        let fake = fake.clone();
        async move { report_of(&fake, "shop", &uid) }
    };
    let failing = eventually("big's report", || report(big.metadata.uid.clone().unwrap())).await;
    assert_eq!(failing["results"][0]["source"], "ValidatingAdmissionPolicy");
    assert_eq!(failing["results"][0]["policy"], "max-replicas");
    assert_eq!(failing["results"][0]["result"], "fail");
    assert_eq!(failing["results"].as_array().unwrap().len(), 1, "the unlabelled policy is not reported: {failing}");
    let passing = eventually("small's report", || report(small.metadata.uid.clone().unwrap())).await;
    assert_eq!(passing["results"][0]["result"], "pass");
    // The failure is a scan event on the admission policy.
    let events = events_api(&admin);
    eventually("an event on the admission policy", || async {
        events.list(&Default::default()).await.ok()?.items.into_iter().find(|e| {
            e.data["regarding"]["kind"] == "ValidatingAdmissionPolicy"
                && e.data["reportingController"] == "kyverno-scan"
        })
    })
    .await;
    // Admission policies are the API server's: no webhook rule, no status written.
    let cfg = vwc(&admin).await.unwrap();
    assert!(!cfg.to_string().contains("deployments"), "{cfg}");
    replica.controller.stop().await;
}

#[tokio::test]
async fn a_periodic_rescan_of_an_unchanged_cluster_writes_nothing() {
    init_logs();
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = client(&fake, None).await;
    install(&fake, &admin, &manifests::Values::default()).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let p = pods.create(&PostParams::default(), &pod("bare", json!({}))).await.unwrap();
    apply_policy(&admin, AUDIT_OWNER).await;
    let replica = start_replica_with(&fake, "verno-0", |o| {
        o.background_scan =
            Some(verno_controller::scan::ScanOptions { rescan: Some(Duration::from_secs(1)), ..Default::default() });
    })
    .await;
    fake.set_service(NS, manifests::SERVICE, Some(replica.server.addr));
    let uid = p.metadata.uid.unwrap();
    eventually("the report", || async { report_of(&fake, "shop", &uid) }).await;
    // The first scan goes on to other objects (Verno's own Deployment, through autogen): wait
    // until its writes stop before counting.
    let mut settled = report_writes(&fake);
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = report_writes(&fake);
        if now == settled {
            break;
        }
        settled = now;
    }
    let lists = || fake.requests().iter().filter(|r| r.method == "GET" && r.path == "/api/v1/pods").count();
    let (writes, listed) = (report_writes(&fake), lists());
    // Several rescans (every second, checked every 5 s): Pods listed again, nothing written.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(lists() > listed, "no rescan happened");
    assert_eq!(report_writes(&fake), writes, "a rescan of an unchanged cluster wrote reports");
    replica.controller.stop().await;
}

// ---- The background controller: generate and mutate-existing, level-based ----

fn secret_api(c: &kube::Client, ns: &str) -> Api<k8s_openapi::api::core::v1::Secret> {
    Api::namespaced(c.clone(), ns)
}

async fn create_namespace(c: &kube::Client, name: &str, labels: Value) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
    let ns = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn secret_names(c: &kube::Client, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = secret_api(c, ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    names.sort();
    names
}

/// Waits until the set in force holds `name` (its status says ready).
async fn wait_ready(admin: &kube::Client, name: &str) {
    eventually("the policy is ready", || async {
        policy_api(admin).get(name).await.ok().filter(|p| p.data["status"]["ready"] == true)
    })
    .await;
}

#[tokio::test]
async fn deleting_one_clone_list_source_removes_only_its_own_copies() {
    let (_fake, admin, replica) = setup().await;
    create_namespace(&admin, "platform", json!({})).await;
    for name in ["alpha", "beta"] {
        let s = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "platform", "labels": {"share": "yes"}}, "data": {"k": "dg=="}})).unwrap();
        secret_api(&admin, "platform").create(&PostParams::default(), &s).await.unwrap();
    }
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "share-secrets"},
        "spec": {"rules": [{"name": "share", "match": {"any": [{"resources": {"kinds": ["Namespace"], "selector": {"matchLabels": {"team": "yes"}}}}]},
            "generate": {"synchronize": true, "namespace": "{{request.object.metadata.name}}",
                "cloneList": {"namespace": "platform", "kinds": ["v1/Secret"], "selector": {"matchLabels": {"share": "yes"}}}}}]}}).to_string()).await;
    wait_ready(&admin, "share-secrets").await;
    for ns in ["team-1", "team-2"] {
        create_namespace(&admin, ns, json!({"team": "yes"})).await;
    }
    for ns in ["team-1", "team-2"] {
        eventually("both copies", || async { (secret_names(&admin, ns).await == ["alpha", "beta"]).then_some(()) })
            .await;
    }
    secret_api(&admin, "platform").delete("alpha", &DeleteParams::default()).await.unwrap();
    for ns in ["team-1", "team-2"] {
        eventually("alpha's copy gone", || async { (secret_names(&admin, ns).await == ["beta"]).then_some(()) }).await;
    }
    // And it stays that way: beta's copies are left alone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(secret_names(&admin, "team-1").await, ["beta"]);
    assert_eq!(secret_names(&admin, "team-2").await, ["beta"]);
    replica.controller.stop().await;
}

/// Kyverno's background controller reports a generate rule's results for the trigger once it
/// has converged, with what it generated (`generated-resources`): for a trigger admitted after
/// the policy and, with `generateExisting`, for one that was there before it.
#[tokio::test]
async fn generate_rules_report_what_they_generated_on_the_trigger() {
    let (fake, admin, replica) = setup().await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), "shop");
    let cm = |name: &str| {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "shop", "labels": {"make": "yes"}}, "data": {"k": "v"}}),
        )
        .unwrap()
    };
    let before = cms.create(&PostParams::default(), &cm("before")).await.unwrap().metadata.uid.unwrap();
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "make-copies"},
        "spec": {"rules": [{"name": "copy", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "selector": {"matchLabels": {"make": "yes"}}}}]},
            "generate": {"generateExisting": true, "apiVersion": "v1", "kind": "ConfigMap", "name": "{{request.object.metadata.name}}-copy",
                "namespace": "{{request.object.metadata.namespace}}", "data": {"data": {"made": "yes"}}}}]}}).to_string()).await;
    wait_ready(&admin, "make-copies").await;
    let after = cms.create(&PostParams::default(), &cm("after")).await.unwrap().metadata.uid.unwrap();
    for (uid, name) in [(before, "before"), (after, "after")] {
        let report = eventually("the trigger's generate result", || async {
            report_of(&fake, "shop", &uid).filter(|r| results_of(r).iter().any(|(p, _, _)| p == "make-copies"))
        })
        .await;
        let results: Vec<&Value> =
            report["results"].as_array().unwrap().iter().filter(|r| r["policy"] == "make-copies").collect();
        assert_eq!(results.len(), 1, "{report}");
        assert_eq!((results[0]["rule"].as_str(), results[0]["result"].as_str()), (Some("copy"), Some("pass")));
        assert_eq!(
            results[0]["properties"]["generated-resources"],
            format!("/v1, Kind=ConfigMap Name={name}-copy Namespace=shop"),
            "{report}"
        );
    }
    replica.controller.stop().await;
}

/// Kyverno learns of clone sources from admission requests, so RBAC written for it often grants
/// `get, list` on Secrets and no `watch` (Kyverno's own CI does): a source change must still
/// reach the copies (the background controller lists the kind periodically instead).
#[tokio::test]
async fn a_clone_source_whose_watch_is_forbidden_still_syncs_its_copies() {
    let (fake, admin, replica) = setup().await;
    fake.forbid_watch("secrets");
    create_namespace(&admin, "platform", json!({})).await;
    let s = serde_json::from_value(
        json!({"metadata": {"name": "regcred", "namespace": "platform"}, "data": {"k": "djE="}}),
    )
    .unwrap();
    secret_api(&admin, "platform").create(&PostParams::default(), &s).await.unwrap();
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "copy-regcred"},
        "spec": {"rules": [{"name": "copy", "match": {"any": [{"resources": {"kinds": ["Namespace"], "selector": {"matchLabels": {"team": "yes"}}}}]},
            "generate": {"synchronize": true, "apiVersion": "v1", "kind": "Secret", "name": "regcred", "namespace": "{{request.object.metadata.name}}",
                "clone": {"namespace": "platform", "name": "regcred"}}}]}}).to_string()).await;
    wait_ready(&admin, "copy-regcred").await;
    create_namespace(&admin, "team-1", json!({"team": "yes"})).await;
    let data = |s: k8s_openapi::api::core::v1::Secret| s.data.and_then(|d| d.get("k").map(|v| v.0.clone()));
    eventually("the copy", || async {
        secret_api(&admin, "team-1").get_opt("regcred").await.ok().flatten().and_then(data).filter(|d| d == b"v1")
    })
    .await;
    let patch = json!({"data": {"k": "djI="}});
    secret_api(&admin, "platform").patch("regcred", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the copy follows its source", || async {
        secret_api(&admin, "team-1").get_opt("regcred").await.ok().flatten().and_then(data).filter(|d| d == b"v2")
    })
    .await;
    replica.controller.stop().await;
}

const DATA_SYNC: &str = r#"{"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "team-credentials"},
  "spec": {"rules": [{"name": "cred", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "selector": {"matchLabels": {"wants": "cred"}}}}]},
    "generate": {"synchronize": true, "apiVersion": "v1", "kind": "Secret",
      "name": "{{request.object.metadata.namespace}}-cred", "namespace": "shared",
      "data": {"data": {"team": "{{ base64_encode(request.object.metadata.namespace) }}"}}}}]}}"#;

async fn trigger_cm(c: &kube::Client, ns: &str, extra: Value) {
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "trigger", "namespace": ns, "labels": {"wants": "cred"}, "annotations": extra}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .patch("trigger", &PatchParams::apply("kubectl").force(), &Patch::Apply(&cm))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_no_op_trigger_update_never_deletes_and_a_namespace_deletion_touches_only_its_own() {
    let (fake, admin, replica) = setup().await;
    create_namespace(&admin, "shared", json!({})).await;
    apply_policy(&admin, DATA_SYNC).await;
    wait_ready(&admin, "team-credentials").await;
    for ns in ["team-1", "team-2"] {
        create_namespace(&admin, ns, json!({})).await;
        trigger_cm(&admin, ns, json!({})).await;
    }
    eventually("both credentials", || async {
        (secret_names(&admin, "shared").await == ["team-1-cred", "team-2-cred"]).then_some(())
    })
    .await;
    let uid = secret_api(&admin, "shared").get("team-1-cred").await.unwrap().metadata.uid;
    let deletes = |fake: &FakeApiServer| {
        fake.writes().iter().filter(|w| w.method == "DELETE" && w.path.contains("/secrets")).count()
    };
    // No-op and unrelated updates of the trigger: nothing is deleted or recreated.
    trigger_cm(&admin, "team-1", json!({})).await;
    trigger_cm(&admin, "team-1", json!({"note": "unrelated"})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(secret_api(&admin, "shared").get("team-1-cred").await.unwrap().metadata.uid, uid);
    assert_eq!(deletes(&fake), 0);
    // A synchronized downstream edited by hand is put back.
    let mut edited = secret_api(&admin, "shared").get("team-1-cred").await.unwrap();
    edited.data = Some(std::collections::BTreeMap::from([("team".into(), k8s_openapi::ByteString(b"other".to_vec()))]));
    secret_api(&admin, "shared").replace("team-1-cred", &PostParams::default(), &edited).await.unwrap();
    eventually("the edit reverted", || async {
        let s = secret_api(&admin, "shared").get("team-1-cred").await.ok()?;
        (s.data?.get("team")?.0 == b"team-1").then_some(())
    })
    .await;
    // The trigger stops matching: its downstream goes, the other stays.
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "trigger", "namespace": "team-2", "labels": {"wants": "nothing"}}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "team-2")
        .replace("trigger", &PostParams::default(), &{
            let mut cur = Api::<ConfigMap>::namespaced(admin.clone(), "team-2").get("trigger").await.unwrap();
            cur.metadata.labels = cm.metadata.labels;
            cur
        })
        .await
        .unwrap();
    eventually("team-2's credential deleted", || async {
        (secret_names(&admin, "shared").await == ["team-1-cred"]).then_some(())
    })
    .await;
    trigger_cm(&admin, "team-2", json!({})).await;
    eventually("team-2's credential back", || async {
        (secret_names(&admin, "shared").await == ["team-1-cred", "team-2-cred"]).then_some(())
    })
    .await;
    // Deleting team-1 (and with it its trigger) deletes team-1's credential only.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete("team-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("team-1's credential deleted", || async {
        (secret_names(&admin, "shared").await == ["team-2-cred"]).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(secret_names(&admin, "shared").await, ["team-2-cred"]);
    // Deleting the synchronized policy deletes what it generated.
    policy_api(&admin).delete("team-credentials", &DeleteParams::default()).await.unwrap();
    eventually("every credential deleted", || async { secret_names(&admin, "shared").await.is_empty().then_some(()) })
        .await;
    let metrics = replica.server.metrics_text();
    assert!(metrics.lines().any(|l| l.starts_with("verno_background_work_total{result=\"done\"}")), "{metrics}");
    replica.controller.stop().await;
}

#[tokio::test]
async fn a_leader_change_during_a_fan_out_ends_with_every_downstream_exactly_once() {
    // The first leader writes slowly, so it is surely half-way when it dies.
    let (fake, admin, first) = setup_with(|o| {
        o.background = Some(verno_controller::background::BackgroundOptions {
            writes_per_second: 40.0,
            burst: 10.0,
            ..Default::default()
        })
    })
    .await;
    create_namespace(&admin, "shared", json!({})).await;
    apply_policy(&admin, DATA_SYNC).await;
    wait_ready(&admin, "team-credentials").await;
    const N: usize = 1000;
    let creates = futures_util::stream::iter(0..N)
        .map(|i| {
            let admin = admin.clone();
            async move {
                let ns = format!("fan-{i}");
                create_namespace(&admin, &ns, json!({})).await;
                trigger_cm(&admin, &ns, json!({})).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>();
    creates.await;
    // The leader dies while it works through the fan-out.
    eventually("some credentials", || async { (secret_names(&admin, "shared").await.len() >= 20).then_some(()) }).await;
    first.controller.abort();
    let at_abort = secret_names(&admin, "shared").await.len();
    assert!(at_abort < N, "the first leader finished the fan-out before it died ({at_abort} of {N})");
    let second = start_replica(&fake, "verno-1").await;
    // What is under test is exactly-once, not speed (a thousand writes, with the other tests of
    // this file running beside it): a long limit.
    let names = fake_apiserver::eventually_within("every credential", Duration::from_secs(120), || async {
        let n = secret_names(&admin, "shared").await;
        (n.len() == N).then_some(n)
    })
    .await
    .unwrap();
    let expected: std::collections::BTreeSet<String> = (0..N).map(|i| format!("fan-{i}-cred")).collect();
    assert_eq!(names.into_iter().collect::<std::collections::BTreeSet<_>>(), expected);
    // Exactly once: no downstream was deleted and created again, none written twice (a create
    // the second leader repeated would show as a second POST of the same name).
    let secret_writes: Vec<_> =
        fake.writes().into_iter().filter(|w| w.path.starts_with("/api/v1/namespaces/shared/secrets")).collect();
    assert!(
        secret_writes.iter().all(|w| w.method == "POST"),
        "{:?}",
        secret_writes.iter().map(|w| &w.method).collect::<Vec<_>>()
    );
    assert_eq!(secret_writes.len(), N, "one create per downstream");
    second.controller.stop().await;
}

#[tokio::test]
async fn generating_policies_and_mutate_existing_policies_act_in_the_cluster() {
    let (_fake, admin, replica) = setup().await;
    let gpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "GeneratingPolicy", "metadata": {"name": "quota"},
        "spec": {"evaluation": {"synchronize": {"enabled": true}},
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["namespaces"]}]},
            "matchConditions": [{"name": "team", "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels"}],
            "generate": [{"expression": "generator.Apply(object.metadata.name, [{'apiVersion': dyn('v1'), 'kind': dyn('ConfigMap'), 'metadata': dyn({'name': 'team-info'}), 'data': dyn({'team': object.metadata.labels['team']})}])"}]}});
    let gpols: Api<DynamicObject> =
        Api::all_with(admin.clone(), &policies::resource(verno_engine::Kind::GeneratingPolicy));
    gpols.patch("quota", &PatchParams::apply("kubectl").force(), &Patch::Apply(&gpol)).await.unwrap();
    eventually("the GeneratingPolicy is ready", || async {
        gpols.get("quota").await.ok().filter(|p| p.data["status"]["conditionStatus"]["ready"] == true)
    })
    .await;
    create_namespace(&admin, "blue", json!({"team": "blue"})).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "blue");
    let cm = eventually("the generated ConfigMap", || async { cms.get("team-info").await.ok() }).await;
    assert_eq!(cm.data.unwrap()["team"], "blue");
    let labels = cm.metadata.labels.unwrap();
    assert_eq!(labels["generate.kyverno.io/policy-name"], "quota");
    assert_eq!(labels["generate.kyverno.io/trigger-kind"], "Namespace");
    // Deleted by hand: put back (synchronize).
    cms.delete("team-info", &DeleteParams::default()).await.unwrap();
    eventually("the ConfigMap regenerated", || async { cms.get("team-info").await.ok() }).await;

    // A MutatingPolicy that labels existing ConfigMaps of a namespace when a ServiceAccount is
    // created there.
    let mpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "MutatingPolicy", "metadata": {"name": "touch"},
        "spec": {"evaluation": {"mutateExisting": {"enabled": true}},
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["serviceaccounts"]}]},
            "targetMatchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]},
            "targetMatchConditions": [{"name": "same-namespace", "expression": "object.metadata.namespace == 'blue'"}],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{metadata: Object.metadata{labels: Object.metadata.labels{touched: \"yes\"}}}"}}]}});
    let mpols: Api<DynamicObject> =
        Api::all_with(admin.clone(), &policies::resource(verno_engine::Kind::MutatingPolicy));
    mpols.patch("touch", &PatchParams::apply("kubectl").force(), &Patch::Apply(&mpol)).await.unwrap();
    eventually("the MutatingPolicy is ready", || async {
        mpols.get("touch").await.ok().filter(|p| p.data["status"]["conditionStatus"]["ready"] == true)
    })
    .await;
    let sa = serde_json::from_value(json!({"metadata": {"name": "go", "namespace": "blue"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), "blue")
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    eventually("the existing ConfigMap labelled", || async {
        cms.get("team-info")
            .await
            .ok()
            .filter(|c| c.metadata.labels.as_ref().is_some_and(|l| l.get("touched").is_some_and(|v| v == "yes")))
    })
    .await;
    replica.controller.stop().await;
}

#[tokio::test]
async fn a_generate_rule_that_cannot_be_applied_becomes_a_policy_error_event() {
    let (_fake, admin, replica) = setup().await;
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "widgets"},
        "spec": {"rules": [{"name": "widget", "match": {"any": [{"resources": {"kinds": ["Namespace"], "names": ["needs-widget"]}}]},
            "generate": {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "namespace": "{{request.object.metadata.name}}",
                "data": {"spec": {"size": 1}}}}]}}).to_string()).await;
    wait_ready(&admin, "widgets").await;
    let policy_uid = policy_api(&admin).get("widgets").await.unwrap().metadata.uid.unwrap();
    create_namespace(&admin, "needs-widget", json!({})).await;
    let ns_uid = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .get("needs-widget")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let ev =
        event_with_note(&admin, "policy widgets/widget error: the cluster does not serve example.com/v1/Widget").await;
    // As Kyverno's background controller: on the policy (a ClusterPolicy's go to `default`),
    // related to the trigger, reported by `kyverno-generate`.
    assert_eq!(ev["metadata"]["namespace"], "default");
    assert_eq!((&ev["type"], &ev["reason"], &ev["action"]), (&json!("Warning"), &json!("PolicyError"), &json!("None")));
    assert_eq!(ev["reportingController"], "kyverno-generate");
    assert_eq!(ev["regarding"]["kind"], "ClusterPolicy");
    assert_eq!(ev["regarding"]["uid"], policy_uid.as_str());
    assert_eq!(ev["related"]["kind"], "Namespace");
    assert_eq!(ev["related"]["name"], "needs-widget");
    assert_eq!(ev["related"]["uid"], ns_uid.as_str());
    replica.controller.stop().await;
}

#[tokio::test]
async fn a_synchronized_rule_takes_over_an_existing_object_no_policy_generated_and_leaves_others() {
    let (_fake, admin, replica) = setup().await;
    create_namespace(&admin, "shared", json!({})).await;
    // Already there, by hand: `team-1-cred` (the synchronized rule's name) and `team-1-keep`
    // (the same rule without synchronize).
    for name in ["team-1-cred", "team-1-keep"] {
        let s = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "shared"}, "data": {"team": "aGFuZA=="}}),
        )
        .unwrap();
        secret_api(&admin, "shared").create(&PostParams::default(), &s).await.unwrap();
    }
    apply_policy(&admin, DATA_SYNC).await;
    let keep = DATA_SYNC
        .replace("team-credentials", "team-keep")
        .replace("-cred\"", "-keep\"")
        .replace("\"synchronize\": true", "\"synchronize\": false");
    apply_policy(&admin, &keep).await;
    wait_ready(&admin, "team-credentials").await;
    wait_ready(&admin, "team-keep").await;
    create_namespace(&admin, "team-1", json!({})).await;
    trigger_cm(&admin, "team-1", json!({})).await;
    // Kyverno's synchronize: the existing object is overwritten with the rule's content and
    // labelled as generated.
    let taken = eventually("the synchronized copy", || async {
        let s = secret_api(&admin, "shared").get("team-1-cred").await.ok()?;
        (s.data.as_ref()?.get("team")?.0 == b"team-1").then_some(s)
    })
    .await;
    let labels = taken.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("generate.kyverno.io/policy-name").map(String::as_str), Some("team-credentials"));
    // Without synchronize, the existing object is left as it is.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kept = secret_api(&admin, "shared").get("team-1-keep").await.unwrap();
    assert_eq!(kept.data.unwrap()["team"].0, b"hand");
    assert!(kept.metadata.labels.unwrap_or_default().is_empty());
    replica.controller.stop().await;
}

/// An ImageValidatingPolicy a Kyverno cluster holds is kept (its CRD is Verno's too) and told,
/// in its status, that Verno does not enforce it yet; its images are not checked.
#[tokio::test]
async fn image_validating_policies_are_enforced_at_admission() {
    let (_fake, admin, replica) = setup().await;
    let ivpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ImageValidatingPolicy", "metadata": {"name": "signed"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "attestors": [{"name": "cosign", "cosign": {"key": {"data": "-----BEGIN PUBLIC KEY-----\nMFk=\n-----END PUBLIC KEY-----"}}}],
            "validations": [{"expression": "images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)"}]}});
    let api: Api<DynamicObject> =
        Api::all_with(admin.clone(), &policies::resource(verno_engine::Kind::ImageValidatingPolicy));
    api.patch("signed", &PatchParams::apply("kubectl").force(), &Patch::Apply(&ivpol)).await.unwrap();
    let status = eventually("the status says ready", || async {
        api.get("signed").await.ok().map(|p| p.data["status"].clone()).filter(|s| s["conditionStatus"]["ready"] == true)
    })
    .await;
    assert_eq!(status["conditionStatus"]["ready"], true, "{status}");
    // Both entries carry the policy's resources: verification and digest pinning.
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    eventually("the entries", || async {
        let v = entry_rules(&vwc(&admin).await?, webhooks::IVPOL_VALIDATE_FAIL)?;
        let m = serde_json::to_value(mwc.get_opt(webhooks::MUTATING_CONFIG).await.ok()??).ok()?;
        let m = entry_rules(&m, webhooks::IVPOL_MUTATE_FAIL)?;
        (v.to_string().contains("pods") && m.to_string().contains("pods")).then_some(())
    })
    .await;
    // Enforced: an image whose digest cannot be had (no registry here) is refused, by name.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let err = pods.create(&PostParams::default(), &pod("unsigned", json!({}))).await.unwrap_err().to_string();
    assert!(err.contains("Policy signed error"), "{err}");
    replica.controller.stop().await;
}

/// GlobalContextEntries are kept in the cluster (before, every policy reading one
/// errored, and an Enforce policy denied every request it matched): a resource entry follows
/// its objects and projections, an API call entry holds its answer and the leader stamps its
/// refresh time, a missing entry fails in Kyverno's words, and an entry Kyverno would refuse
/// is refused when applied.
#[tokio::test]
async fn global_context_entries_feed_global_references() {
    let (_fake, admin, replica) = setup().await;
    let entries: Api<DynamicObject> =
        Api::all_with(admin.clone(), &verno_controller::global_context::global_context_entries());
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "shop");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    cms.create(&PostParams::default(), &cm("seed")).await.unwrap();
    for e in [
        json!({"apiVersion": "kyverno.io/v2alpha1", "kind": "GlobalContextEntry", "metadata": {"name": "shop-cms"},
            "spec": {"kubernetesResource": {"version": "v1", "resource": "configmaps", "namespace": "shop"},
                "projections": [{"name": "count", "jmesPath": "length(@)"}]}}),
        json!({"apiVersion": "kyverno.io/v2alpha1", "kind": "GlobalContextEntry", "metadata": {"name": "shop-list"},
            "spec": {"apiCall": {"urlPath": "/api/v1/namespaces/shop/configmaps", "refreshInterval": "1h"}}}),
    ] {
        let name = e["metadata"]["name"].as_str().unwrap().to_string();
        entries.patch(&name, &PatchParams::apply("kubectl").force(), &Patch::Apply(&e)).await.unwrap();
    }
    // Refused as Kyverno's validation webhook refuses it.
    let bad = json!({"apiVersion": "kyverno.io/v2alpha1", "kind": "GlobalContextEntry", "metadata": {"name": "bad"},
        "spec": {"apiCall": {"service": {"url": "http://localhost:8080"}, "method": "GET",
            "data": [{"key": "a", "value": "b"}], "refreshInterval": "10s"}}});
    let err = entries.patch("bad", &PatchParams::apply("kubectl").force(), &Patch::Apply(&bad)).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.apiCall.method: Forbidden: An External API call with data should have method as POST"),
        "{err}"
    );
    apply_policy(
        &admin,
        &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "one-config-map"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "count",
            "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["shop"]}}]},
            "context": [
                {"name": "count", "globalReference": {"name": "shop-cms.count"}},
                {"name": "listed", "globalReference": {"name": "shop-list", "jmesPath": "items | length(@)"}},
            ],
            "validate": {"message": "{{ count }} ConfigMaps, {{ listed }} listed", "deny": {"conditions": {"any": [
                {"key": "{{ count }}", "operator": "NotEquals", "value": 1},
                {"key": "{{ listed }}", "operator": "NotEquals", "value": 1}]}}}}]}})
        .to_string(),
    )
    .await;
    wait_ready(&admin, "one-config-map").await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    // Admitted once both entries hold the one ConfigMap.
    eventually("admitted", || async { pods.create(&PostParams::default(), &pod("one", json!({}))).await.ok() }).await;
    // A second ConfigMap: the watch brings it to the projection; the API call's answer is an
    // hour old and still says one.
    cms.create(&PostParams::default(), &cm("second")).await.unwrap();
    let err = eventually("denied", || async {
        pods.create(&PostParams::default(), &pod("two", json!({}))).await.err().map(|e| e.to_string())
    })
    .await;
    assert!(err.contains("2 ConfigMaps, 1 listed"), "{err}");
    // The leader stamped the API call entry's refresh time.
    let status = eventually("lastRefreshTime", || async {
        entries
            .get("shop-list")
            .await
            .ok()
            .map(|e| e.data["status"].clone())
            .filter(|s| s["lastRefreshTime"].is_string())
    })
    .await;
    assert!(status.get("conditions").is_none(), "{status}");
    // An entry that does not exist: Kyverno's words, naming it.
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "missing"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "missing",
            "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["other"]}}]},
            "context": [{"name": "n", "globalReference": {"name": "no-such-entry"}}],
            "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "{{ n }}", "operator": "Equals", "value": 0}]}}}}]}}).to_string()).await;
    wait_ready(&admin, "missing").await;
    let other: Api<Pod> = Api::namespaced(admin.clone(), "other");
    let err = eventually("denied", || async {
        other.create(&PostParams::default(), &pod("p", json!({}))).await.err().map(|e| e.to_string())
    })
    .await;
    assert!(err.contains("failed to fetch entry key=no-such-entry"), "{err}");
    replica.controller.stop().await;
}

/// `apiCall.service` context entries call the service in the cluster (before, the entry was
/// never loaded and an Enforce policy reading it denied everything it matched): headers sent,
/// the answer read, a failing service an error in Kyverno's words.
#[tokio::test]
async fn api_call_service_entries_call_the_service() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                let allowed = req.contains("x-token: secret");
                let body = json!({"allowed": allowed}).to_string();
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    let (_fake, admin, replica) = setup().await;
    let policy = |name: &str, token: &str, target: &str| {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
            "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "ask",
                "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaces": [name]}}]},
                "context": [{"name": "answer", "apiCall": {"method": "POST", "service": {"url": target,
                    "headers": [{"key": "X-Token", "value": token}]}, "data": [{"key": "pod", "value": "{{ request.object.metadata.name }}"}]}}],
                "validate": {"message": "refused by the service", "deny": {"conditions": {"any": [
                    {"key": "{{ answer.allowed }}", "operator": "NotEquals", "value": true}]}}}}]}}).to_string()
    };
    apply_policy(&admin, &policy("good", "secret", &url)).await;
    apply_policy(&admin, &policy("bad", "wrong", &url)).await;
    apply_policy(&admin, &policy("down", "secret", "http://127.0.0.1:1/nothing")).await;
    for p in ["good", "bad", "down"] {
        wait_ready(&admin, p).await;
    }
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let pods = |ns: &str| Api::<Pod>::namespaced(admin.clone(), ns);
    eventually("admitted", || async { pods("good").create(&PostParams::default(), &pod("p", json!({}))).await.ok() })
        .await;
    let err = pods("bad").create(&PostParams::default(), &pod("p", json!({}))).await.unwrap_err().to_string();
    assert!(err.contains("refused by the service"), "{err}");
    let err = pods("down").create(&PostParams::default(), &pod("p", json!({}))).await.unwrap_err().to_string();
    assert!(err.contains("failed to execute HTTP request for APICall"), "{err}");
    replica.controller.stop().await;
}

/// A ValidatingPolicy's `namespaceObject` comes from the namespace watch, as Kyverno
/// reads its namespace lister: admission makes no API call for it (before, every request GET
/// its Namespace), and a label change is seen by the next request.
#[tokio::test]
async fn namespace_objects_come_from_the_watch_not_an_api_call_per_request() {
    let (fake, admin, replica) = setup().await;
    create_namespace(&admin, "team-a", json!({"team": "a"})).await;
    let vpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "team-a-only"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "validations": [{"expression": "namespaceObject.metadata.labels.team == 'a'",
                "messageExpression": "'team is ' + namespaceObject.metadata.labels.team"}]}});
    let api: Api<DynamicObject> =
        Api::all_with(admin.clone(), &policies::resource(verno_engine::Kind::ValidatingPolicy));
    api.patch("team-a-only", &PatchParams::apply("kubectl").force(), &Patch::Apply(&vpol)).await.unwrap();
    eventually("the entry", || async {
        entry_rules(&vwc(&admin).await?, webhooks::VPOL_FAIL).filter(|r| r.to_string().contains("pods"))
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    // The first creations may race the policy reaching the server: retry until the set is in force.
    eventually("a pod admitted in team-a", || async {
        pods.create(&PostParams::default(), &pod("first", json!({}))).await.ok()
    })
    .await;
    let namespace_gets =
        || fake.requests().iter().filter(|r| r.method == "GET" && r.path == "/api/v1/namespaces/team-a").count();
    let before = namespace_gets();
    for i in 0..5 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), json!({}))).await.unwrap();
    }
    assert_eq!(namespace_gets(), before, "admission read the Namespace from the API server");
    // A label change reaches the policy through the watch.
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    ns_api
        .patch("team-a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})))
        .await
        .unwrap();
    let err = eventually("a pod refused after the label change", || async {
        pods.create(&PostParams::default(), &pod("late", json!({}))).await.err().map(|e| e.to_string())
    })
    .await;
    assert!(err.contains("Policy team-a-only failed: team is b"), "{err}");
    assert_eq!(namespace_gets(), before, "admission read the Namespace from the API server");
    replica.controller.stop().await;
}

/// A ConfigMap labelled `cache.kyverno.io/enabled` is read from a watch, as Kyverno's informer
/// reads it: admission makes no API call for it and sees its changes; an unlabelled one is
/// read from the API server for each request (Kyverno's client-based resolver).
#[tokio::test]
async fn labelled_config_maps_are_cached_and_others_are_read_each_time() {
    let (fake, admin, replica) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "shop");
    for (name, labels) in [("cached", json!({"cache.kyverno.io/enabled": "true"})), ("plain", json!({}))] {
        let cm = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"team": "a"}}))
            .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let policy = r#"{
      "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "teams"},
      "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{
        "name": "team-from-configmaps",
        "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
        "context": [{"name": "cached", "configMap": {"name": "cached", "namespace": "shop"}},
                    {"name": "plain", "configMap": {"name": "plain", "namespace": "shop"}}],
        "validate": {"message": "team must be {{ cached.data.team }} and {{ plain.data.team }}",
          "deny": {"conditions": {"any": [
            {"key": "{{ request.object.metadata.labels.team || '' }}", "operator": "NotEquals", "value": "{{ cached.data.team }}"},
            {"key": "{{ request.object.metadata.labels.team || '' }}", "operator": "NotEquals", "value": "{{ plain.data.team }}"}]}}}}]}}"#;
    apply_policy(&admin, policy).await;
    wait_ready(&admin, "teams").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let gets = |name: &str| {
        let path = format!("/api/v1/namespaces/shop/configmaps/{name}");
        fake.requests().iter().filter(|r| r.method == "GET" && r.path == path).count()
    };
    eventually("a pod admitted", || async {
        pods.create(&PostParams::default(), &pod("first", json!({"team": "a"}))).await.ok()
    })
    .await;
    let (cached, plain) = (gets("cached"), gets("plain"));
    for i in 0..3 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), json!({"team": "a"}))).await.unwrap();
    }
    assert_eq!(gets("cached"), cached, "the labelled ConfigMap was read from the API server");
    assert_eq!(gets("plain"), plain + 3, "the unlabelled ConfigMap is read for each request");
    // A change to the cached one reaches admission through the watch.
    cms.patch("cached", &PatchParams::default(), &Patch::Merge(json!({"data": {"team": "b"}}))).await.unwrap();
    let err = eventually("the change is seen", || async {
        pods.create(&PostParams::default(), &pod("late", json!({"team": "a"}))).await.err().map(|e| e.to_string())
    })
    .await;
    assert!(err.contains("team must be b and a"), "{err}");
    assert_eq!(gets("cached"), cached, "the labelled ConfigMap was read from the API server");
    replica.controller.stop().await;
}

// ---- A tenant's policy acts only in its own namespace ----

fn namespaced_policy_api(c: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.clone(), ns, &policies::policy_resource())
}

/// Requests anyone made for paths holding `part` (Verno is the only one who could have made
/// those of this test).
fn requests_for(fake: &FakeApiServer, since: usize, part: &str) -> Vec<String> {
    fake.requests()
        .into_iter()
        .skip(since)
        .filter(|r| r.path.contains(part))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test]
async fn a_tenants_policy_reads_creates_and_deletes_nothing_outside_its_namespace() {
    let (fake, admin, replica) = setup().await;
    create_namespace(&admin, "tenant-a", json!({})).await;
    let secret = serde_json::from_value(
        json!({"metadata": {"name": "db", "namespace": "kube-system"}, "data": {"password": "aHVudGVyMg=="}}),
    )
    .unwrap();
    secret_api(&admin, "kube-system").create(&PostParams::default(), &secret).await.unwrap();
    let keep: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "keep", "namespace": "kube-system"}, "data": {"a": "b"}}))
            .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system").create(&PostParams::default(), &keep).await.unwrap();
    let tenant_policies = namespaced_policy_api(&admin, "tenant-a");
    let since = fake.requests().len();

    // A DELETE is refused when the policy is created (the policy validation webhook).
    let delete = json!({"apiVersion": "kyverno.io/v1", "kind": "Policy", "metadata": {"name": "wipe", "namespace": "tenant-a"},
        "spec": {"background": true, "rules": [{"name": "wipe", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "context": [{"name": "gone", "apiCall": {"method": "DELETE", "urlPath": "/api/v1/namespaces/kube-system/configmaps/keep"}}],
            "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "a", "operator": "Equals", "value": "b"}]}}}}]}});
    let err = tenant_policies
        .patch("wipe", &PatchParams::apply("kubectl").force(), &Patch::Apply(&delete))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("apiCall.method"), "{err}");

    // Reads and a POST outside the namespace, from a background-scanned Policy whose generate
    // rule would copy what it read into the tenant's namespace.
    let steal = json!({"apiVersion": "kyverno.io/v1", "kind": "Policy", "metadata": {"name": "steal", "namespace": "tenant-a"},
        "spec": {"background": true, "validationFailureAction": "Audit", "rules": [
            {"name": "copy", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "names": ["trigger"]}}]},
             "context": [
                {"name": "s", "apiCall": {"urlPath": "/api/v1/namespaces/tenant-a/../kube-system/secrets/db"}},
                {"name": "c", "configMap": {"name": "keep", "namespace": "kube-system"}}],
             "generate": {"apiVersion": "v1", "kind": "ConfigMap", "name": "loot", "namespace": "tenant-a",
                "data": {"data": {"password": "{{ s.data.password }}", "a": "{{ c.data.a }}"}}}},
            {"name": "plant", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "names": ["trigger"]}}]},
             "context": [{"name": "p", "apiCall": {"method": "POST", "urlPath": "/api/v1/namespaces/kube-system/configmaps",
                "data": [{"key": "metadata", "value": {"name": "planted"}}]}}],
             "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "a", "operator": "Equals", "value": "b"}]}}}}]}});
    tenant_policies.patch("steal", &PatchParams::apply("kubectl").force(), &Patch::Apply(&steal)).await.unwrap();
    eventually("the Policy is ready", || async {
        tenant_policies.get("steal").await.ok().filter(|p| p.data["status"]["ready"] == true)
    })
    .await;
    let trigger: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "trigger", "namespace": "tenant-a"}})).unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "tenant-a").create(&PostParams::default(), &trigger).await.unwrap();
    // The generate rule errors: the failure is an event on the policy.
    eventually("the refusal is reported", || async {
        let events = events_api(&admin).list(&Default::default()).await.ok()?;
        // (Whichever refused read the rule's data names first: the apiCall path or the
        // ConfigMap's namespace.)
        let refused = |n: &str| {
            n.contains("refers to namespace kube-system")
                || n.contains(r#"configMap namespace "kube-system" is different from policy namespace "tenant-a""#)
        };
        events
            .items
            .into_iter()
            .find(|e| e.data["note"].as_str().is_some_and(refused) || e.data["message"].as_str().is_some_and(refused))
    })
    .await;
    // A scan or two later: nothing outside the namespace was asked for or written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(requests_for(&fake, since, "/namespaces/kube-system/secrets"), Vec::<String>::new());
    assert_eq!(requests_for(&fake, since, "/namespaces/kube-system/configmaps"), Vec::<String>::new());
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), "kube-system");
    assert!(cms.get_opt("planted").await.unwrap().is_none());
    assert!(cms.get_opt("keep").await.unwrap().is_some());
    let loot = Api::<ConfigMap>::namespaced(admin.clone(), "tenant-a").get_opt("loot").await.unwrap();
    assert!(loot.is_none(), "{loot:?}");
    replica.controller.stop().await;
}

/// A dry-run request's POSTs persist nothing: they are sent with `dryRun=All`.
#[tokio::test]
async fn a_dry_run_request_makes_no_api_call_that_persists() {
    let (fake, admin, replica) = setup().await;
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "post"},
        "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "post",
            "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "context": [{"name": "p", "apiCall": {"method": "POST", "urlPath": "/api/v1/namespaces/shop/configmaps",
                "data": [{"key": "metadata", "value": {"name": "{{ request.object.metadata.name }}-seen"}}]}}],
            "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "{{ p.metadata.name }}", "operator": "Equals", "value": "nothing"}]}}}}]}}).to_string()).await;
    wait_ready(&admin, "post").await;
    eventually("rules", || async { entry_rules(&vwc(&admin).await?, webhooks::VALIDATE_FAIL) }).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod("dry", json!({}))).await.unwrap();
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), "shop");
    assert!(cms.get_opt("dry-seen").await.unwrap().is_none(), "a dry run's POST persisted");
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path.ends_with("/namespaces/shop/configmaps") && r.query.contains("dryRun=All"))
    );
    pods.create(&PostParams::default(), &pod("real", json!({}))).await.unwrap();
    assert!(cms.get_opt("real-seen").await.unwrap().is_some());
    replica.controller.stop().await;
}

/// The background controller fed on its own writes — a generate rule whose
/// downstream matched its own trigger made thousands of ConfigMaps from one seed, and a
/// mutate-existing rule that patched its own trigger rewrote it thousands of times. Its own
/// writes trigger nothing now (as Kyverno's `skipBackgroundRequests`).
#[tokio::test]
async fn the_background_controller_does_not_feed_on_its_own_writes() {
    let (fake, admin, replica) = setup().await;
    create_namespace(&admin, "loop", json!({})).await;
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "fan"},
        "spec": {"rules": [
            {"name": "a", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "namespaces": ["loop"]}}]},
             "generate": {"apiVersion": "v1", "kind": "ConfigMap", "name": "{{ request.object.metadata.name }}-a", "namespace": "loop",
                "data": {"data": {"from": "{{ request.object.metadata.name }}"}}}},
            {"name": "b", "match": {"any": [{"resources": {"kinds": ["ConfigMap"], "namespaces": ["loop"]}}]},
             "generate": {"apiVersion": "v1", "kind": "ConfigMap", "name": "{{ request.object.metadata.name }}-b", "namespace": "loop",
                "data": {"data": {"from": "{{ request.object.metadata.name }}"}}}}]}}).to_string()).await;
    apply_policy(&admin, &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "stamp"},
        "spec": {"rules": [{"name": "stamp", "match": {"any": [{"resources": {"kinds": ["Secret"], "namespaces": ["loop"]}}]},
            "mutate": {"targets": [{"apiVersion": "v1", "kind": "Secret", "name": "{{ request.object.metadata.name }}", "namespace": "loop"}],
                "patchStrategicMerge": {"metadata": {"annotations": {"stamped": "{{ time_now_utc() }}"}}}}}]}}).to_string()).await;
    wait_ready(&admin, "fan").await;
    wait_ready(&admin, "stamp").await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "loop");
    let seed: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "seed", "namespace": "loop"}})).unwrap();
    cms.create(&PostParams::default(), &seed).await.unwrap();
    let secret = serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "loop"}})).unwrap();
    secret_api(&admin, "loop").create(&PostParams::default(), &secret).await.unwrap();
    eventually("the seed's two ConfigMaps", || async {
        let names: Vec<String> =
            cms.list(&Default::default()).await.ok()?.items.into_iter().filter_map(|c| c.metadata.name).collect();
        (names.len() >= 3).then_some(())
    })
    .await;
    eventually("the Secret stamped", || async {
        secret_api(&admin, "loop").get("s").await.ok()?.metadata.annotations?.get("stamped").map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut names: Vec<String> =
        cms.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect();
    names.sort();
    // `kube-root-ca.crt` may be there too, with its own two.
    names.retain(|n| n.starts_with("seed"));
    assert!(names == ["seed", "seed-a", "seed-b"], "{} ConfigMaps from one seed", names.len());
    let patches = fake
        .writes()
        .into_iter()
        .filter(|w| w.method == "PATCH" && w.path.ends_with("/namespaces/loop/secrets/s"))
        .count();
    assert_eq!(patches, 1, "the Secret was patched again and again");
    replica.controller.stop().await;
}

// ---- ValidatingAdmissionPolicies generated from policies ----

const NO_HOST_PATH_VAP: &str = r#"{"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "no-host-path"},
  "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{"name": "host-path",
    "match": {"any": [{"resources": {"kinds": ["Pod"], "operations": ["CREATE"]}}]},
    "validate": {"cel": {"generate": true, "expressions": [{"expression": "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))", "message": "HostPath volumes are forbidden."}]}}}]}}"#;

fn admission_api(c: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = kube::discovery::ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(c.clone(), &ar)
}

fn host_path_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}], "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}}))
    .unwrap()
}

/// Kyverno's `generateValidatingAdmissionPolicy` (on by default): a ClusterPolicy whose single
/// rule is `validate.cel` with `generate: true` becomes a ValidatingAdmissionPolicy and binding
/// owned by it, its status says `generated`, and Verno stops evaluating it (the API server
/// enforces the admission policy; the fake runs none, so the Pod goes through). Turned off, the
/// objects go, the status says why, and Verno refuses the Pod again.
#[tokio::test]
async fn a_cel_rule_marked_generate_becomes_a_validating_admission_policy() {
    let (_fake, admin, replica) = setup().await;
    apply_policy(&admin, NO_HOST_PATH_VAP).await;
    let vaps = admission_api(&admin, "ValidatingAdmissionPolicy", "validatingadmissionpolicies");
    let bindings = admission_api(&admin, "ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings");
    let vap = eventually("the admission policy", || async { vaps.get_opt("cpol-no-host-path").await.ok()? }).await;
    let vap = serde_json::to_value(vap).unwrap();
    assert_eq!(vap["metadata"]["labels"]["app.kubernetes.io/managed-by"], "kyverno");
    assert_eq!(vap["metadata"]["ownerReferences"][0]["name"], "no-host-path");
    assert_eq!(vap["spec"]["validations"][0]["message"], "HostPath volumes are forbidden.");
    assert_eq!(
        vap["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        json!(["pods", "pods/ephemeralcontainers"])
    );
    let binding =
        eventually("the binding", || async { bindings.get_opt("cpol-no-host-path-binding").await.ok()? }).await;
    assert_eq!(binding.data["spec"], json!({"policyName": "cpol-no-host-path", "validationActions": ["Deny"]}));
    eventually("generated in the status", || async {
        let p = policy_api(&admin).get("no-host-path").await.ok()?;
        (p.data["status"]["validatingadmissionpolicy"] == json!({"generated": true, "message": ""})).then_some(())
    })
    .await;
    // Verno leaves it to the API server: no rules for it, and the Pod is not refused by Verno.
    eventually("its webhook rules removed", || async {
        vwc(&admin).await.filter(|v| entry_rules(v, webhooks::VALIDATE_FAIL).is_none())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    pods.create(&PostParams::default(), &host_path_pod("one")).await.unwrap();

    // Not generated any more: the objects go, the status says why, Verno enforces again.
    apply_policy(&admin, &NO_HOST_PATH_VAP.replace(r#""generate": true"#, r#""generate": false"#)).await;
    eventually("the admission policy removed", || async {
        (vaps.get_opt("cpol-no-host-path").await.ok()?.is_none()
            && bindings.get_opt("cpol-no-host-path-binding").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    let p = eventually("not generated in the status", || async {
        let p = policy_api(&admin).get("no-host-path").await.ok()?;
        (p.data["status"]["validatingadmissionpolicy"]["generated"] == false).then_some(p)
    })
    .await;
    assert_eq!(
        p.data["status"]["validatingadmissionpolicy"]["message"],
        "skip generating ValidatingAdmissionPolicy: validate.cel.generate is not set to true."
    );
    let attempt = std::sync::atomic::AtomicUsize::new(0);
    let err = eventually("Verno refuses the Pod again", || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pods.create(&PostParams::default(), &host_path_pod(&format!("two-{n}"))).await.err()
    })
    .await;
    assert!(err.to_string().contains("HostPath volumes are forbidden."), "{err}");
    replica.controller.stop().await;
}

/// CEL's `http.Get` in a cluster: the call is made (before, `http.*` said it was not available
/// here, so a ValidatingPolicy using it refused every request it matched), its answer carries
/// `statusCode`, and Kyverno's default blocklist keeps policies off loopback; an operator who
/// clears it (`--http-blocklist ""`) lets them reach a service there.
#[tokio::test]
async fn cel_http_calls_go_out_where_the_blocklist_allows() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/allowed", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                let _ = conn.read(&mut buf).await;
                let body = json!({"images": ["nginx:1.27"]}).to_string();
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    let vpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "allowed-images"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "variables": [{"name": "answer", "expression": format!("http.Get('{url}')")}],
            "validations": [{"expression": "variables.answer.statusCode == 200 && object.spec.containers.all(c, c.image in variables.answer.images)",
                "message": "image not on the service's list"}]}});
    for open in [true, false] {
        let (_fake, admin, replica) = setup_with(|o| {
            if open {
                o.http_rules = Arc::new(verno_controller::cel_http::HttpRules::new(&[], &[]).unwrap());
            }
        })
        .await;
        let api: Api<DynamicObject> =
            Api::all_with(admin.clone(), &policies::resource(verno_engine::Kind::ValidatingPolicy));
        api.patch("allowed-images", &PatchParams::apply("kubectl").force(), &Patch::Apply(&vpol)).await.unwrap();
        eventually("the entry", || async {
            entry_rules(&vwc(&admin).await?, webhooks::VPOL_FAIL).filter(|r| r.to_string().contains("pods"))
        })
        .await;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
        let bad = |name: &str| {
            let mut p = pod(name, json!({}));
            p.spec.as_mut().unwrap().containers[0].image = Some("busybox:1.36".into());
            p
        };
        let err = eventually("a pod refused", || async {
            pods.create(&PostParams::default(), &bad("other")).await.err().map(|e| e.to_string())
        })
        .await;
        if open {
            assert!(err.contains("image not on the service's list"), "{err}");
            pods.create(&PostParams::default(), &pod("listed", json!({}))).await.unwrap();
        } else {
            assert!(err.contains("falls in blocked range 127.0.0.0/8"), "{err}");
            let listed = pods.create(&PostParams::default(), &pod("listed", json!({}))).await.unwrap_err();
            assert!(listed.to_string().contains("falls in blocked range"), "{listed}");
        }
        replica.controller.stop().await;
    }
}

/// The installed ConfigMap carries Kyverno's chart defaults (before, it held only
/// `generateSuccessEvents`, so once Verno read it every filter was gone and the ReplicaSet of
/// a rollout was judged by a Deployment rule — refused where Kyverno admits it unreviewed);
/// `excludeClusterRoles` names a cluster role the requesting user is bound to (before, roles
/// were never worked out for the filters, so the key excluded nobody).
#[tokio::test]
async fn the_installed_config_map_filters_replica_sets_and_excluded_roles_skip_review() {
    let (_fake, admin, replica) = setup_with(|o| o.config_map = Some("verno-config".into())).await;
    let policy = r#"{
      "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "need-ok"},
      "spec": {"validationFailureAction": "Enforce", "background": false, "rules": [{
        "name": "ok-label",
        "match": {"any": [{"resources": {"kinds": ["Deployment", "ReplicaSet"]}}]},
        "validate": {"message": "label ok is required", "pattern": {"metadata": {"labels": {"ok": "?*"}}}}}]}}"#;
    apply_policy(&admin, policy).await;
    let apps = |c: &kube::Client, plural: &str, kind: &str| {
        let ar = kube::core::ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Api::<DynamicObject>::namespaced_with(c.clone(), "default", &ar)
    };
    let object = |kind: &str, name: &str| {
        serde_json::from_value::<DynamicObject>(
            json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}),
        )
        .unwrap()
    };
    let deployments = apps(&admin, "deployments", "Deployment");
    // Until the policy is in force a deployment may get through: a new name each time.
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let err = eventually("a deployment refused", || async {
        let name = format!("web-{}", tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        deployments.create(&PostParams::default(), &object("Deployment", &name)).await.err().map(|e| e.to_string())
    })
    .await;
    assert!(err.contains("label ok is required"), "{err}");
    // A ReplicaSet (what a rollout creates) is not reviewed, as in Kyverno with its chart.
    apps(&admin, "replicasets", "ReplicaSet")
        .create(&PostParams::default(), &object("ReplicaSet", "web-1"))
        .await
        .unwrap();

    // A user bound to an excluded cluster role is not reviewed.
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    let binding = serde_json::from_value(json!({"metadata": {"name": "ci-bot"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ci-deployer"},
        "subjects": [{"kind": "User", "name": "ci-bot", "apiGroup": "rbac.authorization.k8s.io"}]}))
    .unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    cms.patch(
        "verno-config",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"excludeClusterRoles": "ci-deployer"}})),
    )
    .await
    .unwrap();
    let bot = client(&_fake, Some("ci-bot")).await;
    let bot_deployments = apps(&bot, "deployments", "Deployment");
    eventually("the bot's deployment admitted", || async {
        bot_deployments.create(&PostParams::default(), &object("Deployment", "bot-web")).await.ok()
    })
    .await;
    // Everyone else is still reviewed.
    let err = deployments.create(&PostParams::default(), &object("Deployment", "web-last")).await.unwrap_err();
    assert!(err.to_string().contains("label ok is required"), "{err}");
    replica.controller.stop().await;
}
