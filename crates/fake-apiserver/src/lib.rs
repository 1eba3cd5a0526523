//! An in-memory Kubernetes API server for tests: the real `kube::Client` talks HTTP to it.
//!
//! What it models (see `../shared/research/in-cluster-design.md` §4):
//! - one global resourceVersion, bumped by every write, like the etcd revision;
//! - get / list / create / replace / patch (merge, JSON, strategic as merge, apply as merge
//!   with `fieldManager` required) / delete, with `Status` errors (404, 409 AlreadyExists and
//!   Conflict on a stale resourceVersion, 400, 415);
//! - `uid`, `creationTimestamp`, `generation` (bumped when anything outside metadata and status
//!   changes), the `/status` subresource (the main endpoint keeps the stored status);
//! - watch: replay of the event ring newer than the requested resourceVersion, then live
//!   events; an in-stream 410 `Expired` when the version is older than the ring; bookmarks;
//!   `sendInitialEvents` with the `k8s.io/initial-events-end` bookmark; `timeoutSeconds`;
//! - label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) and `metadata.name` /
//!   `metadata.namespace` field selectors on list and watch;
//! - fault injection (fail the next requests, API down, compact the ring) and a request log.
//!
//! Not modelled yet: server-side apply field ownership and conflicts, ownerReference garbage
//! collection, finalizers, paging, metadata-only responses, discovery beyond `/version`, and
//! admission emulation.

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

/// A resource the fake serves.
#[derive(Debug, Clone)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl Resource {
    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }
}

/// The kinds Verno touches.
pub fn default_resources() -> Vec<Resource> {
    let r = |group, version, kind, plural, namespaced| Resource { group, version, kind, plural, namespaced };
    vec![
        r("", "v1", "Namespace", "namespaces", false),
        r("", "v1", "Secret", "secrets", true),
        r("", "v1", "ConfigMap", "configmaps", true),
        r("", "v1", "Pod", "pods", true),
        r("", "v1", "Event", "events", true),
        r("events.k8s.io", "v1", "Event", "events", true),
        r("coordination.k8s.io", "v1", "Lease", "leases", true),
        r("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "validatingwebhookconfigurations", false),
        r("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", false),
        r("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false),
        r("apps", "v1", "Deployment", "deployments", true),
        r("kyverno.io", "v1", "ClusterPolicy", "clusterpolicies", false),
        r("kyverno.io", "v1", "Policy", "policies", true),
        r("kyverno.io", "v2", "PolicyException", "policyexceptions", true),
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
}

/// One request, for assertions such as "no writes at steady state".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
}

impl LoggedRequest {
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }
}

struct Store {
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
    down: bool,
}

struct Inner {
    resources: Vec<Resource>,
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    bookmark_interval: Duration,
}

/// A running fake API server.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

fn lock(m: &Mutex<Store>) -> MutexGuard<'_, Store> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeApiServer {
    /// Starts on `127.0.0.1:<random>` serving `resources`.
    pub async fn start(resources: Vec<Resource>) -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(4096);
        let inner = Arc::new(Inner {
            resources,
            store: Mutex::new(Store {
                rv: 1,
                uid: 0,
                objects: BTreeMap::new(),
                ring: VecDeque::new(),
                ring_capacity: 1000,
                oldest: 1,
                log: Vec::new(),
                fail_next: Vec::new(),
                down: false,
            }),
            events,
            bookmark_interval: Duration::from_millis(500),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
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

    /// Every request so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.inner.store).log.clone()
    }

    /// The writes so far.
    pub fn writes(&self) -> Vec<LoggedRequest> {
        self.requests().into_iter().filter(LoggedRequest::is_write).collect()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.store).rv
    }

    /// The next `n` requests fail with `code`.
    pub fn fail_next(&self, n: usize, code: u16) {
        lock(&self.inner.store).fail_next.push((code, n));
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

    /// An object as stored, if any.
    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.inner.store).objects.get(&(format!("{group}/{plural}"), namespace.to_string(), name.to_string())).cloned()
    }
}

fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
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

fn query(req: &Request) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in req.uri().query().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => match bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(x) => {
                    out.push(x);
                    i += 3;
                    continue;
                }
                None => out.push(b),
            },
            b'+' => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A label selector requirement.
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

fn parse_selector(s: &str) -> Result<Vec<Req>, String> {
    // Split on commas outside parentheses.
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    let set = |v: &str| v.trim().trim_start_matches('(').trim_end_matches(')').split(',').map(|x| x.trim().to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    for p in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        out.push(if let Some((k, v)) = p.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set(v))
        } else if let Some((k, v)) = p.split_once(" in ") {
            Req::In(k.trim().into(), set(v))
        } else if let Some(k) = p.strip_prefix('!') {
            Req::NotExists(k.trim().into())
        } else if p.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
            Req::Exists(p.into())
        } else {
            return Err(format!("unable to parse requirement: {p:?}"));
        });
    }
    Ok(out)
}

struct Filter {
    labels: Vec<Req>,
    fields: Vec<(String, String, bool)>,
}

impl Filter {
    fn parse(q: &HashMap<String, String>) -> Result<Filter, String> {
        let labels = q.get("labelSelector").map(|s| parse_selector(s)).transpose()?.unwrap_or_default();
        let mut fields = Vec::new();
        for p in q.get("fieldSelector").map(String::as_str).unwrap_or("").split(',').filter(|p| !p.is_empty()) {
            let (k, v, eq) = match p.split_once("!=") {
                Some((k, v)) => (k, v, false),
                None => match p.split_once("==").or_else(|| p.split_once('=')) {
                    Some((k, v)) => (k, v, true),
                    None => return Err(format!("invalid field selector {p:?}")),
                },
            };
            if !matches!(k, "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {k}"));
            }
            fields.push((k.to_string(), v.to_string(), eq));
        }
        Ok(Filter { labels, fields })
    }

    fn matches(&self, o: &Value) -> bool {
        let label = |k: &str| o.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v.as_str()),
            Req::Ne(k, v) => label(k) != Some(v.as_str()),
            Req::In(k, vs) => label(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => label(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|(k, v, eq)| {
                let actual = o.pointer(&format!("/{}", k.replace('.', "/"))).and_then(Value::as_str).unwrap_or("");
                (actual == v) == *eq
            })
    }
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
    {
        let mut s = lock(&inner.store);
        s.log.push(LoggedRequest { method: method.to_string(), path: path.clone() });
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
    }
    if path == "/version" {
        return ok_json(StatusCode::OK, &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-verno-fake", "platform": "linux/amd64"}));
    }
    let q = query(&req);
    let Some(t) = route(&inner.resources, &path) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find the requested resource ({path})"));
    };
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), 16 << 20).await {
        Ok(b) => b,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    match (&method, &t.name) {
        (&Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => watch(inner.clone(), &t, &q),
        (&Method::GET, None) => list(&inner, &t, &q),
        (&Method::GET, Some(name)) => match lock(&inner.store).objects.get(&(key(t.resource), t.namespace.clone(), name.clone())) {
            Some(o) => ok_json(StatusCode::OK, o),
            None => status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural)),
        },
        (&Method::POST, None) => create(&inner, &t, &body),
        (&Method::PUT, Some(name)) => replace(&inner, &t, name, &body),
        (&Method::PATCH, Some(name)) => patch(&inner, &t, name, &headers, &q, &body),
        (&Method::DELETE, Some(name)) => delete(&inner, &t, name),
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", format!("{method} is not supported on {path}")),
    }
}

fn list(inner: &Inner, t: &Target, q: &HashMap<String, String>) -> Response {
    let filter = match Filter::parse(q) {
        Ok(f) => f,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let s = lock(&inner.store);
    let k = key(t.resource);
    let items: Vec<Value> = s.objects.iter().filter(|((r, ns, _), o)| *r == k && (t.namespace.is_empty() || *ns == t.namespace) && filter.matches(o)).map(|(_, o)| o.clone()).collect();
    ok_json(
        StatusCode::OK,
        &json!({"apiVersion": t.resource.api_version(), "kind": format!("{}List", t.resource.kind), "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice::<Value>(body).map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", format!("invalid JSON: {e}")))
}

/// Records a write: bumps the version, stamps the object, appends to the ring and notifies.
fn record(inner: &Inner, s: &mut Store, t: &Resource, kind: &'static str, mut object: Value) -> Value {
    s.rv += 1;
    let rv = s.rv;
    if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    let event = Event { rv, resource: key(t), kind, object: object.clone() };
    s.ring.push_back(event.clone());
    while s.ring.len() > s.ring_capacity {
        if let Some(e) = s.ring.pop_front() {
            s.oldest = e.rv;
        }
    }
    let _ = inner.events.send(event);
    object
}

fn create(inner: &Inner, t: &Target, body: &Bytes) -> Response {
    let mut o = match parse_body(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let mut s = lock(&inner.store);
    let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) else {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata is required");
    };
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => match meta.get("generateName").and_then(Value::as_str) {
            Some(g) => format!("{g}{:05x}", s.uid + 1),
            None => return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata.name: Required value"),
        },
    };
    let namespace = if t.resource.namespaced { t.namespace.clone() } else { String::new() };
    let k = (key(t.resource), namespace.clone(), name.clone());
    if s.objects.contains_key(&k) {
        return status(StatusCode::CONFLICT, "AlreadyExists", format!("{} \"{name}\" already exists", t.resource.plural));
    }
    s.uid += 1;
    meta.insert("name".into(), Value::String(name));
    if t.resource.namespaced {
        meta.insert("namespace".into(), Value::String(namespace));
    }
    meta.insert("uid".into(), Value::String(format!("00000000-0000-0000-0000-{:012x}", s.uid)));
    meta.insert("creationTimestamp".into(), Value::String(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()));
    meta.insert("generation".into(), Value::from(1));
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(t.resource.api_version()));
        m.insert("kind".into(), Value::String(t.resource.kind.to_string()));
    }
    let stored = record(inner, &mut s, t.resource, "ADDED", o);
    s.objects.insert(k, stored.clone());
    ok_json(StatusCode::CREATED, &stored)
}

/// Stores `new` over `old` (same key): keeps identity fields, applies the status rule, moves
/// `generation` when the spec changed, and records MODIFIED unless nothing changed.
fn update(inner: &Inner, s: &mut Store, t: &Target, k: (String, String, String), old: &Value, mut new: Value) -> Response {
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
            for f in ["name", "namespace", "uid", "creationTimestamp"] {
                match old_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
            meta.insert("generation".into(), Value::from(if spec_changed { generation + 1 } else { generation }));
            meta.insert("resourceVersion".into(), old_meta.get("resourceVersion").cloned().unwrap_or(Value::Null));
        }
    }
    if &new == old {
        // A no-op write bumps nothing and emits no event.
        return ok_json(StatusCode::OK, old);
    }
    let stored = record(inner, s, t.resource, "MODIFIED", new);
    s.objects.insert(k, stored.clone());
    ok_json(StatusCode::OK, &stored)
}

fn replace(inner: &Inner, t: &Target, name: &str, body: &Bytes) -> Response {
    let new = match parse_body(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let mut s = lock(&inner.store);
    let k = (key(t.resource), t.namespace.clone(), name.to_string());
    let Some(old) = s.objects.get(&k).cloned() else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural));
    };
    let want = new.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
    let have = old.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
    if !want.is_empty() && want != have {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", t.resource.plural),
        );
    }
    update(inner, &mut s, t, k, &old, new)
}

fn patch(inner: &Inner, t: &Target, name: &str, headers: &HeaderMap, q: &HashMap<String, String>, body: &Bytes) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").split(';').next().unwrap_or("").trim().to_string();
    let mut s = lock(&inner.store);
    let k = (key(t.resource), t.namespace.clone(), name.to_string());
    let existing = s.objects.get(&k).cloned();
    let new = match ct.as_str() {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
            if ct == "application/apply-patch+yaml" && q.get("fieldManager").is_none_or(String::is_empty) {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch");
            }
            if ct == "application/strategic-merge-patch+json" && !t.resource.group.is_empty() && t.resource.group.ends_with("kyverno.io") {
                return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources");
            }
            // kube sends apply bodies as JSON (a subset of YAML).
            let p = match parse_body(body) {
                Ok(p) => p,
                Err(r) => return r,
            };
            match (&existing, ct.as_str()) {
                (None, "application/apply-patch+yaml") => {
                    drop(s);
                    return create(inner, t, body);
                }
                (None, _) => return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural)),
                (Some(old), _) => {
                    let mut doc = old.clone();
                    json_patch::merge(&mut doc, &p);
                    doc
                }
            }
        }
        "application/json-patch+json" => {
            let Some(old) = &existing else {
                return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural));
            };
            let p: json_patch::Patch = match serde_json::from_slice(body) {
                Ok(p) => p,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("invalid JSON patch: {e}")),
            };
            let mut doc = old.clone();
            if let Err(e) = json_patch::patch(&mut doc, &p) {
                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", format!("the JSON patch could not be applied: {e}"));
            }
            doc
        }
        other => return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})")),
    };
    let Some(old) = existing else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural));
    };
    update(inner, &mut s, t, k, &old, new)
}

fn delete(inner: &Inner, t: &Target, name: &str) -> Response {
    let mut s = lock(&inner.store);
    let k = (key(t.resource), t.namespace.clone(), name.to_string());
    let Some(old) = s.objects.remove(&k) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", t.resource.plural));
    };
    let gone = record(inner, &mut s, t.resource, "DELETED", old);
    ok_json(StatusCode::OK, &gone)
}

fn frame(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark(t: &Resource, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    if initial_end {
        meta.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
    }
    frame("BOOKMARK", &json!({"apiVersion": t.api_version(), "kind": t.kind, "metadata": meta}))
}

fn watch(inner: Arc<Inner>, t: &Target, q: &HashMap<String, String>) -> Response {
    let filter = match Filter::parse(q) {
        Ok(f) => f,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let resource = t.resource.clone();
    let namespace = t.namespace.clone();
    let k = key(t.resource);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = q.get("timeoutSeconds").and_then(|v| v.parse::<u64>().ok()).unwrap_or(300);
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    // Subscribe before reading the ring so that nothing falls between replay and live events.
    let mut live = inner.events.subscribe();
    let in_scope = move |e: &Event| e.resource == k && (namespace.is_empty() || e.object.pointer("/metadata/namespace").and_then(Value::as_str) == Some(namespace.as_str()));
    let (replay, last, expired): (Vec<Bytes>, u64, bool) = {
        let s = lock(&inner.store);
        if initial || from == 0 {
            let items = s.objects.iter().filter(|((r, ns, _), o)| *r == key(&resource) && (t.namespace.is_empty() || *ns == t.namespace) && filter.matches(o)).map(|(_, o)| frame("ADDED", o));
            let mut v: Vec<Bytes> = items.collect();
            if initial {
                v.push(bookmark(&resource, s.rv, true));
            }
            (v, s.rv, false)
        } else if from < s.oldest {
            (Vec::new(), s.rv, true)
        } else {
            let v = s.ring.iter().filter(|e| e.rv > from && in_scope(e) && filter.matches(&e.object)).map(|e| frame(e.kind, &e.object)).collect();
            (v, s.rv, false)
        }
    };
    let interval = inner.bookmark_interval;
    tokio::spawn(async move {
        if expired {
            let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410});
            let _ = tx.send(frame("ERROR", &gone)).await;
            return;
        }
        for b in replay {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let mut tick = tokio::time::interval(interval);
        let mut rv = last;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(&resource, rv, false)).await.is_err() { return; }
                }
                e = live.recv() => match e {
                    Ok(e) => {
                        if e.rv <= last || !in_scope(&e) { continue; }
                        rv = e.rv;
                        if filter.matches(&e.object) && tx.send(frame(e.kind, &e.object)).await.is_err() { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "watch fell behind", "reason": "Expired", "code": 410});
                        let _ = tx.send(frame("ERROR", &gone)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx)) });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}
