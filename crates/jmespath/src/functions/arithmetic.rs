//! Kyverno's arithmetic: numbers, Kubernetes quantities and Go durations.
//!
//! A string operand is a quantity when it parses as one (`"10m"`, `"5"`, `"1Gi"`), otherwise a
//! duration (`"1h"`, `"30s"`); anything else is an invalid operand. Results keep the operand kind:
//! quantities print canonically, durations as Go prints them, scalars as numbers.

use super::{A, ANY, Arg, Call, Function, N, num_arg, val};
use crate::duration;
use crate::error::RuntimeError;
use crate::quantity::{Format, Quantity};
use crate::value::num;
use serde_json::Value;

macro_rules! f {
    ($name:literal, [$($p:expr),*], $ret:literal, $note:literal, $imp:expr) => {
        Function { name: $name, params: &[$($p),*], variadic: false, returns: $ret, custom: true, note: $note, imp: $imp }
    };
}

pub(crate) static FUNCTIONS: &[Function] = &[
    f!(
        "add",
        [ANY, ANY],
        "any",
        "does arithmetic addition of two specified values of numbers, quantities, and durations",
        |c, a| add(c.name, val(a, 0), val(a, 1))
    ),
    f!(
        "subtract",
        [ANY, ANY],
        "any",
        "does arithmetic subtraction of two specified values of numbers, quantities, and durations",
        subtract
    ),
    f!(
        "multiply",
        [ANY, ANY],
        "any",
        "does arithmetic multiplication of two specified values of numbers, quantities, and durations",
        multiply
    ),
    f!("divide", [ANY, ANY], "any", "divisor must be non zero", divide),
    f!("modulo", [ANY, ANY], "any", "divisor must be non-zero, arguments must be integers", modulo),
    f!(
        "sum",
        [A],
        "any",
        "does arithmetic addition of specified array of values of numbers, quantities, and durations",
        sum
    ),
    f!("round", [N, N], "number", "does roundoff to upper or lower decimal places", round),
];

#[derive(Debug, Clone, Copy)]
enum Operand {
    Scalar(f64),
    Quantity(Quantity),
    Duration(i64),
}

/// An arithmetic operand, as Kyverno reads one: a number, else a string that is a quantity,
/// else a duration; anything else is Kyverno's "invalid operand".
fn operand(name: &str, v: &Value) -> Result<Operand, RuntimeError> {
    match v {
        Value::Number(n) => Ok(Operand::Scalar(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => {
            if let Some(q) = Quantity::parse(s) {
                Ok(Operand::Quantity(q))
            } else if let Some(d) = duration::parse(s) {
                Ok(Operand::Duration(d))
            } else {
                Err(RuntimeError::func(name, "invalid operand"))
            }
        }
        _ => Err(RuntimeError::func(name, "invalid operand")),
    }
}

fn mismatch(name: &str) -> RuntimeError {
    RuntimeError::func(name, "Types mismatch")
}

fn overflow(name: &str) -> RuntimeError {
    RuntimeError::func(name, "arithmetic overflow")
}

fn qv(q: Quantity) -> Value {
    Value::String(q.canonical())
}

fn dv(d: i64) -> Value {
    Value::String(duration::format(d))
}

pub(crate) fn add(name: &str, x: &Value, y: &Value) -> Result<Value, RuntimeError> {
    match (operand(name, x)?, operand(name, y)?) {
        (Operand::Scalar(a), Operand::Scalar(b)) => Ok(num(a + b)),
        (Operand::Quantity(a), Operand::Quantity(b)) => a.add(&b).map(qv).ok_or_else(|| overflow(name)),
        (Operand::Duration(a), Operand::Duration(b)) => a.checked_add(b).map(dv).ok_or_else(|| overflow(name)),
        _ => Err(mismatch(name)),
    }
}

fn subtract(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    match (operand(c.name, val(a, 0))?, operand(c.name, val(a, 1))?) {
        (Operand::Scalar(x), Operand::Scalar(y)) => Ok(num(x - y)),
        (Operand::Quantity(x), Operand::Quantity(y)) => x.sub(&y).map(qv).ok_or_else(|| overflow(c.name)),
        (Operand::Duration(x), Operand::Duration(y)) => x.checked_sub(y).map(dv).ok_or_else(|| overflow(c.name)),
        _ => Err(mismatch(c.name)),
    }
}

fn scale_quantity(name: &str, q: &Quantity, s: f64) -> Result<Value, RuntimeError> {
    let factor = Quantity::from_f64(s, Format::DecimalSI).ok_or_else(|| overflow(name))?;
    q.mul(&factor).map(qv).ok_or_else(|| overflow(name))
}

fn multiply(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    match (operand(c.name, val(a, 0))?, operand(c.name, val(a, 1))?) {
        (Operand::Scalar(x), Operand::Scalar(y)) => Ok(num(x * y)),
        (Operand::Quantity(q), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Quantity(q)) => {
            scale_quantity(c.name, &q, s)
        }
        (Operand::Duration(d), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Duration(d)) => {
            Ok(dv((d as f64 * s) as i64))
        }
        _ => Err(mismatch(c.name)),
    }
}

fn zero(name: &str) -> RuntimeError {
    RuntimeError::func(name, "Zero divisor passed")
}

fn divide(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    match (operand(c.name, val(a, 0))?, operand(c.name, val(a, 1))?) {
        (Operand::Scalar(x), Operand::Scalar(y)) => {
            if y == 0.0 {
                return Err(zero(c.name));
            }
            Ok(num(x / y))
        }
        (Operand::Quantity(x), Operand::Quantity(y)) => {
            if y.mantissa == 0 {
                return Err(zero(c.name));
            }
            Ok(num(x.as_f64() / y.as_f64()))
        }
        (Operand::Quantity(x), Operand::Scalar(y)) => {
            if y == 0.0 {
                return Err(zero(c.name));
            }
            let r = Quantity::from_f64(x.as_f64() / y, x.format).ok_or_else(|| overflow(c.name))?;
            Ok(qv(r))
        }
        (Operand::Duration(x), Operand::Duration(y)) => {
            if y == 0 {
                return Err(zero(c.name));
            }
            Ok(num(x as f64 / y as f64))
        }
        (Operand::Duration(x), Operand::Scalar(y)) => {
            if y == 0.0 {
                return Err(zero(c.name));
            }
            Ok(dv((x as f64 / y) as i64))
        }
        _ => Err(mismatch(c.name)),
    }
}

fn modulo(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let non_int = || RuntimeError::func(c.name, "Non-integer argument(s) passed for modulo");
    match (operand(c.name, val(a, 0))?, operand(c.name, val(a, 1))?) {
        (Operand::Scalar(x), Operand::Scalar(y)) => {
            if x.fract() != 0.0 || y.fract() != 0.0 {
                return Err(non_int());
            }
            if y == 0.0 {
                return Err(zero(c.name));
            }
            // Go's `%`: MinInt64 % -1 is 0, not an overflow.
            Ok(num((x as i64).wrapping_rem(y as i64) as f64))
        }
        (Operand::Quantity(x), Operand::Quantity(y)) => {
            if y.mantissa == 0 {
                return Err(zero(c.name));
            }
            // Work in a common integer scale.
            let e = x.exp.min(y.exp).min(0);
            let xs = Quantity { exp: x.exp - e, ..x };
            let ys = Quantity { exp: y.exp - e, ..y };
            let xi = (xs.mantissa as f64 * 10f64.powi(xs.exp)) as i128;
            let yi = (ys.mantissa as f64 * 10f64.powi(ys.exp)) as i128;
            if yi == 0 {
                return Err(zero(c.name));
            }
            Ok(qv(Quantity { mantissa: xi.wrapping_rem(yi), exp: e, format: x.format }))
        }
        (Operand::Duration(x), Operand::Duration(y)) => {
            if y == 0 {
                return Err(zero(c.name));
            }
            Ok(dv(x.wrapping_rem(y)))
        }
        _ => Err(mismatch(c.name)),
    }
}

fn sum(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let arr = val(a, 0).as_array().map(|x| x.as_slice()).unwrap_or_default();
    let Some(first) = arr.first() else {
        return Err(RuntimeError::func(c.name, "at least one element in the array is required"));
    };
    let mut acc = first.clone();
    // Validate the first operand even when it is alone.
    operand(c.name, &acc)?;
    for el in arr.iter().skip(1) {
        acc = add(c.name, &acc, el)?;
    }
    if let Value::String(s) = &acc
        && let Some(q) = Quantity::parse(s)
    {
        return Ok(qv(q));
    }
    Ok(acc)
}

fn round(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let x = num_arg(c, a, 0)?;
    let d = num_arg(c, a, 1)?;
    if d.fract() != 0.0 || d < 0.0 {
        return Err(RuntimeError::func(c.name, "Non-integer argument(s) passed for round off"));
    }
    let p = 10f64.powi(d as i32);
    Ok(num((x * p).round() / p))
}
