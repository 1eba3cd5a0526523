//! RFC 6902 JSON Patch: applying `patchesJson6902` with Kyverno's options (negative indices,
//! removing a missing path is allowed, `add` creates missing parents), and computing the patch
//! between two documents (what the mutating webhook returns).
//! Small enough that writing it beats adapting a crate to Kyverno's option set.

use serde_json::{Map, Value};

/// Why a JSON patch could not be read or applied. The texts are those of the json-patch
/// library Kyverno uses where a rule's message shows them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    #[error("a JSON patch must be a list of operations, got {0}")]
    NotAList(&'static str),
    #[error("operation {index}: {key:?} must be a string")]
    NotAString { index: usize, key: String },
    #[error("operation {index}: missing {key:?}")]
    Missing { index: usize, key: String },
    #[error("operation {index}: path {path:?} must start with \"/\"")]
    RelativePath { index: usize, path: String },
    #[error("operation {index}: unknown op {op:?}")]
    UnknownOp { index: usize, op: String },
    #[error("invalid list index {token:?} in {path}")]
    InvalidIndex { token: String, path: String },
    #[error("index {token} out of range in {path}")]
    OutOfRange { token: String, path: String },
    #[error("cannot add {0}: it would pad lists with more than {MAX_PADDING} null elements")]
    TooMuchPadding(String),
    #[error("unable to ensure path for negative index other than -1: {index} in {path}")]
    NegativeIndex { index: i64, path: String },
    #[error("cannot create {0}")]
    CannotCreate(String),
    #[error("path {0} goes through a scalar")]
    ThroughScalar(String),
    #[error("missing parent for {0}")]
    MissingParent(String),
    #[error("cannot add {0}: the parent is a scalar")]
    ScalarParent(String),
    #[error("replace operation does not apply: doc is missing path: {0}")]
    ReplaceMissingPath(String),
    #[error("replace operation does not apply: doc is missing key: {0}")]
    ReplaceMissingKey(String),
    #[error("replace operation does not apply: {0} is inside a scalar")]
    ReplaceInScalar(String),
    #[error("move operation does not apply: doc is missing from path: {0}")]
    MoveMissingFrom(String),
    #[error("copy operation does not apply: doc is missing from path: {0}")]
    CopyMissingFrom(String),
    #[error("testing value {0} failed: test failed")]
    TestFailed(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Add { path: String, value: Value },
    Remove { path: String },
    Replace { path: String, value: Value },
    Move { from: String, path: String },
    Copy { from: String, path: String },
    Test { path: String, value: Value },
}

/// Parses a list of operations; errors name the operation's index.
pub fn parse_ops(v: &Value) -> Result<Vec<Op>, PatchError> {
    let Some(items) = v.as_array() else {
        return Err(PatchError::NotAList(verno_jmespath::value::type_name(v)));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        let s = |k: &str| -> Result<String, PatchError> {
            match it.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(PatchError::NotAString { index: i, key: k.to_string() }),
                None => Err(PatchError::Missing { index: i, key: k.to_string() }),
            }
        };
        let path = s("path")?;
        if !path.is_empty() && !path.starts_with('/') {
            return Err(PatchError::RelativePath { index: i, path });
        }
        let value =
            || it.get("value").cloned().ok_or_else(|| PatchError::Missing { index: i, key: "value".to_string() });
        let op = match s("op")?.as_str() {
            "add" => Op::Add { path, value: value()? },
            "remove" => Op::Remove { path },
            "replace" => Op::Replace { path, value: value()? },
            "move" => Op::Move { from: s("from")?, path },
            "copy" => Op::Copy { from: s("from")?, path },
            "test" => Op::Test { path, value: value()? },
            other => return Err(PatchError::UnknownOp { index: i, op: other.to_string() }),
        };
        out.push(op);
    }
    Ok(out)
}

fn tokens(path: &str) -> Vec<String> {
    if path.is_empty() {
        return Vec::new();
    }
    path.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect()
}

/// Index into a list of `len` for reading/replacing (negative counts from the end).
fn index(tok: &str, len: usize, path: &str) -> Result<usize, PatchError> {
    let i: i64 =
        tok.parse().map_err(|_| PatchError::InvalidIndex { token: tok.to_string(), path: path.to_string() })?;
    let n = len as i64;
    let j = if i < 0 { i + n } else { i };
    if j < 0 || j >= n {
        return Err(PatchError::OutOfRange { token: tok.to_string(), path: path.to_string() });
    }
    Ok(j as usize)
}

/// How many nulls the `add` operations of one [`apply`] may pad lists with, all together
/// (missing parents are made as Kyverno's json-patch `EnsurePathExistsOnAdd` makes them, lists
/// padded up to the index a path names): `/a/4294967295/b` must be an error, not an attempt to
/// allocate a hundred gigabytes. Far more than any list of an object the API server accepts
/// is padded by a real patch.
const MAX_PADDING: usize = 10_000;

/// Takes `n` nulls of padding out of what is left of the budget.
fn pad(left: &mut usize, n: usize, path: &str) -> Result<(), PatchError> {
    if n > *left {
        return Err(PatchError::TooMuchPadding(path.to_string()));
    }
    *left -= n;
    Ok(())
}

/// What `add` puts where a parent is missing (Kyverno applies patches with json-patch's
/// `EnsurePathExistsOnAdd`): a list when the next token is an index or `-` (padded with nulls
/// up to that index, out of `left`), an object otherwise.
fn new_parent(next: Option<&String>, path: &str, left: &mut usize) -> Result<Value, PatchError> {
    match next.map(String::as_str) {
        Some("-") => Ok(Value::Array(Vec::new())),
        Some(t) => match t.parse::<i64>() {
            Ok(i) if i >= -1 => {
                let n = usize::try_from(i.max(0)).unwrap_or(usize::MAX);
                pad(left, n, path)?;
                Ok(Value::Array(vec![Value::Null; n]))
            }
            Ok(i) => Err(PatchError::NegativeIndex { index: i, path: path.to_string() }),
            Err(_) => Ok(Value::Object(Map::new())),
        },
        None => Ok(Value::Object(Map::new())),
    }
}

/// The container holding the last token of `toks` (all tokens but the last are walked).
/// `left`: the padding budget (see [`MAX_PADDING`]) when `create`.
fn parent<'a>(
    doc: &'a mut Value,
    toks: &[String],
    path: &str,
    create: bool,
    left: &mut usize,
) -> Result<Option<&'a mut Value>, PatchError> {
    let mut cur = doc;
    let walk = toks.len().saturating_sub(1);
    for (n, t) in toks.iter().take(walk).enumerate() {
        let next = toks.get(n + 1);
        cur = match cur {
            Value::Object(m) => {
                if !m.contains_key(t) {
                    if !create {
                        return Ok(None);
                    }
                    m.insert(t.clone(), new_parent(next, path, left)?);
                }
                match m.get_mut(t) {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
            Value::Array(a) => {
                let i = match index(t, a.len(), path) {
                    Ok(i) => i,
                    // Past the end: pad with nulls up to the index and put the parent there.
                    Err(_) if create && t.parse::<usize>().is_ok_and(|i| i >= a.len()) => {
                        let i = t.parse::<usize>().unwrap_or_default();
                        pad(left, i.saturating_sub(a.len()), path)?;
                        a.resize(i, Value::Null);
                        a.push(new_parent(next, path, left)?);
                        i
                    }
                    Err(e) => return if create { Err(e) } else { Ok(None) },
                };
                match a.get_mut(i) {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
            Value::Null if create => {
                *cur = if next.is_some_and(|x| x == "-" || x.parse::<i64>().is_ok()) {
                    Value::Array(Vec::new())
                } else {
                    Value::Object(Map::new())
                };
                match cur {
                    Value::Object(m) => m.entry(t.clone()).or_insert(Value::Null),
                    _ => return Err(PatchError::CannotCreate(path.to_string())),
                }
            }
            _ => return Err(PatchError::ThroughScalar(path.to_string())),
        };
    }
    Ok(Some(cur))
}

fn get<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = doc;
    for t in tokens(path) {
        cur = match cur {
            Value::Object(m) => m.get(&t)?,
            Value::Array(a) => a.get(index(&t, a.len(), path).ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, path: &str, value: Value, left: &mut usize) -> Result<(), PatchError> {
    let toks = tokens(path);
    let Some(last) = toks.last() else {
        *doc = value;
        return Ok(());
    };
    let Some(p) = parent(doc, &toks, path, true, left)? else {
        return Err(PatchError::MissingParent(path.to_string()));
    };
    match p {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: i64 =
                last.parse().map_err(|_| PatchError::InvalidIndex { token: last.clone(), path: path.to_string() })?;
            let n = a.len() as i64;
            let j = if i < 0 { i + n } else { i };
            if j < 0 || j > n {
                return Err(PatchError::OutOfRange { token: last.clone(), path: path.to_string() });
            }
            a.insert(j as usize, value);
            Ok(())
        }
        Value::Null => {
            let mut m = Map::new();
            m.insert(last.clone(), value);
            *p = Value::Object(m);
            Ok(())
        }
        _ => Err(PatchError::ScalarParent(path.to_string())),
    }
}

/// Removes `path`; a missing path is not an error (Kyverno's AllowMissingPathOnRemove).
fn remove(doc: &mut Value, path: &str) -> Result<Option<Value>, PatchError> {
    let toks = tokens(path);
    let Some(last) = toks.last() else {
        return Ok(Some(std::mem::take(doc)));
    };
    let Some(p) = parent(doc, &toks, path, false, &mut 0)? else { return Ok(None) };
    match p {
        Value::Object(m) => Ok(m.remove(last)),
        Value::Array(a) => match index(last, a.len(), path) {
            Ok(i) => Ok(Some(a.remove(i))),
            Err(_) => Ok(None),
        },
        _ => Ok(None),
    }
}

fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = tokens(path);
    let Some(last) = toks.last() else {
        *doc = value;
        return Ok(());
    };
    let Some(p) = parent(doc, &toks, path, false, &mut 0)? else {
        return Err(PatchError::ReplaceMissingPath(path.to_string()));
    };
    match p {
        Value::Object(m) => {
            if !m.contains_key(last) {
                return Err(PatchError::ReplaceMissingKey(path.to_string()));
            }
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = index(last, a.len(), path)?;
            if let Some(slot) = a.get_mut(i) {
                *slot = value;
            }
            Ok(())
        }
        _ => Err(PatchError::ReplaceInScalar(path.to_string())),
    }
}

/// Applies operations in order with Kyverno's options.
pub fn apply(doc: &mut Value, ops: &[Op]) -> Result<(), PatchError> {
    let mut left = MAX_PADDING;
    for op in ops {
        match op {
            Op::Add { path, value } => add(doc, path, value.clone(), &mut left)?,
            Op::Remove { path } => {
                remove(doc, path)?;
            }
            Op::Replace { path, value } => replace(doc, path, value.clone())?,
            Op::Move { from, path } => {
                let v = remove(doc, from)?.ok_or_else(|| PatchError::MoveMissingFrom(from.clone()))?;
                add(doc, path, v, &mut left)?;
            }
            Op::Copy { from, path } => {
                let v = get(doc, from).cloned().ok_or_else(|| PatchError::CopyMissingFrom(from.clone()))?;
                add(doc, path, v, &mut left)?;
            }
            Op::Test { path, value } => {
                let ok = get(doc, path).is_some_and(|v| crate::equal(v, value));
                if !ok {
                    return Err(PatchError::TestFailed(path.clone()));
                }
            }
        }
    }
    Ok(())
}

fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// The RFC 6902 patch turning `a` into `b`, as JSON operations.
pub fn diff(a: &Value, b: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    diff_at(a, b, "", &mut out);
    out
}

fn op(kind: &str, path: &str, value: Option<&Value>) -> Value {
    let mut m = Map::new();
    m.insert("op".into(), Value::String(kind.into()));
    m.insert("path".into(), Value::String(path.into()));
    if let Some(v) = value {
        m.insert("value".into(), v.clone());
    }
    Value::Object(m)
}

fn diff_at(a: &Value, b: &Value, path: &str, out: &mut Vec<Value>) {
    if crate::equal(a, b) {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let p = format!("{path}/{}", escape(k));
                match y.get(k) {
                    Some(vb) => diff_at(va, vb, &p, out),
                    None => out.push(op("remove", &p, None)),
                }
            }
            for (k, vb) in y {
                if !x.contains_key(k) {
                    out.push(op("add", &format!("{path}/{}", escape(k)), Some(vb)));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            let common = x.len().min(y.len());
            for i in 0..common {
                if let (Some(va), Some(vb)) = (x.get(i), y.get(i)) {
                    diff_at(va, vb, &format!("{path}/{i}"), out);
                }
            }
            for (i, vb) in y.iter().enumerate().skip(common) {
                out.push(op("add", &format!("{path}/{i}"), Some(vb)));
            }
            for i in (common..x.len()).rev() {
                out.push(op("remove", &format!("{path}/{i}"), None));
            }
        }
        _ => out.push(op("replace", path, Some(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(doc: Value, ops: Value) -> Result<Value, PatchError> {
        let ops = parse_ops(&ops)?;
        let mut d = doc;
        apply(&mut d, &ops)?;
        Ok(d)
    }

    /// Found by the `patch` fuzz target (its corpus held it; the fuzz script did not report
    /// the failure): a missing parent named by a huge index made a list of that many nulls.
    /// Padding is bounded per `apply`, across its operations; within the bound it is as before.
    #[test]
    fn padding_lists_is_bounded() {
        for path in ["/a/3333333333/b", "/a/9223372036854775807", "/l/4294967295/x"] {
            let err = run(json!({"l": []}), json!([{"op": "add", "path": path, "value": 1}]));
            assert!(matches!(&err, Err(PatchError::TooMuchPadding(p)) if p == path), "{path}: {err:?}");
        }
        let out = run(json!({}), json!([{"op": "add", "path": "/a/9999/b", "value": 1}]));
        assert_eq!(out.map(|v| v.pointer("/a/9999/b").cloned()), Ok(Some(json!(1))));
        let ops =
            json!([{"op": "add", "path": "/a/6000/b", "value": 1}, {"op": "add", "path": "/c/6000/d", "value": 2}]);
        assert_eq!(run(json!({}), ops), Err(PatchError::TooMuchPadding("/c/6000/d".into())));
        let past_end = json!([{"op": "add", "path": "/l/20000/x", "value": 1}]);
        assert!(run(json!({"l": [1]}), past_end).is_err());
    }

    #[test]
    fn add_creates_missing_parents_and_appends() {
        let out =
            run(json!({}), json!([{"op": "add", "path": "/metadata/labels/a", "value": "1"}])).unwrap_or_default();
        assert_eq!(out, json!({"metadata": {"labels": {"a": "1"}}}));
        let out = run(
            json!({"l": [1, 2]}),
            json!([{"op": "add", "path": "/l/-", "value": 3}, {"op": "add", "path": "/l/0", "value": 0}]),
        )
        .unwrap_or_default();
        assert_eq!(out, json!({"l": [0, 1, 2, 3]}));
        let out = run(json!({}), json!([{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "a"}}]))
            .unwrap_or_default();
        assert_eq!(out, json!({"spec": {"tolerations": [{"key": "a"}]}}));
        // A missing list is made for an index, padded with nulls up to it, and an element
        // past the end of a list is made too (json-patch's EnsurePathExistsOnAdd).
        let out = run(
            json!({"spec": {}}),
            json!([
                {"op": "add", "path": "/spec/imagePullSecrets/0/name", "value": "regcred"},
                {"op": "add", "path": "/spec/l/2", "value": "x"},
                {"op": "add", "path": "/spec/imagePullSecrets/2/name", "value": "other"},
            ]),
        )
        .unwrap_or_default();
        assert_eq!(
            out,
            json!({"spec": {"imagePullSecrets": [{"name": "regcred"}, null, {"name": "other"}], "l": [null, null, "x"]}})
        );
        assert!(run(json!({}), json!([{"op": "add", "path": "/a/-2/b", "value": 1}])).is_err());
        // The last index still has to be inside the list.
        assert!(run(json!({"l": [1]}), json!([{"op": "add", "path": "/l/3", "value": 1}])).is_err());
    }

    #[test]
    fn negative_indices_and_missing_remove() {
        let out = run(
            json!({"l": [1, 2, 3]}),
            json!([{"op": "replace", "path": "/l/-1", "value": 9}, {"op": "remove", "path": "/nope/x"}]),
        )
        .unwrap_or_default();
        assert_eq!(out, json!({"l": [1, 2, 9]}));
    }

    #[test]
    fn move_copy_test() {
        let out = run(json!({"a": 1}), json!([{"op": "copy", "from": "/a", "path": "/b"}, {"op": "move", "from": "/a", "path": "/c"}, {"op": "test", "path": "/b", "value": 1}])).unwrap_or_default();
        assert_eq!(out, json!({"b": 1, "c": 1}));
        assert!(run(json!({"a": 1}), json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
    }

    #[test]
    fn bad_documents_say_which_operation() {
        assert_eq!(
            parse_ops(&json!([{"op": "add", "path": "x", "value": 1}]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            "operation 0: path \"x\" must start with \"/\""
        );
        assert_eq!(
            parse_ops(&json!([{"op": "jump", "path": "/x"}])).err().map(|e| e.to_string()).unwrap_or_default(),
            "operation 0: unknown op \"jump\""
        );
        assert!(run(json!({}), json!([{"op": "replace", "path": "/a", "value": 1}])).is_err());
    }

    #[test]
    fn diff_round_trips() {
        let a = json!({"metadata": {"labels": {"a": "1", "b/c": "2"}}, "spec": {"containers": [{"name": "x"}, {"name": "y"}]}});
        let b = json!({"metadata": {"labels": {"a": "2"}}, "spec": {"containers": [{"name": "z"}]}, "status": {}});
        let ops = diff(&a, &b);
        let mut d = a.clone();
        let parsed = parse_ops(&Value::Array(ops)).unwrap_or_default();
        assert!(apply(&mut d, &parsed).is_ok());
        assert_eq!(d, b);
        assert!(diff(&a, &a).is_empty());
    }
}
