//! cel-go's optional library, version 2 (`cel.OptionalTypes`, in every Kyverno CEL kind), where
//! the `cel` crate stops at version 1: `list.first()` and `list.last()` (an optional of the
//! element, none for an empty list), and `optional.unwrap(list)` / `list.unwrapOpt()` (the
//! values of a list of optionals, nones left out).

use crate::tagged::{Args, Ret, kind, values};
use cel::common::types::{CelList, CelOptional, LIST_TYPE};
use cel::common::value::{BuiltinRef, CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError, Value};

/// The first or last element of the list receiver, as an optional (the element is shared, not
/// copied, when it is a list or map from the request).
fn end<'b, 'v>(args: &[CowVal<'b, 'v>], f: &str, first: bool) -> Ret<'b, 'v> {
    let Some(BuiltinRef::List(list)) = args.first().map(|l| l.as_builtin()) else {
        let v = values(args)?;
        let got = v.first().map_or("nothing", kind);
        return Err(ExecutionError::function_error(f, format!("expected a list, got {got}")));
    };
    let item = if first { list.inner().first() } else { list.inner().last() };
    Ok(CowVal::owned(match item {
        Some(x) => CelOptional::of(x.clone_as_boxed()),
        None => CelOptional::none(),
    }))
}

fn first<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    end(&args, "first", true)
}

fn last<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    end(&args, "last", false)
}

/// The values of the optionals in the list argument; an element that is not an optional is an
/// error, worded as cel-go words it.
fn unwrap<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "optional.unwrap";
    let Some(BuiltinRef::List(list)) = args.first().map(|l| l.as_builtin()) else {
        return Err(ExecutionError::function_error(F, "expected a list of optionals"));
    };
    let mut out: Vec<Box<dyn Val + 'v>> = Vec::new();
    for x in list.inner() {
        let Some(opt) = x.downcast_ref::<CelOptional>() else {
            let shown = Value::try_from(x.as_ref()).map(|v| show(&v)).unwrap_or_else(|_| "value".into());
            return Err(ExecutionError::function_error(F, format!("value {shown} is not optional")));
        };
        if let Some(inner) = opt.option() {
            out.push(inner.clone_as_boxed());
        }
    }
    Ok(CowVal::owned(CelList::from(out)))
}

/// A value as Go's `%v` shows a scalar; others by their type.
fn show(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::String(s) => s.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "NULL_VALUE".into(),
        other => kind(other).into(),
    }
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("first", "list_first", LIST_TYPE, vec![], first)?;
    env.add_member_overload("last", "list_last", LIST_TYPE, vec![], last)?;
    env.add_overload("optional.unwrap", "optional_unwrap", vec![LIST_TYPE], unwrap)?;
    env.add_member_overload("unwrapOpt", "optional_unwrapOpt", LIST_TYPE, vec![], unwrap)?;
    Ok(())
}
