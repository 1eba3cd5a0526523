//! CustomResourceDefinitions: a CRD written becomes served resources (one per served
//! version, with its scope, short names and categories) and carries the status the API
//! server's CRD controller writes (`Established`, `NamesAccepted`, `acceptedNames`,
//! `storedVersions`); a CRD deleted takes its resources and their objects with it.

use super::*;
use std::collections::BTreeSet;

/// Names of CRD-defined resources, interned so `Resource` keeps `&'static str`: bounded by the
/// distinct names ever defined in this process (a test fake's handful).
fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = names.get(s) {
        return n;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// `status.storedVersions` of a CRD as written.
pub(crate) fn stored_versions(crd: Option<&Value>) -> Vec<String> {
    strings(crd.and_then(|c| c.pointer("/status/storedVersions")))
}

/// The status of an accepted CRD, set on every write: `storedVersions` keeps `stored` and adds
/// the storage version. Refused (422, as the API server's CRD validation) when a version that
/// objects may still be stored at is no longer in `spec.versions`.
pub(crate) fn accept(crd: &mut Value, stored: Vec<String>) -> Result<(), Response> {
    let versions: Vec<String> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    let mut stored = stored;
    for v in crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").and_then(Value::as_str))
    {
        if !stored.iter().any(|s| s == v) {
            stored.push(v.to_string());
        }
    }
    let missing: Vec<String> = stored
        .iter()
        .enumerate()
        .filter(|(_, s)| !versions.contains(s))
        .map(|(i, s)| format!("status.storedVersions[{i}]: Invalid value: \"{s}\": must appear in spec.versions"))
        .collect();
    if !missing.is_empty() {
        return Err(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {}", missing.join(", ")),
        ));
    }
    accept_names(crd, stored);
    Ok(())
}

fn accept_names(crd: &mut Value, stored: Vec<String>) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let mut accepted = names.clone();
    if let Some(m) = accepted.as_object_mut() {
        let kind = m.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        m.entry("singular").or_insert_with(|| json!(kind.to_lowercase()));
        m.entry("listKind").or_insert_with(|| json!(format!("{kind}List")));
    }
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "reason": reason, "message": msg, "lastTransitionTime": now});
    if let Some(m) = crd.as_object_mut() {
        m.insert(
            "status".into(),
            json!({
                "acceptedNames": accepted,
                "conditions": [
                    cond("NamesAccepted", "NoConflicts", "no conflicts found"),
                    cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                ],
                "storedVersions": stored,
            }),
        );
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

/// Recomputes the served resources from the stored CRDs; objects of resources no CRD serves
/// any more are removed (DELETED events), as the API server drops a deleted CRD's objects.
pub(crate) fn serve(inner: &Inner, s: &mut Store) {
    let mut served = inner.builtin.clone();
    for ((res, _, _), crd) in &s.objects {
        if res != "apiextensions.k8s.io/customresourcedefinitions"
            || crd.pointer("/metadata/deletionTimestamp").is_some()
        {
            continue;
        }
        let spec = &crd["spec"];
        let (Some(group), Some(kind), Some(plural)) = (
            spec["group"].as_str(),
            spec.pointer("/names/kind").and_then(Value::as_str),
            spec.pointer("/names/plural").and_then(Value::as_str),
        ) else {
            continue;
        };
        for v in spec["versions"].as_array().into_iter().flatten() {
            let Some(version) = v["name"].as_str() else { continue };
            if v.get("served").and_then(Value::as_bool) == Some(false)
                || served.iter().any(|r| r.group == group && r.version == version && r.plural == plural)
            {
                continue;
            }
            served.push(Resource {
                group: intern(group),
                version: intern(version),
                kind: intern(kind),
                plural: intern(plural),
                namespaced: spec["scope"] == "Namespaced",
                short_names: strings(spec.pointer("/names/shortNames")),
                categories: strings(spec.pointer("/names/categories")),
            });
        }
    }
    let keys: BTreeSet<String> = served.iter().map(key).collect();
    let gone: Vec<ObjKey> = s.objects.keys().filter(|k| !keys.contains(&k.0)).cloned().collect();
    let before: Vec<Resource> = inner.resources();
    for k in gone {
        let Some(r) = before.iter().find(|r| key(r) == k.0) else { continue };
        if let Some(o) = s.objects.get(&k).cloned() {
            remove_object(inner, s, r, &k, o);
        }
    }
    *inner.resources.write().unwrap_or_else(std::sync::PoisonError::into_inner) = served;
}

/// The API server's structural defaulting of a custom resource: every `default` of its CRD's
/// schema (for the version written) is filled in where the field is absent and its parent is
/// present, objects and list items walked, before the object is stored. Kyverno's CRDs default
/// `spec.admission`, `spec.background`, `rules[].skipBackgroundRequests`, … this way, and a
/// test reading a stored policy sees them.
pub(crate) fn apply_defaults(s: &Store, r: &Resource, o: &mut Value) {
    let name = format!("{}.{}", r.plural, r.group);
    let k = ("apiextensions.k8s.io/customresourcedefinitions".to_string(), String::new(), name);
    let Some(crd) = s.objects.get(&k) else { return };
    let schema = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["name"] == r.version))
        .and_then(|v| v.pointer("/schema/openAPIV3Schema"));
    if let Some(schema) = schema {
        default_into(schema, o);
    }
}

/// The openAPIV3Schema of the CRD serving `r` at its version, if it is a custom resource.
pub(crate) fn schema_of(s: &Store, r: &Resource) -> Option<Value> {
    let name = format!("{}.{}", r.plural, r.group);
    let k = ("apiextensions.k8s.io/customresourcedefinitions".to_string(), String::new(), name);
    s.objects
        .get(&k)?
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["name"] == r.version))
        .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
        .cloned()
}

/// The API server's structural validation of a custom resource, for the parts of a schema the
/// tests rely on: `required` properties, `enum` and `minimum`; each failure in Kubernetes'
/// field-error words (`spec.x: Required value`, `spec.y: Unsupported value: "z": supported
/// values: "a", "b"`), as (field, reason, message). Types are not checked.
pub(crate) fn schema_errors(schema: &Value, v: &Value, path: &str, out: &mut Vec<(String, &'static str, String)>) {
    if v.is_null() {
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let listed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        let message = format!("Unsupported value: {v}: supported values: {}", listed.join(", "));
        out.push((path.to_string(), "FieldValueNotSupported", message));
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64())
        && n < min
    {
        let message = format!("Invalid value: {v}: {path} in body should be greater than or equal to {min}");
        out.push((path.to_string(), "FieldValueInvalid", message));
    }
    let at = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    match v {
        Value::Object(m) => {
            for r in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
                if !m.contains_key(r) {
                    out.push((at(r), "FieldValueRequired", "Required value".to_string()));
                }
            }
            for (k, sub) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                if let Some(child) = m.get(k) {
                    schema_errors(sub, child, &at(k), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(each) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    schema_errors(each, x, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn default_into(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, sub) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                if !m.contains_key(k)
                    && let Some(d) = sub.get("default")
                {
                    m.insert(k.clone(), d.clone());
                }
                if let Some(child) = m.get_mut(k) {
                    default_into(sub, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(each) = schema.get("items") {
                for x in items {
                    default_into(each, x);
                }
            }
        }
        _ => {}
    }
}
