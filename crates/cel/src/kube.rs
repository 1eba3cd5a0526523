//! Kubernetes' CEL libraries that the `cel` crate does not have, written here: the list
//! functions of `k8s.io/apiserver/pkg/cel/library/lists.go` (`indexOf`, `lastIndexOf`, `isSorted`,
//! `sum`, `min`, `max`), `sets.*`, regex `find`/`findAll`, and `jsonpatch.escapeKey`; and
//! cel-go's regex extension (`regex.replace`, `regex.extract`, `regex.extractAll`).
//!
//! Functions take and return `Value`s: arguments are converted once per call, which is simple
//! and plenty fast for the short lists policies handle.

use cel::common::types::{INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::objects::OptionalValue;
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::cmp::Ordering;
use std::sync::Arc;

pub(crate) type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
pub(crate) type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// A call's arguments as values (converted once per call).
pub(crate) fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(&**a)).collect()
}

/// A value as a call's result.
pub(crate) fn ret<'b, 'v>(v: Value) -> Ret<'b, 'v> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn list<'a>(v: &'a Value, f: &str) -> Result<&'a [Value], ExecutionError> {
    match v {
        Value::List(l) => Ok(l.as_slice()),
        other => Err(ExecutionError::function_error(f, format!("expected a list, got {other:?}"))),
    }
}

fn string<'a>(v: &'a Value, f: &str) -> Result<&'a str, ExecutionError> {
    match v {
        Value::String(s) => Ok(s.as_str()),
        other => Err(ExecutionError::function_error(f, format!("expected a string, got {other:?}"))),
    }
}

fn two<'a>(v: &'a [Value], f: &str) -> Result<(&'a Value, &'a Value), ExecutionError> {
    match v {
        [a, b] => Ok((a, b)),
        _ => Err(ExecutionError::function_error(f, format!("expected 2 arguments, got {}", v.len()))),
    }
}

fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::UInt(x), Value::UInt(y)) => Some(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
        (Value::Int(x), Value::Float(y)) => (*x as f64).partial_cmp(y),
        (Value::Float(x), Value::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

fn index_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (l, x) = two(&v, "indexOf")?;
    let pos = list(l, "indexOf")?.iter().position(|e| e == x).map_or(-1, |p| p as i64);
    ret(Value::Int(pos))
}

fn last_index_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (l, x) = two(&v, "lastIndexOf")?;
    let pos = list(l, "lastIndexOf")?.iter().rposition(|e| e == x).map_or(-1, |p| p as i64);
    ret(Value::Int(pos))
}

fn is_sorted<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let l = list(v.first().unwrap_or(&Value::Null), "isSorted")?;
    let sorted =
        l.iter().zip(l.iter().skip(1)).all(|(a, b)| matches!(compare(a, b), Some(Ordering::Less | Ordering::Equal)));
    ret(Value::Bool(sorted))
}

fn sum<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let l = list(v.first().unwrap_or(&Value::Null), "sum")?;
    let mut acc = Value::Int(0);
    for (i, x) in l.iter().enumerate() {
        acc = match (&acc, x) {
            (Value::Int(a), Value::Int(b)) => {
                Value::Int(a.checked_add(*b).ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?)
            }
            (Value::Int(a), Value::Float(b)) if i == 0 => Value::Float(*a as f64 + b),
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            (Value::Int(a), Value::UInt(b)) if i == 0 && *a == 0 => Value::UInt(*b),
            (Value::UInt(a), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?)
            }
            _ => return Err(ExecutionError::function_error("sum", "the list must hold numbers of one type")),
        };
    }
    ret(acc)
}

fn extreme(args: &[CowVal<'_, '_>], f: &str, want: Ordering) -> Result<Value, ExecutionError> {
    let v = values(args)?;
    let l = list(v.first().unwrap_or(&Value::Null), f)?;
    let mut best: Option<&Value> = None;
    for x in l {
        best = match best {
            None => Some(x),
            Some(b) => match compare(x, b) {
                Some(o) if o == want => Some(x),
                Some(_) => Some(b),
                None => return Err(ExecutionError::function_error(f, "the list must hold comparable values")),
            },
        };
    }
    best.cloned().ok_or_else(|| ExecutionError::function_error(f, "the list is empty"))
}

fn min<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(extreme(&args, "min", Ordering::Less)?)
}

fn max<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(extreme(&args, "max", Ordering::Greater)?)
}

fn sets_contains<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (a, b) = two(&v, "sets.contains")?;
    let a = list(a, "sets.contains")?;
    ret(Value::Bool(list(b, "sets.contains")?.iter().all(|x| a.contains(x))))
}

fn sets_equivalent<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (a, b) = two(&v, "sets.equivalent")?;
    let (a, b) = (list(a, "sets.equivalent")?, list(b, "sets.equivalent")?);
    ret(Value::Bool(a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))))
}

fn sets_intersects<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (a, b) = two(&v, "sets.intersects")?;
    let a = list(a, "sets.intersects")?;
    ret(Value::Bool(list(b, "sets.intersects")?.iter().any(|x| a.contains(x))))
}

fn regex(pattern: &str, f: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern).map_err(|e| ExecutionError::function_error(f, e))
}

fn find<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (s, p) = two(&v, "find")?;
    let found =
        regex(string(p, "find")?, "find")?.find(string(s, "find")?).map(|m| m.as_str().to_string()).unwrap_or_default();
    ret(Value::String(Arc::new(found)))
}

fn find_all<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let (s, p, limit) = match v.as_slice() {
        [s, p] => (s, p, -1),
        [s, p, Value::Int(n)] => (s, p, *n),
        _ => return Err(ExecutionError::function_error("findAll", "expected (string, string[, int])")),
    };
    let re = regex(string(p, "findAll")?, "findAll")?;
    let all = re.find_iter(string(s, "findAll")?).map(|m| Value::String(Arc::new(m.as_str().to_string())));
    let out: Vec<Value> = if limit < 0 { all.collect() } else { all.take(limit as usize).collect() };
    ret(Value::List(Arc::new(out)))
}

/// cel-go's `regex.replace(s, pattern, replacement[, count])` (`ext.Regex`): the first `count`
/// matches replaced (all when `count` is negative or absent, none when it is 0, and then the
/// pattern is not even compiled). In the replacement `\N` (one digit) is group N and `\\`
/// a backslash; any other backslash, or a group the pattern does not have, is an error once a
/// match needs the replacement. `$` has no special meaning.
fn regex_replace<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "regex.replace";
    let v = values(&args)?;
    let (s, p, r, count) = match v.as_slice() {
        [s, p, r] => (s, p, r, -1),
        [s, p, r, Value::Int(n)] => (s, p, r, *n),
        _ => return Err(ExecutionError::function_error(F, "expected (string, string, string[, int])")),
    };
    let (s, p, r) = (string(s, F)?, string(p, F)?, string(r, F)?);
    if count == 0 {
        return ret(Value::String(Arc::new(s.to_string())));
    }
    let re = regex(p, F)?;
    let groups = re.captures_len().saturating_sub(1);
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (done, caps) in re.captures_iter(s).enumerate() {
        if count > 0 && done as i64 >= count {
            break;
        }
        let Some(whole) = caps.get(0) else { continue };
        out.push_str(s.get(last..whole.start()).unwrap_or(""));
        expand_replacement(&caps, r, groups, &mut out)?;
        last = whole.end();
        if out.len() > crate::MAX_RESULT_BYTES {
            return Err(ExecutionError::function_error(
                F,
                format!("the result would hold over {} bytes", crate::MAX_RESULT_BYTES),
            ));
        }
    }
    out.push_str(s.get(last..).unwrap_or(""));
    ret(Value::String(Arc::new(out)))
}

/// Appends `replacement` for one match, its `\N` replaced by the groups (an unmatched group is
/// empty), in cel-go's words when it is malformed.
fn expand_replacement(
    caps: &regex::Captures<'_>,
    replacement: &str,
    groups: usize,
    out: &mut String,
) -> Result<(), ExecutionError> {
    let mut chars = replacement.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let bad = |why: &str| {
            ExecutionError::function_error(
                "regex.replace",
                format!("invalid replacement string: '{replacement}' {why}"),
            )
        };
        match chars.next() {
            None => return Err(bad("\\ not allowed at end")),
            Some('\\') => out.push('\\'),
            Some(d) => {
                let n = d.to_digit(10).ok_or_else(|| bad("\\ must be followed by a digit or \\"))? as usize;
                if n > groups {
                    return Err(ExecutionError::function_error(
                        "regex.replace",
                        format!("replacement string references group {n} but regex has only {groups} group(s)"),
                    ));
                }
                out.push_str(caps.get(n).map_or("", |m| m.as_str()));
            }
        }
    }
    Ok(())
}

/// The pattern of `regex.extract`/`regex.extractAll`, which may have at most one group.
fn extract_pattern(p: &str, f: &str) -> Result<(regex::Regex, bool), ExecutionError> {
    let re = regex(p, f)?;
    let groups = re.captures_len().saturating_sub(1);
    if groups > 1 {
        let q = crate::tagged::go_quote(p.as_bytes());
        return Err(ExecutionError::function_error(
            f,
            format!("regular expression has more than one capturing group: {q}"),
        ));
    }
    Ok((re, groups == 1))
}

/// cel-go's `regex.extract(s, pattern)`: the first match (its group, when the pattern has one)
/// as an optional; none when nothing matches or the group is empty.
fn regex_extract<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "regex.extract";
    let v = values(&args)?;
    let (s, p) = two(&v, F)?;
    let (re, grouped) = extract_pattern(string(p, F)?, F)?;
    let found = re.captures(string(s, F)?).and_then(|c| c.get(usize::from(grouped))).map(|m| m.as_str());
    let found = found.filter(|m| !(grouped && m.is_empty()));
    let opt = match found {
        Some(m) => OptionalValue::of(Value::String(Arc::new(m.to_string()))),
        None => OptionalValue::none(),
    };
    ret(Value::Opaque(Arc::new(opt)))
}

/// cel-go's `regex.extractAll(s, pattern)`: every match (its group, when the pattern has one,
/// leaving out empty ones).
fn regex_extract_all<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "regex.extractAll";
    let v = values(&args)?;
    let (s, p) = two(&v, F)?;
    let (re, grouped) = extract_pattern(string(p, F)?, F)?;
    let found: Vec<Value> = re
        .captures_iter(string(s, F)?)
        .filter_map(|c| c.get(usize::from(grouped)))
        .filter(|m| !(grouped && m.is_empty()))
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    ret(Value::List(Arc::new(found)))
}

/// `jsonpatch.escapeKey(k)`: a key as an RFC 6901 path segment (`~` → `~0`, `/` → `~1`).
fn escape_key<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let s = string(v.first().unwrap_or(&Value::Null), "jsonpatch.escapeKey")?;
    ret(Value::String(Arc::new(s.replace('~', "~0").replace('/', "~1"))))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    use cel::common::types::DYN_TYPE as DYN;
    env.add_member_overload("indexOf", "list_indexOf", LIST_TYPE, vec![DYN], index_of)?;
    env.add_member_overload("lastIndexOf", "list_lastIndexOf", LIST_TYPE, vec![DYN], last_index_of)?;
    env.add_member_overload("isSorted", "list_isSorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload("findAll", "string_findAll", STRING_TYPE, vec![STRING_TYPE], find_all)?;
    env.add_member_overload("findAll", "string_findAll_int", STRING_TYPE, vec![STRING_TYPE, INT_TYPE], find_all)?;
    env.add_overload("sets.contains", "sets_contains", vec![LIST_TYPE, LIST_TYPE], sets_contains)?;
    env.add_overload("sets.equivalent", "sets_equivalent", vec![LIST_TYPE, LIST_TYPE], sets_equivalent)?;
    env.add_overload("sets.intersects", "sets_intersects", vec![LIST_TYPE, LIST_TYPE], sets_intersects)?;
    let strings = |n| (0..n).map(|_| STRING_TYPE).collect::<Vec<_>>();
    env.add_overload("regex.replace", "regex_replace_string_string_string", strings(3), regex_replace)?;
    let with_count = vec![STRING_TYPE, STRING_TYPE, STRING_TYPE, INT_TYPE];
    env.add_overload("regex.replace", "regex_replace_string_string_string_int", with_count, regex_replace)?;
    env.add_overload("regex.extract", "regex_extract_string_string", strings(2), regex_extract)?;
    env.add_overload("regex.extractAll", "regex_extractAll_string_string", strings(2), regex_extract_all)?;
    env.add_overload("jsonpatch.escapeKey", "jsonpatch_escapeKey", vec![STRING_TYPE], escape_key)?;
    Ok(())
}
