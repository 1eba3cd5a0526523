//! Strategic merge patch, our own (no Rust crate implements it).
//!
//! Semantics are those Kyverno gets from kustomize's kyaml merge (Kubernetes SMP as kustomize
//! applies it):
//! - maps merge key by key; `null` in the patch deletes the field;
//! - lists of built-in types with a patch merge key merge element by element on that key; the
//!   patch's elements come first, then the destination's other elements (kustomize's "prepend"
//!   direction, which is why mutate `foreach` with a strategic merge patch walks the list in
//!   reverse by default);
//! - primitive lists with a merge strategy (`finalizers`) are unions;
//! - every other list (including all lists of unknown kinds, i.e. CRDs) is replaced;
//! - directives: `$patch: replace|delete|merge` on maps and list elements, `{$patch: replace}`
//!   inside a merging list, `$retainKeys`, `$setElementOrder/<field>` and
//!   `$deleteFromPrimitiveList/<field>`.
//!
//! The knowledge of which Kubernetes list merges on which key is a table of facts about the
//! Kubernetes API, kept in [`field`] and nowhere else.

use serde_json::{Map, Value};

/// The types whose lists we know. Anything else merges maps and replaces lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// A type without known merge keys below it (CRDs, ConfigMap data, ...).
    Unknown,
    /// The top of an object of a known kind.
    Root(RootKind),
    ObjectMeta,
    /// `spec` of a workload with a pod `template`.
    WorkloadSpec,
    CronJobSpec,
    /// `jobTemplate` (metadata + JobSpec).
    JobTemplate,
    PodTemplate,
    PodSpec,
    Container,
    ServiceSpec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootKind {
    Pod,
    Workload,
    CronJob,
    PodTemplate,
    Service,
    /// Any other object: only `metadata` is known.
    Other,
}

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced by the patch's list.
    Atomic,
    /// Merged element by element on this key.
    Merge(&'static str),
    /// A primitive list merged as a set.
    Set,
}

/// A field's type and, for lists, how they merge and their element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub ty: Ty,
    pub list: ListKind,
}

const UNKNOWN: Field = Field { ty: Ty::Unknown, list: ListKind::Atomic };

const fn map(ty: Ty) -> Field {
    Field { ty, list: ListKind::Atomic }
}

const fn merge(key: &'static str, ty: Ty) -> Field {
    Field { ty, list: ListKind::Merge(key) }
}

/// The root type for an object of `kind` (`apiVersion` does not change merge keys for the
/// kinds we know).
pub fn root(kind: &str) -> Ty {
    Ty::Root(match kind {
        "Pod" => RootKind::Pod,
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" | "ReplicationController" => {
            RootKind::Workload
        }
        "CronJob" => RootKind::CronJob,
        "PodTemplate" => RootKind::PodTemplate,
        "Service" => RootKind::Service,
        _ => RootKind::Other,
    })
}

/// The table: the field `name` inside a value of type `ty`.
pub fn field(ty: Ty, name: &str) -> Field {
    match (ty, name) {
        (Ty::Root(_), "metadata") => map(Ty::ObjectMeta),
        (Ty::Root(RootKind::Pod), "spec") => map(Ty::PodSpec),
        (Ty::Root(RootKind::Workload), "spec") => map(Ty::WorkloadSpec),
        (Ty::Root(RootKind::CronJob), "spec") => map(Ty::CronJobSpec),
        (Ty::Root(RootKind::PodTemplate), "template") => map(Ty::PodTemplate),
        (Ty::Root(RootKind::Service), "spec") => map(Ty::ServiceSpec),
        (Ty::ObjectMeta, "finalizers") => Field { ty: Ty::Unknown, list: ListKind::Set },
        (Ty::ObjectMeta, "ownerReferences") => merge("uid", Ty::Unknown),
        (Ty::WorkloadSpec, "template") => map(Ty::PodTemplate),
        (Ty::CronJobSpec, "jobTemplate") => map(Ty::JobTemplate),
        (Ty::JobTemplate, "metadata") => map(Ty::ObjectMeta),
        (Ty::JobTemplate, "spec") => map(Ty::WorkloadSpec),
        (Ty::PodTemplate, "metadata") => map(Ty::ObjectMeta),
        (Ty::PodTemplate, "spec") => map(Ty::PodSpec),
        (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => merge("name", Ty::Container),
        (Ty::PodSpec, "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => {
            merge("name", Ty::Unknown)
        }
        (Ty::PodSpec, "hostAliases") => merge("ip", Ty::Unknown),
        (Ty::PodSpec, "topologySpreadConstraints") => merge("topologyKey", Ty::Unknown),
        (Ty::Container, "env") => merge("name", Ty::Unknown),
        (Ty::Container, "ports") => merge("containerPort", Ty::Unknown),
        (Ty::Container, "volumeMounts") => merge("mountPath", Ty::Unknown),
        (Ty::Container, "volumeDevices") => merge("devicePath", Ty::Unknown),
        (Ty::ServiceSpec, "ports") => merge("port", Ty::Unknown),
        _ => UNKNOWN,
    }
}

/// Why a strategic merge patch does not apply; `at` is the JSON pointer where it failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MergeError {
    #[error("unknown $patch directive {directive} at {at}")]
    UnknownDirective { directive: Value, at: String },
    /// A map or list in the patch where the document has a scalar or the other container.
    #[error("cannot merge a {patch} into a {found} at {at}")]
    Mismatch { patch: &'static str, found: &'static str, at: String },
    #[error("cannot replace a {found} with a {patch} at {at}")]
    Replace { found: &'static str, patch: &'static str, at: String },
}

/// Applies `patch` to `doc` (an object of `kind`). Errors say where and why.
pub fn apply(doc: &Value, patch: &Value, kind: &str) -> Result<Value, MergeError> {
    let ty = root(kind);
    match merge_value(Some(doc.clone()), patch, Field { ty, list: ListKind::Atomic }, "")? {
        Some(v) => Ok(v),
        None => Ok(Value::Object(Map::new())),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

fn at(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

/// Merges one patch value into an optional destination value; `None` means "delete".
fn merge_value(dest: Option<Value>, patch: &Value, f: Field, path: &str) -> Result<Option<Value>, MergeError> {
    match patch {
        Value::Null => Ok(None),
        Value::Object(p) => {
            match p.get("$patch") {
                Some(Value::String(d)) if d == "delete" => return Ok(None),
                Some(Value::String(d)) if d == "replace" => {
                    return merge_map(Map::new(), p, f.ty, path).map(|m| Some(Value::Object(m)));
                }
                Some(Value::String(d)) if d == "merge" => {}
                Some(other) => {
                    return Err(MergeError::UnknownDirective { directive: other.clone(), at: at(path).to_string() });
                }
                None => {}
            }
            match dest {
                // As kustomize's merge (Kyverno's): a map the destination lacks is added only
                // when something is left in it (`emptyDir: {}` or `securityContext:
                // {seLinuxOptions: {}}` adds nothing).
                None | Some(Value::Null) => {
                    merge_map(Map::new(), p, f.ty, path).map(|m| (!m.is_empty()).then_some(Value::Object(m)))
                }
                Some(Value::Object(d)) => merge_map(d, p, f.ty, path).map(|m| Some(Value::Object(m))),
                Some(other) => {
                    Err(MergeError::Mismatch { patch: "map", found: type_name(&other), at: at(path).to_string() })
                }
            }
        }
        Value::Array(p) => match dest {
            None | Some(Value::Null) => merge_list(Vec::new(), p, f, path).map(|l| l.map(Value::Array)),
            Some(Value::Array(d)) => merge_list(d, p, f, path).map(|l| l.map(Value::Array)),
            Some(other) => {
                Err(MergeError::Mismatch { patch: "list", found: type_name(&other), at: at(path).to_string() })
            }
        },
        scalar => match dest {
            Some(d @ (Value::Object(_) | Value::Array(_))) => {
                Err(MergeError::Replace { found: type_name(&d), patch: type_name(scalar), at: at(path).to_string() })
            }
            _ => Ok(Some(scalar.clone())),
        },
    }
}

fn merge_map(
    mut dest: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
    path: &str,
) -> Result<Map<String, Value>, MergeError> {
    for (k, pv) in patch {
        if k == "$patch"
            || k == "$retainKeys"
            || k.starts_with("$setElementOrder/")
            || k.starts_with("$deleteFromPrimitiveList/")
        {
            continue;
        }
        let child = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
        if let Some(v) = merge_value(dest.remove(k), pv, field(ty, k), &child)? {
            dest.insert(k.clone(), v);
        }
    }
    for (k, pv) in patch {
        if let Some(name) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let gone = pv.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(items)) = dest.get_mut(name) {
                items.retain(|x| !gone.contains(x));
            }
        } else if let Some(name) = k.strip_prefix("$setElementOrder/") {
            let order = pv.as_array().cloned().unwrap_or_default();
            let key = match field(ty, name).list {
                ListKind::Merge(key) => Some(key),
                _ => None,
            };
            if let Some(Value::Array(items)) = dest.get_mut(name) {
                set_element_order(items, &order, key);
            }
        }
    }
    if let Some(keep) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        dest.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(dest)
}

/// The merge-key value of a list element as a string (kyaml compares scalar text).
fn key_of(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

fn merge_list(dest: Vec<Value>, patch: &[Value], f: Field, path: &str) -> Result<Option<Vec<Value>>, MergeError> {
    match f.list {
        ListKind::Atomic => {
            // Replaced; elements that are maps still have their directives resolved.
            let mut out = Vec::with_capacity(patch.len());
            for (i, p) in patch.iter().enumerate() {
                if let Some(v) =
                    merge_value(None, p, Field { ty: f.ty, list: ListKind::Atomic }, &format!("{path}/{i}"))?
                {
                    out.push(v);
                }
            }
            Ok(Some(out))
        }
        ListKind::Set => {
            let mut out: Vec<Value> = Vec::new();
            for v in patch.iter().chain(dest.iter()) {
                if !v.is_null() && !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Ok(Some(out))
        }
        ListKind::Merge(key) => {
            let directive = |v: &Value| {
                v.as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.get("$patch"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let mut dest = dest;
            let mut patch_items: Vec<&Value> = Vec::new();
            for p in patch {
                match directive(p).as_deref() {
                    Some("replace") => dest.clear(),
                    Some("delete") => return Ok(None),
                    _ => patch_items.push(p),
                }
            }
            let elem = Field { ty: f.ty, list: ListKind::Atomic };
            // Keys in kustomize's prepend order: the patch's, then the destination's others.
            let mut keys: Vec<String> = Vec::new();
            for v in patch_items.iter().copied().chain(dest.iter()) {
                if let Some(k) = key_of(v, key)
                    && !keys.contains(&k)
                {
                    keys.push(k);
                }
            }
            let mut out: Vec<Value> = Vec::with_capacity(keys.len());
            for k in &keys {
                let d = dest
                    .iter()
                    .position(|x| key_of(x, key).as_deref() == Some(k.as_str()))
                    .map(|i| dest.swap_remove_keep(i));
                let p = patch_items.iter().find(|x| key_of(x, key).as_deref() == Some(k.as_str()));
                let merged = match p {
                    Some(p) => merge_value(d, p, elem, &format!("{path}[{key}={k}]"))?,
                    None => d,
                };
                match merged {
                    None => {}
                    Some(Value::Object(m)) if m.is_empty() => {}
                    Some(mut v) => {
                        if let Some(o) = v.as_object_mut()
                            && !o.contains_key(key)
                        {
                            o.insert(key.to_string(), Value::String(k.clone()));
                        }
                        out.push(v);
                    }
                }
            }
            // Destination elements without the key stay, after the others.
            out.extend(dest.into_iter().filter(|x| !x.is_null() && key_of(x, key).is_none()));
            Ok(Some(out))
        }
    }
}

trait TakeKeep {
    fn swap_remove_keep(&mut self, i: usize) -> Value;
}

impl TakeKeep for Vec<Value> {
    /// Takes element `i`, leaving `null` in its place so positions stay stable.
    fn swap_remove_keep(&mut self, i: usize) -> Value {
        match self.get_mut(i) {
            Some(slot) => std::mem::take(slot),
            None => Value::Null,
        }
    }
}

fn set_element_order(items: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let id = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let mut rest: Vec<Value> = std::mem::take(items);
    let mut ordered = Vec::with_capacity(rest.len());
    for o in order {
        let o = match key {
            Some(k) => o.get(k).cloned().unwrap_or_else(|| o.clone()),
            None => o.clone(),
        };
        if let Some(i) = rest.iter().position(|x| id(x) == o) {
            ordered.push(rest.remove(i));
        }
    }
    ordered.extend(rest);
    *items = ordered;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn a_new_map_with_nothing_in_it_is_not_added() {
        let d = pod(json!({"containers": [{"name": "c0"}], "volumes": [{"name": "other", "emptyDir": {}}]}));
        let p = json!({"metadata": {"labels": {}}, "spec": {"securityContext": {"seLinuxOptions": {}},
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "containers": [{"name": "c0", "resources": {}, "env": [], "securityContext": {"capabilities": {}, "runAsUser": 5}}]}});
        let out = apply(&d, &p, "Pod").unwrap_or_default();
        assert_eq!(out["metadata"], json!({"name": "p"}));
        assert_eq!(out["spec"].get("securityContext"), None);
        assert_eq!(out["spec"]["volumes"], json!([{"name": "cache"}, {"name": "other", "emptyDir": {}}]));
        assert_eq!(out["spec"]["containers"], json!([{"name": "c0", "env": [], "securityContext": {"runAsUser": 5}}]));
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let d = json!({"kind": "ConfigMap", "data": {"a": "1", "b": "2"}});
        let out = apply(&d, &json!({"data": {"b": null, "c": "3"}}), "ConfigMap").unwrap_or_default();
        assert_eq!(out, json!({"kind": "ConfigMap", "data": {"a": "1", "c": "3"}}));
    }

    #[test]
    fn containers_merge_by_name_patch_first() {
        let d = pod(json!({"containers": [{"name": "app", "image": "nginx"}]}));
        let p = json!({"spec": {"containers": [{"name": "sidecar", "image": "envoy"}, {"name": "app", "imagePullPolicy": "Always"}]}});
        let out = apply(&d, &p, "Pod").unwrap_or_default();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "sidecar", "image": "envoy"}, {"name": "app", "image": "nginx", "imagePullPolicy": "Always"}])
        );
    }

    #[test]
    fn destination_only_elements_keep_their_order_after_patched_ones() {
        let d = pod(json!({"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}));
        let out = apply(&d, &json!({"spec": {"containers": [{"name": "b", "x": 1}]}}), "Pod").unwrap_or_default();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "x": 1}, {"name": "a"}, {"name": "c"}]));
    }

    #[test]
    fn nested_merge_keys_env_ports_volume_mounts() {
        let d = pod(
            json!({"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}], "ports": [{"containerPort": 80}], "volumeMounts": [{"mountPath": "/a", "name": "v"}]}]}),
        );
        let p = json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "2"}, {"name": "Y", "value": "3"}], "ports": [{"containerPort": 80, "protocol": "TCP"}], "volumeMounts": [{"mountPath": "/b", "name": "w"}]}]}});
        let out = apply(&d, &p, "Pod").unwrap_or_default();
        let c = &out["spec"]["containers"][0];
        assert_eq!(c["env"], json!([{"name": "X", "value": "2"}, {"name": "Y", "value": "3"}]));
        assert_eq!(c["ports"], json!([{"containerPort": 80, "protocol": "TCP"}]));
        assert_eq!(c["volumeMounts"], json!([{"mountPath": "/b", "name": "w"}, {"mountPath": "/a", "name": "v"}]));
    }

    #[test]
    fn workload_templates_reach_the_pod_spec() {
        let d = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a"}]}}}}}});
        let p = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "b"}]}}}}}});
        let out = apply(&d, &p, "CronJob").unwrap_or_default();
        assert_eq!(
            out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"],
            json!([{"name": "b"}, {"name": "a"}])
        );
        let d = json!({"kind": "Deployment", "spec": {"template": {"spec": {"volumes": [{"name": "a"}]}}}});
        let out = apply(
            &d,
            &json!({"spec": {"template": {"spec": {"volumes": [{"name": "b", "emptyDir": {}}]}}}}),
            "Deployment",
        )
        .unwrap_or_default();
        // The new volume's empty `emptyDir` is not added (Kyverno's CLI writes `- name: b`).
        assert_eq!(out["spec"]["template"]["spec"]["volumes"], json!([{"name": "b"}, {"name": "a"}]));
    }

    #[test]
    fn lists_without_merge_keys_are_replaced() {
        let d = pod(json!({"tolerations": [{"key": "a"}], "containers": [{"name": "a", "args": ["x", "y"]}]}));
        let p = json!({"spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "a", "args": ["z"]}]}});
        let out = apply(&d, &p, "Pod").unwrap_or_default();
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["z"]));
        // A CRD: lists of maps with names are still replaced.
        let d = json!({"kind": "ScaledObject", "spec": {"triggers": [{"name": "a"}]}});
        let out = apply(&d, &json!({"spec": {"triggers": [{"name": "b"}]}}), "ScaledObject").unwrap_or_default();
        assert_eq!(out["spec"]["triggers"], json!([{"name": "b"}]));
    }

    #[test]
    fn finalizers_are_a_set() {
        let d = json!({"kind": "Namespace", "metadata": {"finalizers": ["a", "b"]}});
        let out = apply(&d, &json!({"metadata": {"finalizers": ["c", "a"]}}), "Namespace").unwrap_or_default();
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
    }

    #[test]
    fn patch_directives() {
        let d = pod(
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "b"}], "securityContext": {"runAsUser": 1, "fsGroup": 2}}),
        );
        // delete one element
        let out =
            apply(&d, &json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}), "Pod").unwrap_or_default();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b"}]));
        // replace the list
        let out = apply(&d, &json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}), "Pod")
            .unwrap_or_default();
        assert_eq!(out["spec"]["containers"], json!([{"name": "c"}]));
        // replace a map
        let out = apply(&d, &json!({"spec": {"securityContext": {"runAsUser": 5, "$patch": "replace"}}}), "Pod")
            .unwrap_or_default();
        assert_eq!(out["spec"]["securityContext"], json!({"runAsUser": 5}));
        // delete a map
        let out = apply(&d, &json!({"spec": {"securityContext": {"$patch": "delete"}}}), "Pod").unwrap_or_default();
        assert!(out["spec"].get("securityContext").is_none());
        // retainKeys
        let out = apply(&d, &json!({"spec": {"securityContext": {"$retainKeys": ["fsGroup"], "fsGroup": 3}}}), "Pod")
            .unwrap_or_default();
        assert_eq!(out["spec"]["securityContext"], json!({"fsGroup": 3}));
        // setElementOrder
        let out = apply(&d, &json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}], "containers": [{"name": "a", "image": "y"}]}}), "Pod").unwrap_or_default();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b"}, {"name": "a", "image": "y"}]));
        // deleteFromPrimitiveList
        let d = json!({"kind": "Namespace", "metadata": {"finalizers": ["a", "b"]}});
        let out = apply(&d, &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}), "Namespace")
            .unwrap_or_default();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn new_content_drops_nulls_and_directives() {
        let d = pod(json!({}));
        let out = apply(&d, &json!({"spec": {"securityContext": {"a": null, "b": 1, "$patch": "merge"}}}), "Pod")
            .unwrap_or_default();
        assert_eq!(out["spec"]["securityContext"], json!({"b": 1}));
    }

    #[test]
    fn type_mismatches_are_errors_with_paths() {
        let d = pod(json!({"containers": [{"name": "a"}]}));
        let e =
            apply(&d, &json!({"spec": {"containers": "x"}}), "Pod").err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(e, "cannot replace a list with a string at /spec/containers");
        let e = apply(&d, &json!({"spec": {"containers": {"a": 1}}}), "Pod")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(e, "cannot merge a map into a list at /spec/containers");
    }
}
