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
    let mut out = String::new();
    write_go_json(v, &mut out);
    out
}

fn write_go_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => out.push_str(&i.to_string()),
            (_, Some(u)) => out.push_str(&u.to_string()),
            _ => out.push_str(&go_json_float(n.as_f64().unwrap_or(0.0))),
        },
        Value::String(s) => go_json_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(x, out);
            }
            out.push(']');
        }
        // serde_json's map keeps keys in byte order, which is Go's sorted order.
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_json_string(k, out);
                out.push(':');
                write_go_json(x, out);
            }
            out.push('}');
        }
    }
}

/// A float as Go's `encoding/json` writes it: the shortest decimal, with an exponent only
/// below 1e-6 or from 1e21 on (`1e-7`, `1e+21`); `1000.0` is `1000`.
pub fn go_json_float(f: f64) -> String {
    let a = f.abs();
    if a != 0.0 && !(1e-6..1e21).contains(&a) {
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((m, e)) if e.starts_with('-') => format!("{m}e{e}"),
            Some((m, e)) => format!("{m}e+{}", if e.len() < 2 { format!("0{e}") } else { e.to_string() }),
            None => s,
        }
    } else {
        go_format_float(f)
    }
}

/// A JSON string as Go writes it: HTML-safe (`<`, `>`, `&` and the line separators escaped).
pub fn go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A map key looked up with the comparison in line. serde_json's `Map` is a `BTreeMap`:
/// a lookup compares the key with a node's keys one after another through `str`'s `Ord`,
/// a call to libc's `memcmp` each — most of the cost of matching a pattern's keys against
/// a resource's (Kubernetes keys are short and usually differ in their first bytes). The
/// order is `str`'s (bytes, then length), as `BTreeMap` requires of a borrowed form.
/// (`ref-cast` gives the `&str` → `&Key` view without unsafe code of ours.)
#[derive(ref_cast::RefCast, PartialEq, Eq)]
#[repr(transparent)]
pub struct Key(str);

impl Key {
    pub fn new(k: &str) -> &Key {
        <Key as ref_cast::RefCast>::ref_cast(k)
    }
}

impl std::borrow::Borrow<Key> for String {
    fn borrow(&self) -> &Key {
        Key::new(self)
    }
}

impl Ord for Key {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        for (x, y) in a.iter().zip(b) {
            if x != y {
                return x.cmp(y);
            }
        }
        a.len().cmp(&b.len())
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

/// `m.get(k)` with the comparison in line (see [`Key`]).
#[inline]
pub fn get<'m>(m: &'m serde_json::Map<String, Value>, k: &str) -> Option<&'m Value> {
    m.get(Key::new(k))
}

/// `a == b` compared in line, for short names (kinds, keys, groups, operations): `str`'s `==`
/// calls libc's `memcmp` whenever the lengths agree, and the call costs more than comparing
/// a few bytes here.
#[inline]
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that order differently by bytes and by length, share prefixes, are empty or not
    /// ASCII: `Key`'s order must be `str`'s exactly, or `BTreeMap` lookups miss keys.
    const KEYS: &[&str] = &[
        "",
        "a",
        "b",
        "ab",
        "abc",
        "abd",
        "ba",
        "spec",
        "spec2",
        "specs",
        "status",
        "metadata",
        "kind",
        "z",
        "Z",
        "é",
        "e\u{301}",
        "ÿ",
        "app.kubernetes.io/name",
        "app.kubernetes.io/nam",
        "\u{10000}",
        "~0",
        "a b",
    ];

    #[test]
    fn keys_order_as_str_orders_them() {
        for a in KEYS {
            for b in KEYS {
                assert_eq!(Key::new(a).cmp(Key::new(b)), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(same(a, b), a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn lookups_find_what_map_get_finds() {
        // Maps of every size up to past a B-tree node's capacity (11), so inner nodes are searched.
        for n in 0..=KEYS.len() {
            let m: serde_json::Map<String, Value> =
                KEYS.iter().take(n).enumerate().map(|(i, k)| (k.to_string(), Value::from(i))).collect();
            for k in KEYS.iter().chain(&["absent", "spe", "zz", "0"]) {
                assert_eq!(get(&m, k), m.get(*k), "{k:?} in a map of {n}");
            }
        }
    }

    #[test]
    fn go_json_writes_numbers_and_strings_as_go_does() {
        let v = serde_json::json!({"b": [1000.0, 2.5, 1e-7, 1.5e21, -3], "a": "<a&b>", "n": null});
        assert_eq!(to_json(&v), r#"{"a":"\u003ca\u0026b\u003e","b":[1000,2.5,1e-7,1.5e+21,-3],"n":null}"#);
        assert_eq!(go_json_float(0.0), "0");
        assert_eq!(go_json_float(1e-6), "0.000001");
    }
}
