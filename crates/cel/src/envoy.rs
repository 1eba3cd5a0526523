//! Kyverno's authorization libraries for the ValidatingPolicy `Envoy` and `HTTP` evaluation
//! modes. Envoy:
//! `envoy.Allowed()`, `envoy.Denied(code)`, `envoy.Header(k, v)`, `envoy.QueryParam(k, v)`,
//! the builders `.WithBody`, `.WithHeader`, `.WithoutHeader`, `.WithResponseHeader`,
//! `.WithQueryParam`, `.WithoutQueryParam`, `.KeepEmptyValue`, and `.Response()` with
//! `.WithMessage` / `.WithMetadata`.
//!
//! Kyverno builds Envoy's protobuf messages; here they are their protobuf-JSON forms (what
//! Envoy's `CheckResponse` looks like on the wire as JSON), so they print, compare and convert
//! like any map: an `OkHttpResponse` is a map without `status`, a `DeniedHttpResponse` one with
//! `status.code`, and `Response()` makes the `CheckResponse` (`status.code` 0 with
//! `okResponse`, or 7, PERMISSION_DENIED, with `deniedResponse`). Ours because no crate offers
//! Envoy's types as CEL values, and the JSON forms are all a policy can observe.

use crate::authz::{json_args as args, ret};
use cel::common::types::{BOOL_TYPE, INT_TYPE, MAP_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};
use serde_json::{Map, Value as Json, json};

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn string(a: &[Json], i: usize, f: &str) -> Result<String, ExecutionError> {
    a.get(i)
        .and_then(Json::as_str)
        .map(str::to_string)
        .ok_or_else(|| ExecutionError::function_error(f, "expected a string"))
}

/// The builder a member function works on, checked to be of the expected message.
fn message(a: &[Json], f: &str, want: Message) -> Result<Map<String, Json>, ExecutionError> {
    let m = a.first().and_then(Json::as_object).cloned().unwrap_or_default();
    let is = if m.contains_key("okResponse") || m.contains_key("deniedResponse") {
        Message::Check
    } else if m.contains_key("status") {
        Message::Denied
    } else {
        Message::Ok
    };
    let ok = match want {
        Message::OkOrDenied => matches!(is, Message::Ok | Message::Denied),
        w => w == is,
    };
    if ok { Ok(m) } else { Err(ExecutionError::function_error(f, format!("not applicable to {}", is.name()))) }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Message {
    Ok,
    Denied,
    OkOrDenied,
    Check,
}

impl Message {
    fn name(self) -> &'static str {
        match self {
            Message::Ok => "an OkHttpResponse",
            Message::Denied => "a DeniedHttpResponse",
            Message::OkOrDenied => "an http response",
            Message::Check => "a CheckResponse",
        }
    }
}

fn push(m: &mut Map<String, Json>, key: &str, v: Json) {
    match m.get_mut(key) {
        Some(Json::Array(a)) => a.push(v),
        _ => {
            m.insert(key.to_string(), Json::Array(vec![v]));
        }
    }
}

/// A `HeaderValueOption` from a header value or from `key, value` strings.
fn header(a: &[Json], from: usize, f: &str) -> Result<Json, ExecutionError> {
    match a.get(from) {
        Some(Json::Object(h)) if h.contains_key("header") => Ok(Json::Object(h.clone())),
        Some(Json::String(_)) => Ok(json!({"header": {"key": string(a, from, f)?, "value": string(a, from + 1, f)?}})),
        _ => Err(ExecutionError::function_error(f, "expected a header")),
    }
}

fn allowed<'b, 'v>(_: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&json!({}))
}

fn denied<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "envoy.Denied")?;
    let code = a.first().and_then(Json::as_i64).unwrap_or(0);
    ret(&json!({"status": {"code": code}}))
}

fn header_kv<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "envoy.Header")?;
    ret(&header(&a, 0, "envoy.Header")?)
}

fn query_param<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "envoy.QueryParam")?;
    ret(&json!({"key": string(&a, 0, "envoy.QueryParam")?, "value": string(&a, 1, "envoy.QueryParam")?}))
}

fn with_body<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithBody")?;
    let mut m = message(&a, "WithBody", Message::Denied)?;
    m.insert("body".into(), Json::String(string(&a, 1, "WithBody")?));
    ret(&Json::Object(m))
}

fn with_header<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithHeader")?;
    let mut m = message(&a, "WithHeader", Message::OkOrDenied)?;
    push(&mut m, "headers", header(&a, 1, "WithHeader")?);
    ret(&Json::Object(m))
}

fn without_header<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithoutHeader")?;
    let mut m = message(&a, "WithoutHeader", Message::Ok)?;
    push(&mut m, "headersToRemove", Json::String(string(&a, 1, "WithoutHeader")?));
    ret(&Json::Object(m))
}

fn with_response_header<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithResponseHeader")?;
    let mut m = message(&a, "WithResponseHeader", Message::Ok)?;
    push(&mut m, "responseHeadersToAdd", header(&a, 1, "WithResponseHeader")?);
    ret(&Json::Object(m))
}

fn with_query_param<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithQueryParam")?;
    let mut m = message(&a, "WithQueryParam", Message::Ok)?;
    let p = match a.get(1) {
        Some(Json::Object(p)) => Json::Object(p.clone()),
        _ => json!({"key": string(&a, 1, "WithQueryParam")?, "value": string(&a, 2, "WithQueryParam")?}),
    };
    push(&mut m, "queryParametersToSet", p);
    ret(&Json::Object(m))
}

fn without_query_param<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithoutQueryParam")?;
    let mut m = message(&a, "WithoutQueryParam", Message::Ok)?;
    push(&mut m, "queryParametersToRemove", Json::String(string(&a, 1, "WithoutQueryParam")?));
    ret(&Json::Object(m))
}

fn keep_empty_value<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "KeepEmptyValue")?;
    let mut h = match a.first() {
        Some(Json::Object(h)) if h.contains_key("header") => h.clone(),
        _ => return Err(ExecutionError::function_error("KeepEmptyValue", "expected a header")),
    };
    h.insert("keepEmptyValue".into(), Json::Bool(a.get(1).and_then(Json::as_bool).unwrap_or(true)));
    ret(&Json::Object(h))
}

fn response<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "Response")?;
    // The HTTP library's responses are already in their final shape.
    if let Some(Json::Object(m)) = a.first()
        && (m.contains_key("ok") || m.contains_key("denied"))
    {
        return ret(&Json::Object(m.clone()));
    }
    let m = message(&a, "Response", Message::OkOrDenied)?;
    if m.contains_key("status") {
        // PERMISSION_DENIED
        ret(&json!({"status": {"code": 7}, "deniedResponse": m}))
    } else {
        ret(&json!({"status": {"code": 0}, "okResponse": m}))
    }
}

fn with_message<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithMessage")?;
    let mut m = message(&a, "WithMessage", Message::Check)?;
    if let Some(Json::Object(s)) = m.get_mut("status") {
        s.insert("message".into(), Json::String(string(&a, 1, "WithMessage")?));
    }
    ret(&Json::Object(m))
}

fn with_metadata<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "WithMetadata")?;
    let mut m = message(&a, "WithMetadata", Message::Check)?;
    let meta = a.get(1).filter(|v| v.is_object()).cloned();
    m.insert(
        "dynamicMetadata".into(),
        meta.ok_or_else(|| ExecutionError::function_error("WithMetadata", "expected a map"))?,
    );
    ret(&Json::Object(m))
}

/// How a response a policy returned decides: allowed, or denied (and why, as Kyverno's CLI
/// words it).
pub enum Decision {
    Allowed,
    Denied(String),
}

/// Reads what an Envoy-mode validation returned (a `CheckResponse` as [`response`] builds it).
pub fn decision(v: &Json) -> Result<Decision, crate::EvalError> {
    if let Some(ok) = v.get("okResponse")
        && ok.is_object()
    {
        return Ok(Decision::Allowed);
    }
    if let Some(d) = v.get("deniedResponse") {
        let code = d.pointer("/status/code").and_then(Json::as_i64).unwrap_or(0);
        return Ok(Decision::Denied(format!("request denied with status code {code}")));
    }
    Err(crate::EvalError::NotEnvoyResponse)
}

/// Reads what an HTTP-mode validation returned (`http.Allowed().Response()` or
/// `http.Denied(reason).Response()`).
pub fn http_decision(v: &Json) -> Result<Decision, crate::EvalError> {
    if v.get("ok").is_some_and(Json::is_object) {
        return Ok(Decision::Allowed);
    }
    if let Some(d) = v.get("denied").filter(|d| d.is_object()) {
        let reason = d.get("reason").and_then(Json::as_str).unwrap_or("");
        return Ok(Decision::Denied(format!("request denied, reason: {reason}")));
    }
    Err(crate::EvalError::NotHttpResponse)
}

// Kyverno's HTTP authorization library: `http.Allowed()`, `http.Denied(reason)`, `.Response()`,
// and on the request's attributes `.Header(name)` (case-insensitive, as HTTP header names) and
// `.QueryParam(name)`, both lists of values.

fn http_allowed<'b, 'v>(_: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&json!({"ok": {}}))
}

fn http_denied<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "http.Denied")?;
    ret(&json!({"denied": {"reason": string(&a, 0, "http.Denied")?}}))
}

fn values_of(m: Option<&Json>, key: &str, fold_case: bool) -> Json {
    let found = m.and_then(Json::as_object).and_then(|m| {
        m.iter().find(|(k, _)| if fold_case { k.eq_ignore_ascii_case(key) } else { *k == key }).map(|(_, v)| v)
    });
    match found {
        Some(Json::Array(a)) => Json::Array(a.clone()),
        Some(Json::String(s)) => json!([s]),
        _ => json!([]),
    }
}

fn http_header<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "Header")?;
    let key = string(&a, 1, "Header")?;
    ret(&values_of(a.first().and_then(|r| r.get("header")), &key, true))
}

fn http_query_param<'b, 'v>(a: Args<'b, 'v>) -> Ret<'b, 'v> {
    let a = args(&a, "QueryParam")?;
    let key = string(&a, 1, "QueryParam")?;
    ret(&values_of(a.first().and_then(|r| r.get("query")), &key, false))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("envoy.Allowed", "envoy_allowed", vec![], allowed)?;
    env.add_overload("envoy.Denied", "envoy_denied", vec![INT_TYPE], denied)?;
    env.add_overload("envoy.Header", "envoy_header", vec![STRING_TYPE, STRING_TYPE], header_kv)?;
    env.add_overload("envoy.QueryParam", "envoy_queryparam", vec![STRING_TYPE, STRING_TYPE], query_param)?;
    env.add_member_overload("WithBody", "envoy_with_body", MAP_TYPE, vec![STRING_TYPE], with_body)?;
    env.add_member_overload("WithHeader", "envoy_with_header", MAP_TYPE, vec![MAP_TYPE], with_header)?;
    env.add_member_overload(
        "WithHeader",
        "envoy_with_header_kv",
        MAP_TYPE,
        vec![STRING_TYPE, STRING_TYPE],
        with_header,
    )?;
    env.add_member_overload("WithoutHeader", "envoy_without_header", MAP_TYPE, vec![STRING_TYPE], without_header)?;
    env.add_member_overload(
        "WithResponseHeader",
        "envoy_with_response_header",
        MAP_TYPE,
        vec![MAP_TYPE],
        with_response_header,
    )?;
    env.add_member_overload(
        "WithResponseHeader",
        "envoy_with_response_header_kv",
        MAP_TYPE,
        vec![STRING_TYPE, STRING_TYPE],
        with_response_header,
    )?;
    env.add_member_overload("WithQueryParam", "envoy_with_queryparam", MAP_TYPE, vec![MAP_TYPE], with_query_param)?;
    env.add_member_overload(
        "WithQueryParam",
        "envoy_with_queryparam_kv",
        MAP_TYPE,
        vec![STRING_TYPE, STRING_TYPE],
        with_query_param,
    )?;
    env.add_member_overload(
        "WithoutQueryParam",
        "envoy_without_queryparam",
        MAP_TYPE,
        vec![STRING_TYPE],
        without_query_param,
    )?;
    env.add_member_overload("KeepEmptyValue", "envoy_keep_empty", MAP_TYPE, vec![], keep_empty_value)?;
    env.add_member_overload("KeepEmptyValue", "envoy_keep_empty_bool", MAP_TYPE, vec![BOOL_TYPE], keep_empty_value)?;
    env.add_member_overload("Response", "envoy_response", MAP_TYPE, vec![], response)?;
    env.add_member_overload("WithMessage", "envoy_with_message", MAP_TYPE, vec![STRING_TYPE], with_message)?;
    env.add_member_overload("WithMetadata", "envoy_with_metadata", MAP_TYPE, vec![MAP_TYPE], with_metadata)?;
    env.add_overload("http.Allowed", "http_allowed", vec![], http_allowed)?;
    env.add_overload("http.Denied", "http_denied", vec![STRING_TYPE], http_denied)?;
    env.add_member_overload("Header", "http_header", MAP_TYPE, vec![STRING_TYPE], http_header)?;
    env.add_member_overload("QueryParam", "http_query_param", MAP_TYPE, vec![STRING_TYPE], http_query_param)?;
    Ok(())
}
