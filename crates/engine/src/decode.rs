//! Reading policy documents into their serde types: strictly (a field the kind does not have is
//! an error that names it), for every kind.

use crate::error::{CompileError, DocumentError};
use serde_json::Value;
use verno_api::Kind;

/// Decodes a `kyverno.io` document into its serde type, refusing fields the kind does not have
/// under `spec` (a typo such as `patern:` would otherwise be dropped and the rule enforce less
/// than it says). Kyverno refuses them too: its CLI validates documents against the CRD schemas
/// (`value provided for unknown field`), and the API server with kubectl's strict field
/// validation. `metadata` (all of ObjectMeta) and `status` are not checked. Free-form parts
/// (patterns, patches, CEL `Value`s) are accepted whole.
/// The CEL kinds decode through here too (`vpol::decode`), with the fields of Kyverno 1.19's
/// and Kubernetes' schemas modelled in `verno_api::cel`.
pub(crate) fn strict<T: serde::de::DeserializeOwned>(doc: &Value, kind: Option<Kind>) -> Result<T, DocumentError> {
    let mut unknown: Option<String> = None;
    let decoded = serde_ignored::deserialize(doc.clone(), |path| {
        let path = field_path(&path);
        if unknown.is_none() && path.starts_with("spec.") {
            unknown = Some(path);
        }
    })
    .map_err(|e| DocumentError::Decode(e.to_string()))?;
    match unknown {
        Some(path) => Err(DocumentError::Invalid(CompileError::new(
            path,
            format!("unknown field: a {} has no such field", kind.map_or("policy", Kind::name)),
        ))),
        None => Ok(decoded),
    }
}

/// `spec.rules.0.validate` as Kyverno writes paths: `spec.rules[0].validate`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let p = field_path(parent);
            if p.is_empty() { key.clone() } else { format!("{p}.{key}") }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// A CEL-kind document read into its serde type; a shape error names the field.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(doc: &Value) -> Result<T, CompileError> {
    let kind = verno_api::Kind::of_document(doc);
    strict(doc, kind).map_err(|e| match e {
        DocumentError::Invalid(e) => e,
        other => CompileError::new("spec", other.to_string()),
    })
}

/// JSON of a typed part, for the compilers that take the policy's own shape.
pub(crate) fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
