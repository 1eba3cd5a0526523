//! `verno manifests --crds` applied over a cluster that runs (or ran) Kyverno 1.19: Kyverno's
//! own CRDs (`../shared/ecosystem/kyverno-crds/`, beside this checkout; the test says so and
//! passes when they are not there) are installed in the fake API server, their
//! `status.storedVersions` list the older versions an upgraded cluster still has objects at
//! (`v2beta1`, `v1alpha1`), and Verno's CRDs are then applied over them by server-side apply,
//! as `kubectl apply --server-side` does. The fake refuses a CRD that drops a stored version,
//! as the API server does, so this fails if Verno's CRDs ever stop serving one of them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and reads files

use fake_apiserver::{FakeApiServer, default_resources};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

fn crd_api(client: kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    };
    Api::all_with(client, &ar)
}

fn kyverno_crds() -> Option<Vec<Value>> {
    let dir = verno_testkit::corpus("ecosystem/kyverno-crds", "the upgrade over Kyverno's CRDs")?;
    let mut out = Vec::new();
    for sub in ["kyverno", "policies.kyverno.io", "policyreport", "reports"] {
        let mut files: Vec<_> = std::fs::read_dir(dir.join(sub)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for p in files.into_iter().filter(|p| p.extension().is_some_and(|x| x == "yaml")) {
            let text = std::fs::read_to_string(&p).unwrap();
            out.extend(
                serde_saphyr::from_multiple::<Value>(&text)
                    .unwrap()
                    .into_iter()
                    .filter(|d| d["kind"] == "CustomResourceDefinition"),
            );
        }
    }
    Some(out)
}

#[tokio::test]
async fn verno_crds_apply_over_kyverno_crds_with_old_stored_versions() {
    let Some(theirs) = kyverno_crds() else { return };
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let api = crd_api(client);
    // Kyverno's CRDs, and the versions an upgraded cluster still stores objects at.
    let mut upgraded = Vec::new();
    for crd in &theirs {
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        let obj: DynamicObject = serde_json::from_value(crd.clone()).unwrap();
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        let old: Vec<String> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .filter(|v| matches!(*v, "v2beta1" | "v1alpha1"))
            .map(str::to_string)
            .collect();
        if old.is_empty() {
            continue;
        }
        let mut with_status = serde_json::to_value(&created).unwrap();
        let mut stored: Vec<Value> = with_status["status"]["storedVersions"].as_array().cloned().unwrap_or_default();
        stored.extend(old.iter().map(|v| json!(v)));
        with_status["status"]["storedVersions"] = json!(stored);
        let obj: DynamicObject = serde_json::from_value(with_status).unwrap();
        let after = api.replace_status(&name, &PostParams::default(), &obj).await.unwrap();
        let listed = serde_json::to_value(&after).unwrap()["status"]["storedVersions"].clone();
        for v in &old {
            assert!(listed.as_array().unwrap().contains(&json!(v)), "{name}: {listed}");
        }
        upgraded.push(name);
    }
    assert!(upgraded.iter().any(|n| n == "cleanuppolicies.kyverno.io"), "{upgraded:?}");
    assert!(upgraded.iter().any(|n| n == "validatingpolicies.policies.kyverno.io"), "{upgraded:?}");
    // Verno's CRDs over them: every one is accepted.
    let pp = PatchParams::apply("verno").force();
    for crd in verno_controller::crds::all() {
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The fake refuses what the API server refuses: a CRD that no longer lists a version
    // objects are stored at.
    let mut dropped = verno_controller::crds::all()
        .into_iter()
        .find(|c| c["metadata"]["name"] == "cleanuppolicies.kyverno.io")
        .unwrap();
    let versions: Vec<Value> =
        dropped["spec"]["versions"].as_array().unwrap().iter().filter(|v| v["name"] != "v2beta1").cloned().collect();
    dropped["spec"]["versions"] = json!(versions);
    let err = api.patch("cleanuppolicies.kyverno.io", &pp, &Patch::Apply(&dropped)).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("status.storedVersions") && s.message.contains("v2beta1")),
        "{err:?}"
    );
}
