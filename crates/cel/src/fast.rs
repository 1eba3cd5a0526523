//! A direct evaluator for the common part of CEL, reading the request's JSON where it is.
//!
//! The `cel` crate's interpreter converts every input to its own values first (a boxed value,
//! a `String` and a SipHash map entry per JSON node) and pays for scopes, qualified-name
//! resolution and overload look-ups by name at every node: the 17 Pod Security policies took
//! 3.4 times as long as their pattern versions (`docs/benchmarks.md`). Nothing in the crate
//! evaluates over borrowed data, so this module compiles the crate's own parsed (and
//! macro-expanded) AST once into a tree of its own ([`Node`]) and walks that over the inputs'
//! `serde_json::Value`s, borrowing them.
//!
//! It covers a subset: field selection (plain, optional `?.`, `has()`), `orValue`,
//! comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`), logic, comparisons of two
//! values of one scalar type, `in`, `+`, `-`, `*` on ints (checked), list and string
//! concatenation, indexing, `size`, `startsWith`, `endsWith`, `contains`, list and empty-map
//! literals. It never guesses: whatever it does not cover, and every error (a missing key,
//! two operand types CEL's rules would have to settle, an overflow, more built than the
//! crate's result budget), is [`Declined`], and the caller evaluates the expression with the
//! crate instead. So an answer from here is the
//! answer the crate gives (a differential test holds the two together), and any expression
//! still gets the crate's answer and error message.

use cel::IdedExpr;
use cel::common::ast::{Expr, LiteralValue, operators};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::rc::Rc;

/// The expression needs the crate's interpreter (see the module's documentation).
#[derive(Debug, PartialEq)]
pub(crate) struct Declined;

type R<T> = Result<T, Declined>;

/// A value during evaluation: JSON borrowed from the inputs, or built here.
#[derive(Clone, Debug)]
pub(crate) enum V<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Str(Cow<'a, str>),
    /// A JSON object of the inputs (or the empty map literal).
    Map(&'a Map<String, Value>),
    /// A JSON array of the inputs.
    JList(&'a [Value]),
    /// A list built here.
    List(Rc<Vec<V<'a>>>),
    /// An optional: `Some` holds the value.
    Opt(Option<Rc<V<'a>>>),
}

static EMPTY_MAP: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);

/// JSON as CEL sees it, with Kubernetes' number rule (as `json_val` converts): integral
/// numbers are `int` (`uint` only beyond `int`'s range), others `double`.
pub(crate) fn from_json(v: &Value) -> V<'_> {
    match v {
        Value::Null => V::Null,
        Value::Bool(b) => V::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => V::Int(i),
            (None, Some(u)) => V::UInt(u),
            _ => V::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => V::Str(Cow::Borrowed(s)),
        Value::Array(a) => V::JList(a),
        Value::Object(m) => V::Map(m),
    }
}

/// An expression compiled for the direct evaluator: operators and functions resolved once,
/// identifiers sorted into comprehension variables, inputs and composition variables.
#[derive(Debug)]
pub(crate) enum Node {
    Lit(Lit),
    EmptyMap,
    /// A comprehension's iteration variable or accumulator.
    Local(String),
    /// An input (`object`, `request`, ...).
    Input(String),
    /// A composition variable (`variables.<name>`).
    Var(String),
    Select(Box<Node>, String),
    Has(Box<Node>, String),
    OptSelect(Box<Node>, String),
    List(Vec<Node>),
    Comp(Box<Comp>),
    Cond(Box<[Node; 3]>),
    And(Box<[Node; 2]>),
    Or(Box<[Node; 2]>),
    Not(Box<Node>),
    NotStrictlyFalse(Box<Node>),
    Eq(Box<[Node; 2]>),
    Ne(Box<[Node; 2]>),
    Cmp(std::cmp::Ordering, bool, Box<[Node; 2]>),
    In(Box<[Node; 2]>),
    /// `a + b`; `append`: `a` is a comprehension's accumulator, appended to in place.
    Add(Box<[Node; 2]>, bool),
    Sub(Box<[Node; 2]>),
    Mul(Box<[Node; 2]>),
    Neg(Box<Node>),
    Index(Box<[Node; 2]>),
    /// `target.orValue(default)`, as `[target, default]`.
    OrValue(Box<[Node; 2]>),
    HasValue(Box<Node>),
    Size(Box<Node>),
    /// `target.startsWith(arg)` and the like, as `[target, arg]`.
    Str(StrFn, Box<[Node; 2]>),
}

#[derive(Debug)]
pub(crate) enum Lit {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Str(String),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum StrFn {
    StartsWith,
    EndsWith,
    Contains,
}

#[derive(Debug)]
pub(crate) struct Comp {
    range: Node,
    iter_var: String,
    accu_var: String,
    init: Node,
    cond: Node,
    step: Node,
    result: Node,
}

/// Compiles `e` for the direct evaluator; `None` when it uses anything the evaluator does not
/// cover (then the crate evaluates it, always).
pub(crate) fn compile(e: &IdedExpr) -> Option<Node> {
    compile_in(e, &mut Vec::new())
}

fn compile_in(e: &IdedExpr, locals: &mut Vec<String>) -> Option<Node> {
    let two = |a: &IdedExpr, b: &IdedExpr, locals: &mut Vec<String>| -> Option<Box<[Node; 2]>> {
        Some(Box::new([compile_in(a, locals)?, compile_in(b, locals)?]))
    };
    Some(match &e.expr {
        Expr::Literal(l) => Node::Lit(match l {
            LiteralValue::Boolean(b) => Lit::Bool(*b.inner()),
            LiteralValue::Int(i) => Lit::Int(*i.inner()),
            LiteralValue::UInt(u) => Lit::UInt(*u.inner()),
            LiteralValue::Double(d) => Lit::Double(*d.inner()),
            LiteralValue::String(s) => Lit::Str(s.inner().to_string()),
            LiteralValue::Null => Lit::Null,
            LiteralValue::Bytes(_) => return None,
        }),
        Expr::Ident(name) if locals.iter().any(|l| l == name) => Node::Local(name.clone()),
        Expr::Ident(name) => match name.strip_prefix("@var:") {
            Some(var) => Node::Var(var.to_string()),
            // `variables` as a whole, the host and other internal names: the crate's.
            None if name == "variables" || name.starts_with('@') => return None,
            None => Node::Input(name.clone()),
        },
        Expr::Select(sel) => {
            let operand = Box::new(compile_in(&sel.operand, locals)?);
            if sel.test { Node::Has(operand, sel.field.clone()) } else { Node::Select(operand, sel.field.clone()) }
        }
        Expr::List(l) if l.optional_indices.is_empty() => {
            Node::List(l.elements.iter().map(|x| compile_in(x, locals)).collect::<Option<_>>()?)
        }
        Expr::Map(m) if m.entries.is_empty() => Node::EmptyMap,
        Expr::Comprehension(c) if c.iter_var2.is_none() => {
            let range = compile_in(&c.iter_range, locals)?;
            let init = compile_in(&c.accu_init, locals)?;
            locals.push(c.accu_var.clone());
            let cond = compile_in(&c.loop_cond, locals);
            let result = compile_in(&c.result, locals);
            locals.push(c.iter_var.clone());
            let step = compile_in(&c.loop_step, locals);
            locals.truncate(locals.len() - 2);
            Node::Comp(Box::new(Comp {
                range,
                iter_var: c.iter_var.clone(),
                accu_var: c.accu_var.clone(),
                init,
                cond: cond?,
                step: step?,
                result: result?,
            }))
        }
        Expr::Call(c) => {
            use std::cmp::Ordering::*;
            let name = c.func_name.as_str();
            match (c.target.as_deref(), c.args.as_slice()) {
                (None, [x, a, b]) if name == operators::CONDITIONAL => {
                    Node::Cond(Box::new([compile_in(x, locals)?, compile_in(a, locals)?, compile_in(b, locals)?]))
                }
                (None, [a, b]) => match name {
                    operators::LOGICAL_AND => Node::And(two(a, b, locals)?),
                    operators::LOGICAL_OR => Node::Or(two(a, b, locals)?),
                    operators::EQUALS => Node::Eq(two(a, b, locals)?),
                    operators::NOT_EQUALS => Node::Ne(two(a, b, locals)?),
                    operators::LESS => Node::Cmp(Less, true, two(a, b, locals)?),
                    operators::LESS_EQUALS => Node::Cmp(Greater, false, two(a, b, locals)?),
                    operators::GREATER => Node::Cmp(Greater, true, two(a, b, locals)?),
                    operators::GREATER_EQUALS => Node::Cmp(Less, false, two(a, b, locals)?),
                    operators::IN => Node::In(two(a, b, locals)?),
                    operators::ADD => {
                        // `@result + [x]` in a loop: the accumulator is appended to in place.
                        let append = matches!(&a.expr, Expr::Ident(n) if n.starts_with('@') && locals.contains(n));
                        Node::Add(two(a, b, locals)?, append)
                    }
                    operators::SUBSTRACT => Node::Sub(two(a, b, locals)?),
                    operators::MULTIPLY => Node::Mul(two(a, b, locals)?),
                    operators::INDEX => Node::Index(two(a, b, locals)?),
                    operators::OPT_SELECT => match &b.expr {
                        Expr::Literal(LiteralValue::String(f)) => {
                            Node::OptSelect(Box::new(compile_in(a, locals)?), f.inner().to_string())
                        }
                        _ => return None,
                    },
                    _ => return None,
                },
                (None, [a]) => match name {
                    operators::LOGICAL_NOT => Node::Not(Box::new(compile_in(a, locals)?)),
                    operators::NOT_STRICTLY_FALSE => Node::NotStrictlyFalse(Box::new(compile_in(a, locals)?)),
                    operators::NEGATE => Node::Neg(Box::new(compile_in(a, locals)?)),
                    "size" => Node::Size(Box::new(compile_in(a, locals)?)),
                    _ => return None,
                },
                // A target that spells a name (`optional.of(x)`, `math.greatest(…)`) may be a
                // qualified function: the crate's.
                (Some(t), _) if !target_is_value(t, locals) => return None,
                (Some(t), [d]) if name == "orValue" => Node::OrValue(two(t, d, locals)?),
                (Some(t), []) if name == "hasValue" => Node::HasValue(Box::new(compile_in(t, locals)?)),
                (Some(t), []) if name == "size" => Node::Size(Box::new(compile_in(t, locals)?)),
                (Some(t), [a]) => {
                    let f = match name {
                        "startsWith" => StrFn::StartsWith,
                        "endsWith" => StrFn::EndsWith,
                        "contains" => StrFn::Contains,
                        _ => return None,
                    };
                    Node::Str(f, two(t, a, locals)?)
                }
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// Whether a call's target is a value rather than (possibly) a qualified function name: the
/// crate resolves `a.b.f(x)` as the function `a.b.f` when one is declared. Every name it
/// declares starts with something no input is called (`optional`, `math`, `strings`, ...);
/// targets rooted at an input, a variable or a comprehension variable are values.
fn target_is_value(t: &IdedExpr, locals: &[String]) -> bool {
    let mut e = t;
    loop {
        match &e.expr {
            Expr::Select(s) => e = &s.operand,
            Expr::Ident(n) => {
                return locals.contains(n)
                    || n.starts_with("@var:")
                    || matches!(
                        n.as_str(),
                        "object" | "oldObject" | "request" | "params" | "namespaceObject" | "exceptions"
                    );
            }
            _ => return true,
        }
    }
}

/// The values the inputs have for one evaluation.
pub(crate) trait Inputs {
    fn input(&self, name: &str) -> Option<&Value>;
    fn variable(&self, name: &str) -> Option<&Value>;
}

/// Where identifiers are looked up: the comprehension variables in scope (innermost last),
/// then the caller's inputs.
pub(crate) struct Scope<'a> {
    locals: Vec<(&'a str, V<'a>)>,
    inputs: &'a dyn Inputs,
    /// What may still be built: list elements and string bytes (see [`BUILD_BUDGET`]).
    budget: usize,
    /// Loop iterations still allowed (the crate's runtime limit, `crate::MAX_ITERATIONS`);
    /// past it the crate takes over, and its meter gives the error.
    steps: u64,
}

impl<'a> Scope<'a> {
    pub(crate) fn new(inputs: &'a dyn Inputs) -> Self {
        Scope { locals: Vec::new(), inputs, budget: BUILD_BUDGET, steps: crate::MAX_ITERATIONS as u64 }
    }

    /// Counts `n` elements or bytes built; past the budget the crate takes over.
    fn build(&mut self, n: usize) -> R<()> {
        self.budget = self.budget.checked_sub(n).ok_or(Declined)?;
        Ok(())
    }

    fn local(&self, name: &str) -> R<V<'a>> {
        self.locals.iter().rev().find(|(n, _)| *n == name).map(|(_, v)| v.clone()).ok_or(Declined)
    }

    /// Takes a local out (leaving null), for an accumulator that is appended to in place.
    fn take_local(&mut self, name: &str) -> R<V<'a>> {
        let slot = self.locals.iter_mut().rev().find(|(n, _)| *n == name).ok_or(Declined)?;
        Ok(std::mem::replace(&mut slot.1, V::Null))
    }

    fn set_local(&mut self, name: &str, v: V<'a>) {
        if let Some(slot) = self.locals.iter_mut().rev().find(|(n, _)| *n == name) {
            slot.1 = v;
        }
    }
}

/// How many list elements and string bytes one evaluation may build here (what the crate's
/// result budget allows, `MAX_RESULT_BYTES`); an evaluation that would build more is left to
/// the crate and its budget. Loops are bounded before evaluation starts (`Expr::admit`).
const BUILD_BUDGET: usize = crate::MAX_RESULT_BYTES;

pub(crate) fn eval<'a>(n: &'a Node, s: &mut Scope<'a>) -> R<V<'a>> {
    match n {
        Node::Lit(l) => Ok(match l {
            Lit::Null => V::Null,
            Lit::Bool(b) => V::Bool(*b),
            Lit::Int(i) => V::Int(*i),
            Lit::UInt(u) => V::UInt(*u),
            Lit::Double(d) => V::Double(*d),
            Lit::Str(x) => V::Str(Cow::Borrowed(x)),
        }),
        Node::EmptyMap => Ok(V::Map(&EMPTY_MAP)),
        Node::Local(name) => s.local(name),
        Node::Input(name) => s.inputs.input(name).map(from_json).ok_or(Declined),
        Node::Var(name) => s.inputs.variable(name).map(from_json).ok_or(Declined),
        Node::Select(x, f) => select(eval(x, s)?, f, false),
        Node::Has(x, f) => select(eval(x, s)?, f, true),
        Node::OptSelect(x, f) => Ok(match eval(x, s)? {
            V::Opt(None) => V::Opt(None),
            V::Opt(Some(inner)) => opt_field(&inner, f),
            v => opt_field(&v, f),
        }),
        Node::List(items) => {
            s.build(items.len())?;
            Ok(V::List(Rc::new(items.iter().map(|x| eval(x, s)).collect::<R<Vec<_>>>()?)))
        }
        Node::Comp(c) => comprehension(c, s),
        Node::Cond(x) => {
            let [c, a, b] = &**x;
            if bool_of(&eval(c, s)?)? { eval(a, s) } else { eval(b, s) }
        }
        // `&&`, `||`: a first operand that decides is the answer; else the second must be a
        // boolean (what the crate answers when an operand fails or is not one is its own).
        Node::And(x) => {
            let [a, b] = &**x;
            if !bool_of(&eval(a, s)?)? {
                return Ok(V::Bool(false));
            }
            Ok(V::Bool(bool_of(&eval(b, s)?)?))
        }
        Node::Or(x) => {
            let [a, b] = &**x;
            if bool_of(&eval(a, s)?)? {
                return Ok(V::Bool(true));
            }
            Ok(V::Bool(bool_of(&eval(b, s)?)?))
        }
        Node::Not(a) => Ok(V::Bool(!bool_of(&eval(a, s)?)?)),
        Node::NotStrictlyFalse(a) => Ok(V::Bool(not_strictly_false(eval(a, s)?))),
        Node::Eq(x) => {
            let (a, b) = both(x, s)?;
            Ok(V::Bool(equal(&a, &b)?))
        }
        Node::Ne(x) => {
            let (a, b) = both(x, s)?;
            Ok(V::Bool(!equal(&a, &b)?))
        }
        // `Cmp(o, true, …)`: the ordering is `o`; `Cmp(o, false, …)`: it is not `o`.
        Node::Cmp(o, is, x) => {
            let (a, b) = both(x, s)?;
            Ok(V::Bool((order(&a, &b)? == *o) == *is))
        }
        Node::In(x) => {
            let (a, b) = both(x, s)?;
            contains(&b, &a).map(V::Bool)
        }
        Node::Add(x, append) => {
            let [a, b] = &**x;
            let lhs = match (append, a) {
                (true, Node::Local(name)) => s.take_local(name)?,
                _ => eval(a, s)?,
            };
            let rhs = eval(b, s)?;
            add(lhs, rhs, s)
        }
        Node::Sub(x) => match both(x, s)? {
            (V::Int(a), V::Int(b)) => a.checked_sub(b).map(V::Int).ok_or(Declined),
            _ => Err(Declined),
        },
        Node::Mul(x) => match both(x, s)? {
            (V::Int(a), V::Int(b)) => a.checked_mul(b).map(V::Int).ok_or(Declined),
            _ => Err(Declined),
        },
        Node::Neg(a) => match eval(a, s)? {
            V::Int(x) => x.checked_neg().map(V::Int).ok_or(Declined),
            V::Double(x) => Ok(V::Double(-x)),
            _ => Err(Declined),
        },
        Node::Index(x) => match both(x, s)? {
            (V::Map(m), V::Str(k)) => m.get(k.as_ref()).map(from_json).ok_or(Declined),
            (V::JList(l), V::Int(i)) => usize::try_from(i).ok().and_then(|i| l.get(i)).map(from_json).ok_or(Declined),
            (V::List(l), V::Int(i)) => usize::try_from(i).ok().and_then(|i| l.get(i)).cloned().ok_or(Declined),
            _ => Err(Declined),
        },
        // The crate evaluates a call's arguments before its target, the default included.
        Node::OrValue(x) => {
            let [t, d] = &**x;
            let d = eval(d, s)?;
            match eval(t, s)? {
                V::Opt(Some(v)) => Ok(v.as_ref().clone()),
                V::Opt(None) => Ok(d),
                _ => Err(Declined),
            }
        }
        Node::HasValue(t) => match eval(t, s)? {
            V::Opt(v) => Ok(V::Bool(v.is_some())),
            _ => Err(Declined),
        },
        Node::Size(x) => size(&eval(x, s)?),
        Node::Str(f, x) => {
            let [t, a] = &**x;
            let a = eval(a, s)?;
            match (eval(t, s)?, a) {
                (V::Str(x), V::Str(y)) => Ok(V::Bool(match f {
                    StrFn::StartsWith => x.starts_with(y.as_ref()),
                    StrFn::EndsWith => x.ends_with(y.as_ref()),
                    StrFn::Contains => x.contains(y.as_ref()),
                })),
                _ => Err(Declined),
            }
        }
    }
}

fn both<'a>(x: &'a [Node; 2], s: &mut Scope<'a>) -> R<(V<'a>, V<'a>)> {
    let [a, b] = x;
    Ok((eval(a, s)?, eval(b, s)?))
}

fn comprehension<'a>(c: &'a Comp, s: &mut Scope<'a>) -> R<V<'a>> {
    let init = eval(&c.init, s)?;
    let range = eval(&c.range, s)?;
    // Map keys come in the JSON's order, the crate's in its hash map's: only a loop whose
    // result cannot depend on the order (a boolean fold) runs over a map here.
    if matches!(range, V::Map(_)) && !matches!(init, V::Bool(_)) {
        return Err(Declined);
    }
    let items: Vec<V<'a>> = match &range {
        V::JList(a) => a.iter().map(from_json).collect(),
        V::List(l) => l.as_ref().clone(),
        V::Map(m) => m.keys().map(|k| V::Str(Cow::Borrowed(k.as_str()))).collect(),
        _ => return Err(Declined),
    };
    s.locals.push((c.accu_var.as_str(), init));
    let looped = (|| {
        for item in items {
            s.steps = s.steps.checked_sub(1).ok_or(Declined)?;
            if !not_strictly_false(eval(&c.cond, s)?) {
                break;
            }
            s.locals.push((c.iter_var.as_str(), item));
            let step = eval(&c.step, s);
            s.locals.pop();
            s.set_local(&c.accu_var, step?);
        }
        eval(&c.result, s)
    })();
    s.locals.pop();
    looped
}

/// `@not_strictly_false`: anything but `false` continues the loop (the crate's `try_bool`
/// of a non-boolean is an error, which it takes as true).
fn not_strictly_false(v: V<'_>) -> bool {
    !matches!(v, V::Bool(false))
}

/// `x.f` (or `has(x.f)` with `test`).
fn select<'a>(operand: V<'a>, field: &str, test: bool) -> R<V<'a>> {
    match (operand, test) {
        (V::Map(m), false) => m.get(field).map(from_json).ok_or(Declined),
        (V::Map(m), true) => Ok(V::Bool(m.contains_key(field))),
        // `.f` after an optional stays optional; `has()` on an empty one is false.
        (V::Opt(None), false) => Ok(V::Opt(None)),
        (V::Opt(None), true) => Ok(V::Bool(false)),
        (V::Opt(Some(inner)), test) => match &*inner {
            V::Map(m) if test => Ok(V::Bool(m.contains_key(field))),
            V::Map(m) => Ok(V::Opt(m.get(field).map(|v| Rc::new(from_json(v))))),
            _ => Err(Declined),
        },
        _ => Err(Declined),
    }
}

fn bool_of(v: &V<'_>) -> R<bool> {
    match v {
        V::Bool(b) => Ok(*b),
        _ => Err(Declined),
    }
}

/// `a in b`.
fn contains(b: &V<'_>, a: &V<'_>) -> R<bool> {
    match b {
        V::Map(m) => match a {
            V::Str(k) => Ok(m.contains_key(k.as_ref())),
            _ => Err(Declined),
        },
        V::JList(l) => {
            for x in l.iter() {
                if equal(a, &from_json(x))? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        V::List(l) => {
            for x in l.iter() {
                if equal(a, x)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        _ => Err(Declined),
    }
}

/// `.?f`: present → `optional.of`, absent (or not a map: the crate's failed index) → none.
fn opt_field<'a>(v: &V<'a>, field: &str) -> V<'a> {
    match v {
        V::Map(m) => V::Opt(m.get(field).map(|x| Rc::new(from_json(x)))),
        _ => V::Opt(None),
    }
}

fn size(v: &V<'_>) -> R<V<'static>> {
    let n = match v {
        V::Str(s) => s.chars().count(),
        V::JList(l) => l.len(),
        V::List(l) => l.len(),
        V::Map(m) => m.len(),
        _ => return Err(Declined),
    };
    i64::try_from(n).map(V::Int).map_err(|_| Declined)
}

fn add<'a>(a: V<'a>, b: V<'a>, s: &mut Scope<'a>) -> R<V<'a>> {
    let list_len = |v: &V| match v {
        V::JList(l) => Some(l.len()),
        V::List(l) => Some(l.len()),
        _ => None,
    };
    match (a, b) {
        (V::Int(x), V::Int(y)) => x.checked_add(y).map(V::Int).ok_or(Declined),
        (V::Str(x), V::Str(y)) => {
            s.build(x.len() + y.len())?;
            let mut out = x.into_owned();
            out.push_str(&y);
            Ok(V::Str(Cow::Owned(out)))
        }
        (a, b) => {
            let (Some(la), Some(lb)) = (list_len(&a), list_len(&b)) else { return Err(Declined) };
            // An appended-to accumulator is not built again: only what is added counts.
            s.build(if matches!(&a, V::List(l) if Rc::strong_count(l) == 1) { lb } else { la + lb })?;
            let mut out = match a {
                V::List(l) => Rc::try_unwrap(l).unwrap_or_else(|l| l.as_ref().clone()),
                V::JList(l) => l.iter().map(from_json).collect(),
                _ => return Err(Declined),
            };
            match b {
                V::List(l) => out.extend(l.iter().cloned()),
                V::JList(l) => out.extend(l.iter().map(from_json)),
                _ => return Err(Declined),
            }
            Ok(V::List(Rc::new(out)))
        }
    }
}

/// `==` between two values of one scalar type; anything else is left to the crate's rules
/// (heterogeneous numbers, lists, maps, optionals).
fn equal(a: &V<'_>, b: &V<'_>) -> R<bool> {
    Ok(match (a, b) {
        (V::Null, V::Null) => true,
        (V::Bool(x), V::Bool(y)) => x == y,
        (V::Int(x), V::Int(y)) => x == y,
        (V::UInt(x), V::UInt(y)) => x == y,
        (V::Double(x), V::Double(y)) => x == y,
        (V::Str(x), V::Str(y)) => x == y,
        _ => return Err(Declined),
    })
}

fn order(a: &V<'_>, b: &V<'_>) -> R<std::cmp::Ordering> {
    match (a, b) {
        (V::Int(x), V::Int(y)) => Ok(x.cmp(y)),
        (V::UInt(x), V::UInt(y)) => Ok(x.cmp(y)),
        (V::Double(x), V::Double(y)) => x.partial_cmp(y).ok_or(Declined),
        (V::Str(x), V::Str(y)) => Ok(x.as_ref().cmp(y.as_ref())),
        _ => Err(Declined),
    }
}

/// A result as JSON (a composition variable's value): the types whose JSON reads back as
/// the same CEL value. A `uint` would read back as an `int`, an optional has no JSON form.
pub(crate) fn to_json(v: &V<'_>) -> R<Value> {
    Ok(match v {
        V::Null => Value::Null,
        V::Bool(b) => Value::Bool(*b),
        V::Int(i) => Value::from(*i),
        V::Double(d) => serde_json::Number::from_f64(*d).map(Value::Number).ok_or(Declined)?,
        V::Str(s) => Value::String(s.to_string()),
        V::Map(m) => Value::Object((*m).clone()),
        V::JList(l) => Value::Array(l.to_vec()),
        V::List(l) => Value::Array(l.iter().map(to_json).collect::<R<_>>()?),
        V::UInt(_) | V::Opt(_) => return Err(Declined),
    })
}

/// Whether the crate's result and the direct evaluator's are the same CEL value (of the same
/// types): for the differential checks (`Expr::direct_disagreement`).
pub(crate) fn same(c: &cel::Value, f: &V<'_>) -> bool {
    let list = |c: &[cel::Value], f: Vec<V<'_>>| c.len() == f.len() && c.iter().zip(&f).all(|(c, f)| same(c, f));
    match (c, f) {
        (cel::Value::Null, V::Null) => true,
        (cel::Value::Bool(a), V::Bool(b)) => a == b,
        (cel::Value::Int(a), V::Int(b)) => a == b,
        (cel::Value::UInt(a), V::UInt(b)) => a == b,
        (cel::Value::Float(a), V::Double(b)) => a == b || (a.is_nan() && b.is_nan()),
        (cel::Value::String(a), V::Str(b)) => a.as_str() == b.as_ref(),
        (cel::Value::List(a), V::JList(b)) => list(a, b.iter().map(from_json).collect()),
        (cel::Value::List(a), V::List(b)) => list(a, b.as_ref().clone()),
        (cel::Value::Map(a), V::Map(b)) => {
            a.map.len() == b.len()
                && b.iter().all(|(k, v)| {
                    a.map
                        .get(&cel::objects::Key::String(std::sync::Arc::new(k.clone())))
                        .is_some_and(|c| same(c, &from_json(v)))
                })
        }
        (cel::Value::Opaque(o), V::Opt(f)) => match (o.downcast_ref::<cel::objects::OptionalValue>(), f) {
            (Some(c), None) => c.value().is_none(),
            (Some(c), Some(f)) => c.value().is_some_and(|c| same(c, f)),
            (None, _) => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Expr, Vars};
    use serde_json::json;

    fn inputs() -> Vec<serde_json::Value> {
        vec![
            json!({"metadata": {"name": "busybox", "namespace": "ns"},
                   "spec": {"containers": [{"name": "busybox", "image": "busybox", "command": ["sh"]}]}}),
            json!({"metadata": {"name": "hardened", "labels": {"app": "x", "tier": "web"},
                                "annotations": {"container.apparmor.security.beta.kubernetes.io/a": "runtime/default"}},
                   "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                            "hostNetwork": false, "replicas": 3, "ratio": 0.5,
                            "volumes": [{"name": "v", "configMap": {"name": "c"}}],
                            "containers": [{"name": "a", "image": "a:1", "ports": [{"containerPort": 80}],
                                            "securityContext": {"allowPrivilegeEscalation": false, "runAsUser": 1000,
                                                                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
                            "initContainers": [{"name": "i", "image": "i", "securityContext": {"privileged": false}}]}}),
            // Shapes that make CEL's rules matter: wrong types, nulls, mixed lists, big numbers.
            json!({"metadata": {"name": 7, "labels": null, "annotations": {"a": 1}},
                   "spec": {"securityContext": null, "hostNetwork": "yes", "replicas": 9223372036854775807u64,
                            "ratio": 1, "volumes": [{"hostPath": {"path": "/"}}, "x"],
                            "containers": [{"name": "a", "ports": [{"hostPort": 0.0}, {"hostPort": "80"}],
                                            "securityContext": {"capabilities": {"add": [1, "SYS_ADMIN"], "drop": "ALL"},
                                                                "runAsUser": 0, "procMount": null}},
                                           {"name": "b", "securityContext": {"privileged": true, "seLinuxOptions": {"type": "spc_t"}}}]}}),
            json!({"metadata": {}, "spec": {"containers": "not a list", "replicas": 18446744073709551615u64, "ratio": -0.0}}),
            json!({"spec": {"containers": [], "hostNetwork": true}}),
        ]
    }

    const EXPRESSIONS: &[&str] = &[
        "variables.containers.all(c, c.?securityContext.?capabilities.?add.orValue([]).all(a, a in ['AUDIT_WRITE', 'CHOWN', 'NET_BIND_SERVICE']))",
        "variables.containers.all(c, 'ALL' in c.?securityContext.?capabilities.?drop.orValue([]) && c.?securityContext.?capabilities.?add.orValue([]).all(a, a == 'NET_BIND_SERVICE'))",
        "!object.spec.?hostNetwork.orValue(false) && !object.spec.?hostPID.orValue(false)",
        "object.spec.?volumes.orValue([]).all(v, !has(v.hostPath))",
        "variables.containers.all(c, c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))",
        "variables.containers.all(c, c.?securityContext.?allowPrivilegeEscalation.orValue(true) == false)",
        "variables.containers.all(c, !c.?securityContext.?privileged.orValue(false))",
        "variables.containers.all(c, c.?securityContext.?procMount.orValue('Default') == 'Default')",
        "([object.spec.?securityContext.?seLinuxOptions.orValue({})] + variables.containers.map(c, c.?securityContext.?seLinuxOptions.orValue({}))).all(o, o.?type.orValue('') in ['', 'container_t'] && !has(o.user))",
        "object.spec.?securityContext.?runAsUser.orValue(1) != 0 && variables.containers.all(c, c.?securityContext.?runAsUser.orValue(1) != 0)",
        "variables.containers.all(c, c.?securityContext.?runAsNonRoot.orValue(object.spec.?securityContext.?runAsNonRoot.orValue(false)) == true)",
        "object.metadata.?annotations.orValue({}).all(k, !k.startsWith('container.apparmor') || object.metadata.annotations[k] == 'runtime/default' || object.metadata.annotations[k].startsWith('localhost/'))",
        "object.spec.containers.all(c, c.name == 'a')",
        "object.spec.containers.exists(c, c.name == 'a')",
        "object.spec.containers.exists_one(c, c.name == 'a')",
        "object.spec.containers.map(c, c.name)",
        "object.spec.containers.filter(c, c.name.startsWith('b'))",
        "object.spec.containers.map(c, c.name).size()",
        "size(object.spec.containers) > 0",
        "object.spec.containers[0].name",
        "object.spec.containers[5].name",
        "object.spec.containers[-1].name",
        "object.spec.x == null",
        "object.spec.x",
        "object.spec.?x.orValue(1) == 1",
        "object.spec.?x.hasValue()",
        "object.spec.?containers.hasValue()",
        "has(object.spec.x)",
        "has(object.spec.containers)",
        "has(object.spec.securityContext.runAsNonRoot)",
        "object.spec.?securityContext.runAsNonRoot",
        "has(object.metadata.labels.app)",
        "'app' in object.metadata.labels",
        "object.metadata.labels.all(k, k.size() < 5)",
        "object.metadata.labels.exists(k, object.metadata.labels[k] == 'web')",
        "object.metadata.labels.map(k, k)",
        "object.spec.replicas + 1 > 2",
        "object.spec.replicas * 2",
        "object.spec.replicas - 1",
        "-object.spec.replicas",
        "object.spec.ratio == 0.5",
        "object.spec.ratio < 1.0",
        "object.spec.ratio == 1",
        "-object.spec.ratio",
        "object.spec.hostNetwork == true",
        "object.spec.hostNetwork ? 1 : 2",
        "object.metadata.name + '-x'",
        "object.metadata.name.size()",
        "object.metadata.name.contains('box')",
        "object.metadata.name.endsWith('box')",
        "object.metadata.name < 'c'",
        "[1, 2, 3].map(x, x * 2)",
        "[1, 'a'].exists(x, x == 1)",
        "1 in [1, 2.0]",
        "1 == 1.0",
        "1 == 1u",
        "1u + 2u",
        "'abc' < 'abd'",
        "null == null",
        "[] + [1] == [1]",
        "{}.size() == 0",
        "variables.containers.size()",
        "variables.containers + object.spec.?initContainers.orValue([])",
        "object.spec.containers.all(c, c.?image.orValue('').contains(':'))",
        "object.spec.containers.all(c, c.?ports.orValue([]).all(p, p.containerPort < 1000))",
        "object.spec.containers.all(c, c.securityContext.runAsUser > 0)",
        "int(object.spec.replicas) == 3",
        "object.spec.x || true",
        "true || object.spec.x",
        "false && object.spec.x",
        "object.spec.x && false",
        "object.spec.hostNetwork || false",
        "!object.spec.hostNetwork",
        "request.object.metadata.name == object.metadata.name",
        "request.operation == 'CREATE'",
        "object.spec.?x.orValue(object.spec.y)",
        "object.spec.?containers.orValue([]).size()",
        "oldObject == null",
        "object.spec.containers.all(c, object.spec.containers.exists(d, d.name == c.name))",
        "object.spec.containers.map(c, c.name.startsWith('a'), c.name)",
        "object.spec.containers.map(c, object.spec.containers.map(d, d.name + c.name))",
        "object.spec.containers.filter(c, has(c.securityContext)).map(c, c.securityContext)",
        "object.spec.containers.exists_one(c, c.?securityContext.?privileged.orValue(false))",
        "object.spec.containers.map(c, c.?ports.orValue([])).all(ps, ps.all(p, p.?hostPort.orValue(0) == 0))",
        "namespaceObject.metadata.labels['env'] == 'prod'",
        "namespaceObject.?metadata.?labels.?env.orValue('none')",
        "params.allowed.exists(a, a == object.metadata.name)",
        "object.metadata.name in params.allowed",
        "params.limit > size(object.spec.containers)",
        "request.userInfo.username.startsWith('system:')",
        "request.?userInfo.?groups.orValue([]).exists(g, g == 'system:masters')",
        "object.spec.containers.all(c, c.name.size() <= 63 && c.name != '')",
        "[object.metadata.name, 'x'].map(n, n + n)",
        "object.spec.containers.map(c, 1).size() * 2 - 1",
        "object.spec.?volumes.orValue([]).filter(v, has(v.hostPath)).size() == 0",
        "optional.of(1).orValue(2) == 1",
        "math.greatest(1, 2) == 2",
        "object.spec.containers.exists(c, c.image.matches('^busy'))",
        "variables.missing == 1",
        "object.metadata.name.lowerAscii() == 'busybox'",
    ];

    /// The direct evaluator answers as the crate's interpreter wherever it answers at all,
    /// and covers the Pod Security expressions on ordinary Pods.
    #[test]
    fn direct_answers_are_the_crates() {
        let containers = Expr::compile(
            "object.spec.containers + object.spec.?initContainers.orValue([]) + object.spec.?ephemeralContainers.orValue([])",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (mut answered, mut declined) = (0, 0);
        for (i, object) in inputs().iter().enumerate() {
            let mut vars = Vars::default();
            vars.set_with_fields(
                "request",
                &json!({"operation": "CREATE", "userInfo": {"username": "system:admin", "groups": ["system:masters"]}}),
                &[("object", object)],
            );
            assert!(vars.set_field_of("object", "request", "object"));
            vars.set("oldObject", &serde_json::Value::Null);
            vars.set("namespaceObject", &json!({"metadata": {"name": "ns", "labels": {"env": "prod"}}}));
            vars.set("params", &json!({"allowed": ["busybox", "a", 1], "limit": 2}));
            vars.share_results();
            let _ = containers.eval_into_variable("containers", &mut vars);
            for src in EXPRESSIONS {
                let e = Expr::compile(src).unwrap_or_else(|e| panic!("{src}: {e}"));
                let slow = e.eval_cel(&vars);
                let direct = e.fast(&vars, |f| Some((slow.as_ref().map(|c| same(c, f)), format!("{f:?}"))));
                match (direct, &slow) {
                    (None, _) => declined += 1,
                    (Some((Ok(same), f)), Ok(c)) => {
                        assert!(same, "input {i}: {src}: the crate gives {c:?}, the direct evaluator {f}");
                        answered += 1;
                    }
                    (Some((_, f)), Err(c)) => {
                        panic!("input {i}: {src}: the crate fails ({c}), the direct evaluator gives {f}")
                    }
                    (Some((Err(_), _)), Ok(_)) => unreachable!(),
                }
            }
        }
        assert!(answered > declined, "answered {answered}, declined {declined}");
        // The Pod Security expressions on the first two (ordinary) Pods: all answered here.
        for object in inputs().iter().take(2) {
            let mut vars = Vars::default();
            vars.set_with_fields("request", &json!({}), &[("object", object)]);
            assert!(vars.set_field_of("object", "request", "object"));
            let _ = containers.eval_into_variable("containers", &mut vars);
            assert!(Inputs::variable(&vars, "containers").is_some());
            for src in EXPRESSIONS.iter().take(12) {
                let e = Expr::compile(src).unwrap_or_else(|e| panic!("{src}: {e}"));
                assert!(e.fast(&vars, |_| Some(())).is_some(), "{src} on {object}");
            }
        }
    }
}
