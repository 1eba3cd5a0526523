//! The CLI's answers to the engine's data port: values files, `clusterResources` as a tiny fake
//! cluster for `configMap` / `apiCall`, `apiCallResponses` mocks and `globalContextEntries`.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use verno_api::Values;
use verno_engine::{Data, Loaded};

#[derive(Default)]
pub struct CliData {
    pub values: Values,
    /// Objects of the fake cluster (`clusterResources`); `None` when the test gives none.
    pub cluster: Option<Vec<Value>>,
    pub api_mocks: Vec<Value>,
    pub global_entries: Vec<Value>,
    /// `targetResources`: the objects mutate-existing rules may patch.
    pub targets: Vec<Value>,
    /// `cloneSourceResource` files: objects generate rules may clone.
    pub clone_sources: Vec<Value>,
}

fn str_at<'v>(v: &'v Value, p: &str) -> &'v str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Kind, apiVersion (when given) and namespace (when given) select an object.
fn selects(o: &Value, api_version: &str, kind: &str, namespace: &str) -> bool {
    str_at(o, "/kind") == kind && (api_version.is_empty() || str_at(o, "/apiVersion") == api_version) && (namespace.is_empty() || str_at(o, "/metadata/namespace") == namespace)
}

impl CliData {
    fn policy_values(&self, policy: &str) -> Option<&verno_api::cli::PolicyValues> {
        self.values.policies.iter().find(|p| p.name == policy)
    }

    /// Values for a policy × resource (`policies[].resources[].values`).
    pub fn resource_values(&self, policy: &str, resource: &str) -> Vec<(String, Value)> {
        self.policy_values(policy)
            .and_then(|p| p.resources.iter().find(|r| r.name == resource))
            .map(|r| r.values.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Namespace labels from `namespaceSelector` entries and `namespaces` objects.
    pub fn namespace_labels(&self, ns: &str) -> Option<BTreeMap<String, String>> {
        if let Some(s) = self.values.namespace_selector.iter().find(|s| s.name == ns) {
            return Some(s.labels.clone());
        }
        for n in &self.values.namespaces {
            if n.pointer("/metadata/name").and_then(Value::as_str) == Some(ns) {
                return Some(verno_engine::matching::labels_of(n));
            }
        }
        None
    }
}

use verno_engine::matching::plural;

impl Data for CliData {
    fn rule_values(&self, policy: &str, rule: &str) -> Vec<(String, Value)> {
        self.policy_values(policy)
            .and_then(|p| p.rules.iter().find(|r| r.name == rule))
            .map(|r| r.values.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    fn foreach_values(&self, policy: &str, rule: &str) -> BTreeMap<String, Vec<Value>> {
        self.policy_values(policy)
            .and_then(|p| p.rules.iter().find(|r| r.name == rule))
            .map(|r| r.foreach_values.clone())
            .unwrap_or_default()
    }

    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        let Some(cluster) = &self.cluster else { return Loaded::Unavailable };
        for o in cluster {
            if o.get("kind").and_then(Value::as_str) == Some("ConfigMap")
                && o.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                && o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default") == namespace
            {
                return Loaded::Value(json!({"data": o.get("data").cloned().unwrap_or(json!({})), "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}));
            }
        }
        Loaded::Error(format!("configmaps \"{name}\" not found"))
    }

    fn api_call(&self, method: &str, url_path: &str, _data: Option<&Value>) -> Loaded {
        for m in &self.api_mocks {
            let url = m.get("urlPath").or_else(|| m.get("url")).and_then(Value::as_str).unwrap_or("");
            let mm = m.get("method").and_then(Value::as_str).unwrap_or("GET");
            if url == url_path && mm.eq_ignore_ascii_case(method) {
                let body = m.pointer("/response/body").cloned().unwrap_or(Value::Null);
                let body = match body {
                    Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                    other => other,
                };
                return Loaded::Value(body);
            }
        }
        if url_path.starts_with("http://") || url_path.starts_with("https://") {
            // External services are only answered from `apiCallResponses`.
            return Loaded::Unavailable;
        }
        let Some(cluster) = &self.cluster else { return Loaded::Unavailable };
        // /api/v1[/namespaces/NS]/PLURAL[/NAME] or /apis/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME]
        let path = url_path.split('?').next().unwrap_or("");
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (api_version, rest) = match segs.as_slice() {
            ["api", v, rest @ ..] => ((*v).to_string(), rest.to_vec()),
            ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest.to_vec()),
            _ => return Loaded::Error(format!("unsupported API path {url_path}")),
        };
        let (ns, rest) = match rest.as_slice() {
            ["namespaces", ns, r @ ..] if !r.is_empty() => (Some((*ns).to_string()), r.to_vec()),
            r => (None, r.to_vec()),
        };
        let (res, name) = match rest.as_slice() {
            [res] => ((*res).to_string(), None),
            [res, name] => ((*res).to_string(), Some((*name).to_string())),
            _ => return Loaded::Error(format!("unsupported API path {url_path}")),
        };
        let items: Vec<Value> = cluster
            .iter()
            .filter(|o| o.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str()))
            .filter(|o| plural(o.get("kind").and_then(Value::as_str).unwrap_or("")) == res)
            .filter(|o| ns.as_ref().is_none_or(|n| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(n.as_str())))
            .cloned()
            .collect();
        match name {
            Some(n) => match items.into_iter().find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(n.as_str())) {
                Some(o) => Loaded::Value(o),
                None => Loaded::Error(format!("{res} \"{n}\" not found")),
            },
            None => Loaded::Value(json!({"apiVersion": api_version, "kind": "List", "items": items, "metadata": {}})),
        }
    }

    fn namespace_object(&self, name: &str) -> Option<Value> {
        let by_name = |o: &&Value| crate::load::kind(o) == "Namespace" && o.pointer("/metadata/name").and_then(Value::as_str) == Some(name);
        if let Some(n) = self.values.namespaces.iter().find(by_name) {
            return Some(n.clone());
        }
        if let Some(n) = self.cluster.iter().flatten().find(by_name) {
            return Some(n.clone());
        }
        // A namespace known only by its labels (`namespaceSelector` values).
        self.namespace_labels(name).map(|labels| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}))
    }

    fn resource(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.clone_sources
            .iter()
            .chain(self.cluster.iter().flatten())
            .find(|o| selects(o, api_version, kind, "") && str_at(o, "/metadata/namespace") == namespace && str_at(o, "/metadata/name") == name)
            .cloned()
    }

    fn list(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.clone_sources.iter().chain(self.cluster.iter().flatten()).filter(|o| selects(o, api_version, kind, namespace)).cloned().collect()
    }

    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.targets.iter().chain(self.cluster.iter().flatten()).filter(|o| selects(o, api_version, kind, namespace)).cloned().collect()
    }

    fn global_reference(&self, name: &str) -> Loaded {
        for g in &self.global_entries {
            if g.get("name").and_then(Value::as_str) == Some(name) {
                if let Some(d) = g.get("data") {
                    return Loaded::Value(d.clone());
                }
                if let Some(r) = g.get("resources") {
                    return Loaded::Value(r.clone());
                }
            }
        }
        Loaded::Unavailable
    }
}
