//! `verno manifests`: the plain-YAML install (design §1 L0, §6).
//!
//! The webhook configurations come first, so `kubectl delete -f` removes them before anything
//! else. Their entries carry everything but `rules` and `caBundle` (which Verno owns): a fresh
//! install matches nothing, and a dead or half-removed Verno can only refuse what a fail-closed
//! entry matches, never kube-system, kube-public, kube-node-lease, Verno's own namespace,
//! nodes, CSRs, leases, events, or Verno's own service accounts.

use crate::probe::{PROBE_LABEL, VERIFY_PATH};
use crate::webhooks::{MONITOR, POLICY_VALIDATE, MUTATE_FAIL, MUTATE_IGNORE, MUTATING_CONFIG, VALIDATE_FAIL, VALIDATE_IGNORE, VALIDATING_CONFIG};
use serde_json::{Value, json};

/// Values, named as in the Helm chart (`--set key=value`).
#[derive(Debug, Clone)]
pub struct Values {
    pub namespace: String,
    /// `admissionController.replicas`
    pub replicas: i64,
    /// `image.repository`, `image.tag`
    pub image_repository: String,
    pub image_tag: String,
    /// `config.webhooks.failTimeoutSeconds`, `config.webhooks.ignoreTimeoutSeconds`
    pub fail_timeout: i64,
    pub ignore_timeout: i64,
    /// `config.excludedNamespaces` (comma-separated with --set), besides the system ones.
    pub excluded_namespaces: Vec<String>,
}

impl Default for Values {
    fn default() -> Self {
        Values {
            namespace: "verno".into(),
            replicas: 2,
            image_repository: "ghcr.io/verno/verno".into(),
            image_tag: env!("CARGO_PKG_VERSION").into(),
            fail_timeout: 5,
            ignore_timeout: 3,
            excluded_namespaces: Vec::new(),
        }
    }
}

pub const SERVICE: &str = "verno-svc";
pub const METRICS_SERVICE: &str = "verno-svc-metrics";
pub const DEPLOYMENT: &str = "verno-admission-controller";
pub const SERVICE_ACCOUNT: &str = "verno-admission-controller";
pub const CLUSTER_ROLE: &str = "verno:admission-controller";
pub const OPT_OUT_LABEL: &str = "verno.io/ignore";

impl Values {
    /// Applies one `--set key=value`.
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--set {kv:?}: expected key=value"))?;
        let int = |v: &str| v.parse::<i64>().map_err(|_| format!("--set {k}: {v:?} is not a whole number"));
        match k {
            "admissionController.replicas" => self.replicas = int(v)?,
            "image.repository" => self.image_repository = v.into(),
            "image.tag" => self.image_tag = v.into(),
            "config.webhooks.failTimeoutSeconds" => self.fail_timeout = int(v)?,
            "config.webhooks.ignoreTimeoutSeconds" => self.ignore_timeout = int(v)?,
            "config.excludedNamespaces" => self.excluded_namespaces = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
            "namespace" => self.namespace = v.into(),
            other => return Err(format!("--set {other}: unknown value (known: admissionController.replicas, image.repository, image.tag, config.webhooks.failTimeoutSeconds, config.webhooks.ignoreTimeoutSeconds, config.excludedNamespaces)")),
        }
        if !(1..=30).contains(&self.fail_timeout) || !(1..=30).contains(&self.ignore_timeout) {
            return Err("webhook timeouts must be between 1 and 30 seconds".into());
        }
        Ok(())
    }

    /// Namespaces the API server never sends to Verno.
    pub fn excluded(&self) -> Vec<String> {
        let mut v: Vec<String> = ["kube-system", "kube-public", "kube-node-lease"].iter().map(|s| s.to_string()).collect();
        v.push(self.namespace.clone());
        v.extend(self.excluded_namespaces.iter().cloned());
        v.sort();
        v.dedup();
        v
    }
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": "verno", "app.kubernetes.io/part-of": "verno", "app.kubernetes.io/component": "admission-controller"})
}

/// The API server's own filters on every entry (design §1 (b)).
pub fn match_conditions(namespace: &str) -> Value {
    json!([
        {"name": "exclude-nodes-and-csrs", "expression": "!(request.resource.group == '' && request.resource.resource == 'nodes') && !(request.resource.group == 'certificates.k8s.io' && request.resource.resource == 'certificatesigningrequests')"},
        {"name": "exclude-leases", "expression": "!(request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases')"},
        {"name": "exclude-events", "expression": "!(request.resource.resource == 'events')"},
        {"name": "exclude-verno-service-accounts", "expression": format!("!request.userInfo.username.startsWith('system:serviceaccount:{namespace}:')")},
    ])
}

fn entry(v: &Values, name: &str, path: &str, fail: bool) -> Value {
    json!({
        "name": name,
        "clientConfig": {"service": {"name": SERVICE, "namespace": v.namespace, "path": path, "port": 443}},
        "failurePolicy": if fail { "Fail" } else { "Ignore" },
        "timeoutSeconds": if fail { v.fail_timeout } else { v.ignore_timeout },
        "sideEffects": "NoneOnDryRun",
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": v.excluded()},
            {"key": OPT_OUT_LABEL, "operator": "DoesNotExist"},
        ]},
        "matchConditions": match_conditions(&v.namespace),
    })
}

/// The probe's entry: fail-open, only the probe Lease in Verno's namespace, and no exclusion of
/// Verno's own service account (the leader makes the probe write).
fn monitor_entry(v: &Values) -> Value {
    json!({
        "name": MONITOR,
        "clientConfig": {"service": {"name": SERVICE, "namespace": v.namespace, "path": VERIFY_PATH, "port": 443}},
        "failurePolicy": "Ignore",
        "timeoutSeconds": v.ignore_timeout,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": v.namespace}},
        "objectSelector": {"matchLabels": {PROBE_LABEL: "true"}},
    })
}

/// The policy validation entry: fail-open, every namespace (a Policy may live anywhere), and
/// only Verno's kinds (rules set by Verno).
fn policy_entry(v: &Values) -> Value {
    json!({
        "name": POLICY_VALIDATE,
        "clientConfig": {"service": {"name": SERVICE, "namespace": v.namespace, "path": "/policyvalidate", "port": 443}},
        "failurePolicy": "Ignore",
        "timeoutSeconds": v.ignore_timeout,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
    })
}

/// The webhook configurations as the installer owns them (no rules, no caBundle).
pub fn webhook_configurations(v: &Values) -> Vec<Value> {
    vec![
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_CONFIG, "labels": labels()},
            "webhooks": [entry(v, VALIDATE_FAIL, "/validate/fail", true), entry(v, VALIDATE_IGNORE, "/validate/ignore", false), policy_entry(v)]}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_CONFIG, "labels": labels()},
            "webhooks": [entry(v, MUTATE_FAIL, "/mutate/fail", true), entry(v, MUTATE_IGNORE, "/mutate/ignore", false), monitor_entry(v)]}),
    ]
}

/// The whole install, in apply order (webhook configurations first).
pub fn render(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    let selector = json!({"app.kubernetes.io/name": "verno", "app.kubernetes.io/component": "admission-controller"});
    let mut docs = webhook_configurations(v);
    docs.extend([
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels()}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": ns, "labels": labels()}}),
        // The ClusterRole is also the webhook configurations' owner (design §1 L2).
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": CLUSTER_ROLE, "labels": labels()},
            "rules": [
                {"apiGroups": ["kyverno.io"], "resources": ["clusterpolicies", "policies", "policyexceptions"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["kyverno.io"], "resources": ["clusterpolicies/status", "policies/status"], "verbs": ["get", "patch", "update"]},
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "resourceNames": [VALIDATING_CONFIG, MUTATING_CONFIG], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "verbs": ["list", "watch"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": [CLUSTER_ROLE], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["list", "watch"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": CLUSTER_ROLE, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": ns}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": CLUSTER_ROLE, "namespace": ns, "labels": labels()},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
            ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": CLUSTER_ROLE, "namespace": ns, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": ns}]}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": ns, "labels": labels()},
            "spec": {"selector": selector, "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE, "namespace": ns, "labels": labels()},
            "spec": {"selector": selector, "ports": [{"name": "metrics-port", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DEPLOYMENT, "namespace": ns, "labels": labels()},
            "spec": {
                "replicas": v.replicas,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}},
                "template": {
                    "metadata": {"labels": labels()},
                    "spec": {
                        "serviceAccountName": SERVICE_ACCOUNT,
                        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}}],
                        "containers": [{
                            "name": "verno",
                            "image": format!("{}:{}", v.image_repository, v.image_tag),
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["serve", "--kube", "--service", SERVICE, "--deployment", DEPLOYMENT, "--owner-cluster-role", CLUSTER_ROLE],
                            "env": [
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            ],
                            "ports": [{"name": "https", "containerPort": 9443, "protocol": "TCP"}, {"name": "metrics-port", "containerPort": 8000, "protocol": "TCP"}],
                            "readinessProbe": {"httpGet": {"path": "/health/readiness", "port": 9443, "scheme": "HTTPS"}, "periodSeconds": 5},
                            "livenessProbe": {"httpGet": {"path": "/health/liveness", "port": 9443, "scheme": "HTTPS"}, "periodSeconds": 10},
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
                        }],
                    },
                },
            }}),
    ]);
    if v.replicas > 1 {
        docs.push(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": DEPLOYMENT, "namespace": ns, "labels": labels()},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}}));
    }
    docs
}

/// Multi-document YAML.
pub fn to_yaml(docs: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).map_err(|e| e.to_string())?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn webhook_entries_exclude_system_namespaces_and_carry_no_rules() {
        let docs = render(&Values::default());
        assert_eq!(docs[0]["kind"], "ValidatingWebhookConfiguration");
        assert_eq!(docs[1]["kind"], "MutatingWebhookConfiguration");
        for cfg in &docs[..2] {
            for w in cfg["webhooks"].as_array().unwrap() {
                assert!(w.get("rules").is_none());
                if w["name"] == POLICY_VALIDATE {
                    assert_eq!(w["failurePolicy"], "Ignore");
                    continue;
                }
                if w["name"] == MONITOR {
                    // The probe: fail-open, and nothing but the probe Lease in Verno's namespace.
                    assert_eq!(w["failurePolicy"], "Ignore");
                    assert_eq!(w["namespaceSelector"], json!({"matchLabels": {"kubernetes.io/metadata.name": "verno"}}));
                    assert_eq!(w["objectSelector"], json!({"matchLabels": {PROBE_LABEL: "true"}}));
                    continue;
                }
                let excluded = &w["namespaceSelector"]["matchExpressions"][0]["values"];
                for ns in ["kube-system", "kube-public", "kube-node-lease", "verno"] {
                    assert!(excluded.as_array().unwrap().iter().any(|v| v == ns), "{ns} excluded");
                }
                assert!(w["timeoutSeconds"].as_i64().unwrap() <= 10);
            }
        }
        assert!(docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
        let mut one = Values::default();
        one.set("admissionController.replicas=1").unwrap();
        assert!(!render(&one).iter().any(|d| d["kind"] == "PodDisruptionBudget"));
        assert!(one.set("admissionController.replicas=x").unwrap_err().contains("not a whole number"));
        assert!(one.set("nope=1").unwrap_err().contains("unknown value"));
    }
}
