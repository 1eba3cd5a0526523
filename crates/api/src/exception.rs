//! `kyverno.io/v2` (and `v2beta1`) PolicyException.

use crate::meta::ObjectMeta;
use crate::policy::{Conditions, MatchResources, PodSecurityStandard};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyException {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ExceptionSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    #[serde(default, rename = "match")]
    pub match_: MatchResources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
    #[serde(default)]
    pub exceptions: Vec<ExceptionRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_security: Vec<PodSecurityStandard>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionRef {
    #[serde(default)]
    pub policy_name: String,
    #[serde(default)]
    pub rule_names: Vec<String>,
}
