//! The Helm chart, with a real helm (v4, installed by `scripts/install-helm.sh` when missing):
//! lint, render with every `charts/verno/ci/*.yaml`, check the invariants of the rendered
//! install, and check that `verno manifests` renders the same objects.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use verno_controller::manifests::{self, Values};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// helm from `$VERNO_HELM`, else `.tools/bin/helm`, installed by the project's script when
/// missing. A failed install fails the test: the chart is never silently untested.
fn helm() -> PathBuf {
    if let Ok(p) = std::env::var("VERNO_HELM") {
        return PathBuf::from(p);
    }
    let p = root().join(".tools/bin/helm");
    // Tests run in parallel: one installs, the others wait for it (the script also locks).
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if !p.exists() {
        let out = Command::new("bash")
            .arg(root().join("scripts/install-helm.sh"))
            .current_dir(root())
            .output()
            .expect("running scripts/install-helm.sh");
        assert!(
            out.status.success(),
            "scripts/install-helm.sh failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    p
}

fn run(args: &[&str]) -> String {
    let out = Command::new(helm()).args(args).current_dir(root()).output().expect("running helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn render(values_file: Option<&str>) -> Vec<Value> {
    let mut args = vec!["template", "verno", "charts/verno", "--namespace", "verno"];
    if let Some(f) = values_file {
        args.extend(["-f", f]);
    }
    let text = run(&args);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Compares document by document and names the first difference.
fn same(ours: &[Value], helm: &[Value], what: &str) {
    let names = |d: &[Value]| {
        d.iter()
            .map(|x| format!("{}/{}", x["kind"].as_str().unwrap_or(""), x["metadata"]["name"].as_str().unwrap_or("")))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(ours), names(helm), "{what}: the same objects");
    for (a, b) in ours.iter().zip(helm) {
        assert_eq!(
            a, b,
            "{what}: {} {} differs\nverno manifests: {a}\nhelm template:   {b}",
            a["kind"], a["metadata"]["name"]
        );
    }
}

fn ci_values() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("charts/verno/ci"))
        .unwrap()
        .flatten()
        .map(|e| format!("charts/verno/ci/{}", e.file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

/// Drops what only Helm adds, and sorts, so that the two renders compare.
fn normalize(mut docs: Vec<Value>) -> Vec<Value> {
    for d in &mut docs {
        for path in ["/metadata/labels", "/spec/template/metadata/labels"] {
            if let Some(l) = d.pointer_mut(path).and_then(Value::as_object_mut) {
                for k in [
                    "app.kubernetes.io/instance",
                    "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/version",
                    "helm.sh/chart",
                ] {
                    l.remove(k);
                }
            }
        }
    }
    docs.retain(|d| d["kind"] != "Namespace" && d["kind"] != "ServiceMonitor");
    docs.sort_by_key(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]));
    docs
}

#[test]
fn the_chart_lints_and_every_render_keeps_the_safety_invariants() {
    run(&["lint", "--strict", "charts/verno"]);
    for f in ci_values() {
        run(&["lint", "--strict", "charts/verno", "-f", &f]);
        let docs = render(Some(&f));
        let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(root().join(&f)).unwrap()).unwrap();
        let replicas = values.pointer("/admissionController/replicas").and_then(Value::as_i64).unwrap_or(2);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for k in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "Deployment",
            "Service",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ] {
            assert!(kinds.contains(&k), "{f}: no {k}");
        }
        assert_eq!(kinds.contains(&"PodDisruptionBudget"), replicas > 1, "{f}: a PDB exactly when replicas > 1");
        for d in &docs {
            assert!(d.pointer("/metadata/annotations/helm.sh~1hook").is_none(), "{f}: no hooks");
        }
        for cfg in docs.iter().filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration"))) {
            for w in cfg["webhooks"].as_array().unwrap() {
                let name = w["name"].as_str().unwrap();
                assert!(w.get("rules").is_none(), "{f} {name}: the chart owns no rules");
                assert!(w.pointer("/clientConfig/caBundle").is_none(), "{f} {name}: the chart owns no caBundle");
                if name == verno_controller::webhooks::POLICY_VALIDATE {
                    // Policy validation: fail-open, so a dead Verno never stops a policy sync.
                    assert_eq!(w["failurePolicy"], "Ignore", "{f} {name}");
                    continue;
                }
                if name == verno_controller::webhooks::MONITOR {
                    // The end-to-end probe: fail-open, and only the probe Lease in the release namespace.
                    assert_eq!(w["failurePolicy"], "Ignore", "{f} {name}");
                    assert_eq!(
                        w["namespaceSelector"],
                        serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": "verno"}}),
                        "{f} {name}"
                    );
                    assert_eq!(
                        w["objectSelector"],
                        serde_json::json!({"matchLabels": {"verno.io/probe": "true"}}),
                        "{f} {name}"
                    );
                    continue;
                }
                let excluded =
                    w.pointer("/namespaceSelector/matchExpressions/0/values").and_then(Value::as_array).unwrap();
                for ns in ["kube-system", "kube-public", "kube-node-lease", "verno"] {
                    assert!(excluded.iter().any(|v| v == ns), "{f} {name}: {ns} is not excluded");
                }
                // Verno's four come first; values may only add.
                let conds = w["matchConditions"].as_array().unwrap();
                assert_eq!(
                    conds[..4].iter().map(|c| c["name"].as_str().unwrap()).collect::<Vec<_>>(),
                    ["exclude-nodes-and-csrs", "exclude-leases", "exclude-events", "exclude-verno-service-accounts"],
                    "{f} {name}: matchConditions"
                );
                assert!(w["timeoutSeconds"].as_i64().unwrap() <= 10, "{f} {name}: timeout");
                assert_eq!(w["failurePolicy"] == "Fail", name.ends_with("-fail"), "{f} {name}: failurePolicy");
            }
        }
    }
}

#[test]
fn verno_manifests_and_helm_template_render_the_same_install() {
    let helm_default = normalize(render(None));
    let ours = normalize(manifests::render(&Values::default()));
    same(&ours, &helm_default, "defaults");
    // With values set both ways.
    let helm_set = normalize(render(Some("charts/verno/ci/one-replica-extra-exclusions-values.yaml")));
    let mut v = Values::default();
    for kv in [
        "admissionController.replicas=1",
        "config.excludedNamespaces=monitoring,istio-system",
        "config.webhooks.failTimeoutSeconds=10",
    ] {
        v.set(kv).unwrap();
    }
    let ours = normalize(manifests::render(&v));
    same(&ours, &helm_set, "values set");
    // Every CI values file, read by `verno manifests -f` and by `helm template -f`.
    for f in ci_values() {
        let mut v = Values::default();
        v.apply_file(&root().join(&f)).unwrap();
        same(&normalize(manifests::render(&v)), &normalize(render(Some(&f))), &f);
    }
}

#[test]
fn kyverno_shaped_values_add_exclusions_and_never_remove_vernos() {
    let mut v = Values::default();
    v.apply_file(&root().join("charts/verno/ci/kyverno-shaped-values.yaml")).unwrap();
    let docs = manifests::render(&v);
    let w = &docs[0]["webhooks"][0];
    let exprs = w["namespaceSelector"]["matchExpressions"].as_array().unwrap();
    assert_eq!(exprs.len(), 3);
    assert!(exprs[0]["values"].as_array().unwrap().iter().any(|n| n == "verno"), "Verno's own exclusion stays first");
    assert_eq!(exprs[2]["values"], serde_json::json!(["kube-system", "argocd", "cert-manager"]));
    assert_eq!(w["namespaceSelector"]["matchLabels"], serde_json::json!({"policy": "enforced"}));
    assert_eq!(w["objectSelector"]["matchExpressions"][0]["key"], "webhooks.kyverno.io/exclude");
    assert_eq!(w["matchConditions"].as_array().unwrap().len(), 5);
    // Bad values are refused with the file and key.
    let dir = tempdir();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "config:\n  webhooks:\n    namespaceSelector:\n      matchExpressions:\n      - key: a\n        operator: Sometimes\n").unwrap();
    let err = Values::default().apply_file(&bad).unwrap_err().to_string();
    assert!(err.ends_with("bad.yaml: config.webhooks.namespaceSelector.matchExpressions[0]: needs a key and an operator In, NotIn, Exists or DoesNotExist"), "{err}");
    std::fs::write(&bad, "config:\n  webhook:\n    failTimeoutSeconds: 3\n").unwrap();
    let err = Values::default().apply_file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.yaml: config.webhook.failTimeoutSeconds: unknown value"), "{err}");
    // Chart-only values are accepted with a note.
    std::fs::write(&bad, "serviceMonitor:\n  enabled: true\n").unwrap();
    let notes = Values::default().apply_file(&bad).unwrap();
    assert!(notes[0].contains("serviceMonitor.enabled is used by the Helm chart only"), "{notes:?}");
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("verno-chart-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_charts_crds_are_the_ones_verno_generates() {
    let text = std::fs::read_to_string(root().join("charts/verno/crds/crds.yaml")).unwrap();
    let chart: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let chart: Vec<Value> = chart.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(
        chart,
        verno_controller::crds::all(),
        "charts/verno/crds/crds.yaml is stale: regenerate it with `verno manifests --crds -o charts/verno/crds/crds.yaml`"
    );
    let names: Vec<&str> = chart.iter().filter_map(|c| c.pointer("/metadata/name").and_then(Value::as_str)).collect();
    assert_eq!(
        names,
        [
            "clusterpolicies.kyverno.io",
            "policies.kyverno.io",
            "policyexceptions.kyverno.io",
            "updaterequests.kyverno.io",
            "validatingpolicies.policies.kyverno.io",
            "namespacedvalidatingpolicies.policies.kyverno.io",
            "mutatingpolicies.policies.kyverno.io",
            "namespacedmutatingpolicies.policies.kyverno.io",
            "generatingpolicies.policies.kyverno.io",
            "namespacedgeneratingpolicies.policies.kyverno.io",
            "deletingpolicies.policies.kyverno.io",
            "namespaceddeletingpolicies.policies.kyverno.io",
            "imagevalidatingpolicies.policies.kyverno.io",
            "namespacedimagevalidatingpolicies.policies.kyverno.io",
            "globalcontextentries.kyverno.io",
            "clustercleanuppolicies.kyverno.io",
            "cleanuppolicies.kyverno.io",
            "policyexceptions.policies.kyverno.io",
            "clusterpolicyreports.wgpolicyk8s.io",
            "policyreports.wgpolicyk8s.io",
            "clusterreports.openreports.io",
            "reports.openreports.io",
            "clusterephemeralreports.reports.kyverno.io",
            "ephemeralreports.reports.kyverno.io"
        ]
    );
    // Helm installs crds/ but never deletes them: an uninstall keeps every policy.
    let rendered = run(&["template", "verno", "charts/verno", "--namespace", "verno", "--include-crds"]);
    assert!(rendered.contains("name: clusterpolicies.kyverno.io"));
}
