//! An in-memory Kubernetes API server for tests: the real `kube::Client` talks HTTP to it.
//!
//! What it models:
//! - one global resourceVersion, bumped by every write, like the etcd revision;
//! - get / list / create / replace / patch / delete, with `Status` errors (404, 409
//!   AlreadyExists and Conflict on a stale resourceVersion, 400, 415, 422 for webhook
//!   configuration entries missing required fields);
//! - patches: merge, JSON, strategic (merge keys of the built-in lists), and server-side apply
//!   with field ownership per manager, removal of fields a manager stops applying, and 409
//!   conflicts for non-forced applies (`ssa`);
//! - `uid`, `creationTimestamp`, `generation` (bumped when anything outside metadata and status
//!   changes), `managedFields`, the `/status` subresource (the main endpoint keeps status);
//! - finalizers (`deletionTimestamp`, deletion when the last one goes) and background
//!   ownerReference garbage collection;
//! - watch: replay of the event ring newer than the requested resourceVersion, then live
//!   events; an in-stream 410 `Expired` when the version is older than the ring; bookmarks;
//!   `sendInitialEvents` with the `k8s.io/initial-events-end` bookmark; `timeoutSeconds`;
//! - label selectors and `metadata.name` / `metadata.namespace` field selectors; metadata-only
//!   responses (`as=PartialObjectMetadata[List]`); discovery (`/api`, `/apis`, group versions);
//! - admission emulation (`admission`): webhooks called over HTTPS with their `caBundle`;
//! - fault injection (fail the next requests, delay, API down, compact the ring) and a request
//!   log.
//!
//! Lists honour `limit` and `continue` (the token is the last item's `namespace/name`; pages
//! are not a consistent snapshot as the real server's are). An object entering or leaving a
//! selector-filtered watch's selection is ADDED or DELETED there (with its previous content), as
//! the API server's watch cache sends it. Not modelled: deletecollection, propagation policies
//! (GC is always background), schemas and defaulting, RBAC on requests (access reviews are
//! answered from the RBAC objects), and per-GVR resourceVersions of aggregated APIs. Events are stored in both event APIs
//! (core v1 and events.k8s.io/v1) and every write to one is mirrored, converted, into the other.

#![allow(clippy::result_large_err)]

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

pub mod admission;
mod change;
mod crd;
mod rbac;
mod read;
pub use client::{eventually, eventually_within};
mod client;
mod select;
pub mod ssa;

use change::*;
use read::*;
use select::{Filter, query};

/// A resource the fake serves.
#[derive(Debug, Clone)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    /// Short names and categories a CRD declares (built-ins: `read::short_names`).
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
}

impl Resource {
    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }
}

/// The kinds Verno touches.
pub fn default_resources() -> Vec<Resource> {
    let r = |group, version, kind, plural, namespaced| Resource {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names: Vec::new(),
        categories: Vec::new(),
    };
    vec![
        r("", "v1", "Namespace", "namespaces", false),
        r("", "v1", "Secret", "secrets", true),
        r("", "v1", "ConfigMap", "configmaps", true),
        r("", "v1", "Pod", "pods", true),
        r("", "v1", "Event", "events", true),
        r("", "v1", "Service", "services", true),
        r("", "v1", "ServiceAccount", "serviceaccounts", true),
        r("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false),
        r("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
        r("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true),
        r("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", true),
        r("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true),
        r("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false),
        r("wgpolicyk8s.io", "v1alpha2", "PolicyReport", "policyreports", true),
        r("wgpolicyk8s.io", "v1alpha2", "ClusterPolicyReport", "clusterpolicyreports", false),
        r("events.k8s.io", "v1", "Event", "events", true),
        r("coordination.k8s.io", "v1", "Lease", "leases", true),
        r(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
        ),
        r("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", false),
        r("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false),
        r("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", false),
        r("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", false),
        r("apps", "v1", "Deployment", "deployments", true),
        r("apps", "v1", "ReplicaSet", "replicasets", true),
        r("apps", "v1", "StatefulSet", "statefulsets", true),
        r("apps", "v1", "DaemonSet", "daemonsets", true),
        r("apps", "v1", "ControllerRevision", "controllerrevisions", true),
        r("batch", "v1", "Job", "jobs", true),
        r("batch", "v1", "CronJob", "cronjobs", true),
        r("", "v1", "Node", "nodes", false),
        r("", "v1", "PersistentVolume", "persistentvolumes", false),
        r("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true),
        r("", "v1", "LimitRange", "limitranges", true),
        r("", "v1", "ResourceQuota", "resourcequotas", true),
        r("", "v1", "Endpoints", "endpoints", true),
        r("", "v1", "ReplicationController", "replicationcontrollers", true),
        r("", "v1", "PodTemplate", "podtemplates", true),
        r("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true),
        r("networking.k8s.io", "v1", "Ingress", "ingresses", true),
        r("networking.k8s.io", "v1", "IngressClass", "ingressclasses", false),
        r("storage.k8s.io", "v1", "StorageClass", "storageclasses", false),
        r("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests", false),
        r("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", false),
        r("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", false),
        r("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
        r("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
        r("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", false),
        r(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
        ),
        // MutatingAdmissionPolicy at each version Kubernetes has served it (one object, every
        // version reads it, as the API server's conversion does); v1 first, the preferred one.
        r("admissionregistration.k8s.io", "v1", "MutatingAdmissionPolicy", "mutatingadmissionpolicies", false),
        r(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
            false,
        ),
        r("admissionregistration.k8s.io", "v1beta1", "MutatingAdmissionPolicy", "mutatingadmissionpolicies", false),
        r(
            "admissionregistration.k8s.io",
            "v1beta1",
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
            false,
        ),
        r("admissionregistration.k8s.io", "v1alpha1", "MutatingAdmissionPolicy", "mutatingadmissionpolicies", false),
        r(
            "admissionregistration.k8s.io",
            "v1alpha1",
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
            false,
        ),
        r("kyverno.io", "v1", "ClusterPolicy", "clusterpolicies", false),
        r("kyverno.io", "v1", "Policy", "policies", true),
        r("kyverno.io", "v2", "PolicyException", "policyexceptions", true),
        r("policies.kyverno.io", "v1", "ValidatingPolicy", "validatingpolicies", false),
        r("policies.kyverno.io", "v1", "NamespacedValidatingPolicy", "namespacedvalidatingpolicies", true),
        r("policies.kyverno.io", "v1", "MutatingPolicy", "mutatingpolicies", false),
        r("policies.kyverno.io", "v1", "NamespacedMutatingPolicy", "namespacedmutatingpolicies", true),
        r("policies.kyverno.io", "v1", "PolicyException", "policyexceptions", true),
    ]
}

/// One watch event as stored in the ring.
#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    /// `group/plural`.
    resource: String,
    kind: &'static str,
    object: Value,
    /// The object before a MODIFIED event: a selector-filtered watch turns the event into
    /// ADDED or DELETED when the object enters or leaves the selection, as the API server's
    /// watch cache does.
    old: Option<Value>,
}

impl Event {
    /// The event as a watch with `filter` sees it, if at all: (type, object). An object leaving
    /// the selection is DELETED with its previous content at the event's resourceVersion.
    pub(crate) fn through(&self, filter: &select::Filter) -> Option<(&'static str, std::borrow::Cow<'_, Value>)> {
        use std::borrow::Cow;
        let now = filter.matches(&self.object);
        let Some(old) = self.old.as_ref().filter(|_| self.kind == "MODIFIED") else {
            return now.then_some((self.kind, Cow::Borrowed(&self.object)));
        };
        match (filter.matches(old), now) {
            (true, true) => Some(("MODIFIED", Cow::Borrowed(&self.object))),
            (false, true) => Some(("ADDED", Cow::Borrowed(&self.object))),
            (true, false) => {
                let mut prev = old.clone();
                if let Some(m) = prev.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.insert("resourceVersion".into(), Value::String(self.rv.to_string()));
                }
                Some(("DELETED", Cow::Owned(prev)))
            }
            (false, false) => None,
        }
    }
}

/// One request, for assertions such as "no writes at steady state".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
    /// The query string (`limit=500&…`), empty when none.
    pub query: String,
    /// The request body's size, from its `Content-Length`.
    pub bytes: u64,
}

impl LoggedRequest {
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }
}

pub(crate) struct Store {
    rv: u64,
    uid: u64,
    /// (group/plural, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    ring: VecDeque<Event>,
    ring_capacity: usize,
    /// The oldest resourceVersion a watch may resume from.
    oldest: u64,
    log: Vec<LoggedRequest>,
    fail_next: Vec<(u16, usize)>,
    /// Resources (plural names) whose watches are refused with 403, as RBAC granting `list`
    /// without `watch` refuses them.
    forbid_watch: std::collections::HashSet<String>,
    down: bool,
    /// Added to every request (a slow API server).
    delay: Duration,
    /// Field ownership per object (server-side apply).
    owners: BTreeMap<ObjKey, ssa::Owners>,
    /// The managers among the owners that wrote by apply.
    appliers: BTreeMap<ObjKey, std::collections::BTreeSet<String>>,
    /// Services webhooks may name: (namespace, name) → the ready endpoint, if any.
    services: BTreeMap<(String, String), Option<SocketAddr>>,
    /// Every webhook call made by admission emulation.
    admission_log: Vec<admission::Call>,
    /// The uids of stored objects, and the objects that have ownerReferences: garbage
    /// collection looks at those only (a delete among 50,000 objects must not scan them all).
    uids: HashMap<String, ObjKey>,
    owned: std::collections::BTreeSet<ObjKey>,
}

impl Store {
    /// Stores `o` under `k`, keeping the uid and owner indexes.
    fn put(&mut self, k: ObjKey, o: Value) {
        if let Some(old) = self.objects.get(&k)
            && let Some(u) = old.pointer("/metadata/uid").and_then(Value::as_str)
        {
            self.uids.remove(u);
        }
        if let Some(u) = o.pointer("/metadata/uid").and_then(Value::as_str) {
            self.uids.insert(u.to_string(), k.clone());
        }
        if o.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|r| !r.is_empty()) {
            self.owned.insert(k.clone());
        } else {
            self.owned.remove(&k);
        }
        self.objects.insert(k, o);
    }

    /// Removes the object under `k`, keeping the indexes.
    fn take(&mut self, k: &ObjKey) -> Option<Value> {
        let o = self.objects.remove(k)?;
        if let Some(u) = o.pointer("/metadata/uid").and_then(Value::as_str) {
            self.uids.remove(u);
        }
        self.owned.remove(k);
        Some(o)
    }
}

pub(crate) struct Inner {
    /// The kinds served from the start.
    builtin: Vec<Resource>,
    /// The built-in kinds, then those of CustomResourceDefinitions as they are written.
    resources: std::sync::RwLock<Vec<Resource>>,
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    bookmark_interval: Duration,
}

impl Inner {
    /// The resources served now.
    pub(crate) fn resources(&self) -> Vec<Resource> {
        self.resources.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// A running fake API server.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

pub(crate) fn lock(m: &Mutex<Store>) -> MutexGuard<'_, Store> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeApiServer {
    /// Starts on `127.0.0.1:<random>` serving `resources`.
    pub async fn start(resources: Vec<Resource>) -> std::io::Result<FakeApiServer> {
        FakeApiServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), resources).await
    }

    /// Starts on `addr` (port 0: any free port) serving `resources`.
    pub async fn start_on(addr: SocketAddr, resources: Vec<Resource>) -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(4096);
        let inner = Arc::new(Inner {
            builtin: resources.clone(),
            resources: std::sync::RwLock::new(resources),
            store: Mutex::new(Store {
                rv: 1,
                uid: 0,
                objects: BTreeMap::new(),
                ring: VecDeque::new(),
                ring_capacity: 1000,
                oldest: 1,
                log: Vec::new(),
                fail_next: Vec::new(),
                forbid_watch: Default::default(),
                down: false,
                delay: Duration::ZERO,
                owners: BTreeMap::new(),
                appliers: BTreeMap::new(),
                services: BTreeMap::new(),
                admission_log: Vec::new(),
                uids: HashMap::new(),
                owned: Default::default(),
            }),
            events,
            bookmark_interval: Duration::from_millis(500),
        });
        {
            let mut s = lock(&inner.store);
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                system_create(
                    &inner,
                    &mut s,
                    "",
                    "namespaces",
                    "",
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                );
            }
            rbac::bootstrap(&inner, &mut s);
        }
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeApiServer { inner, addr })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for clients of this server (kubectl, kube::Client): plain HTTP, no
    /// credentials, context `fake` with namespace `default`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.inner.store).log.clone()
    }

    /// The writes so far.
    pub fn writes(&self) -> Vec<LoggedRequest> {
        self.requests().into_iter().filter(LoggedRequest::is_write).collect()
    }

    /// How many writes the server has taken, not counting Leases and Events (the steady
    /// chatter of controllers): unchanged over a while, nothing is happening in the cluster.
    pub fn activity(&self) -> usize {
        lock(&self.inner.store)
            .log
            .iter()
            .filter(|r| r.is_write() && !r.path.contains("/leases") && !r.path.contains("/events"))
            .count()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.store).rv
    }

    /// The next `n` requests fail with `code`.
    pub fn fail_next(&self, n: usize, code: u16) {
        lock(&self.inner.store).fail_next.push((code, n));
    }

    /// Watches of `plural` are refused with 403 Forbidden from now on (lists still work).
    pub fn forbid_watch(&self, plural: &str) {
        lock(&self.inner.store).forbid_watch.insert(plural.to_string());
    }

    /// While down, every request gets 503.
    pub fn set_down(&self, down: bool) {
        lock(&self.inner.store).down = down;
    }

    /// Forgets the event history: watches resuming from an older version get 410 Expired.
    pub fn compact(&self) {
        let mut s = lock(&self.inner.store);
        s.ring.clear();
        s.oldest = s.rv;
    }

    /// Every request waits this long first (a slow API server).
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.inner.store).delay = delay;
    }

    /// Declares a Service webhooks can name, with its ready endpoint (`None`: the Service
    /// exists but has no ready endpoints). Services never declared are "not found".
    pub fn set_service(&self, namespace: &str, name: &str, endpoint: Option<SocketAddr>) {
        lock(&self.inner.store).services.insert((namespace.to_string(), name.to_string()), endpoint);
    }

    /// Removes a Service.
    pub fn remove_service(&self, namespace: &str, name: &str) {
        lock(&self.inner.store).services.remove(&(namespace.to_string(), name.to_string()));
    }

    /// The webhook calls admission emulation has made so far.
    pub fn admission_calls(&self) -> Vec<admission::Call> {
        lock(&self.inner.store).admission_log.clone()
    }

    /// An object as stored, if any.
    /// Every stored object of a resource (all namespaces), read without a request.
    pub fn objects(&self, group: &str, plural: &str) -> Vec<Value> {
        let k = format!("{group}/{plural}");
        objects_of(&lock(&self.inner.store).objects, &k).map(|(_, o)| o.clone()).collect()
    }

    /// Whether any stored object carries the label `key`.
    pub fn any_labelled(&self, key: &str) -> bool {
        lock(&self.inner.store)
            .objects
            .values()
            .any(|o| o.pointer("/metadata/labels").and_then(|l| l.get(key)).is_some())
    }

    /// How many objects of a resource are stored.
    pub fn count(&self, group: &str, plural: &str) -> usize {
        let k = format!("{group}/{plural}");
        objects_of(&lock(&self.inner.store).objects, &k).count()
    }

    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.inner.store)
            .objects
            .get(&(format!("{group}/{plural}"), namespace.to_string(), name.to_string()))
            .cloned()
    }
}

/// A JSON response with `Warning` headers.
pub(crate) fn ok_json_headers(code: StatusCode, v: &Value, warnings: &[String]) -> Response {
    let mut r = ok_json(code, v);
    add_warnings(&mut r, warnings);
    r
}

/// Webhook warnings as `Warning: 299 - "…"` headers.
fn add_warnings(r: &mut Response, warnings: &[String]) {
    for w in warnings {
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("299 - {w:?}")) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
}

pub(crate) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message.into(), "reason": reason, "code": code.as_u16()});
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn ok_json(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// What a request path names.
struct Target<'a> {
    resource: &'a Resource,
    namespace: String,
    name: Option<String>,
    status: bool,
}

fn route<'a>(resources: &'a [Resource], path: &str) -> Option<Target<'a>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (ns.to_string(), more),
        other => (String::new(), other),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return None,
    };
    let resource = resources.iter().find(|r| r.group == group && r.version == version && r.plural == plural)?;
    if sub.is_some_and(|s| s != "status") {
        return None;
    }
    Some(Target { resource, namespace, name, status: sub == Some("status") })
}

fn key(r: &Resource) -> String {
    format!("{}/{}", r.group, r.plural)
}

/// Everything but metadata and status, to decide whether `generation` moves.
fn spec_part(o: &Value) -> Value {
    let mut m = o.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "apiVersion", "kind"] {
        m.remove(k);
    }
    Value::Object(m)
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let delay = {
        let mut s = lock(&inner.store);
        let query = req.uri().query().unwrap_or("").to_string();
        let bytes = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        s.log.push(LoggedRequest { method: method.to_string(), path: path.clone(), query, bytes });
        if s.down {
            return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "the API server is down");
        }
        if let Some((code, left)) = s.fail_next.first_mut() {
            let code = *code;
            *left -= 1;
            if *left == 0 {
                s.fail_next.remove(0);
            }
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return status(code, "InternalError", "injected failure");
        }
        s.delay
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let resources = inner.resources();
    if let Some(r) = discovery(&resources, &path) {
        return r;
    }
    // Bodies are JSON (and YAML-free): protobuf, which kubectl sends for built-in kinds, is
    // refused with 415 as an API server refuses a media type it does not serve; client-go then
    // retries the request as JSON.
    let media = req.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if media.starts_with("application/vnd.kubernetes.protobuf") || media.starts_with("application/cbor") {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the body's media type {media:?} is not supported by this server; send application/json"),
        );
    }
    let q = query(&req);
    let Some(t) = route(&resources, &path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        );
    };
    let headers = req.headers().clone();
    if t.resource.group == "authorization.k8s.io" {
        if method != Method::POST || t.name.is_some() {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} is not supported on {path}"),
            );
        }
        return match axum::body::to_bytes(req.into_body(), 1 << 20).await {
            Ok(b) => rbac::review(&inner, t.resource.plural, &headers, &b),
            Err(e) => status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
        };
    }
    let meta_only = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let body = match axum::body::to_bytes(req.into_body(), 16 << 20).await {
        Ok(b) => b,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (&method, &t.name) {
        (&Method::GET, None) if watching && lock(&inner.store).forbid_watch.contains(t.resource.plural) => status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!("{} is forbidden: cannot watch resource {:?}", t.resource.plural, t.resource.plural),
        ),
        (&Method::GET, None) if watching => watch(inner.clone(), &t, &q, meta_only),
        (&Method::GET, None) => list(&inner, &t, &q, meta_only),
        (&Method::GET, Some(name)) => {
            match lock(&inner.store).objects.get(&(key(t.resource), t.namespace.clone(), name.clone())) {
                Some(o) if meta_only => ok_json(StatusCode::OK, &partial(o)),
                Some(o) => ok_json(StatusCode::OK, &in_version(o, t.resource)),
                None => not_found(t.resource, name),
            }
        }
        (&Method::POST, None) | (&Method::PUT, Some(_)) | (&Method::PATCH, Some(_)) | (&Method::DELETE, Some(_)) => {
            write(&inner, &t, &method, &headers, &q, &body).await
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", format!("{method} is not supported on {path}")),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice::<Value>(body)
        .map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", format!("invalid JSON: {e}")))
}

/// Records a write: bumps the version, stamps the object, appends to the ring and notifies.
fn record(inner: &Inner, s: &mut Store, t: &Resource, kind: &'static str, mut object: Value) -> Value {
    s.rv += 1;
    let rv = s.rv;
    if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    // A MODIFIED object is still stored as it was (callers store the result of this).
    let old = if kind == "MODIFIED" {
        let meta =
            |f: &str| object.pointer(&format!("/metadata/{f}")).and_then(Value::as_str).unwrap_or("").to_string();
        let ns = if t.namespaced { meta("namespace") } else { String::new() };
        s.objects.get(&(key(t), ns, meta("name"))).cloned()
    } else {
        None
    };
    let event = Event { rv, resource: key(t), kind, object: object.clone(), old };
    s.ring.push_back(event.clone());
    while s.ring.len() > s.ring_capacity {
        if let Some(e) = s.ring.pop_front() {
            s.oldest = e.rv;
        }
    }
    let _ = inner.events.send(event);
    object
}

type ObjKey = (String, String, String);

/// The stored objects of one resource (`group/plural`), in (namespace, name) order: a range of
/// the ordered map, so a request touches only its own resource's objects.
pub(crate) fn objects_of<'a>(
    objects: &'a BTreeMap<ObjKey, Value>,
    resource: &'a str,
) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + 'a {
    objects
        .range((resource.to_string(), String::new(), String::new())..)
        .take_while(move |((r, _, _), _)| r == resource)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// A write worked out against the store but not yet admitted or stored.
pub(crate) struct Change {
    pub(crate) k: ObjKey,
    pub(crate) resource: Resource,
    pub(crate) status: bool,
    pub(crate) op: Operation,
    pub(crate) old: Option<Value>,
    /// The object to store (`None` for a delete).
    pub(crate) new: Option<Value>,
    /// Field ownership after the write, when an apply decided it.
    owners: Option<ssa::Owners>,
    /// The manager of this write.
    manager: String,
    apply: bool,
}

fn not_found(t: &Resource, name: &str) -> Response {
    status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.plural))
}

/// The requesting user (`Impersonate-User` / `Impersonate-Group`, else an administrator).
pub(crate) fn user(headers: &HeaderMap) -> (String, Vec<String>) {
    let impersonated = headers.get("impersonate-user").and_then(|v| v.to_str().ok());
    let name = impersonated.unwrap_or("kubernetes-admin").to_string();
    let mut groups: Vec<String> =
        headers.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    if groups.is_empty() {
        // As the API server's authenticator: a service account's groups follow from its name;
        // the kubeconfig's own user is an administrator.
        groups = match impersonated.and_then(|u| u.strip_prefix("system:serviceaccount:")) {
            Some(rest) => {
                let ns = rest.split(':').next().unwrap_or("");
                vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{ns}"),
                    "system:authenticated".into(),
                ]
            }
            None if impersonated.is_some() => vec!["system:authenticated".into()],
            None => vec!["system:masters".into(), "system:authenticated".into()],
        };
    }
    (name, groups)
}

/// A write. A PATCH or DELETE that finds the object changed while its admission round trip ran
/// is tried again on the new object, as the API server's `GuaranteedUpdate` retries (only a
/// write whose own precondition fails is a client's conflict); a POST or PUT is not.
async fn write(
    inner: &Arc<Inner>,
    t: &Target<'_>,
    method: &Method,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: &Bytes,
) -> Response {
    let retries = if matches!(*method, Method::PATCH | Method::DELETE) { 5 } else { 0 };
    let mut attempt = 0;
    loop {
        let r = write_once(inner, t, method, headers, q, body).await;
        if r.status() != StatusCode::CONFLICT || attempt >= retries || !raced(&r) {
            return r;
        }
        attempt += 1;
    }
}

/// Whether a conflict answer is the admission round trip's race (not a precondition's).
fn raced(r: &Response) -> bool {
    r.extensions().get::<Raced>().is_some()
}

#[derive(Clone, Copy)]
struct Raced;

/// kube-apiserver's largest request body (`MaxRequestBodyBytes`, 3 MiB) and etcd's largest
/// request (`--max-request-bytes`, 1.5 MiB), which bounds a stored object.
const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;
const MAX_OBJECT_BYTES: usize = 1536 * 1024;

async fn write_once(
    inner: &Arc<Inner>,
    t: &Target<'_>,
    method: &Method,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: &Bytes,
) -> Response {
    // The API server's own limit on a request body (3 MiB), before anything is read.
    if body.len() > MAX_REQUEST_BYTES {
        return status(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("limit is {MAX_REQUEST_BYTES}, request is {}", body.len()),
        );
    }
    let prepared = {
        let mut s = lock(&inner.store);
        let mut prepared = match *method {
            Method::POST => prepare_create(&mut s, t, body, q),
            Method::PUT => prepare_replace(&s, t, body, q),
            Method::PATCH => prepare_patch(&mut s, t, headers, q, body),
            _ => prepare_delete(&s, t, body),
        };
        // Defaults are filled in as the request is decoded, before admission: webhooks see
        // the defaulted object, old and new alike (and again after mutation, at commit).
        if let Ok(c) = prepared.as_mut()
            && let Some(new) = c.new.as_mut()
        {
            crd::apply_defaults(&s, &c.resource, new);
        }
        prepared
    };
    let mut change = match prepared {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut warnings = Vec::new();
    let is_pod = change.resource.group.is_empty() && change.resource.plural == "pods";
    if change.op == Operation::Create
        && is_pod
        && !change.status
        && let Some(pod) = change.new.as_mut()
    {
        service_account_admission(pod, change.k.0.len() + change.k.2.len());
    }
    if !change.status {
        let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
        match admission::admit(inner, &change, &user(headers), dry_run).await {
            Ok((mutated, w)) => {
                if mutated.is_some() {
                    change.new = mutated;
                }
                warnings = w;
            }
            Err(r) => return r,
        }
    }
    if q.get("dryRun").is_some_and(|v| v == "All") {
        return ok_json(StatusCode::OK, change.new.as_ref().or(change.old.as_ref()).unwrap_or(&Value::Null));
    }
    // etcd's limit on one request (1.5 MiB): the object as it would be stored.
    if let Some(new) = &change.new
        && serde_json::to_vec(new).map_or(0, |b| b.len()) > MAX_OBJECT_BYTES
    {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "etcdserver: request is too large");
    }
    let mut s = lock(&inner.store);
    // Optimistic concurrency across the admission round trip.
    let rv = |o: Option<&Value>| o.and_then(|o| o.pointer("/metadata/resourceVersion")).cloned();
    if rv(s.objects.get(&change.k)) != rv(change.old.as_ref()) {
        let mut r = conflict_on(&change.resource, &change.k.2);
        r.extensions_mut().insert(Raced);
        return r;
    }
    let mut response = commit(inner, &mut s, change);
    add_warnings(&mut response, &warnings);
    response
}

/// The API server's ServiceAccount admission plugin, which runs before the admission webhooks:
/// a Pod without a service account gets `default`, and unless it opts out of the token, a
/// projected `kube-api-access-…` volume mounted into every container. (`seed` varies the
/// name's suffix as the API server's random one does.)
fn service_account_admission(pod: &mut Value, seed: usize) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let sa = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    spec.insert("serviceAccountName".into(), json!(sa));
    spec.insert("serviceAccount".into(), json!(sa));
    if spec.get("automountServiceAccountToken") == Some(&Value::Bool(false)) {
        return;
    }
    const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let mounted = |c: &Value| {
        c.get("volumeMounts").and_then(Value::as_array).is_some_and(|m| m.iter().any(|m| m["mountPath"] == MOUNT))
    };
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String =
        (0..5).map(|i| alphabet.get((seed * 7 + i * 13) % alphabet.len()).map_or('x', |b| *b as char)).collect();
    let name = format!("kube-api-access-{suffix}");
    let mut any = false;
    for list in ["initContainers", "containers"] {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if mounted(c) {
                continue;
            }
            if let Some(c) = c.as_object_mut() {
                let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
                if let Some(m) = mounts.as_array_mut() {
                    m.push(json!({"name": name, "mountPath": MOUNT, "readOnly": true}));
                    any = true;
                }
            }
        }
    }
    if any {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(v) = volumes.as_array_mut() {
            v.push(json!({"name": name, "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}));
        }
    }
}

fn invalid(kind: &str, name: &str, causes: &[String]) -> Response {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{kind}.admissionregistration.k8s.io \"{name}\" is invalid: {}", causes.join(", ")),
    )
}

/// The checks the API server makes that our tests rely on: a webhook configuration entry
/// needs its name, clientConfig, sideEffects and admissionReviewVersions (so an apply of only
/// `rules` onto a deleted configuration fails instead of re-creating it).
fn validate(t: &Resource, o: &Value) -> Result<(), Response> {
    if !matches!(t.kind, "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration") {
        return Ok(());
    }
    let name = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let mut causes = Vec::new();
    for (i, w) in o.get("webhooks").and_then(Value::as_array).into_iter().flatten().enumerate() {
        for f in ["name", "clientConfig", "sideEffects", "admissionReviewVersions"] {
            if w.get(f).is_none_or(Value::is_null) {
                causes.push(format!("webhooks[{i}].{f}: Required value"));
            }
        }
    }
    if causes.is_empty() { Ok(()) } else { Err(invalid(t.kind, name, &causes)) }
}

fn commit(inner: &Inner, s: &mut Store, mut c: Change) -> Response {
    let is_crd = c.resource.group == "apiextensions.k8s.io" && c.resource.kind == "CustomResourceDefinition";
    if is_crd && let Some(new) = c.new.as_mut() {
        // What was stored stays listed (a status write may add to it, as an upgrade tool
        // does), and every stored version must still be in the spec.
        let from = if c.status { Some(&*new) } else { c.old.as_ref() };
        let stored = crd::stored_versions(from);
        if let Err(e) = crd::accept(new, stored) {
            return e;
        }
    }
    if !is_crd && let Some(new) = c.new.as_mut() {
        crd::apply_defaults(s, &c.resource, new);
    }
    let namespace = (c.resource.group.is_empty() && c.resource.kind == "Namespace").then(|| (c.op, c.k.2.clone()));
    if let (Some((Operation::Create, _)), Some(Value::Object(o))) = (&namespace, c.new.as_mut()) {
        o.insert("status".into(), json!({"phase": "Active"}));
    }
    let response = commit_change(inner, s, c);
    if is_crd {
        crd::serve(inner, s);
    }
    match namespace {
        // The service account controller's `default` ServiceAccount in every new namespace.
        Some((Operation::Create, ns)) if response.status().is_success() => {
            system_create(
                inner,
                s,
                "",
                "serviceaccounts",
                &ns,
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
            );
        }
        // The namespace controller empties a deleted namespace (here at once, not in the
        // background: the namespace is gone when the DELETE returns).
        Some((Operation::Delete, ns)) if response.status().is_success() => {
            let resources = inner.resources();
            let inside: Vec<ObjKey> = s.objects.keys().filter(|k| k.1 == ns).cloned().collect();
            for k in inside {
                let Some(r) = resources.iter().find(|r| key(r) == k.0) else { continue };
                if let Some(o) = s.objects.get(&k).cloned() {
                    remove_object(inner, s, r, &k, o);
                }
            }
            collect_garbage(inner, s);
        }
        _ => {}
    }
    response
}

/// An object the API server's own controllers make (no admission, no field manager of a
/// client's): the built-in namespaces, the `default` ServiceAccount of a namespace.
fn system_create(inner: &Inner, s: &mut Store, group: &str, plural: &str, ns: &str, o: Value) {
    let resources = inner.resources();
    let Some(r) = resources.iter().find(|r| r.group == group && r.plural == plural) else { return };
    let t = Target { resource: r, namespace: ns.to_string(), name: None, status: false };
    if let Ok(c) = new_object(s, &t, o, "kube-controller-manager".into(), None) {
        let _ = commit(inner, s, c);
    }
}

fn commit_change(inner: &Inner, s: &mut Store, mut c: Change) -> Response {
    if matches!(c.resource.group, "" | "apps" | "batch")
        && inner.builtin.iter().any(|b| b.plural == c.resource.plural)
        && let Some(o) = c.new.as_mut()
    {
        drop_empty_lists(o);
    }
    // Events are one object in two APIs (core v1 and events.k8s.io/v1): a write to either
    // is mirrored, converted, into the other.
    let mirror = (c.resource.plural == "events" && matches!(c.resource.group, "" | "events.k8s.io"))
        .then(|| (c.resource.clone(), c.k.clone()));
    let response = commit_stored(inner, s, c);
    if let Some((r, k)) = mirror {
        mirror_event(inner, s, &r, &k);
    }
    response
}

/// The built-in kinds are Go structs in a real API server, whose list fields are `omitempty`
/// (`env: []` is stored as no `env`); the few that are not keep their empty list.
fn drop_empty_lists(v: &mut Value) {
    const KEPT: [&str; 1] = ["containers"];
    match v {
        Value::Object(m) => {
            m.retain(|k, x| !(KEPT.iter().all(|kept| k != kept) && x.as_array().is_some_and(Vec::is_empty)));
            m.values_mut().for_each(drop_empty_lists);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_empty_lists),
        _ => {}
    }
}

/// Brings the other API's copy of the event at `k` (in `r`) in line with it: converted and
/// written, or removed when it is gone.
fn mirror_event(inner: &Inner, s: &mut Store, r: &Resource, k: &ObjKey) {
    let to_core = r.group == "events.k8s.io";
    let resources = inner.resources();
    let other_group = if to_core { "" } else { "events.k8s.io" };
    let Some(other) = resources.iter().find(|x| x.group == other_group && x.plural == "events") else { return };
    let ok = (key(other), k.1.clone(), k.2.clone());
    match s.objects.get(k).cloned() {
        Some(o) => {
            let converted = convert_event(&o, to_core, &other.api_version());
            let kind = if s.objects.contains_key(&ok) { "MODIFIED" } else { "ADDED" };
            let stored = record(inner, s, other, kind, converted);
            s.put(ok, stored);
        }
        None => {
            if let Some(o) = s.objects.get(&ok).cloned() {
                remove_object(inner, s, other, &ok, o);
            }
        }
    }
}

/// An Event in the other API's shape (the field renames of Kubernetes' own conversion).
fn convert_event(o: &Value, to_core: bool, api_version: &str) -> Value {
    // (events.k8s.io/v1, core v1)
    const RENAMES: [(&str, &str); 6] = [
        ("regarding", "involvedObject"),
        ("note", "message"),
        ("deprecatedSource", "source"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
    ];
    let mut out = Map::new();
    let Some(m) = o.as_object() else { return o.clone() };
    for (k, v) in m {
        let renamed = RENAMES
            .iter()
            .find_map(|(ev, core)| if to_core { (k == ev).then_some(*core) } else { (k == core).then_some(*ev) });
        let name = match (k.as_str(), to_core) {
            ("reportingController", true) => "reportingComponent",
            ("reportingComponent", false) => "reportingController",
            _ => renamed.unwrap_or(k),
        };
        out.insert(name.to_string(), v.clone());
    }
    if to_core
        && !out.contains_key("source")
        && let Some(c) = out.get("reportingComponent").cloned()
    {
        out.insert("source".into(), json!({"component": c}));
    }
    if !to_core
        && !out.contains_key("reportingController")
        && let Some(c) = out.get("deprecatedSource").and_then(|s| s.get("component")).cloned()
    {
        out.insert("reportingController".into(), c);
    }
    out.insert("apiVersion".into(), Value::String(api_version.to_string()));
    Value::Object(out)
}

fn commit_stored(inner: &Inner, s: &mut Store, c: Change) -> Response {
    let api_version = c.resource.api_version();
    match (c.op, c.old, c.new) {
        (Operation::Create, _, Some(mut o)) => {
            let owners = c.owners.unwrap_or_else(|| {
                let mut owners = ssa::Owners::new();
                ssa::record_update(&json!({}), &o, &mut owners, &c.manager);
                owners
            });
            let appliers: std::collections::BTreeSet<String> =
                if c.apply { [c.manager.clone()].into() } else { Default::default() };
            set_managed_fields(&mut o, &owners, &appliers, &api_version);
            s.owners.insert(c.k.clone(), owners);
            s.appliers.insert(c.k.clone(), appliers);
            let stored = record(inner, s, &c.resource, "ADDED", o);
            let namespace = c.k.1.clone();
            s.put(c.k, stored.clone());
            // Only an object created with owners, none of which exists, is an orphan at once.
            // The owners are looked up by the kind and name their references give (as the
            // garbage collector resolves them), not by a scan of every object.
            let refs = stored.pointer("/metadata/ownerReferences").and_then(Value::as_array);
            if refs.is_some_and(|r| !r.is_empty() && r.iter().all(|r| !owner_exists(inner, s, r, &namespace))) {
                collect_garbage(inner, s);
            }
            ok_json(StatusCode::CREATED, &stored)
        }
        (Operation::Update, Some(old), Some(new)) => {
            let t =
                Target { resource: &c.resource, namespace: c.k.1.clone(), name: Some(c.k.2.clone()), status: c.status };
            let mut owners = s.owners.get(&c.k).cloned().unwrap_or_default();
            let mut appliers = s.appliers.get(&c.k).cloned().unwrap_or_default();
            match c.owners {
                Some(o) => {
                    owners = o;
                    appliers.insert(c.manager.clone());
                }
                None => ssa::record_update(&old, &new, &mut owners, &c.manager),
            }
            appliers.retain(|m| owners.contains_key(m));
            let (response, stored) = update(inner, s, &t, c.k.clone(), &old, new, &owners, &appliers);
            s.owners.insert(c.k.clone(), owners);
            s.appliers.insert(c.k.clone(), appliers);
            // The last finalizer gone from an object being deleted: it goes now.
            if let Some(o) = stored.filter(|o| o.pointer("/metadata/deletionTimestamp").is_some() && !finalizers(o)) {
                remove_object(inner, s, &c.resource, &c.k, o);
                collect_garbage(inner, s);
            }
            response
        }
        (Operation::Delete, Some(old), _) => {
            if finalizers(&old) {
                if old.pointer("/metadata/deletionTimestamp").is_some() {
                    return ok_json(StatusCode::OK, &old);
                }
                let stored = mark_deleting(inner, s, &c.resource, c.k, old);
                return ok_json(StatusCode::OK, &stored);
            }
            let gone = remove_object(inner, s, &c.resource, &c.k, old);
            collect_garbage(inner, s);
            ok_json(StatusCode::OK, &gone)
        }
        _ => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "inconsistent write"),
    }
}

/// A delete held by finalizers: the object stays, with its `deletionTimestamp` set.
fn mark_deleting(inner: &Inner, s: &mut Store, r: &Resource, k: ObjKey, mut o: Value) -> Value {
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(
            "deletionTimestamp".into(),
            Value::String(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        );
    }
    let stored = record(inner, s, r, "MODIFIED", o);
    s.put(k, stored.clone());
    stored
}

fn remove_object(inner: &Inner, s: &mut Store, r: &Resource, k: &ObjKey, o: Value) -> Value {
    s.take(k);
    s.owners.remove(k);
    s.appliers.remove(k);
    record(inner, s, r, "DELETED", o)
}

/// Whether the object an ownerReference names (in `namespace` when its kind is namespaced)
/// exists with the uid it gives.
fn owner_exists(inner: &Inner, s: &Store, r: &Value, namespace: &str) -> bool {
    let f = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let group = f("apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    inner.resources().iter().filter(|res| res.group == group && res.kind == f("kind")).any(|res| {
        let ns = if res.namespaced { namespace } else { "" };
        s.objects
            .get(&(key(res), ns.to_string(), f("name").to_string()))
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            == Some(f("uid"))
    })
}

/// Background garbage collection: an object whose ownerReferences all name absent UIDs is
/// deleted (its finalizers honoured), and so on down the chain.
fn collect_garbage(inner: &Inner, s: &mut Store) {
    loop {
        let orphans: Vec<ObjKey> = s
            .owned
            .iter()
            .filter(|k| {
                let Some(o) = s.objects.get(*k) else { return false };
                let refs = o.pointer("/metadata/ownerReferences").and_then(Value::as_array);
                refs.is_some_and(|r| {
                    !r.is_empty()
                        && r.iter()
                            .all(|r| r.get("uid").and_then(Value::as_str).is_none_or(|u| !s.uids.contains_key(u)))
                }) && o.pointer("/metadata/deletionTimestamp").is_none()
            })
            .cloned()
            .collect();
        if orphans.is_empty() {
            return;
        }
        for k in orphans {
            let Some(r) = inner.resources().into_iter().find(|r| key(r) == k.0) else { continue };
            let Some(o) = s.objects.get(&k).cloned() else { continue };
            if finalizers(&o) {
                mark_deleting(inner, s, &r, k, o);
            } else {
                remove_object(inner, s, &r, &k, o);
            }
        }
    }
}

/// Stores `new` over `old` (same key): keeps identity fields, applies the status rule, moves
/// `generation` when the spec changed, and records MODIFIED unless nothing changed.
#[allow(clippy::too_many_arguments)]
fn update(
    inner: &Inner,
    s: &mut Store,
    t: &Target,
    k: ObjKey,
    old: &Value,
    mut new: Value,
    owners: &ssa::Owners,
    appliers: &std::collections::BTreeSet<String>,
) -> (Response, Option<Value>) {
    let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
    if t.status {
        // /status changes only status.
        let st = new.get("status").cloned();
        new = old.clone();
        if let Some(m) = new.as_object_mut() {
            match st {
                Some(v) => m.insert("status".into(), v),
                None => m.remove("status"),
            };
        }
    } else if let Some(m) = new.as_object_mut() {
        match old.get("status") {
            Some(v) => m.insert("status".into(), v.clone()),
            None => m.remove("status"),
        };
    }
    let generation = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(1);
    let spec_changed = spec_part(old) != spec_part(&new);
    if let Some(m) = new.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(t.resource.api_version()));
        m.insert("kind".into(), Value::String(t.resource.kind.to_string()));
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            for f in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"] {
                match old_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
            meta.insert("generation".into(), Value::from(if spec_changed { generation + 1 } else { generation }));
            meta.insert("resourceVersion".into(), old_meta.get("resourceVersion").cloned().unwrap_or(Value::Null));
        }
    }
    set_managed_fields(&mut new, owners, appliers, &t.resource.api_version());
    if &new == old {
        // A no-op write bumps nothing and emits no event.
        return (ok_json(StatusCode::OK, old), None);
    }
    let stored = record(inner, s, t.resource, "MODIFIED", new);
    s.put(k, stored.clone());
    (ok_json(StatusCode::OK, &stored), Some(stored))
}
