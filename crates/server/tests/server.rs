//! The real server over TLS with a real HTTP client: deny with Kyverno's message, allow,
//! mutate patch, bad requests, reload, metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use verno_engine::PolicySet;
use verno_server::{Config, Loader, Running, TlsSource};

const REQUIRE_TEAM: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: require-team
spec:
  validationFailureAction: Enforce
  rules:
  - name: check-team
    match:
      any:
      - resources:
          kinds: [Pod]
    validate:
      message: "label 'team' is required"
      pattern:
        metadata:
          labels:
            team: "?*"
"#;

const ADD_TIER: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: add-tier
spec:
  rules:
  - name: default-tier
    match:
      any:
      - resources:
          kinds: [Pod]
    mutate:
      patchStrategicMerge:
        metadata:
          labels:
            +(tier): standard
"#;

/// Compiles every `.yaml` in `dir` (our own tiny loader; the CLI has the full one).
fn loader(dir: PathBuf) -> Loader {
    Arc::new(move || {
        let mut policies = Vec::new();
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&dir).map_err(|e| e.to_string())?.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| e.to_string())?;
            let doc = verno_jmespath::yaml::parse(&text).map_err(|e| format!("{}: {e}", f.display()))?;
            match verno_engine::compile(&doc, &[]).map_err(|e| format!("{}: {e}", f.display()))? {
                verno_engine::Compiled::Policy(p) => policies.push(Arc::new(p)),
                verno_engine::Compiled::Exception(_) => {}
            }
        }
        Ok(PolicySet::new(policies, Vec::new()))
    })
}

struct Harness {
    running: Option<Running>,
    client: reqwest::Client,
    _tmp: tempfile::TempDir,
    policies: PathBuf,
}

impl Harness {
    async fn start(policies: &[(&str, &str)]) -> Result<Harness, String> {
        Harness::start_with(policies, |_| {}).await
    }

    async fn start_with(policies: &[(&str, &str)], tweak: impl FnOnce(&mut Config)) -> Result<Harness, String> {
        let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
        let pdir = tmp.path().join("policies");
        std::fs::create_dir_all(&pdir).map_err(|e| e.to_string())?;
        for (name, text) in policies {
            std::fs::write(pdir.join(name), text).map_err(|e| e.to_string())?;
        }
        let cfg = Config {
            addr: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
            metrics_addr: Some("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?),
            tls: TlsSource::Dir {
                dir: tmp.path().join("tls"),
                dns_names: vec!["localhost".into(), "127.0.0.1".into()],
            },
            body_limit: 64 * 1024,
            deadline: Duration::from_secs(5),
            watch: vec![pdir.clone()],
            poll_interval: Duration::from_millis(100),
            ..Config::default()
        };
        let mut cfg = cfg;
        tweak(&mut cfg);
        let running = verno_server::start(cfg, loader(pdir.clone())).await.map_err(|e| e.to_string())?;
        let ca = running.ca_path.clone().ok_or("no CA")?;
        let client = client(&ca)?;
        Ok(Harness { running: Some(running), client, _tmp: tmp, policies: pdir })
    }

    fn url(&self, path: &str) -> String {
        let port = self.running.as_ref().map(|r| r.addr.port()).unwrap_or(0);
        format!("https://localhost:{port}{path}")
    }

    async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        let (code, text) = self.post_text(path, body.to_string()).await?;
        Ok((code, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Posts `body` as it is (JSON or not) with a JSON Content-Type; the answer as text.
    async fn post_text(&self, path: &str, body: String) -> Result<(u16, String), String> {
        let r = self
            .client
            .post(self.url(path))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let code = r.status().as_u16();
        Ok((code, r.text().await.map_err(|e| e.to_string())?))
    }
}

fn client(ca: &Path) -> Result<reqwest::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder().use_preconfigured_tls(tls).build().map_err(|e| e.to_string())
}

fn review(labels: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0d7b7e3c-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "shop", "name": "web", "userInfo": {"username": "alice"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": labels},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}})
}

/// A CREATE of `object` (a Pod in `default`).
fn review_of(object: &Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0d7b7e3c-2", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "default", "name": object["metadata"]["name"], "userInfo": {"username": "alice"}, "object": object}})
}

/// Issue 49, no false denials: the requests Kyverno's ConfigMap leaves alone are admitted
/// unevaluated — by default (Kyverno's chart) ReplicaSets, whose Deployments are judged (a
/// rollout of a Deployment that predates a policy must not hang on its ReplicaSets), anything
/// in kube-system, and requests by nodes; with a ConfigMap, exactly what it says.
#[tokio::test]
async fn requests_kyvernos_config_map_filters_are_admitted_unevaluated() -> Result<(), String> {
    const DENY_ALL: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: deny-all
spec:
  validationFailureAction: Enforce
  rules:
  - name: never
    match:
      any:
      - resources:
          kinds: [ReplicaSet, Pod, ConfigMap]
    validate:
      message: never
      deny: {}
"#;
    let h = Harness::start(&[("deny-all.yaml", DENY_ALL)]).await?;
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-7d9f", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let review = |kind: Value, object: &Value, ns: &str, user: Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-f", "kind": kind, "operation": "CREATE", "namespace": ns, "name": object["metadata"]["name"],
            "userInfo": user, "object": object}})
    };
    let alice = json!({"username": "alice"});
    let rs_kind = json!({"group": "apps", "version": "v1", "kind": "ReplicaSet"});
    let (_, a) = h.post("/validate/fail", &review(rs_kind.clone(), &rs, "shop", alice.clone())).await?;
    assert_eq!(a["response"], json!({"uid": "u-f", "allowed": true}));
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let pod_kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    let (_, a) = h.post("/validate/fail", &review(pod_kind.clone(), &pod, "shop", alice.clone())).await?;
    assert_eq!(a["response"]["allowed"], false, "{a}");
    // The kubelet's mirror Pod.
    let node = json!({"username": "system:node:n1", "groups": ["system:nodes", "system:authenticated"]});
    let (_, a) = h.post("/validate/fail", &review(pod_kind.clone(), &pod, "shop", node)).await?;
    assert_eq!(a["response"]["allowed"], true, "{a}");
    // A ConfigMap of Kyverno's replaces the defaults: ReplicaSets are judged, ConfigMaps named
    // `cache-*` are not.
    let running = h.running.as_ref().ok_or("not running")?;
    let data: std::collections::BTreeMap<String, String> =
        [("resourceFilters".to_string(), "[ConfigMap,*,cache-*]".to_string())].into();
    running.set_request_filters(verno_engine::filters::RequestFilters::from_config_map(&data));
    let (_, a) = h.post("/validate/fail", &review(rs_kind, &rs, "shop", alice.clone())).await?;
    assert_eq!(a["response"]["allowed"], false, "{a}");
    let cm =
        |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "shop"}});
    let cm_kind = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let (_, a) = h.post("/validate/fail", &review(cm_kind.clone(), &cm("cache-1"), "shop", alice.clone())).await?;
    assert_eq!(a["response"]["allowed"], true, "{a}");
    let (_, a) = h.post("/validate/fail", &review(cm_kind, &cm("other"), "shop", alice)).await?;
    assert_eq!(a["response"]["allowed"], false, "{a}");
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[tokio::test]
async fn the_webhook_denies_allows_and_patches_over_tls() -> Result<(), String> {
    let h = Harness::start(&[("require-team.yaml", REQUIRE_TEAM), ("add-tier.yaml", ADD_TIER)]).await?;

    let (code, denied) = h.post("/validate", &review(json!({"app": "web"}))).await?;
    assert_eq!(code, 200);
    assert_eq!(denied["response"]["uid"], "0d7b7e3c-1");
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(denied["response"]["status"]["status"], "Failure");
    assert_eq!(
        denied["response"]["status"]["message"],
        "\n\nresource Pod/shop/web was blocked due to the following policies \n\nrequire-team:\n  check-team: 'validation error: label ''team'' is required. rule check-team failed at path /metadata/labels/team/'\n"
    );

    let (_, allowed) = h.post("/validate", &review(json!({"team": "payments"}))).await?;
    assert_eq!(allowed["response"], json!({"uid": "0d7b7e3c-1", "allowed": true}));

    let (_, mutated) = h.post("/mutate", &review(json!({"team": "payments"}))).await?;
    assert_eq!(mutated["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(mutated["response"]["patch"].as_str().unwrap_or(""))
        .map_err(|e| e.to_string())?;
    let ops: Value = serde_json::from_slice(&patch).map_err(|e| e.to_string())?;
    assert_eq!(ops, json!([{"op": "add", "path": "/metadata/labels/tier", "value": "standard"}]));

    // Nothing to change: no patch fields at all.
    let (_, same) = h.post("/mutate", &review(json!({"team": "payments", "tier": "gold"}))).await?;
    assert_eq!(same["response"], json!({"uid": "0d7b7e3c-1", "allowed": true}));

    // The metrics saw the requests.
    let maddr = h.running.as_ref().and_then(|r| r.metrics_addr).ok_or("no metrics")?;
    let metrics = h
        .client
        .get(format!("http://{maddr}/metrics"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    assert!(metrics.contains(r#"kyverno_admission_requests_total{resource_kind="Pod",resource_namespace="shop",resource_request_operation="create",request_allowed="false",request_webhook="validate"} 1"#), "{metrics}");
    assert!(
        metrics.contains(r#"policy_name="require-team""#) && metrics.contains(r#"rule_result="fail""#),
        "{metrics}"
    );
    // A cluster policy's namespace is "-" in every metric, as Kyverno labels it.
    assert!(metrics.contains(r#"policy_type="cluster",policy_background_mode="true",policy_namespace="-",policy_name="require-team",resource_kind="Pod""#), "{metrics}");
    assert!(metrics.contains("kyverno_admission_review_duration_seconds_bucket"), "{metrics}");
    assert!(metrics.contains("kyverno_policy_execution_duration_seconds_count"), "{metrics}");
    // One info series per rule in force, and the policies created at start.
    assert!(metrics.contains(r#"kyverno_policy_rule_info_total{policy_validation_mode="enforce",policy_type="cluster",policy_background_mode="true",policy_namespace="-",policy_name="require-team",rule_name="check-team",rule_type="validate",status_ready="true"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"kyverno_policy_changes_total{policy_validation_mode="audit",policy_type="cluster",policy_background_mode="true",policy_namespace="-",policy_name="add-tier",policy_change_type="created"} 1"#), "{metrics}");

    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

const AUDIT_OWNER: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: audit-owner
spec:
  validationFailureAction: Audit
  rules:
  - name: check-owner
    match:
      any:
      - resources:
          kinds: [Pod]
    validate:
      message: "label 'owner' is recommended"
      pattern:
        metadata:
          labels:
            owner: "?*"
"#;

#[tokio::test]
async fn failed_rules_are_handed_over_for_policy_violation_events() -> Result<(), String> {
    let h = Harness::start(&[("require-team.yaml", REQUIRE_TEAM), ("audit-owner.yaml", AUDIT_OWNER)]).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    h.running.as_ref().ok_or("not running")?.report_events(tx);

    // Blocked by the Enforce rule; the Audit rule fails too but blocks nothing.
    let (_, denied) = h.post("/validate", &review(json!({"app": "web"}))).await?;
    assert_eq!(denied["response"]["allowed"], false);
    let mut got = Vec::new();
    while let Ok(n) = rx.try_recv() {
        match n {
            verno_engine::Notice::Violation(v) => got.push(v),
            other => return Err(format!("only violations expected, got {other:?}")),
        }
    }
    got.sort_by(|a, b| a.policy_name.cmp(&b.policy_name));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0].policy_note(),
        "Pod shop/web: [check-owner] fail; validation error: label 'owner' is recommended. rule check-owner failed at path /metadata/labels/owner/"
    );
    assert_eq!(
        got[0].resource_note(),
        "policy audit-owner/check-owner fail: validation error: label 'owner' is recommended. rule check-owner failed at path /metadata/labels/owner/"
    );
    assert!(!got[0].blocked);
    assert_eq!(
        got[1].policy_note(),
        "Pod shop/web: [check-team] fail (blocked); validation error: label 'team' is required. rule check-team failed at path /metadata/labels/team/"
    );
    assert!(got[1].blocked);
    assert_eq!((got[1].resource.api_version.as_str(), got[1].resource.kind.as_str()), ("v1", "Pod"));

    // A dry run leaves nothing.
    let mut dry = review(json!({"app": "web"}));
    dry["request"]["dryRun"] = json!(true);
    h.post("/validate", &dry).await?;
    assert!(rx.try_recv().is_err());
    // A passing request leaves what success events need: each policy applied, no exception.
    h.post("/validate", &review(json!({"team": "a", "owner": "b"}))).await?;
    let mut applied = Vec::new();
    while let Ok(n) = rx.try_recv() {
        match n {
            verno_engine::Notice::Applied(a) => applied.push(a),
            other => return Err(format!("only applied policies expected, got {other:?}")),
        }
    }
    applied.sort_by(|a, b| a.policy_name.cmp(&b.policy_name));
    assert_eq!(applied.len(), 2, "{applied:?}");
    assert_eq!(applied[0].applied_note(), "Pod shop/web: pass");
    assert_eq!(applied[0].action(), "Resource Passed");
    assert!(applied.iter().all(|a| a.exempted.is_empty()));

    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_clear_http_errors() -> Result<(), String> {
    let h = Harness::start(&[("require-team.yaml", REQUIRE_TEAM)]).await?;
    let r = h
        .client
        .post(h.url("/validate"))
        .header("Content-Type", "text/plain")
        .body("{}")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(r.status().as_u16(), 415);
    let (code, text) = h.post_text("/validate", r#"{"request": {"uid": "#.to_string()).await?;
    assert_eq!(code, 400);
    assert!(text.starts_with("invalid AdmissionReview JSON: EOF while parsing"), "{text}");
    let (code, body) =
        h.post("/validate", &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})).await?;
    assert_eq!((code, body), (400, Value::String("invalid AdmissionReview: request is missing".into())));
    let big = "x".repeat(100 * 1024);
    // The webhooks read their bodies themselves, the other routes through a middleware: the
    // same limit and answer for both.
    for path in ["/validate", "/vpol/some-policy", "/mutate/ignore", "/policyvalidate", "/verifymutate"] {
        let (code, text) = h.post_text(path, big.clone()).await?;
        assert_eq!(code, 413, "{path}");
        assert!(text.starts_with("the request body is over "), "{path}: {text}");
    }
    let live = h.client.get(h.url("/health/liveness")).send().await.map_err(|e| e.to_string())?;
    assert_eq!(live.status().as_u16(), 200);
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[tokio::test]
async fn policy_changes_are_picked_up_and_a_broken_file_keeps_the_old_set() -> Result<(), String> {
    let h = Harness::start(&[]).await?;
    // No policies: everything is allowed.
    let (_, r) = h.post("/validate", &review(json!({}))).await?;
    assert_eq!(r["response"]["allowed"], true);

    std::fs::write(h.policies.join("require-team.yaml"), REQUIRE_TEAM).map_err(|e| e.to_string())?;
    let mut denied = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, r) = h.post("/validate", &review(json!({}))).await?;
        if r["response"]["allowed"] == false {
            denied = true;
            break;
        }
    }
    assert!(denied, "the new policy was not loaded");

    // A broken file: reported, and the previous set stays in force.
    std::fs::write(
        h.policies.join("zz-broken.yaml"),
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata:\n  name: broken\nspec:\n  validationFailureAction: Sometimes\n  rules: []\n",
    )
    .map_err(|e| e.to_string())?;
    let err = h.running.as_ref().map(|r| r.reload()).unwrap_or(Ok(()));
    assert!(
        err.map_err(|e| e.to_string())
            .is_err_and(|e| e.contains("zz-broken.yaml") && e.contains("spec.validationFailureAction"))
    );
    let (_, r) = h.post("/validate", &review(json!({}))).await?;
    assert_eq!(r["response"]["allowed"], false);
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections() -> Result<(), String> {
    let h = Harness::start(&[("require-team.yaml", REQUIRE_TEAM)]).await?;
    let (code, _) = h.post("/validate", &review(json!({"team": "a"}))).await?;
    assert_eq!(code, 200);
    // A second CA and serving pair, copied over the files being served.
    let other = tempfile::tempdir().map_err(|e| e.to_string())?;
    let new_ca = verno_server::tls::ensure_dir(other.path(), &["localhost".to_string()]).map_err(|e| e.to_string())?;
    let served = h._tmp.path().join("tls");
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(other.path().join(f), served.join(f)).map_err(|e| e.to_string())?;
    }
    let port = h.running.as_ref().map(|r| r.addr.port()).unwrap_or(0);
    let mut switched = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A fresh client trusting only the new CA: it succeeds once the new pair is served.
        let fresh = client(&new_ca)?;
        if fresh.get(format!("https://localhost:{port}/health/readiness")).send().await.is_ok() {
            switched = true;
            break;
        }
    }
    assert!(switched, "the new certificate was not served");
    // New connections trusting only the old CA now fail.
    let old_ca = h._tmp.path().join("tls/ca.crt");
    let old = client(&old_ca)?;
    assert!(old.get(format!("https://localhost:{port}/health/readiness")).send().await.is_err());
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Issue 14, item 5: idle connections were never closed, so enough of them exhausted the
/// descriptors (and the health checks failed). A connection that never completes its TLS
/// handshake is now closed after the idle timeout.
#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let pdir = tmp.path().join("policies");
    std::fs::create_dir_all(&pdir).unwrap();
    let cfg = Config {
        tls: TlsSource::Dir { dir: tmp.path().join("tls"), dns_names: vec!["localhost".into()] },
        body_limit: 64 * 1024,
        deadline: Duration::from_secs(5),
        max_concurrency: 2,
        idle_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_secs(3600),
        ..Config::default()
    };
    let running = verno_server::start(cfg, loader(pdir)).await.unwrap();
    let addr = running.addr;
    let closed = tokio::task::spawn_blocking(move || {
        use std::io::Read as _;
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        // Far longer than the idle timeout: a server that keeps the connection fails here.
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => true,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            Ok(_) => false,
        }
    })
    .await
    .unwrap();
    assert!(closed, "the idle connection was kept");
    running.shutdown(Duration::from_secs(1)).await;
}

/// Every pair of containers: quadratic work, seconds for a Pod with thousands of containers.
const PAIRWISE: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: pairwise
spec:
  validationFailureAction: Enforce
  rules:
  - name: distinct
    match:
      any:
      - resources:
          kinds: [Pod]
    validate:
      foreach:
      - list: request.object.spec.containers
        foreach:
        - list: request.object.spec.containers
          deny:
            conditions:
              any:
              - key: "{{ element.name }}"
                operator: Equals
                value: never
"#;

/// A server with [`PAIRWISE`], one evaluation slot on the blocking pool (no request is evaluated
/// on the executor) and the given deadline.
async fn one_slot_pairwise(deadline: Duration) -> Result<Harness, String> {
    Harness::start_with(&[("pairwise.yaml", PAIRWISE)], |cfg| {
        cfg.deadline = deadline;
        cfg.max_concurrency = 1;
        cfg.inline_body_max = 0;
        cfg.body_limit = 4 << 20;
    })
    .await
}

/// Issue 21: a self-contained set is evaluated on the executor, without the hand-off to the
/// blocking pool. Work that turns out slow there is still cut at the deadline (a watchdog thread
/// cancels it), light requests are answered meanwhile, and the set's later requests go to the
/// pool, where the deadline and the slots hold as before.
#[tokio::test]
async fn slow_work_on_the_executor_is_cut_at_the_deadline_and_sends_the_set_to_the_pool() -> Result<(), String> {
    let h = Harness::start_with(&[("pairwise.yaml", PAIRWISE)], |cfg| {
        cfg.deadline = Duration::from_millis(700);
        cfg.max_concurrency = 1;
        cfg.inline_body_max = 4 << 20;
        cfg.body_limit = 4 << 20;
    })
    .await?;
    let light = review_of(&pod_in_default("light", 1));
    let heavy = review_of(&pod_in_default("heavy", 4000));
    // Before anything slow: evaluated on the executor, answered.
    let (code, body) = h.post("/validate/fail", &light).await?;
    assert_eq!((code, &body["response"]["allowed"]), (200, &json!(true)), "{body}");
    let started = std::time::Instant::now();
    let (first, during) = tokio::join!(h.post("/validate/fail", &heavy), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t = std::time::Instant::now();
        let r = h.post("/validate/fail", &light).await;
        (r, t.elapsed())
    });
    let (code, body) = first?;
    assert_eq!(code, 200);
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let msg = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("exceeded the 700 ms deadline"), "{msg}");
    // 16 million pairs take far longer than the deadline: the work was cut, not finished.
    assert!(started.elapsed() < Duration::from_secs(5), "the heavy request ran for {:?}", started.elapsed());
    // The light request was not stuck behind the heavy one (the other worker answered it).
    let (light_answer, light_took) = during;
    assert_eq!(light_answer?.1["response"]["allowed"], true);
    assert!(light_took < Duration::from_millis(500), "the light request took {light_took:?}");
    // The set now takes the pool: a second heavy request is cut there, and holds the only slot
    // until it stops, as on the pool.
    let (code, body) = h.post("/validate/fail", &heavy).await?;
    assert_eq!(code, 200);
    assert!(body["response"]["status"]["message"].as_str().unwrap_or_default().contains("deadline"), "{body}");
    let (code, body) = h.post("/validate/fail", &light).await?;
    assert_eq!((code, &body["response"]["allowed"]), (200, &json!(true)), "{body}");
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// A ClusterPolicy that reads a ConfigMap: its family is evaluated on the blocking pool.
const READS_CONFIG_MAP: &str = r#"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: reads-config-map
spec:
  validationFailureAction: Audit
  rules:
  - name: cm
    match:
      any:
      - resources:
          kinds: [Pod]
    context:
    - name: cm
      configMap: {name: settings, namespace: default}
    validate:
      deny:
        conditions:
          any:
          - key: "{{ cm.data.mode || '' }}"
            operator: Equals
            value: closed
"#;

/// A ValidatingPolicy that reads only the request.
const NO_BAD_IMAGES: &str = r#"
apiVersion: policies.kyverno.io/v1
kind: ValidatingPolicy
metadata:
  name: no-bad-images
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [pods]
  variables:
  - name: images
    expression: object.spec.containers.map(c, c.image)
  validations:
  - expression: variables.images.all(i, i != 'bad')
    message: bad image
"#;

/// Issue 21: ValidatingPolicies that read nothing but the request (no parameters, no library
/// that reads the cluster) are evaluated on the executor too: with the only evaluation slot
/// held by a ClusterPolicy request on the pool, a `/vpol` request is answered before it, where
/// it would otherwise wait for the slot.
#[tokio::test]
async fn self_contained_cel_policies_are_answered_without_an_evaluation_slot() -> Result<(), String> {
    let h = Harness::start_with(
        &[("pairwise.yaml", PAIRWISE), ("reads.yaml", READS_CONFIG_MAP), ("vpol.yaml", NO_BAD_IMAGES)],
        |cfg| {
            cfg.deadline = Duration::from_millis(1500);
            cfg.max_concurrency = 1;
            cfg.body_limit = 4 << 20;
        },
    )
    .await?;
    let heavy = review_of(&pod_in_default("heavy", 4000));
    let light = review_of(&pod_in_default("light", 1));
    let order = std::sync::Mutex::new(Vec::new());
    let (first, second) = tokio::join!(
        async {
            let r = h.post("/validate/fail", &heavy).await;
            order.lock().map_err(|e| e.to_string())?.push("heavy");
            r
        },
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let r = h.post("/vpol", &light).await;
            order.lock().map_err(|e| e.to_string())?.push("light");
            r
        }
    );
    let (code, body) = first?;
    assert_eq!(code, 200);
    assert!(body["response"]["status"]["message"].as_str().unwrap_or_default().contains("deadline"), "{body}");
    let (code, body) = second?;
    assert_eq!((code, &body["response"]["allowed"]), (200, &json!(true)), "{body}");
    assert_eq!(*order.lock().map_err(|e| e.to_string())?, ["light", "heavy"]);
    // The CEL verdicts are the pool's: a bad image is refused with the policy's message.
    let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "bad"}]}});
    let (code, body) = h.post("/vpol", &review_of(&bad)).await?;
    assert_eq!((code, &body["response"]["allowed"]), (200, &json!(false)), "{body}");
    let msg = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("Policy no-bad-images failed: bad image"), "{msg}");
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// A Pod `name` in `default` with `containers` containers `c0`, `c1`, ….
fn pod_in_default(name: &str, containers: usize) -> Value {
    let containers: Vec<Value> = (0..containers).map(|i| json!({"name": format!("c{i}"), "image": "nginx"})).collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": containers}})
}

/// Issue 14, item 4: past the deadline the failure policy answered, but the evaluation ran on to
/// its end (minutes for a CEL loop; nine such requests left nine spinning threads). The work is
/// now cancelled at the deadline and holds its evaluation slot until it stops: with one slot, the
/// next request is evaluated at once instead of waiting (and being shed) behind work nobody waits
/// for.
#[tokio::test]
async fn work_past_the_deadline_is_cancelled_and_frees_its_slot() -> Result<(), String> {
    let h = one_slot_pairwise(Duration::from_millis(500)).await?;
    let heavy = pod_in_default("heavy", 4000);
    let (code, body) = h.post("/validate/fail", &review_of(&heavy)).await?;
    assert_eq!(code, 200);
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let msg = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("exceeded the 500 ms deadline"), "{msg}");
    // The heavy work (16 million pairs) would hold the only slot for far longer than the
    // deadline; once cancelled it stops and the next request gets the slot in time.
    let light = pod_in_default("light", 1);
    for _ in 0..3 {
        let (code, body) = h.post("/validate/fail", &review_of(&light)).await?;
        assert_eq!(code, 200);
        assert_eq!(body["response"]["allowed"], true, "{body}");
    }
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Issue 14, item 5: a client that sent its headers and then trickled its body held the body's
/// memory until it gave up (300 half-sent 3 MB bodies held 900 MB). The body must now arrive
/// within the idle timeout; the server answers 408 and closes.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_refused_with_408() -> Result<(), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let h = Harness::start_with(&[], |cfg| cfg.idle_timeout = Duration::from_secs(1)).await?;
    let ca = h.running.as_ref().and_then(|r| r.ca_path.clone()).ok_or("no CA")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca).map_err(|e| e.to_string())? {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let port = h.running.as_ref().map(|r| r.addr.port()).unwrap_or(0);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    // Headers promise 60 000 bytes; 10 arrive, then nothing.
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{}",
        "{\"apiVersio"
    );
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // Far longer than the timeout: a server that waits for the body fails here.
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "the server still waits for the body");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("the request body did not arrive within 1 s"), "{answer}");
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Issue 47 item 12: a client that completed the TLS handshake and then sent nothing kept its
/// connection for good (no timeout covers the read that tells HTTP/1 from HTTP/2); a thousand
/// of them exhausted the descriptors. It is now closed after the idle timeout.
#[tokio::test]
async fn a_connection_that_sends_nothing_after_its_handshake_is_closed() -> Result<(), String> {
    use tokio::io::AsyncReadExt as _;
    let h = Harness::start_with(&[], |cfg| cfg.idle_timeout = Duration::from_secs(1)).await?;
    let ca = h.running.as_ref().and_then(|r| r.ca_path.clone()).ok_or("no CA")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca).map_err(|e| e.to_string())? {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let port = h.running.as_ref().map(|r| r.addr.port()).unwrap_or(0);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    // Far longer than the timeout: a server that keeps the connection fails here.
    let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the silent connection was kept");
    // A connection that does talk is served as before.
    let ok =
        h.client.get(format!("https://localhost:{port}/health/liveness")).send().await.map_err(|e| e.to_string())?;
    assert_eq!(ok.status(), 200);
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Found by the overload bench (issue 14, item 3): a client that gave up while its request waited
/// for a slot left the waiting count one too high for good; after enough of them every request
/// was shed as "overloaded" while the server sat idle.
#[tokio::test]
async fn clients_that_give_up_while_waiting_do_not_leave_the_queue_full() -> Result<(), String> {
    let h = one_slot_pairwise(Duration::from_millis(1500)).await?;
    let heavy = pod_in_default("heavy", 3000);
    let light = pod_in_default("light", 1);
    // The heavy request holds the only slot until its deadline; 100 clients queue behind it
    // (64 may wait, the rest are shed) and give up after 300 ms.
    let heavy = review_of(&heavy);
    let busy = h.post("/validate/fail", &heavy);
    let impatient = async {
        let tries = (0..100).map(|_| {
            let req = h
                .client
                .post(h.url("/validate/fail"))
                .header("Content-Type", "application/json")
                .timeout(Duration::from_millis(300))
                .body(review_of(&light).to_string())
                .send();
            async move { req.await.is_err() }
        });
        futures_util::future::join_all(tries).await
    };
    let (busy, gave_up) = tokio::join!(busy, async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        impatient.await
    });
    assert!(busy?.1["response"]["status"]["message"].as_str().unwrap_or_default().contains("deadline"));
    assert!(gave_up.iter().filter(|g| **g).count() >= 64, "the clients waited and gave up");
    // The queue is empty again: the next request is evaluated, not shed.
    let (code, body) = h.post("/validate/fail", &review_of(&light)).await?;
    assert_eq!(code, 200);
    assert_eq!(body["response"]["allowed"], true, "{body}");
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// A review of a Pod whose `spec.extra` nests `depth` objects, written as text (serializing a
/// deep value recurses per level, as parsing it does).
fn deep_review(labels: &str, depth: usize) -> String {
    let deep = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"0d7b7e3c-3","kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","namespace":"shop","name":"web","userInfo":{{"username":"alice"}},"object":{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"web","namespace":"shop","labels":{labels}}},"spec":{{"containers":[{{"name":"web","image":"nginx:1.27"}}],"extra":{deep}}}}}}}}}"#
    )
}

/// Issue 47 item 12: an object nested deeper than serde_json's default 128 levels was refused
/// with 400, which a webhook under `failurePolicy: Fail` turns into a denial of a good object.
/// Kubernetes decodes objects up to 10,000 levels deep; so does the webhook (on the runtime
/// `verno_server::runtime` builds, whose threads' stacks hold the engine's walks that deep), and
/// deeper bodies get a 400 that says so.
#[test]
fn objects_nested_as_deep_as_kubernetes_allows_are_judged() -> Result<(), String> {
    let rt = verno_server::runtime().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let h = Harness::start_with(&[("require-team.yaml", REQUIRE_TEAM), ("add-tier.yaml", ADD_TIER)], |c| {
            c.body_limit = 1 << 20;
        })
        .await?;
        for depth in [200, verno_server::admission::MAX_DEPTH - 8] {
            let (code, text) = h.post_text("/validate", deep_review(r#"{"team":"payments"}"#, depth)).await?;
            assert_eq!(code, 200, "depth {depth}: {text}");
            assert!(text.contains(r#""allowed":true"#), "depth {depth}: {text}");
            let (code, text) = h.post_text("/validate", deep_review(r#"{"app":"web"}"#, depth)).await?;
            assert_eq!(code, 200, "depth {depth}: {text}");
            assert!(text.contains("label ''team'' is required"), "depth {depth}: {text}");
            let (code, text) = h.post_text("/mutate", deep_review(r#"{"team":"payments"}"#, depth)).await?;
            assert_eq!(code, 200, "depth {depth}: {text}");
            assert!(text.contains(r#""patchType":"JSONPatch""#), "depth {depth}: {text}");
        }
        let (code, text) = h.post_text("/validate", deep_review(r#"{"team":"payments"}"#, 20_000)).await?;
        assert_eq!(code, 400, "{text}");
        assert_eq!(text, "invalid AdmissionReview: the request nests deeper than 10000 levels", "{text}");
        let live = h.client.get(h.url("/health/liveness")).send().await.map_err(|e| e.to_string())?;
        assert_eq!(live.status().as_u16(), 200);
        if let Some(r) = h.running {
            r.shutdown(Duration::from_secs(1)).await;
        }
        Ok(())
    })
}

/// Issue 47 item 12: over HTTP/2 (what the API server speaks to webhooks) a 10 MB body got a
/// stream reset instead of the 413 HTTP/1.1 clients get.
#[tokio::test]
async fn a_body_over_the_limit_gets_413_over_http2_too() -> Result<(), String> {
    let h = Harness::start(&[("require-team.yaml", REQUIRE_TEAM)]).await?;
    let ca = h.running.as_ref().and_then(|r| r.ca_path.clone()).ok_or("no CA")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca).map_err(|e| e.to_string())? {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let h2 = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .http2_prior_knowledge()
        .build()
        .map_err(|e| e.to_string())?;
    for (size, path) in [(10 << 20, "/validate"), (100 << 10, "/validate"), (10 << 20, "/policyvalidate")] {
        let r = h2
            .post(h.url(path))
            .header("Content-Type", "application/json")
            .body("x".repeat(size))
            .send()
            .await
            .map_err(|e| format!("{size} bytes to {path}: {e:?}"))?;
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        assert_eq!(r.status().as_u16(), 413, "{size} bytes to {path}");
        let text = r.text().await.map_err(|e| e.to_string())?;
        assert!(text.starts_with("the request body is over "), "{text}");
    }
    if let Some(r) = h.running {
        r.shutdown(Duration::from_secs(1)).await;
    }
    Ok(())
}
