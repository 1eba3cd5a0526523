//! JSON value helpers with JMESPath's (and Go's) notion of types, truthiness and equality.

use serde_json::{Number, Value};

/// JMESPath truthiness: false, null, "", [] and {} are false; everything else (0 too) is true.
pub fn is_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Number(_) => true,
    }
}

/// Deep equality where numbers compare by value (`1` equals `1.0`), as Go's float64 model does.
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| values_equal(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| values_equal(v, w)))
        }
        _ => a == b,
    }
}

/// Builds a JSON number from an f64, as an integer when it is whole (so `3.0` prints `3`).
pub fn num(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Value::Number(Number::from(f as i64))
    } else {
        Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)
    }
}

/// The JMESPath type name of a value.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Formats a float the way Go's `strconv.FormatFloat(f, 'f', -1, 64)` does (shortest, no exponent).
pub fn go_format_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i128)
    } else {
        let s = format!("{f}");
        s
    }
}

/// Renders a value as Go's `fmt.Sprint` would for scalars decoded from JSON.
pub fn go_sprint(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                u.to_string()
            } else {
                go_format_g(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::Bool(b) => b.to_string(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    }
}

/// Go's `%v` for float64 (the `%g` verb with shortest precision).
pub fn go_format_g(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    let exp = f.abs().log10().floor() as i32;
    if !(-4..21).contains(&exp) {
        let s = format!("{f:e}");
        // Rust prints `1e21`, Go prints `1e+21`.
        match s.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = if let Some(d) = e.strip_prefix('-') { ('-', d) } else { ('+', e) };
                let digits = if digits.len() < 2 { format!("0{digits}") } else { digits.to_string() };
                format!("{m}e{sign}{digits}")
            }
            None => s,
        }
    } else {
        format!("{f}")
    }
}

/// Serializes a value as compact JSON (Go's `json.Marshal` with sorted keys).
pub fn to_json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
