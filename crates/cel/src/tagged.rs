//! Values of the Kubernetes CEL types the `cel` crate has no type for (`net.IP`, `net.CIDR`,
//! `kubernetes.URL`, `kubernetes.Semver`), and what their functions share.
//!
//! As a quantity is (see `quantity`), such a value is a map with one entry: a tag key (`@ip`,
//! `@cidr`, `@url`, `@semver`) and the value's canonical text. Two values Kubernetes calls
//! equal have the same text, so `==` on the maps is Kubernetes' equality, and no new CEL type
//! is needed. The functions read the text back with the same parser that made it.

use cel::common::value::{CowVal, Val};
use cel::objects::{Key, Map};
use cel::{ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
pub(crate) type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

pub(crate) fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

pub(crate) fn ret<'b, 'v>(v: Value) -> Ret<'b, 'v> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

pub(crate) fn str_value(s: impl Into<String>) -> Value {
    Value::String(Arc::new(s.into()))
}

/// The value of the type `tag` whose canonical text is `text`.
pub(crate) fn tagged(tag: &str, text: String) -> Value {
    let mut m = HashMap::new();
    m.insert(Key::String(Arc::new(tag.to_string())), str_value(text));
    Value::Map(Map { map: Arc::new(m) })
}

/// The canonical text of `v` when it is a value of the type `tag`.
pub(crate) fn untag<'a>(v: &'a Value, tag: &str) -> Option<&'a str> {
    match v {
        Value::Map(m) if m.map.len() == 1 => match m.map.get(&Key::String(Arc::new(tag.to_string()))) {
            Some(Value::String(s)) => Some(s.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// The string argument at `i`.
pub(crate) fn string_at<'a>(args: &'a [Value], i: usize, f: &str) -> Result<&'a str, ExecutionError> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(other) => Err(ExecutionError::function_error(f, format!("expected a string, got {}", kind(other)))),
        None => Err(ExecutionError::function_error(f, "missing argument")),
    }
}

/// The name of a value's type, for messages (a tagged value by its Kubernetes type).
pub(crate) fn kind(v: &Value) -> &'static str {
    let tags = [("@ip", "net.IP"), ("@cidr", "net.CIDR"), ("@url", "kubernetes.URL"), ("@semver", "kubernetes.Semver")];
    if let Some((_, name)) = tags.iter().find(|(tag, _)| untag(v, tag).is_some()) {
        return name;
    }
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Duration(_) => "duration",
        Value::Timestamp(_) => "timestamp",
        Value::Null => "null_type",
        _ => "object",
    }
}

/// The error of calling `f` on arguments no overload takes (cel-go: `no such overload`).
pub(crate) fn no_overload(f: &str, args: &[Value]) -> ExecutionError {
    let types: Vec<&str> = args.iter().map(kind).collect();
    ExecutionError::function_error(f, format!("no such overload: {f}({})", types.join(", ")))
}

/// `s` quoted as Go's `strconv.Quote` quotes it (Kubernetes' messages quote inputs with `%q`):
/// printable characters as they are, the rest escaped, bytes that are not UTF-8 as `\xNN`.
pub(crate) fn go_quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for chunk in s.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                c if printable(c) => out.push(c),
                c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint`, closely enough for messages: no controls, no spaces but ASCII's,
/// no invisible formatting characters.
fn printable(c: char) -> bool {
    c == ' '
        || !(c.is_control()
            || c.is_whitespace()
            || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_as_go_does() {
        assert_eq!(go_quote(b"a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote(b"tab\there\n"), r#""tab\there\n""#);
        assert_eq!(go_quote("ü €".as_bytes()), "\"ü €\"");
        assert_eq!(go_quote(b"%\xff"), r#""%\xff""#);
        assert_eq!(go_quote("\u{1}\u{a0}".as_bytes()), r#""\x01\u00a0""#);
    }
}
