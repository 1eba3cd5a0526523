//! A namespaced policy acts only in its own namespace. Whoever may create a
//! `Policy` or a namespaced CEL policy in `tenant-a` must not make Verno read, create or delete
//! anything elsewhere with its own identity — through `apiCall`, `configMap`, clone sources,
//! mutate-existing targets or CEL's `resource` library — whatever the variables make of the
//! names. An API call may only GET or POST, and a dry run's POST persists nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use verno_engine::{Compiled, Data, Loaded, PolicySet, Request, Scope, Status, compile};

/// A cluster that answers everything and writes down every question.
#[derive(Default, Clone)]
struct Cluster(Arc<Mutex<Vec<String>>>);

impl Cluster {
    fn note(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
    fn asked(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn asked_about(&self, what: &str) -> Vec<String> {
        self.asked().into_iter().filter(|a| a.contains(what)).collect()
    }
}

impl Data for Cluster {
    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        self.note(format!("configmap {namespace}/{name}"));
        Loaded::Value(json!({"data": {"secret": "hunter2"}, "metadata": {"name": name}}))
    }
    fn api_call(&self, method: &str, url_path: &str, _data: Option<&Value>) -> Loaded {
        self.note(format!("{method} {url_path}"));
        Loaded::Value(json!({"data": {"password": "aHVudGVyMg=="}}))
    }
    fn resource(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.note(format!("get {api_version}/{kind} {namespace}/{name}"));
        Some(json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "data": {"password": "aHVudGVyMg=="}}))
    }
    fn list(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.note(format!("list {api_version}/{kind} in {namespace:?}"));
        Vec::new()
    }
    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.note(format!("targets {api_version}/{kind} in {namespace:?}"));
        Vec::new()
    }
    fn namespace_object(&self, name: &str) -> Option<Value> {
        self.note(format!("namespace {name}"));
        Some(json!({"metadata": {"name": name}}))
    }
    fn cel_host(&self) -> Option<Arc<dyn verno_cel::Host>> {
        Some(Arc::new(self.clone()))
    }
}

impl verno_cel::Host for Cluster {
    fn resource_get(
        &self,
        api_version: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, verno_cel::HostError> {
        self.note(format!("cel get {api_version}/{resource} {namespace}/{name}"));
        Ok(json!({"metadata": {"name": name, "namespace": namespace}, "data": {"password": "aHVudGVyMg=="}}))
    }
    fn resource_list(
        &self,
        api_version: &str,
        resource: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, verno_cel::HostError> {
        self.note(format!("cel list {api_version}/{resource} in {namespace:?}"));
        Ok(vec![json!({"metadata": {"name": "x", "namespace": namespace, "labels": {"a": "b"}}})])
    }
}

fn compiled(doc: Value) -> Arc<verno_engine::CompiledPolicy> {
    match compile(&doc, &[]) {
        Ok(Compiled::Policy(p)) => Arc::new(p),
        other => panic!("the policy does not compile: {:?}", other.err()),
    }
}

fn config_map(ns: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "trigger", "namespace": ns, "annotations": annotations}, "data": {"a": "b"}})
}

/// `(rule, status, message)` of every rule that ran on `object`.
fn run(policies: Vec<Value>, object: &Value, dry_run: bool, data: &Cluster) -> Vec<(String, Status, String)> {
    let set = PolicySet::new(policies.into_iter().map(compiled).collect(), Vec::new());
    let req = Request { dry_run, ..Request::new(verno_engine::Operation::Create, object) };
    let out = set.evaluate(&req, Scope::ALL, &verno_jmespath::NoEnv, data, &mut ());
    out.into_responses().into_iter().flat_map(|r| r.rules).map(|r| (r.name.to_string(), r.status, r.message)).collect()
}

/// A `Policy` in `ns` whose one validate rule on ConfigMaps loads `context` and denies when
/// `{{ probe }}` is set.
fn policy_with_context(kind: &str, ns: &str, context: Value) -> Value {
    json!({"apiVersion": "kyverno.io/v1", "kind": kind, "metadata": {"name": "steal", "namespace": ns},
        "spec": {"validationFailureAction": "Enforce", "background": true, "rules": [{
            "name": "r", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "context": context,
            "validate": {"message": "leaked {{ probe }}",
                "deny": {"conditions": {"any": [{"key": "{{ probe || '' }}", "operator": "Equals", "value": "never"}]}}}}]}})
}

#[test]
fn namespaced_policies_read_no_config_map_of_another_namespace() {
    let data = Cluster::default();
    let p = policy_with_context(
        "Policy",
        "tenant-a",
        json!([{"name": "probe", "configMap": {"name": "db", "namespace": "{{ request.object.metadata.annotations.ns }}"}}]),
    );
    let rules = run(vec![p], &config_map("tenant-a", json!({"ns": "kube-system"})), false, &data);
    assert_eq!(rules[0].1, Status::Error, "{rules:?}");
    assert!(
        rules[0].2.contains(r#"configMap namespace "kube-system" is different from policy namespace "tenant-a""#),
        "{rules:?}"
    );
    assert!(data.asked_about("configmap").is_empty(), "asked: {:?}", data.asked());
    // Its own namespace (also by default) is read.
    let p = policy_with_context("Policy", "tenant-a", json!([{"name": "probe", "configMap": {"name": "db"}}]));
    run(vec![p], &config_map("tenant-a", json!({})), false, &data);
    assert_eq!(data.asked_about("configmap"), ["configmap tenant-a/db"]);
}

#[test]
fn namespaced_policies_call_no_api_path_outside_their_namespace() {
    let data = Cluster::default();
    for (path, why) in [
        ("/api/v1/namespaces/kube-system/secrets/db", "refers to namespace kube-system"),
        ("/api/v1/namespaces/tenant-a/../kube-system/secrets/db", "refers to namespace kube-system"),
        ("/api/v1/namespaces/tenant-a%2F..%2Fkube-system/secrets/db", "refers to namespace kube-system"),
        ("/api/v1/nodes", "does not contain a namespace segment"),
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", "does not contain a namespace segment"),
    ] {
        // The path comes from the request: judged after substitution.
        let p = policy_with_context(
            "Policy",
            "tenant-a",
            json!([{"name": "probe", "apiCall": {"urlPath": "{{ request.object.metadata.annotations.path }}",
                "default": "fallback"}}]),
        );
        let rules = run(vec![p], &config_map("tenant-a", json!({"path": path})), false, &data);
        assert_eq!(rules[0].1, Status::Error, "{path}: {rules:?}");
        assert!(rules[0].2.contains(why), "{path}: {rules:?}");
    }
    assert!(data.asked().is_empty(), "asked: {:?}", data.asked());
    // Within its namespace, the call is made, on the cleaned path.
    let p = policy_with_context(
        "Policy",
        "tenant-a",
        json!([{"name": "probe", "apiCall": {"urlPath": "/api/v1/namespaces/tenant-a/./configmaps//db?x=1"}}]),
    );
    run(vec![p], &config_map("tenant-a", json!({})), false, &data);
    assert_eq!(data.asked(), ["GET /api/v1/namespaces/tenant-a/configmaps/db?x=1"]);
    // A ClusterPolicy reaches the cluster, as Kyverno's does.
    let p = policy_with_context(
        "ClusterPolicy",
        "",
        json!([{"name": "probe", "apiCall": {"urlPath": "/api/v1/namespaces/kube-system/secrets/db"}}]),
    );
    run(vec![p], &config_map("tenant-a", json!({})), false, &data);
    assert_eq!(data.asked_about("kube-system"), ["GET /api/v1/namespaces/kube-system/secrets/db"]);
}

#[test]
fn api_calls_only_get_or_post() {
    for method in ["DELETE", "PUT", "PATCH", "get"] {
        let p = policy_with_context(
            "ClusterPolicy",
            "",
            json!([{"name": "probe", "apiCall": {"method": method, "urlPath": "/api/v1/namespaces/x/configmaps/y"}}]),
        );
        let err = compile(&p, &[]).err().unwrap_or_else(|| panic!("{method} compiles"));
        let text = err.to_string();
        assert!(text.contains("context[0].apiCall.method"), "{method}: {text}");
        assert!(text.contains(r#"supported values: "GET", "POST""#), "{method}: {text}");
    }
    // In a foreach's context too.
    let p = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
        "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "validate": {"foreach": [{"list": "request.object.data", "context": [{"name": "x",
                "apiCall": {"method": "DELETE", "urlPath": "/api/v1/namespaces/x/configmaps/y"}}],
                "deny": {"conditions": {"any": [{"key": "a", "operator": "Equals", "value": "b"}]}}}]}}]}});
    assert!(compile(&p, &[]).is_err(), "a foreach's DELETE compiles");
}

#[test]
fn a_dry_run_posts_with_dry_run_all() {
    let data = Cluster::default();
    let p = policy_with_context(
        "ClusterPolicy",
        "",
        json!([{"name": "probe", "apiCall": {"method": "POST", "urlPath": "/api/v1/namespaces/kube-system/configmaps",
            "data": [{"key": "metadata", "value": {"name": "planted"}}]}},
            {"name": "read", "apiCall": {"urlPath": "/api/v1/namespaces/kube-system/configmaps/x"}}]),
    );
    run(vec![p.clone()], &config_map("tenant-a", json!({})), true, &data);
    assert_eq!(
        data.asked(),
        [
            "POST /api/v1/namespaces/kube-system/configmaps?dryRun=All",
            "GET /api/v1/namespaces/kube-system/configmaps/x"
        ]
    );
    let data = Cluster::default();
    run(vec![p], &config_map("tenant-a", json!({})), false, &data);
    assert_eq!(data.asked()[0], "POST /api/v1/namespaces/kube-system/configmaps");
}

#[test]
fn namespaced_policies_clone_from_and_generate_into_their_namespace_only() {
    let data = Cluster::default();
    let generating = |target_ns: &str, source_ns: &str| {
        json!({"apiVersion": "kyverno.io/v1", "kind": "Policy", "metadata": {"name": "copy", "namespace": "tenant-a"},
            "spec": {"rules": [{"name": "copy", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
                "generate": {"apiVersion": "v1", "kind": "Secret", "name": "stolen", "namespace": target_ns,
                    "clone": {"namespace": source_ns, "name": "db"}}}]}})
    };
    let object = config_map("tenant-a", json!({"ns": "kube-system"}));
    let rules =
        run(vec![generating("tenant-a", "{{ request.object.metadata.annotations.ns }}")], &object, false, &data);
    assert_eq!(rules[0].1, Status::Error, "{rules:?}");
    assert!(rules[0].2.contains("cannot clone resources from other namespaces"), "{rules:?}");
    let rules =
        run(vec![generating("{{ request.object.metadata.annotations.ns }}", "tenant-a")], &object, false, &data);
    assert_eq!(rules[0].1, Status::Error, "{rules:?}");
    assert!(rules[0].2.contains("cannot generate resources in other namespaces"), "{rules:?}");
    assert!(data.asked_about("kube-system").is_empty(), "asked: {:?}", data.asked());
    let rules = run(vec![generating("tenant-a", "tenant-a")], &object, false, &data);
    assert_eq!(rules[0].1, Status::Pass, "{rules:?}");
    assert_eq!(data.asked(), ["get v1/Secret tenant-a/db"]);
}

#[test]
fn namespaced_cel_policies_read_resources_of_their_namespace_only() {
    let vpol = |expr: &str| {
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": "NamespacedValidatingPolicy",
            "metadata": {"name": "read", "namespace": "tenant-a"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "validations": [{"expression": "false", "messageExpression": expr}]}})
    };
    let object = config_map("tenant-a", json!({}));
    // Another namespace, named in the cluster form: refused, nothing read.
    let data = Cluster::default();
    let rules = run(
        vec![vpol("string(resource.Get('v1', 'secrets', 'kube-system', 'db').data.password)")],
        &object,
        false,
        &data,
    );
    assert!(!rules[0].2.contains("aHVudGVyMg"), "{rules:?}");
    let data2 = Cluster::default();
    run(vec![vpol("string(resource.List('v1', 'secrets', '').items.size())")], &object, false, &data2);
    assert!(
        data.asked_about("cel ").is_empty() && data2.asked_about("cel ").is_empty(),
        "asked: {:?} {:?}",
        data.asked(),
        data2.asked()
    );
    // Kyverno's namespaced forms name no namespace: the policy's.
    let data = Cluster::default();
    let rules = run(
        vec![vpol(
            "resource.Get('v1', 'configmaps', 'cm').metadata.namespace + ' ' + \
             string(resource.List('v1', 'configmaps').items.size()) + ' ' + \
             string(resource.List('v1', 'configmaps', {'a': 'b'}).items.size()) + ' ' + \
             resource.Get(resource.ToGVR('v1', 'ConfigMap'), 'cm').metadata.name",
        )],
        &object,
        false,
        &data,
    );
    assert_eq!(rules[0].2, "tenant-a 1 1 cm", "{rules:?}");
    assert_eq!(
        data.asked_about("cel "),
        [
            "cel get v1/configmaps tenant-a/cm",
            "cel list v1/configmaps in \"tenant-a\"",
            "cel list v1/configmaps in \"tenant-a\"",
            "cel get v1/configmaps tenant-a/cm"
        ]
    );
    // A ValidatingPolicy (cluster-wide) keeps the cluster form.
    let mut cluster = vpol("resource.Get('v1', 'secrets', 'kube-system', 'db').metadata.namespace");
    cluster["kind"] = json!("ValidatingPolicy");
    cluster["metadata"] = json!({"name": "read"});
    let data = Cluster::default();
    let rules = run(vec![cluster], &object, false, &data);
    assert_eq!(rules[0].2, "kube-system", "{rules:?}");
}

#[test]
fn namespaced_and_cluster_policies_in_one_request_each_keep_their_reach() {
    // The CEL variables are kept per request; a cluster policy's host must not serve a
    // namespaced one (nor the reverse).
    let object = config_map("tenant-a", json!({}));
    let cel = |kind: &str, ns: Option<&str>, name: &str| {
        let mut meta = json!({"name": name});
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": kind, "metadata": meta,
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "validations": [{"expression": "false",
                    "messageExpression": "resource.Get('v1', 'secrets', 'kube-system', 'db').metadata.namespace"}]}})
    };
    for order in [false, true] {
        let data = Cluster::default();
        let mut ps = vec![cel("ValidatingPolicy", None, "a"), cel("NamespacedValidatingPolicy", Some("tenant-a"), "b")];
        if order {
            ps.reverse();
        }
        let rules = run(ps, &object, false, &data);
        assert_eq!(data.asked_about("cel "), ["cel get v1/secrets kube-system/db"], "{rules:?}");
    }
}
