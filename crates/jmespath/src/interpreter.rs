//! Evaluates an [`Ast`] against a `serde_json::Value`, borrowing from the input wherever possible.
//!
//! Kyverno's fork of go-jmespath differs from the spec in one way that matters: a missing key in
//! a plain field path is an error (`Unknown key "k" in path`). The error propagates through
//! sub-expressions and index expressions, and is swallowed (read as `null`) by comparators,
//! function arguments, `||`, `&&`, `!`, pipes, projections and multiselects.

use crate::Env;
use crate::ast::{Ast, Comparator};
use crate::error::RuntimeError;
use crate::functions::Arg;
use crate::value::{is_truthy, values_equal};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::cell::Cell;

/// The longest string a function may return (1 MiB): larger results are an error, so
/// nesting string functions cannot grow memory without bound.
pub const MAX_STRING_BYTES: usize = 1 << 20;

/// The work one evaluation may do: every step of the tree walk costs 1 and every value node
/// copied or built by a projection, multiselect, flatten, slice or literal costs 1. About
/// 100 ms and a few hundred MiB at most; a legitimate policy expression over a 3 MiB object
/// uses a small fraction, while `[@,@]|[@,@]|…` (doubling per pipe) stops here.
pub const MAX_WORK: u64 = 8_000_000;

/// How often (in units of work) the caller's [`Env::cancelled`] is asked.
const CANCEL_CHECK_EVERY: u64 = 1 << 14;

/// The budget of one evaluation. Once spent (or cancelled) every later step fails, and
/// `Expression::search` reports the error whatever operators made of it.
pub(crate) struct Meter<'e> {
    pub(crate) env: &'e dyn Env,
    dialect: crate::Dialect,
    left: Cell<u64>,
    stopped: Cell<Option<&'static str>>,
}

impl<'e> Meter<'e> {
    pub(crate) fn new(env: &'e dyn Env, dialect: crate::Dialect) -> Meter<'e> {
        Meter { env, dialect, left: Cell::new(MAX_WORK), stopped: Cell::new(None) }
    }

    fn charge(&self, units: u64) -> Result<(), RuntimeError> {
        let before = self.left.get();
        if self.stopped.get().is_none() {
            match before.checked_sub(units) {
                Some(left) => {
                    self.left.set(left);
                    if before / CANCEL_CHECK_EVERY != left / CANCEL_CHECK_EVERY && self.env.cancelled() {
                        self.stopped.set(Some("the evaluation was cancelled (its deadline passed)"));
                    }
                }
                None => self.stopped.set(Some(
                    "the expression does too much work (over 8 million steps and copied values); simplify it",
                )),
            }
        }
        match self.stopped.get() {
            Some(why) => Err(RuntimeError::Budget(why.to_string())),
            None => Ok(()),
        }
    }

    /// Charges for a deep copy of `v` (its node count), counting no further than what is left.
    fn charge_copy(&self, v: &Value) -> Result<(), RuntimeError> {
        self.charge(Self::nodes(v, self.left.get()))
    }

    /// Charges for `times` deep copies of `v`, counting its nodes once: the same charges as
    /// `times` calls of [`Meter::charge_copy`] (the count is capped at what is left, so a
    /// second copy that would not fit fails as it would counted again).
    fn charge_copies(&self, v: &Value, times: u32) -> Result<(), RuntimeError> {
        let n = Self::nodes(v, self.left.get());
        for _ in 0..times {
            self.charge(n)?;
        }
        Ok(())
    }

    /// Nodes of `v`, counting no further than `limit` (no allocation: this runs for every
    /// copied value; the depth is bounded by the data's, which serde_json caps at 128).
    /// Scalars are counted without a call (most children are), and no iterator is boxed.
    fn nodes(v: &Value, limit: u64) -> u64 {
        fn children<'v>(values: impl Iterator<Item = &'v Value>, limit: u64) -> u64 {
            let mut n = 1;
            for c in values {
                if n > limit {
                    break;
                }
                n += match c {
                    Value::Array(_) | Value::Object(_) => Meter::nodes(c, limit - n),
                    _ => 1,
                };
            }
            n
        }
        match v {
            Value::Array(a) => children(a.iter(), limit),
            Value::Object(m) => children(m.values(), limit),
            _ => 1,
        }
    }

    /// `v` as an owned value; copying a borrowed one is charged.
    fn own(&self, v: Cv<'_>) -> Result<Value, RuntimeError> {
        match v {
            Cow::Borrowed(b) => {
                self.charge_copy(b)?;
                Ok(b.clone())
            }
            Cow::Owned(o) => Ok(o),
        }
    }

    pub(crate) fn exhausted(&self) -> Option<RuntimeError> {
        self.stopped.get().map(|why| RuntimeError::Budget(why.to_string()))
    }
}

pub(crate) type Cv<'a> = Cow<'a, Value>;

static NULL: Value = Value::Null;

/// A sub-expression's result as go-jmespath (Kyverno's fork) reads it inside an operator, a
/// function argument, a multiselect or a projection: a missing key is `null`; any other error
/// (a function's, the budget's) is the whole expression's error, never `null` — an
/// `x || fallback` must not turn a failed `parse_json` into the fallback.
fn or_null(r: Result<Cv<'_>, RuntimeError>) -> Result<Cv<'_>, RuntimeError> {
    match r {
        Err(RuntimeError::NotFound(_)) => Ok(Cow::Borrowed(&NULL)),
        other => other,
    }
}

pub(crate) fn eval<'a>(ast: &Ast, data: &'a Value, env: &Meter<'_>) -> Result<Cv<'a>, RuntimeError> {
    env.charge(1)?;
    match ast {
        Ast::Identity => Ok(Cow::Borrowed(data)),
        Ast::Field(name) => match data {
            Value::Object(m) => match crate::value::get(m, name) {
                Some(v) => Ok(Cow::Borrowed(v)),
                None if env.dialect == crate::Dialect::Community => Ok(Cow::Borrowed(&NULL)),
                None => Err(RuntimeError::NotFound(compact_str::CompactString::new(name))),
            },
            _ => Ok(Cow::Borrowed(&NULL)),
        },
        Ast::Variable(name) => match env.env.variable(name) {
            Some(v) => Ok(Cow::Owned(v)),
            None => Err(RuntimeError::Other(format!("variable not defined: ${name}"))),
        },
        Ast::Index(i) => match data {
            Value::Array(a) => {
                let len = a.len() as i64;
                let idx = if *i < 0 { len + *i } else { *i };
                if idx < 0 || idx >= len {
                    Ok(Cow::Borrowed(&NULL))
                } else {
                    Ok(a.get(idx as usize).map(Cow::Borrowed).unwrap_or(Cow::Borrowed(&NULL)))
                }
            }
            _ => Ok(Cow::Borrowed(&NULL)),
        },
        Ast::Slice { start, stop, step } => match data {
            Value::Array(a) => Ok(Cow::Owned(Value::Array(slice(a, *start, *stop, *step, env)?))),
            _ => Ok(Cow::Borrowed(&NULL)),
        },
        Ast::Subexpr(lhs, rhs) => {
            let l = eval(lhs, data, env)?;
            chain(env, l, |v| eval(rhs, v, env))
        }
        Ast::Projection(lhs, rhs) => {
            // `spec.[a, b][].x`: the flattened elements are visited where they are.
            let elements = match elements(lhs, data, env)? {
                Elements::Other => None,
                Elements::Null => {
                    env.charge(1)?; // the flatten node, as evaluating it charges
                    return Ok(Cow::Borrowed(&NULL));
                }
                Elements::List(l) => {
                    env.charge(1)?;
                    Some(l)
                }
            };
            if let Some(elements) = elements {
                let mut out = Vec::with_capacity(elements.len());
                for el in &elements {
                    let r = or_null(eval(rhs, el, env))?;
                    if !r.is_null() {
                        out.push(env.own(r)?);
                    }
                }
                return Ok(Cow::Owned(Value::Array(out)));
            }
            let l = match (or_null(eval(lhs, data, env))?, &**rhs) {
                // `x[]` over a list made for this expression: the elements are moved, not copied
                // (the budget is charged as for the general case below).
                (Cow::Owned(Value::Array(arr)), Ast::Identity) => {
                    return Ok(Cow::Owned(Value::Array(kept_as_they_are(arr, env)?)));
                }
                (l, _) => l,
            };
            let arr = match l.as_ref() {
                Value::Array(a) => a,
                _ => return Ok(Cow::Borrowed(&NULL)),
            };
            let mut out = Vec::with_capacity(arr.len());
            for el in arr {
                let r = or_null(eval(rhs, el, env))?;
                if !r.is_null() {
                    out.push(env.own(r)?);
                }
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::ValueProjection(lhs, rhs) => {
            // go-jmespath reads any error of the left side as null here (and in filters and
            // flattens); everywhere else only a missing key is null.
            let l = eval(lhs, data, env).unwrap_or(Cow::Borrowed(&NULL));
            let obj = match l.as_ref() {
                Value::Object(m) => m,
                _ => return Ok(Cow::Borrowed(&NULL)),
            };
            let mut out = Vec::with_capacity(obj.len());
            for el in obj.values() {
                let r = or_null(eval(rhs, el, env))?;
                if !r.is_null() {
                    out.push(env.own(r)?);
                }
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::FilterProjection { lhs, rhs, cond } => {
            let l = eval(lhs, data, env).unwrap_or(Cow::Borrowed(&NULL));
            let arr = match l.as_ref() {
                Value::Array(a) => a,
                _ => return Ok(Cow::Borrowed(&NULL)),
            };
            let mut out = Vec::new();
            for el in arr {
                let c = or_null(eval(cond, el, env))?;
                if is_truthy(&c) {
                    let r = or_null(eval(rhs, el, env))?;
                    if !r.is_null() {
                        out.push(env.own(r)?);
                    }
                }
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::Flatten(inner) => match elements(ast, data, env)? {
            Elements::Other => Ok(match flattened(inner, data, env)? {
                Some(l) => Cow::Owned(Value::Array(l.into_iter().map(Cow::into_owned).collect())),
                None => Cow::Borrowed(&NULL),
            }),
            Elements::Null => Ok(Cow::Borrowed(&NULL)),
            Elements::List(l) => Ok(Cow::Owned(Value::Array(l.into_iter().map(Cow::into_owned).collect()))),
        },
        Ast::Literal(v) => env.own(Cow::Borrowed(v)).map(Cow::Owned),
        Ast::MultiList(items) => {
            if data.is_null() {
                return Ok(Cow::Borrowed(&NULL));
            }
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let v = or_null(eval(it, data, env))?;
                out.push(env.own(v)?);
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::MultiHash(items) => {
            if data.is_null() {
                return Ok(Cow::Borrowed(&NULL));
            }
            let mut out = Map::new();
            for (k, it) in items {
                let v = or_null(eval(it, data, env))?;
                out.insert(k.clone(), env.own(v)?);
            }
            Ok(Cow::Owned(Value::Object(out)))
        }
        Ast::Call(f, args) => {
            let mut vals: Vec<Arg<'_, 'a>> = Vec::with_capacity(args.len());
            for a in args {
                match a {
                    Ast::Expref(inner) => vals.push(Arg::Expref(inner)),
                    other => vals.push(Arg::Value(or_null(eval(other, data, env))?)),
                }
            }
            let out = f.call(&vals, env)?;
            // Whatever a function builds is work done: counted like a copy.
            if out.is_array() || out.is_object() {
                env.charge_copy(&out)?;
            }
            // Output budget: nested `replace_all` or `repeat`-like growth stops here.
            if let Value::String(s) = &out
                && s.len() > MAX_STRING_BYTES
            {
                return Err(RuntimeError::func(
                    f.name,
                    format!("the result is {} bytes; strings over {MAX_STRING_BYTES} bytes are refused", s.len()),
                ));
            }
            Ok(Cow::Owned(out))
        }
        Ast::Expref(_) => Ok(Cow::Borrowed(&NULL)),
        Ast::Not(inner) => {
            let v = or_null(eval(inner, data, env))?;
            Ok(Cow::Owned(Value::Bool(!is_truthy(&v))))
        }
        Ast::And(a, b) => {
            let l = or_null(eval(a, data, env))?;
            if !is_truthy(&l) {
                return Ok(l);
            }
            // go-jmespath returns the right side as it is, a missing key's error included.
            eval(b, data, env)
        }
        Ast::Or(a, b) => {
            let l = or_null(eval(a, data, env))?;
            if is_truthy(&l) {
                return Ok(l);
            }
            or_null(eval(b, data, env))
        }
        Ast::Compare(op, a, b) => {
            let l = or_null(eval(a, data, env))?;
            let r = or_null(eval(b, data, env))?;
            Ok(Cow::Owned(compare(*op, &l, &r)))
        }
        Ast::Pipe(a, b) => {
            let l = or_null(eval(a, data, env))?;
            or_null(chain(env, l, |v| eval(b, v, env)))
        }
    }
}

/// `inner[]` where `inner` is not a field path's multiselect (see [`elements`]): the
/// elements of the list `inner` gives, one level flattened, borrowed where they are in `data`
/// (`None` when `inner` gives no list). Charged as copies either way.
fn flattened<'a>(inner: &Ast, data: &'a Value, env: &Meter<'_>) -> Result<Option<Vec<Cv<'a>>>, RuntimeError> {
    let mut out = Vec::new();
    match eval(inner, data, env).unwrap_or(Cow::Borrowed(&NULL)) {
        // A list made for this expression (`spec.[a, b][]`): its elements are moved.
        Cow::Owned(Value::Array(arr)) => {
            out.reserve(arr.len());
            for el in arr {
                env.charge_copy(&el)?;
                match el {
                    Value::Array(inner) => out.extend(inner.into_iter().map(Cow::Owned)),
                    other => out.push(Cow::Owned(other)),
                }
            }
        }
        Cow::Borrowed(Value::Array(arr)) => {
            out.reserve(arr.len());
            for el in arr {
                env.charge_copy(el)?;
                match el {
                    Value::Array(inner) => out.extend(inner.iter().map(Cow::Borrowed)),
                    other => out.push(Cow::Borrowed(other)),
                }
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(out))
}

/// What [`items`] found: a list's elements, each where it is when the expression only picks
/// them, or a value that is not a list.
pub enum Items<'a> {
    List(Vec<Cv<'a>>),
    Other(Cv<'a>),
}

/// [`eval`] for a caller that iterates the result: a list's elements one by one, those a
/// flatten picks from `data` (`spec.containers[]`, `spec.[a, b][]`) borrowed rather than
/// copied into a new list. Charged as [`eval`] charges, errors read as [`eval`] reads them.
pub(crate) fn items<'a>(ast: &Ast, data: &'a Value, env: &Meter<'_>) -> Result<Items<'a>, RuntimeError> {
    // `x[]` is a projection of the flatten of `x` that keeps each element as it is.
    let (flatten, inner) = match ast {
        Ast::Projection(lhs, rhs) if matches!(**rhs, Ast::Identity) => match &**lhs {
            Ast::Flatten(inner) => (&**lhs, inner),
            _ => return eval(ast, data, env).map(Items::of),
        },
        _ => return eval(ast, data, env).map(Items::of),
    };
    env.charge(1)?; // the projection node
    let list = match elements(flatten, data, env)? {
        Elements::Null => {
            env.charge(1)?; // the flatten node, as evaluating it charges
            None
        }
        Elements::List(l) => {
            env.charge(1)?;
            Some(l)
        }
        // As the projection evaluates its left side: an error there reads as null.
        Elements::Other => env.charge(1).and_then(|()| flattened(inner, data, env)).unwrap_or(None),
    };
    let Some(list) = list else { return Ok(Items::Other(Cow::Borrowed(&NULL))) };
    Ok(Items::List(kept_as_they_are(list, env)?))
}

/// The elements of a projection whose right side is `@`, without copying them: each charged as
/// evaluating `@` on it and keeping its result charges, nulls dropped.
fn kept_as_they_are<T: std::borrow::Borrow<Value>>(list: Vec<T>, env: &Meter<'_>) -> Result<Vec<T>, RuntimeError> {
    let mut out = Vec::with_capacity(list.len());
    for el in list {
        if env.charge(1).is_err() || el.borrow().is_null() {
            continue;
        }
        env.charge_copy(el.borrow())?;
        out.push(el);
    }
    Ok(out)
}

impl<'a> Items<'a> {
    fn of(v: Cv<'a>) -> Items<'a> {
        match v {
            Cow::Borrowed(Value::Array(a)) => Items::List(a.iter().map(Cow::Borrowed).collect()),
            Cow::Owned(Value::Array(a)) => Items::List(a.into_iter().map(Cow::Owned).collect()),
            other => Items::Other(other),
        }
    }
}

/// Evaluates `f` on a value that may be borrowed from the input or owned by this call.
/// What [`elements`] found.
enum Elements<'a> {
    /// Not a flattened multiselect over a field path: evaluate as usual.
    Other,
    /// The flatten gives `null` (the multiselect ran over `null`, or the path failed).
    Null,
    List(Vec<Cv<'a>>),
}

/// Is `ast` a plain field path (`a`, `a.b.c`)? Its value is always borrowed from the data.
fn is_field_path(ast: &Ast) -> bool {
    match ast {
        Ast::Field(_) => true,
        Ast::Subexpr(lhs, rhs) => matches!(&**rhs, Ast::Field(_)) && is_field_path(lhs),
        _ => false,
    }
}

/// The elements of a flattened multiselect (`spec.[a, b][]`, also below a field path) without
/// building the intermediate lists: each element is borrowed from the data where it lives. The
/// budget is charged as building them charges it (each node visited; the multiselect's copies,
/// then the flatten's), so limits do not depend on the shortcut. The `Flatten` node itself is
/// the caller's to charge.
fn elements<'a>(flatten: &Ast, data: &'a Value, env: &Meter<'_>) -> Result<Elements<'a>, RuntimeError> {
    let Ast::Flatten(inner) = flatten else { return Ok(Elements::Other) };
    #[cfg(test)]
    if tests::NO_SHORTCUT.with(std::cell::Cell::get) {
        return Ok(Elements::Other);
    }
    let (base, items) = match &**inner {
        Ast::MultiList(items) => (Ok(Cow::Borrowed(data)), items),
        Ast::Subexpr(lhs, rhs) if is_field_path(lhs) => match &**rhs {
            Ast::MultiList(items) => {
                env.charge(1)?; // the subexpression node
                (eval(lhs, data, env), items)
            }
            _ => return Ok(Elements::Other),
        },
        _ => return Ok(Elements::Other),
    };
    let base = match base {
        Ok(Cow::Borrowed(v)) => v,
        // A field path only borrows; a missing key (Kyverno's dialect) reads as null here, as
        // the flatten's operand does.
        Ok(Cow::Owned(_)) | Err(_) => return Ok(Elements::Null),
    };
    env.charge(1)?; // the multiselect node
    #[cfg(test)]
    tests::TAKEN.with(|n| n.set(n.get() + 1));
    if base.is_null() {
        return Ok(Elements::Null);
    }
    let mut out = Vec::new();
    for it in items {
        let v = or_null(eval(it, base, env))?;
        // Charged as the multiselect copies it, then as the flatten copies it again.
        env.charge_copies(&v, if matches!(v, Cow::Borrowed(_)) { 2 } else { 1 })?;
        match v {
            Cow::Borrowed(Value::Array(a)) => out.extend(a.iter().map(Cow::Borrowed)),
            Cow::Owned(Value::Array(a)) => out.extend(a.into_iter().map(Cow::Owned)),
            other => out.push(other),
        }
    }
    Ok(Elements::List(out))
}

fn chain<'a>(
    env: &Meter<'_>,
    l: Cv<'a>,
    f: impl for<'b> FnOnce(&'b Value) -> Result<Cv<'b>, RuntimeError>,
) -> Result<Cv<'a>, RuntimeError> {
    match l {
        Cow::Borrowed(v) => f(v),
        Cow::Owned(v) => match f(&v) {
            Ok(r) => env.own(r).map(Cow::Owned),
            Err(e) => Err(e),
        },
    }
}

fn compare(op: Comparator, l: &Value, r: &Value) -> Value {
    match op {
        Comparator::Eq => Value::Bool(values_equal(l, r)),
        Comparator::Ne => Value::Bool(!values_equal(l, r)),
        _ => {
            let (Some(a), Some(b)) = (l.as_f64(), r.as_f64()) else {
                return Value::Null;
            };
            Value::Bool(match op {
                Comparator::Lt => a < b,
                Comparator::Lte => a <= b,
                Comparator::Gt => a > b,
                _ => a >= b,
            })
        }
    }
}

fn slice(
    a: &[Value],
    start: Option<i64>,
    stop: Option<i64>,
    step: Option<i64>,
    env: &Meter<'_>,
) -> Result<Vec<Value>, RuntimeError> {
    let len = a.len() as i64;
    let step = step.unwrap_or(1);
    let cap = |v: i64, neg_default: i64| -> i64 { if v < 0 { (v + len).max(neg_default) } else { v.min(len) } };
    let (start, stop) = if step > 0 {
        (start.map(|s| cap(s, 0)).unwrap_or(0), stop.map(|s| cap(s, 0)).unwrap_or(len))
    } else {
        let capn = |v: i64| -> i64 { if v < 0 { (v + len).max(-1) } else { v.min(len - 1) } };
        (start.map(capn).unwrap_or(len - 1), stop.map(capn).unwrap_or(-1))
    };
    let mut out = Vec::new();
    let mut i = start;
    if step > 0 {
        while i < stop {
            if let Some(v) = a.get(i as usize) {
                out.push(env.own(Cow::Borrowed(v))?);
            }
            i += step;
        }
    } else {
        while i > stop {
            if i >= 0
                && let Some(v) = a.get(i as usize)
            {
                out.push(env.own(Cow::Borrowed(v))?);
            }
            i += step;
        }
    }
    Ok(out)
}

/// Evaluates an expression reference (`&expr`) on one element, as `sort_by` and friends do.
pub(crate) fn eval_expref(ast: &Ast, data: &Value, env: &Meter<'_>) -> Result<Value, RuntimeError> {
    eval(ast, data, env).and_then(|v| env.own(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    thread_local! {
        /// Evaluates without [`elements`]: the reference its results and charges must equal.
        pub(super) static NO_SHORTCUT: Cell<bool> = const { Cell::new(false) };
        /// How often the shortcut ran.
        pub(super) static TAKEN: Cell<usize> = const { Cell::new(0) };
    }

    /// Result and work charged, with or without the flattened-multiselect shortcut.
    fn run(src: &str, data: &Value, shortcut: bool) -> (Result<Value, RuntimeError>, u64) {
        NO_SHORTCUT.with(|f| f.set(!shortcut));
        let ast = crate::parser::parse(src, crate::Dialect::Kyverno).unwrap_or(Ast::Identity);
        let meter = Meter::new(&crate::NoEnv, crate::Dialect::Kyverno);
        let out = eval(&ast, data, &meter).map(Cow::into_owned);
        NO_SHORTCUT.with(|f| f.set(false));
        (out, meter.left.get())
    }

    #[test]
    fn flattened_multiselects_read_in_place_give_the_same_results_and_charges() {
        let data = json!({"spec": {
            "containers": [{"name": "a", "sc": {"add": ["X", "Y"]}}, {"name": "b"}],
            "initContainers": [{"name": "i", "sc": {"add": ["Z"]}}],
            "one": {"name": "o"},
            "empty": [],
            "nil": null,
            "n": 3
        }});
        let cases = [
            "[spec][]",
            "spec.[n][]",
            "spec.[containers, initContainers][]",
            "spec.[containers, initContainers][].name",
            "spec.[containers, initContainers, ephemeral][].sc.add[]",
            "spec.[containers, one, n, nil, empty][]",
            "spec.[containers, one][].name",
            "spec.[length(containers), containers][]",
            "spec.[containers[].name, initContainers[].name][]",
            "[spec.containers, spec.initContainers][].name",
            "nothing.[a, b][]",
            "nothing.[a, b][].c",
            "spec.nil.[a][]",
            "spec.nil.[a][].b",
            "spec.[containers, initContainers][] | length(@)",
            "spec.[containers][][]",
        ];
        for src in cases {
            let with = run(src, &data, true);
            let without = run(src, &data, false);
            assert_eq!(with, without, "{src}");
        }
        // The shortcut is taken where it applies, and only there.
        let taken = |src: &str| {
            TAKEN.with(|n| n.set(0));
            let _ = run(src, &data, true);
            TAKEN.with(Cell::get)
        };
        assert_eq!(taken("spec.[containers, initContainers][].name"), 1);
        assert_eq!(taken("spec.[containers, initContainers][]"), 1);
        assert_eq!(taken("spec.containers[].name"), 0);
        assert_eq!(taken("length(spec).[a][]"), 0);
    }

    /// Items as a list and work charged, through [`items`].
    fn run_items(src: &str, data: &Value) -> (Result<Value, RuntimeError>, u64, usize) {
        let ast = crate::parser::parse(src, crate::Dialect::Kyverno).unwrap_or(Ast::Identity);
        let meter = Meter::new(&crate::NoEnv, crate::Dialect::Kyverno);
        let mut borrowed = 0;
        let out = items(&ast, data, &meter).map(|found| match found {
            Items::List(l) => {
                borrowed = l.iter().filter(|c| matches!(c, Cow::Borrowed(_))).count();
                Value::Array(l.into_iter().map(Cow::into_owned).collect())
            }
            Items::Other(v) => {
                assert!(!v.is_array(), "{src}: a list given as one item");
                v.into_owned()
            }
        });
        (out, meter.left.get(), borrowed)
    }

    /// A foreach's list read element by element gives what evaluating it gives, charged the
    /// same, with the elements a flatten picks from the data borrowed.
    #[test]
    fn items_are_the_result_list_with_the_same_charges() {
        let data = json!({"spec": {
            "containers": [{"name": "a", "sc": {"add": ["X"]}}, {"name": "b"}, null],
            "initContainers": [{"name": "i"}],
            "nested": [[1, 2], 3, [[4]]],
            "one": {"name": "o"},
            "nil": null,
            "n": 3
        }});
        let cases = [
            ("spec.[ephemeralContainers, initContainers, containers][]", 3),
            ("spec.[containers, one, n, nil][]", 4),
            ("spec.containers[]", 2),
            ("spec.nested[]", 4),
            ("spec.containers", 3),
            ("spec.containers[].name", 0),
            ("spec.[containers[].name][]", 0),
            ("[spec.containers, spec.initContainers][]", 3),
            ("spec.one", 0),
            ("spec.nil[]", 0),
            ("spec.n[]", 0),
            ("nothing.[a][]", 0),
            ("spec.nothing", 0),
            ("spec.containers[?name == 'a']", 0),
            ("to_array(spec.n)", 0),
        ];
        for (src, borrowed) in cases {
            let (out, left, b) = run_items(src, &data);
            let (want, want_left) = run(src, &data, true);
            assert_eq!((out, left), (want, want_left), "{src}");
            assert_eq!(b, borrowed, "{src}: elements borrowed");
        }
    }
}
