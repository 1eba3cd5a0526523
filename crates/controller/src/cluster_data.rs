//! The engine's data port in a cluster: `configMap` context entries and `apiCall`s to the
//! Kubernetes API read the API server, as Verno's own ServiceAccount.
//!
//! The engine is synchronous and runs on the server's blocking pool, so each read blocks that
//! thread on the runtime (`Handle::block_on`) for at most [`TIMEOUT`]; the admission deadline
//! and the evaluation slots bound how many wait at once. Responses are read as they stream in
//! and refused past [`MAX_BYTES`] (Kyverno caps only its service calls, at 2 MB; the API
//! server's answers it reads whole — a lower limit here could refuse lists Kyverno reads).
//! ConfigMaps labelled `cache.kyverno.io/enabled` are answered from a reflector store
//! fed by a label-selected watch (as Kyverno's informer-based resolver); any other ConfigMap
//! is read from the API server each time, as Kyverno's client-based resolver does.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, Subject};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use verno_cel::HostError;
use verno_engine::{Data, Loaded};

/// The longest one read may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest response accepted.
pub const MAX_BYTES: usize = 16 << 20;

/// The label that puts a ConfigMap in the cache (Kyverno's `LabelCacheEnabled`; any value).
pub const CACHE_LABEL: &str = "cache.kyverno.io/enabled";

/// A name that cannot be one segment of an API path (see [`segment`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not a name the Kubernetes API can be asked for")]
pub struct BadName {
    pub name: String,
}

/// Why a call to the Kubernetes API ([`fetch`]) failed. The texts reach policies' context
/// errors (Kyverno shows the API server's message as it is).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A method other than GET and POST (Kyverno's CRD allows no other).
    #[error("{method} {path}: only GET and POST calls are made")]
    Method { method: String, path: String },
    /// The request could not be built (the path is not a URI).
    #[error("{method} {path}: {source}")]
    Request {
        method: String,
        path: String,
        #[source]
        source: http::Error,
    },
    /// No answer within [`TIMEOUT`].
    #[error("{method} {path}: no answer within {} s", TIMEOUT.as_secs())]
    Timeout { method: String, path: String },
    /// The API server refused the call (its message shown) or could not be reached.
    #[error("{}", kube_message(.0))]
    Kube(#[source] kube::Error),
    /// The answer is over the response limit.
    #[error("{method} {path}: the response is over the limit of {max} bytes")]
    TooLarge { method: String, path: String, max: usize },
    #[error("{method} {path}: the response is not JSON: {source}")]
    NotJson {
        method: String,
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl FetchError {
    /// Whether the API server answered 404 (no such object).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FetchError::Kube(kube::Error::Api(s)) if s.code == 404)
    }
}

/// An API error's message as the server wrote it; any other client error in its own words.
fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// What a `configMap` context entry sees of a ConfigMap: its `data` and `metadata`.
fn context_value(cm: &Value) -> Value {
    json!({
        "data": cm.get("data").cloned().unwrap_or(json!({})),
        "metadata": cm.get("metadata").cloned().unwrap_or(json!({})),
    })
}

#[derive(Clone)]
pub struct ClusterData {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
    /// Verifies `verifyImages` rules against registries (admission only).
    images: Option<Arc<verno_images::Verifier>>,
    /// ConfigMaps labelled [`CACHE_LABEL`], when the cache is on.
    config_maps: Option<Store<ConfigMap>>,
    /// The largest response accepted ([`MAX_BYTES`] unless set).
    max_bytes: usize,
    /// RoleBindings and ClusterRoleBindings, for the requesting user's roles.
    bindings: Option<(Store<RoleBinding>, Store<ClusterRoleBinding>)>,
    /// The GlobalContextEntries' data.
    global: Option<Arc<crate::global_context::GlobalStore>>,
    /// Namespaces as the namespace watch holds them (labels of any namespace).
    namespaces: Option<Arc<verno_engine::LiveNamespaces>>,
    /// Where CEL's `http.*` may go.
    http: Arc<crate::cel_http::HttpRules>,
}

impl ClusterData {
    /// Reads through `client`; must be created inside the runtime whose threads it will block.
    pub fn new(client: kube::Client) -> ClusterData {
        ClusterData {
            client,
            runtime: tokio::runtime::Handle::current(),
            images: None,
            config_maps: None,
            max_bytes: MAX_BYTES,
            bindings: None,
            global: None,
            namespaces: None,
            http: Arc::default(),
        }
    }

    /// Reads as another identity (the background and cleanup controllers read as the accounts
    /// they act as), with the same global context entries and response limit; ConfigMaps are
    /// read from the API server as that identity.
    pub fn acting_as(&self, client: kube::Client) -> ClusterData {
        ClusterData {
            global: self.global.clone(),
            namespaces: self.namespaces.clone(),
            max_bytes: self.max_bytes,
            http: self.http.clone(),
            ..ClusterData::new(client)
        }
    }

    /// Works out requesting users' Roles and ClusterRoles from the bindings these stores hold.
    pub fn with_bindings(mut self, roles: Store<RoleBinding>, cluster_roles: Store<ClusterRoleBinding>) -> ClusterData {
        self.bindings = Some((roles, cluster_roles));
        self
    }

    /// Refuses responses over `bytes` (read no further than that).
    pub fn with_max_response_bytes(mut self, bytes: usize) -> ClusterData {
        self.max_bytes = bytes.max(1);
        self
    }

    /// Answers `configMap` entries for the ConfigMaps `cache` holds from it.
    pub fn with_config_map_cache(mut self, cache: Store<ConfigMap>) -> ClusterData {
        self.config_maps = Some(cache);
        self
    }

    /// Adds image verification: registry credentials and `keys.secret` are read from Secrets
    /// (a Secret named without a namespace lives in Verno's `namespace`), passes are cached
    /// for `cache` (TTL, entries) when set.
    pub fn with_image_verifier(mut self, namespace: &str, cache: Option<(Duration, usize)>) -> ClusterData {
        let reader_data = self.clone();
        let own = namespace.to_string();
        let reader: verno_images::SecretReader = Arc::new(move |ns: &str, name: &str| {
            let ns = if ns.is_empty() { own.as_str() } else { ns };
            // `SecretReader` (verno_images) fixes its error as the message text.
            segment(ns, false).and_then(|()| segment(name, false)).map_err(|e| e.to_string())?;
            reader_data.call("GET", &format!("/api/v1/namespaces/{ns}/secrets/{name}"), None).map_err(|e| e.to_string())
        });
        match verno_images::Verifier::on(self.runtime.clone()) {
            Ok(v) => {
                let v = v.with_secrets(reader);
                let v = match cache {
                    Some((ttl, size)) => v.with_cache(verno_images::Cache::new(ttl, size)),
                    None => v,
                };
                self.images = Some(Arc::new(v));
            }
            Err(e) => tracing::warn!(error = %e, "image verification is not available"),
        }
        self
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, FetchError> {
        self.runtime.block_on(fetch(&self.client, method, path, body, self.max_bytes))
    }

    /// The client reads go through (global context entries call the API with it).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Answers namespaces' labels (a mutate-existing target's `namespaceSelector`) from the
    /// namespace watch.
    pub fn with_namespaces(mut self, live: Arc<verno_engine::LiveNamespaces>) -> ClusterData {
        self.namespaces = Some(live);
        self
    }

    /// CEL's `http.*` goes where `rules` allow (Kyverno's default blocklist unless set).
    pub fn with_http_rules(mut self, rules: Arc<crate::cel_http::HttpRules>) -> ClusterData {
        self.http = rules;
        self
    }

    /// Answers `globalReference` context entries and `globalContext.Get` from `store`.
    pub fn with_global_context(mut self, store: Arc<crate::global_context::GlobalStore>) -> ClusterData {
        self.global = Some(store);
        self
    }
}

/// One call to the Kubernetes API (`GET` or `POST` of `path`), bounded by [`TIMEOUT`] and
/// `max` bytes; a 404 is told apart ([`FetchError::is_not_found`]).
pub async fn fetch(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
    max: usize,
) -> Result<Value, FetchError> {
    let (m, p) = (|| method.to_string(), || path.to_string());
    // Kyverno's CRD allows no other method; the engine refuses others first.
    if !matches!(method, "GET" | "POST") {
        return Err(FetchError::Method { method: m(), path: p() });
    }
    let mut req = http::Request::builder().method(method).uri(path);
    if body.is_some() {
        req = req.header("Content-Type", "application/json");
    }
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default()).unwrap_or_default();
    let req = req.body(bytes).map_err(|source| FetchError::Request { method: m(), path: p(), source })?;
    let client = client.clone();
    // Read as it streams in, and never more than the limit: a response over it is refused
    // without being held (six concurrent 120 MB lists once took a gigabyte).
    let read = async move {
        use futures_util::AsyncReadExt as _;
        let body = client.request_stream(req).await?;
        let mut bytes = Vec::new();
        body.take(max as u64 + 1).read_to_end(&mut bytes).await.map_err(kube::Error::ReadEvents)?;
        Ok::<_, kube::Error>(bytes)
    };
    let bytes = tokio::time::timeout(TIMEOUT, read)
        .await
        .map_err(|_| FetchError::Timeout { method: m(), path: p() })?
        .map_err(FetchError::Kube)?;
    if bytes.len() > max {
        return Err(FetchError::TooLarge { method: m(), path: p(), max });
    }
    serde_json::from_slice(&bytes).map_err(|source| FetchError::NotJson { method: m(), path: p(), source })
}

/// The API path of a kind's objects (`namespace` empty: cluster-wide). The plural is worked out
/// from the kind as Kyverno's CLI does; kinds with irregular plurals are not found.
fn collection(api_version: &str, kind: &str, namespace: &str) -> Result<String, BadName> {
    resource_path(api_version, &verno_engine::plural(kind), namespace)
}

/// The Kyverno CEL libraries in a cluster: `resource.Get/List` read the API server, the
/// authorizer library asks it for SubjectAccessReviews, `time.now()` is the wall clock.
impl verno_cel::Host for ClusterData {
    /// An object that does not exist is `null` (Kyverno's resource library maps NotFound so;
    /// `resource.Get(…) != null` is how policies ask whether it exists).
    fn resource_get(&self, api_version: &str, resource: &str, namespace: &str, name: &str) -> Result<Value, HostError> {
        let path = resource_path(api_version, resource, namespace).and_then(|c| object_path(&c, name));
        match self.call("GET", &path.map_err(|e| HostError::Failed(e.to_string()))?, None) {
            Ok(v) => Ok(v),
            Err(e) if e.is_not_found() => Ok(Value::Null),
            Err(e) => Err(HostError::Failed(e.to_string())),
        }
    }

    fn resource_list(&self, api_version: &str, resource: &str, namespace: &str) -> Result<Vec<Value>, HostError> {
        let path = resource_path(api_version, resource, namespace).map_err(|e| HostError::Failed(e.to_string()))?;
        let l = self.call("GET", &format!("{path}?limit=500"), None).map_err(|e| HostError::Failed(e.to_string()))?;
        Ok(typed_items(&l))
    }

    fn authorize(&self, review: &Value) -> Result<Value, HostError> {
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": review});
        let answer = self
            .call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", Some(&body))
            .map_err(|e| HostError::Failed(e.to_string()))?;
        Ok(answer.get("status").cloned().unwrap_or(json!({"allowed": false})))
    }

    fn now(&self) -> Option<i64> {
        Some(chrono::Utc::now().timestamp())
    }

    fn random_seed(&self) -> Option<u64> {
        Some(crate::runtime::fresh_seed())
    }

    /// Kyverno's `http` library: the call made, where the rules allow.
    fn http(&self, call: &verno_cel::HttpCall<'_>) -> Result<Value, HostError> {
        self.runtime.block_on(crate::cel_http::call(&self.http, call, self.max_bytes)).map_err(HostError::Failed)
    }

    /// `image.GetMetadata` / `getImageData`: read from the registry as `imageRegistry`
    /// context entries read it (admission only: the controllers verify no images).
    fn image_metadata(&self, reference: &str) -> Result<Value, HostError> {
        match Data::image_data(self, reference, None) {
            Loaded::Value(v) => Ok(v),
            Loaded::Error(e) => Err(HostError::Failed(format!("failed to get imagedata: {e}"))),
            _ => Err(HostError::Unavailable(format!("metadata for image {reference:?} is not available here"))),
        }
    }

    /// An entry that is not there (or not loaded yet) is `null`, as Kyverno's CEL library
    /// answers it; one that failed to load is an error.
    fn global_context(&self, name: &str, projection: &str) -> Result<Value, HostError> {
        match self.global.as_ref().map(|g| g.get(name, projection)) {
            Some(Some(answer)) => answer.map_err(|e| HostError::Failed(e.to_string())),
            _ => Ok(Value::Null),
        }
    }
}

/// A list's items with their `apiVersion` and `kind` (the API server leaves them out of each
/// item; Kubernetes' dynamic client puts them back, and policies read them).
fn typed_items(list: &Value) -> Vec<Value> {
    let api_version = list.get("apiVersion").cloned().unwrap_or(Value::Null);
    let kind = list.get("kind").and_then(Value::as_str).and_then(|k| k.strip_suffix("List")).map(str::to_string);
    let mut items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    for i in &mut items {
        if let Some(o) = i.as_object_mut() {
            if !o.contains_key("apiVersion") && !api_version.is_null() {
                o.insert("apiVersion".into(), api_version.clone());
            }
            if let (false, Some(k)) = (o.contains_key("kind"), &kind) {
                o.insert("kind".into(), Value::String(k.clone()));
            }
        }
    }
    items
}

/// Whether `s` can be put in an API path as one segment (`empty_ok`: or left out): a name
/// from a policy or a request must not walk the path (`..`, `/`) or change the request (`?`,
/// `#`, escapes). Kubernetes names hold none of these.
fn segment(s: &str, empty_ok: bool) -> Result<(), BadName> {
    let bad = if s.is_empty() {
        !empty_ok
    } else {
        s == "."
            || s == ".."
            || s.chars().any(|c| matches!(c, '/' | '?' | '#' | '%' | '\\') || c.is_whitespace() || c.is_control())
    };
    if bad { Err(BadName { name: s.to_string() }) } else { Ok(()) }
}

/// The path of one object of a collection, its name checked with [`segment`].
fn object_path(collection: &str, name: &str) -> Result<String, BadName> {
    segment(name, false)?;
    Ok(format!("{collection}/{name}"))
}

/// The API path of a resource's objects (`resource` is the plural, `namespace` empty:
/// cluster-wide), every part checked with [`segment`] (an apiVersion's group and version, a
/// resource's `plural[/subresource]`).
fn resource_path(api_version: &str, resource: &str, namespace: &str) -> Result<String, BadName> {
    for part in api_version.split('/').chain(resource.split('/')) {
        segment(part, false)?;
    }
    segment(namespace, true)?;
    let base = if api_version.contains('/') { format!("/apis/{api_version}") } else { format!("/api/{api_version}") };
    Ok(if namespace.is_empty() {
        format!("{base}/{resource}")
    } else {
        format!("{base}/namespaces/{namespace}/{resource}")
    })
}

/// Whether a binding's subject is the user (a `User` of that name, a `Group` it is in, or the
/// `ServiceAccount` the username names), as Kyverno matches them.
fn binds(subjects: Option<&Vec<Subject>>, username: &str, groups: &[String]) -> bool {
    subjects.into_iter().flatten().any(|s| match s.kind.as_str() {
        "User" => s.name == username,
        "Group" => groups.contains(&s.name),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().unwrap_or("");
            username.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':'))
                == Some((ns, s.name.as_str()))
        }
        _ => false,
    })
}

impl Data for ClusterData {
    /// Roles as `namespace:name` (a RoleBinding's ClusterRole counts as a role of its
    /// namespace, as Kyverno counts it), ClusterRoles by name; sorted, without repeats.
    fn user_roles(&self, username: &str, groups: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        let (role_bindings, cluster_role_bindings) = self.bindings.as_ref()?;
        let mut roles: Vec<String> = role_bindings
            .state()
            .iter()
            .filter(|b| binds(b.subjects.as_ref(), username, groups))
            .map(|b| format!("{}:{}", b.metadata.namespace.as_deref().unwrap_or(""), b.role_ref.name))
            .collect();
        let mut cluster_roles: Vec<String> = cluster_role_bindings
            .state()
            .iter()
            .filter(|b| binds(b.subjects.as_ref(), username, groups))
            .map(|b| b.role_ref.name.clone())
            .collect();
        for l in [&mut roles, &mut cluster_roles] {
            l.sort();
            l.dedup();
        }
        Some((roles, cluster_roles))
    }

    /// Read from the registry with the image verifier's client and credentials (admission
    /// only; the controllers' data has no verifier, as they verify no images).
    fn image_data(&self, image: &str, credentials: Option<&verno_api::images::RegistryCredentials>) -> Loaded {
        use verno_engine::verify_images::ImageVerifier as _;
        match &self.images {
            Some(v) => match v.image_data(image, credentials, "") {
                Ok(d) => Loaded::Value(d),
                Err(e) => Loaded::Error(e.message().to_string()),
            },
            None => Loaded::Unavailable,
        }
    }

    fn image_verifier(&self) -> Option<Arc<dyn verno_engine::verify_images::ImageVerifier>> {
        self.images.clone().map(|v| v as Arc<dyn verno_engine::verify_images::ImageVerifier>)
    }

    fn cel_host(&self) -> Option<std::sync::Arc<dyn verno_cel::Host>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    /// A namespace's labels, from the namespace watch (or, for one it has not delivered yet,
    /// the API server), as Kyverno reads its namespace lister.
    fn namespace_labels(&self, namespace: &str) -> Option<std::collections::BTreeMap<String, String>> {
        if let Some(ns) = self.namespaces.as_ref().and_then(|l| l.get(namespace)) {
            return Some(ns.labels.clone());
        }
        self.namespace_object(namespace).map(|ns| verno_engine::labels_of(&ns))
    }

    /// Only for a namespace the watch has not delivered yet (the policy set answers from its
    /// [`verno_engine::LiveNamespaces`] first), as Kyverno falls back from its lister to the
    /// API; shaped as the watch's.
    fn namespace_object(&self, name: &str) -> Option<Value> {
        segment(name, false).ok()?;
        let mut ns = self.call("GET", &format!("/api/v1/namespaces/{name}"), None).ok()?;
        verno_engine::LiveNamespaces::as_cel_sees_it(&mut ns);
        Some(ns)
    }

    fn resource(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let api_version = if api_version.is_empty() { "v1" } else { api_version };
        self.call("GET", &object_path(&collection(api_version, kind, namespace).ok()?, name).ok()?, None).ok()
    }

    fn list(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        // Any version (`*`, as mutate-existing targets may say): the core group's `v1` (no
        // discovery here).
        let api_version = if api_version.is_empty() || api_version == "*" { "v1" } else { api_version };
        // One page: lists are bounded by the response limit of `call`.
        let Ok(path) = collection(api_version, kind, namespace) else { return Vec::new() };
        match self.call("GET", &format!("{path}?limit=500"), None) {
            Ok(l) => typed_items(&l),
            Err(_) => Vec::new(),
        }
    }

    fn resource_objects(&self, api_version: &str, resource: &str, namespace: &str) -> Vec<Value> {
        if resource.contains('*') || api_version.contains('*') {
            // Wildcards need discovery; a MutatingPolicy's targets name their resources.
            return Vec::new();
        }
        verno_cel::Host::resource_list(self, api_version, resource, namespace).unwrap_or_default()
    }

    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        let cached = self.config_maps.as_ref().and_then(|c| c.get(&ObjectRef::new(name).within(namespace)));
        if let Some(cm) = cached.and_then(|cm| serde_json::to_value(&*cm).ok()) {
            return Loaded::Value(context_value(&cm));
        }
        if let Err(e) = segment(namespace, false).and_then(|()| segment(name, false)) {
            return Loaded::Error(e.to_string());
        }
        match self.call("GET", &format!("/api/v1/namespaces/{namespace}/configmaps/{name}"), None) {
            Ok(cm) => Loaded::Value(context_value(&cm)),
            Err(e) => Loaded::Error(e.to_string()),
        }
    }

    /// `name` is the entry, then after a dot the projection (Kyverno's form).
    fn global_reference(&self, name: &str) -> Loaded {
        let (entry, projection) = verno_engine::global_context::split_reference(name);
        match self.global.as_ref().and_then(|g| g.get(entry, projection)) {
            Some(Ok(v)) => Loaded::Value(v),
            Some(Err(e)) => Loaded::Error(e.to_string()),
            None => Loaded::Error(format!("failed to fetch entry key={entry}")),
        }
    }

    /// A service call (`apiCall.service`), in Kyverno's words when it fails; bounded by the
    /// client's timeout and the response limit.
    fn service_call(
        &self,
        method: &str,
        url: &str,
        data: Option<&Value>,
        service: &verno_engine::Service<'_>,
    ) -> Loaded {
        let method = if method.is_empty() { "GET" } else { method };
        let call = crate::service_call::call(method, url, service.ca_bundle, service.headers, data, self.max_bytes);
        match self.runtime.block_on(call) {
            Ok(v) => Loaded::Value(v),
            Err(e) => Loaded::Error(e.to_string()),
        }
    }

    fn api_call(&self, method: &str, url_path: &str, data: Option<&Value>) -> Loaded {
        if !url_path.starts_with('/') {
            // A service URL reaches here only through `service_call`.
            return Loaded::Unavailable;
        }
        match self.call(if method.is_empty() { "GET" } else { method }, url_path, data) {
            Ok(v) => Loaded::Value(v),
            Err(e) => Loaded::Error(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An API server whose every answer is an endless JSON body, sent as fast as it is read;
    /// counts the bytes it managed to send.
    async fn endless() -> (String, Arc<std::sync::atomic::AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    let head =
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, "[".repeat(1 << 16));
                    while conn.write_all(chunk.as_bytes()).await.is_ok() {
                        counter.fetch_add(1 << 16, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        (url, sent)
    }

    /// A response was read whole before its size was checked (six
    /// concurrent requests whose policy listed 120 ConfigMaps of 1 MB took the server from 245 MB
    /// to 1.33 GB). It is read as it streams in, and refused at the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn api_call_responses_are_refused_at_the_limit_while_they_stream_in() {
        let (url, sent) = endless().await;
        let config = kube::Config::new(url.parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let data = ClusterData::new(client).with_max_response_bytes(1 << 20);
        let answer =
            tokio::task::spawn_blocking(move || data.api_call("GET", "/api/v1/configmaps", None)).await.unwrap();
        let Loaded::Error(e) = answer else { panic!("an endless response was accepted") };
        assert!(e.contains("the response is over the limit of 1048576 bytes"), "{e}");
        // The server got no further than the limit and what the connection buffers.
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 16 << 20, "{sent} bytes sent");
    }
}
