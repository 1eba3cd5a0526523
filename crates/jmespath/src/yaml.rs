//! YAML → JSON with Kubernetes' YAML 1.1 scalar rules (`0644` is octal, `yes` is true), used by
//! `parse_yaml` and re-exported for the other crates so every YAML reader behaves the same.

use serde_json::Value;

/// The options every Verno YAML reader uses. Errors say the line and column but carry no
/// snippet of the input: a file may hold secrets (a test file can name any path), and its text
/// must not end up in logs.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { legacy_octal_numbers: true, with_snippet: false }
}

/// Parses one YAML document into JSON.
pub fn parse(s: &str) -> Result<Value, serde_saphyr::Error> {
    let v: Option<Value> = serde_saphyr::from_str_with_options(s, options())?;
    Ok(v.unwrap_or(Value::Null))
}

/// Parses a multi-document stream; empty documents are dropped.
pub fn parse_all(s: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    let docs: Vec<Option<Value>> = serde_saphyr::from_str_multiple_with_options(s, options())?;
    Ok(docs.into_iter().flatten().filter(|v| !v.is_null()).collect())
}
