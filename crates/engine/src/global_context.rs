//! GlobalContextEntry (`kyverno.io`): what an entry asks to be kept (a Kubernetes resource's
//! objects, or an API call's answer refreshed on an interval), its projections, and Kyverno's
//! checks of the spec, in its words. The cluster side (watches, calls, the store policies read
//! through `globalReference` and `globalContext.Get`) lives in the controller; this module is
//! what both it and the policy validation webhook agree on.

use serde_json::{Map, Value};
use std::time::Duration;
use verno_jmespath::{Env, Expression};

/// Where an entry's data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum GlobalSource {
    /// Every object of a resource (`group` empty: the core group), in one namespace or all.
    Resource { group: String, version: String, resource: String, namespace: String },
    /// An API call, made again every `refresh`, with `retry_limit` attempts each time.
    ApiCall { call: Call, refresh: Duration, retry_limit: u32 },
}

/// One call: a Kubernetes API path or a service URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// `GET` or `POST`.
    pub method: String,
    pub target: CallTarget,
    /// The request body (`apiCall.data`'s key/value pairs as one object), for `POST`.
    pub body: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CallTarget {
    /// A path of the Kubernetes API (`/apis/apps/v1/deployments`).
    Path(String),
    /// An HTTP(S) service: its URL, the PEM CA bundle that verifies it (empty: the system's
    /// roots) and the headers sent.
    Service { url: String, ca_bundle: String, headers: Vec<(String, String)> },
}

/// A named JMESPath query over the entry's data, kept up to date with it.
#[derive(Debug, Clone)]
pub struct Projection {
    pub name: String,
    query: Expression,
}

impl PartialEq for Projection {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.query.source() == other.query.source()
    }
}

impl Projection {
    /// The projection of `data`, or why it failed (Kyverno's words).
    pub fn apply(&self, data: &Value, env: &dyn Env) -> Result<Value, String> {
        self.query
            .search(data, env)
            .map(std::borrow::Cow::into_owned)
            .map_err(|e| format!("failed to apply projection {:?}: {e}", self.name))
    }
}

/// A GlobalContextEntry's spec, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalEntry {
    pub name: String,
    pub source: GlobalSource,
    pub projections: Vec<Projection>,
}

/// The refresh interval Kyverno's CRD gives an API call entry that names none.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(600);
/// The attempts Kyverno's CRD gives an API call entry that names none (`retryLimit`).
pub const DEFAULT_RETRY_LIMIT: u32 = 3;
/// The most projections one entry may have (each is recomputed on every change).
pub const MAX_PROJECTIONS: usize = 64;

impl GlobalEntry {
    /// Reads and checks a GlobalContextEntry object as Kyverno's validation webhook does; every
    /// error in Kubernetes' field-error form, joined as Kubernetes joins them.
    pub fn from_object(obj: &Value) -> Result<GlobalEntry, String> {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let empty = Value::Object(Map::new());
        let spec = obj.get("spec").unwrap_or(&empty);
        let mut errs: Vec<String> = Vec::new();
        let resource = spec.get("kubernetesResource").filter(|v| !v.is_null());
        let api_call = spec.get("apiCall").filter(|v| !v.is_null());
        if resource.is_some() == api_call.is_some() {
            errs.push(
                "spec.kubernetesResource: Forbidden: A global context entry should either have KubernetesResource or APICall"
                    .into(),
            );
        }
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let mut source = None;
        if let (Some(r), None) = (resource, api_call) {
            let (group, version, res) = (s(r, "group"), s(r, "version"), s(r, "resource"));
            if group.is_empty() && version != "v1" {
                errs.push("spec.resource.group: Required value: A Resource entry requires a group".into());
            }
            if version.is_empty() {
                errs.push("spec.resource.version: Required value: A Resource entry requires a version".into());
            }
            if res.is_empty() {
                errs.push("spec.resource.resource: Required value: A Resource entry requires a resource".into());
            }
            source = Some(GlobalSource::Resource { group, version, resource: res, namespace: s(r, "namespace") });
        }
        if let (Some(a), None) = (api_call, resource) {
            let refresh = match a.get("refreshInterval").and_then(Value::as_str) {
                None => Some(DEFAULT_REFRESH),
                Some(text) => verno_jmespath::duration::parse(text)
                    .filter(|ns| *ns >= 0)
                    .map(|ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0))),
            };
            let refresh = match refresh {
                Some(d) if !d.is_zero() => d,
                _ => {
                    errs.push("spec.apiCall.refreshIntervalSeconds: Required value: A Resource entry requires a refresh interval greater than 0 seconds".into());
                    DEFAULT_REFRESH
                }
            };
            let url_path = s(a, "urlPath");
            let service = a.get("service").filter(|v| v.is_object());
            if service.is_none() == url_path.is_empty() {
                errs.push(
                    "spec.apiCall.service: Forbidden: An External API call should either have Service or URLPath"
                        .into(),
                );
            }
            let method = match s(a, "method") {
                m if m.is_empty() => "GET".to_string(),
                m => m,
            };
            let data = a.get("data").filter(|v| !v.is_null());
            if data.is_some() && method != "POST" {
                errs.push(
                    "spec.apiCall.method: Forbidden: An External API call with data should have method as POST".into(),
                );
            }
            if method != "GET" && method != "POST" {
                errs.push(format!(
                    "spec.apiCall.method: Unsupported value: {method:?}: supported values: \"GET\", \"POST\""
                ));
            }
            let body = data.map(|d| crate::context_entry::request_body(d.clone()));
            let target = match service {
                Some(svc) => CallTarget::Service {
                    url: s(svc, "url"),
                    ca_bundle: s(svc, "caBundle"),
                    headers: svc
                        .get("headers")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|h| (s(h, "key"), s(h, "value")))
                        .collect(),
                },
                None => CallTarget::Path(url_path),
            };
            let retry_limit = a
                .get("retryLimit")
                .and_then(Value::as_u64)
                .map_or(DEFAULT_RETRY_LIMIT, |n| u32::try_from(n).unwrap_or(u32::MAX));
            source = Some(GlobalSource::ApiCall { call: Call { method, target, body }, refresh, retry_limit });
        }
        let listed = spec.get("projections").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
        if listed.len() > MAX_PROJECTIONS {
            errs.push(format!(
                "spec.projections: Too many: {}: must have at most {MAX_PROJECTIONS} items",
                listed.len()
            ));
        }
        let mut projections = Vec::new();
        for (i, p) in listed.iter().enumerate().take(MAX_PROJECTIONS) {
            let (pname, jp) = (s(p, "name"), s(p, "jmesPath"));
            let at = format!("spec.projections[{i}]");
            if pname.is_empty() {
                errs.push(format!("{at}.name: Required value: A projection entry requires a name"));
            }
            if pname == name {
                errs.push(format!(
                    "{at}.name: Required value: A projection entry requires a name different from the global context entry name"
                ));
            }
            if jp.is_empty() {
                errs.push(format!("{at}.jmesPath: Required value: A projection entry requires a JMESPath"));
            }
            match Expression::compile(&jp) {
                Ok(query) => projections.push(Projection { name: pname, query }),
                Err(e) if !jp.is_empty() => errs.push(format!("{at}.jmesPath: Invalid value: {jp:?}: {e}")),
                Err(_) => {}
            }
        }
        match (errs.len(), source) {
            (0, Some(source)) => Ok(GlobalEntry { name, source, projections }),
            (1, _) => Err(errs.remove(0)),
            _ => Err(format!("[{}]", errs.join(", "))),
        }
    }
}

/// A `globalReference.name`: the entry, and after its first dot the projection (empty: the
/// entry's whole data), as Kyverno splits it.
pub fn split_reference(name: &str) -> (&str, &str) {
    let mut parts = name.split('.');
    let entry = parts.next().unwrap_or("");
    (entry, parts.next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

    use super::*;
    use serde_json::json;

    fn entry(spec: Value) -> Result<GlobalEntry, String> {
        GlobalEntry::from_object(&json!({"metadata": {"name": "e"}, "spec": spec}))
    }

    #[test]
    fn a_resource_entry_reads_its_group_version_and_namespace() {
        let e = entry(json!({"kubernetesResource": {"group": "apps", "version": "v1", "resource": "deployments", "namespace": "ns"}}))
            .unwrap();
        assert_eq!(
            e.source,
            GlobalSource::Resource {
                group: "apps".into(),
                version: "v1".into(),
                resource: "deployments".into(),
                namespace: "ns".into()
            }
        );
        // The core group needs no group.
        entry(json!({"kubernetesResource": {"version": "v1", "resource": "pods"}})).unwrap();
    }

    #[test]
    fn kyvernos_checks_in_its_words() {
        let e = entry(json!({"apiCall": {"service": {"url": "http://x"}, "method": "GET", "data": [{"key": "a", "value": 1}], "refreshInterval": "10s"}}))
            .unwrap_err();
        assert_eq!(e, "spec.apiCall.method: Forbidden: An External API call with data should have method as POST");
        let e = entry(json!({})).unwrap_err();
        assert_eq!(
            e,
            "spec.kubernetesResource: Forbidden: A global context entry should either have KubernetesResource or APICall"
        );
        let e = entry(json!({"kubernetesResource": {"version": "v2", "resource": "x"}})).unwrap_err();
        assert_eq!(e, "spec.resource.group: Required value: A Resource entry requires a group");
        let e = entry(
            json!({"apiCall": {"urlPath": "/api/v1/pods", "service": {"url": "http://x"}, "refreshInterval": "0s"}}),
        )
        .unwrap_err();
        assert!(e.starts_with("[spec.apiCall.refreshIntervalSeconds: Required value"), "{e}");
        assert!(
            e.contains("spec.apiCall.service: Forbidden: An External API call should either have Service or URLPath")
        );
        let e = entry(json!({"kubernetesResource": {"version": "v1", "resource": "pods"}, "projections": [{"name": "e", "jmesPath": "[?"}]}))
            .unwrap_err();
        assert!(
            e.contains("spec.projections[0].name: Required value: A projection entry requires a name different"),
            "{e}"
        );
        assert!(e.contains("spec.projections[0].jmesPath: Invalid value: \"[?\""), "{e}");
    }

    #[test]
    fn an_api_call_entry_takes_kyvernos_defaults_and_builds_its_body() {
        let e = entry(json!({"apiCall": {"urlPath": "/api/v1/namespaces"}})).unwrap();
        let GlobalSource::ApiCall { call, refresh, retry_limit } = e.source else { panic!() };
        assert_eq!((refresh, retry_limit), (DEFAULT_REFRESH, DEFAULT_RETRY_LIMIT));
        assert_eq!(
            call,
            Call { method: "GET".into(), target: CallTarget::Path("/api/v1/namespaces".into()), body: None }
        );
        let e = entry(json!({"apiCall": {"service": {"url": "https://svc", "headers": [{"key": "X", "value": "y"}]}, "method": "POST", "data": [{"key": "a", "value": {"b": 1}}], "refreshInterval": "1m30s"}}))
            .unwrap();
        let GlobalSource::ApiCall { call, refresh, .. } = e.source else { panic!() };
        assert_eq!(refresh, Duration::from_secs(90));
        assert_eq!(call.body, Some(json!({"a": {"b": 1}})));
        assert_eq!(
            call.target,
            CallTarget::Service {
                url: "https://svc".into(),
                ca_bundle: String::new(),
                headers: vec![("X".into(), "y".into())]
            }
        );
    }

    #[test]
    fn projections_apply_and_references_split_at_the_first_dot() {
        let e = entry(json!({"kubernetesResource": {"version": "v1", "resource": "pods"}, "projections": [{"name": "n", "jmesPath": "length(@)"}]}))
            .unwrap();
        assert_eq!(e.projections[0].apply(&json!([1, 2]), &verno_jmespath::NoEnv).unwrap(), json!(2));
        assert_eq!(split_reference("entry.proj"), ("entry", "proj"));
        assert_eq!(split_reference("entry"), ("entry", ""));
        assert_eq!(split_reference("a.b.c"), ("a", "b"));
    }
}
