//! cel-go's two-variable comprehensions (`ext.TwoVarComprehensions`, in Kubernetes' CEL base
//! environment and so in every Kyverno CEL kind): over a list the variables are the index and
//! the element, over a map the key and the value.
//!
//! - `all(i, v, p)`, `exists(i, v, p)`, `existsOne(i, v, p)` (also `exists_one`)
//! - `transformList(i, v, [filter,] expr)` → a list
//! - `transformMap(k, v, [filter,] expr)` → a map with the same keys (indexes for a list)
//! - `transformMapEntry(k, v, [filter,] entry)` → the union of the single-entry maps `entry`
//!   gives (a key given twice is an error)
//!
//! The `cel` crate's comprehensions bind one variable, so each macro expands into a
//! one-variable comprehension over the target's keys (`@keys`: indexes of a list, keys of a
//! map), with the second variable bound to `target[key]` for each step, the target bound once
//! beforehand (as `cel.bind` binds, see `bind.rs`).

use cel::common::ast::operators;
use cel::common::ast::{CallExpr, ComprehensionExpr, Expr as Ast, IdedExpr, ListExpr, LiteralValue, MapExpr};
use cel::common::types::DYN_TYPE;
use cel::objects::{Key, Map};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

use crate::kube::{Args, Ret, ret, values};

/// `@keys(x)`: the indexes of a list, the keys of a map.
fn keys<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.first() {
        Some(Value::List(l)) => ret(Value::List(Arc::new((0..l.len() as i64).map(Value::Int).collect()))),
        Some(Value::Map(m)) => ret(Value::List(Arc::new(m.map.keys().map(|k| Value::from(k.clone())).collect()))),
        other => Err(ExecutionError::function_error(
            "comprehension",
            format!("a two-variable comprehension needs a list or a map, got {other:?}"),
        )),
    }
}

fn key_of(v: &Value) -> Result<Key, ExecutionError> {
    match v {
        Value::String(s) => Ok(Key::String(s.clone())),
        Value::Int(i) => Ok(Key::Int(*i)),
        Value::UInt(u) => Ok(Key::Uint(*u)),
        Value::Bool(b) => Ok(Key::Bool(*b)),
        other => Err(ExecutionError::function_error("transformMap", format!("{other:?} cannot be a map key"))),
    }
}

/// `@map_insert(m, k, v)`: `m` with `k` set to `v`.
fn map_insert<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.as_slice() {
        [Value::Map(m), k, v] => {
            let mut out: HashMap<Key, Value> = (*m.map).clone();
            out.insert(key_of(k)?, v.clone());
            ret(Value::Map(Map { map: Arc::new(out) }))
        }
        other => Err(ExecutionError::function_error("transformMap", format!("unexpected arguments {other:?}"))),
    }
}

/// `@map_merge(m, entry)`: `m` with the entries of the map `entry`, none of whose keys `m`
/// has (cel-go: "insert failed: key … already exists").
fn map_merge<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.as_slice() {
        [Value::Map(m), Value::Map(entry)] => {
            let mut out: HashMap<Key, Value> = (*m.map).clone();
            for (k, v) in entry.map.iter() {
                if out.insert(k.clone(), v.clone()).is_some() {
                    return Err(ExecutionError::function_error(
                        "transformMapEntry",
                        format!("insert failed: key {} already exists", crate::sdk::key_text(k)),
                    ));
                }
            }
            ret(Value::Map(Map { map: Arc::new(out) }))
        }
        [_, other] => Err(ExecutionError::function_error(
            "transformMapEntry",
            format!("the entry expression must give a map, got {other:?}"),
        )),
        other => Err(ExecutionError::function_error("transformMapEntry", format!("unexpected arguments {other:?}"))),
    }
}

/// What a macro builds its expression from.
struct Builder<'h, 'a> {
    h: &'h mut MacroExprHelper<'a>,
}

impl Builder<'_, '_> {
    fn ident(&mut self, n: &str) -> IdedExpr {
        self.h.next_expr(Ast::Ident(n.to_string()))
    }
    fn call(&mut self, f: &str, args: Vec<IdedExpr>) -> IdedExpr {
        self.h.next_expr(Ast::Call(CallExpr { func_name: f.to_string(), target: None, args }))
    }
    fn bool(&mut self, b: bool) -> IdedExpr {
        self.h.next_expr(Ast::Literal(LiteralValue::Boolean(b.into())))
    }
    fn int(&mut self, i: i64) -> IdedExpr {
        self.h.next_expr(Ast::Literal(LiteralValue::Int(i.into())))
    }
    fn list(&mut self, elements: Vec<IdedExpr>) -> IdedExpr {
        self.h.next_expr(Ast::List(ListExpr { elements, optional_indices: Vec::new() }))
    }
    fn empty_map(&mut self) -> IdedExpr {
        self.h.next_expr(Ast::Map(MapExpr { entries: Vec::new() }))
    }
    /// `body` with `name` bound to `init` (a comprehension over nothing, as `cel.bind`).
    fn bind(&mut self, name: &str, init: IdedExpr, body: IdedExpr) -> IdedExpr {
        let range = self.list(Vec::new());
        let cond = self.bool(false);
        let step = self.ident(name);
        self.h.next_expr(Ast::Comprehension(Box::new(ComprehensionExpr {
            iter_range: range,
            iter_var: "#unused".to_string(),
            iter_var2: None,
            accu_var: name.to_string(),
            accu_init: init,
            loop_cond: cond,
            loop_step: step,
            result: body,
        })))
    }
}

/// Which macro, with which arguments.
#[derive(Clone, Copy)]
enum Kind {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

const ACCU: &str = "@result";

/// `target.<kind>(k, v, [filter,] body)` expanded; `None` when the call is not one of these
/// (the identifiers are not plain names).
fn expand(
    h: &mut MacroExprHelper<'_>,
    kind: Kind,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Option<IdedExpr> {
    let name = |e: &IdedExpr| match &e.expr {
        Ast::Ident(n) => Some(n.clone()),
        _ => None,
    };
    let (k, v) = (name(args.first()?)?, name(args.get(1)?)?);
    let target = target.take()?;
    let mut rest = std::mem::take(args).into_iter().skip(2);
    let (filter, body) = match (rest.next(), rest.next()) {
        (Some(f), Some(b)) => (Some(f), b),
        (Some(b), None) => (None, b),
        _ => return None,
    };
    let mut b = Builder { h };
    // A name no source can spell, unique to this expansion (the target's node id).
    let t = format!("@t{}", target.id);
    // The second variable bound to `t[k]` around an expression of the step.
    let with_value = |b: &mut Builder<'_, '_>, e: IdedExpr| {
        let (ti, ki) = (b.ident(&t), b.ident(&k));
        let at = b.call(operators::INDEX, vec![ti, ki]);
        b.bind(&v, at, e)
    };
    let body = with_value(&mut b, body);
    let filter = filter.map(|f| with_value(&mut b, f));
    let accu = |b: &mut Builder<'_, '_>| b.ident(ACCU);
    let (init, cond, step, result) = match kind {
        Kind::All | Kind::Exists => {
            let all = matches!(kind, Kind::All);
            let init = b.bool(all);
            let a = accu(&mut b);
            let guard = if all { a } else { b.call(operators::LOGICAL_NOT, vec![a]) };
            let cond = b.call(operators::NOT_STRICTLY_FALSE, vec![guard]);
            let a = accu(&mut b);
            let step = b.call(if all { operators::LOGICAL_AND } else { operators::LOGICAL_OR }, vec![a, body]);
            (init, cond, step, accu(&mut b))
        }
        Kind::ExistsOne => {
            let init = b.int(0);
            let cond = b.bool(true);
            let (a, one) = (accu(&mut b), b.int(1));
            let plus = b.call(operators::ADD, vec![a, one]);
            let a = accu(&mut b);
            let step = b.call(operators::CONDITIONAL, vec![body, plus, a]);
            let (a, one) = (accu(&mut b), b.int(1));
            let result = b.call(operators::EQUALS, vec![a, one]);
            (init, cond, step, result)
        }
        Kind::TransformList | Kind::TransformMap | Kind::TransformMapEntry => {
            let init = if matches!(kind, Kind::TransformList) { b.list(Vec::new()) } else { b.empty_map() };
            let cond = b.bool(true);
            let a = accu(&mut b);
            let grown = match kind {
                Kind::TransformList => {
                    let one = b.list(vec![body]);
                    b.call(operators::ADD, vec![a, one])
                }
                Kind::TransformMap => {
                    let key = b.ident(&k);
                    b.call("@map_insert", vec![a, key, body])
                }
                _ => b.call("@map_merge", vec![a, body]),
            };
            let step = match filter {
                Some(f) => {
                    let a = accu(&mut b);
                    b.call(operators::CONDITIONAL, vec![f, grown, a])
                }
                None => grown,
            };
            (init, cond, step, accu(&mut b))
        }
    };
    let ti = b.ident(&t);
    let range = b.call("@keys", vec![ti]);
    let loop_ = b.h.next_expr(Ast::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: k,
        iter_var2: None,
        accu_var: ACCU.to_string(),
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result,
    })));
    Some(b.bind(&t, target, loop_))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("@keys", "@keys_dyn", vec![DYN_TYPE], keys)?;
    env.add_overload("@map_insert", "@map_insert_dyn", vec![DYN_TYPE, DYN_TYPE, DYN_TYPE], map_insert)?;
    env.add_overload("@map_merge", "@map_merge_dyn", vec![DYN_TYPE, DYN_TYPE], map_merge)?;
    let three_only =
        [("all", Kind::All), ("exists", Kind::Exists), ("existsOne", Kind::ExistsOne), ("exists_one", Kind::ExistsOne)];
    for (name, kind) in three_only {
        env.add_macro(Macro::receiver(name, 3, move |h, target, args| Ok(expand(h, kind, target, args))))?;
    }
    let three_or_four = [
        ("transformList", Kind::TransformList),
        ("transformMap", Kind::TransformMap),
        ("transformMapEntry", Kind::TransformMapEntry),
    ];
    for (name, kind) in three_or_four {
        for arity in [3, 4] {
            env.add_macro(Macro::receiver(name, arity, move |h, target, args| Ok(expand(h, kind, target, args))))?;
        }
    }
    Ok(())
}
