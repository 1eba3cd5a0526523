//! The real `kube::Client` against the fake: CRUD, conflicts, selectors, and kube's watcher
//! through live events, bookmarks and a 410 relist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking

use fake_apiserver::{FakeApiServer, default_resources};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use std::collections::BTreeMap;
use std::time::Duration;

async fn client(fake: &FakeApiServer) -> kube::Client {
    let config = kube::Config::new(fake.url().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>());
    c.data = Some([("k".to_string(), "v".to_string())].into());
    c
}

#[tokio::test]
async fn crud_conflicts_and_selectors_behave_like_an_api_server() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake).await, "team");
    let created = api.create(&PostParams::default(), &cm("a", &[("tier", "web")])).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("team"));
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    api.create(&PostParams::default(), &cm("b", &[("tier", "db")])).await.unwrap();
    // AlreadyExists.
    let err = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"), "{err:?}");
    // Selectors.
    let web = api.list(&ListParams::default().labels("tier=web")).await.unwrap();
    assert_eq!(web.items.iter().map(|c| c.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>(), ["a"]);
    let not_web = api.list(&ListParams::default().labels("tier notin (web)")).await.unwrap();
    assert_eq!(not_web.items.len(), 1);
    let by_name = api.list(&ListParams::default().fields("metadata.name=b")).await.unwrap();
    assert_eq!(by_name.items.len(), 1);
    assert!(web.metadata.resource_version.is_some());
    // A merge patch changes data and bumps generation; a stale replace conflicts.
    let patched =
        api.patch("a", &PatchParams::default(), &Patch::Merge(serde_json::json!({"data": {"k": "w"}}))).await.unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let err = api.replace("a", &PostParams::default(), &created).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"), "{err:?}");
    // A no-op patch is not a write of the store: the version does not move.
    let rv = fake.resource_version();
    api.patch("a", &PatchParams::default(), &Patch::Merge(serde_json::json!({"data": {"k": "w"}}))).await.unwrap();
    assert_eq!(fake.resource_version(), rv);
    // Apply needs a field manager, and creates.
    let applied = api.patch("c", &PatchParams::apply("verno"), &Patch::Apply(cm("c", &[]))).await.unwrap();
    assert_eq!(applied.metadata.name.as_deref(), Some("c"));
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let err = api.get("a").await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 404), "{err:?}");
    // The request log sees every write.
    assert_eq!(fake.writes().iter().filter(|w| w.method == "DELETE").count(), 1);
    // Fault injection: the injected failure reaches the client (a 409, which kube does not retry).
    fake.fail_next(1, 409);
    assert!(api.get("b").await.is_err());
    assert!(api.get("b").await.is_ok());
}

#[tokio::test]
async fn kube_watcher_sees_changes_and_relists_after_410() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let client = client(&fake).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    api.create(&PostParams::default(), &cm("first", &[])).await.unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default().timeout(2)).boxed();
    macro_rules! next {
        () => {
            tokio::time::timeout(Duration::from_secs(10), events.next())
                .await
                .expect("an event in time")
                .expect("the stream goes on")
        };
    }
    // The initial list.
    let mut inits = Vec::new();
    loop {
        match next!().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(c) => inits.push(c.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(inits, ["first"]);
    // A live change.
    api.create(&PostParams::default(), &cm("second", &[])).await.unwrap();
    loop {
        if let watcher::Event::Apply(c) = next!().unwrap() {
            assert_eq!(c.metadata.name.as_deref(), Some("second"));
            break;
        }
    }
    // Forget the history: the watch resumes from a version that is too old, gets an
    // in-stream 410 and kube relists.
    api.create(&PostParams::default(), &cm("third", &[])).await.unwrap();
    loop {
        if let watcher::Event::Apply(c) = next!().unwrap() {
            assert_eq!(c.metadata.name.as_deref(), Some("third"));
            break;
        }
    }
    // A write elsewhere moves the version past what the watcher has seen; compacting then
    // makes its next watch (after its 2 s timeout) too old.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "elsewhere");
    other.create(&PostParams::default(), &cm("x", &[])).await.unwrap();
    fake.compact();
    let mut relisted = Vec::new();
    loop {
        // The 410 may surface as an error item before the relist.
        let Ok(e) = next!() else { continue };
        match e {
            watcher::Event::InitApply(c) => relisted.push(c.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    relisted.sort();
    assert_eq!(relisted, ["first", "second", "third"]);
}

#[tokio::test]
async fn server_side_apply_owns_fields_and_reports_conflicts() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client(&fake).await);
    let chart = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "cfg"},
        "webhooks": [{"name": "w.example.io", "clientConfig": {"url": "https://example.invalid/"}, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Fail"}]});
    api.patch("cfg", &PatchParams::apply("helm"), &Patch::Apply(&chart)).await.unwrap();
    // Another manager adds rules to the same entry; the chart's fields stay.
    let rules = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "cfg"},
        "webhooks": [{"name": "w.example.io", "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}]});
    let live = api.patch("cfg", &PatchParams::apply("verno").force(), &Patch::Apply(&rules)).await.unwrap();
    let w = &live.webhooks.unwrap()[0];
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.rules.as_ref().map(Vec::len), Some(1));
    // Changing a field the chart owns without force is a 409 Conflict naming the owner.
    let grab = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "cfg"},
        "webhooks": [{"name": "w.example.io", "failurePolicy": "Ignore"}]});
    let err = api.patch("cfg", &PatchParams::apply("verno"), &Patch::Apply(&grab)).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("conflict with \"helm\"")),
        "{err:?}"
    );
    // Re-applying the same thing is not a write of the store.
    let rv = fake.resource_version();
    api.patch("cfg", &PatchParams::apply("verno").force(), &Patch::Apply(&rules)).await.unwrap();
    assert_eq!(fake.resource_version(), rv);
    // Dropping rules from the applied set removes them.
    let none = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "cfg"},
        "webhooks": [{"name": "w.example.io"}]});
    let live = api.patch("cfg", &PatchParams::apply("verno").force(), &Patch::Apply(&none)).await.unwrap();
    assert!(live.webhooks.unwrap()[0].rules.is_none());
    // Once the object is gone, an apply that lacks the required fields cannot re-create it.
    api.delete("cfg", &DeleteParams::default()).await.unwrap();
    let err = api.patch("cfg", &PatchParams::apply("verno").force(), &Patch::Apply(&rules)).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 422), "{err:?}");
    assert!(api.get_opt("cfg").await.unwrap().is_none());
}

#[tokio::test]
async fn owner_references_are_garbage_collected_and_finalizers_hold_deletion() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let roles: Api<ClusterRole> = Api::all(c.clone());
    let mut role = ClusterRole::default();
    role.metadata.name = Some("owner".into());
    let role = roles.create(&PostParams::default(), &role).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "team");
    let mut dep = cm("dependent", &[]);
    dep.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: "owner".into(),
        uid: role.metadata.uid.clone().unwrap(),
        ..Default::default()
    }]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    let mut held = cm("held", &[]);
    held.metadata.finalizers = Some(vec!["example.io/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    roles.delete("owner", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("dependent").await.unwrap().is_none(), "the dependent is collected");
    // A finalizer keeps the object, marked for deletion, until it is removed.
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = cms.get("held").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    cms.patch("held", &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn metadata_only_lists_and_discovery() {
    use k8s_openapi::api::core::v1::Namespace;
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let ns: Api<Namespace> = Api::all(c.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some("shop".into());
    n.metadata.labels = Some([("env".to_string(), "prod".to_string())].into());
    ns.create(&PostParams::default(), &n).await.unwrap();
    let metas = ns.list_metadata(&ListParams::default().labels("env=prod")).await.unwrap();
    assert_eq!(metas.items.len(), 1);
    assert_eq!(metas.items[0].metadata.labels.as_ref().and_then(|l| l.get("env")).map(String::as_str), Some("prod"));
    let groups = c.list_api_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "kyverno.io"));
    let core = c.list_core_api_resources("v1").await.unwrap();
    assert!(core.resources.iter().any(|r| r.name == "namespaces" && !r.namespaced));
    // As in a real cluster: the built-in namespaces exist, and every namespace gets a
    // `default` ServiceAccount.
    let all = ns.list_metadata(&ListParams::default()).await.unwrap();
    let names: Vec<String> = all.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
    assert_eq!(names, ["default", "kube-node-lease", "kube-public", "kube-system", "shop"]);
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(c.clone(), "shop");
    assert!(sas.get_opt("default").await.unwrap().is_some());
}

/// The namespace controller's work: deleting a namespace deletes what is in it.
#[tokio::test]
async fn deleting_a_namespace_deletes_its_objects() {
    use k8s_openapi::api::core::v1::Namespace;
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let ns: Api<Namespace> = Api::all(c.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some("shop".into());
    ns.create(&PostParams::default(), &n).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("a".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    ns.delete("shop", &DeleteParams::default()).await.unwrap();
    assert!(ns.get_opt("shop").await.unwrap().is_none());
    assert!(cms.get_opt("a").await.unwrap().is_none());
}

/// A CustomResourceDefinition becomes a served resource with its status set, and goes away
/// with its objects when the CRD is deleted; objects read back in the version asked for.
#[tokio::test]
async fn a_crd_becomes_a_served_resource() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true}, {"name": "v1beta1", "served": true, "storage": false}]}});
    fake.apply(&c, &crd).await.unwrap();
    let stored = fake.get("apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.example.com").unwrap();
    assert_eq!(stored["status"]["conditions"][1]["type"], "Established");
    assert_eq!(stored["status"]["acceptedNames"]["listKind"], "WidgetList");
    let w = serde_json::json!({"apiVersion": "example.com/v1beta1", "kind": "Widget", "metadata": {"name": "w", "namespace": "default"}, "spec": {"size": 1}});
    fake.apply(&c, &w).await.unwrap();
    let ar = kube::discovery::ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), "default", &ar);
    let got = api.get("w").await.unwrap();
    assert_eq!(got.types.map(|t| t.api_version).as_deref(), Some("example.com/v1"));
    let crds: Api<DynamicObject> = Api::all_with(
        c.clone(),
        &kube::discovery::ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        },
    );
    crds.delete("widgets.example.com", &DeleteParams::default()).await.unwrap();
    assert!(!matches!(api.get_opt("w").await, Ok(Some(_))), "the resource is no longer served");
    assert!(fake.get("example.com", "widgets", "default", "w").is_none());
}

/// The ServiceAccount admission plugin: a new Pod runs as `default` and gets the projected
/// token volume mounted in every container, unless it opts out.
#[tokio::test]
async fn pods_get_a_service_account_and_its_token_volume() {
    use k8s_openapi::api::core::v1::Pod;
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let pod = |name: &str, automount: Option<bool>| -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "spec": {"automountServiceAccountToken": automount,
            "containers": [{"name": "a", "image": "x"}], "volumes": [{"name": "data", "emptyDir": {}}]}}),
        )
        .unwrap()
    };
    let p = pods.create(&PostParams::default(), &pod("p", None)).await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let volumes = spec.volumes.unwrap();
    assert_eq!(volumes.len(), 2);
    assert!(volumes[1].name.starts_with("kube-api-access-") && volumes[1].projected.is_some());
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    assert_eq!(mounts[0].mount_path, "/var/run/secrets/kubernetes.io/serviceaccount");
    let q = pods.create(&PostParams::default(), &pod("q", Some(false))).await.unwrap();
    assert_eq!(q.spec.unwrap().volumes.unwrap().len(), 1);
}

#[tokio::test]
async fn access_reviews_answer_from_the_stored_rbac_objects() {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
        SubjectAccessReviewSpec,
    };
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let admin = client(&fake).await;
    let user = "system:serviceaccount:verno:scanner";
    let sar = |verb: &str, group: &str, resource: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                version: Some("v1".into()),
                resource: Some(resource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let ask = |r: SubjectAccessReview| {
        let reviews = reviews.clone();
        async move { reviews.create(&PostParams::default(), &r).await.unwrap().status.unwrap() }
    };
    // Nothing bound yet: denied, with no reason (as Kubernetes' RBAC authorizer).
    let st = ask(sar("list", "apps", "deployments")).await;
    assert!(!st.allowed);
    assert_eq!(st.reason.as_deref().unwrap_or(""), "");
    // Bound to the bootstrap `view` role (aggregated from system:aggregate-to-view).
    let bindings: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(&()),
    );
    let binding: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "scanner-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "scanner", "namespace": "verno"}]}))
    .unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    let st = ask(sar("list", "apps", "deployments")).await;
    assert!(st.allowed, "{st:?}");
    assert!(st.reason.unwrap_or_default().contains("ClusterRoleBinding \"scanner-view\""));
    assert!(ask(sar("watch", "", "pods")).await.allowed);
    // `view` does not read Secrets, and there is no `configmaps` in `apps`.
    assert!(!ask(sar("get", "", "secrets")).await.allowed);
    assert!(!ask(sar("get", "apps", "configmaps")).await.allowed);
    assert!(!ask(sar("delete", "", "pods")).await.allowed);
    // A self review is answered for the impersonated user, with its service-account groups.
    let mut config = kube::Config::new(fake.url().parse().unwrap());
    config.auth_info.impersonate = Some(user.into());
    let me = kube::Client::try_from(config).unwrap();
    let selves: Api<SelfSubjectAccessReview> = Api::all(me);
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                group: Some("".into()),
                resource: Some("configmaps".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(selves.create(&PostParams::default(), &review).await.unwrap().status.unwrap().allowed);
    // The kubeconfig's own user is an administrator.
    let admin_selves: Api<SelfSubjectAccessReview> = Api::all(admin);
    let mut secrets = review.clone();
    secrets.spec.resource_attributes.as_mut().unwrap().resource = Some("secrets".into());
    assert!(admin_selves.create(&PostParams::default(), &secrets).await.unwrap().status.unwrap().allowed);
}

#[tokio::test]
async fn an_event_is_one_object_in_both_event_apis() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let new = kube::discovery::ApiResource {
        group: "events.k8s.io".into(),
        version: "v1".into(),
        api_version: "events.k8s.io/v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
    };
    let events: Api<DynamicObject> = Api::namespaced_with(c.clone(), "default", &new);
    let ev: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.1"},
        "eventTime": "2026-11-24T00:00:00.000000Z",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "default"},
        "note": "Pod default/web: pass", "reason": "PolicyApplied", "type": "Normal",
        "action": "Resource Passed", "reportingController": "kyverno-admission", "reportingInstance": "verno-0",
    }))
    .unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "default");
    let got = core.get("web.1").await.unwrap();
    assert_eq!(got.involved_object.name.as_deref(), Some("web"));
    assert_eq!(got.message.as_deref(), Some("Pod default/web: pass"));
    assert_eq!(got.reporting_component.as_deref(), Some("kyverno-admission"));
    assert_eq!(got.source.and_then(|s| s.component).as_deref(), Some("kyverno-admission"));
    // A change through either API shows in the other; a delete removes both.
    core.patch("web.1", &PatchParams::default(), &Patch::Merge(serde_json::json!({"message": "changed"})))
        .await
        .unwrap();
    let back = events.get("web.1").await.unwrap();
    assert_eq!(back.data["note"], "changed");
    assert_eq!(back.data["regarding"]["name"], "web");
    events.delete("web.1", &DeleteParams::default()).await.unwrap();
    assert!(core.get_opt("web.1").await.unwrap().is_none());
}

#[tokio::test]
async fn empty_lists_of_built_in_kinds_are_not_stored() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let pods: Api<DynamicObject> = Api::namespaced_with(
        c.clone(),
        "default",
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
    );
    let pod: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "finalizers": []},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [], "ports": []}], "imagePullSecrets": []},
    }))
    .unwrap();
    let stored = pods.create(&PostParams::default(), &pod).await.unwrap();
    let spec = &stored.data["spec"];
    assert!(spec.get("imagePullSecrets").is_none(), "{spec}");
    assert!(spec["containers"][0].get("env").is_none() && spec["containers"][0].get("ports").is_none(), "{spec}");
    assert!(stored.metadata.finalizers.is_none());
    // `containers` is not omitempty in the Go type: an empty list stays.
    let empty: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}, "spec": {"containers": []},
    }))
    .unwrap();
    let stored = pods.create(&PostParams::default(), &empty).await.unwrap();
    assert_eq!(stored.data["spec"]["containers"], serde_json::json!([]));
}

#[tokio::test]
async fn lists_come_in_pages_when_a_limit_is_given() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let client = client(&fake).await;
    for ns in ["a", "b"] {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        for i in 0..3 {
            api.create(&PostParams::default(), &cm(&format!("cm-{i}"), &[("tier", if i == 1 { "db" } else { "web" })]))
                .await
                .unwrap();
        }
    }
    let all: Api<ConfigMap> = Api::all(client.clone());
    let mut lp = ListParams::default().limit(4);
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = all.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 4);
        seen.extend(
            page.items
                .iter()
                .map(|c| format!("{}/{}", c.metadata.namespace.clone().unwrap(), c.metadata.name.clone().unwrap())),
        );
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(seen, ["a/cm-0", "a/cm-1", "a/cm-2", "b/cm-0", "b/cm-1", "b/cm-2"]);
    // Selectors apply before the limit; an exact fit has no next page.
    let web = all.list(&ListParams::default().labels("tier=web").limit(4)).await.unwrap();
    assert_eq!(web.items.len(), 4);
    assert!(web.metadata.continue_.as_deref().unwrap_or("").is_empty());
    assert!(fake.requests().iter().any(|r| r.query.contains("limit=4")));
}

/// An object relabelled out of a label-selected watch's selection is
/// DELETED there (with its previous labels, at the new resourceVersion), and ADDED when it is
/// relabelled back in, as the API server's watch cache sends them — controllers that watch by
/// label (TTL, generated downstreams) forget such objects on a real cluster.
#[tokio::test]
async fn objects_leaving_or_entering_a_label_selected_watch_are_deleted_or_added_there() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake).await, "team");
    api.create(&PostParams::default(), &cm("a", &[("tmp", "yes")])).await.unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default().labels("tmp=yes")).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .unwrap()
    };
    while !matches!(next().await, watcher::Event::InitDone) {}
    let relabel = |v: &str| Patch::Merge(serde_json::json!({"metadata": {"labels": {"tmp": v}}}));
    let out = api.patch("a", &PatchParams::default(), &relabel("no")).await.unwrap();
    match next().await {
        watcher::Event::Delete(c) => {
            assert_eq!(c.metadata.labels.unwrap()["tmp"], "yes", "the previous content");
            assert_eq!(c.metadata.resource_version, out.metadata.resource_version);
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
    // Changes outside the selection are not seen; coming back in is an ADDED.
    api.patch("a", &PatchParams::default(), &Patch::Merge(serde_json::json!({"data": {"k": "w"}}))).await.unwrap();
    api.patch("a", &PatchParams::default(), &relabel("yes")).await.unwrap();
    match next().await {
        watcher::Event::Apply(c) => assert_eq!(c.data.unwrap()["k"], "w"),
        other => panic!("expected the object back, got {other:?}"),
    }
}

/// Structural defaulting, as the API server applies a CRD's schema defaults: absent fields
/// with a `default` are filled in where their parent is present (list items too), written
/// values are kept, and a field whose parent is absent stays absent.
#[tokio::test]
async fn a_crds_schema_defaults_are_filled_in() {
    let fake = FakeApiServer::start(default_resources()).await.unwrap();
    let c = client(&fake).await;
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"kind": "Gadget", "plural": "gadgets"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "enabled": {"type": "boolean", "default": true},
                    "mode": {"type": "string", "default": "Audit"},
                    "parts": {"type": "array", "items": {"type": "object", "properties": {"size": {"type": "integer", "default": 1}}}},
                    "extra": {"type": "object", "properties": {"on": {"type": "boolean", "default": false}}}}}}}}}]}});
    fake.apply(&c, &crd).await.unwrap();
    let g = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
        "spec": {"mode": "Enforce", "parts": [{}, {"size": 3}]}});
    fake.apply(&c, &g).await.unwrap();
    let stored = fake.get("example.com", "gadgets", "", "g").unwrap();
    assert_eq!(
        stored["spec"],
        serde_json::json!({"enabled": true, "mode": "Enforce", "parts": [{"size": 1}, {"size": 3}]})
    );
}
