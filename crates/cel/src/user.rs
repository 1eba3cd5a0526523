//! Kyverno's `user` library: `parseServiceAccount(username)` (also `user.parseServiceAccount`)
//! reads a service account's username, `system:serviceaccount:<namespace>:<name>`, into an
//! object with Kyverno's (Go) field names `Namespace` and `Name`; another username gives both
//! empty.

use cel::common::ast::{CallExpr, Expr as Ast};
use cel::common::types::STRING_TYPE;
use cel::common::value::{CowVal, Val};
use cel::objects::{Key, Map};
use cel::parser::Macro;
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

const FUNCTION: &str = "parseServiceAccount";

/// (namespace, name) of a service account's username; empty for anything else.
pub fn service_account(username: &str) -> (&str, &str) {
    let Some(rest) = username.strip_prefix("system:serviceaccount:") else { return ("", "") };
    match rest.split_once(':') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => (ns, name),
        _ => ("", ""),
    }
}

fn parse_service_account<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let username = match args.first().map(|a| Value::try_from(&**a)) {
        Some(Ok(Value::String(s))) => s,
        _ => return Err(ExecutionError::function_error(FUNCTION, "expected a string")),
    };
    let (namespace, name) = service_account(&username);
    let mut m = HashMap::new();
    m.insert(Key::String(Arc::new("Namespace".into())), Value::String(Arc::new(namespace.to_string())));
    m.insert(Key::String(Arc::new("Name".into())), Value::String(Arc::new(name.to_string())));
    let b: Box<dyn Val> = Value::Map(Map { map: Arc::new(m) }).try_into()?;
    Ok(CowVal::Owned(b))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(FUNCTION, "parseServiceAccount_string", vec![STRING_TYPE], parse_service_account)?;
    // `user.parseServiceAccount(x)` is the same call.
    env.add_macro(Macro::receiver_var_arg(FUNCTION, |helper, target, args| {
        if !matches!(target.as_ref().map(|t| &t.expr), Some(Ast::Ident(n)) if n == "user") || args.len() != 1 {
            return Ok(None);
        }
        Ok(Some(helper.next_expr(Ast::Call(CallExpr {
            func_name: FUNCTION.to_string(),
            target: None,
            args: std::mem::take(args),
        }))))
    }))?;
    Ok(())
}
