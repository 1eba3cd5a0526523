//! Assertion trees as kyverno-json evaluates them (chainsaw's assert/error documents, `check`
//! and `expect.match`): maps match partially, lists element by element with equal length,
//! scalars by value; `(…)` keys project with an expression, `~` iterates, `-> name` binds.
//!
//! `Ok(mismatches)`: the tree was evaluated (no mismatch: it holds). `Err`: a hard error (a
//! type that cannot be compared, a projection on a non-object, a failing expression), which
//! ends the operation at once; its text is the error with its context (`{:#}`).

use crate::expr::{self, Bindings};
use anyhow::{Context as _, Result, bail};
use serde_json::Value;

pub type Mismatches = Vec<String>;

pub fn check(expected: &Value, actual: &Value, bindings: &Bindings) -> Result<Mismatches> {
    let mut out = Vec::new();
    node(expected, actual, bindings, "", &mut out)?;
    Ok(out)
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 { format!("{}…", &s[..s.floor_char_boundary(200)]) } else { s }
}

fn node(expected: &Value, actual: &Value, b: &Bindings, path: &str, out: &mut Mismatches) -> Result<()> {
    match expected {
        Value::Object(m) => {
            if m.is_empty() {
                if actual.is_null() {
                    out.push(format!("{}: Invalid value: null: invalid value, must not be null", display(path)));
                }
                return Ok(());
            }
            for (k, e) in m {
                let p = expr::parse(k);
                let here = child(path, k);
                let projected = match &p.compiler {
                    Some(c) => {
                        expr::eval(c, &p.statement, actual, b).with_context(|| format!("{here}: Internal error"))?
                    }
                    None => match actual {
                        Value::Null => {
                            out.push(format!("{here}: Required value: field not found in the input object"));
                            continue;
                        }
                        Value::Object(a) => match a.get(&p.statement) {
                            Some(v) => v.clone(),
                            None => {
                                out.push(format!("{here}: Required value: field not found in the input object"));
                                continue;
                            }
                        },
                        _ => bail!("{here}: Internal error: projection not recognized"),
                    },
                };
                let mut b = b.clone();
                if !p.binding.is_empty() {
                    b.set(&p.binding, projected.clone());
                }
                if p.foreach {
                    match &projected {
                        Value::Array(items) => {
                            for (i, item) in items.iter().enumerate() {
                                let b = if p.foreach_name.is_empty() {
                                    b.clone()
                                } else {
                                    b.with(&p.foreach_name, i.into())
                                };
                                node(e, item, &b, &format!("{here}[{i}]"), out)?;
                            }
                        }
                        Value::Object(items) => {
                            for (key, item) in items {
                                let b = if p.foreach_name.is_empty() {
                                    b.clone()
                                } else {
                                    b.with(&p.foreach_name, key.clone().into())
                                };
                                node(e, item, &b, &format!("{here}[{key}]"), out)?;
                            }
                        }
                        other => bail!("{here}: Invalid value: {}: expected a slice or a map", show(other)),
                    }
                } else {
                    node(e, &projected, &b, &here, out)?;
                }
            }
            Ok(())
        }
        Value::Array(es) => match actual {
            Value::Null => {
                out.push(format!("{}: Invalid value: null: value is null", display(path)));
                Ok(())
            }
            Value::Array(a) if a.len() != es.len() => {
                out.push(format!("{}: Invalid value: {}: lengths of slices don't match", display(path), show(actual)));
                Ok(())
            }
            Value::Array(a) => {
                for (i, (e, x)) in es.iter().zip(a).enumerate() {
                    node(e, x, b, &format!("{path}[{i}]"), out)?;
                }
                Ok(())
            }
            other => bail!("{}: Invalid value: {}: expected a slice", display(path), show(other)),
        },
        scalar => {
            let want = match scalar {
                Value::String(s) => {
                    let p = expr::parse(s);
                    if p.foreach {
                        bail!("{}: foreach is not supported in scalar projections", display(path));
                    }
                    if !p.binding.is_empty() {
                        bail!("{}: binding is not supported in scalar projections", display(path));
                    }
                    match &p.compiler {
                        Some(c) => expr::eval(c, &p.statement, actual, b)
                            .with_context(|| format!("{}: Internal error", display(path)))?,
                        None => Value::String(p.statement),
                    }
                }
                v => v.clone(),
            };
            if !matches(&want, actual).with_context(|| format!("{}: Internal error", display(path)))? {
                out.push(format!(
                    "{}: Invalid value: {}: Expected value: {}",
                    display(path),
                    show(actual),
                    show(&want)
                ));
            }
            Ok(())
        }
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() { "(root)" } else { path }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "invalid",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "slice",
        Value::Object(_) => "map",
    }
}

/// kyverno-json's `matching.Match`: a map or list produced by an expression compares
/// partially (maps) or element by element (lists of the same length).
pub fn matches(expected: &Value, actual: &Value) -> Result<bool> {
    match expected {
        Value::Array(es) => {
            let Value::Array(a) = actual else {
                bail!("invalid actual value, must be a slice, found {}", kind(actual));
            };
            if a.len() != es.len() {
                return Ok(false);
            }
            for (e, x) in es.iter().zip(a) {
                if !matches(e, x)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Value::Object(es) => {
            let Value::Object(a) = actual else {
                bail!("invalid actual value, must be a map, found {}", kind(actual));
            };
            for (k, e) in es {
                match a.get(k) {
                    None => return Ok(false),
                    Some(x) => {
                        if !matches(e, x)? {
                            return Ok(false);
                        }
                    }
                }
            }
            Ok(true)
        }
        _ => equal(expected, actual),
    }
}

/// kyverno-json's `matching.Equal`: nulls, deep equality of one type, numbers by value;
/// anything else cannot be compared (a hard error, not a mismatch).
fn equal(expected: &Value, actual: &Value) -> Result<bool> {
    match (expected, actual) {
        (Value::Null, Value::Null) => Ok(true),
        (Value::Null, _) | (_, Value::Null) => Ok(false),
        (Value::Number(e), Value::Number(a)) => Ok(e == a || e.as_f64() == a.as_f64()),
        (e, a) if kind(e) == kind(a) => Ok(e == a),
        (e, a) => bail!("types are not comparable, {} - {}", kind(e), kind(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn holds(e: Value, a: Value) -> bool {
        check(&e, &a, &Bindings::default()).unwrap().is_empty()
    }

    #[test]
    fn maps_match_partially_and_report_missing_fields() {
        assert!(holds(json!({"a": 1}), json!({"a": 1, "b": 2})));
        assert!(!holds(json!({"a": 1}), json!({"a": 2})));
        let m = check(&json!({"status": {"ready": true}}), &json!({"metadata": {}}), &Bindings::default()).unwrap();
        assert_eq!(m, vec!["status: Required value: field not found in the input object"]);
        assert!(holds(json!({"a": {}}), json!({"a": {"x": 1}})));
        assert!(!holds(json!({"a": {}}), json!({"a": null})));
    }

    #[test]
    fn lists_must_have_the_same_length_and_order() {
        assert!(holds(json!({"l": [{"n": 1}, {"n": 2}]}), json!({"l": [{"n": 1, "x": 0}, {"n": 2}]})));
        assert!(!holds(json!({"l": [{"n": 1}]}), json!({"l": [{"n": 1}, {"n": 2}]})));
        assert!(!holds(json!({"l": [{"n": 2}, {"n": 1}]}), json!({"l": [{"n": 1}, {"n": 2}]})));
        assert!(!holds(json!({"l": [1]}), json!({"l": null})));
        assert!(check(&json!({"l": [1]}), &json!({"l": "x"}), &Bindings::default()).is_err());
    }

    #[test]
    fn scalars_compare_by_value_and_other_types_are_a_hard_error() {
        assert!(holds(json!({"n": 1}), json!({"n": 1.0})));
        assert!(holds(json!({"s": null}), json!({"s": null})));
        assert!(!holds(json!({"s": "x"}), json!({"s": null})));
        assert!(check(&json!({"s": "true"}), &json!({"s": true}), &Bindings::default()).is_err());
        assert!(check(&json!({"s": 1}), &json!({"s": {"a": 1}}), &Bindings::default()).is_err());
    }

    #[test]
    fn expression_keys_project_and_bindings_reach_them() {
        let b = Bindings::default().with("stderr", json!("admission webhook denied the request"));
        assert!(check(&json!({"(contains($stderr, 'denied'))": true}), &Value::Null, &b).unwrap().is_empty());
        assert!(!check(&json!({"(contains($stderr, 'allowed'))": true}), &Value::Null, &b).unwrap().is_empty());
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert!(holds(json!({"(length(spec.containers))": 2}), pod.clone()));
        assert!(holds(json!({"spec": {"~.(containers)": {"(name != null)": true}}}), pod.clone()));
        // A scalar expression's result is compared with the value: a bool against a string
        // cannot be compared, which is a hard error, as kyverno-json has it.
        assert!(
            check(&json!({"spec": {"~.(containers)": {"name": "(@ != null)"}}}), &pod, &Bindings::default()).is_err()
        );
        assert!(!holds(json!({"spec": {"~.(containers)": {"name": "a"}}}), pod.clone()));
        assert!(holds(json!({"spec": {"~i.(containers)": {"(to_string($i))": "(to_string($i))"}}}), pod.clone()));
        assert!(holds(json!({"(spec.containers[0]) -> c": {"($c.name)": "a"}}), pod));
        // An expression producing a map compares partially.
        assert!(holds(json!({"(spec)": {"x": 1}}), json!({"spec": {"x": 1, "y": 2}})));
        // Escaped text is a plain string.
        assert!(holds(json!({"a": "\\(x)\\"}), json!({"a": "(x)"})));
    }
}
