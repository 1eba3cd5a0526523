//! Conditions (`preconditions`, `deny`, exception `conditions`): operators with Kyverno's exact
//! coercions, and any/all evaluation with messages.

use crate::context::Context;
use crate::error::{CompileError, EvalError};
use crate::pattern;
use crate::template::TValue;
use serde_json::Value;
use std::borrow::Cow;
use std::cmp::Ordering;
use verno_api::{Condition, Conditions};
use verno_jmespath::{duration, quantity::Quantity, semver, value::go_sprint, wildcard};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    AnyIn,
    AllIn,
    AnyNotIn,
    AllNotIn,
    GreaterThan,
    GreaterThanOrEquals,
    LessThan,
    LessThanOrEquals,
    DurationGreaterThan,
    DurationGreaterThanOrEquals,
    DurationLessThan,
    DurationLessThanOrEquals,
}

impl Operator {
    pub fn parse(s: &str) -> Option<Operator> {
        Some(match s.to_ascii_lowercase().as_str() {
            "equals" | "equal" => Operator::Equals,
            "notequals" | "notequal" => Operator::NotEquals,
            "in" => Operator::In,
            "notin" => Operator::NotIn,
            "anyin" => Operator::AnyIn,
            "allin" => Operator::AllIn,
            "anynotin" => Operator::AnyNotIn,
            "allnotin" => Operator::AllNotIn,
            "greaterthan" => Operator::GreaterThan,
            "greaterthanorequals" => Operator::GreaterThanOrEquals,
            "lessthan" => Operator::LessThan,
            "lessthanorequals" => Operator::LessThanOrEquals,
            "durationgreaterthan" => Operator::DurationGreaterThan,
            "durationgreaterthanorequals" => Operator::DurationGreaterThanOrEquals,
            "durationlessthan" => Operator::DurationLessThan,
            "durationlessthanorequals" => Operator::DurationLessThanOrEquals,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct CompiledCondition {
    key: TValue,
    op: Operator,
    value: TValue,
    message: Option<TValue>,
}

/// `{any, all}`; the legacy list is `all`.
#[derive(Debug, Clone, Default)]
pub struct CompiledConditions {
    any: Option<Vec<CompiledCondition>>,
    all: Option<Vec<CompiledCondition>>,
}

impl CompiledConditions {
    /// `preconditions` (or `conditions`) that a rule, foreach entry or target may leave out.
    pub fn compile_optional(c: Option<&Conditions>, path: &str) -> Result<Option<CompiledConditions>, CompileError> {
        c.map(|c| CompiledConditions::compile(c, path)).transpose()
    }

    pub fn compile(c: &Conditions, path: &str) -> Result<CompiledConditions, CompileError> {
        let list = |v: &[Condition], p: &str| -> Result<Vec<CompiledCondition>, CompileError> {
            v.iter().enumerate().map(|(i, c)| compile_one(c, &format!("{p}[{i}]"))).collect()
        };
        Ok(match c {
            Conditions::List(v) => CompiledConditions { any: None, all: Some(list(v, path)?) },
            Conditions::AnyAll { any, all } => CompiledConditions {
                any: any.as_ref().map(|v| list(v, &format!("{path}.any"))).transpose()?,
                all: all.as_ref().map(|v| list(v, &format!("{path}.all"))).transpose()?,
            },
        })
    }

    /// Evaluates; returns (result, messages). On false the messages are those of the failing
    /// conditions; on true those of the conditions that held.
    pub fn evaluate(&self, ctx: &Context) -> Result<(bool, String), EvalError> {
        let mut false_msgs: Vec<String> = Vec::new();
        let mut true_msgs: Vec<String> = Vec::new();
        let mut any_ok = true;
        if let Some(any) = &self.any
            && !any.is_empty()
        {
            any_ok = false;
            for c in any {
                let (v, m) = c.evaluate(ctx)?;
                if v {
                    any_ok = true;
                    if let Some(m) = m {
                        true_msgs.push(m);
                    }
                    break;
                } else if let Some(m) = m {
                    false_msgs.push(m);
                }
            }
        }
        let mut all_ok = true;
        if let Some(all) = &self.all {
            for c in all {
                let (v, m) = c.evaluate(ctx)?;
                if !v {
                    all_ok = false;
                    if let Some(m) = m {
                        false_msgs.push(m);
                    }
                    break;
                } else if let Some(m) = m {
                    true_msgs.push(m);
                }
            }
        }
        let ok = any_ok && all_ok;
        let msgs = if ok { true_msgs } else { false_msgs };
        Ok((ok, msgs.join("; ")))
    }
}

fn compile_one(c: &Condition, path: &str) -> Result<CompiledCondition, CompileError> {
    let op = Operator::parse(&c.operator)
        .ok_or_else(|| CompileError::new(format!("{path}.operator"), format!("unknown operator {:?}", c.operator)))?;
    let key = TValue::compile(&c.key).map_err(|e| CompileError::new(format!("{path}.key"), e))?;
    let value = TValue::compile(&c.value).map_err(|e| CompileError::new(format!("{path}.value"), e))?;
    let message = c
        .message
        .as_ref()
        .filter(|m| !m.is_empty())
        .map(|m| TValue::compile(&Value::String(m.clone())))
        .transpose()
        .map_err(|e| CompileError::new(format!("{path}.message"), e))?;
    Ok(CompiledCondition { key, op, value, message })
}

impl CompiledCondition {
    fn evaluate(&self, ctx: &Context) -> Result<(bool, Option<String>), EvalError> {
        let key = self
            .key
            .render(ctx, "")
            .map_err(|e| EvalError::Substitution(format!("failed to substitute variables in condition key: {e}")))?;
        let value = self
            .value
            .render(ctx, "")
            .map_err(|e| EvalError::Substitution(format!("failed to substitute variables in condition value: {e}")))?;
        let r = evaluate(self.op, &key, &value);
        let msg = self.message.as_ref().map(|m| match m.render(ctx, "") {
            Ok(v) => match v.as_ref() {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
            Err(_) => String::new(),
        });
        Ok((r, msg.filter(|m| !m.is_empty())))
    }
}

/// Applies an operator to substituted key and value. A null key (a filter or function that
/// found nothing) makes every operator false, `NotEquals` and the `…NotIn` ones included, as
/// each of Kyverno's handlers refuses a key of no type.
pub fn evaluate(op: Operator, key: &Value, value: &Value) -> bool {
    if key.is_null() {
        return false;
    }
    match op {
        Operator::Equals => equals(key, value),
        Operator::NotEquals => !equals(key, value),
        Operator::AnyIn => set_op(key, value, SetOp::AnyIn),
        Operator::AllIn => set_op(key, value, SetOp::AllIn),
        Operator::AnyNotIn => set_op(key, value, SetOp::AnyNotIn),
        Operator::AllNotIn => set_op(key, value, SetOp::AllNotIn),
        Operator::In => legacy_in(key, value, false),
        Operator::NotIn => legacy_in(key, value, true),
        Operator::GreaterThan => numeric(key, value) == Some(Ordering::Greater),
        Operator::GreaterThanOrEquals => matches!(numeric(key, value), Some(Ordering::Greater | Ordering::Equal)),
        Operator::LessThan => numeric(key, value) == Some(Ordering::Less),
        Operator::LessThanOrEquals => matches!(numeric(key, value), Some(Ordering::Less | Ordering::Equal)),
        Operator::DurationGreaterThan => duration_cmp(key, value) == Some(Ordering::Greater),
        Operator::DurationGreaterThanOrEquals => {
            matches!(duration_cmp(key, value), Some(Ordering::Greater | Ordering::Equal))
        }
        Operator::DurationLessThan => duration_cmp(key, value) == Some(Ordering::Less),
        Operator::DurationLessThanOrEquals => {
            matches!(duration_cmp(key, value), Some(Ordering::Less | Ordering::Equal))
        }
    }
}

/// A Go duration string other than `"0"`, in nanoseconds.
fn as_duration(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) if s != "0" => duration::parse(s),
        _ => None,
    }
}

/// Whether `s` may be a duration or a quantity: both begin with a sign, a digit or a dot.
fn starts_numeric(s: &str) -> bool {
    matches!(s.as_bytes().first(), Some(b'0'..=b'9' | b'+' | b'-' | b'.'))
}

/// When either side is a duration string and the other a duration or a number (seconds).
fn duration_pair(key: &Value, value: &Value) -> Option<(f64, f64)> {
    let kd = as_duration(key);
    let vd = as_duration(value);
    if kd.is_none() && vd.is_none() {
        return None;
    }
    let secs = |d: Option<i64>, v: &Value| -> Option<f64> {
        match d {
            Some(ns) => Some(ns as f64 / 1e9),
            None => v.as_f64(),
        }
    };
    Some((secs(kd, key)?, secs(vd, value)?))
}

fn duration_cmp(key: &Value, value: &Value) -> Option<Ordering> {
    let k = match key {
        Value::String(s) => duration::parse(s)? as f64 / 1e9,
        Value::Number(n) => n.as_f64()?,
        _ => return None,
    };
    let v = match value {
        Value::String(s) => duration::parse(s)? as f64 / 1e9,
        Value::Number(n) => n.as_f64()?,
        _ => return None,
    };
    k.partial_cmp(&v)
}

fn equals(key: &Value, value: &Value) -> bool {
    match key {
        Value::Bool(b) => value.as_bool() == Some(*b),
        Value::Number(n) => {
            let Some(k) = n.as_f64() else { return false };
            match value {
                Value::Number(v) => v.as_f64() == Some(k),
                Value::String(s) => {
                    if let Some((a, b)) = duration_pair(key, value) {
                        return a == b;
                    }
                    pattern::number_equals_string(n, s)
                }
                _ => false,
            }
        }
        Value::Object(_) | Value::Array(_) => verno_jmespath::value::values_equal(key, value),
        Value::String(k) => {
            // A key that cannot start a number cannot be a duration or a quantity, and a string
            // key pairs with a duration value only as a duration itself: straight to the
            // wildcard comparison (`CREATE` against `DELETE` tried both parsers on each side).
            if !starts_numeric(k) {
                return matches!(value, Value::String(v) if wildcard::matches(v, k));
            }
            if let Some((a, b)) = duration_pair(key, value) {
                return a == b;
            }
            if let Some(kq) = Quantity::parse(k)
                && let Value::String(vs) = value
            {
                return Quantity::parse(vs).is_some_and(|vq| vq == kq);
            }
            match value {
                Value::String(v) => wildcard::matches(v, k),
                _ => false,
            }
        }
        Value::Null => value.is_null(),
    }
}

/// Kyverno's operator names, kept as they are spelled in policies.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, PartialEq)]
enum SetOp {
    AnyIn,
    AllIn,
    AnyNotIn,
    AllNotIn,
}

/// `%v` of a value, borrowed when it is a string.
fn sprint(v: &Value) -> Cow<'_, str> {
    match v {
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(go_sprint(other)),
    }
}

/// A string holding a JSON array (`'["a", "b"]'`), decoded; `None` for any other string
/// (turned away without the parser when it does not start with `[`).
fn json_array(s: &str) -> Option<Vec<Value>> {
    if !s.trim_start().starts_with('[') {
        return None;
    }
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Array(a)) => Some(a),
        _ => None,
    }
}

fn key_elements(key: &Value) -> Option<Vec<(Cow<'_, str>, &Value)>> {
    static NULL: Value = Value::Null;
    match key {
        Value::Array(a) => Some(a.iter().map(|v| (sprint(v), v)).collect()),
        Value::Object(_) => None,
        Value::Null => Some(vec![(Cow::Borrowed(""), &NULL)]),
        other => Some(vec![(sprint(other), other)]),
    }
}

fn set_op(key: &Value, value: &Value, op: SetOp) -> bool {
    let Some(keys) = key_elements(key) else { return false };
    let key_is_array = key.is_array();
    // A range value: `a-b` / `a!-b`.
    if let Value::String(s) = value
        && let Some((neg, lo, hi)) = pattern::parse_range(s)
    {
        let in_range = |v: &Value| {
            let r = pattern::validate_string_pattern(v, &format!("{lo}-{hi}"));
            if neg { !r } else { r }
        };
        let inside: Vec<bool> = keys.iter().map(|(_, v)| in_range(v)).collect();
        return match op {
            SetOp::AnyIn => inside.iter().any(|b| *b),
            SetOp::AllIn => inside.iter().all(|b| *b),
            SetOp::AnyNotIn => inside.iter().any(|b| !*b),
            SetOp::AllNotIn => inside.iter().all(|b| !*b),
        };
    }
    let decoded;
    let (values, exact): (Vec<Cow<'_, str>>, bool) = match value {
        Value::Array(a) => (a.iter().map(sprint).collect(), false),
        Value::String(s) => match json_array(s) {
            Some(a) => {
                decoded = a;
                (decoded.iter().map(sprint).collect(), true)
            }
            None => (vec![Cow::Borrowed(s.as_str())], false),
        },
        // A scalar value stands for a one-element list for AnyIn/AnyNotIn; AllIn/AllNotIn take
        // it as the wrong type (false), as Kyverno's handlers do.
        Value::Number(_) | Value::Bool(_) if key_is_array && matches!(op, SetOp::AnyIn | SetOp::AnyNotIn) => {
            (vec![sprint(value)], false)
        }
        _ => return false,
    };
    let matches = |k: &str, v: &str| if exact { k == v } else { wildcard::matches(v, k) || wildcard::matches(k, v) };
    let mut found = keys.iter().map(|(k, _)| values.iter().any(|v| matches(k, v)));
    match op {
        SetOp::AnyIn => found.any(|b| b),
        SetOp::AllIn => found.all(|b| b),
        SetOp::AnyNotIn => found.any(|b| !b),
        SetOp::AllNotIn => found.all(|b| !b),
    }
}

/// The deprecated `In` (`not_in`: `NotIn`), as Kyverno's handlers decide it. A value of the
/// wrong type (not a list, nor a string that matches or holds a JSON list of strings), a key
/// that is null or an object: false for both. A scalar key (printed as Go prints it) is in a
/// list when one element matches it as a wildcard either way, in a string when the string
/// matches it as a wildcard or is a JSON list of strings holding it. A list key is in a list
/// of strings or a JSON list of strings when all its elements are; a one-element list key
/// equal to a plain string value is in it for both operators (Kyverno's quirk).
fn legacy_in(key: &Value, value: &Value, not_in: bool) -> bool {
    let string_list = |s: &str| serde_json::from_str::<Vec<String>>(s).ok();
    match key {
        Value::Array(ka) => {
            let Some(keys) = ka.iter().map(|k| k.as_str().map(str::to_string)).collect::<Option<Vec<String>>>() else {
                return false;
            };
            let set: Vec<String> = match value {
                Value::Array(a) => match a.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>() {
                    Some(set) => set,
                    None => return false,
                },
                Value::String(s) => {
                    if keys.len() == 1 && keys.first().is_some_and(|k| k == s) {
                        return true;
                    }
                    match string_list(s) {
                        Some(set) => set,
                        None => return false,
                    }
                }
                _ => return false,
            };
            let all_in = keys.iter().all(|k| set.contains(k));
            all_in != not_in
        }
        Value::Object(_) | Value::Null => false,
        scalar => {
            let k = go_sprint(scalar);
            let found = match value {
                Value::Array(a) => {
                    a.iter().map(go_sprint).any(|v| wildcard::matches(&v, &k) || wildcard::matches(&k, &v))
                }
                Value::String(s) => {
                    if wildcard::matches(s, &k) {
                        true
                    } else {
                        match string_list(s) {
                            Some(list) => list.contains(&k),
                            None => return false,
                        }
                    }
                }
                _ => return false,
            };
            found != not_in
        }
    }
}

fn numeric(key: &Value, value: &Value) -> Option<Ordering> {
    if let Some((a, b)) = duration_pair(key, value) {
        return a.partial_cmp(&b);
    }
    match key {
        Value::Number(n) => {
            let k = n.as_f64()?;
            let v = match value {
                Value::Number(v) => v.as_f64()?,
                Value::String(s) => s.parse::<f64>().ok()?,
                _ => return None,
            };
            k.partial_cmp(&v)
        }
        Value::String(ks) => {
            if let Value::String(vs) = value
                && let (Some(a), Some(b)) = (Quantity::parse(ks), Quantity::parse(vs))
            {
                return Some(a.cmp(&b));
            }
            if let Ok(k) = ks.parse::<f64>() {
                let v = match value {
                    Value::Number(v) => v.as_f64()?,
                    Value::String(s) => s.parse::<f64>().ok()?,
                    _ => return None,
                };
                return k.partial_cmp(&v);
            }
            if let (Some(a), Value::String(vs)) = (semver::Version::parse(ks), value) {
                let b = semver::Version::parse(vs)?;
                return Some(a.cmp(&b));
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(k: Value, op: &str, v: Value) -> bool {
        evaluate(Operator::parse(op).unwrap_or(Operator::Equals), &k, &v)
    }

    /// Found by the Kyverno oracle (issue 50), checked against Kyverno's CLI: an empty list of
    /// images `AllNotIn` the number 1 denied a Pod Kyverno admits.
    #[test]
    fn all_in_and_all_not_in_refuse_a_scalar_value_for_a_list_key() {
        assert!(!t(json!([]), "AllNotIn", json!(1)));
        assert!(!t(json!(["a"]), "AllNotIn", json!(1)));
        assert!(!t(json!(["1"]), "AllIn", json!(1)));
        assert!(t(json!(["1"]), "AnyIn", json!(1)));
        assert!(t(json!(["a"]), "AnyNotIn", json!(1)));
    }

    /// Found by the Kyverno oracle (issue 50), checked against Kyverno's CLI: a key that is null
    /// (`containers[?x].name` on a ConfigMap) denied through `NotEquals`, `AnyNotIn`, `AllNotIn`
    /// and `AnyIn` where Kyverno admits: every operator is false on a null key.
    #[test]
    fn a_null_key_makes_every_operator_false() {
        for op in [
            "Equals",
            "NotEquals",
            "AnyIn",
            "AllIn",
            "AnyNotIn",
            "AllNotIn",
            "In",
            "NotIn",
            "LessThan",
            "GreaterThan",
            "DurationLessThan",
        ] {
            for v in [json!(1), json!(""), json!(["a"]), json!(["*"]), Value::Null, json!("1h")] {
                assert!(!t(Value::Null, op, v.clone()), "null {op} {v}");
            }
        }
        // A null value is another matter: the key's handler decides.
        assert!(t(json!("a"), "NotEquals", Value::Null));
    }

    /// Found by the Kyverno oracle (issue 50), each vector checked against Kyverno's CLI: `0
    /// NotIn ""` was true in Verno and denied where Kyverno admits (a value that is neither a
    /// match nor a JSON list is the wrong type: false for both operators).
    #[test]
    fn deprecated_in_and_not_in_decide_as_kyverno() {
        let cases = [
            (json!(0), "NotIn", json!(""), false),
            (json!(0), "In", json!(""), false),
            (json!(["a"]), "NotIn", json!("a"), true),
            (json!(["a"]), "In", json!("a"), true),
            (json!("a"), "In", json!("[\"a\",\"b\"]"), true),
            (json!("a"), "NotIn", json!("[\"b\"]"), true),
            (json!(["a", "b"]), "In", json!(["a", 1]), false),
            (json!(["a", "b"]), "NotIn", json!(["a", 1]), false),
            (json!(true), "In", json!(["tr*"]), true),
            (json!("x"), "NotIn", json!("y"), false),
            (Value::Null, "NotIn", json!(["a"]), false),
        ];
        for (k, op, v, want) in cases {
            assert_eq!(t(k.clone(), op, v.clone()), want, "{k} {op} {v}");
        }
    }

    #[test]
    fn condition_vectors_from_the_spec() {
        assert!(t(json!(""), "Equals", json!("")));
        assert!(t(json!("nginx:1.2"), "Equals", json!("nginx:*")));
        assert!(!t(json!("nginx:*"), "Equals", json!("nginx:1.2")));
        assert!(!t(json!("5"), "Equals", json!(5)));
        assert!(t(json!(5), "Equals", json!("5")));
        assert!(t(json!("1Gi"), "Equals", json!("1024Mi")));
        assert!(t(json!("90s"), "Equals", json!("1m30s")));
        assert!(t(json!(["a", "b"]), "AnyIn", json!(["b*"])));
        assert!(!t(json!(["a", "b"]), "AllIn", json!(["a"])));
        assert!(t(json!(["a", "b"]), "AllNotIn", json!(["c"])));
        assert!(t(json!("x"), "AnyIn", json!("x")));
        assert!(t(json!(5), "AnyIn", json!("1-10")));
        assert!(t(json!("1.26.3"), "GreaterThan", json!("1.25.0")));
        assert!(t(json!("2Gi"), "GreaterThanOrEquals", json!("1Gi")));
        assert!(t(json!(5), "LessThan", json!("1h")));
        assert!(!t(json!("foo"), "GreaterThan", json!(1)));
        assert!(t(json!("CREATE"), "equals", json!("CREATE")));
        assert!(t(json!(["a"]), "NotEquals", json!("a")));
    }

    /// A string key that cannot begin a number goes straight to the wildcard comparison; keys
    /// that can are still read as durations and quantities, against either kind of value.
    #[test]
    fn string_keys_compare_as_words_durations_or_quantities() {
        assert!(t(json!("CREATE"), "NotEquals", json!("DELETE")));
        assert!(!t(json!("DELETE"), "NotEquals", json!("DELETE")));
        assert!(t(json!("CREATE"), "Equals", json!("CR?A*")));
        assert!(!t(json!("CREATE"), "Equals", json!("5m")));
        assert!(!t(json!("CREATE"), "Equals", json!(5)));
        assert!(!t(json!("m5"), "Equals", json!("5m")));
        assert!(!t(json!(" 5m"), "Equals", json!("300s")));
        assert!(t(json!("5m"), "Equals", json!("300s")));
        assert!(t(json!("-1m"), "Equals", json!("-60s")));
        assert!(t(json!("+2m"), "Equals", json!("120s")));
        assert!(t(json!(".5Gi"), "Equals", json!("512Mi")));
        assert!(t(json!("60s"), "Equals", json!(60)));
        assert!(t(json!("1Gi"), "Equals", json!("1Gi")));
        assert!(!t(json!("1Gi"), "Equals", json!("1G")));
        // A key that reads as a quantity compares as one only.
        assert!(!t(json!("10"), "Equals", json!("1*")));
    }
}
