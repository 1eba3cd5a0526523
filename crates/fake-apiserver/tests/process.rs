//! The fake API server as a process: it listens, writes a kubeconfig, and a client
//! configured only from that kubeconfig can work with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use std::io::BufRead as _;
use std::process::{Command, Stdio};

/// Starts the process writing `kubeconfig`; returns it and its first line (`listening on …`).
fn start(kubeconfig: &std::path::Path) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_verno-fake-apiserver"))
        .args(["--kubeconfig-out", kubeconfig.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, line)
}

#[tokio::test]
async fn the_process_serves_clients_configured_from_its_kubeconfig() {
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    let (mut child, line) = start(&kubeconfig);
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), line.trim().trim_start_matches("listening on "));
    let api: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(api.get("c").await.unwrap().metadata.uid, created.metadata.uid);
    // Bad arguments are refused with a usage line.
    let bad = Command::new(env!("CARGO_BIN_EXE_verno-fake-apiserver")).arg("--port").arg("x").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--port \"x\""));
    child.kill().unwrap();
    let _ = child.wait();
}

/// The real kubectl (v1.33.9, installed by `scripts/install-kubectl.sh` when missing) against the
/// process: short names resolve through discovery, and objects it applies can be read back.
#[test]
fn a_real_kubectl_works_against_the_process() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let kubectl = root.join(".tools/bin/kubectl");
    if !kubectl.exists() {
        let out =
            Command::new("bash").arg(root.join("scripts/install-kubectl.sh")).current_dir(&root).output().unwrap();
        assert!(out.status.success(), "install-kubectl.sh: {}", String::from_utf8_lossy(&out.stderr));
    }
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    let (mut child, _) = start(&kubeconfig);
    let run = |args: &[&str]| {
        let out = Command::new(&kubectl).arg("--kubeconfig").arg(&kubeconfig).args(args).output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    for short in ["cm", "cpol", "polex", "vpol"] {
        let (ok, out) = run(&["get", short]);
        assert!(ok && out.contains("No resources found"), "kubectl get {short}: {out}");
    }
    let (ok, out) = run(&["get", "ns", "-o", "name"]);
    assert!(ok && out.contains("namespace/kube-system"), "kubectl get ns: {out}");
    let manifest = tmp.path().join("cm.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c1\ndata:\n  a: b\n").unwrap();
    // kubectl's client-side validation reads OpenAPI; the fake serves no schemas, so it
    // validates nothing on the client.
    let (ok, out) = run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(ok && out.contains("configmap/c1 created"), "{out}");
    assert_eq!(run(&["get", "cm", "c1", "-o", "jsonpath={.data.a}"]), (true, "b".to_string()));
    // Not modelled yet: protobuf bodies (kubectl create sends them for built-in kinds) are
    // refused with 415 and a clear message, not misread as broken JSON.
    let (ok, out) = run(&["create", "namespace", "team"]);
    assert!(!ok && out.contains("\"application/vnd.kubernetes.protobuf\" is not supported"), "{out}");
    child.kill().unwrap();
    let _ = child.wait();
}
