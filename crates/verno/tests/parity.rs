//! One engine front door: the same Pods through `verno apply`, `verno serve --policies` and the
//! in-cluster path (the server and controller on the fake API server, admission emulated)
//! get the same verdicts and messages, for a ClusterPolicy and a ValidatingPolicy
//! (`testdata/parity`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use fake_apiserver::{FakeApiServer, default_resources, eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn parity() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/parity")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    verno_jmespath::yaml::parse_all(&text).unwrap().into_iter().filter(|d| !d.is_null()).collect()
}

fn pods() -> Vec<Value> {
    docs(&parity().join("pods.yaml"))
}

fn policies() -> Vec<Value> {
    let dir = parity().join("policies");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    files.iter().flat_map(|f| docs(f)).collect()
}

/// The AdmissionReview the API server sends for creating `pod`.
fn review(pod: &Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]}, "object": pod}})
}

/// `verno apply` on the pods: policy → resource name → (result, message).
fn apply() -> Vec<(String, String, String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_verno"))
        .args(["apply", parity().join("policies").to_str().unwrap(), "-r"])
        .arg(parity().join("pods.yaml"))
        .args(["-o", "json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let resource = r["resource"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
            let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
            (s("policy"), resource, s("result"), s("message"))
        })
        .collect()
}

/// `verno serve --policies` as a process; killed on drop.
struct Serve {
    child: Child,
    port: u16,
    client: reqwest::Client,
    _tmp: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    async fn start() -> Serve {
        let tmp = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_verno"))
            .args(["serve", "--policies", parity().join("policies").to_str().unwrap()])
            .args(["--addr", &format!("127.0.0.1:{port}"), "--metrics-addr", "off"])
            .args(["--tls-dir", tmp.path().to_str().unwrap(), "--dns-name", "localhost"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let ca = tmp.path().join("ca.crt");
        eventually("the server's CA", || async { ca.exists().then_some(()) }).await.unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder().use_preconfigured_tls(tls).build().unwrap();
        let serve = Serve { child, port, client, _tmp: tmp };
        eventually("readiness", || async {
            let r = serve.client.get(serve.url("/health/readiness")).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await
        .unwrap();
        serve
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    /// The answer's (allowed, message).
    async fn review(&self, path: &str, review: &Value) -> (bool, String) {
        let r = self.client.post(self.url(path)).header("Content-Type", "application/json").body(review.to_string());
        let v: Value = serde_json::from_str(&r.send().await.unwrap().text().await.unwrap()).unwrap();
        let response = &v["response"];
        (response["allowed"] == true, response["status"]["message"].as_str().unwrap_or("").to_string())
    }
}

const NS: &str = "verno";

/// The in-cluster path: the install applied, one replica serving, the policies applied.
async fn cluster() -> (FakeApiServer, kube::Client, verno_controller::Controller) {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = fake.client(None).unwrap();
    let values = verno_controller::manifests::Values::default();
    for doc in verno_controller::crds::all().into_iter().chain(verno_controller::manifests::render(&values)) {
        fake.apply(&admin, &doc).await.unwrap();
    }
    let cfg = verno_server::Config {
        // The certificate is replaced by start_server.
        body_limit: 3 << 20,
        deadline: Duration::from_secs(5),
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut opts = verno_controller::Options::new(NS, "verno-0");
    opts.service = verno_controller::manifests::SERVICE.into();
    opts.debounce = Duration::from_millis(100);
    opts.probe_interval = None;
    opts.acting = verno_controller::Acting::default_accounts(&fake.config(None).unwrap(), NS).unwrap();
    let sa = format!("system:serviceaccount:{NS}:{}", verno_controller::manifests::SERVICE_ACCOUNT);
    let (server, controller) =
        verno_cli::in_cluster::start_replica(fake.client(Some(&sa)).unwrap(), cfg, opts).await.unwrap();
    fake.set_service(NS, verno_controller::manifests::SERVICE, Some(server.addr));
    for p in policies() {
        fake.apply(&admin, &p).await.unwrap();
    }
    (fake, admin, controller)
}

/// The in-cluster answer to creating `pod`: (allowed, message without the API server's prefix).
async fn create(admin: &kube::Client, pod: &Value) -> (bool, String) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    let p: Pod = serde_json::from_value(pod.clone()).unwrap();
    match pods.create(&PostParams::default(), &p).await {
        Ok(_) => (true, String::new()),
        Err(kube::Error::Api(status)) => {
            let m = status.message;
            let at = m.find(" denied the request: ").map_or(0, |i| i + " denied the request: ".len());
            (false, m[at..].to_string())
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusterpolicy_and_a_validatingpolicy_answer_alike_in_apply_serve_and_the_cluster() {
    let team_msg = "validation error: label 'team' is required. rule check-team failed at path /metadata/labels/team/";
    let owner_msg = "label 'owner' is required";
    // verno apply: each Pod breaks exactly one policy, with the rule's message.
    let applied = apply();
    let row = |policy: &str, pod: &str| {
        applied.iter().find(|r| r.0 == policy && r.1 == pod).map(|r| (r.2.clone(), r.3.clone())).unwrap()
    };
    assert_eq!(row("require-team", "owned-only"), ("fail".into(), team_msg.into()), "{applied:?}");
    assert_eq!(row("require-owner", "team-only"), ("fail".into(), owner_msg.into()), "{applied:?}");
    assert_eq!(row("require-team", "team-only").0, "pass");
    assert_eq!(row("require-owner", "owned-only").0, "pass");

    // verno serve --policies: the ClusterPolicy on /validate, the ValidatingPolicy on /vpol.
    let pods = pods();
    let (owned_only, team_only) = (&pods[0], &pods[1]);
    let serve = Serve::start().await;
    let cpol_denial = format!(
        "\n\nresource Pod/shop/owned-only was blocked due to the following policies \n\nrequire-team:\n  check-team: '{}'\n",
        team_msg.replace('\'', "''")
    );
    let vpol_denial = format!("Policy require-owner failed: {owner_msg}");
    assert_eq!(serve.review("/validate", &review(owned_only)).await, (false, cpol_denial.clone()));
    assert_eq!(serve.review("/vpol", &review(owned_only)).await, (true, String::new()));
    assert_eq!(serve.review("/validate", &review(team_only)).await, (true, String::new()));
    assert_eq!(serve.review("/vpol", &review(team_only)).await, (false, vpol_denial.clone()));
    drop(serve);

    // In the cluster: the same denials, from the entries the policies were routed to.
    let (_fake, admin, controller) = cluster().await;
    let ready = |kind: &'static str, name: &'static str, pointer: &'static str| {
        let admin = admin.clone();
        async move {
            let ar = verno_controller::policies::resource(verno_engine::Kind::of(
                if kind == "ClusterPolicy" { "kyverno.io/v1" } else { "policies.kyverno.io/v1" },
                kind,
            )?);
            let api: Api<kube::api::DynamicObject> = Api::all_with(admin, &ar);
            let o = api.get(name).await.ok()?;
            (o.data.pointer(pointer) == Some(&Value::Bool(true))).then_some(o)
        }
    };
    let cpol =
        eventually("ClusterPolicy ready", || ready("ClusterPolicy", "require-team", "/status/ready")).await.unwrap();
    assert_eq!(cpol.data["status"]["conditions"][0]["type"], "Ready");
    let vpol = eventually("ValidatingPolicy ready", || {
        ready("ValidatingPolicy", "require-owner", "/status/conditionStatus/ready")
    })
    .await
    .unwrap();
    assert_eq!(vpol.data["status"]["conditionStatus"]["conditions"][0]["type"], "WebhookConfigured");
    // The leader writes rules after the status; wait until both entries route Pods.
    eventually("rules for both entries", || async {
        let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
            Api::all(admin.clone());
        let cfg = serde_json::to_value(api.get(verno_controller::webhooks::VALIDATING_CONFIG).await.ok()?).ok()?;
        let has = |entry: &str| {
            cfg["webhooks"].as_array().into_iter().flatten().any(|w| w["name"] == entry && w["rules"].is_array())
        };
        (has(verno_controller::webhooks::VALIDATE_FAIL) && has(verno_controller::webhooks::VPOL_FAIL)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(create(&admin, owned_only).await, (false, cpol_denial));
    assert_eq!(create(&admin, team_only).await, (false, vpol_denial));
    let fine = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "both", "namespace": "shop", "labels": {"team": "web", "owner": "alice"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}});
    assert_eq!(create(&admin, &fine).await, (true, String::new()));
    controller.stop().await;
}
