//! The CLI's answers to the engine's data port: values files, `clusterResources` as a tiny fake
//! cluster for `configMap` / `apiCall`, `apiCallResponses` mocks and `globalContextEntries`.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use verno_api::Values;
use verno_engine::{
    Asker, Data, Loaded, NamespaceView, Operation, PolicyResponse, PolicySet, Request, RequestUser, Scope, UserInfoRef,
};

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
    /// Image metadata from the test's context file (`spec.images`).
    pub images: Vec<Value>,
    /// The Kyverno CEL libraries' view of all of the above, built once by [`CliData::build_cel_host`].
    pub cel_host: Option<Arc<dyn verno_cel::Host>>,
    /// The registry client of `verifyImages` rules, started on first use (as Kyverno's CLI, it
    /// talks to the real registries and keeps no cache).
    pub registry: std::sync::OnceLock<Option<Arc<verno_images::Verifier>>>,
}

/// A snapshot of the test's data for the Kyverno CEL libraries.
struct CliHost {
    objects: Vec<Value>,
    api_mocks: Vec<Value>,
    global_entries: Vec<Value>,
    images: Vec<Value>,
    now: Option<i64>,
}

impl CliHost {
    /// Objects of a resource (plural, any case) and apiVersion (empty: any).
    fn of<'a>(&'a self, api_version: &'a str, resource: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        let resource = resource.to_lowercase();
        self.objects.iter().filter(move |o| {
            let kind = str_at(o, "/kind");
            (verno_engine::plural(kind) == resource || kind.to_lowercase() == resource)
                && (api_version.is_empty() || str_at(o, "/apiVersion") == api_version)
        })
    }
}

impl verno_cel::Host for CliHost {
    fn resource_get(
        &self,
        api_version: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, verno_cel::HostError> {
        // Not given: it does not exist, which Kyverno's resource library answers `null`.
        Ok(self
            .of(api_version, resource)
            .find(|o| str_at(o, "/metadata/name") == name && str_at(o, "/metadata/namespace") == namespace)
            .cloned()
            .unwrap_or(Value::Null))
    }

    fn resource_list(
        &self,
        api_version: &str,
        resource: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, verno_cel::HostError> {
        Ok(self
            .of(api_version, resource)
            .filter(|o| namespace.is_empty() || str_at(o, "/metadata/namespace") == namespace)
            .cloned()
            .collect())
    }

    fn http(&self, call: &verno_cel::HttpCall<'_>) -> Result<Value, verno_cel::HostError> {
        let (method, url) = (call.method, call.url);
        find_mock(&self.api_mocks, method, url)
            .map(|m| m.get("response").cloned().unwrap_or(Value::Null))
            .ok_or_else(|| verno_cel::HostError::Unavailable(format!("no apiCallResponses entry for {method} {url}")))
    }

    fn global_context(&self, name: &str, projection: &str) -> Result<Value, verno_cel::HostError> {
        let entry = self
            .global_entries
            .iter()
            .find(|g| g.get("name").and_then(Value::as_str) == Some(name))
            .ok_or_else(|| verno_cel::HostError::Unavailable(format!("global context entry {name:?} not found")))?;
        let value = project(entry).map_err(verno_cel::HostError::Failed)?;
        if projection.is_empty() {
            return Ok(value);
        }
        value.get(projection).cloned().ok_or_else(|| {
            verno_cel::HostError::Unavailable(format!("global context entry {name:?} has no projection {projection:?}"))
        })
    }

    fn image_metadata(&self, reference: &str) -> Result<Value, verno_cel::HostError> {
        let norm = norm_image(reference);
        self.images
            .iter()
            .find(|i| {
                let r = str_at(i, "/image");
                r == reference || norm_image(r) == norm
            })
            .cloned()
            .ok_or_else(|| {
                verno_cel::HostError::Unavailable(format!("no metadata for image {reference:?} in the test's context"))
            })
    }

    fn now(&self) -> Option<i64> {
        self.now
    }

    fn random_seed(&self) -> Option<u64> {
        verno_jmespath::Env::random_seed(&CliEnv)
    }
}

/// The `apiCallResponses` entry for a call (`urlPath` or `url`, method `GET` by default).
fn find_mock<'a>(mocks: &'a [Value], method: &str, url: &str) -> Option<&'a Value> {
    mocks.iter().find(|m| {
        let u = m.get("urlPath").or_else(|| m.get("url")).and_then(Value::as_str).unwrap_or("");
        u == url && m.get("method").and_then(Value::as_str).unwrap_or("GET").eq_ignore_ascii_case(method)
    })
}

/// An image reference in full (`nginx` is `docker.io/nginx:latest`), to match references that
/// spell the same image differently.
fn norm_image(r: &str) -> String {
    verno_engine::image_info(r, "")
        .and_then(|i| i.get("reference").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| r.to_string())
}

/// A global context entry's value: its data (or resources), with its projections applied when
/// it has any (`{projection name: JMESPath result}`), as Kyverno exposes them. The error is the
/// projection's message (JMESPath's, in Kyverno's words), handed on as a `HostError::Failed`.
fn project(entry: &Value) -> Result<Value, String> {
    let data = entry.get("data").or_else(|| entry.get("resources")).cloned().unwrap_or(Value::Null);
    let Some(projections) = entry.get("projections").and_then(Value::as_array).filter(|p| !p.is_empty()) else {
        return Ok(data);
    };
    let mut out = serde_json::Map::new();
    for p in projections {
        let name = p.get("name").and_then(Value::as_str).unwrap_or("");
        let path = p.get("jmesPath").or_else(|| p.get("path")).and_then(Value::as_str).unwrap_or("@");
        out.insert(
            name.to_string(),
            verno_jmespath::search(path, &data).map_err(|e| format!("projection {name}: {e}"))?,
        );
    }
    Ok(Value::Object(out))
}

fn str_at<'v>(v: &'v Value, p: &str) -> &'v str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Kind, apiVersion (when given) and namespace (when given) select an object.
fn selects(o: &Value, api_version: &str, kind: &str, namespace: &str) -> bool {
    (kind.is_empty() || str_at(o, "/kind") == kind)
        && (api_version.is_empty() || str_at(o, "/apiVersion") == api_version)
        && (namespace.is_empty() || str_at(o, "/metadata/namespace") == namespace)
}

impl CliData {
    /// Snapshots the data for the Kyverno CEL libraries; call once everything is loaded.
    pub fn build_cel_host(&mut self) {
        // `targetResources` too: a MutatingPolicy's target expression reads them with
        // `resource.Get`, as Kyverno's CLI registers them with its fake cluster.
        let objects: Vec<Value> =
            self.clone_sources.iter().chain(self.cluster.iter().flatten()).chain(&self.targets).cloned().collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_secs()).ok());
        self.cel_host = Some(Arc::new(CliHost {
            objects,
            api_mocks: self.api_mocks.clone(),
            global_entries: self.global_entries.clone(),
            images: self.images.clone(),
            now,
        }));
    }

    fn policy_values(&self, policy: &str) -> Option<&verno_api::cli::PolicyValues> {
        self.values.policies.iter().find(|p| p.name == policy)
    }
}

use verno_engine::plural;

impl Data for CliData {
    fn image_verifier(&self) -> Option<Arc<dyn verno_engine::verify_images::ImageVerifier>> {
        self.registry
            .get_or_init(|| match verno_images::Verifier::new() {
                Ok(v) => Some(Arc::new(v)),
                Err(e) => {
                    tracing::warn!("image verification is not available: {e}");
                    None
                }
            })
            .clone()
            .map(|v| v as Arc<dyn verno_engine::verify_images::ImageVerifier>)
    }

    fn resource_values(&self, policy: &str, resource: &str) -> Vec<(String, Value)> {
        self.policy_values(policy)
            .and_then(|p| p.resources.iter().find(|r| r.name == resource))
            .map(|r| r.values.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Namespace labels from `namespaceSelector` entries and `namespaces` objects.
    /// A namespace's labels as the values give them: `namespaces` first (Kyverno gives them
    /// precedence), then `namespaceSelector`.
    fn namespace_labels(&self, ns: &str) -> Option<BTreeMap<String, String>> {
        for n in &self.values.namespaces {
            if n.pointer("/metadata/name").and_then(Value::as_str) == Some(ns) {
                return Some(verno_engine::labels_of(n));
            }
        }
        if let Some(s) = self.values.namespace_selector.iter().find(|s| s.name == ns) {
            return Some(s.labels.clone());
        }
        None
    }

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
                return Loaded::Value(
                    json!({"data": o.get("data").cloned().unwrap_or(json!({})), "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}),
                );
            }
        }
        Loaded::Error(format!("configmaps \"{name}\" not found"))
    }

    fn api_call(&self, method: &str, url_path: &str, _data: Option<&Value>) -> Loaded {
        if let Some(m) = find_mock(&self.api_mocks, method, url_path) {
            let body = m.pointer("/response/body").cloned().unwrap_or(Value::Null);
            let body = match body {
                Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                other => other,
            };
            return Loaded::Value(body);
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
            .filter(|o| {
                ns.as_ref().is_none_or(|n| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(n.as_str()))
            })
            .cloned()
            .collect();
        match name {
            Some(n) => match items
                .into_iter()
                .find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(n.as_str()))
            {
                Some(o) => Loaded::Value(o),
                None => Loaded::Error(format!("{res} \"{n}\" not found")),
            },
            None => Loaded::Value(json!({"apiVersion": api_version, "kind": "List", "items": items, "metadata": {}})),
        }
    }

    /// Kyverno's CLI: `validate.cel` sees a Namespace with only the request's namespace name,
    /// the admission policies one with the name and the labels the values give it, and the
    /// `policies.kyverno.io` kinds only a namespace the values describe (null otherwise).
    fn namespace_object_as(&self, view: NamespaceView, name: &str) -> Option<Value> {
        match view {
            NamespaceView::Rule => Some(NamespaceView::made_up(name, None)),
            NamespaceView::ValidatingAdmission | NamespaceView::MutatingAdmission => {
                Some(NamespaceView::made_up(name, self.namespace_labels(name).as_ref()))
            }
            NamespaceView::Policy => {
                let named = |o: &&Value| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name);
                if let Some(n) = self.values.namespaces.iter().find(named) {
                    return Some(n.clone());
                }
                let s = self.values.namespace_selector.iter().find(|s| s.name == name)?;
                Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": s.labels}}))
            }
        }
    }

    fn resource(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.clone_sources
            .iter()
            .chain(self.cluster.iter().flatten())
            .find(|o| {
                selects(o, api_version, kind, "")
                    && str_at(o, "/metadata/namespace") == namespace
                    && str_at(o, "/metadata/name") == name
            })
            .cloned()
    }

    fn list(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.clone_sources
            .iter()
            .chain(self.cluster.iter().flatten())
            .filter(|o| selects(o, api_version, kind, namespace))
            .cloned()
            .collect()
    }

    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.targets
            .iter()
            .chain(self.cluster.iter().flatten())
            .filter(|o| selects(o, api_version, kind, namespace))
            .cloned()
            .collect()
    }

    fn global_reference(&self, name: &str) -> Loaded {
        match self.global_entries.iter().find(|g| g.get("name").and_then(Value::as_str) == Some(name)) {
            Some(g) if g.get("data").is_some() || g.get("resources").is_some() => match project(g) {
                Ok(v) => Loaded::Value(v),
                Err(e) => Loaded::Error(e),
            },
            _ => Loaded::Unavailable,
        }
    }

    fn cel_host(&self) -> Option<Arc<dyn verno_cel::Host>> {
        self.cel_host.clone()
    }
}

/// The clock, DNS and randomness the CLI offers to JMESPath functions.
pub struct CliEnv;

impl verno_jmespath::Env for CliEnv {
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Local::now().fixed_offset())
    }
    fn random_seed(&self) -> Option<u64> {
        use std::hash::{BuildHasher, Hasher};
        // A fresh randomly keyed hasher per call: random enough for `random()`, no extra crate.
        Some(std::collections::hash_map::RandomState::new().build_hasher().finish())
    }
    fn resolve_host(&self, host: &str) -> Option<Vec<std::net::IpAddr>> {
        use std::net::ToSocketAddrs;
        (host, 80).to_socket_addrs().ok().map(|it| it.map(|a| a.ip()).collect())
    }
}

/// How `verno test` and `verno apply` put a resource to the engine: the request Kyverno's CLI
/// makes of it (the operation from values, the user from the user-info file, `--set` and
/// global values), evaluated by [`PolicySet::evaluate`] with every phase.
pub struct Requests<'a> {
    pub set: &'a PolicySet,
    pub data: &'a CliData,
    pub user: Option<&'a (RequestUser, Value)>,
    /// `--set` and global values, applied to every request.
    pub globals: &'a [(String, Value)],
}

fn resource_name(r: &Value) -> &str {
    r.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

impl Requests<'_> {
    /// Every policy's response to one resource under one operation, in policy order.
    pub fn run(&self, resource: &Value, operation: &str) -> Vec<PolicyResponse> {
        self.run_as(resource, operation, None)
    }

    /// [`Requests::run`] for a payload that is not a Kubernetes object (an Envoy
    /// `CheckRequest`): `kind` says what it is, for matching.
    pub fn run_as(
        &self,
        resource: &Value,
        operation: &str,
        kind: Option<&verno_api::admission::GroupVersionKind>,
    ) -> Vec<PolicyResponse> {
        // Values files are checked when read (`load::parse_values`), and test entries
        // (`test_cmd`): the operation is one of the four.
        let op = Operation::parse(operation).unwrap_or_default();
        // DELETE is about the old object; UPDATE compares the resource with itself.
        let (object, old): (&Value, Option<&Value>) = match op {
            Operation::Delete => (&Value::Null, Some(resource)),
            Operation::Update => (resource, Some(resource)),
            Operation::Create | Operation::Connect => (resource, None),
        };
        let globals: Vec<(String, Value)> =
            self.globals.iter().filter(|(k, _)| k != "request.operation").cloned().collect();
        let req = Request {
            operation: op,
            object,
            old_object: old,
            asker: self
                .user
                .map(|(user, info)| Asker { user: Some(user), info: UserInfoRef::Json(info) })
                .unwrap_or_default(),
            namespace_labels: None,
            subresource: "",
            kind,
            variables: &globals,
            existing: true,
            dry_run: false,
        };
        self.set.evaluate(&req, Scope::ALL, &CliEnv, self.data, &mut ()).into_responses()
    }

    /// The operation for a resource: `request.operation` from per-resource values, then globals.
    pub fn operation_for(&self, policy: Option<&str>, resource: &Value) -> String {
        if let Some(p) = policy
            && let Some((_, v)) = self
                .data
                .resource_values(p, resource_name(resource))
                .into_iter()
                .find(|(k, _)| k == "request.operation")
            && let Some(s) = v.as_str()
        {
            return s.to_string();
        }
        self.globals
            .iter()
            .find(|(k, _)| k == "request.operation")
            .and_then(|(_, v)| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "CREATE".into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A false deny: an object the test does not hold does not exist, and Kyverno's
    /// resource library answers `null` for it — `resource.Get(…) != null` asks whether it does.
    #[test]
    fn resource_get_of_an_object_not_given_is_null() {
        let host = CliHost {
            objects: vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cfg", "namespace": "default"}})],
            api_mocks: Vec::new(),
            global_entries: Vec::new(),
            images: Vec::new(),
            now: None,
        };
        use verno_cel::Host as _;
        assert_eq!(host.resource_get("v1", "configmaps", "default", "nope"), Ok(Value::Null));
        assert!(host.resource_get("v1", "configmaps", "default", "cfg").unwrap().is_object());
    }
}
