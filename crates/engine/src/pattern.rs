//! Validate `pattern` matching: Kyverno's overlay semantics with anchors, wildcards, operators,
//! durations and quantities. Paths are slash-joined and end with `/`.

use crate::anchor::{self, Anchor};
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use verno_jmespath::{duration, quantity::Quantity, wildcard};

/// Why a pattern did not match.
#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// A condition anchor did not hold: the enclosing map (or rule) does not apply.
    Conditional(String),
    /// A global anchor did not hold: the whole rule does not apply.
    Global(String),
    /// A negation anchor found its key.
    Negation(String),
    /// An ordinary mismatch.
    Fail(String),
    /// Every element of an array (or every anchor of a map) skipped: Kyverno's `PatternError`
    /// with `Skip`, whose message is its parts' messages joined by `; `. A map whose other
    /// anchors applied ignores it (a direct conditional or global mismatch it does not).
    Skipped(String),
}

impl Mismatch {
    pub fn message(&self) -> String {
        match self {
            Mismatch::Conditional(m) => format!("conditional anchor mismatch: {m}"),
            Mismatch::Global(m) => format!("global anchor mismatch: {m}"),
            Mismatch::Negation(m) => format!("negation anchor matched in resource: {m}"),
            Mismatch::Fail(m) | Mismatch::Skipped(m) => m.clone(),
        }
    }
    fn is_skip(&self) -> bool {
        matches!(self, Mismatch::Conditional(_) | Mismatch::Global(_) | Mismatch::Skipped(_))
    }
}

/// The outcome of matching a whole pattern, as `validate.MatchPattern` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct PatternError {
    pub message: String,
    /// Empty when the failure is an execution error (an anchor key missing from the resource).
    pub path: String,
    pub skip: bool,
}

#[derive(Default)]
struct AnchorMap {
    seen: BTreeMap<String, bool>,
}

impl AnchorMap {
    fn check(&mut self, pattern: &serde_json::Map<String, Value>, resource: &serde_json::Map<String, Value>) {
        for k in pattern.keys() {
            if let Some((a, key)) = anchor::parse(k)
                && matches!(a, Anchor::Condition | Anchor::Existence)
            {
                let e = self.seen.entry(k.clone()).or_insert(false);
                if !*e && resource.contains_key(key) {
                    *e = true;
                }
            }
        }
    }
    fn keys_missing(&self) -> bool {
        self.seen.values().any(|v| !v)
    }
}

type Res = Result<(), (String, Mismatch)>;

static NULL: Value = Value::Null;

/// Matches `resource` against `pattern` from the root.
pub fn match_pattern(resource: &Value, pattern: &Value) -> Result<(), PatternError> {
    let mut ac = AnchorMap::default();
    let mut path = String::with_capacity(64);
    path.push('/');
    match element(resource, pattern, &mut path, &mut ac) {
        Ok(()) => Ok(()),
        Err((path, m)) => {
            if m.is_skip() {
                return Err(PatternError { message: m.message(), path: String::new(), skip: true });
            }
            if matches!(m, Mismatch::Negation(_)) {
                return Err(PatternError { message: m.message(), path, skip: false });
            }
            if ac.keys_missing() {
                return Err(PatternError { message: m.message(), path: String::new(), skip: false });
            }
            Err(PatternError { message: m.message(), path, skip: false })
        }
    }
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Runs `f` with `seg` appended to the path buffer (`seg/`), restoring it afterwards.
/// Paths are only turned into owned strings when something fails.
fn with_seg<T>(path: &mut String, seg: &str, f: impl FnOnce(&mut String) -> T) -> T {
    let len = path.len();
    path.push_str(seg);
    path.push('/');
    let r = f(path);
    path.truncate(len);
    r
}

fn element(resource: &Value, pattern: &Value, path: &mut String, ac: &mut AnchorMap) -> Res {
    match pattern {
        Value::Object(pm) => {
            let Value::Object(rm) = resource else {
                return Err((
                    path.clone(),
                    Mismatch::Fail(format!(
                        "pattern and resource have different structures. Path: {path}. Expected {}, found {}",
                        go_type(pattern),
                        go_type(resource)
                    )),
                ));
            };
            ac.check(pm, rm);
            validate_map(rm, pm, path, ac)
        }
        Value::Array(pa) => {
            let Value::Array(ra) = resource else {
                return Err((
                    path.clone(),
                    Mismatch::Fail(format!(
                        "validation rule failed at path {path}, resource does not satisfy the expected overlay pattern"
                    )),
                ));
            };
            validate_array(ra, pa, path, ac)
        }
        _ => {
            if let Value::Array(ra) = resource {
                for r in ra {
                    if !validate_scalar(r, pattern) {
                        return Err((path.clone(), scalar_mismatch(resource, pattern, path)));
                    }
                }
                return Ok(());
            }
            if !validate_scalar(resource, pattern) {
                return Err((path.clone(), scalar_mismatch(resource, pattern, path)));
            }
            Ok(())
        }
    }
}

fn scalar_mismatch(resource: &Value, pattern: &Value, path: &str) -> Mismatch {
    Mismatch::Fail(format!(
        "resource value '{}' does not match '{}' at path {path}",
        go_value(resource),
        go_value(pattern)
    ))
}

/// `%v` of a decoded JSON value, close enough for messages.
fn go_value(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        other => verno_jmespath::value::go_sprint(other),
    }
}

fn index_seg(i: usize) -> String {
    i.to_string()
}

fn validate_array(ra: &[Value], pa: &[Value], path: &mut String, ac: &mut AnchorMap) -> Res {
    let Some(first) = pa.first() else {
        return Err((path.clone(), Mismatch::Fail("pattern Array empty".into())));
    };
    match first {
        Value::Object(_) => {
            let mut applied = 0;
            let mut skips: Vec<String> = Vec::new();
            for (i, r) in ra.iter().enumerate() {
                match with_seg(path, &index_seg(i), |p| element(r, first, p, ac)) {
                    Ok(()) => applied += 1,
                    Err((_, m)) if m.is_skip() => skips.push(m.message()),
                    Err(e) => return Err(e),
                }
            }
            if applied == 0 && !skips.is_empty() {
                return Err((path.clone(), Mismatch::Skipped(skips.join("; "))));
            }
            Ok(())
        }
        Value::Array(_) => {
            if ra.len() < pa.len() {
                return Err((
                    path.clone(),
                    Mismatch::Fail(format!(
                        "validate Array failed, array length mismatch, resource Array len is {} and pattern Array len is {}",
                        ra.len(),
                        pa.len()
                    )),
                ));
            }
            for (i, p) in pa.iter().enumerate() {
                let r = ra.get(i).unwrap_or(&NULL);
                with_seg(path, &index_seg(i), |pp| element(r, p, pp, ac))?;
            }
            Ok(())
        }
        scalar => {
            for (i, r) in ra.iter().enumerate() {
                with_seg(path, &index_seg(i), |pp| element(r, scalar, pp, ac))?;
            }
            Ok(())
        }
    }
}

/// Expands wildcard keys under `metadata.labels` / `metadata.annotations` to the resource's keys.
fn expand_metadata(
    pm: &serde_json::Map<String, Value>,
    rm: &serde_json::Map<String, Value>,
) -> Option<serde_json::Map<String, Value>> {
    let (meta_key, pmeta) = pm.iter().find(|(k, _)| strip_anchor(k) == "metadata")?;
    let pmeta = pmeta.as_object()?;
    let rmeta = rm.get("metadata")?.as_object()?;
    let mut changed = false;
    let mut new_meta = pmeta.clone();
    for tag in ["labels", "annotations"] {
        let Some((tkey, pdata)) = pmeta.iter().find(|(k, _)| strip_anchor(k) == tag) else { continue };
        let Some(pdata) = pdata.as_object() else { continue };
        if !pdata.keys().any(|k| wildcard::has_wildcard(k)) {
            continue;
        }
        let Some(rdata) = rmeta.get(tag).and_then(Value::as_object) else { continue };
        let mut out = serde_json::Map::new();
        for (k, v) in pdata {
            if wildcard::has_wildcard(k) {
                let (prefix, bare) = split_anchor(k);
                match rdata.keys().find(|rk| wildcard::matches(bare, rk)) {
                    // The anchor stays around the expanded key: `=(a/*)` -> `=(a/b)`.
                    Some(rk) if prefix.is_empty() => {
                        out.insert(rk.clone(), v.clone());
                    }
                    Some(rk) => {
                        out.insert(format!("{prefix}{rk})"), v.clone());
                    }
                    None => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            } else {
                out.insert(k.clone(), v.clone());
            }
        }
        new_meta.insert(tkey.clone(), Value::Object(out));
        changed = true;
    }
    if !changed {
        return None;
    }
    let mut np = pm.clone();
    np.insert(meta_key.clone(), Value::Object(new_meta));
    Some(np)
}

/// The key without its anchor decoration.
pub fn strip_anchor(k: &str) -> &str {
    anchor::parse(k).map(|(_, key)| key).unwrap_or(k)
}

/// The anchor text before the key (`=(`), and the bare key.
fn split_anchor(k: &str) -> (String, &str) {
    match anchor::parse(k) {
        Some((_, key)) => {
            let prefix_len = k.trim().find('(').map(|i| i + 1).unwrap_or(0);
            (k.trim().get(..prefix_len).unwrap_or("").to_string(), key)
        }
        None => (String::new(), k),
    }
}

fn has_nested_anchors(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, x)| anchor::parse(k).is_some() || has_nested_anchors(x)),
        Value::Array(a) => a.iter().any(has_nested_anchors),
        _ => false,
    }
}

fn validate_map(
    rm: &serde_json::Map<String, Value>,
    pm_in: &serde_json::Map<String, Value>,
    path: &mut String,
    ac: &mut AnchorMap,
) -> Res {
    let expanded = if pm_in.contains_key("metadata") || pm_in.keys().any(|k| k.ends_with("(metadata)")) {
        expand_metadata(pm_in, rm)
    } else {
        None
    };
    let pm = expanded.as_ref().unwrap_or(pm_in);
    // Fast path: no anchors at this level and none below: keys in sorted order (serde_json's
    // maps are already sorted).
    let any_anchor_here = pm.keys().any(|k| k.ends_with(')'));
    if !any_anchor_here && !pm.values().any(has_nested_anchors) {
        for (k, v) in pm {
            handle(k, v, rm, path, ac)?;
        }
        return Ok(());
    }
    // Phase 1: condition, existence, equality and negation anchors, sorted by key. As Kyverno:
    // anchors that skip are gathered; the map skips when none applied, or when one of them
    // is a direct conditional (or global) mismatch, which also hides a later failure; skipped
    // arrays beside anchors that applied are ignored.
    let mut rest: Vec<(&String, &Value)> = Vec::new();
    let mut skips: Vec<Mismatch> = Vec::new();
    let mut applied = 0;
    let direct = |skips: &[Mismatch]| skips.iter().any(|m| !matches!(m, Mismatch::Skipped(_)));
    for (k, v) in pm {
        match anchor::parse(k) {
            Some((Anchor::Condition | Anchor::Existence | Anchor::Equality | Anchor::Negation, _)) => {
                match handle(k, v, rm, path, ac) {
                    Ok(()) => applied += 1,
                    Err((_, m)) if m.is_skip() => skips.push(m),
                    Err(e) if !direct(&skips) => return Err(e),
                    Err(_) => {}
                }
            }
            _ => rest.push((k, v)),
        }
    }
    if !skips.is_empty() && (applied == 0 || direct(&skips)) {
        let message = skips.iter().map(Mismatch::message).collect::<Vec<_>>().join("; ");
        return Err((path.clone(), Mismatch::Skipped(message)));
    }
    // Phase 2: global anchors and keys with nested anchors first (reverse-sorted), then the rest sorted.
    let mut front: Vec<(&String, &Value)> = Vec::new();
    let mut back: Vec<(&String, &Value)> = Vec::new();
    for (k, v) in rest {
        let global = matches!(anchor::parse(k), Some((Anchor::Global, _)));
        if global || has_nested_anchors(v) {
            front.insert(0, (k, v));
        } else {
            back.push((k, v));
        }
    }
    for (k, v) in front.into_iter().chain(back) {
        handle(k, v, rm, path, ac)?;
    }
    Ok(())
}

fn handle(k: &str, pattern: &Value, rm: &serde_json::Map<String, Value>, path: &mut String, ac: &mut AnchorMap) -> Res {
    match anchor::parse(k) {
        Some((Anchor::Condition, key)) => with_seg(path, key, |cur| match rm.get(key) {
            Some(v) => element(v, pattern, cur, ac).map_err(|(p, m)| (p, Mismatch::Conditional(m.message()))),
            None => {
                Err((cur.clone(), Mismatch::Conditional("conditional anchor key doesn't exist in the resource".into())))
            }
        }),
        Some((Anchor::Global, key)) => with_seg(path, key, |cur| match rm.get(key) {
            Some(v) => element(v, pattern, cur, ac).map_err(|(p, m)| (p, Mismatch::Global(m.message()))),
            None => Ok(()),
        }),
        Some((Anchor::Equality, key)) => with_seg(path, key, |cur| match rm.get(key) {
            Some(v) => element(v, pattern, cur, ac),
            None => Ok(()),
        }),
        Some((Anchor::Negation, key)) => with_seg(path, key, |cur| {
            if rm.contains_key(key) {
                return Err((cur.clone(), Mismatch::Negation(format!("{cur} is not allowed"))));
            }
            Ok(())
        }),
        Some((Anchor::Existence, key)) => {
            with_seg(path, key, |cur| {
                let Some(v) = rm.get(key) else { return Ok(()) };
                let Value::Array(ra) = v else {
                    return Err((
                        cur.clone(),
                        Mismatch::Fail(format!(
                            "invalid resource type {}: Existence ^ () anchor can be used only on list/array type resource",
                            go_type(v)
                        )),
                    ));
                };
                let Value::Array(pa) = pattern else {
                    return Err((
                        cur.clone(),
                        Mismatch::Fail(
                            "invalid pattern type: Pattern has to be of list to compare against resource".into(),
                        ),
                    ));
                };
                for p in pa {
                    if !p.is_object() {
                        return Err((
                        cur.clone(),
                        Mismatch::Fail("invalid pattern type: Pattern has to be of type map to compare against items in resource".into()),
                    ));
                    }
                    let found = ra
                        .iter()
                        .enumerate()
                        .any(|(i, r)| with_seg(cur, &index_seg(i), |pp| element(r, p, pp, ac)).is_ok());
                    if !found {
                        return Err((
                            cur.clone(),
                            Mismatch::Fail(format!("existence anchor validation failed at path {cur}")),
                        ));
                    }
                }
                Ok(())
            })
        }
        Some((Anchor::AddIfNotPresent, _)) | None => {
            let rv = rm.get(k).unwrap_or(&NULL);
            if pattern.as_str() == Some("*") {
                if rv.is_null() {
                    return Err((path.clone(), Mismatch::Fail(format!("{path}/{k} not found"))));
                }
                return Ok(());
            }
            with_seg(path, k, |cur| element(rv, pattern, cur, ac))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalars

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Equal,
    NotEqual,
    More,
    Less,
    MoreEqual,
    LessEqual,
}

/// A number against a string, as Kyverno compares them: an integer only equals a base-10
/// integer string, a float a float string.
pub fn number_equals_string(n: &serde_json::Number, s: &str) -> bool {
    let Some(f) = n.as_f64() else { return false };
    if n.is_i64() || n.is_u64() {
        s.parse::<i64>().ok().map(|x| x as f64) == Some(f)
    } else {
        s.parse::<f64>().ok() == Some(f)
    }
}

/// `pattern.Validate`: one resource value against one scalar (or map) pattern.
pub fn validate_scalar(value: &Value, pattern: &Value) -> bool {
    match pattern {
        Value::Bool(b) => value.as_bool() == Some(*b),
        Value::Number(n) => {
            let Some(p) = n.as_f64() else { return false };
            match value {
                Value::Number(v) => v.as_f64() == Some(p),
                Value::String(s) => number_equals_string(n, s),
                _ => false,
            }
        }
        Value::Null => match value {
            Value::Null => true,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Bool(b) => !*b,
            _ => false,
        },
        Value::Object(_) => value.is_object(),
        Value::String(p) => validate_string_patterns(value, p),
        Value::Array(_) => false,
    }
}

fn validate_string_patterns(value: &Value, pattern: &str) -> bool {
    if value.as_str() == Some(pattern) {
        return true;
    }
    if !pattern.contains(['|', '&']) {
        return validate_string_pattern(value, pattern.trim_matches(' '));
    }
    pattern
        .split('|')
        .any(|cond| cond.trim_matches(' ').split('&').all(|c| validate_string_pattern(value, c.trim_matches(' '))))
}

const NUM: &str = r"[-|\+]?\d+(?:\.\d+)?[A-Za-z]*";
static IN_RANGE: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(&format!("^({NUM})-({NUM})$")).ok());
static NOT_IN_RANGE: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(&format!("^({NUM})!-({NUM})$")).ok());

/// A range pattern (`1-10`, `1Gi!-4Gi`): (negated, low, high).
pub fn parse_range(p: &str) -> Option<(bool, String, String)> {
    // Both forms start with a number (optionally signed) and have a `-` after it: most patterns
    // are turned away here, without the regexes.
    let first = p.as_bytes().first()?;
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'|')) || !p.get(1..)?.contains('-') {
        return None;
    }
    if let Some(c) = NOT_IN_RANGE.as_ref().and_then(|r| r.captures(p)) {
        return Some((true, c.get(1)?.as_str().to_string(), c.get(2)?.as_str().to_string()));
    }
    if let Some(c) = IN_RANGE.as_ref().and_then(|r| r.captures(p)) {
        return Some((false, c.get(1)?.as_str().to_string(), c.get(2)?.as_str().to_string()));
    }
    None
}

/// One condition of a string pattern: an optional operator, a range, or a plain value.
pub fn validate_string_pattern(value: &Value, pattern: &str) -> bool {
    let op = if pattern.len() < 2 {
        Op::Equal
    } else if pattern.starts_with(">=") {
        Op::MoreEqual
    } else if pattern.starts_with("<=") {
        Op::LessEqual
    } else if pattern.starts_with('>') {
        Op::More
    } else if pattern.starts_with('<') {
        Op::Less
    } else if pattern.starts_with('!') {
        Op::NotEqual
    } else {
        if let Some((neg, lo, hi)) = parse_range(pattern) {
            return if neg {
                validate_string_pattern(value, &format!("< {lo}")) || validate_string_pattern(value, &format!("> {hi}"))
            } else {
                validate_string_pattern(value, &format!(">= {lo}"))
                    && validate_string_pattern(value, &format!("<= {hi}"))
            };
        }
        Op::Equal
    };
    let skip = match op {
        Op::MoreEqual | Op::LessEqual => 2,
        Op::More | Op::Less | Op::NotEqual => 1,
        Op::Equal => 0,
    };
    let p = pattern.get(skip..).unwrap_or("").trim();
    compare_duration(value, p, op) || compare_quantity(value, p, op) || compare_string(value, p, op)
}

fn number_to_string(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("0".into()),
        Value::Number(n) => Some(match n.as_i64() {
            Some(i) => i.to_string(),
            None => format!("{:.6}", n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn apply(o: Ordering, op: Op) -> bool {
    match op {
        Op::Equal => o == Ordering::Equal,
        Op::NotEqual => o != Ordering::Equal,
        Op::More => o == Ordering::Greater,
        Op::Less => o == Ordering::Less,
        Op::MoreEqual => o != Ordering::Less,
        Op::LessEqual => o != Ordering::Greater,
    }
}

fn compare_duration(value: &Value, pattern: &str, op: Op) -> bool {
    let Some(p) = duration::parse(pattern) else { return false };
    let Some(vs) = number_to_string(value) else { return false };
    let Some(v) = duration::parse(&vs) else { return false };
    apply(v.cmp(&p), op)
}

fn compare_quantity(value: &Value, pattern: &str, op: Op) -> bool {
    let Some(p) = Quantity::parse(pattern) else { return false };
    let Some(vs) = number_to_string(value) else { return false };
    let Some(v) = Quantity::parse(&vs) else { return false };
    apply(v.cmp(&p), op)
}

fn compare_string(value: &Value, pattern: &str, op: Op) -> bool {
    if !matches!(op, Op::Equal | Op::NotEqual) {
        return false;
    }
    let s: std::borrow::Cow<str> = match value {
        Value::String(s) => s.as_str().into(),
        Value::Bool(b) => if *b { "true" } else { "false" }.into(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string().into(),
            None => go_format_e(n.as_f64().unwrap_or(0.0)).into(),
        },
        _ => return false,
    };
    let m = wildcard::matches(pattern, &s);
    if op == Op::NotEqual { !m } else { m }
}

/// Go's `strconv.FormatFloat(f, 'E', -1, 64)`: `1.5E+00`.
fn go_format_e(f: f64) -> String {
    let s = format!("{f:E}");
    match s.split_once('E') {
        Some((m, e)) => {
            let (sign, d) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}E{sign}{d:0>2}")
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(p: Value, r: Value) -> bool {
        validate_scalar(&r, &p)
    }

    #[test]
    fn scalar_vectors_from_the_spec() {
        assert!(ok(json!("*"), json!(0)));
        assert!(!ok(json!("?*"), json!("")));
        assert!(!ok(json!("?*"), Value::Null));
        assert!(ok(json!("?*"), json!(5)));
        assert!(ok(Value::Null, json!("")));
        assert!(ok(Value::Null, json!(false)));
        assert!(!ok(json!(true), json!("true")));
        assert!(ok(json!(80), json!("80")));
        assert!(ok(json!(">1"), json!(2)));
        assert!(!ok(json!("<=512Mi"), json!("1Gi")));
        assert!(ok(json!("10Mi"), json!("10485760")));
        assert!(ok(json!("1h"), json!("60m")));
        assert!(ok(json!("1.5"), json!(1.5)));
        assert!(ok(json!("<10"), Value::Null));
        assert!(ok(json!("1-10"), json!(5)));
        assert!(!ok(json!("1-10"), json!("11")));
        assert!(ok(json!("1!-10"), json!(0)));
        assert!(ok(json!("!1-10"), json!(5)));
        assert!(!ok(json!("!default"), json!("default")));
        assert!(ok(json!("a* | b*"), json!("bob")));
        assert!(ok(json!(">1 & <5"), json!(3)));
        assert_eq!(go_format_e(1.5), "1.5E+00");
    }

    #[test]
    fn map_patterns_report_kyverno_paths() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "nginx:latest"}]}});
        let p = json!({"spec": {"containers": [{"image": "!*:latest"}]}});
        let e = match_pattern(&pod, &p).err();
        assert_eq!(e.map(|e| e.path), Some("/spec/containers/0/image/".to_string()));
        let missing = json!({"spec": {}});
        let e = match_pattern(&missing, &p).err();
        assert_eq!(e.map(|e| e.path), Some("/spec/containers/".to_string()));
        let empty = json!({"spec": {"containers": []}});
        assert!(match_pattern(&empty, &p).is_ok());
    }

    #[test]
    fn star_requires_a_value_and_reports_the_parent() {
        let p = json!({"metadata": {"labels": {"app": "*"}}});
        let r = json!({"metadata": {"labels": {}}});
        let e = match_pattern(&r, &p).err();
        assert_eq!(e.map(|e| e.path), Some("/metadata/labels/".to_string()));
    }

    #[test]
    fn conditional_anchor_skips_elements_and_rules() {
        let p = json!({"spec": {"containers": [{"(name)": "a*", "image": "x"}]}});
        let r = json!({"spec": {"containers": [{"name": "b", "image": "y"}]}});
        assert!(match_pattern(&r, &p).err().is_some_and(|e| e.skip));
        let r2 = json!({"spec": {"containers": [{"name": "b", "image": "y"}, {"name": "a1", "image": "x"}]}});
        assert!(match_pattern(&r2, &p).is_ok());
    }

    #[test]
    fn a_skipped_array_beside_anchors_that_applied_is_ignored() {
        // Two optional lists with a conditional element pattern: one has an element the
        // condition selects (and it passes), the other has none.
        let p = json!({"spec": {
            "=(workers)": [{"(role)": "db*", "tls": true}],
            "=(sidecars)": [{"(role)": "db*", "tls": true}],
        }});
        let r = json!({"spec": {
            "workers": [{"role": "db-main", "tls": true}, {"role": "web"}],
            "sidecars": [{"role": "proxy", "tls": false}],
        }});
        assert!(match_pattern(&r, &p).is_ok());
        // Nothing selected anywhere: the rule skips, with every mismatch, in key order.
        let none = json!({"spec": {"workers": [{"role": "web"}], "sidecars": [{"role": "proxy"}]}});
        let e = match_pattern(&none, &p).unwrap_err();
        assert!(e.skip);
        assert_eq!(
            e.message,
            "conditional anchor mismatch: resource value 'proxy' does not match 'db*' at path /spec/sidecars/0/role/; \
             conditional anchor mismatch: resource value 'web' does not match 'db*' at path /spec/workers/0/role/"
        );
        // A selected element that fails still fails.
        let bad = json!({"spec": {"workers": [{"role": "db-main", "tls": false}], "sidecars": [{"role": "proxy"}]}});
        assert!(match_pattern(&bad, &p).is_err_and(|e| !e.skip));
    }

    #[test]
    fn negation_anchor_fails_at_the_key() {
        let p = json!({"spec": {"volumes": [{"X(hostPath)": "null"}]}});
        let r = json!({"spec": {"volumes": [{"hostPath": {"path": "/"}}]}});
        let e = match_pattern(&r, &p).err();
        assert_eq!(e.map(|e| (e.path, e.skip)), Some(("/spec/volumes/0/hostPath/".to_string(), false)));
    }

    #[test]
    fn equality_and_existence_anchors() {
        let p = json!({"spec": {"=(hostNetwork)": false}});
        assert!(match_pattern(&json!({"spec": {}}), &p).is_ok());
        assert!(match_pattern(&json!({"spec": {"hostNetwork": true}}), &p).is_err());
        let ex = json!({"spec": {"^(containers)": [{"image": "nginx*"}]}});
        assert!(
            match_pattern(&json!({"spec": {"containers": [{"image": "redis"}, {"image": "nginx:1"}]}}), &ex).is_ok()
        );
        assert!(match_pattern(&json!({"spec": {"containers": [{"image": "redis"}]}}), &ex).is_err());
    }

    #[test]
    fn wildcard_label_keys_expand_to_resource_keys() {
        let p = json!({"metadata": {"labels": {"app.kubernetes.io/*": "?*"}}});
        assert!(match_pattern(&json!({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}), &p).is_ok());
        assert!(match_pattern(&json!({"metadata": {"labels": {"other": "x"}}}), &p).is_err());
        // An anchored wildcard key keeps its anchor once expanded: the equality anchor checks
        // the value only where the annotation exists.
        let p = json!({"metadata": {"annotations": {"=(container.apparmor.security.beta.kubernetes.io/*)": "runtime/default"}}});
        let with =
            |v: &str| json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": v}}});
        assert!(match_pattern(&with("runtime/default"), &p).is_ok());
        let err = match_pattern(&with("unconfined"), &p).err().map(|e| e.path).unwrap_or_default();
        assert_eq!(err, "/metadata/annotations/container.apparmor.security.beta.kubernetes.io/c/");
        assert!(match_pattern(&json!({"metadata": {"annotations": {"other": "x"}}}), &p).is_ok());
    }
}
