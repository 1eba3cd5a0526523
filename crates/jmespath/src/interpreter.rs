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
        /// Nodes of `v`, counting no further than `limit` (no allocation: this runs for every
        /// copied value; the depth is bounded by the data's, which serde_json caps at 128).
        fn nodes(v: &Value, limit: u64) -> u64 {
            let mut n = 1;
            let children: &mut dyn Iterator<Item = &Value> = match v {
                Value::Array(a) => &mut a.iter(),
                Value::Object(m) => &mut m.values(),
                _ => return 1,
            };
            for c in children {
                if n > limit {
                    break;
                }
                n += nodes(c, limit - n);
            }
            n
        }
        self.charge(nodes(v, self.left.get()))
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

pub(crate) fn eval<'a>(ast: &Ast, data: &'a Value, env: &Meter<'_>) -> Result<Cv<'a>, RuntimeError> {
    env.charge(1)?;
    match ast {
        Ast::Identity => Ok(Cow::Borrowed(data)),
        Ast::Field(name) => match data {
            Value::Object(m) => match m.get(name) {
                Some(v) => Ok(Cow::Borrowed(v)),
                None if env.dialect == crate::Dialect::Community => Ok(Cow::Borrowed(&NULL)),
                None => Err(RuntimeError::NotFound(name.clone())),
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
            let l = match (eval(lhs, data, env).unwrap_or(Cow::Borrowed(&NULL)), &**rhs) {
                // `x[]` over a list made for this expression: the elements are moved, not copied
                // (the budget is charged as for the general case below).
                (Cow::Owned(Value::Array(arr)), Ast::Identity) => {
                    let mut out = Vec::with_capacity(arr.len());
                    for el in arr {
                        if env.charge(1).is_err() || el.is_null() {
                            continue;
                        }
                        env.charge_copy(&el)?;
                        out.push(el);
                    }
                    return Ok(Cow::Owned(Value::Array(out)));
                }
                (l, _) => l,
            };
            let arr = match l.as_ref() {
                Value::Array(a) => a,
                _ => return Ok(Cow::Borrowed(&NULL)),
            };
            let mut out = Vec::with_capacity(arr.len());
            for el in arr {
                let r = eval(rhs, el, env).unwrap_or(Cow::Borrowed(&NULL));
                if !r.is_null() {
                    out.push(env.own(r)?);
                }
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::ValueProjection(lhs, rhs) => {
            let l = eval(lhs, data, env).unwrap_or(Cow::Borrowed(&NULL));
            let obj = match l.as_ref() {
                Value::Object(m) => m,
                _ => return Ok(Cow::Borrowed(&NULL)),
            };
            let mut out = Vec::with_capacity(obj.len());
            for el in obj.values() {
                let r = eval(rhs, el, env).unwrap_or(Cow::Borrowed(&NULL));
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
                let c = eval(cond, el, env).unwrap_or(Cow::Borrowed(&NULL));
                if is_truthy(&c) {
                    let r = eval(rhs, el, env).unwrap_or(Cow::Borrowed(&NULL));
                    if !r.is_null() {
                        out.push(env.own(r)?);
                    }
                }
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::Flatten(inner) => {
            let l = eval(inner, data, env).unwrap_or(Cow::Borrowed(&NULL));
            let mut out = Vec::new();
            match l {
                // A list made for this expression (`spec.[a, b][]`): its elements are moved, not
                // copied again (charged all the same, so the budget is the same either way).
                Cow::Owned(Value::Array(arr)) => {
                    out.reserve(arr.len());
                    for el in arr {
                        env.charge_copy(&el)?;
                        match el {
                            Value::Array(inner) => out.extend(inner),
                            other => out.push(other),
                        }
                    }
                }
                Cow::Borrowed(Value::Array(arr)) => {
                    out.reserve(arr.len());
                    for el in arr {
                        env.charge_copy(el)?;
                        match el {
                            Value::Array(inner) => out.extend(inner.iter().cloned()),
                            other => out.push(other.clone()),
                        }
                    }
                }
                _ => return Ok(Cow::Borrowed(&NULL)),
            }
            Ok(Cow::Owned(Value::Array(out)))
        }
        Ast::Literal(v) => env.own(Cow::Borrowed(v)).map(Cow::Owned),
        Ast::MultiList(items) => {
            if data.is_null() {
                return Ok(Cow::Borrowed(&NULL));
            }
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let v = eval(it, data, env).unwrap_or(Cow::Borrowed(&NULL));
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
                let v = eval(it, data, env).unwrap_or(Cow::Borrowed(&NULL));
                out.insert(k.clone(), env.own(v)?);
            }
            Ok(Cow::Owned(Value::Object(out)))
        }
        Ast::Call(f, args) => {
            let mut vals: Vec<Arg<'_, 'a>> = Vec::with_capacity(args.len());
            for a in args {
                match a {
                    Ast::Expref(inner) => vals.push(Arg::Expref(inner)),
                    other => vals.push(Arg::Value(eval(other, data, env).unwrap_or(Cow::Borrowed(&NULL)))),
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
            let v = eval(inner, data, env).unwrap_or(Cow::Borrowed(&NULL));
            Ok(Cow::Owned(Value::Bool(!is_truthy(&v))))
        }
        Ast::And(a, b) => {
            let l = eval(a, data, env).unwrap_or(Cow::Borrowed(&NULL));
            if !is_truthy(&l) {
                return Ok(l);
            }
            Ok(eval(b, data, env).unwrap_or(Cow::Borrowed(&NULL)))
        }
        Ast::Or(a, b) => {
            let l = eval(a, data, env).unwrap_or(Cow::Borrowed(&NULL));
            if is_truthy(&l) {
                return Ok(l);
            }
            Ok(eval(b, data, env).unwrap_or(Cow::Borrowed(&NULL)))
        }
        Ast::Compare(op, a, b) => {
            let l = eval(a, data, env).unwrap_or(Cow::Borrowed(&NULL));
            let r = eval(b, data, env).unwrap_or(Cow::Borrowed(&NULL));
            Ok(Cow::Owned(compare(*op, &l, &r)))
        }
        Ast::Pipe(a, b) => {
            let l = eval(a, data, env).unwrap_or(Cow::Borrowed(&NULL));
            chain(env, l, |v| eval(b, v, env))
        }
    }
}

/// Evaluates `f` on a value that may be borrowed from the input or owned by this call.
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
