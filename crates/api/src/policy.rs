//! `kyverno.io/v1` (and `v2beta1`) ClusterPolicy / Policy.
//!
//! Free-form parts (patterns, condition keys and values, mutate and generate bodies) stay
//! `serde_json::Value`; the engine compiles them.

use crate::meta::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicy {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Spec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_failure_action: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_failure_action_overrides: Vec<FailureActionOverride>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_rules: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<WebhookConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emit_warning: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_server_side_apply: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_existing: Option<bool>,
    /// The deprecated spelling of `generateExisting`, still in Kyverno 1.19's schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_existing_on_policy_update: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutate_existing_on_policy_update: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_validation: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureActionOverride {
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "match")]
    pub match_: MatchResources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<MatchResources>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Conditions>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cel_preconditions: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate: Option<Validation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutate: Option<Mutation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<Generation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_images: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_extractors: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_background_requests: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_properties: Option<BTreeMap<String, String>>,
}

/// `match` / `exclude`: `any`, `all`, or the legacy inline form.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<Vec<ResourceFilter>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<Vec<ResourceFilter>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceDescription>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<Subject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_roles: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFilter {
    #[serde(default)]
    pub resources: ResourceDescription,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<Subject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_roles: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDescription {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextEntry {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variable: Option<VariableEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_call: Option<ApiCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_registry: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_reference: Option<GlobalReference>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VariableEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "jmesPath")]
    pub jmes_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapReference {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "jmesPath")]
    pub jmes_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalReference {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "jmesPath")]
    pub jmes_path: Option<String>,
}

/// Conditions: `{any: [...], all: [...]}` or the legacy bare list (meaning all).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Conditions {
    List(Vec<Condition>),
    AnyAll {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        any: Option<Vec<Condition>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        all: Option<Vec<Condition>>,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub key: Value,
    #[serde(default)]
    pub operator: String,
    #[serde(default)]
    pub value: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Validation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_action: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_action_overrides: Vec<FailureActionOverride>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_existing_violations: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_pattern: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Deny>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Vec<ForEachValidation>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assert: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deny {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForEachValidation {
    #[serde(default)]
    pub list: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element_scope: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Conditions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_pattern: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Deny>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Vec<ForEachValidation>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    #[serde(default)]
    pub level: String,
    #[serde(default)]
    pub version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<PodSecurityStandard>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurityStandard {
    #[serde(default)]
    pub control_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restricted_field: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// `mutate`: a strategic merge patch, RFC 6902 patches (a string), foreach, and targets.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mutation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetResourceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_strategic_merge: Option<Value>,
    #[serde(default, rename = "patchesJson6902", skip_serializing_if = "Option::is_none")]
    pub patches_json6902: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Vec<ForEachMutation>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutate_existing_on_policy_update: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForEachMutation {
    #[serde(default)]
    pub list: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Conditions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_strategic_merge: Option<Value>,
    #[serde(default, rename = "patchesJson6902", skip_serializing_if = "Option::is_none")]
    pub patches_json6902: Option<String>,
    /// Nested foreach (free-form JSON in Kyverno's API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Vec<ForEachMutation>>,
}

/// A mutate-existing target.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetResourceSpec {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Conditions>,
}

/// `generate`: the downstream identity and one of data, clone, cloneList or foreach.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Generation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronize: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_downstream_on_policy_delete: Option<bool>,
    /// Rule-level `generateExisting` (Kyverno 1.13+); the background controller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_existing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneFrom>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_list: Option<CloneList>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<Vec<ForEachGeneration>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloneFrom {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloneList {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub kinds: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForEachGeneration {
    #[serde(default)]
    pub list: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditions: Option<Conditions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneFrom>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_list: Option<CloneList>,
}

/// `kyverno.io/v2` CleanupPolicy / ClusterCleanupPolicy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupPolicy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CleanupPolicySpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupPolicySpec {
    /// Loaded once per run, before any target (no `configMap` or `imageRegistry` entries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextEntry>,
    #[serde(default, rename = "match")]
    pub match_: MatchResources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<MatchResources>,
    /// `any` / `all` conditions; each candidate object is `target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
    /// Cron schedule (required).
    #[serde(default)]
    pub schedule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_propagation_policy: Option<String>,
}
