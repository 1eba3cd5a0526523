//! `admission.k8s.io/v1` AdmissionReview: what the API server sends a webhook and what the
//! webhook answers. The objects stay `serde_json::Value` (policies read them as JSON); the
//! envelope is typed, so the server reads fields instead of JSON pointers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The envelope in both directions: `request` on the way in, `response` on the way out.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    /// Repeated in the answer (`admission.k8s.io/v1`, or `v1beta1` from old API servers).
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "review_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

/// What a request does to its object (`request.operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

/// For a request built in code; a review read from the wire names its operation.
impl Default for Operation {
    fn default() -> Operation {
        Operation::Create
    }
}

impl Operation {
    pub const ALL: [Operation; 4] = [Operation::Create, Operation::Update, Operation::Delete, Operation::Connect];

    /// As the API server writes it: `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }

    /// One of the four, in any case; `None` for anything else.
    pub fn parse(s: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str().eq_ignore_ascii_case(s))
    }
}

/// From the four words exactly as the API server writes them; the error names the word.
impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Operation, D::Error> {
        let word = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Operation::ALL.into_iter().find(|o| o.as_str() == word).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown operation {word:?}, expected CREATE, UPDATE, DELETE or CONNECT"))
        })
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_api_version() -> String {
    "admission.k8s.io/v1".into()
}

fn review_kind() -> String {
    "AdmissionReview".into()
}

/// `group`/`version`/`kind` as the API server names the requested type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

impl GroupVersionKind {
    /// `group/version`, or `version` for the core group; empty when the version is unknown.
    pub fn api_version(&self) -> String {
        match (self.group.is_empty(), self.version.is_empty()) {
            (_, true) => String::new(),
            (true, false) => self.version.clone(),
            (false, false) => format!("{}/{}", self.group, self.version),
        }
    }
}

/// `group`/`version`/`resource` (the plural).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// Who asks: `request.userInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, Value>,
}

/// The annotation Verno's end-to-end probe webhook stamps on the probe Lease (Kyverno's
/// verify webhook stamps `kyverno.io/last-request-time`).
pub const LAST_REQUEST_ANNOTATION: &str = "verno.io/last-request-time";

/// The request half of a review.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub resource: GroupVersionResource,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// A review with another word is refused as malformed; one without it (the API server
    /// always sends it) is read as a CREATE.
    #[serde(default)]
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    /// The new object; absent (null) on DELETE.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub object: Value,
    /// The old object on UPDATE and DELETE.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub old_object: Value,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub options: Value,
}

impl AdmissionRequest {
    /// The object the request is about: the old one on DELETE.
    pub fn subject(&self) -> &Value {
        if self.object.is_null() { &self.old_object } else { &self.object }
    }

    /// A string field of the subject's metadata (`name`, `namespace`, `uid`, ...).
    fn subject_meta(&self, field: &str) -> &str {
        self.subject().get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or("")
    }

    /// The requested kind, else the object's own `kind`.
    pub fn kind_name(&self) -> &str {
        if self.kind.kind.is_empty() {
            self.subject().get("kind").and_then(Value::as_str).unwrap_or("")
        } else {
            &self.kind.kind
        }
    }

    /// The request's namespace, else the object's. A Namespace lives in none: the API server
    /// sends a Namespace's own name as `request.namespace` (the fake API server did not, so
    /// reports of Namespaces were looked for at `/namespaces/bar/namespaces/bar` on a real
    /// one, and denials named `Namespace/bar/bar` where Kyverno says `Namespace//bar`).
    pub fn namespace_name(&self) -> &str {
        let core_namespace = self.kind_name() == "Namespace" && self.kind.group.is_empty();
        if core_namespace {
            ""
        } else if self.namespace.is_empty() {
            self.subject_meta("namespace")
        } else {
            &self.namespace
        }
    }

    /// The request's name, else the object's.
    pub fn object_name(&self) -> &str {
        if self.name.is_empty() { self.subject_meta("name") } else { &self.name }
    }

    /// `group/version` of the requested kind, else the object's own `apiVersion`.
    pub fn api_version(&self) -> String {
        let gv = self.kind.api_version();
        if gv.is_empty() {
            self.subject().get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string()
        } else {
            gv
        }
    }

    /// The object's uid (the API server assigns it before validating admission, even on CREATE).
    pub fn object_uid(&self) -> &str {
        self.subject_meta("uid")
    }
}

/// The answer half of a review.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of a JSON Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `metav1.Status` as a denial carries it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Status {
    /// A `Failure` with the message the user sees.
    pub fn failure(message: impl Into<String>) -> Status {
        Status { metadata: serde_json::Map::new(), status: "Failure".into(), message: message.into() }
    }
}

impl AdmissionReview {
    /// The answer to a review: same `apiVersion`, `kind: AdmissionReview`, this response.
    pub fn answer(api_version: &str, response: AdmissionResponse) -> AdmissionReview {
        AdmissionReview {
            api_version: api_version.to_string(),
            kind: review_kind(),
            request: None,
            response: Some(response),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Found on the real API server: a Namespace's request names the Namespace
    /// itself as `namespace`; the Namespace lives in none.
    #[test]
    fn a_namespace_lives_in_no_namespace() {
        let req: AdmissionRequest = serde_json::from_value(json!({"uid": "u", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Namespace"}, "namespace": "bar", "name": "bar",
            "object": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bar"}}}))
        .unwrap_or_default();
        assert_eq!(req.namespace_name(), "");
        let pod: AdmissionRequest = serde_json::from_value(json!({"uid": "u", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "bar", "name": "p",
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}))
        .unwrap_or_default();
        assert_eq!(pod.namespace_name(), "bar");
    }

    #[test]
    fn a_delete_request_is_about_its_old_object() {
        let r: AdmissionReview = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u", "operation": "DELETE", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                        "oldObject": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop", "uid": "d1"}}}
        }))
        .unwrap();
        let req = r.request.unwrap();
        assert_eq!((req.kind_name(), req.namespace_name(), req.object_name()), ("Deployment", "shop", "web"));
        assert_eq!((req.api_version().as_str(), req.object_uid()), ("apps/v1", "d1"));
        assert!(req.object.is_null());
    }

    #[test]
    fn an_answer_has_no_empty_fields() {
        let a = AdmissionReview::answer(
            "admission.k8s.io/v1",
            AdmissionResponse { uid: "u".into(), allowed: true, ..Default::default() },
        );
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": true}})
        );
    }
}
