//! A server-side apply subset: field sets per manager, merging by list keys, removal of fields
//! a manager stopped applying, and conflicts for non-forced applies.
//!
//! What it models: associative lists keyed by the names in [`list_key`] (everything else is an
//! atomic list, owned and replaced as a whole); the last applied field set of each apply
//! manager; fields changed by ordinary writes (PUT, merge or JSON patch) pass to that writer's
//! manager. What it does not: schemas of custom resources (their lists are atomic), `x-kubernetes-
//! map-type: atomic` maps, set-type lists, and `managedFields` in responses (kept server-side).

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seg {
    Field(String),
    /// The element of an associative list whose key field has this value.
    Key(String, String),
}

pub type Path = Vec<Seg>;
/// manager → the leaf fields it owns.
pub type Owners = BTreeMap<String, BTreeSet<Path>>;

/// The merge key of an associative list, by field name (Kubernetes' built-in types).
pub fn list_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "webhooks" => "name",
        "ownerReferences" => "uid",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "volumeMounts"
        | "imagePullSecrets" => "name",
        "conditions" => "type",
        "subjects" => "name",
        _ => return None,
    })
}

/// Metadata fields the server owns; never part of a field set.
const SERVER_META: [&str; 8] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
];

fn key_of(elem: &Value, key: &str) -> Option<String> {
    match elem.get(key)? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The leaf fields set in `v`, with their paths.
pub fn leaves(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(m) = v.as_object() {
        for (k, child) in m {
            if k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                if let Some(meta) = child.as_object() {
                    for (mk, mv) in meta.iter().filter(|(mk, _)| !SERVER_META.contains(&mk.as_str())) {
                        walk(mk, mv, &mut vec![Seg::Field("metadata".into())], &mut out);
                    }
                }
                continue;
            }
            walk(k, child, &mut Vec::new(), &mut out);
        }
    }
    out
}

fn walk(name: &str, v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    prefix.push(Seg::Field(name.to_string()));
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                walk(k, child, prefix, out);
            }
        }
        Value::Array(items) if list_key(name).is_some() && !items.is_empty() => {
            let key = list_key(name).unwrap_or("name");
            for item in items {
                let Some(kv) = key_of(item, key) else { continue };
                prefix.push(Seg::Key(key.to_string(), kv));
                // The element itself (its key field) is a leaf, so that an element stays while
                // its applier owns it even when every other field is gone.
                out.insert(prefix.clone());
                if let Some(m) = item.as_object() {
                    for (k, child) in m.iter().filter(|(k, _)| k.as_str() != key) {
                        walk(k, child, prefix, out);
                    }
                }
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
    prefix.pop();
}

/// The value at `path`, if present.
pub fn get<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::Field(f) => cur.get(f)?,
            Seg::Key(k, kv) => cur.as_array()?.iter().find(|e| key_of(e, k).as_deref() == Some(kv.as_str()))?,
        };
    }
    Some(cur)
}

/// Removes the field or list element at `path`; empty maps left behind are removed too.
pub fn remove(v: &mut Value, path: &[Seg]) {
    let Some((last, parents)) = path.split_last() else { return };
    let Some(parent) = get_mut(v, parents) else { return };
    match last {
        Seg::Field(f) => {
            if let Some(m) = parent.as_object_mut() {
                m.remove(f);
            }
        }
        Seg::Key(k, kv) => {
            if let Some(a) = parent.as_array_mut() {
                a.retain(|e| key_of(e, k).as_deref() != Some(kv.as_str()));
            }
        }
    }
    let empty = match parent {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if empty && !parents.is_empty() {
        remove(v, parents);
    }
}

fn get_mut<'a>(v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::Field(f) => cur.get_mut(f)?,
            Seg::Key(k, kv) => cur.as_array_mut()?.iter_mut().find(|e| key_of(e, k).as_deref() == Some(kv.as_str()))?,
        };
    }
    Some(cur)
}

/// Merges an applied configuration into the live object: maps field by field, associative
/// lists element by element (new elements appended), everything else replaced.
pub fn merge(live: &mut Value, applied: &Value) {
    merge_named(live, applied, "");
}

fn merge_named(live: &mut Value, applied: &Value, name: &str) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                match l.get_mut(k) {
                    Some(lv) => merge_named(lv, av, k),
                    None => {
                        l.insert(k.clone(), av.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) if list_key(name).is_some() => {
            let key = list_key(name).unwrap_or("name");
            for ae in a {
                let kv = key_of(ae, key);
                match l.iter_mut().find(|le| kv.is_some() && key_of(le, key) == kv) {
                    Some(le) => merge_named(le, ae, ""),
                    None => l.push(ae.clone()),
                }
            }
        }
        (l, a) => *l = a.clone(),
    }
}

/// A path as the API server prints it in conflict messages (`.spec.webhooks[name="x"].rules`).
pub fn display(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Seg::Key(k, v) => s.push_str(&format!("[{k}={v:?}]")),
        }
    }
    s
}

/// Applies `applied` for `manager`. Returns the new object, or the conflicts when another
/// manager owns a field with a different value and `force` is off.
pub fn apply(
    live: &Value,
    applied: &Value,
    owners: &mut Owners,
    manager: &str,
    force: bool,
) -> Result<Value, Vec<(String, Path)>> {
    let new_set = leaves(applied);
    let mut conflicts = Vec::new();
    for (other, set) in owners.iter().filter(|(m, _)| m.as_str() != manager) {
        // A list element's own path is shared freely: two managers may both name an entry.
        for p in new_set.intersection(set).filter(|p| !matches!(p.last(), Some(Seg::Key(..)))) {
            if get(live, p) != get(applied, p) {
                conflicts.push((other.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (other, p) in &conflicts {
        if let Some(set) = owners.get_mut(other) {
            set.remove(p);
        }
    }
    let mut out = live.clone();
    let old_set = owners.get(manager).cloned().unwrap_or_default();
    for p in old_set.difference(&new_set) {
        let shared = owners.iter().any(|(m, set)| m != manager && set.iter().any(|q| q.starts_with(p)));
        if !shared {
            remove(&mut out, p);
        }
    }
    merge(&mut out, applied);
    owners.insert(manager.to_string(), new_set);
    owners.retain(|_, set| !set.is_empty());
    Ok(out)
}

/// An ordinary write by `manager`: the fields it changed or added become its own; fields that
/// are gone leave every set.
pub fn record_update(old: &Value, new: &Value, owners: &mut Owners, manager: &str) {
    let before = leaves(old);
    let after = leaves(new);
    let changed: BTreeSet<Path> =
        after.iter().filter(|p| !before.contains(*p) || get(old, p) != get(new, p)).cloned().collect();
    for set in owners.values_mut() {
        set.retain(|p| after.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        owners.entry(manager.to_string()).or_default().extend(changed);
    }
    owners.retain(|_, set| !set.is_empty());
}

/// `metadata.managedFields` entries for the response (FieldsV1 shape, sorted by manager).
pub fn managed_fields(owners: &Owners, appliers: &BTreeSet<String>, api_version: &str) -> Value {
    let mut out = Vec::new();
    for (m, set) in owners {
        let mut root = Map::new();
        for p in set {
            let mut cur = &mut root;
            for seg in p {
                let k = match seg {
                    Seg::Field(f) => format!("f:{f}"),
                    Seg::Key(k, v) => format!("k:{}", serde_json::json!({ k: v })),
                };
                let next = cur.entry(k).or_insert_with(|| Value::Object(Map::new()));
                let Some(m) = next.as_object_mut() else { break };
                cur = m;
            }
        }
        let op = if appliers.contains(m) { "Apply" } else { "Update" };
        out.push(serde_json::json!({"manager": m, "operation": op, "apiVersion": api_version, "fieldsType": "FieldsV1", "fieldsV1": root}));
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn two_managers_share_a_webhook_list() {
        let chart = json!({"webhooks": [{"name": "a", "sideEffects": "None", "failurePolicy": "Fail"}]});
        let mut owners = Owners::new();
        let live = apply(&json!({}), &chart, &mut owners, "helm", false).unwrap();
        let verno = json!({"webhooks": [{"name": "a", "rules": [{"operations": ["CREATE"]}]}]});
        let live = apply(&live, &verno, &mut owners, "verno", false).unwrap();
        assert_eq!(live["webhooks"][0]["failurePolicy"], "Fail");
        assert_eq!(live["webhooks"][0]["rules"][0]["operations"][0], "CREATE");
        // Verno stops applying rules: they go, the chart's fields stay.
        let live = apply(&live, &json!({"webhooks": [{"name": "a"}]}), &mut owners, "verno", false).unwrap();
        assert!(live["webhooks"][0].get("rules").is_none());
        assert_eq!(live["webhooks"][0]["failurePolicy"], "Fail");
        // Verno may not change the chart's failurePolicy without force.
        let err =
            apply(&live, &json!({"webhooks": [{"name": "a", "failurePolicy": "Ignore"}]}), &mut owners, "verno", false)
                .unwrap_err();
        assert_eq!(err[0].0, "helm");
        assert_eq!(display(&err[0].1), ".webhooks[name=\"a\"].failurePolicy");
        let forced =
            apply(&live, &json!({"webhooks": [{"name": "a", "failurePolicy": "Ignore"}]}), &mut owners, "verno", true)
                .unwrap();
        assert_eq!(forced["webhooks"][0]["failurePolicy"], "Ignore");
    }

    #[test]
    fn an_update_takes_the_fields_it_changes() {
        let mut owners = Owners::new();
        let live = apply(&json!({}), &json!({"spec": {"holderIdentity": "a"}}), &mut owners, "a", false).unwrap();
        let mut new = live.clone();
        new["spec"]["holderIdentity"] = json!("b");
        record_update(&live, &new, &mut owners, "b");
        assert!(!owners.contains_key("a"));
        // a's non-forced apply now conflicts with b's write.
        assert!(apply(&new, &json!({"spec": {"holderIdentity": "a"}}), &mut owners, "a", false).is_err());
    }
}
