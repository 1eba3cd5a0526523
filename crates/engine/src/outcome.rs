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
///
/// What few rules produce (exceptions, generated objects, patched targets, report properties,
/// clone sources) sits behind one optional box: a response is moved several times on its way
/// out, and most responses are a name, a status and a message.
#[derive(Debug, Clone)]
pub struct RuleResponse {
    pub name: compact_str::CompactString,
    pub rule_type: RuleType,
    pub status: Status,
    pub message: String,
    /// Generate rules: keep downstream objects in sync (acted on by the cluster controller).
    pub synchronize: bool,
    pub orphan_downstream: bool,
    extra: Option<Box<RuleExtra>>,
}

/// The parts of a [`RuleResponse`] few rules have.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleExtra {
    /// Names of the PolicyExceptions that made this rule skip.
    pub exceptions: Vec<String>,
    /// Objects a generate rule produced (with Kyverno's labels).
    pub generated: Vec<serde_json::Value>,
    /// Mutate-existing targets after patching.
    pub patched_targets: Vec<serde_json::Value>,
    /// The rule's `reportProperties`, variables substituted once its context and preconditions
    /// were evaluated (Kyverno copies them into the report result's `properties`).
    pub properties: Vec<(String, String)>,
    /// Generate rules: where `clone` / `cloneList` read their sources — (apiVersion, kind,
    /// namespace, name; no name for a `cloneList`) — also when a source was missing, so the
    /// cluster controller can watch for it. A GeneratingPolicy's `resource.Get/List` reads are
    /// listed with the plural resource in place of the kind.
    pub clone_sources: Vec<(String, String, String, String)>,
}

static NO_EXTRA: RuleExtra = RuleExtra {
    exceptions: Vec::new(),
    generated: Vec::new(),
    patched_targets: Vec::new(),
    properties: Vec::new(),
    clone_sources: Vec::new(),
};

impl RuleResponse {
    pub fn new(name: &str, rule_type: RuleType, status: Status, message: impl Into<String>) -> Self {
        RuleResponse {
            name: name.into(),
            rule_type,
            status,
            message: message.into(),
            synchronize: false,
            orphan_downstream: false,
            extra: None,
        }
    }

    fn extra(&self) -> &RuleExtra {
        self.extra.as_deref().unwrap_or(&NO_EXTRA)
    }

    /// The parts few rules have, to set them (made empty on first use).
    pub fn extra_mut(&mut self) -> &mut RuleExtra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// Names of the PolicyExceptions that made this rule skip.
    pub fn exceptions(&self) -> &[String] {
        &self.extra().exceptions
    }

    /// Objects a generate rule produced.
    pub fn generated(&self) -> &[serde_json::Value] {
        &self.extra().generated
    }

    /// Mutate-existing targets after patching.
    pub fn patched_targets(&self) -> &[serde_json::Value] {
        &self.extra().patched_targets
    }

    /// The rule's rendered `reportProperties`.
    pub fn properties(&self) -> &[(String, String)] {
        &self.extra().properties
    }

    /// Where a generate rule's clones read their sources.
    pub fn clone_sources(&self) -> &[(String, String, String, String)] {
        &self.extra().clone_sources
    }
}

/// Equal when every part is (no extras and empty extras are the same).
impl PartialEq for RuleResponse {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.rule_type == other.rule_type
            && self.status == other.status
            && self.message == other.message
            && self.synchronize == other.synchronize
            && self.orphan_downstream == other.orphan_downstream
            && self.extra() == other.extra()
    }
}

/// The fields in their order, the empty and false ones left out (as the derived form wrote them
/// before the extras moved into their box).
impl Serialize for RuleResponse {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let x = self.extra();
        let mut s = serializer.serialize_struct("RuleResponse", 11)?;
        s.serialize_field("name", self.name.as_str())?;
        s.serialize_field("rule_type", &self.rule_type)?;
        s.serialize_field("status", &self.status)?;
        s.serialize_field("message", &self.message)?;
        if !x.exceptions.is_empty() {
            s.serialize_field("exceptions", &x.exceptions)?;
        }
        if !x.generated.is_empty() {
            s.serialize_field("generated", &x.generated)?;
        }
        if !x.patched_targets.is_empty() {
            s.serialize_field("patched_targets", &x.patched_targets)?;
        }
        if self.synchronize {
            s.serialize_field("synchronize", &self.synchronize)?;
        }
        if self.orphan_downstream {
            s.serialize_field("orphan_downstream", &self.orphan_downstream)?;
        }
        if !x.properties.is_empty() {
            s.serialize_field("properties", &x.properties)?;
        }
        if !x.clone_sources.is_empty() {
            s.serialize_field("clone_sources", &x.clone_sources)?;
        }
        s.end()
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

#[cfg(test)]
mod rule_response_tests {
    use super::*;

    /// The extras' box changes neither the written form (fields in their order, empty ones left
    /// out) nor equality (no extras equals empty extras).
    #[test]
    fn responses_serialize_and_compare_as_their_fields() {
        let plain = RuleResponse::new("r", RuleType::Validation, Status::Pass, "ok");
        assert_eq!(
            serde_json::to_string(&plain).unwrap_or_default(),
            r#"{"name":"r","rule_type":"Validation","status":"pass","message":"ok"}"#
        );
        let mut emptied = plain.clone();
        emptied.extra_mut();
        assert_eq!(plain, emptied);
        assert_eq!(
            serde_json::to_string(&emptied).unwrap_or_default(),
            serde_json::to_string(&plain).unwrap_or_default()
        );
        let mut full = RuleResponse::new("g", RuleType::Generation, Status::Pass, "");
        full.synchronize = true;
        full.orphan_downstream = true;
        let x = full.extra_mut();
        x.exceptions = vec!["ns/e".into()];
        x.generated = vec![serde_json::json!({"kind": "ConfigMap"})];
        x.patched_targets = vec![serde_json::json!(1)];
        x.properties = vec![("k".into(), "v".into())];
        x.clone_sources = vec![("v1".into(), "Secret".into(), "ns".into(), "s".into())];
        assert_eq!(
            serde_json::to_string(&full).unwrap_or_default(),
            concat!(
                r#"{"name":"g","rule_type":"Generation","status":"pass","message":"","exceptions":["ns/e"],"#,
                r#""generated":[{"kind":"ConfigMap"}],"patched_targets":[1],"synchronize":true,"orphan_downstream":true,"#,
                r#""properties":[["k","v"]],"clone_sources":[["v1","Secret","ns","s"]]}"#
            )
        );
        assert_ne!(full, plain);
        assert_eq!(full.exceptions(), ["ns/e".to_string()]);
        assert_eq!(full.clone_sources().len(), 1);
        let mut other = full.clone();
        other.extra_mut().properties.clear();
        assert_ne!(full, other);
    }
}
