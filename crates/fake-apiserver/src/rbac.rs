//! RBAC as the API server's authorizer decides it, for `SubjectAccessReview` and
//! `SelfSubjectAccessReview` (`authorization.k8s.io/v1`).
//!
//! The fake does not enforce authorization on its own requests (every client may do
//! everything); it answers access reviews from the ClusterRoles, Roles and bindings stored in it,
//! as Kubernetes' RBAC authorizer would, so that a controller checking its own permissions (as
//! Kyverno's policy status does for the reports controller) sees what a real cluster with the same
//! RBAC objects would answer. Members of `system:masters` are allowed everything. Aggregated
//! ClusterRoles (`aggregationRule`) are resolved when a review is made, not written back into the
//! stored object as Kubernetes' aggregation controller does.
//!
//! Kubernetes' bootstrap roles are only partly modelled: `cluster-admin`, and `view` aggregated
//! from `system:aggregate-to-view` with the read rules Kubernetes 1.34 gives it.

use crate::{Inner, Store, lock, ok_json, status, system_create};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

const GROUP: &str = "rbac.authorization.k8s.io";

/// What a review asks about.
#[derive(Debug, Default)]
pub(crate) struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub namespace: String,
    /// A non-resource request (`/healthz`, …): `resource` is empty and this is the path.
    pub path: Option<String>,
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let verbs = strs(rule.get("verbs"));
    if !verbs.iter().any(|v| *v == "*" || *v == a.verb) {
        return false;
    }
    if let Some(path) = &a.path {
        return strs(rule.get("nonResourceURLs"))
            .iter()
            .any(|u| *u == "*" || *u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix)));
    }
    if !strs(rule.get("apiGroups")).iter().any(|g| *g == "*" || *g == a.group) {
        return false;
    }
    let combined =
        if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
    let resource_ok = strs(rule.get("resources")).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/").is_some_and(|sub| sub == a.subresource))
    });
    if !resource_ok {
        return false;
    }
    let names = strs(rule.get("resourceNames"));
    names.is_empty() || names.contains(&a.name.as_str())
}

fn label_selector_matches(selector: &Value, labels: &Value) -> bool {
    let ok_labels = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let ok_exprs = selector.get("matchExpressions").and_then(Value::as_array).is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or("");
            let values = strs(e.get("values"));
            let have = labels.get(key).and_then(Value::as_str);
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => have.is_some_and(|h| values.contains(&h)),
                "NotIn" => have.is_none_or(|h| !values.contains(&h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
    });
    ok_labels && ok_exprs
}

/// The rules of a ClusterRole, with those it aggregates.
fn cluster_role_rules(s: &Store, name: &str) -> Vec<Value> {
    let key = (format!("{GROUP}/clusterroles"), String::new(), name.to_string());
    let Some(role) = s.objects.get(&key) else { return Vec::new() };
    let mut rules: Vec<Value> = role.get("rules").and_then(Value::as_array).cloned().unwrap_or_default();
    let selectors = role.pointer("/aggregationRule/clusterRoleSelectors").and_then(Value::as_array);
    for selector in selectors.into_iter().flatten() {
        for ((k, _, other), o) in &s.objects {
            if k != &format!("{GROUP}/clusterroles") || other == name {
                continue;
            }
            let labels = o.pointer("/metadata/labels").cloned().unwrap_or(Value::Null);
            if label_selector_matches(selector, &labels) {
                rules.extend(o.get("rules").and_then(Value::as_array).cloned().unwrap_or_default());
            }
        }
    }
    rules
}

fn subject_matches(subject: &Value, user: &str, groups: &[String], binding_ns: &str) -> bool {
    let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
    match subject.get("kind").and_then(Value::as_str).unwrap_or("") {
        "User" => name == user,
        "Group" => groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = subject.get("namespace").and_then(Value::as_str).filter(|n| !n.is_empty()).unwrap_or(binding_ns);
            user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// Whether RBAC allows the request, and the authorizer's reason (empty when denied, as
/// Kubernetes' RBAC authorizer gives no reason for a request no rule allows).
pub(crate) fn authorize(s: &Store, user: &str, groups: &[String], a: &Attributes) -> (bool, String) {
    if groups.iter().any(|g| g == "system:masters") {
        return (true, String::new());
    }
    let describe = |subject: &Value| {
        let kind = subject.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
        match subject.get("namespace").and_then(Value::as_str) {
            Some(ns) if kind == "ServiceAccount" => format!("{kind} \"{ns}/{name}\""),
            _ => format!("{kind} \"{name}\""),
        }
    };
    let (cluster_bindings, bindings) = (format!("{GROUP}/clusterrolebindings"), format!("{GROUP}/rolebindings"));
    let bindings = crate::objects_of(&s.objects, &cluster_bindings).chain(
        crate::objects_of(&s.objects, &bindings)
            .filter(|((_, ns, _), _)| !a.namespace.is_empty() && *ns == a.namespace),
    );
    for ((k, ns, name), binding) in bindings {
        let namespaced = k.ends_with("/rolebindings");
        let Some(subject) = binding
            .get("subjects")
            .and_then(Value::as_array)
            .and_then(|subs| subs.iter().find(|sub| subject_matches(sub, user, groups, ns)))
        else {
            continue;
        };
        let role_kind = binding.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or("");
        let role_name = binding.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("");
        let rules = match role_kind {
            "ClusterRole" => cluster_role_rules(s, role_name),
            "Role" if namespaced => s
                .objects
                .get(&(format!("{GROUP}/roles"), ns.clone(), role_name.to_string()))
                .and_then(|r| r.get("rules"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if rules.iter().any(|r| rule_allows(r, a)) {
            let by = if namespaced {
                format!("RoleBinding \"{name}/{ns}\"")
            } else {
                format!("ClusterRoleBinding \"{name}\"")
            };
            return (true, format!("RBAC: allowed by {by} of {role_kind} \"{role_name}\" to {}", describe(subject)));
        }
    }
    (false, String::new())
}

/// Answers a POST of a `SubjectAccessReview` or `SelfSubjectAccessReview`: the review with its
/// `status` filled in (nothing is stored, as in Kubernetes).
pub(crate) fn review(inner: &Inner, plural: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let mut review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("invalid JSON: {e}")),
    };
    let spec = review.get("spec").cloned().unwrap_or(Value::Null);
    let (user, groups) = if plural == "selfsubjectaccessreviews" {
        crate::user(headers)
    } else {
        let user = spec.get("user").and_then(Value::as_str).unwrap_or("").to_string();
        let groups: Vec<String> = strs(spec.get("groups")).into_iter().map(str::to_string).collect();
        if user.is_empty() && groups.is_empty() {
            let kind = "SubjectAccessReview";
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!(
                    "{kind}.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
                ),
            );
        }
        (user, groups)
    };
    let attrs = if let Some(r) = spec.get("resourceAttributes") {
        let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Attributes {
            verb: field("verb"),
            group: field("group"),
            resource: field("resource"),
            subresource: field("subresource"),
            name: field("name"),
            namespace: field("namespace"),
            path: None,
        }
    } else if let Some(n) = spec.get("nonResourceAttributes") {
        let field = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Attributes { verb: field("verb"), path: Some(field("path")), ..Attributes::default() }
    } else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.resourceAttributes: Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        );
    };
    let (allowed, reason) = authorize(&lock(&inner.store), &user, &groups, &attrs);
    let st =
        if reason.is_empty() { json!({"allowed": allowed}) } else { json!({"allowed": allowed, "reason": reason}) };
    if let Some(m) = review.as_object_mut() {
        m.insert("status".into(), st);
        m.entry("metadata").or_insert(json!({"creationTimestamp": null}));
    }
    ok_json_created(&review)
}

fn ok_json_created(v: &Value) -> Response {
    ok_json(StatusCode::CREATED, v)
}

/// The bootstrap roles a new API server has (the part the fake models).
pub(crate) fn bootstrap(inner: &Inner, s: &mut Store) {
    let read = ["get", "list", "watch"];
    let aggregate_to_view = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "system:aggregate-to-view", "labels": {
            "kubernetes.io/bootstrapping": "rbac-defaults",
            "rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods", "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services", "services/status"], "verbs": read},
            {"apiGroups": [""], "resources": ["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status", "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"], "verbs": read},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": read},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {"apiGroups": ["apps"], "resources": ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale", "deployments/status", "replicasets", "replicasets/scale", "replicasets/status", "statefulsets", "statefulsets/scale", "statefulsets/status"], "verbs": read},
            {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers", "horizontalpodautoscalers/status"], "verbs": read},
            {"apiGroups": ["batch"], "resources": ["cronjobs", "cronjobs/status", "jobs", "jobs/status"], "verbs": read},
            {"apiGroups": ["extensions"], "resources": ["daemonsets", "daemonsets/status", "deployments", "deployments/scale", "deployments/status", "ingresses", "ingresses/status", "networkpolicies", "replicasets", "replicasets/scale", "replicasets/status", "replicationcontrollers/scale"], "verbs": read},
            {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets", "poddisruptionbudgets/status"], "verbs": read},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingresses/status", "networkpolicies"], "verbs": read},
        ],
    });
    let view = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "view", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]},
        "rules": [],
    });
    let cluster_admin = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    });
    let masters = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": "system:masters"}],
    });
    for o in [aggregate_to_view, view, cluster_admin] {
        system_create(inner, s, GROUP, "clusterroles", "", o);
    }
    system_create(inner, s, GROUP, "clusterrolebindings", "", masters);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(verb: &str, group: &str, resource: &str) -> Attributes {
        Attributes { verb: verb.into(), group: group.into(), resource: resource.into(), ..Attributes::default() }
    }

    #[test]
    fn rules_match_verbs_groups_resources_and_names() {
        let rule =
            json!({"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"], "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &attrs("get", "apps", "deployments")));
        assert!(!rule_allows(&rule, &attrs("watch", "apps", "deployments")));
        assert!(!rule_allows(&rule, &attrs("get", "", "deployments")));
        assert!(!rule_allows(&rule, &attrs("get", "apps", "configmaps")));
        let mut scale = attrs("get", "apps", "deployments");
        scale.subresource = "scale".into();
        assert!(rule_allows(&rule, &scale));
        let named = json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"], "verbs": ["get"]});
        let mut a = attrs("get", "", "secrets");
        assert!(!rule_allows(&named, &a), "a rule with resourceNames does not allow an unnamed request");
        a.name = "a".into();
        assert!(rule_allows(&named, &a));
        // A wildcard in the request is matched only by a wildcard in the rule.
        assert!(!rule_allows(&rule, &attrs("get", "*", "deployments")));
        let all = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(&all, &attrs("get", "*", "*")));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = json!({"a": "1", "b": "2"});
        assert!(label_selector_matches(&json!({"matchLabels": {"a": "1"}}), &labels));
        assert!(!label_selector_matches(&json!({"matchLabels": {"a": "2"}}), &labels));
        assert!(label_selector_matches(
            &json!({"matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]}),
            &labels
        ));
        assert!(!label_selector_matches(&json!({"matchExpressions": [{"key": "c", "operator": "Exists"}]}), &labels));
    }

    #[test]
    fn service_account_subjects_name_the_full_user() {
        let sa = json!({"kind": "ServiceAccount", "name": "verno", "namespace": "verno"});
        assert!(subject_matches(&sa, "system:serviceaccount:verno:verno", &[], "x"));
        assert!(!subject_matches(&sa, "system:serviceaccount:other:verno", &[], "x"));
        let group = json!({"kind": "Group", "name": "devs"});
        assert!(subject_matches(&group, "alice", &["devs".to_string()], ""));
    }
}
