//! Validate `pattern` matching: Kyverno's overlay semantics with anchors, wildcards, operators,
//! durations and quantities. Paths are slash-joined and end with `/`.

use crate::anchor::{self, Anchor};
use compact_str::CompactString;
use serde_json::Value;
use std::cmp::Ordering;
use std::sync::LazyLock;
use verno_jmespath::value::get;
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
    /// The message Kyverno gives for this mismatch.
    pub fn into_message(self) -> String {
        match self {
            Mismatch::Conditional(m) => crate::cat(&["conditional anchor mismatch: ", &m]),
            Mismatch::Global(m) => crate::cat(&["global anchor mismatch: ", &m]),
            Mismatch::Negation(m) => crate::cat(&["negation anchor matched in resource: ", &m]),
            Mismatch::Fail(m) | Mismatch::Skipped(m) => m,
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

/// A validate pattern compiled once: anchors parsed, the order Kyverno visits a map's keys in
/// worked out, string operators, ranges, durations and quantities parsed. Matching walks this
/// tree beside the resource; a pattern with variables is compiled after they are substituted.
#[derive(Debug, Clone)]
pub struct Pattern {
    root: Node,
    /// The condition and existence anchor keys (as written) of the pattern, each once: a key's
    /// place here is its number in [`AnchorMap`].
    anchor_names: Vec<String>,
}

#[derive(Debug, Clone)]
enum Node {
    Map(Box<MapNode>),
    Array(Vec<Node>),
    Scalar(Box<Scalar>),
}

/// A pattern map, laid out for the walk (a match reads it front to back: the compiled patterns'
/// own reads were most of the data-cache misses of a Pod Security request in place).
#[derive(Debug, Clone)]
struct MapNode {
    /// In the order a match visits them: phase 1 — condition, existence, equality and negation
    /// anchors, in key order (serde_json keeps keys sorted) — then phase 2 — global anchors and
    /// keys with nested anchors (reverse key order), then the rest in key order.
    entries: Vec<Entry>,
    /// How many of `entries` are phase 1.
    first: usize,
    /// No anchor at this level and none below: every key in order, one phase.
    plain: bool,
    /// Condition and existence anchors, for [`AnchorMap`].
    anchor_keys: Vec<AnchorKey>,
    /// The map as written, when wildcard label or annotation keys under `metadata` are
    /// expanded to the resource's keys before matching.
    expand: Option<Box<serde_json::Map<String, Value>>>,
}

/// A condition or existence anchor key of a map.
#[derive(Debug, Clone)]
struct AnchorKey {
    /// Its place in [`Pattern::anchor_names`]; `None` for a key only a wildcard expansion made.
    id: Option<usize>,
    /// As written (`=(securityContext)`).
    raw: String,
    /// Looked up in each resource map: kept in line (most keys are short).
    bare: CompactString,
}

/// Numbers anchor keys: while a pattern compiles, a new key gets the next number; a map
/// compiled while matching (wildcard metadata keys expanded) looks its keys up.
enum Ids<'a> {
    Assign(&'a mut Vec<String>),
    Lookup(&'a [String]),
}

impl Ids<'_> {
    fn id(&mut self, raw: &str) -> Option<usize> {
        match self {
            Ids::Assign(names) => Some(names.iter().position(|n| n == raw).unwrap_or_else(|| {
                names.push(raw.to_string());
                names.len() - 1
            })),
            Ids::Lookup(names) => names.iter().position(|n| n == raw),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// What the entry looks up in the resource map: the key without its anchor, or as written
    /// (no anchor, or `+(k)`). In line for short keys: the walk compares it without another read.
    key: CompactString,
    anchor: Option<Anchor>,
    value: Node,
    /// The value is exactly `"*"`.
    star: bool,
    /// The value has anchors somewhere below.
    nested: bool,
}

#[derive(Debug, Clone)]
struct Scalar {
    /// As written, for messages.
    source: Value,
    kind: ScalarKind,
}

#[derive(Debug, Clone)]
enum ScalarKind {
    Bool(bool),
    /// `None`: a number that is not an f64 (matches nothing).
    Number(serde_json::Number, Option<f64>),
    Null,
    Str(StrPattern),
    Object,
    Array,
}

/// A string pattern: `a | b & c` alternatives of conditions (the text itself is the
/// [`Scalar`]'s source).
#[derive(Debug, Clone)]
struct StrPattern {
    any_of: Vec<Vec<Cond>>,
}

/// One condition of a string pattern: an operator and operand, or a range.
#[derive(Debug, Clone)]
enum Cond {
    Compare {
        op: Op,
        operand: String,
        duration: Option<i64>,
        quantity: Option<Quantity>,
    },
    /// `lo-hi` (`>= lo` and `<= hi`) or `lo!-hi` (`< lo` or `> hi`).
    Range {
        negated: bool,
        lo: Box<Cond>,
        hi: Box<Cond>,
    },
}

impl Pattern {
    pub fn compile(pattern: &Value) -> Pattern {
        let mut anchor_names = Vec::new();
        let root = Node::compile(pattern, &mut Ids::Assign(&mut anchor_names));
        Pattern { root, anchor_names }
    }

    /// Matches `resource` against the pattern from the root, as `validate.MatchPattern` does.
    pub fn matches(&self, resource: &Value) -> Result<(), PatternError> {
        // The path buffer is reused from one match to the next (a pattern match takes a few
        // hundred nanoseconds: its own allocation showed in profiles).
        thread_local! {
            static PATH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
        }
        let mut ac = AnchorMap::new(&self.anchor_names);
        let mut path = PATH.take();
        path.clear();
        path.push('/');
        let walked = self.root.element(resource, &mut path, &mut ac);
        PATH.set(path);
        match walked {
            Ok(()) => Ok(()),
            Err(e) => {
                let (path, m) = *e;
                if m.is_skip() {
                    return Err(PatternError { message: m.into_message(), path: String::new(), skip: true });
                }
                if matches!(m, Mismatch::Negation(_)) {
                    return Err(PatternError { message: m.into_message(), path, skip: false });
                }
                if ac.keys_missing() {
                    return Err(PatternError { message: m.into_message(), path: String::new(), skip: false });
                }
                Err(PatternError { message: m.into_message(), path, skip: false })
            }
        }
    }
}

/// Matches `resource` against `pattern` from the root (compiling the pattern first).
pub fn match_pattern(resource: &Value, pattern: &Value) -> Result<(), PatternError> {
    Pattern::compile(pattern).matches(resource)
}

/// Condition and existence anchor keys seen so far, and whether any resource map had them: by
/// their number in the pattern, as bits (a map of the keys' texts cost two allocations per key
/// per match, and every Pod Security pattern has such anchors); past 64 keys, or for a key only
/// an expansion made, by text.
struct AnchorMap<'p> {
    names: &'p [String],
    seen: u64,
    hit: u64,
    others: Vec<(String, bool)>,
}

impl<'p> AnchorMap<'p> {
    fn new(names: &'p [String]) -> AnchorMap<'p> {
        AnchorMap { names, seen: 0, hit: 0, others: Vec::new() }
    }

    fn check(&mut self, keys: &[AnchorKey], resource: &serde_json::Map<String, Value>) {
        for k in keys {
            let hit = get(resource, &k.bare).is_some();
            match k.id.filter(|i| *i < 64) {
                Some(i) => {
                    self.seen |= 1 << i;
                    self.hit |= u64::from(hit) << i;
                }
                None => match self.others.iter_mut().find(|(raw, _)| *raw == k.raw) {
                    Some(e) => e.1 |= hit,
                    None => self.others.push((k.raw.clone(), hit)),
                },
            }
        }
    }

    fn keys_missing(&self) -> bool {
        self.seen & !self.hit != 0 || self.others.iter().any(|(_, hit)| !hit)
    }
}

/// A mismatch, boxed: results are returned through every level of the walk, and most are
/// `Ok` (a 56-byte result written at every level showed in profiles).
type Res = Result<(), Box<(String, Mismatch)>>;

fn fail(path: String, m: Mismatch) -> Res {
    Err(Box::new((path, m)))
}

static NULL: Value = Value::Null;

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

fn with_index<T>(path: &mut String, i: usize, f: impl FnOnce(&mut String) -> T) -> T {
    let len = path.len();
    if i < 10 {
        // Most lists are short: one digit pushed here (`push_index` is not inlined).
        path.push(char::from(b'0' + i as u8));
    } else {
        crate::push_index(path, i);
    }
    path.push('/');
    let r = f(path);
    path.truncate(len);
    r
}

impl Node {
    fn compile(v: &Value, ids: &mut Ids) -> Node {
        match v {
            Value::Object(m) => Node::Map(Box::new(MapNode::compile(m, ids))),
            Value::Array(a) => Node::Array(a.iter().map(|x| Node::compile(x, ids)).collect()),
            other => Node::Scalar(Box::new(Scalar::compile(other))),
        }
    }

    /// Whether a key below (this map included) has an anchor.
    fn has_anchors(&self) -> bool {
        match self {
            Node::Map(m) => m.entries.iter().any(|e| e.anchor.is_some() || e.nested),
            Node::Array(a) => a.iter().any(Node::has_anchors),
            Node::Scalar(_) => false,
        }
    }

    fn go_type(&self) -> &'static str {
        match self {
            Node::Map(_) => "map[string]interface {}",
            Node::Array(_) => "[]interface {}",
            Node::Scalar(s) => go_type(&s.source),
        }
    }

    fn element(&self, resource: &Value, path: &mut String, ac: &mut AnchorMap<'_>) -> Res {
        match self {
            Node::Map(pm) => {
                let Value::Object(rm) = resource else {
                    return fail(
                        path.clone(),
                        Mismatch::Fail(crate::cat(&[
                            "pattern and resource have different structures. Path: ",
                            path,
                            ". Expected ",
                            self.go_type(),
                            ", found ",
                            go_type(resource),
                        ])),
                    );
                };
                ac.check(&pm.anchor_keys, rm);
                pm.validate(rm, path, ac)
            }
            Node::Array(pa) => {
                let Value::Array(ra) = resource else {
                    return fail(
                        path.clone(),
                        Mismatch::Fail(crate::cat(&[
                            "validation rule failed at path ",
                            path,
                            ", resource does not satisfy the expected overlay pattern",
                        ])),
                    );
                };
                validate_array(ra, pa, path, ac)
            }
            Node::Scalar(s) => {
                if let Value::Array(ra) = resource {
                    for r in ra {
                        if !s.matches(r) {
                            return fail(path.clone(), scalar_mismatch(resource, &s.source, path));
                        }
                    }
                    return Ok(());
                }
                if !s.matches(resource) {
                    return fail(path.clone(), scalar_mismatch(resource, &s.source, path));
                }
                Ok(())
            }
        }
    }
}

fn scalar_mismatch(resource: &Value, pattern: &Value, path: &str) -> Mismatch {
    Mismatch::Fail(crate::cat(&[
        "resource value '",
        &go_value(resource),
        "' does not match '",
        &go_value(pattern),
        "' at path ",
        path,
    ]))
}

/// `%v` of a decoded JSON value, close enough for messages.
fn go_value(v: &Value) -> std::borrow::Cow<'_, str> {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.as_str().into(),
        other => verno_jmespath::value::go_sprint(other).into(),
    }
}

fn validate_array(ra: &[Value], pa: &[Node], path: &mut String, ac: &mut AnchorMap<'_>) -> Res {
    let Some(first) = pa.first() else {
        return fail(path.clone(), Mismatch::Fail("pattern Array empty".into()));
    };
    match first {
        Node::Map(_) => {
            let mut applied = 0;
            let mut skips: Vec<String> = Vec::new();
            for (i, r) in ra.iter().enumerate() {
                match with_index(path, i, |p| first.element(r, p, ac)) {
                    Ok(()) => applied += 1,
                    Err(e) if e.1.is_skip() => skips.push(e.1.into_message()),
                    Err(e) => return Err(e),
                }
            }
            if applied == 0 && !skips.is_empty() {
                return fail(path.clone(), Mismatch::Skipped(skips.join("; ")));
            }
            Ok(())
        }
        Node::Array(_) => {
            if ra.len() < pa.len() {
                return fail(
                    path.clone(),
                    Mismatch::Fail(format!(
                        "validate Array failed, array length mismatch, resource Array len is {} and pattern Array len is {}",
                        ra.len(),
                        pa.len()
                    )),
                );
            }
            for (i, p) in pa.iter().enumerate() {
                let r = ra.get(i).unwrap_or(&NULL);
                with_index(path, i, |pp| p.element(r, pp, ac))?;
            }
            Ok(())
        }
        Node::Scalar(_) => {
            for (i, r) in ra.iter().enumerate() {
                with_index(path, i, |pp| first.element(r, pp, ac))?;
            }
            Ok(())
        }
    }
}

/// Whether matching `pm` first rewrites `metadata.labels` or `metadata.annotations` (see
/// [`expand_metadata`]): when one has a wildcard key or a value that is not a string.
fn expands_metadata(pm: &serde_json::Map<String, Value>) -> bool {
    if !(pm.contains_key("metadata") || pm.keys().any(|k| k.ends_with("(metadata)"))) {
        return false;
    }
    let Some(pmeta) = pm.iter().find(|(k, _)| strip_anchor(k) == "metadata").and_then(|(_, v)| v.as_object()) else {
        return false;
    };
    ["labels", "annotations"].iter().any(|tag| {
        pmeta.iter().find(|(k, _)| strip_anchor(k) == *tag).and_then(|(_, v)| v.as_object()).is_some_and(needs_rewrite)
    })
}

/// A labels/annotations pattern Kyverno rewrites before matching: a wildcard key, or a value
/// that is not a string.
fn needs_rewrite(d: &serde_json::Map<String, Value>) -> bool {
    d.iter().any(|(k, v)| wildcard::has_wildcard(k) || !v.is_string())
}

/// Kyverno's rewrite of `metadata.labels` / `metadata.annotations` (its `ExpandInMetadata`, on
/// every map of the pattern that has `metadata` beside a resource `metadata`): when the resource
/// has that map, the pattern's keeps only its string values (a `false`, a number or a null is
/// dropped, so it checks nothing) and its wildcard keys become the resource's keys they match.
fn expand_metadata(
    pm: &serde_json::Map<String, Value>,
    rm: &serde_json::Map<String, Value>,
) -> Option<serde_json::Map<String, Value>> {
    let (meta_key, pmeta) = pm.iter().find(|(k, _)| strip_anchor(k) == "metadata")?;
    let pmeta = pmeta.as_object()?;
    let rmeta = get(rm, "metadata")?.as_object()?;
    // The pattern's metadata is copied only once a resource map is there to expand against
    // (most resources have no annotations: the copy per request showed in profiles).
    let mut new_meta: Option<serde_json::Map<String, Value>> = None;
    for tag in ["labels", "annotations"] {
        let Some(rdata) = get(rmeta, tag).and_then(Value::as_object) else { continue };
        let Some((tkey, pdata)) = pmeta.iter().find(|(k, _)| strip_anchor(k) == tag) else { continue };
        let Some(pdata) = pdata.as_object() else { continue };
        if !needs_rewrite(pdata) {
            continue;
        }
        let mut out = serde_json::Map::new();
        for (k, v) in pdata {
            if !v.is_string() {
                continue;
            }
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
        new_meta.get_or_insert_with(|| pmeta.clone()).insert(tkey.clone(), Value::Object(out));
    }
    let new_meta = new_meta?;
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

impl MapNode {
    fn compile(pm: &serde_json::Map<String, Value>, ids: &mut Ids) -> MapNode {
        let mut plain = true;
        let mut first = Vec::new();
        let mut front = Vec::new();
        let mut back = Vec::new();
        for (k, v) in pm {
            let value = Node::compile(v, ids);
            let anchor = anchor::parse(k);
            let key = match anchor {
                Some((a, bare)) if a != Anchor::AddIfNotPresent => bare,
                _ => k.as_str(),
            };
            let nested = value.has_anchors();
            plain &= !(k.ends_with(')') || nested);
            let entry =
                Entry { key: key.into(), anchor: anchor.map(|(a, _)| a), star: v.as_str() == Some("*"), nested, value };
            match entry.anchor {
                Some(Anchor::Condition | Anchor::Existence | Anchor::Equality | Anchor::Negation) => first.push(entry),
                Some(Anchor::Global) => front.push(entry),
                _ if entry.nested => front.push(entry),
                _ => back.push(entry),
            }
        }
        // Numbered once the values below are (as they always were: the numbers decide which
        // keys past the 64th are kept by text).
        let anchor_keys = pm
            .keys()
            .filter_map(|k| match anchor::parse(k) {
                Some((Anchor::Condition | Anchor::Existence, bare)) => {
                    Some(AnchorKey { id: ids.id(k), raw: k.clone(), bare: bare.into() })
                }
                _ => None,
            })
            .collect();
        let phase_one = first.len();
        let mut entries = first;
        entries.extend(front.into_iter().rev());
        entries.extend(back);
        MapNode {
            entries,
            first: phase_one,
            plain,
            anchor_keys,
            expand: expands_metadata(pm).then(|| Box::new(pm.clone())),
        }
    }

    fn validate(&self, rm: &serde_json::Map<String, Value>, path: &mut String, ac: &mut AnchorMap<'_>) -> Res {
        if let Some(source) = &self.expand
            && let Some(expanded) = expand_metadata(source, rm)
        {
            let mut node = MapNode::compile(&expanded, &mut Ids::Lookup(ac.names));
            node.expand = None;
            return node.validate(rm, path, ac);
        }
        if self.plain {
            for e in &self.entries {
                e.handle(rm, path, ac)?;
            }
            return Ok(());
        }
        // Phase 1: condition, existence, equality and negation anchors, sorted by key. As Kyverno:
        // anchors that skip are gathered; the map skips when none applied, or when one of them
        // is a direct conditional (or global) mismatch, which also hides a later failure; skipped
        // arrays beside anchors that applied are ignored.
        let mut skips: Vec<Mismatch> = Vec::new();
        let mut applied = 0;
        let direct = |skips: &[Mismatch]| skips.iter().any(|m| !matches!(m, Mismatch::Skipped(_)));
        let (first, second) = self.entries.split_at(self.first.min(self.entries.len()));
        for e in first {
            match e.handle(rm, path, ac) {
                Ok(()) => applied += 1,
                Err(e) if e.1.is_skip() => skips.push(e.1),
                Err(e) if !direct(&skips) => return Err(e),
                Err(_) => {}
            }
        }
        if !skips.is_empty() && (applied == 0 || direct(&skips)) {
            let message = skips.into_iter().map(Mismatch::into_message).collect::<Vec<_>>().join("; ");
            return fail(path.clone(), Mismatch::Skipped(message));
        }
        // Phase 2: global anchors and keys with nested anchors first (reverse-sorted), then the rest sorted.
        for e in second {
            e.handle(rm, path, ac)?;
        }
        Ok(())
    }
}

impl Entry {
    fn handle(&self, rm: &serde_json::Map<String, Value>, path: &mut String, ac: &mut AnchorMap<'_>) -> Res {
        let pattern = &self.value;
        let key = self.key.as_str();
        match self.anchor {
            Some(Anchor::Condition) => with_seg(path, key, |cur| match get(rm, key) {
                Some(v) => {
                    pattern.element(v, cur, ac).map_err(|e| Box::new((e.0, Mismatch::Conditional(e.1.into_message()))))
                }
                None => fail(
                    cur.clone(),
                    Mismatch::Conditional("conditional anchor key doesn't exist in the resource".into()),
                ),
            }),
            Some(Anchor::Global) => with_seg(path, key, |cur| match get(rm, key) {
                Some(v) => {
                    pattern.element(v, cur, ac).map_err(|e| Box::new((e.0, Mismatch::Global(e.1.into_message()))))
                }
                None => Ok(()),
            }),
            Some(Anchor::Equality) => with_seg(path, key, |cur| match get(rm, key) {
                Some(v) => pattern.element(v, cur, ac),
                None => Ok(()),
            }),
            Some(Anchor::Negation) => with_seg(path, key, |cur| {
                if get(rm, key).is_some() {
                    return fail(cur.clone(), Mismatch::Negation(crate::cat(&[cur, " is not allowed"])));
                }
                Ok(())
            }),
            Some(Anchor::Existence) => with_seg(path, key, |cur| {
                let Some(v) = get(rm, key) else { return Ok(()) };
                let Value::Array(ra) = v else {
                    return fail(
                        cur.clone(),
                        Mismatch::Fail(format!(
                            "invalid resource type {}: Existence ^ () anchor can be used only on list/array type resource",
                            go_type(v)
                        )),
                    );
                };
                let Node::Array(pa) = pattern else {
                    return fail(
                        cur.clone(),
                        Mismatch::Fail(
                            "invalid pattern type: Pattern has to be of list to compare against resource".into(),
                        ),
                    );
                };
                for p in pa {
                    if !matches!(p, Node::Map(_)) {
                        return fail(
                            cur.clone(),
                            Mismatch::Fail(
                                "invalid pattern type: Pattern has to be of type map to compare against items in resource"
                                    .into(),
                            ),
                        );
                    }
                    let found =
                        ra.iter().enumerate().any(|(i, r)| with_index(cur, i, |pp| p.element(r, pp, ac)).is_ok());
                    if !found {
                        return fail(
                            cur.clone(),
                            Mismatch::Fail(crate::cat(&["existence anchor validation failed at path ", cur])),
                        );
                    }
                }
                Ok(())
            }),
            Some(Anchor::AddIfNotPresent) | None => {
                let k = key;
                let rv = get(rm, k).unwrap_or(&NULL);
                if self.star {
                    if rv.is_null() {
                        return fail(path.clone(), Mismatch::Fail(crate::cat(&[path, "/", k, " not found"])));
                    }
                    return Ok(());
                }
                with_seg(path, k, |cur| pattern.element(rv, cur, ac))
            }
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

impl Scalar {
    fn compile(pattern: &Value) -> Scalar {
        let kind = match pattern {
            Value::Bool(b) => ScalarKind::Bool(*b),
            Value::Number(n) => ScalarKind::Number(n.clone(), n.as_f64()),
            Value::Null => ScalarKind::Null,
            Value::String(p) => ScalarKind::Str(StrPattern::compile(p)),
            Value::Object(_) => ScalarKind::Object,
            Value::Array(_) => ScalarKind::Array,
        };
        Scalar { source: pattern.clone(), kind }
    }

    /// `pattern.Validate`: one resource value against this pattern.
    fn matches(&self, value: &Value) -> bool {
        match &self.kind {
            ScalarKind::Bool(b) => value.as_bool() == Some(*b),
            ScalarKind::Number(n, p) => {
                let Some(p) = p else { return false };
                match value {
                    Value::Number(v) => v.as_f64() == Some(*p),
                    Value::String(s) => number_equals_string(n, s),
                    _ => false,
                }
            }
            ScalarKind::Null => match value {
                Value::Null => true,
                Value::Number(n) => n.as_f64() == Some(0.0),
                Value::String(s) => s.is_empty(),
                Value::Bool(b) => !*b,
                _ => false,
            },
            ScalarKind::Object => value.is_object(),
            // The value equal to the pattern's text matches whatever operators it spells.
            ScalarKind::Str(p) => value.as_str().is_some_and(|v| self.source.as_str() == Some(v)) || p.matches(value),
            ScalarKind::Array => false,
        }
    }
}

/// `pattern.Validate`: one resource value against one scalar (or map) pattern.
#[cfg(test)]
fn validate_scalar(value: &Value, pattern: &Value) -> bool {
    Scalar::compile(pattern).matches(value)
}

impl StrPattern {
    fn compile(pattern: &str) -> StrPattern {
        let any_of = if pattern.contains(['|', '&']) {
            pattern
                .split('|')
                .map(|alt| alt.trim_matches(' ').split('&').map(|c| Cond::compile(c.trim_matches(' '))).collect())
                .collect()
        } else {
            vec![vec![Cond::compile(pattern.trim_matches(' '))]]
        };
        StrPattern { any_of }
    }

    fn matches(&self, value: &Value) -> bool {
        self.any_of.iter().any(|all| all.iter().all(|c| c.matches(value)))
    }
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

impl Cond {
    fn compile(pattern: &str) -> Cond {
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
            if let Some((negated, lo, hi)) = parse_range(pattern) {
                let (lo, hi) = if negated {
                    (Cond::compile(&format!("< {lo}")), Cond::compile(&format!("> {hi}")))
                } else {
                    (Cond::compile(&format!(">= {lo}")), Cond::compile(&format!("<= {hi}")))
                };
                return Cond::Range { negated, lo: Box::new(lo), hi: Box::new(hi) };
            }
            Op::Equal
        };
        let skip = match op {
            Op::MoreEqual | Op::LessEqual => 2,
            Op::More | Op::Less | Op::NotEqual => 1,
            Op::Equal => 0,
        };
        let operand = pattern.get(skip..).unwrap_or("").trim();
        Cond::Compare {
            op,
            operand: operand.to_string(),
            duration: duration::parse(operand),
            quantity: Quantity::parse(operand),
        }
    }

    fn matches(&self, value: &Value) -> bool {
        match self {
            Cond::Range { negated: true, lo, hi } => lo.matches(value) || hi.matches(value),
            Cond::Range { negated: false, lo, hi } => lo.matches(value) && hi.matches(value),
            Cond::Compare { op, operand, duration, quantity } => {
                compare_duration(value, *duration, *op)
                    || compare_quantity(value, quantity.as_ref(), *op)
                    || compare_string(value, operand, *op)
            }
        }
    }
}

/// One condition of a string pattern: an optional operator, a range, or a plain value.
pub fn validate_string_pattern(value: &Value, pattern: &str) -> bool {
    Cond::compile(pattern).matches(value)
}

fn number_to_string(v: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match v {
        Value::Null => Some("0".into()),
        Value::Number(n) => Some(match n.as_i64() {
            Some(i) => i.to_string().into(),
            None => format!("{:.6}", n.as_f64().unwrap_or(0.0)).into(),
        }),
        Value::String(s) => Some(s.as_str().into()),
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

fn compare_duration(value: &Value, pattern: Option<i64>, op: Op) -> bool {
    let Some(p) = pattern else { return false };
    let Some(vs) = number_to_string(value) else { return false };
    let Some(v) = duration::parse(&vs) else { return false };
    apply(v.cmp(&p), op)
}

fn compare_quantity(value: &Value, pattern: Option<&Quantity>, op: Op) -> bool {
    let Some(p) = pattern else { return false };
    let Some(vs) = number_to_string(value) else { return false };
    let Some(v) = Quantity::parse(&vs) else { return false };
    apply(v.cmp(p), op)
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

    /// Found by the Kyverno oracle (issue 50), each vector checked against Kyverno's CLI: a
    /// Pod labelled `env: web-1` was refused by `=(labels): {=(env): false}`, which Kyverno
    /// admits (it drops label and annotation pattern values that are not strings).
    #[test]
    fn label_and_annotation_patterns_keep_only_string_values() {
        let pod = json!({"metadata": {"name": "r", "labels": {"env": "web-1"}, "annotations": {"env": "web-1"}}, "spec": {"x": "web"}});
        for (p, want) in [
            (json!({"metadata": {"=(labels)": {"=(env)": false}}}), true),
            (json!({"metadata": {"=(labels)": {"env": 0}}}), true),
            (json!({"metadata": {"=(annotations)": {"=(env)": null}}}), true),
            (json!({"metadata": {"=(labels)": {"env": false, "app": "?*"}}}), false),
            (json!({"spec": {"=(x)": false}}), false),
        ] {
            assert_eq!(match_pattern(&pod, &p).is_ok(), want, "{p}");
        }
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

    /// Anchor keys are merged by the key as written, whether counted by number (the first 64
    /// of a pattern), past 64, or made by an expansion: missing only if no map had it.
    #[test]
    fn anchor_keys_seen_are_merged_by_key_whatever_their_number() {
        let names: Vec<String> = (0..70).map(|i| format!("=(k{i})")).collect();
        let key = |i: usize, id: Option<usize>| AnchorKey { id, raw: format!("=(k{i})"), bare: format!("k{i}").into() };
        let with = |keys: &[&str]| -> serde_json::Map<String, Value> {
            keys.iter().map(|k| (k.to_string(), Value::Bool(true))).collect()
        };
        for i in [3, 63, 64, 69] {
            let mut ac = AnchorMap::new(&names);
            ac.check(&[key(i, Some(i))], &with(&[]));
            assert!(ac.keys_missing(), "k{i} not found yet");
            ac.check(&[key(i, Some(i))], &with(&[&format!("k{i}")]));
            assert!(!ac.keys_missing(), "k{i} found once");
            ac.check(&[key(i, Some(i))], &with(&[]));
            assert!(!ac.keys_missing(), "k{i} found once is enough");
        }
        // A key only an expansion made has no number (a key the pattern has is looked up to
        // its number): kept by text, merged by text.
        let made = || AnchorKey { id: None, raw: "=(app/x)".into(), bare: "app/x".into() };
        let mut ac = AnchorMap::new(&names);
        ac.check(&[made()], &with(&[]));
        assert!(ac.keys_missing());
        ac.check(&[made()], &with(&["app/x"]));
        assert!(!ac.keys_missing());
        let mut ids = Ids::Lookup(&names);
        assert_eq!((ids.id("=(k5)"), ids.id("=(other)")), (Some(5), None));
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
