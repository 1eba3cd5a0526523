//! Kyverno's string and matching functions.

use super::{ArgType, Call, Function, N, O, S, num_arg, str_arg, val};
use crate::error::RuntimeError;
use crate::value::num;
use crate::wildcard;
use serde_json::Value;

const STR_OR_NUM: &[ArgType] = &[ArgType::String, ArgType::Number];

macro_rules! f {
    ($name:literal, [$($p:expr),*], $ret:literal, $note:literal, $imp:expr) => {
        Function { name: $name, params: &[$($p),*], variadic: false, returns: $ret, custom: true, note: $note, imp: $imp }
    };
}

pub(crate) static FUNCTIONS: &[Function] = &[
    f!("compare", [S, S], "number", "compares two strings lexicographically", |c, a| {
        Ok(num(match str_arg(c, a, 0)?.cmp(str_arg(c, a, 1)?) {
            std::cmp::Ordering::Less => -1.0,
            std::cmp::Ordering::Equal => 0.0,
            std::cmp::Ordering::Greater => 1.0,
        }))
    }),
    f!(
        "equal_fold",
        [S, S],
        "bool",
        "allows comparing two strings for equivalency where the only differences are letter cases",
        |c, a| { Ok(Value::Bool(str_arg(c, a, 0)?.to_lowercase() == str_arg(c, a, 1)?.to_lowercase())) }
    ),
    f!(
        "replace",
        [S, S, S, N],
        "string",
        "replaces a specified number of instances of the source string with the replacement string in a parent",
        replace
    ),
    f!(
        "replace_all",
        [S, S, S],
        "string",
        "replace all instances of one string with another in an overall parent string",
        |c, a| { Ok(Value::String(str_arg(c, a, 0)?.replace(str_arg(c, a, 1)?, str_arg(c, a, 2)?))) }
    ),
    f!("to_upper", [S], "string", "transforms the input string to uppercase", |c, a| Ok(Value::String(
        str_arg(c, a, 0)?.to_uppercase()
    ))),
    f!("to_lower", [S], "string", "transforms the input string to lowercase", |c, a| Ok(Value::String(
        str_arg(c, a, 0)?.to_lowercase()
    ))),
    f!(
        "trim",
        [S, S],
        "string",
        "trims both ends of the source string by characters appearing in the second string",
        |c, a| {
            let cut: Vec<char> = str_arg(c, a, 1)?.chars().collect();
            Ok(Value::String(str_arg(c, a, 0)?.trim_matches(|ch| cut.contains(&ch)).to_string()))
        }
    ),
    f!("trim_prefix", [S, S], "string", "trims the prefix from the source string", |c, a| {
        let s = str_arg(c, a, 0)?;
        Ok(Value::String(s.strip_prefix(str_arg(c, a, 1)?).unwrap_or(s).to_string()))
    }),
    f!(
        "split",
        [S, S],
        "array",
        "splits the first string when the second string is found and converts it into an array",
        split
    ),
    f!(
        "truncate",
        [S, N],
        "string",
        "length argument must be enclosed in backticks; ex. \"{{request.object.metadata.name | truncate(@, `9`)}}\"",
        |c, a| {
            let s = str_arg(c, a, 0)?;
            let n = num_arg(c, a, 1)?.max(0.0) as usize;
            Ok(Value::String(s.chars().take(n).collect()))
        }
    ),
    f!(
        "regex_match",
        [S, STR_OR_NUM],
        "bool",
        "first string is the regular expression which is compared with second input which can be a number or string",
        |c, a| {
            let re = compile(c, str_arg(c, a, 0)?)?;
            Ok(Value::Bool(re.is_match(&stringify_num(val(a, 1)))))
        }
    ),
    f!("regex_replace_all", [S, STR_OR_NUM, STR_OR_NUM], "string", "converts all parameters to string", |c, a| {
        let re = compile(c, str_arg(c, a, 0)?)?;
        let src = stringify_num(val(a, 1));
        let rep = stringify_num(val(a, 2));
        // Go's `$1W` names group `1W`, and Rust's expansion agrees, so the template passes through.
        Ok(Value::String(re.replace_all(&src, rep.as_str()).into_owned()))
    }),
    f!(
        "regex_replace_all_literal",
        [S, STR_OR_NUM, STR_OR_NUM],
        "string",
        "converts all parameters to string",
        |c, a| {
            let re = compile(c, str_arg(c, a, 0)?)?;
            let src = stringify_num(val(a, 1));
            let rep = stringify_num(val(a, 2));
            Ok(Value::String(re.replace_all(&src, regex::NoExpand(&rep)).into_owned()))
        }
    ),
    f!(
        "pattern_match",
        [S, STR_OR_NUM],
        "bool",
        "'*' matches zero or more alphanumeric characters, '?' matches a single alphanumeric character",
        |c, a| { Ok(Value::Bool(wildcard::matches(str_arg(c, a, 0)?, &stringify_num(val(a, 1))))) }
    ),
    f!(
        "label_match",
        [O, O],
        "bool",
        "object arguments must be enclosed in backticks; ex. `{{ label_match(`{\"app\": \"nginx\"}`, request.object.metadata.labels) }}`",
        |_, a| {
            let sel = val(a, 0).as_object();
            let labels = val(a, 1).as_object();
            Ok(Value::Bool(match (sel, labels) {
                (Some(s), Some(l)) => s.iter().all(|(k, v)| l.get(k).is_some_and(|w| w == v)),
                _ => false,
            }))
        }
    ),
    f!(
        "to_boolean",
        [S],
        "bool",
        "It returns true or false for any string, such as 'True', 'TruE', 'False', 'FAlse', 'faLSE', etc.",
        |c, a| {
            let s = str_arg(c, a, 0)?;
            match s.to_lowercase().as_str() {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(RuntimeError::func(
                    c.name,
                    format!("lowercase argument must be 'true' or 'false' (provided: '{s}')"),
                )),
            }
        }
    ),
];

fn replace(c: &Call<'_>, a: &[crate::functions::Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let s = str_arg(c, a, 0)?;
    let old = str_arg(c, a, 1)?;
    let new = str_arg(c, a, 2)?;
    let n = num_arg(c, a, 3)?;
    if n < 0.0 {
        return Ok(Value::String(s.replace(old, new)));
    }
    Ok(Value::String(s.replacen(old, new, n as usize)))
}

fn split(c: &Call<'_>, a: &[crate::functions::Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let s = str_arg(c, a, 0)?;
    let sep = str_arg(c, a, 1)?;
    let parts: Vec<Value> = if sep.is_empty() {
        s.chars().map(|ch| Value::String(ch.to_string())).collect()
    } else {
        s.split(sep).map(|p| Value::String(p.to_string())).collect()
    };
    Ok(Value::Array(parts))
}

fn compile(c: &Call<'_>, re: &str) -> Result<regex::Regex, RuntimeError> {
    regex::Regex::new(&go_braces(re))
        .map_err(|e| RuntimeError::func(c.name, format!("invalid regular expression {re:?}: {e}")))
}

/// Go's regular expressions read a `{` that does not start a repetition (`{n}`, `{n,}`,
/// `{n,m}`) as a literal brace; Rust's refuse it. Such a brace is escaped (outside character
/// classes, where both read it literally).
fn go_braces(re: &str) -> std::borrow::Cow<'_, str> {
    if !re.contains('{') {
        return std::borrow::Cow::Borrowed(re);
    }
    let is_repeat = |rest: &str| {
        let Some(body) = rest.strip_prefix('{').and_then(|r| r.split_once('}')).map(|x| x.0) else { return false };
        let (lo, hi) = body.split_once(',').map_or((body, None), |(l, h)| (l, Some(h)));
        !lo.is_empty()
            && lo.bytes().all(|b| b.is_ascii_digit())
            && hi.is_none_or(|h| h.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut out = String::with_capacity(re.len() + 4);
    let mut in_class = false;
    let mut chars = re.char_indices().peekable();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '\\' => {
                out.push(ch);
                if let Some((_, next)) = chars.next() {
                    out.push(next);
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push(ch);
                // A `]` right after `[` or `[^` is a member of the class.
                if let Some(&(_, '^')) = chars.peek() {
                    out.push('^');
                    chars.next();
                }
                if let Some(&(_, ']')) = chars.peek() {
                    out.push(']');
                    chars.next();
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(ch);
            }
            '{' if !in_class && !is_repeat(re.get(i..).unwrap_or("")) => out.push_str("\\{"),
            _ => out.push(ch),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Numbers become strings the way Kyverno's regex functions print them (`FormatFloat(f, 'f', -1, 32)`).
pub(crate) fn stringify_num(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        // Every JSON number is a float64 to Kyverno, integers too: `123456789` prints as
        // `123456790`. (Rust's `f32` display is the shortest that reads back, without exponent.)
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0) as f32;
            format!("{f}")
        }
        other => other.to_string(),
    }
}
