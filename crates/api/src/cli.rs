//! The Kyverno CLI's own files (`cli.kyverno.io/v1alpha1`): Test, Values and UserInfo.

use crate::strict::Shape;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Test {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub policies: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub target_resources: Vec<String>,
    #[serde(default)]
    pub exceptions: Vec<String>,
    #[serde(default)]
    pub variables: Option<String>,
    #[serde(default)]
    pub values: Option<Value>,
    #[serde(default)]
    pub userinfo: Option<String>,
    #[serde(default)]
    pub param_resources: Vec<String>,
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub cluster_resources: Vec<String>,
    #[serde(default)]
    pub json_payloads: Vec<String>,
    #[serde(default)]
    pub http_payloads: Vec<String>,
    #[serde(default)]
    pub envoy_payloads: Vec<String>,
    #[serde(default)]
    pub api_call_responses: Vec<Value>,
    #[serde(default)]
    pub global_context_entries: Vec<Value>,
    #[serde(default)]
    pub checks: Vec<Value>,
    #[serde(default)]
    pub results: Vec<TestResult>,
}

impl Test {
    pub fn name(&self) -> String {
        self.metadata.as_ref().and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default().to_string()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TestResult {
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub rule: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_specs: Vec<Value>,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub result: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub patched_resources: Option<String>,
    #[serde(default)]
    pub generated_resource: Option<String>,
    #[serde(default)]
    pub generated_resources: Vec<String>,
    #[serde(default)]
    pub clone_source_resource: Option<String>,
    #[serde(default)]
    pub fail_on_missing_resources: Option<bool>,
    #[serde(default)]
    pub is_validating_admission_policy: bool,
    #[serde(default)]
    pub is_mutating_admission_policy: bool,
    #[serde(default)]
    pub is_validating_policy: bool,
    #[serde(default)]
    pub is_mutating_policy: bool,
    #[serde(default)]
    pub is_generating_policy: bool,
    #[serde(default)]
    pub is_image_validating_policy: bool,
    #[serde(default)]
    pub is_deleting_policy: bool,
}

/// The Values file (`kind: Values`), or a Test's inline `values`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Values {
    #[serde(default)]
    pub global_values: BTreeMap<String, Value>,
    #[serde(default)]
    pub policies: Vec<PolicyValues>,
    #[serde(default)]
    pub namespace_selector: Vec<NamespaceSelectorValues>,
    #[serde(default)]
    pub namespaces: Vec<Value>,
    #[serde(default)]
    pub subresources: Vec<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyValues {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub rules: Vec<RuleValues>,
    #[serde(default)]
    pub resources: Vec<ResourceValues>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleValues {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub values: BTreeMap<String, Value>,
    #[serde(default)]
    pub foreach_values: BTreeMap<String, Vec<Value>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceValues {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub values: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelectorValues {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `kind: UserInfo`: who is making the request in `verno test` / `verno apply`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfoFile {
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub cluster_roles: Vec<String>,
    #[serde(default)]
    pub user_info: Value,
}

static S: Shape = Shape::Scalar;
static F: Shape = Shape::Free;
static LS: Shape = Shape::List(&S);
static LF: Shape = Shape::List(&F);

static RESULT: Shape = Shape::Object(&[
    ("policy", &S),
    ("rule", &S),
    ("resources", &LS),
    ("resourceSpecs", &LF),
    ("kind", &S),
    ("result", &S),
    ("status", &S),
    ("resource", &S),
    ("namespace", &S),
    ("operation", &S),
    ("patchedResources", &S),
    ("generatedResource", &S),
    ("generatedResources", &LS),
    ("cloneSourceResource", &S),
    ("failOnMissingResources", &S),
    ("isValidatingAdmissionPolicy", &S),
    ("isMutatingAdmissionPolicy", &S),
    ("isValidatingPolicy", &S),
    ("isMutatingPolicy", &S),
    ("isGeneratingPolicy", &S),
    ("isImageValidatingPolicy", &S),
    ("isDeletingPolicy", &S),
]);
static RESULTS: Shape = Shape::List(&RESULT);

static RULE_VALUES: Shape = Shape::Object(&[("name", &S), ("values", &F), ("foreachValues", &F)]);
static RULE_VALUES_L: Shape = Shape::List(&RULE_VALUES);
static RES_VALUES: Shape = Shape::Object(&[("name", &S), ("values", &F)]);
static RES_VALUES_L: Shape = Shape::List(&RES_VALUES);
static POLICY_VALUES: Shape = Shape::Object(&[("name", &S), ("rules", &RULE_VALUES_L), ("resources", &RES_VALUES_L)]);
static POLICY_VALUES_L: Shape = Shape::List(&POLICY_VALUES);
static NS_SEL: Shape = Shape::Object(&[("name", &S), ("labels", &F)]);
static NS_SEL_L: Shape = Shape::List(&NS_SEL);

/// The body of a Values document (also a Test's inline `values`).
pub static VALUES_SPEC: Shape = Shape::Object(&[
    ("apiVersion", &S),
    ("kind", &S),
    ("metadata", &F),
    ("globalValues", &F),
    ("policies", &POLICY_VALUES_L),
    ("namespaceSelector", &NS_SEL_L),
    ("namespaces", &LF),
    ("subresources", &LF),
]);

pub static TEST: Shape = Shape::Object(&[
    ("apiVersion", &S),
    ("kind", &S),
    ("metadata", &F),
    ("policies", &LS),
    ("resources", &LS),
    ("targetResources", &LS),
    ("exceptions", &LS),
    ("variables", &S),
    ("values", &VALUES_SPEC),
    ("userinfo", &S),
    ("paramResources", &LS),
    ("context", &S),
    ("clusterResources", &LS),
    ("jsonPayloads", &LS),
    ("httpPayloads", &LS),
    ("envoyPayloads", &LS),
    ("apiCallResponses", &LF),
    ("globalContextEntries", &LF),
    ("checks", &LF),
    ("results", &RESULTS),
]);

pub static USER_INFO: Shape = Shape::Object(&[
    ("apiVersion", &S),
    ("kind", &S),
    ("metadata", &F),
    ("roles", &LS),
    ("clusterRoles", &LS),
    ("userInfo", &F),
]);
