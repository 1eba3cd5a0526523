//! Kubernetes metadata and label selectors.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The stored object's uid (events name the policy by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// When the API server stored the object (RFC 3339); the background controller compares
    /// it with its triggers' (a trigger created before its policy is generated for only with
    /// `generateExisting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

impl LabelSelector {
    /// The selector in the API's `labelSelector` query syntax (`a=b,c in (d,e),!f`); `None`
    /// when it cannot be said there (an unknown operator, Kyverno's `*`/`?` wildcards in a
    /// value, an `In` without values). An empty selector is `Some("")`: everything.
    pub fn to_query(&self) -> Option<String> {
        let plain = |s: &str| !s.is_empty() && !s.contains(['*', '?', ',', '(', ')', '=', '!', ' ']);
        let mut parts = Vec::new();
        for (k, v) in self.match_labels.iter().flatten() {
            if !plain(k) || v.contains(['*', '?', ',', '(', ')', '=', '!', ' ']) {
                return None;
            }
            parts.push(format!("{k}={v}"));
        }
        for e in self.match_expressions.iter().flatten() {
            if !plain(&e.key) || e.values.iter().any(|v| !plain(v)) {
                return None;
            }
            parts.push(match e.operator.as_str() {
                "In" if !e.values.is_empty() => format!("{} in ({})", e.key, e.values.join(",")),
                "NotIn" if !e.values.is_empty() => format!("{} notin ({})", e.key, e.values.join(",")),
                "Exists" => e.key.clone(),
                "DoesNotExist" => format!("!{}", e.key),
                _ => return None,
            });
        }
        Some(parts.join(","))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}
