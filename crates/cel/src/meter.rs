//! The runtime cost limit of one evaluation by the `cel` crate, in the spirit of Kubernetes'
//! `CostLimit`: every loop pays for its iterations and for what each iteration builds, and a
//! cancelled evaluation stops at its next payment.
//!
//! The estimate made before an evaluation (`Expr::admit`: the widest input list to the power
//! of the loop depth) cannot see lists an expression builds itself (`split()`, `+`, literals),
//! and the crate has no hook inside its loops. So each comprehension is instrumented when the
//! expression compiles: its range becomes `@loop_range(@meter, range)`, which pays the range's
//! size before the loop runs (an inner loop pays again each time it starts), and its
//! per-element expression becomes `@loop_step(@meter, x)`, which pays one plus the size of
//! what the element built (a string's characters, a list's or map's entries). The wrapping
//! keeps the shapes the crate's fast paths recognise (`@result && x`, `@result + [x]`,
//! `c ? @result + [x] : @result`). Over [`crate::MAX_RUNTIME_COST`] units in all, or once the
//! cancel flag is set, the evaluation fails: an error, never a partial answer.
//!
//! The direct evaluator (`fast`) runs the expression as written, with its own step count.

use cel::common::ast::{CallExpr, Expr, IdedExpr};
use cel::common::types::DYN_TYPE as DYN;
use cel::common::value::{CowVal, Val};
use cel::objects::Opaque;
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) const METER_VAR: &str = "@meter";
const RANGE_FN: &str = "@loop_range";
const STEP_FN: &str = "@loop_step";
const COND_FN: &str = "@loop_cond";

/// What one evaluation has spent, and the caller's cancel flag.
#[derive(Debug)]
pub(crate) struct Meter {
    spent: AtomicU64,
    limit: u64,
    cancel: Option<Arc<AtomicBool>>,
}

impl Meter {
    pub(crate) fn new(limit: u64, cancel: Option<Arc<AtomicBool>>) -> Meter {
        Meter { spent: AtomicU64::new(0), limit, cancel }
    }

    fn pay(&self, units: u64) -> Result<(), ExecutionError> {
        if self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(ExecutionError::function_error("loop", "the evaluation was cancelled (its deadline passed)"));
        }
        let spent = self.spent.fetch_add(units, Ordering::Relaxed).saturating_add(units);
        if spent > self.limit {
            return Err(ExecutionError::function_error(
                "loop",
                format!(
                    "the expression's runtime cost exceeds the budget of {} (loop iterations and what they build)",
                    self.limit
                ),
            ));
        }
        Ok(())
    }
}

/// The meter, as the opaque value bound to [`METER_VAR`].
#[derive(Debug, Clone)]
pub(crate) struct MeterValue(pub(crate) Arc<Meter>);

impl PartialEq for MeterValue {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for MeterValue {}

impl Opaque for MeterValue {
    fn runtime_type_name(&self) -> &str {
        "verno.meter"
    }
}

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// The size a value counts for: its characters, elements or entries.
fn size(v: &dyn Val) -> u64 {
    v.as_sizer().map(|s| u64::try_from(*s.size().inner()).unwrap_or(0)).unwrap_or(0)
}

/// Pays `units(value)` to the meter in the first argument; returns the value untouched.
fn metered<'b, 'v>(mut args: Args<'b, 'v>, units: impl Fn(&dyn Val) -> u64) -> Ret<'b, 'v> {
    let value = args.pop().ok_or_else(|| ExecutionError::function_error("loop", "no value"))?;
    let meter = args.first().and_then(|m| match Value::try_from(&**m) {
        Ok(Value::Opaque(o)) => o.downcast_ref::<MeterValue>().map(|m| m.0.clone()),
        _ => None,
    });
    // Evaluated without a meter (none bound): nothing to pay.
    if let Some(m) = meter {
        m.pay(units(value.as_ref()))?;
    }
    Ok(value)
}

fn loop_range<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    metered(args, size)
}

fn loop_step<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    metered(args, |v| 1 + size(v))
}

/// Pays nothing, but fails once the meter is spent or cancelled: `all()` and `exists()` keep
/// looping past an element's error (a later element may still decide the result), so their
/// loop condition is where a spent meter ends the loop.
fn loop_cond<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    metered(args, |_| 0)
}

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(RANGE_FN, &format!("{RANGE_FN}_2"), vec![DYN, DYN], loop_range)?;
    env.add_overload(STEP_FN, &format!("{STEP_FN}_2"), vec![DYN, DYN], loop_step)?;
    env.add_overload(COND_FN, &format!("{COND_FN}_2"), vec![DYN, DYN], loop_cond)?;
    Ok(())
}

/// Instruments every comprehension below `e` (see the module's comment); new nodes get ids
/// above `next_id`, which is advanced.
pub(crate) fn instrument(e: &mut IdedExpr, next_id: &mut u64) {
    for child in crate::rewrite::children_mut(e) {
        instrument(child, next_id);
    }
    let Expr::Comprehension(c) = &mut e.expr else { return };
    // `cel.bind`-style comprehensions over an empty literal range do not loop.
    if matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty()) {
        return;
    }
    wrap(&mut c.iter_range, RANGE_FN, next_id);
    // A literal condition (`map`, `filter`) is left as it is: the crate's append path needs it,
    // and those loops stop at an element's first error anyway.
    if !matches!(c.loop_cond.expr, Expr::Literal(_)) {
        wrap(&mut c.loop_cond, COND_FN, next_id);
    }
    let accu = c.accu_var.clone();
    let is_accu = |x: &IdedExpr| matches!(&x.expr, Expr::Ident(n) if *n == accu);
    // The per-element expression, wrapped where the crate's fast paths still see their shape.
    enum Spot {
        Arg(usize),
        ListElement,
        Whole,
    }
    let spot = match &c.loop_step.expr {
        Expr::Call(call) if call.target.is_none() => match (call.func_name.as_str(), call.args.as_slice()) {
            // `@result && x`, `@result || x` (all, exists).
            ("_&&_" | "_||_", [a, _]) if is_accu(a) => Spot::Arg(1),
            // `@result + [x]` (map).
            ("_+_", [a, list]) if is_accu(a) && matches!(&list.expr, Expr::List(l) if l.elements.len() == 1) => {
                Spot::ListElement
            }
            // `c ? step : @result` (filter, exists_one).
            ("_?_:_", [_, _, otherwise]) if is_accu(otherwise) => Spot::Arg(0),
            _ => Spot::Whole,
        },
        _ => Spot::Whole,
    };
    let step = &mut c.loop_step;
    let target = match (spot, &mut step.expr) {
        (Spot::Arg(i), Expr::Call(call)) => call.args.get_mut(i),
        (Spot::ListElement, Expr::Call(call)) => match call.args.get_mut(1).map(|l| &mut l.expr) {
            Some(Expr::List(l)) => l.elements.first_mut(),
            _ => None,
        },
        _ => None,
    };
    let target = match target {
        Some(t) => t,
        None => step,
    };
    wrap(target, STEP_FN, next_id);
}

/// Replaces `x` by `f(@meter, x)`.
fn wrap(x: &mut IdedExpr, f: &str, next_id: &mut u64) {
    let mut fresh = || {
        *next_id += 1;
        *next_id
    };
    let meter = IdedExpr { id: fresh(), expr: Expr::Ident(METER_VAR.to_string()) };
    let id = fresh();
    let inner = std::mem::replace(x, IdedExpr { id, expr: Expr::Ident(String::new()) });
    x.expr = Expr::Call(CallExpr { func_name: f.to_string(), target: None, args: vec![meter, inner] });
}

/// The largest node id below `e`.
pub(crate) fn max_id(e: &IdedExpr) -> u64 {
    crate::rewrite::children(e).into_iter().map(max_id).fold(e.id, u64::max)
}
