//! Strict decoding of the CLI's files, the way Kyverno decodes them: every field must be known
//! (an unknown field is an error naming its path) but names match regardless of letter case,
//! as Go's `encoding/json` does. Keys are rewritten to their canonical spelling, then the value
//! is handed to serde.

use serde_json::{Map, Value};
use thiserror::Error;

/// What a node of a document may hold.
pub enum Shape {
    /// Anything: not checked.
    Free,
    /// A scalar (string, number, bool, null).
    Scalar,
    /// An object with exactly these fields.
    Object(&'static [(&'static str, &'static Shape)]),
    /// A list whose items have this shape.
    List(&'static Shape),
}

#[derive(Debug, Error, PartialEq)]
pub enum StrictError {
    #[error("unknown field \"{field}\" at {path}")]
    UnknownField { path: String, field: String },
    #[error("{path}: expected {expected}, found {found}")]
    WrongType { path: String, expected: &'static str, found: &'static str },
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// Checks `v` against `shape` and returns it with canonical key spelling.
pub fn normalize(v: &Value, shape: &Shape, path: &str) -> Result<Value, StrictError> {
    match shape {
        Shape::Free => Ok(v.clone()),
        Shape::Scalar => match v {
            Value::Array(_) | Value::Object(_) => {
                Err(StrictError::WrongType { path: path.to_string(), expected: "a scalar", found: type_name(v) })
            }
            _ => Ok(v.clone()),
        },
        Shape::List(item) => match v {
            Value::Null => Ok(Value::Null),
            Value::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for (i, x) in a.iter().enumerate() {
                    out.push(normalize(x, item, &format!("{path}[{i}]"))?);
                }
                Ok(Value::Array(out))
            }
            other => {
                Err(StrictError::WrongType { path: path.to_string(), expected: "a list", found: type_name(other) })
            }
        },
        Shape::Object(fields) => match v {
            Value::Null => Ok(Value::Null),
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, x) in m {
                    let found = fields
                        .iter()
                        .find(|(name, _)| *name == k)
                        .or_else(|| fields.iter().find(|(name, _)| name.eq_ignore_ascii_case(k)));
                    let Some((name, sub)) = found else {
                        return Err(StrictError::UnknownField {
                            path: if path.is_empty() { "the top level".into() } else { path.to_string() },
                            field: k.clone(),
                        });
                    };
                    let child = if path.is_empty() { (*name).to_string() } else { format!("{path}.{name}") };
                    out.insert((*name).to_string(), normalize(x, sub, &child)?);
                }
                Ok(Value::Object(out))
            }
            other => {
                Err(StrictError::WrongType { path: path.to_string(), expected: "an object", found: type_name(other) })
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static INNER: Shape = Shape::Object(&[("name", &Shape::Scalar)]);
    static LIST: Shape = Shape::List(&INNER);
    static TOP: Shape = Shape::Object(&[("apiVersion", &Shape::Scalar), ("items", &LIST)]);

    #[test]
    fn field_names_match_case_insensitively() {
        let v = json!({"APIVERSION": "x", "Items": [{"NAME": "a"}]});
        assert_eq!(normalize(&v, &TOP, ""), Ok(json!({"apiVersion": "x", "items": [{"name": "a"}]})));
    }

    #[test]
    fn unknown_fields_are_errors_with_their_path() {
        let v = json!({"items": [{"name": "a", "nmae": "b"}]});
        assert_eq!(
            normalize(&v, &TOP, "").map_err(|e| e.to_string()),
            Err("unknown field \"nmae\" at items[0]".to_string())
        );
    }
}
