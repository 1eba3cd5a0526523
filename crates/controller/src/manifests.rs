//! `verno manifests`: the plain-YAML install.
//!
//! The webhook configurations come first, so `kubectl delete -f` removes them before anything
//! else. Their entries carry everything but `rules` and `caBundle` (which Verno owns): a fresh
//! install matches nothing, and a dead or half-removed Verno can only refuse what a fail-closed
//! entry matches, never kube-system, kube-public, kube-node-lease, Verno's own namespace,
//! nodes, CSRs, leases, events, or Verno's own service accounts.

// Writing into documents this module has just built with `json!` (always objects), where
// `value["key"] = …` cannot panic and reads far better than `as_object_mut` chains.
#![allow(clippy::indexing_slicing)]

use crate::probe::{PROBE_LABEL, VERIFY_PATH};
use crate::webhooks::{
    CEL_RESOURCES, ConfigNames, KYVERNO_POLICY_CONFIG, KYVERNO_VERIFY_CONFIG, MONITOR, POLICY_ENTRIES, POLICY_VALIDATE,
    TEMPLATE_ANNOTATION,
};

/// The ClusterRole aggregating the background controller's permissions.
pub const BACKGROUND_ROLE: &str = "verno:background-controller";

/// The `status` subresources of the CEL policy kinds Verno writes.
const CEL_STATUS: [&str; 10] = [
    "deletingpolicies/status",
    "generatingpolicies/status",
    "imagevalidatingpolicies/status",
    "mutatingpolicies/status",
    "namespaceddeletingpolicies/status",
    "namespacedgeneratingpolicies/status",
    "namespacedimagevalidatingpolicies/status",
    "namespacedmutatingpolicies/status",
    "namespacedvalidatingpolicies/status",
    "validatingpolicies/status",
];
use serde_json::{Value, json};

/// The `policies.kyverno.io` resources Verno reads, sorted.
fn cel_read() -> Vec<&'static str> {
    let mut r: Vec<&str> =
        CEL_RESOURCES.iter().copied().chain(["imagevalidatingpolicies", "namespacedimagevalidatingpolicies"]).collect();
    r.sort_unstable();
    r
}

/// Values, named as in the Helm chart (`--set key=value`, or a values file with `-f`).
#[derive(Debug, Clone)]
pub struct Values {
    pub namespace: String,
    /// Verno runs outside the cluster at this `https://HOST:PORT` (Kyverno's `--serverIP`):
    /// the webhooks call it by URL instead of through the Service, and no Deployment,
    /// Service or PodDisruptionBudget is rendered (`verno serve --kube --server-url` is run
    /// by hand, with the ServiceAccount's credentials).
    pub server_url: Option<String>,
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
    /// Kyverno's `config.webhooks.namespaceSelector`: its `matchExpressions` and `matchLabels`
    /// are added to Verno's own exclusions on every resource entry (Verno's stay: a values
    /// file from a Kyverno install cannot drop kube-system or Verno's namespace).
    pub namespace_selector: Option<Value>,
    /// Kyverno's `config.webhooks.objectSelector`, on every resource entry.
    pub object_selector: Option<Value>,
    /// Kyverno's `config.matchConditions`, appended to Verno's four on every resource entry.
    pub match_conditions: Vec<Value>,
    /// `admissionController.rbac.createViewRoleBinding` and `.viewRoleName` (Kyverno's
    /// reports-controller values): the ClusterRole bound to Verno's service account so that
    /// it may read what policies scan in the background.
    pub view_role_binding: bool,
    pub view_role: String,
    /// Kyverno's `config.name`: the ConfigMap with Kyverno's dynamic configuration keys, in
    /// Verno's namespace (`--config-map`).
    pub config_name: String,
    /// Kyverno's `config.generateSuccessEvents` and `config.successEventActions`, written into
    /// that ConfigMap (and changeable there while Verno runs).
    pub generate_success_events: bool,
    pub success_event_actions: String,
    /// Kyverno's `config.resourceFilters` (by default its chart's: events, nodes, API
    /// services, token and access reviews, bindings, ReplicaSets, ephemeral reports and the
    /// system namespaces are not reviewed) and `config.exclude{Groups,Usernames,Roles,
    /// ClusterRoles}` (by default the `system:nodes` group), written into that ConfigMap:
    /// Verno reads them from there, so without them every ReplicaSet a rollout creates would
    /// be judged where Kyverno admits it unreviewed.
    pub resource_filters: Vec<String>,
    pub exclude_groups: Vec<String>,
    pub exclude_usernames: Vec<String>,
    pub exclude_roles: Vec<String>,
    pub exclude_cluster_roles: Vec<String>,
    /// Kyverno's `features.omitEvents.eventTypes` (`--omit-events`).
    pub omit_events: Vec<String>,
    /// Kyverno's `features.backgroundScan.enabled` (`--background-scan`) and
    /// `features.admissionReports.enabled` (`--admission-reports`).
    pub background_scan: bool,
    pub admission_reports: bool,
    /// Kyverno's `openreports.enabled` (`--openreports`).
    pub openreports: bool,
    /// Kyverno's `backgroundController.enabled` (`--background-controller`): generate and
    /// mutate-existing rules applied by the leader.
    pub background_controller: bool,
    /// Kyverno's `cleanupController.enabled` (`--cleanup-controller`): cleanup and deleting
    /// policies and the TTL label, run by the leader.
    pub cleanup_controller: bool,
    /// Kyverno's `cleanupController.rbac.clusterRole.extraResources`: rules of one more
    /// ClusterRole aggregated into the cleanup role (what the TTL label and cleanup policies
    /// may delete, besides ClusterRoles labelled `rbac.kyverno.io/aggregate-to-cleanup-controller`).
    pub cleanup_extra_resources: Vec<Value>,
    /// Kyverno's `backgroundController.rbac.coreClusterRole.extraResources` (by default the
    /// chart's: create, update, patch and delete NetworkPolicies, Ingresses, IngressClasses,
    /// Roles, RoleBindings, ConfigMaps, ResourceQuotas, LimitRanges, ResourceClaims and their
    /// templates) and `backgroundController.rbac.clusterRole.extraResources`: what generate and
    /// mutate-existing rules may write besides ClusterRoles labelled
    /// `rbac.kyverno.io/aggregate-to-background-controller`.
    pub background_core_resources: Vec<Value>,
    pub background_extra_resources: Vec<Value>,
    /// Kyverno's `admissionController.rbac.clusterRole.extraResources`: more rules bound to
    /// Verno's service account (what policies' API calls and context entries read).
    pub admission_extra_resources: Vec<Value>,
    /// Kyverno's `reportsController.rbac.clusterRole.extraResources`: what background scans
    /// read besides `view` (Verno's account scans, so these join its aggregated role).
    pub reports_extra_resources: Vec<Value>,
    /// The ServiceAccounts (Kyverno's `…Controller.rbac.serviceAccount.name`): Verno's own and
    /// the two its background and cleanup controllers act as. Kyverno's names
    /// (`kyverno-admission-controller`, …) make RoleBindings written for Kyverno apply.
    pub admission_account: String,
    pub background_account: String,
    pub cleanup_account: String,
    /// `kyvernoNames` (Verno's own value): the webhook configuration objects carry Kyverno's
    /// names (`kyverno-resource-validating-webhook-cfg`, `kyverno-resource-mutating-webhook-cfg`)
    /// and its `webhook.kyverno.io/managed-by: kyverno` label, so that runbooks, dashboards and
    /// tests written for Kyverno find them (`verno serve --kyverno-names`).
    pub kyverno_names: bool,
    /// Kyverno's `features.forceFailurePolicyIgnore.enabled` (`--force-failure-policy-ignore`):
    /// every policy fail-open.
    pub force_failure_policy_ignore: bool,
    /// Kyverno's `features.policyExceptions.enabled` and `.namespace`
    /// (`--enable-policy-exception`, `--exception-namespace`): off by default, as in Kyverno.
    pub policy_exceptions: bool,
    pub exception_namespace: String,
    /// Kyverno's `features.mutatingAdmissionPolicyReports.enabled`
    /// (`--mutating-admission-policy-reports`): background scans report the
    /// MutatingAdmissionPolicies labelled `reports.kyverno.io/enabled: "true"`.
    pub mutating_admission_policy_reports: bool,
    /// Kyverno's `rbac.roles.aggregate.admin` / `.view`: the user-facing ClusterRoles
    /// (`…:rbac:admin:policies`, `…:rbac:view:policyreports`, …) join Kubernetes' `admin` /
    /// `view` roles, so namespace admins and viewers can read (and admins write) policies and
    /// reports.
    pub aggregate_to_admin: bool,
    pub aggregate_to_view: bool,
}

/// Why a value (`--set key=value`, a values file) is refused; the text names the key (and the
/// file), as `verno manifests` prints it.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// A `--set` argument without `=`.
    #[error("--set {kv:?}: expected key=value")]
    NotKeyValue { kv: String },
    /// A `--set` value refused.
    #[error("--set {0}")]
    Set(#[source] Box<ValuesError>),
    #[error("{}: {source}", .path.display())]
    ReadFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A values file that is not YAML.
    #[error("{}: {source}", .path.display())]
    ParseFile {
        path: std::path::PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{}: expected a map of values", .path.display())]
    NotAMap { path: std::path::PathBuf },
    /// A value of a values file refused.
    #[error("{}: {source}", .path.display())]
    InFile {
        path: std::path::PathBuf,
        #[source]
        source: Box<ValuesError>,
    },
    #[error("{key}: {value} is not a whole number")]
    NotAnInteger { key: String, value: Value },
    /// Not a DNS subdomain.
    #[error("{key}: {value} is not a ServiceAccount name (lower-case letters, digits, '-' and '.')")]
    NotAnAccount { key: String, value: Value },
    #[error("{key}: {value} is not a string")]
    NotAString { key: String, value: Value },
    #[error("{key}: {value} is not true or false")]
    NotABoolean { key: String, value: Value },
    #[error("{key}: expected a list of namespaces")]
    NotNamespaces { key: String },
    #[error("{key}: expected a list of strings")]
    NotTexts { key: String },
    #[error("{key}: expected a list of {{name, expression}}")]
    NotMatchConditions { key: String },
    #[error("{key}[{index}]: a match condition needs a name and an expression")]
    BadMatchCondition { key: String, index: usize },
    #[error("{key}: at most 60 (the API server allows 64, Verno uses 4)")]
    TooManyMatchConditions { key: String },
    #[error("{key}: expected a list of event reasons")]
    NotEventReasons { key: String },
    #[error("{key}: unknown event reason {reason:?} (known: {})", EVENT_REASONS.join(", "))]
    UnknownEventReason { key: String, reason: String },
    #[error("{key}: expected a list of RBAC rules")]
    NotRbacRules { key: String },
    #[error("{key}[{index}]: an RBAC rule needs apiGroups, resources and verbs (lists of strings)")]
    BadRbacRule { key: String, index: usize },
    #[error("{path}: expected a label selector (matchLabels / matchExpressions)")]
    NotASelector { path: String },
    #[error("{path}.matchExpressions[{index}]: needs a key and an operator In, NotIn, Exists or DoesNotExist")]
    BadSelectorExpression { path: String, index: usize },
    #[error("{path}.{field}: not a label selector field (matchLabels, matchExpressions)")]
    NotASelectorField { path: String, field: String },
    /// A key neither Verno nor the chart knows.
    #[error("{key}: unknown value (known: {KNOWN})")]
    Unknown { key: String },
    #[error("webhook timeouts must be between 1 and 30 seconds")]
    Timeouts,
}

/// Why the manifests could not be written as YAML.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(#[source] serde_saphyr::SerializeError);

/// Kyverno's event reasons (`features.omitEvents.eventTypes`).
const EVENT_REASONS: [&str; 4] = ["PolicyViolation", "PolicyApplied", "PolicyError", "PolicySkipped"];

/// The rules Kyverno's chart gives its background controller's core ClusterRole by default.
fn background_core_default() -> Vec<Value> {
    let write = ["create", "update", "patch", "delete"];
    vec![
        json!({"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingressclasses", "networkpolicies"], "verbs": write}),
        json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings", "roles"], "verbs": write}),
        json!({"apiGroups": [""], "resources": ["configmaps", "resourcequotas", "limitranges"], "verbs": write}),
        json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["create", "delete", "update", "patch", "deletecollection"]}),
    ]
}

/// A list of RBAC rules from a values key (`extraResources`).
fn rbac_rules(k: &str, v: &Value) -> Result<Vec<Value>, ValuesError> {
    let list = match v {
        Value::Null => Vec::new(),
        Value::Array(a) => a.clone(),
        _ => return Err(ValuesError::NotRbacRules { key: k.to_string() }),
    };
    for (i, r) in list.iter().enumerate() {
        let names = |f: &str| r.get(f).and_then(Value::as_array).is_some_and(|a| a.iter().all(Value::is_string));
        if !r.is_object() || !names("verbs") || !(names("resources") || names("nonResourceURLs")) {
            return Err(ValuesError::BadRbacRule { key: k.to_string(), index: i });
        }
    }
    Ok(list)
}

impl Default for Values {
    fn default() -> Self {
        Values {
            namespace: "verno".into(),
            server_url: None,
            replicas: 2,
            image_repository: "ghcr.io/verno/verno".into(),
            image_tag: env!("CARGO_PKG_VERSION").into(),
            fail_timeout: 10,
            ignore_timeout: 3,
            excluded_namespaces: Vec::new(),
            namespace_selector: None,
            object_selector: None,
            match_conditions: Vec::new(),
            view_role_binding: true,
            view_role: "view".into(),
            config_name: "verno-config".into(),
            generate_success_events: false,
            success_event_actions: String::new(),
            resource_filters: verno_engine::filters::KYVERNO_RESOURCE_FILTERS
                .split_inclusive(']')
                .map(str::to_string)
                .collect(),
            exclude_groups: vec![verno_engine::filters::KYVERNO_EXCLUDE_GROUPS.to_string()],
            exclude_usernames: Vec::new(),
            exclude_roles: Vec::new(),
            exclude_cluster_roles: Vec::new(),
            omit_events: vec!["PolicyApplied".into(), "PolicySkipped".into()],
            background_scan: true,
            admission_reports: true,
            openreports: false,
            background_controller: true,
            cleanup_controller: true,
            cleanup_extra_resources: Vec::new(),
            background_core_resources: background_core_default(),
            background_extra_resources: Vec::new(),
            admission_extra_resources: Vec::new(),
            reports_extra_resources: Vec::new(),
            admission_account: SERVICE_ACCOUNT.into(),
            background_account: BACKGROUND_ACCOUNT.into(),
            cleanup_account: CLEANUP_ACCOUNT.into(),
            kyverno_names: false,
            force_failure_policy_ignore: false,
            policy_exceptions: false,
            exception_namespace: String::new(),
            mutating_admission_policy_reports: false,
            aggregate_to_admin: true,
            aggregate_to_view: true,
        }
    }
}

pub const SERVICE: &str = "verno-svc";
pub const METRICS_SERVICE: &str = "verno-svc-metrics";
pub const KYVERNO_SERVICE: &str = "kyverno-svc";
pub const DEPLOYMENT: &str = "verno-admission-controller";
pub const SERVICE_ACCOUNT: &str = "verno-admission-controller";
/// The accounts the background and cleanup controllers act as (impersonated by Verno's own
/// account, which may impersonate these two and nothing else): each holds only its
/// controller's permissions, as Kyverno's separate controller ServiceAccounts do.
pub const BACKGROUND_ACCOUNT: &str = "verno-background-controller";
pub const CLEANUP_ACCOUNT: &str = "verno-cleanup-controller";
/// The Role letting Verno's account act as the two controller accounts.
pub const IMPERSONATE_ROLE: &str = "verno:controller-accounts";
pub const CLUSTER_ROLE: &str = "verno:admission-controller";
pub const CLEANUP_ROLE: &str = "verno:cleanup-controller";
pub const OPT_OUT_LABEL: &str = "verno.io/ignore";

/// Chart values `verno manifests` renders the same way the chart does.
const KNOWN: &str = "admissionController.replicas, admissionController.rbac.createViewRoleBinding, admissionController.rbac.viewRoleName, image.repository, image.tag, config.webhooks.failTimeoutSeconds, config.webhooks.ignoreTimeoutSeconds, config.webhooks.namespaceSelector, config.webhooks.objectSelector, config.matchConditions, config.excludedNamespaces, config.name, config.generateSuccessEvents, config.successEventActions, config.resourceFilters, config.excludeGroups, config.excludeUsernames, config.excludeRoles, config.excludeClusterRoles, features.omitEvents.eventTypes, features.backgroundScan.enabled, features.admissionReports.enabled, openreports.enabled, backgroundController.enabled, backgroundController.rbac.coreClusterRole.extraResources, backgroundController.rbac.clusterRole.extraResources, admissionController.rbac.clusterRole.extraResources, reportsController.rbac.clusterRole.extraResources, admissionController.rbac.serviceAccount.name, backgroundController.rbac.serviceAccount.name, cleanupController.rbac.serviceAccount.name, cleanupController.enabled, cleanupController.rbac.clusterRole.extraResources, kyvernoNames, features.forceFailurePolicyIgnore.enabled, features.policyExceptions.enabled, features.policyExceptions.namespace, features.mutatingAdmissionPolicyReports.enabled, rbac.roles.aggregate.admin, rbac.roles.aggregate.view";
/// Chart values for objects `verno manifests` does not render (the ServiceMonitor needs the
/// Prometheus Operator's CRD), or whose chart defaults it renders as they are.
const CHART_ONLY: &[&str] = &[
    "serviceMonitor.",
    "admissionController.resources.",
    "admissionController.podDisruptionBudget.",
    "image.pullPolicy",
    "metricsService.",
];

/// Values that are whole objects or lists, not walked into.
const SUBTREES: &[&str] = &[
    "config.webhooks.namespaceSelector",
    "config.webhooks.objectSelector",
    "config.matchConditions",
    "config.excludedNamespaces",
];

fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v.as_object() {
        Some(m) if !SUBTREES.contains(&prefix) => {
            for (k, x) in m {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaves(&path, x, out);
            }
        }
        _ if prefix.is_empty() => {}
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

fn selector_ok(path: &str, v: &Value) -> Result<(), ValuesError> {
    let Some(m) = v.as_object() else {
        return Err(ValuesError::NotASelector { path: path.to_string() });
    };
    for (k, x) in m {
        match k.as_str() {
            "matchLabels" if x.is_object() || x.is_null() => {}
            "matchExpressions" if x.is_array() || x.is_null() => {
                for (i, e) in x.as_array().into_iter().flatten().enumerate() {
                    let op = e.get("operator").and_then(Value::as_str).unwrap_or("");
                    if e.get("key").and_then(Value::as_str).is_none()
                        || !["In", "NotIn", "Exists", "DoesNotExist"].contains(&op)
                    {
                        return Err(ValuesError::BadSelectorExpression { path: path.to_string(), index: i });
                    }
                }
            }
            other => {
                return Err(ValuesError::NotASelectorField { path: path.to_string(), field: other.to_string() });
            }
        }
    }
    Ok(())
}

fn int(k: &str, v: &Value) -> Result<i64, ValuesError> {
    v.as_i64().ok_or_else(|| ValuesError::NotAnInteger { key: k.to_string(), value: v.clone() })
}

/// A ServiceAccount name: a DNS subdomain (lower-case alphanumerics, '-' and '.').
fn account(k: &str, v: &Value) -> Result<String, ValuesError> {
    match v.as_str() {
        Some(n)
            if !n.is_empty()
                && n.len() <= 253
                && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
                && n.starts_with(|c: char| c.is_ascii_alphanumeric())
                && n.ends_with(|c: char| c.is_ascii_alphanumeric()) =>
        {
            Ok(n.to_string())
        }
        _ => Err(ValuesError::NotAnAccount { key: k.to_string(), value: v.clone() }),
    }
}

fn text(k: &str, v: &Value) -> Result<String, ValuesError> {
    v.as_str().map(str::to_string).ok_or_else(|| ValuesError::NotAString { key: k.to_string(), value: v.clone() })
}

/// `true`/`false`, as booleans or (`--set`) strings.
fn boolean(k: &str, v: &Value) -> Result<bool, ValuesError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s == "false" => Ok(s == "true"),
        _ => Err(ValuesError::NotABoolean { key: k.to_string(), value: v.clone() }),
    }
}

/// A label selector value (`None`: null or empty, no selector).
fn selector(k: &str, v: &Value) -> Result<Option<Value>, ValuesError> {
    Ok(match v {
        Value::Null => None,
        Value::Object(m) if m.is_empty() => None,
        _ => {
            selector_ok(k, v)?;
            Some(v.clone())
        }
    })
}

/// `config.matchConditions`: `{name, expression}`s added to Verno's own, at most 60.
fn extra_match_conditions(k: &str, v: &Value) -> Result<Vec<Value>, ValuesError> {
    let list = match v {
        Value::Null => Vec::new(),
        Value::Array(a) => a.clone(),
        _ => return Err(ValuesError::NotMatchConditions { key: k.to_string() }),
    };
    for (i, c) in list.iter().enumerate() {
        if c.get("name").and_then(Value::as_str).is_none() || c.get("expression").and_then(Value::as_str).is_none() {
            return Err(ValuesError::BadMatchCondition { key: k.to_string(), index: i });
        }
    }
    if list.len() + 4 > 64 {
        return Err(ValuesError::TooManyMatchConditions { key: k.to_string() });
    }
    Ok(list)
}

/// A list of strings (`config.resourceFilters`, `config.exclude*`); `null` is none, and a
/// string is one entry (`--set config.excludeGroups=a,b` gives one string: split at commas).
fn texts(k: &str, v: &Value) -> Result<Vec<String>, ValuesError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) if k == "config.resourceFilters" => Ok(vec![s.clone()]),
        Value::String(s) => Ok(s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()),
        Value::Array(items) => items.iter().map(|i| text(k, i)).collect(),
        _ => Err(ValuesError::NotTexts { key: k.to_string() }),
    }
}

/// `features.omitEvents.eventTypes`: a list (or, with `--set`, a comma-separated text) of
/// Kyverno's event reasons.
fn event_reasons(k: &str, v: &Value) -> Result<Vec<String>, ValuesError> {
    let list: Vec<String> = match v {
        Value::Null => Vec::new(),
        Value::Array(a) => a.iter().map(|r| text(k, r)).collect::<Result<_, _>>()?,
        Value::String(s) => s.split(',').map(str::trim).filter(|r| !r.is_empty()).map(str::to_string).collect(),
        _ => return Err(ValuesError::NotEventReasons { key: k.to_string() }),
    };
    if let Some(bad) = list.iter().find(|r| !EVENT_REASONS.contains(&r.as_str())) {
        return Err(ValuesError::UnknownEventReason { key: k.to_string(), reason: bad.clone() });
    }
    Ok(list)
}

/// The note for a value only the chart renders (`None`: not one of them).
fn chart_only(k: &str) -> Option<String> {
    CHART_ONLY
        .iter()
        .any(|p| k == *p || (p.ends_with('.') && k.starts_with(p)))
        .then(|| format!("{k} is used by the Helm chart only; verno manifests renders the chart's default"))
}

impl Values {
    /// Applies one `--set key=value`.
    pub fn set(&mut self, kv: &str) -> Result<(), ValuesError> {
        let (k, v) = kv.split_once('=').ok_or_else(|| ValuesError::NotKeyValue { kv: kv.to_string() })?;
        let value = match k {
            "config.excludedNamespaces" => Value::Array(
                v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| Value::String(s.into())).collect(),
            ),
            _ => v.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::String(v.into())),
        };
        self.apply(k, &value).map(|_| ()).map_err(|e| ValuesError::Set(Box::new(e)))
    }

    /// Applies a values file (YAML, the chart's shape). Returns notes about values that only the
    /// chart renders; unknown values are an error naming the file and key.
    pub fn apply_file(&mut self, path: &std::path::Path) -> Result<Vec<String>, ValuesError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ValuesError::ReadFile { path: path.to_path_buf(), source })?;
        let doc: Value = serde_saphyr::from_str(&text)
            .map_err(|e| ValuesError::ParseFile { path: path.to_path_buf(), source: Box::new(e) })?;
        if !(doc.is_object() || doc.is_null()) {
            return Err(ValuesError::NotAMap { path: path.to_path_buf() });
        }
        let mut found = Vec::new();
        leaves("", &doc, &mut found);
        let mut notes = Vec::new();
        for (k, v) in found {
            let note = self
                .apply(&k, &v)
                .map_err(|e| ValuesError::InFile { path: path.to_path_buf(), source: Box::new(e) })?;
            if let Some(note) = note {
                notes.push(format!("{}: {note}", path.display()));
            }
        }
        Ok(notes)
    }

    /// One value by its dotted path (a whole list or object where the chart takes one), as a
    /// values file sets it; `Some(note)` when it is accepted but only the chart uses it.
    pub fn apply(&mut self, k: &str, v: &Value) -> Result<Option<String>, ValuesError> {
        if let Some(flag) = self.flag(k) {
            *flag = boolean(k, v)?;
        } else if let Some(field) = self.text_field(k) {
            *field = text(k, v)?;
        } else if let Some(field) = self.account_field(k) {
            *field = account(k, v)?;
        } else if let Some(field) = self.rules_field(k) {
            *field = rbac_rules(k, v)?;
        } else if !self.apply_other(k, v)? {
            return chart_only(k).map(Some).ok_or_else(|| ValuesError::Unknown { key: k.to_string() });
        }
        if !(1..=30).contains(&self.fail_timeout) || !(1..=30).contains(&self.ignore_timeout) {
            return Err(ValuesError::Timeouts);
        }
        Ok(None)
    }

    /// The on/off value key `k` names.
    fn flag(&mut self, k: &str) -> Option<&mut bool> {
        Some(match k {
            "admissionController.rbac.createViewRoleBinding" => &mut self.view_role_binding,
            "config.generateSuccessEvents" => &mut self.generate_success_events,
            "features.backgroundScan.enabled" => &mut self.background_scan,
            "features.admissionReports.enabled" => &mut self.admission_reports,
            "features.forceFailurePolicyIgnore.enabled" => &mut self.force_failure_policy_ignore,
            "features.policyExceptions.enabled" => &mut self.policy_exceptions,
            "features.mutatingAdmissionPolicyReports.enabled" => &mut self.mutating_admission_policy_reports,
            "openreports.enabled" => &mut self.openreports,
            "backgroundController.enabled" => &mut self.background_controller,
            "cleanupController.enabled" => &mut self.cleanup_controller,
            "kyvernoNames" => &mut self.kyverno_names,
            "rbac.roles.aggregate.admin" => &mut self.aggregate_to_admin,
            "rbac.roles.aggregate.view" => &mut self.aggregate_to_view,
            _ => return None,
        })
    }

    /// The text value key `k` names (any string).
    fn text_field(&mut self, k: &str) -> Option<&mut String> {
        Some(match k {
            "admissionController.rbac.viewRoleName" => &mut self.view_role,
            "image.repository" => &mut self.image_repository,
            "namespace" => &mut self.namespace,
            "config.name" => &mut self.config_name,
            _ => return None,
        })
    }

    /// The ServiceAccount name key `k` names.
    fn account_field(&mut self, k: &str) -> Option<&mut String> {
        Some(match k {
            "admissionController.rbac.serviceAccount.name" => &mut self.admission_account,
            "backgroundController.rbac.serviceAccount.name" => &mut self.background_account,
            "cleanupController.rbac.serviceAccount.name" => &mut self.cleanup_account,
            _ => return None,
        })
    }

    /// The RBAC rules (`extraResources`) key `k` names.
    fn rules_field(&mut self, k: &str) -> Option<&mut Vec<Value>> {
        Some(match k {
            "cleanupController.rbac.clusterRole.extraResources" => &mut self.cleanup_extra_resources,
            "backgroundController.rbac.coreClusterRole.extraResources" => &mut self.background_core_resources,
            "backgroundController.rbac.clusterRole.extraResources" => &mut self.background_extra_resources,
            "admissionController.rbac.clusterRole.extraResources" => &mut self.admission_extra_resources,
            "reportsController.rbac.clusterRole.extraResources" => &mut self.reports_extra_resources,
            _ => return None,
        })
    }

    /// The values of their own shape (numbers, lists, selectors, texts that may be empty);
    /// false when `k` is none of them.
    fn apply_other(&mut self, k: &str, v: &Value) -> Result<bool, ValuesError> {
        match k {
            "admissionController.replicas" => self.replicas = int(k, v)?,
            // Empty means the chart's appVersion, as in the chart.
            "image.tag" => {
                let t = if v.is_null() { String::new() } else { text(k, v)? };
                self.image_tag = if t.is_empty() { env!("CARGO_PKG_VERSION").into() } else { t };
            }
            "config.webhooks.failTimeoutSeconds" => self.fail_timeout = int(k, v)?,
            "config.webhooks.ignoreTimeoutSeconds" => self.ignore_timeout = int(k, v)?,
            "config.excludedNamespaces" => {
                self.excluded_namespaces = v
                    .as_array()
                    .ok_or_else(|| ValuesError::NotNamespaces { key: k.to_string() })?
                    .iter()
                    .map(|n| text(k, n))
                    .collect::<Result<_, _>>()?;
            }
            "config.webhooks.namespaceSelector" => self.namespace_selector = selector(k, v)?,
            "config.webhooks.objectSelector" => self.object_selector = selector(k, v)?,
            "config.matchConditions" => self.match_conditions = extra_match_conditions(k, v)?,
            "features.policyExceptions.namespace" => {
                self.exception_namespace = if v.is_null() { String::new() } else { text(k, v)? }
            }
            "config.successEventActions" => {
                self.success_event_actions = if v.is_null() { String::new() } else { text(k, v)? }
            }
            "features.omitEvents.eventTypes" => self.omit_events = event_reasons(k, v)?,
            "config.resourceFilters" => self.resource_filters = texts(k, v)?,
            "config.excludeGroups" => self.exclude_groups = texts(k, v)?,
            "config.excludeUsernames" => self.exclude_usernames = texts(k, v)?,
            "config.excludeRoles" => self.exclude_roles = texts(k, v)?,
            "config.excludeClusterRoles" => self.exclude_cluster_roles = texts(k, v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The admission Service's name: Kyverno's (`kyverno-svc`) with Kyverno's names, for the
    /// webhook entries Kyverno users' tests and tools read.
    pub fn service(&self) -> &'static str {
        if self.kyverno_names { KYVERNO_SERVICE } else { SERVICE }
    }

    /// Namespaces the API server never sends to Verno.
    pub fn excluded(&self) -> Vec<String> {
        let mut v: Vec<String> =
            ["kube-system", "kube-public", "kube-node-lease"].iter().map(|s| s.to_string()).collect();
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

/// The API server's own filters on every entry.
pub fn match_conditions(namespace: &str) -> Value {
    json!([
        {"name": "exclude-nodes-and-csrs", "expression": "!(request.resource.group == '' && request.resource.resource == 'nodes') && !(request.resource.group == 'certificates.k8s.io' && request.resource.resource == 'certificatesigningrequests')"},
        {"name": "exclude-leases", "expression": "!(request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases')"},
        {"name": "exclude-events", "expression": "!(request.resource.resource == 'events')"},
        {"name": "exclude-verno-service-accounts", "expression": format!("!request.userInfo.username.startsWith('system:serviceaccount:{namespace}:')")},
    ])
}

fn entry(v: &Values, name: &str, path: &str, fail: bool) -> Value {
    let mut expressions = vec![
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": v.excluded()}),
        json!({"key": OPT_OUT_LABEL, "operator": "DoesNotExist"}),
    ];
    let user_ns = v.namespace_selector.as_ref();
    expressions.extend(
        user_ns.and_then(|s| s.get("matchExpressions")).and_then(Value::as_array).into_iter().flatten().cloned(),
    );
    let mut namespace_selector = json!({"matchExpressions": expressions});
    if let Some(labels) =
        user_ns.and_then(|s| s.get("matchLabels")).filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        namespace_selector["matchLabels"] = labels.clone();
    }
    let mut conditions = match_conditions(&v.namespace);
    if let Some(list) = conditions.as_array_mut() {
        list.extend(v.match_conditions.iter().cloned());
    }
    let mut e = base_entry(v, name, path, fail, "NoneOnDryRun");
    e["namespaceSelector"] = namespace_selector;
    e["matchConditions"] = conditions;
    if let Some(o) = &v.object_selector {
        e["objectSelector"] = o.clone();
    }
    e
}

/// What every entry carries: the Service path, failure policy with its timeout, side effects.
fn base_entry(v: &Values, name: &str, path: &str, fail: bool, side_effects: &str) -> Value {
    let client = match &v.server_url {
        Some(url) => json!({"url": format!("{}{path}", url.trim_end_matches('/'))}),
        None => json!({"service": {"name": v.service(), "namespace": v.namespace, "path": path, "port": 443}}),
    };
    json!({
        "name": name,
        "clientConfig": client,
        "failurePolicy": if fail { "Fail" } else { "Ignore" },
        "timeoutSeconds": if fail { v.fail_timeout } else { v.ignore_timeout },
        "sideEffects": side_effects,
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
    })
}

/// The probe's entry: fail-open, only the probe Lease in Verno's namespace, and no exclusion of
/// Verno's own service account (the leader makes the probe write).
fn monitor_entry(v: &Values) -> Value {
    let mut e = base_entry(v, MONITOR, VERIFY_PATH, false, "None");
    e["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": v.namespace}});
    e["objectSelector"] = json!({"matchLabels": {PROBE_LABEL: "true"}});
    e
}

/// The policy validation entry: fail-open, every namespace (a Policy may live anywhere), and
/// only Verno's kinds (rules set by Verno).
fn policy_entry(v: &Values) -> Value {
    base_entry(v, POLICY_VALIDATE, "/policyvalidate", false, "None")
}

/// The policy entries of the validating (or mutating) configuration, in the installer's order.
fn entries(v: &Values, validating: bool) -> Vec<Value> {
    POLICY_ENTRIES
        .iter()
        .filter(|(.., in_validating)| *in_validating == validating)
        .map(|(name, path, fail, _)| entry(v, name, path, *fail))
        .collect()
}

/// The webhook configurations as the installer owns them (no rules, no caBundle).
pub fn webhook_configurations(v: &Values) -> Vec<Value> {
    if v.kyverno_names {
        return kyverno_configurations(v);
    }
    let names = ConfigNames::VERNO;
    let labels = labels();
    vec![
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": names.validating, "labels": labels},
            "webhooks": entries(v, true).into_iter().chain([policy_entry(v)]).collect::<Vec<_>>()}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": names.mutating, "labels": labels},
            "webhooks": entries(v, false).into_iter().chain([monitor_entry(v)]).collect::<Vec<_>>()}),
    ]
}

/// Kyverno's layout (`kyvernoNames`): the two resource configurations carry no entries — Verno
/// writes them whole from the policies, as Kyverno's webhook controller does, after the
/// template annotation rendered here from the values — and the policy validation and probe
/// entries have configurations of their own, all under Kyverno's names, label and annotation.
fn kyverno_configurations(v: &Values) -> Vec<Value> {
    let names = ConfigNames::KYVERNO;
    let mut labels = labels();
    if let Some(m) = labels.as_object_mut() {
        m.insert("webhook.kyverno.io/managed-by".into(), json!("kyverno"));
    }
    // Kyverno's `config.webhooks.namespaceSelector` (its chart's default leaves kube-system
    // out), then its own namespace (`excludeKyvernoNamespace`), then Verno's extra exclusions.
    let mut selector = v.namespace_selector.clone().unwrap_or_else(|| {
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]})
    });
    let mut excluded =
        vec![json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [v.namespace]})];
    if !v.excluded_namespaces.is_empty() {
        excluded
            .push(json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": v.excluded_namespaces}));
    }
    match selector.get_mut("matchExpressions").and_then(Value::as_array_mut) {
        Some(list) => list.extend(excluded),
        None => selector["matchExpressions"] = Value::Array(excluded),
    }
    let client = match &v.server_url {
        Some(url) => json!({"url": url.trim_end_matches('/')}),
        None => json!({"service": {"name": v.service(), "namespace": v.namespace, "port": 443}}),
    };
    let mut template = json!({"clientConfig": client, "namespaceSelector": selector,
        "matchConditions": v.match_conditions, "timeoutSeconds": v.fail_timeout,
        "admissionReports": v.admission_reports});
    if let Some(o) = &v.object_selector {
        template["objectSelector"] = o.clone();
    }
    let annotations = json!({"admissions.enforcer/disabled": "true", TEMPLATE_ANNOTATION: template.to_string()});
    let plain = json!({"admissions.enforcer/disabled": "true"});
    let config = |kind: &str, name: &str, annotations: &Value, webhooks: Vec<Value>| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "labels": labels, "annotations": annotations}, "webhooks": webhooks})
    };
    vec![
        config("ValidatingWebhookConfiguration", names.validating, &annotations, Vec::new()),
        config("MutatingWebhookConfiguration", names.mutating, &annotations, Vec::new()),
        config("ValidatingWebhookConfiguration", KYVERNO_POLICY_CONFIG, &plain, vec![policy_entry(v)]),
        config("MutatingWebhookConfiguration", KYVERNO_VERIFY_CONFIG, &plain, vec![monitor_entry(v)]),
    ]
}

/// A binding `name` of `role` to the ServiceAccount `account` of `ns`: a RoleBinding of a Role
/// in `namespace` when given, else a ClusterRoleBinding of a ClusterRole.
fn binding(namespace: Option<&str>, name: &str, role: &str, account: &str, ns: &str) -> Value {
    let (kind, role_kind) =
        if namespace.is_some() { ("RoleBinding", "Role") } else { ("ClusterRoleBinding", "ClusterRole") };
    let mut metadata = json!({"name": name, "labels": labels()});
    if let Some(n) = namespace {
        metadata["namespace"] = json!(n);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]})
}

/// [`aggregating_components`] for one controller component.
fn aggregating_component(name: &str, selecting: &[&str], component: Option<&str>) -> Value {
    aggregating_components(name, selecting, component.as_slice())
}

/// A ClusterRole holding the rules of every ClusterRole labelled with one of `selecting`
/// ("true"), or labelled as Kyverno's chart labels one of its controller `components`' own
/// (`app.kubernetes.io/component: COMPONENT`, `instance` and `part-of: kyverno`), which
/// Kyverno's controller roles aggregate too.
fn aggregating_components(name: &str, selecting: &[&str], components: &[&str]) -> Value {
    let mut selectors: Vec<Value> = selecting.iter().map(|l| json!({"matchLabels": {*l: "true"}})).collect();
    for c in components {
        selectors.push(json!({"matchLabels": {"app.kubernetes.io/component": c,
            "app.kubernetes.io/instance": "kyverno", "app.kubernetes.io/part-of": "kyverno"}}));
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels()},
        "aggregationRule": {"clusterRoleSelectors": selectors}, "rules": []})
}

/// A ClusterRole of `rules` labelled `rbac.verno.io/aggregate-to-{to}`, so that the role of that
/// controller aggregates it.
fn aggregated_into(name: &str, to: &str, rules: &[Value]) -> Value {
    let mut l = labels();
    l[format!("rbac.verno.io/aggregate-to-{to}")] = json!("true");
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": l}, "rules": rules})
}

/// The user-facing ClusterRoles Kyverno's chart installs (`kyverno:rbac:…` with Kyverno's
/// names, `verno:rbac:…` otherwise): admin (write) and view (read) of policies, policy
/// reports, ephemeral reports and update requests, aggregated into Kubernetes' `admin` and
/// `view` roles as the values say.
fn user_roles(v: &Values) -> Vec<Value> {
    let prefix = if v.kyverno_names { "kyverno:rbac" } else { "verno:rbac" };
    let write = ["create", "delete", "get", "list", "patch", "update", "watch"];
    let read = ["get", "list", "watch"];
    let groups: [(&str, Vec<Value>); 4] = [
        (
            "policies",
            vec![
                json!({"apiGroups": ["kyverno.io"], "resources": ["cleanuppolicies", "clustercleanuppolicies", "policies", "clusterpolicies"]}),
                json!({"apiGroups": ["policies.kyverno.io"], "resources": ["deletingpolicies", "generatingpolicies", "imagevalidatingpolicies", "mutatingpolicies", "namespaceddeletingpolicies", "namespacedgeneratingpolicies", "namespacedimagevalidatingpolicies", "namespacedmutatingpolicies", "namespacedvalidatingpolicies", "policyexceptions", "validatingpolicies"]}),
            ],
        ),
        (
            "policyreports",
            vec![json!({"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports", "clusterpolicyreports"]})],
        ),
        (
            "reports",
            vec![
                json!({"apiGroups": ["reports.kyverno.io"], "resources": ["ephemeralreports", "clusterephemeralreports"]}),
            ],
        ),
        ("updaterequests", vec![json!({"apiGroups": ["kyverno.io"], "resources": ["updaterequests"]})]),
    ];
    let mut out = Vec::new();
    for (what, rules) in groups {
        for (role, verbs, aggregate, on) in
            [("admin", &write[..], "admin", v.aggregate_to_admin), ("view", &read[..], "view", v.aggregate_to_view)]
        {
            let mut l = labels();
            if on && let Some(m) = l.as_object_mut() {
                m.insert(format!("rbac.authorization.k8s.io/aggregate-to-{aggregate}"), json!("true"));
            }
            let rules: Vec<Value> = rules
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    if let Some(m) = r.as_object_mut() {
                        m.insert("verbs".into(), json!(verbs));
                    }
                    r
                })
                .collect();
            out.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": format!("{prefix}:{role}:{what}"), "labels": l}, "rules": rules}));
        }
    }
    out
}

/// The whole install, in apply order (webhook configurations first).
pub fn render(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    let mut docs = webhook_configurations(v);
    docs.extend([
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels()}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": v.admission_account, "namespace": ns, "labels": labels()}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": v.background_account, "namespace": ns, "labels": labels()}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": v.cleanup_account, "namespace": ns, "labels": labels()}}),
        // The ClusterRole is also the webhook configurations' owner.
        admission_cluster_role(v),
        binding(None, CLUSTER_ROLE, CLUSTER_ROLE, &v.admission_account, ns),
    ]);
    docs.extend(aggregated_roles(v));
    docs.extend(extra_rules(v));
    docs.extend(user_roles(v));
    docs.push(config_map(v));
    docs.extend(namespaced_roles(v));
    if v.server_url.is_some() {
        return docs;
    }
    docs.extend(workload(v));
    docs
}

/// Verno's own ClusterRole: what the admission controller and the reports controller read
/// and write.
fn admission_cluster_role(v: &Values) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": CLUSTER_ROLE, "labels": labels()},
    "rules": [
        {"apiGroups": ["kyverno.io"], "resources": ["clusterpolicies", "policies", "policyexceptions"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kyverno.io"], "resources": ["clusterpolicies/status", "policies/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["kyverno.io"], "resources": ["cleanuppolicies", "clustercleanuppolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kyverno.io"], "resources": ["cleanuppolicies/status", "clustercleanuppolicies/status"], "verbs": ["get", "patch", "update"]},
        // GlobalContextEntries: their data kept for policies, refresh times stamped.
        {"apiGroups": ["kyverno.io"], "resources": ["globalcontextentries"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kyverno.io"], "resources": ["globalcontextentries/status"], "verbs": ["get", "patch", "update"]},
        // The kinds Verno enforces, and the ImageValidatingPolicies it reports as not
        // supported yet (in their status; they are not sent to policy validation).
        {"apiGroups": ["policies.kyverno.io"], "resources": cel_read(), "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["policies.kyverno.io"], "resources": CEL_STATUS, "verbs": ["get", "patch", "update"]},
        // Namespace labels for matching; ConfigMaps for `configMap` context entries.
        {"apiGroups": [""], "resources": ["namespaces", "configmaps"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "resourceNames": ConfigNames::of(v.kyverno_names).all(), "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "verbs": ["list", "watch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": [CLUSTER_ROLE], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["list", "watch"]},
        // The requesting user's Roles and ClusterRoles (`roles`/`clusterRoles` in match
        // and exclude, `request.roles`), worked out from the bindings as Kyverno does.
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings", "clusterrolebindings"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        // Admission policies and their bindings, which background scans report, and
        // which Verno writes for the policies that ask for them (as Kyverno's role).
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        // MutatingAdmissionPolicies for the MutatingPolicies that ask for one (Kyverno's
        // chart leaves them to extraResources; Verno grants them so the policy field
        // works as written).
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingadmissionpolicies", "mutatingadmissionpolicybindings"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        // PolicyReports from admission results and background scans.
        {"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports", "clusterpolicyreports"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        {"apiGroups": ["openreports.io"], "resources": ["reports", "clusterreports"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        // The CEL authorizer library (`authorizer.….check(verb)`).
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]})
}

/// The ClusterRoles that aggregate what ClusterRoles labelled for each controller grant
/// (Kyverno's labels and Verno's), bound to the accounts that act as them.
fn aggregated_roles(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    let mut docs = Vec::new();
    // Verno's account also does the work of Kyverno's admission and reports controllers (context
    // loaders, background scans): it holds what ClusterRoles labelled for either aggregate, so
    // the grants written for Kyverno (`rbac.kyverno.io/aggregate-to-reports-controller` for a
    // scan of Secrets, say) work unchanged.
    let aggregated = format!("{CLUSTER_ROLE}:aggregate");
    docs.extend([
        aggregating_components(
            &aggregated,
            &[
                "rbac.kyverno.io/aggregate-to-admission-controller",
                "rbac.kyverno.io/aggregate-to-reports-controller",
                "rbac.verno.io/aggregate-to-admission-controller",
            ],
            &["admission-controller", "reports-controller"],
        ),
        binding(None, &aggregated, &aggregated, &v.admission_account, ns),
    ]);
    // The background controller creates, updates and deletes what generate and mutate-existing
    // rules name. As Kyverno's chart, the permissions come from ClusterRoles the user labels
    // `rbac.kyverno.io/aggregate-to-background-controller: "true"` (so the ones written for
    // Kyverno work unchanged), aggregated into one role bound to the background account.
    docs.extend([
        aggregating_component(
            BACKGROUND_ROLE,
            &["rbac.kyverno.io/aggregate-to-background-controller", "rbac.verno.io/aggregate-to-background-controller"],
            Some("background-controller"),
        ),
        binding(None, BACKGROUND_ROLE, BACKGROUND_ROLE, &v.background_account, ns),
    ]);
    // The cleanup controller deletes what cleanup and deleting policies and the TTL label
    // select; its permissions come, as in Kyverno's chart, from ClusterRoles labelled
    // `rbac.kyverno.io/aggregate-to-cleanup-controller: "true"` plus the chart's extra rules.
    docs.extend([
        aggregating_component(
            CLEANUP_ROLE,
            &["rbac.kyverno.io/aggregate-to-cleanup-controller", "rbac.verno.io/aggregate-to-cleanup-controller"],
            Some("cleanup-controller"),
        ),
        binding(None, CLEANUP_ROLE, CLEANUP_ROLE, &v.cleanup_account, ns),
    ]);
    docs
}

/// The controllers' own rules and the chart's `extraResources`, aggregated into their roles;
/// the `view` role bindings.
fn extra_rules(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    let mut docs = Vec::new();
    // The background controller's own rules (Kyverno's core role's `extraResources`, the chart's
    // defaults unless set) and the user's extra ones, aggregated into its role.
    for (suffix, rules) in [("core", &v.background_core_resources), ("additional", &v.background_extra_resources)] {
        if !rules.is_empty() {
            docs.push(aggregated_into(&format!("{BACKGROUND_ROLE}:{suffix}"), "background-controller", rules));
        }
    }
    if !v.admission_extra_resources.is_empty() {
        let name = format!("{CLUSTER_ROLE}:additional");
        docs.extend([
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels()},
                "rules": v.admission_extra_resources}),
            binding(None, &name, &name, &v.admission_account, ns),
        ]);
    }
    // What the cleanup controller itself reads (as Kyverno's cleanup core role): namespaces, for
    // namespace selectors and context entries.
    let namespaces = [json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]})];
    docs.push(aggregated_into(&format!("{CLEANUP_ROLE}:core"), "cleanup-controller", &namespaces));
    // The policy kinds, as Kyverno's background core role grants them: generate rules may make
    // (and synchronize) policies and exceptions, and Kyverno's policy validation checks that.
    let all = ["create", "delete", "get", "list", "patch", "update", "watch", "deletecollection"];
    let policy_kinds = [
        json!({"apiGroups": ["kyverno.io"], "resources": ["policies", "policies/status", "clusterpolicies",
            "clusterpolicies/status", "policyexceptions", "updaterequests", "updaterequests/status",
            "globalcontextentries", "globalcontextentries/status"], "verbs": all}),
        json!({"apiGroups": ["policies.kyverno.io"], "resources": ["generatingpolicies", "namespacedgeneratingpolicies",
            "mutatingpolicies", "namespacedmutatingpolicies", "policyexceptions"], "verbs": all}),
    ];
    docs.push(aggregated_into(&format!("{BACKGROUND_ROLE}:policies"), "background-controller", &policy_kinds));
    if !v.reports_extra_resources.is_empty() {
        docs.push(aggregated_into(
            "verno:reports-controller:additional",
            "admission-controller",
            &v.reports_extra_resources,
        ));
    }
    if !v.cleanup_extra_resources.is_empty() {
        docs.push(aggregated_into(
            &format!("{CLEANUP_ROLE}:additional"),
            "cleanup-controller",
            &v.cleanup_extra_resources,
        ));
    }
    if v.view_role_binding {
        // Read access for background scans (the policies' RBACPermissionsGranted condition).
        docs.push(binding(None, &format!("{CLUSTER_ROLE}:view"), &v.view_role, &v.admission_account, ns));
        // And for the background controller (triggers, clone sources), as Kyverno's chart.
        docs.push(binding(None, &format!("{BACKGROUND_ROLE}:view"), &v.view_role, &v.background_account, ns));
    }
    docs
}

/// The ConfigMap of Kyverno's dynamic configuration keys.
fn config_map(v: &Values) -> Value {
    let ns = &v.namespace;
    // Kyverno's dynamic configuration keys that Verno reads (followed live).
    let mut config_data = json!({"generateSuccessEvents": v.generate_success_events.to_string()});
    if !v.success_event_actions.is_empty() {
        config_data["successEventActions"] = json!(v.success_event_actions);
    }
    // As Kyverno's chart writes them: filters one after another, the user lists comma-separated.
    if !v.resource_filters.is_empty() {
        config_data["resourceFilters"] = json!(v.resource_filters.concat());
    }
    for (key, list) in [
        ("excludeGroups", &v.exclude_groups),
        ("excludeUsernames", &v.exclude_usernames),
        ("excludeRoles", &v.exclude_roles),
        ("excludeClusterRoles", &v.exclude_cluster_roles),
    ] {
        if !list.is_empty() {
            config_data[key] = json!(list.join(","));
        }
    }
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": v.config_name, "namespace": ns, "labels": labels()}, "data": config_data})
}

/// Verno's Role in its namespace (certificates, leases, its Deployment) and the Role that lets
/// it act as the two controller accounts, with their bindings.
fn namespaced_roles(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": CLUSTER_ROLE, "namespace": ns, "labels": labels()},
        "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
        ]}),
        binding(Some(ns), CLUSTER_ROLE, CLUSTER_ROLE, &v.admission_account, ns),
        // Verno's account acts as the background and cleanup accounts (and as no one else).
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": IMPERSONATE_ROLE, "namespace": ns, "labels": labels()},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [v.background_account, v.cleanup_account], "verbs": ["impersonate"]}]}),
        binding(Some(ns), IMPERSONATE_ROLE, IMPERSONATE_ROLE, &v.admission_account, ns),
    ]
}

/// What runs Verno in the cluster: its Services, Deployment and (with more than one replica)
/// PodDisruptionBudget.
fn workload(v: &Values) -> Vec<Value> {
    let ns = &v.namespace;
    let selector = json!({"app.kubernetes.io/name": "verno", "app.kubernetes.io/component": "admission-controller"});
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": v.service(), "namespace": ns, "labels": labels()},
            "spec": {"selector": selector, "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE, "namespace": ns, "labels": labels()},
            "spec": {"selector": selector, "ports": [{"name": "metrics-port", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]}}),
        deployment(v, &selector),
    ];
    if v.replicas > 1 {
        docs.push(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": DEPLOYMENT, "namespace": ns, "labels": labels()},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}}));
    }
    docs
}

/// Verno's Deployment (`selector`: its pods' labels).
fn deployment(v: &Values, selector: &Value) -> Value {
    let ns = &v.namespace;
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DEPLOYMENT, "namespace": ns, "labels": labels()},
    "spec": {
        "replicas": v.replicas,
        "selector": {"matchLabels": selector},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": labels()},
            "spec": {
                "serviceAccountName": v.admission_account,
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}}],
                "containers": [{
                    "name": "verno",
                    "image": format!("{}:{}", v.image_repository, v.image_tag),
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["serve", "--kube", "--service", v.service(), "--deployment", DEPLOYMENT, "--owner-cluster-role", CLUSTER_ROLE,
                "--config-map", v.config_name, "--omit-events", v.omit_events.join(","),
                "--background-scan", v.background_scan.to_string(), "--admission-reports", v.admission_reports.to_string(),
                "--openreports", v.openreports.to_string(), "--background-controller", v.background_controller.to_string(),
                "--cleanup-controller", v.cleanup_controller.to_string(),
                "--background-account", v.background_account, "--cleanup-account", v.cleanup_account,
                "--kyverno-names", v.kyverno_names.to_string(),
                "--force-failure-policy-ignore", v.force_failure_policy_ignore.to_string(),
                "--mutating-admission-policy-reports", v.mutating_admission_policy_reports.to_string(),
                "--enable-policy-exception", v.policy_exceptions.to_string(), "--exception-namespace", v.exception_namespace],
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
    }})
}

/// Multi-document YAML.
pub fn to_yaml(docs: &[Value]) -> Result<String, YamlError> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).map_err(YamlError)?);
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

    /// Verno outside the cluster (Kyverno's `--serverIP`): every webhook calls the URL, and
    /// nothing runs Verno in the cluster.
    #[test]
    fn a_server_url_makes_url_webhooks_and_no_deployment() {
        let v = Values { server_url: Some("https://127.0.0.1:9443/".into()), ..Values::default() };
        let docs = render(&v);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert!(!kinds.contains(&"Deployment") && !kinds.contains(&"Service"), "{kinds:?}");
        let hooks: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")))
            .flat_map(|d| d["webhooks"].as_array().into_iter().flatten())
            .collect();
        assert!(!hooks.is_empty());
        for h in hooks {
            let url = h["clientConfig"]["url"].as_str().unwrap_or("");
            assert!(url.starts_with("https://127.0.0.1:9443/"), "{h}");
            assert!(h["clientConfig"].get("service").is_none(), "{h}");
        }
    }

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
                    assert_eq!(
                        w["namespaceSelector"],
                        json!({"matchLabels": {"kubernetes.io/metadata.name": "verno"}})
                    );
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
        assert!(one.set("admissionController.replicas=x").unwrap_err().to_string().contains("not a whole number"));
        assert!(one.set("nope=1").unwrap_err().to_string().contains("unknown value"));
    }
}
