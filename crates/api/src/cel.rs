//! The CEL policy kinds: `policies.kyverno.io` ValidatingPolicy, MutatingPolicy (and their
//! Namespaced forms) and PolicyException, and Kubernetes' ValidatingAdmissionPolicy and
//! MutatingAdmissionPolicy with their bindings. They share one spec shape (Kubernetes'
//! admission policy, which Kyverno's kinds extend), so one set of types reads them all; a field
//! a kind does not have is simply absent. Expressions stay strings: the engine compiles them.

use crate::meta::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Any of the CEL policy kinds, by its shared spec.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelPolicy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CelPolicySpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_constraints: Option<MatchResources>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<NamedExpression>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<NamedExpression>,
    /// ValidatingPolicy / ValidatingAdmissionPolicy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validations: Vec<Validation>,
    /// ValidatingPolicy: `Deny`, `Warn`, `Audit`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_actions: Vec<String>,
    /// MutatingPolicy / MutatingAdmissionPolicy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mutations: Vec<Mutation>,
    /// `Fail` (the default) or `Ignore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    /// Kyverno's autogen settings (`podControllers.controllers`), read as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autogen: Option<Value>,
    /// An admission policy's `paramKind` (`apiVersion`, `kind`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_kind: Option<Value>,
    // Fields of Kyverno 1.19's and Kubernetes' schemas that Verno reads nowhere yet; modelled
    // so that strict decoding accepts them (and refuses what is in no schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_annotations: Option<Value>,
    /// `Never` or `IfNeeded` (MutatingPolicy, MutatingAdmissionPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinvocation_policy: Option<String>,
    /// `timeoutSeconds` of the webhook Kyverno configures for the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<Value>,
    /// MutatingPolicy mutate-existing targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_match_constraints: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_match_conditions: Option<Value>,
    /// GeneratingPolicy: what to generate, each a CEL `expression` (calling `generator.Apply`)
    /// or a YAML `template`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generate: Vec<Generation>,
    /// GeneratingPolicy: server-side apply for generated objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_server_side_apply: Option<bool>,
    /// ImageValidatingPolicy: which images the policy is about (`glob` or `expression`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_image_references: Vec<Value>,
    /// ImageValidatingPolicy: image lists by name (`name`, `expression`), beside the Pod ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NamedExpression>,
    /// ImageValidatingPolicy: who signs (`cosign` or `notary`), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestors: Vec<Value>,
    /// ImageValidatingPolicy: attestations by name (`intoto` or `referrer`, with a `type`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<Value>,
    /// ImageValidatingPolicy: `mutateDigest`, `verifyDigest`, `required` (all true by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_configurations: Option<Value>,
    /// ImageValidatingPolicy: registry access (`allowInsecureRegistry`, `providers`, `secrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Value>,
}

/// One `spec.generate` entry of a GeneratingPolicy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Generation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<GenerationTemplate>,
}

/// A generation template: YAML documents, with `(( expr ))` placeholders when `interpolate` is
/// `cel`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GenerationTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpolate: Option<String>,
    #[serde(default)]
    pub value: String,
}

/// Kubernetes `MatchResources`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchResources {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_rules: Vec<ResourceRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_resource_rules: Vec<ResourceRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_policy: Option<String>,
}

/// Kubernetes `NamedRuleWithOperations`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRule {
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub api_versions: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub operations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A named CEL expression: a variable or a match condition.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NamedExpression {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub expression: Value,
}

/// One validation of a ValidatingPolicy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Validation {
    #[serde(default)]
    pub expression: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_expression: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One mutation of a MutatingPolicy: `ApplyConfiguration` or `JSONPatch`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mutation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_configuration: Option<ExpressionField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_patch: Option<ExpressionField>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExpressionField {
    #[serde(default)]
    pub expression: Value,
}

/// Kyverno's `evaluation`: `mode` (`Kubernetes` or `JSON`) and the background / admission
/// switches.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Evaluation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<Switch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Switch>,
    /// MutatingPolicy: mutate existing resources.
    #[serde(default, rename = "mutateExisting", skip_serializing_if = "Option::is_none")]
    pub mutate_existing: Option<Switch>,
    #[serde(default, rename = "skipBackgroundRequests", skip_serializing_if = "Option::is_none")]
    pub skip_background_requests: Option<bool>,
    #[serde(default, rename = "useServerSideApply", skip_serializing_if = "Option::is_none")]
    pub use_server_side_apply: Option<bool>,
    /// GeneratingPolicy: generate for triggers that exist when the policy is created.
    #[serde(default, rename = "generateExisting", skip_serializing_if = "Option::is_none")]
    pub generate_existing: Option<Switch>,
    /// GeneratingPolicy: keep generated objects in sync with the policy, trigger and source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronize: Option<Switch>,
    /// GeneratingPolicy: keep generated objects when the policy is deleted.
    #[serde(default, rename = "orphanDownstreamOnPolicyDelete", skip_serializing_if = "Option::is_none")]
    pub orphan_downstream_on_policy_delete: Option<Switch>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Switch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A ValidatingAdmissionPolicyBinding or MutatingAdmissionPolicyBinding.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyBinding {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BindingSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    #[serde(default)]
    pub policy_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_actions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_resources: Option<MatchResources>,
    /// `name`, `namespace` or `selector` of the params object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_ref: Option<Value>,
}

/// A `policies.kyverno.io` PolicyException: the policies it names and when it applies.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelPolicyException {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CelExceptionSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelExceptionSpec {
    #[serde(default)]
    pub policy_refs: Vec<PolicyRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<NamedExpression>,
    // Kyverno 1.19 fields not read yet (image exceptions, expiry, reporting); modelled so
    // that strict decoding accepts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_values: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_mode: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_result: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicyRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// `policies.kyverno.io` DeletingPolicy / NamespacedDeletingPolicy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletingPolicy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: DeletingPolicySpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletingPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_constraints: Option<MatchResources>,
    /// CEL conditions; an object is deleted when all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<NamedExpression>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<NamedExpression>,
    /// Cron schedule (required).
    #[serde(default)]
    pub schedule: String,
    /// `Foreground`, `Background` or `Orphan`; unset: the API server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_propagation_policy: Option<String>,
}
