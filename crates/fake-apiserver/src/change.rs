//! The write side before commit: create, replace (with resourceVersion checks), the patch
//! kinds (merge, JSON, strategic, server-side apply with field managers) and delete, each
//! producing a `Change` or the API server's error.

use super::*;

pub(crate) fn prepare_create(
    s: &mut Store,
    t: &Target,
    body: &Bytes,
    q: &HashMap<String, String>,
) -> Result<Change, Response> {
    let o = parse_body(body)?;
    let manager = q.get("fieldManager").cloned().unwrap_or_else(|| "unknown".into());
    new_object(s, t, o, manager, None)
}

/// A new object with its identity fields; `owners` when an apply creates it.
pub(crate) fn new_object(
    s: &mut Store,
    t: &Target,
    mut o: Value,
    manager: String,
    owners: Option<ssa::Owners>,
) -> Result<Change, Response> {
    let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata is required"));
    };
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => match meta.get("generateName").and_then(Value::as_str) {
            Some(g) => format!("{g}{:05x}", s.uid + 1),
            None => return Err(status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata.name: Required value")),
        },
    };
    let namespace = if t.resource.namespaced { t.namespace.clone() } else { String::new() };
    let k = (key(t.resource), namespace.clone(), name.clone());
    if s.objects.contains_key(&k) {
        return Err(status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.resource.plural),
        ));
    }
    s.uid += 1;
    meta.insert("name".into(), Value::String(name));
    if t.resource.namespaced {
        meta.insert("namespace".into(), Value::String(namespace));
    }
    meta.insert("uid".into(), Value::String(format!("00000000-0000-0000-0000-{:012x}", s.uid)));
    meta.insert("creationTimestamp".into(), Value::String(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()));
    meta.insert("generation".into(), Value::from(1));
    meta.remove("resourceVersion");
    meta.remove("managedFields");
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(t.resource.api_version()));
        m.insert("kind".into(), Value::String(t.resource.kind.to_string()));
    }
    validate(t.resource, &o)?;
    let apply = owners.is_some();
    Ok(Change {
        k,
        resource: t.resource.clone(),
        status: false,
        op: Operation::Create,
        old: None,
        new: Some(o),
        owners,
        manager,
        apply,
    })
}

pub(crate) fn conflict_on(t: &Resource, name: &str) -> Response {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            t.plural
        ),
    )
}

pub(crate) fn prepare_replace(
    s: &Store,
    t: &Target,
    body: &Bytes,
    q: &HashMap<String, String>,
) -> Result<Change, Response> {
    let new = parse_body(body)?;
    let name = t.name.clone().unwrap_or_default();
    let k = (key(t.resource), t.namespace.clone(), name.clone());
    let old = s.objects.get(&k).cloned().ok_or_else(|| not_found(t.resource, &name))?;
    let want = new.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
    let have = old.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
    if !want.is_empty() && want != have {
        return Err(conflict_on(t.resource, &name));
    }
    validate(t.resource, &new)?;
    let manager = q.get("fieldManager").cloned().unwrap_or_else(|| "unknown".into());
    Ok(Change {
        k,
        resource: t.resource.clone(),
        status: t.status,
        op: Operation::Update,
        old: Some(old),
        new: Some(new),
        owners: None,
        manager,
        apply: false,
    })
}

pub(crate) fn prepare_patch(
    s: &mut Store,
    t: &Target,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Change, Response> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let name = t.name.clone().unwrap_or_default();
    let k = (key(t.resource), t.namespace.clone(), name.clone());
    let existing = s.objects.get(&k).cloned();
    let manager = q.get("fieldManager").cloned().unwrap_or_default();
    let new = match ct.as_str() {
        "application/apply-patch+yaml" => {
            if manager.is_empty() {
                return Err(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            // kube sends apply bodies as JSON (a subset of YAML).
            let applied = parse_body(body)?;
            let force = q.get("force").is_some_and(|v| v == "true");
            let owner_key = if t.status { format!("{manager}/status") } else { manager.clone() };
            let mut owners = s.owners.get(&k).cloned().unwrap_or_default();
            let base = existing.clone().unwrap_or_else(|| json!({}));
            let merged = ssa::apply(&base, &applied, &mut owners, &owner_key, force).map_err(|conflicts| {
                let list: Vec<String> =
                    conflicts.iter().map(|(m, p)| format!("conflict with {m:?}: {}", ssa::display(p))).collect();
                let n = conflicts.len();
                let noun = if n == 1 { "conflict" } else { "conflicts" };
                status(StatusCode::CONFLICT, "Conflict", format!("Apply failed with {n} {noun}: {}", list.join(", ")))
            })?;
            if existing.is_none() {
                if t.status {
                    return Err(not_found(t.resource, &name));
                }
                return new_object(s, t, merged, owner_key, Some(owners));
            }
            return Ok(Change {
                k,
                resource: t.resource.clone(),
                status: t.status,
                op: Operation::Update,
                old: existing,
                new: Some(merged),
                owners: Some(owners),
                manager: owner_key,
                apply: true,
            });
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            if ct == "application/strategic-merge-patch+json" && t.resource.group.ends_with("kyverno.io") {
                return Err(status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    "strategic merge patch is not supported for custom resources",
                ));
            }
            let p = parse_body(body)?;
            let old = existing.as_ref().ok_or_else(|| not_found(t.resource, &name))?;
            let mut doc = old.clone();
            if ct == "application/strategic-merge-patch+json" {
                strategic(&mut doc, &p, "");
            } else {
                json_patch::merge(&mut doc, &p);
            }
            doc
        }
        "application/json-patch+json" => {
            let old = existing.as_ref().ok_or_else(|| not_found(t.resource, &name))?;
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", format!("invalid JSON patch: {e}")))?;
            let mut doc = old.clone();
            json_patch::patch(&mut doc, &p).map_err(|e| {
                status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", format!("the JSON patch could not be applied: {e}"))
            })?;
            doc
        }
        other => {
            return Err(status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                ),
            ));
        }
    };
    validate(t.resource, &new)?;
    let manager = if manager.is_empty() { "unknown".to_string() } else { manager };
    Ok(Change {
        k,
        resource: t.resource.clone(),
        status: t.status,
        op: Operation::Update,
        old: existing,
        new: Some(new),
        owners: None,
        manager,
        apply: false,
    })
}

/// Strategic merge patch for the built-in list keys (`ssa::list_key`); `null` deletes.
pub(crate) fn strategic(doc: &mut Value, patch: &Value, name: &str) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, pv) in p {
                if pv.is_null() {
                    d.remove(k);
                } else if let Some(dv) = d.get_mut(k) {
                    strategic(dv, pv, k);
                } else {
                    d.insert(k.clone(), pv.clone());
                }
            }
        }
        (Value::Array(d), Value::Array(p)) if ssa::list_key(name).is_some() => {
            let key = ssa::list_key(name).unwrap_or("name");
            for pe in p {
                let kv = pe.get(key);
                match d.iter_mut().find(|de| kv.is_some() && de.get(key) == kv) {
                    Some(de) => strategic(de, pe, ""),
                    None => d.push(pe.clone()),
                }
            }
        }
        (d, p) => *d = p.clone(),
    }
}

/// A DELETE, with the DeleteOptions body's `preconditions` (`uid`, `resourceVersion`) checked
/// against the stored object as the API server checks them (409 when either differs).
pub(crate) fn prepare_delete(s: &Store, t: &Target, body: &Bytes) -> Result<Change, Response> {
    let name = t.name.clone().unwrap_or_default();
    let k = (key(t.resource), t.namespace.clone(), name.clone());
    let old = s.objects.get(&k).cloned().ok_or_else(|| not_found(t.resource, &name))?;
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    for (field, meta, label) in [("uid", "uid", "UID"), ("resourceVersion", "resourceVersion", "ResourceVersion")] {
        let Some(want) = options.pointer(&format!("/preconditions/{field}")).and_then(Value::as_str) else { continue };
        let have = old.pointer(&format!("/metadata/{meta}")).and_then(Value::as_str).unwrap_or("");
        if want != have {
            return Err(status(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}",
                    t.resource.plural
                ),
            ));
        }
    }
    Ok(Change {
        k,
        resource: t.resource.clone(),
        status: false,
        op: Operation::Delete,
        old: Some(old),
        new: None,
        owners: None,
        manager: String::new(),
        apply: false,
    })
}

pub(crate) fn finalizers(o: &Value) -> bool {
    o.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty())
}

pub(crate) fn set_managed_fields(
    o: &mut Value,
    owners: &ssa::Owners,
    appliers: &std::collections::BTreeSet<String>,
    api_version: &str,
) {
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        if owners.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), ssa::managed_fields(owners, appliers, api_version));
        }
    }
}
