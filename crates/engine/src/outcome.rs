//! Outcomes are data: every rule that applies yields a status and a message.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Warn,
    Error,
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Error => "error",
            Status::Skip => "skip",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RuleType {
    Validation,
    Mutation,
    Generation,
    ImageVerify,
    /// Cleanup and deleting policies (Kyverno's `Deletion`).
    Deletion,
}

/// The result of one rule on one resource.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleResponse {
    pub name: String,
    pub rule_type: RuleType,
    pub status: Status,
    pub message: String,
    /// Names of the PolicyExceptions that made this rule skip.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exceptions: Vec<String>,
    /// Objects a generate rule produced (with Kyverno's labels).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<serde_json::Value>,
    /// Mutate-existing targets after patching.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub patched_targets: Vec<serde_json::Value>,
    /// Generate rules: keep downstream objects in sync (acted on by the cluster controller).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub synchronize: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub orphan_downstream: bool,
    /// The rule's `reportProperties`, variables substituted once its context and preconditions
    /// were evaluated (Kyverno copies them into the report result's `properties`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<(String, String)>,
    /// Generate rules: where `clone` / `cloneList` read their sources — (apiVersion, kind,
    /// namespace, name; no name for a `cloneList`) — also when a source was missing, so the
    /// cluster controller can watch for it. A GeneratingPolicy's `resource.Get/List` reads are
    /// listed with the plural resource in place of the kind.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clone_sources: Vec<(String, String, String, String)>,
}

impl RuleResponse {
    pub fn new(name: &str, rule_type: RuleType, status: Status, message: impl Into<String>) -> Self {
        RuleResponse {
            name: name.to_string(),
            rule_type,
            status,
            message: message.into(),
            exceptions: Vec::new(),
            generated: Vec::new(),
            patched_targets: Vec::new(),
            synchronize: false,
            orphan_downstream: false,
            properties: Vec::new(),
            clone_sources: Vec::new(),
        }
    }
}

/// A rule that did not apply, and why (for debugging). Written while rules are matched, so
/// it holds the rule's index in the policy (`None`: the whole policy), not a copy of its name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotApplied {
    pub rule: Option<usize>,
    pub reason: std::borrow::Cow<'static, str>,
}

/// Everything one policy said about one resource.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyResponse {
    /// `name` for ClusterPolicy, `namespace/name` for Policy.
    pub policy: String,
    pub rules: Vec<RuleResponse>,
    pub not_applied: Vec<NotApplied>,
    /// The resource after this policy's mutate rules (and every earlier policy's), when changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patched: Option<serde_json::Value>,
}

impl PolicyResponse {
    pub fn rule(&self, name: &str) -> Option<&RuleResponse> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// Appends another phase's results for the same policy.
    pub fn merge(&mut self, other: PolicyResponse) {
        self.rules.extend(other.rules);
        self.not_applied.extend(other.not_applied);
        if other.patched.is_some() {
            self.patched = other.patched;
        }
    }
}
