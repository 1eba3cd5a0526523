//! Kubernetes' CEL quantity library (`k8s.io/apiserver/pkg/cel/library/quantity.go`), which
//! every Kyverno CEL kind has: `quantity(s)`, `isQuantity(s)`, and on a quantity `isInteger()`,
//! `asInteger()`, `asApproximateFloat()`, `sign()`, `add(q|int)`, `sub(q|int)`,
//! `isGreaterThan(q)`, `isLessThan(q)`, `compareTo(q)`. Resource limits are read with it
//! (`quantity(c.resources.limits.memory).isGreaterThan(quantity('1Gi'))`).
//!
//! A quantity is held as a map with one entry, its value in billionths (`@quantity`: an
//! integer as a string), so two quantities that are the same amount are equal
//! (`quantity('1') == quantity('1000m')`), as Kubernetes' `Quantity.Equal` says. Amounts finer
//! than a billionth are rounded up, as Kubernetes rounds them when it canonicalizes.
//! (Written here: the `cel` crate has no Kubernetes libraries.)

use cel::common::types::{DYN_TYPE as DYN, MAP_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::objects::{Key, Map};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

const KEY: &str = "@quantity";
const NANO: i128 = 1_000_000_000;

/// Why a string is not a quantity, in Kubernetes' words.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}")]
    Syntax(String),
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

/// A quantity string's value in billionths, as Kubernetes' `resource.ParseQuantity` reads it:
/// an optional sign, digits with an optional fraction, and a binary (`Ki`…`Ei`), decimal
/// (`n`, `u`, `m`, `k`, `M`…`E`) or exponent (`e3`, `E-2`) suffix.
pub fn parse(s: &str) -> Result<i128, QuantityError> {
    let bad = || QuantityError::Syntax(s.to_string());
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..).unwrap_or("")),
        Some(b'+') => (false, s.get(1..).unwrap_or("")),
        _ => (false, s),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad());
    }
    // (power of ten, power of two) the suffix multiplies by.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => match other.strip_prefix(['e', 'E']) {
            Some(e) if !e.is_empty() => (e.parse::<i32>().map_err(|_| bad())?, 0),
            _ => return Err(bad()),
        },
    };
    let too_large = || QuantityError::TooLarge(s.to_string());
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 36 {
        return Err(too_large());
    }
    let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| bad())? };
    // value = mantissa × 10^(exp10 − len(fraction)) × 2^exp2, in billionths: × 10^9.
    let scale = exp10 - i32::try_from(fraction.len()).map_err(|_| too_large())? + 9;
    let mut v = mantissa.checked_mul(1i128.checked_shl(exp2).ok_or_else(too_large)?).ok_or_else(too_large)?;
    if scale >= 0 {
        let p = 10i128.checked_pow(u32::try_from(scale).map_err(|_| too_large())?).ok_or_else(too_large)?;
        v = v.checked_mul(p).ok_or_else(too_large)?;
    } else {
        let p = 10i128.checked_pow(scale.unsigned_abs()).unwrap_or(i128::MAX);
        // Rounded up, away from zero for the magnitude (Kubernetes rounds up when it
        // canonicalizes to a finer scale than it keeps).
        v = v / p + i128::from(v % p != 0);
    }
    Ok(if negative { -v } else { v })
}

fn quantity_value(nanos: i128) -> Value {
    let mut m = HashMap::new();
    m.insert(Key::String(Arc::new(KEY.to_string())), Value::String(Arc::new(nanos.to_string())));
    Value::Map(Map { map: Arc::new(m) })
}

fn nanos_of(v: &Value, f: &str) -> Result<i128, ExecutionError> {
    if let Value::Map(m) = v
        && let Some(Value::String(s)) = m.map.get(&Key::String(Arc::new(KEY.to_string())))
        && let Ok(n) = s.parse::<i128>()
    {
        return Ok(n);
    }
    Err(ExecutionError::function_error(f, "expected a quantity"))
}

fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

fn ret<'b, 'v>(v: Value) -> Ret<'b, 'v> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn string_arg(args: &[Value], f: &str) -> Result<String, ExecutionError> {
    match args.first() {
        Some(Value::String(s)) => Ok(s.to_string()),
        _ => Err(ExecutionError::function_error(f, "expected a string")),
    }
}

fn quantity<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string_arg(&values(&args)?, "quantity")?;
    ret(quantity_value(parse(&s).map_err(|e| ExecutionError::function_error("quantity", e))?))
}

fn is_quantity<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string_arg(&values(&args)?, "isQuantity")?;
    ret(Value::Bool(parse(&s).is_ok()))
}

/// The receiver's value, and the argument's (a quantity, or an int for `add`/`sub`).
fn pair(args: &[CowVal<'_, '_>], f: &str, ints: bool) -> Result<(i128, i128), ExecutionError> {
    let v = values(args)?;
    let a = nanos_of(v.first().unwrap_or(&Value::Null), f)?;
    let b = match v.get(1) {
        Some(Value::Int(i)) if ints => i128::from(*i) * NANO,
        Some(other) => nanos_of(other, f)?,
        None => return Err(ExecutionError::function_error(f, "expected an argument")),
    };
    Ok((a, b))
}

fn one(args: &[CowVal<'_, '_>], f: &str) -> Result<i128, ExecutionError> {
    let v = values(args)?;
    nanos_of(v.first().unwrap_or(&Value::Null), f)
}

fn add<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (a, b) = pair(&args, "add", true)?;
    ret(quantity_value(a.checked_add(b).ok_or_else(|| ExecutionError::function_error("add", "overflow"))?))
}

fn sub<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (a, b) = pair(&args, "sub", true)?;
    ret(quantity_value(a.checked_sub(b).ok_or_else(|| ExecutionError::function_error("sub", "overflow"))?))
}

/// How the receiver compares with the argument: two quantities, or two semantic versions (the
/// semver library's methods of the same names; one overload on a map must serve both).
fn ordering(args: &[CowVal<'_, '_>], f: &str) -> Result<std::cmp::Ordering, ExecutionError> {
    if let Some(o) = crate::semver::ordering(&values(args)?, f) {
        return o;
    }
    let (a, b) = pair(args, f, false)?;
    Ok(a.cmp(&b))
}

fn is_greater_than<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Bool(ordering(&args, "isGreaterThan")?.is_gt()))
}

fn is_less_than<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Bool(ordering(&args, "isLessThan")?.is_lt()))
}

fn compare_to<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Int(ordering(&args, "compareTo")? as i64))
}

fn sign<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Int(one(&args, "sign")?.signum() as i64))
}

/// The whole value, when it is whole and fits an int.
fn integer(n: i128) -> Option<i64> {
    if n % NANO != 0 {
        return None;
    }
    i64::try_from(n / NANO).ok()
}

fn is_integer<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Bool(integer(one(&args, "isInteger")?).is_some()))
}

fn as_integer<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match integer(one(&args, "asInteger")?) {
        Some(i) => ret(Value::Int(i)),
        None => Err(ExecutionError::function_error(
            "asInteger",
            "cannot convert value to integer: the quantity is not whole or does not fit an int",
        )),
    }
}

fn as_approximate_float<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Float(one(&args, "asApproximateFloat")? as f64 / NANO as f64))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("quantity", "quantity_string", vec![STRING_TYPE], quantity)?;
    env.add_overload("isQuantity", "isQuantity_string", vec![STRING_TYPE], is_quantity)?;
    env.add_member_overload("add", "quantity_add", MAP_TYPE, vec![DYN], add)?;
    env.add_member_overload("sub", "quantity_sub", MAP_TYPE, vec![DYN], sub)?;
    env.add_member_overload("isGreaterThan", "quantity_isGreaterThan", MAP_TYPE, vec![DYN], is_greater_than)?;
    env.add_member_overload("isLessThan", "quantity_isLessThan", MAP_TYPE, vec![DYN], is_less_than)?;
    env.add_member_overload("compareTo", "quantity_compareTo", MAP_TYPE, vec![DYN], compare_to)?;
    env.add_member_overload("sign", "quantity_sign", MAP_TYPE, vec![], sign)?;
    env.add_member_overload("isInteger", "quantity_isInteger", MAP_TYPE, vec![], is_integer)?;
    env.add_member_overload("asInteger", "quantity_asInteger", MAP_TYPE, vec![], as_integer)?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_asApproximateFloat",
        MAP_TYPE,
        vec![],
        as_approximate_float,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_reads_them() {
        assert_eq!(parse("1"), Ok(NANO));
        assert_eq!(parse("1000m"), Ok(NANO));
        assert_eq!(parse("1.5"), Ok(1_500_000_000));
        assert_eq!(parse("1Ki"), Ok(1024 * NANO));
        assert_eq!(parse("1Gi"), Ok((1 << 30) * NANO));
        assert_eq!(parse("2G"), Ok(2_000_000_000 * NANO));
        assert_eq!(parse("1e3"), Ok(1000 * NANO));
        assert_eq!(parse("1E-3"), Ok(NANO / 1000));
        assert_eq!(parse("-250m"), Ok(-250_000_000));
        assert_eq!(parse(".5"), Ok(500_000_000));
        assert_eq!(parse("0.1n"), Ok(1));
        for bad in ["", "Mi", "1.2.3", "1 Gi", "1Gb", "1e", "--1", "abc"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("99999999999999999999999999999999999999Ei").is_err());
    }
}
