//! The JMESPath 2015 builtin functions (Kyverno replaces `sum`; see `arithmetic`).

use super::{A, ANY, Arg, ArgType, Call, E, Function, N, O, S, num_arg, str_arg, val};
use crate::error::RuntimeError;
use crate::interpreter::eval_expref;
use crate::value::{num, to_json, type_name, values_equal};
use serde_json::{Map, Value};
use std::cmp::Ordering;

const STR_OR_ARR: &[ArgType] = &[ArgType::String, ArgType::Array, ArgType::Object];
const ARR_NUM_OR_STR: &[ArgType] = &[ArgType::ArrayNumber, ArgType::ArrayString];

macro_rules! f {
    ($name:literal, [$($p:expr),*], $var:expr, $ret:literal, $note:literal, $imp:expr) => {
        Function { name: $name, params: &[$($p),*], variadic: $var, returns: $ret, custom: false, note: $note, imp: $imp }
    };
}

pub(crate) static FUNCTIONS: &[Function] = &[
    f!("abs", [N], false, "number", "absolute value", |c, a| Ok(num(num_arg(c, a, 0)?.abs()))),
    f!("avg", [&[ArgType::ArrayNumber]], false, "number", "average of an array of numbers", avg),
    f!("ceil", [N], false, "number", "round up", |c, a| Ok(num(num_arg(c, a, 0)?.ceil()))),
    f!("contains", [&[ArgType::Array, ArgType::String], ANY], false, "boolean", "array or string contains", contains),
    f!("ends_with", [S, S], false, "boolean", "string suffix test", |c, a| Ok(Value::Bool(
        str_arg(c, a, 0)?.ends_with(str_arg(c, a, 1)?)
    ))),
    f!("floor", [N], false, "number", "round down", |c, a| Ok(num(num_arg(c, a, 0)?.floor()))),
    f!("join", [S, &[ArgType::ArrayString]], false, "string", "join strings", join),
    f!("keys", [O], false, "array", "object keys", |_, a| Ok(Value::Array(
        val(a, 0).as_object().map(|o| o.keys().map(|k| Value::String(k.clone())).collect()).unwrap_or_default()
    ))),
    f!("length", [STR_OR_ARR], false, "number", "length of string, array or object", length),
    f!("map", [E, A], false, "array", "apply an expression to each element", map),
    f!("max", [ARR_NUM_OR_STR], false, "number|string", "largest element", |c, a| minmax(c, a, Ordering::Greater)),
    f!("max_by", [A, E], false, "any", "element with the largest key", |c, a| minmax_by(c, a, Ordering::Greater)),
    f!("merge", [O], true, "object", "merge objects, later keys win", merge),
    f!("min", [ARR_NUM_OR_STR], false, "number|string", "smallest element", |c, a| minmax(c, a, Ordering::Less)),
    f!("min_by", [A, E], false, "any", "element with the smallest key", |c, a| minmax_by(c, a, Ordering::Less)),
    f!("not_null", [ANY], true, "any", "first non-null argument", |_, a| Ok(a
        .iter()
        .map(Arg::value)
        .find(|v| !v.is_null())
        .cloned()
        .unwrap_or(Value::Null))),
    f!("reverse", [&[ArgType::Array, ArgType::String]], false, "array|string", "reverse", reverse),
    f!("sort", [ARR_NUM_OR_STR], false, "array", "sort numbers or strings", sort),
    f!("sort_by", [A, E], false, "array", "sort by key expression", sort_by),
    f!("starts_with", [S, S], false, "boolean", "string prefix test", |c, a| Ok(Value::Bool(
        str_arg(c, a, 0)?.starts_with(str_arg(c, a, 1)?)
    ))),
    f!("to_array", [ANY], false, "array", "wrap non-arrays in an array", |_, a| Ok(match val(a, 0) {
        Value::Array(x) => Value::Array(x.clone()),
        v => Value::Array(vec![v.clone()]),
    })),
    f!("to_number", [ANY], false, "number", "convert to number", to_number),
    f!("to_string", [ANY], false, "string", "convert to string (JSON for non-strings)", |_, a| Ok(match val(a, 0) {
        Value::String(s) => Value::String(s.clone()),
        v => Value::String(to_json(v)),
    })),
    f!("type", [ANY], false, "string", "type name", |_, a| Ok(Value::String(type_name(val(a, 0)).into()))),
    f!("values", [O], false, "array", "object values", |_, a| Ok(Value::Array(
        val(a, 0).as_object().map(|o| o.values().cloned().collect()).unwrap_or_default()
    ))),
];

fn avg(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let arr = val(a, 0).as_array().cloned().unwrap_or_default();
    if arr.is_empty() {
        return Ok(Value::Null);
    }
    let s: f64 = arr.iter().filter_map(Value::as_f64).sum();
    Ok(num(s / arr.len() as f64))
}

fn contains(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let needle = val(a, 1);
    Ok(Value::Bool(match val(a, 0) {
        Value::Array(arr) => arr.iter().any(|x| values_equal(x, needle)),
        Value::String(s) => needle.as_str().is_some_and(|n| s.contains(n)),
        _ => false,
    }))
}

fn join(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let sep = str_arg(c, a, 0)?;
    let parts: Vec<&str> =
        val(a, 1).as_array().map(|x| x.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    Ok(Value::String(parts.join(sep)))
}

fn length(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    Ok(num(match val(a, 0) {
        Value::String(s) => s.chars().count() as f64,
        Value::Array(x) => x.len() as f64,
        Value::Object(o) => o.len() as f64,
        _ => 0.0,
    }))
}

fn map(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let Some(Arg::Expref(e)) = a.first() else { return Err(RuntimeError::arg(c.name, 1, "expref")) };
    let mut out = Vec::new();
    for el in val(a, 1).as_array().map(|x| x.as_slice()).unwrap_or_default() {
        out.push(eval_expref(e, el, c.meter).unwrap_or(Value::Null));
    }
    Ok(Value::Array(out))
}

fn cmp_values(x: &Value, y: &Value) -> Option<Ordering> {
    match (x, y) {
        (Value::Number(p), Value::Number(q)) => p.as_f64()?.partial_cmp(&q.as_f64()?),
        (Value::String(p), Value::String(q)) => Some(p.cmp(q)),
        _ => None,
    }
}

fn minmax(_: &Call<'_>, a: &[Arg<'_, '_>], want: Ordering) -> Result<Value, RuntimeError> {
    let arr = val(a, 0).as_array().map(|x| x.as_slice()).unwrap_or_default();
    let mut best: Option<&Value> = None;
    for el in arr {
        best = match best {
            None => Some(el),
            Some(b) if cmp_values(el, b) == Some(want) => Some(el),
            keep => keep,
        };
    }
    Ok(best.cloned().unwrap_or(Value::Null))
}

fn minmax_by(c: &Call<'_>, a: &[Arg<'_, '_>], want: Ordering) -> Result<Value, RuntimeError> {
    let Some(Arg::Expref(e)) = a.get(1) else { return Err(RuntimeError::arg(c.name, 2, "expref")) };
    let arr = val(a, 0).as_array().map(|x| x.as_slice()).unwrap_or_default();
    let mut best: Option<(&Value, Value)> = None;
    for el in arr {
        let k = eval_expref(e, el, c.meter)?;
        if !(k.is_number() || k.is_string()) {
            return Err(RuntimeError::func(c.name, "expression must evaluate to a number or string"));
        }
        best = match best {
            None => Some((el, k)),
            Some((b, bk)) => {
                if cmp_values(&k, &bk) == Some(want) {
                    Some((el, k))
                } else {
                    Some((b, bk))
                }
            }
        };
    }
    Ok(best.map(|(v, _)| v.clone()).unwrap_or(Value::Null))
}

fn merge(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let mut out = Map::new();
    for arg in a {
        if let Value::Object(o) = arg.value() {
            for (k, v) in o {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(Value::Object(out))
}

fn reverse(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    Ok(match val(a, 0) {
        Value::String(s) => Value::String(s.chars().rev().collect()),
        Value::Array(x) => Value::Array(x.iter().rev().cloned().collect()),
        _ => Value::Null,
    })
}

fn sort(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let mut arr = val(a, 0).as_array().cloned().unwrap_or_default();
    arr.sort_by(|x, y| cmp_values(x, y).unwrap_or(Ordering::Equal));
    Ok(Value::Array(arr))
}

fn sort_by(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let Some(Arg::Expref(e)) = a.get(1) else { return Err(RuntimeError::arg(c.name, 2, "expref")) };
    let arr = val(a, 0).as_array().map(|x| x.as_slice()).unwrap_or_default();
    let mut keyed = Vec::with_capacity(arr.len());
    for el in arr {
        let k = eval_expref(e, el, c.meter)?;
        if !(k.is_number() || k.is_string()) {
            return Err(RuntimeError::func(c.name, "expression must evaluate to a number or string"));
        }
        keyed.push((k, el.clone()));
    }
    keyed.sort_by(|x, y| cmp_values(&x.0, &y.0).unwrap_or(Ordering::Equal));
    Ok(Value::Array(keyed.into_iter().map(|x| x.1).collect()))
}

fn to_number(_: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    Ok(match val(a, 0) {
        Value::Number(n) => Value::Number(n.clone()),
        Value::String(s) => s.trim().parse::<f64>().map(num).unwrap_or(Value::Null),
        _ => Value::Null,
    })
}
