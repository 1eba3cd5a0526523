//! Kubernetes' CEL authorizer library: `authorizer.serviceAccount(ns, name)` (or `authorizer`
//! itself, the requesting user), `.group(g).resource(r).subresource(s).namespace(ns).name(n)` or
//! `.path(p)`, `.check(verb)`, and the decision's `.allowed()`, `.reason()`, `.errored()`,
//! `.error()`.
//!
//! As with the other libraries (see `host.rs`), parse-time macros rewrite these calls into
//! functions no CEL source can name: the builder is a map tagged `@authz`, and `.check(verb)`
//! asks the [`Host`](crate::Host) for an access review. Without a host the check is an error
//! ("not available here").

use crate::host::HOST_VAR;
use cel::common::ast::{CallExpr, Expr as Ast, IdedExpr, LiteralValue};
use cel::common::types::CelString;
use cel::common::types::DYN_TYPE as DYN;
use cel::common::value::CowVal;
use cel::parser::Macro;
use cel::{DeclarationError, Env, ExecutionError, Value};
use serde_json::{Value as Json, json};

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

const TAG: &str = "@authz";

pub(crate) fn json_args(args: &[CowVal<'_, '_>], f: &str) -> Result<Vec<Json>, ExecutionError> {
    args.iter()
        .map(|a| {
            Value::try_from(&**a).and_then(|v| crate::to_json(&v).map_err(|e| ExecutionError::function_error(f, e)))
        })
        .collect()
}

pub(crate) fn ret<'b, 'v>(v: &Json) -> Ret<'b, 'v> {
    Ok(CowVal::Owned(crate::json_val(v)))
}

fn builder(v: Option<&Json>, f: &str) -> Result<serde_json::Map<String, Json>, ExecutionError> {
    match v {
        Some(Json::Object(m)) if m.get(TAG).is_some() => Ok(m.clone()),
        _ => Err(ExecutionError::function_error(f, "the receiver is not an authorizer")),
    }
}

/// `authorizer` itself: the requesting user, from `request.userInfo`.
fn from_request<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = json_args(&args, "authorizer")?;
    let info = a.first().and_then(|r| r.get("userInfo")).cloned().unwrap_or(Json::Null);
    ret(&json!({TAG: "principal", "user": info.get("username").cloned().unwrap_or(json!("")),
        "groups": info.get("groups").cloned().unwrap_or(json!([]))}))
}

/// `authorizer.serviceAccount(namespace, name)`.
fn service_account<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = json_args(&args, "serviceAccount")?;
    let s = |i: usize| a.get(i).and_then(Json::as_str).unwrap_or("").to_string();
    let (ns, name) = (s(0), s(1));
    ret(&json!({TAG: "principal", "user": format!("system:serviceaccount:{ns}:{name}"),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"]}))
}

/// `.group(g)`, `.resource(r)`, … : the builder with one more attribute.
fn set<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = json_args(&args, "authorizer")?;
    let field = a.get(1).and_then(Json::as_str).unwrap_or("").to_string();
    let mut m = builder(a.first(), &field)?;
    m.insert(field, a.get(2).cloned().unwrap_or(Json::Null));
    ret(&Json::Object(m))
}

/// `.check(verb)`: the host's access review of the built attributes.
fn check<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let host = match args.first().map(|a| Value::try_from(&**a)) {
        Some(Ok(Value::Opaque(o))) => o.downcast_ref::<crate::host::HostValue>().map(|h| h.0.clone()),
        _ => None,
    }
    .ok_or_else(|| ExecutionError::function_error("check", "the authorizer is not available here"))?;
    let a = json_args(args.get(1..).unwrap_or_default(), "check")?;
    let m = builder(a.first(), "check")?;
    let verb = a.get(1).and_then(Json::as_str).unwrap_or("");
    let field = |k: &str| m.get(k).and_then(Json::as_str).unwrap_or("").to_string();
    let attributes = match m.get("path").and_then(Json::as_str) {
        Some(path) => ("nonResourceAttributes", json!({"path": path, "verb": verb})),
        None => (
            "resourceAttributes",
            json!({"group": field("group"), "resource": field("resource"), "subresource": field("subresource"),
                "namespace": field("namespace"), "name": field("name"), "verb": verb}),
        ),
    };
    let review = json!({"user": m.get("user"), "groups": m.get("groups"), attributes.0: attributes.1});
    let decision = match host.authorize(&review) {
        Ok(d) => json!({TAG: "decision", "allowed": d.get("allowed").and_then(Json::as_bool).unwrap_or(false),
            "reason": d.get("reason").cloned().unwrap_or(json!("")), "errored": false, "error": ""}),
        Err(e) => json!({TAG: "decision", "allowed": false, "reason": "", "errored": true, "error": e.to_string()}),
    };
    ret(&decision)
}

/// `.allowed()`, `.reason()`, `.errored()`, `.error()` of a decision.
fn get<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = json_args(&args, "authorizer")?;
    let field = a.get(1).and_then(Json::as_str).unwrap_or("");
    match a.first() {
        Some(Json::Object(m)) if m.get(TAG).and_then(Json::as_str) == Some("decision") => {
            ret(m.get(field).unwrap_or(&Json::Null))
        }
        _ => Err(ExecutionError::function_error(field, "the receiver is not an authorization decision")),
    }
}

fn text(helper: &mut cel::parser::MacroExprHelper, s: &str) -> IdedExpr {
    helper.next_expr(Ast::Literal(LiteralValue::String(CelString::from(s.to_string()))))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let fns: [(&str, cel::common::functions::Function, usize); 5] = [
        ("@authz_request", from_request, 1),
        ("@authz_sa", service_account, 2),
        ("@authz_set", set, 3),
        ("@authz_check", check, 3),
        ("@authz_get", get, 2),
    ];
    for (name, f, n) in fns {
        env.add_overload(name, &format!("{name}_{n}"), (0..n).map(|_| DYN).collect(), f)?;
    }
    // Builder steps (one argument), on `authorizer` itself or on a builder.
    for m in ["group", "resource", "subresource", "namespace", "name", "path"] {
        env.add_macro(Macro::receiver_var_arg(m, move |helper, target, args| {
            let (Some(t), 1) = (target.take(), args.len()) else { return Ok(None) };
            let receiver = match &t.expr {
                Ast::Ident(n) if n == "authorizer" => {
                    let req = helper.next_expr(Ast::Ident("request".into()));
                    helper.next_expr(Ast::Call(CallExpr {
                        func_name: "@authz_request".into(),
                        target: None,
                        args: vec![req],
                    }))
                }
                _ => t,
            };
            let key = text(helper, m);
            let mut all = vec![receiver, key];
            all.append(args);
            Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name: "@authz_set".into(), target: None, args: all }))))
        }))?;
    }
    env.add_macro(Macro::receiver_var_arg("serviceAccount", |helper, target, args| {
        match (target.as_ref().map(|t| &t.expr), args.len()) {
            (Some(Ast::Ident(n)), 2) if n == "authorizer" => {
                let all = std::mem::take(args);
                Ok(Some(helper.next_expr(Ast::Call(CallExpr {
                    func_name: "@authz_sa".into(),
                    target: None,
                    args: all,
                }))))
            }
            _ => Ok(None),
        }
    }))?;
    env.add_macro(Macro::receiver_var_arg("check", |helper, target, args| {
        let (Some(t), 1) = (target.take(), args.len()) else { return Ok(None) };
        let host = helper.next_expr(Ast::Ident(HOST_VAR.to_string()));
        let mut all = vec![host, t];
        all.append(args);
        Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name: "@authz_check".into(), target: None, args: all }))))
    }))?;
    for m in ["allowed", "reason", "errored", "error"] {
        env.add_macro(Macro::receiver_var_arg(m, move |helper, target, args| {
            let (Some(t), 0) = (target.take(), args.len()) else { return Ok(None) };
            let key = text(helper, m);
            let all = vec![t, key];
            Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name: "@authz_get".into(), target: None, args: all }))))
        }))?;
    }
    Ok(())
}
