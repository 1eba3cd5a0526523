//! The properties the fuzz targets assert beyond "no panic". A file of its own, with no
//! dependency on libFuzzer, so the workspace's tests run the checked-in corpora through the same
//! checks (`crates/engine/tests/fuzz_properties.rs` includes it by path).

use serde_json::Value;
use verno_engine::jsonpatch;
use verno_jmespath::{Expression, NoEnv, RuntimeError};

/// The JSON patch [`jsonpatch::diff`] makes from `before` to `after` (what the webhook answers
/// a mutation with) parses, applies to `before`, and gives `after`.
pub fn patch_round_trip(before: &Value, after: &Value) -> Result<(), String> {
    let ops = Value::Array(jsonpatch::diff(before, after));
    let parsed = jsonpatch::parse_ops(&ops).map_err(|e| format!("the diff {ops} does not parse: {e}"))?;
    let mut doc = before.clone();
    jsonpatch::apply(&mut doc, &parsed).map_err(|e| format!("the diff {ops} does not apply to {before}: {e}"))?;
    // Numbers compare as numbers (`4.0` is `4`), as the diff compares them.
    if !verno_engine::equal(&doc, after) {
        return Err(format!("the diff {ops} applied to {before} gives {doc}, not {after}"));
    }
    Ok(())
}

/// The ways an enclosing expression reads a sub-expression: an operator, a function argument,
/// a pipe, and (when the current node is not null: a multiselect of null is null, its items
/// unread) a multiselect. `{}` is the sub-expression.
const ENCLOSING: &[&str] =
    &["({}) || `1`", "({}) && `1`", "!({})", "to_string(({}))", "not_null(({}), `1`)", "({}) | @", "({}) == `null`"];
const MULTISELECTS: &[&str] = &["[({}), `1`]", "{a: ({}), b: `1`}"];

/// As go-jmespath (Kyverno's fork) does: an error of a sub-expression is an error of the whole,
/// whatever encloses it; only a missing key (`RuntimeError::NotFound`) reads as `null`. So when
/// `expr` fails on `input` with any other error, every enclosing form of it fails too (a
/// `parse_json(x) || 'fallback'` must not turn a failed parse into the fallback).
pub fn jmespath_errors_propagate(expr: &str, input: &Value) -> Result<(), String> {
    let Ok(e) = Expression::compile(expr) else { return Ok(()) };
    let err = match e.search(input, &NoEnv) {
        Ok(_) | Err(RuntimeError::NotFound(_)) => return Ok(()),
        Err(err) => err,
    };
    let multiselects = if input.is_null() { &[][..] } else { MULTISELECTS };
    for form in ENCLOSING.iter().chain(multiselects) {
        let whole = form.replace("{}", expr);
        let w = Expression::compile(&whole).map_err(|p| format!("`{expr}` compiles but `{whole}` does not: {p}"))?;
        if let Ok(v) = w.search(input, &NoEnv) {
            return Err(format!("`{expr}` fails ({err}) but `{whole}` gives {v}"));
        }
    }
    Ok(())
}
