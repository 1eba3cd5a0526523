//! The read side: discovery documents, lists (with label and field selectors, and as
//! metadata only) and watches (from a resourceVersion, with bookmarks).

use super::*;

/// The short names and categories a real cluster lists for a resource (Kubernetes' built-ins,
/// Kyverno 1.19's CRDs), so that `kubectl get ns` or `kubectl get cpol` resolve.
fn short_names(group: &str, plural: &str) -> (&'static [&'static str], &'static [&'static str]) {
    const KYVERNO: &[&str] = &["kyverno"];
    const ALL: &[&str] = &["all"];
    match (group, plural) {
        ("", "namespaces") => (&["ns"], &[]),
        ("", "configmaps") => (&["cm"], &[]),
        ("", "pods") => (&["po"], ALL),
        ("", "events") | ("events.k8s.io", "events") => (&["ev"], &[]),
        ("", "services") => (&["svc"], ALL),
        ("", "serviceaccounts") => (&["sa"], &[]),
        ("policy", "poddisruptionbudgets") => (&["pdb"], &[]),
        ("apiextensions.k8s.io", "customresourcedefinitions") => (&["crd", "crds"], &["api-extensions"]),
        ("apps", "deployments") => (&["deploy"], ALL),
        ("apps", "replicasets") => (&["rs"], ALL),
        ("apps", "statefulsets") => (&["sts"], ALL),
        ("apps", "daemonsets") => (&["ds"], ALL),
        ("batch", "jobs") => (&[], ALL),
        ("batch", "cronjobs") => (&["cj"], ALL),
        ("", "nodes") => (&["no"], &[]),
        ("", "persistentvolumes") => (&["pv"], &[]),
        ("", "persistentvolumeclaims") => (&["pvc"], &[]),
        ("", "limitranges") => (&["limits"], &[]),
        ("", "resourcequotas") => (&["quota"], &[]),
        ("", "endpoints") => (&["ep"], &[]),
        ("", "replicationcontrollers") => (&["rc"], ALL),
        ("networking.k8s.io", "networkpolicies") => (&["netpol"], &[]),
        ("networking.k8s.io", "ingresses") => (&["ing"], &[]),
        ("storage.k8s.io", "storageclasses") => (&["sc"], &[]),
        ("certificates.k8s.io", "certificatesigningrequests") => (&["csr"], &[]),
        ("scheduling.k8s.io", "priorityclasses") => (&["pc"], &[]),
        ("autoscaling", "horizontalpodautoscalers") => (&["hpa"], ALL),
        ("kyverno.io", "clusterpolicies") => (&["cpol"], KYVERNO),
        ("kyverno.io", "policies") => (&["pol"], KYVERNO),
        ("kyverno.io", "policyexceptions") => (&["polex"], KYVERNO),
        ("kyverno.io", "cleanuppolicies") => (&["cleanpol"], KYVERNO),
        ("kyverno.io", "clustercleanuppolicies") => (&["ccleanpol"], KYVERNO),
        ("wgpolicyk8s.io", "policyreports") => (&["polr"], &[]),
        ("wgpolicyk8s.io", "clusterpolicyreports") => (&["cpolr"], &[]),
        ("policies.kyverno.io", "validatingpolicies") => (&["vpol"], KYVERNO),
        ("policies.kyverno.io", "namespacedvalidatingpolicies") => (&["nvpol"], KYVERNO),
        ("policies.kyverno.io", "mutatingpolicies") => (&["mpol"], KYVERNO),
        ("policies.kyverno.io", "namespacedmutatingpolicies") => (&["nmpol"], KYVERNO),
        _ => (&[], &[]),
    }
}

/// `/api`, `/apis`, `/api/v1` and `/apis/<group>/<version>`.
pub(crate) fn discovery(resources: &[Resource], path: &str) -> Option<Response> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let list = |group: &str, version: &str| {
        let items: Vec<Value> = resources
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .flat_map(|r| {
                // Access reviews are create-only and have no status subresource of their own.
                if r.group == "authorization.k8s.io" {
                    return vec![json!({"name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind, "verbs": ["create"]})];
                }
                let verbs = json!(["create", "delete", "get", "list", "patch", "update", "watch"]);
                let mut main = json!({"name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs});
                let (short, categories) = short_names(r.group, r.plural);
                let short: Vec<String> = if r.short_names.is_empty() { short.iter().map(|s| s.to_string()).collect() } else { r.short_names.clone() };
                let categories: Vec<String> =
                    if r.categories.is_empty() { categories.iter().map(|s| s.to_string()).collect() } else { r.categories.clone() };
                if let Some(m) = main.as_object_mut() {
                    if !short.is_empty() {
                        m.insert("shortNames".into(), json!(short));
                    }
                    if !categories.is_empty() {
                        m.insert("categories".into(), json!(categories));
                    }
                }
                let st = json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]});
                vec![main, st]
            })
            .collect();
        let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        ok_json(
            StatusCode::OK,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}),
        )
    };
    match segs.as_slice() {
        ["version"] => Some(ok_json(
            StatusCode::OK,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-verno-fake", "platform": "linux/amd64"}),
        )),
        ["api"] => Some(ok_json(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        )),
        ["api", v] => Some(list("", v)),
        ["apis"] => {
            let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for r in resources.iter().filter(|r| !r.group.is_empty()) {
                let vs = groups.entry(r.group).or_default();
                if !vs.contains(&r.version) {
                    vs.push(r.version);
                }
            }
            let groups: Vec<Value> = groups
                .iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
                    json!({"name": g, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
                })
                .collect();
            Some(ok_json(StatusCode::OK, &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})))
        }
        ["apis", g, v] => Some(list(g, v)),
        // OpenAPI: the fake models no schemas, and says so with an index that lists no group
        // version; kubectl then validates nothing on the client (as for a CRD without a
        // schema) and the server checks what it models.
        ["openapi", "v3"] => Some(ok_json(StatusCode::OK, &json!({"paths": {}}))),
        // client-go reads OpenAPI v2 only as protobuf; zero bytes are an empty Document.
        ["openapi", "v2"] => Some(
            axum::response::Response::builder()
                .status(StatusCode::OK)
                .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
                .body(axum::body::Body::empty())
                .unwrap_or_default(),
        ),
        _ => None,
    }
}

/// The metadata-only form (`Accept: …;as=PartialObjectMetadata`).
pub(crate) fn partial(o: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o.get("metadata").cloned().unwrap_or(json!({}))})
}

pub(crate) fn list(inner: &Inner, t: &Target, q: &HashMap<String, String>, meta_only: bool) -> Response {
    let filter = match Filter::parse(q) {
        Ok(f) => f,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let s = lock(&inner.store);
    let k = key(t.resource);
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    // `continue`: the page starts after this `namespace/name`.
    let after: Option<(&str, &str)> = q.get("continue").filter(|c| !c.is_empty()).and_then(|c| c.split_once('/'));
    let mut matching = crate::objects_of(&s.objects, &k)
        .filter(|((_, ns, name), o)| {
            (t.namespace.is_empty() || *ns == t.namespace)
                && after.is_none_or(|a| (ns.as_str(), name.as_str()) > a)
                && filter.matches(o)
        })
        .peekable();
    let mut items: Vec<Value> = Vec::new();
    let mut last: Option<(&str, &str)> = None;
    // As the API server: the items of a built-in kind's list carry no apiVersion or kind (the
    // list says them); a custom resource's items keep theirs.
    let builtin = inner.builtin.iter().any(|r| r.group == t.resource.group && r.plural == t.resource.plural);
    while items.len() < limit {
        let Some(((_, ns, name), o)) = matching.next() else { break };
        let mut item = if meta_only { partial(o) } else { in_version(o, t.resource) };
        if builtin
            && !meta_only
            && let Some(m) = item.as_object_mut()
        {
            m.remove("apiVersion");
            m.remove("kind");
        }
        items.push(item);
        last = Some((ns.as_str(), name.as_str()));
    }
    let more = matching.peek().is_some();
    let mut metadata = serde_json::Map::new();
    metadata.insert("resourceVersion".into(), json!(s.rv.to_string()));
    if let (true, Some((ns, name))) = (more, last) {
        metadata.insert("continue".into(), json!(format!("{ns}/{name}")));
    }
    let (api_version, kind) = if meta_only {
        ("meta.k8s.io/v1".to_string(), "PartialObjectMetadataList".to_string())
    } else {
        (t.resource.api_version(), format!("{}List", t.resource.kind))
    };
    ok_json(StatusCode::OK, &json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items}))
}

/// `o` as the version `r` serves it: objects are stored once per group and resource, and
/// every served version of a kind has the same schema here (CRDs with conversion `None`), so
/// conversion is the `apiVersion` alone.
pub(crate) fn in_version(o: &Value, r: &Resource) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(r.api_version()));
    }
    o
}

pub(crate) fn frame(kind: &str, object: &Value) -> Bytes {
    frame_as(kind, object, false)
}

pub(crate) fn frame_as(kind: &str, object: &Value, meta_only: bool) -> Bytes {
    let object = if meta_only { partial(object) } else { object.clone() };
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

pub(crate) fn bookmark(t: &Resource, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    if initial_end {
        meta.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
    }
    frame("BOOKMARK", &json!({"apiVersion": t.api_version(), "kind": t.kind, "metadata": meta}))
}

pub(crate) fn watch(inner: Arc<Inner>, t: &Target, q: &HashMap<String, String>, meta_only: bool) -> Response {
    let filter = match Filter::parse(q) {
        Ok(f) => f,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
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
    let in_scope = move |e: &Event| {
        e.resource == k
            && (namespace.is_empty()
                || e.object.pointer("/metadata/namespace").and_then(Value::as_str) == Some(namespace.as_str()))
    };
    let (replay, last, expired): (Vec<Bytes>, u64, bool) = {
        let s = lock(&inner.store);
        if initial || from == 0 {
            let k = key(&resource);
            let items = crate::objects_of(&s.objects, &k)
                .filter(|((_, ns, _), o)| (t.namespace.is_empty() || *ns == t.namespace) && filter.matches(o))
                .map(|(_, o)| frame_as("ADDED", &in_version(o, &resource), meta_only));
            let mut v: Vec<Bytes> = items.collect();
            if initial {
                v.push(bookmark(&resource, s.rv, true));
            }
            (v, s.rv, false)
        } else if from < s.oldest {
            (Vec::new(), s.rv, true)
        } else {
            let v = s
                .ring
                .iter()
                .filter(|e| e.rv > from && in_scope(e))
                .filter_map(|e| {
                    e.through(&filter).map(|(kind, o)| frame_as(kind, &in_version(&o, &resource), meta_only))
                })
                .collect();
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
                        let Some((kind, o)) = e.through(&filter) else { continue };
                        if tx.send(frame_as(kind, &in_version(&o, &resource), meta_only)).await.is_err() { return; }
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
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}
