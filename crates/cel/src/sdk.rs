//! Kyverno's small CEL libraries (its SDK's `hash`, `math`, `json`, `yaml`, `x509`, `time`,
//! `transform`, `gzip` and `random`), which every Kyverno CEL policy kind has: functions of
//! their arguments alone, except `random`, whose seed comes from the [`crate::Host`] (the
//! engine has no randomness of its own).
//!
//! Both spellings Kyverno registers are accepted: `sha256(s)` and `hash.sha256(s)`,
//! `listObjToMap(…)` and `transform.listObjToMap(…)`, `random()` and `random.random()`.
//! `json` and `yaml` are variables in Kyverno (`json.unmarshal(s)`); here they are the
//! qualified names of functions, which reads the same.

use crate::host::{HOST_VAR, HostValue};
use cel::common::ast::{CallExpr, Expr as Ast, IdedExpr};
use cel::common::types::{
    BYTES_TYPE, DOUBLE_TYPE, DURATION_TYPE, DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE, TIMESTAMP_TYPE,
};
use cel::common::value::CowVal;
use cel::objects::{Key, Map};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::sync::Arc;
use verno_jmespath::value::{go_json_float, go_json_string};

use crate::kube::{Args, Ret, ret, values};

/// The most `gzip.decompress` inflates: a small input must not expand into gigabytes.
const MAX_INFLATED: u64 = 8 << 20;

fn string(v: Option<&Value>, f: &str) -> Result<Arc<String>, ExecutionError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ExecutionError::function_error(f, format!("expected a string, got {other:?}"))),
        None => Err(ExecutionError::function_error(f, "missing argument")),
    }
}

fn str_value(s: impl Into<String>) -> Value {
    Value::String(Arc::new(s.into()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

macro_rules! digest {
    ($name:ident, $f:literal, $hasher:ty) => {
        fn $name<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
            use sha2::Digest as _;
            let s = string(values(&args)?.first(), $f)?;
            ret(str_value(hex(&<$hasher>::digest(s.as_bytes()))))
        }
    };
}

digest!(sha1, "sha1", sha1::Sha1);
digest!(sha256, "sha256", sha2::Sha256);
digest!(md5, "md5", md5::Md5);

/// `math.round(x, n)`: `x` rounded to `n` decimals, halves away from zero (Go's `math.Round`).
fn round<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.as_slice() {
        [Value::Float(x), Value::Int(n)] => {
            let shift = 10f64.powi((*n).clamp(-400, 400) as i32);
            ret(Value::Float((x * shift).round() / shift))
        }
        other => Err(ExecutionError::function_error("math.round", format!("expected (double, int), got {other:?}"))),
    }
}

/// `json.unmarshal(s)`: the JSON text as a value.
fn json_unmarshal<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string(values(&args)?.first(), "json.unmarshal")?;
    let v: serde_json::Value =
        serde_json::from_str(&s).map_err(|e| ExecutionError::function_error("json.unmarshal", e))?;
    Ok(CowVal::Owned(crate::json_val(&v)))
}

/// `json.marshal(v)`: the value as Go's `json.Marshal` writes it (keys sorted, integral
/// doubles without a fraction, `<`, `>` and `&` escaped).
fn json_marshal<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let mut out = String::new();
    go_json(v.first().unwrap_or(&Value::Null), &mut out, 0)?;
    ret(str_value(out))
}

fn go_json(v: &Value, out: &mut String, depth: usize) -> Result<(), ExecutionError> {
    if depth > 128 {
        return Err(ExecutionError::function_error("json.marshal", "value nested too deeply"));
    }
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::UInt(u) => out.push_str(&u.to_string()),
        Value::Float(f) => {
            if !f.is_finite() {
                return Err(ExecutionError::function_error("json.marshal", format!("unsupported value: {f}")));
            }
            out.push_str(&go_json_float(*f));
        }
        Value::String(s) => go_json_string(s, out),
        Value::Bytes(b) => {
            use base64::Engine as _;
            go_json_string(&base64::engine::general_purpose::STANDARD.encode(b.as_slice()), out)
        }
        Value::Timestamp(t) => go_json_string(&t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true), out),
        Value::Duration(d) => out.push_str(&d.num_nanoseconds().unwrap_or(i64::MAX).to_string()),
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_json(x, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Map(m) => {
            let mut entries: Vec<(String, &Value)> = m.map.iter().map(|(k, x)| (key_text(k), x)).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (k, x)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_json_string(k, out);
                out.push(':');
                go_json(x, out, depth + 1)?;
            }
            out.push('}');
        }
        other => return Err(ExecutionError::function_error("json.marshal", format!("unsupported value: {other:?}"))),
    }
    Ok(())
}

/// A map key as text (error messages, JSON object keys).
pub(crate) fn key_text(k: &Key) -> String {
    match k {
        Key::String(s) => s.to_string(),
        Key::Int(i) => i.to_string(),
        Key::Uint(u) => u.to_string(),
        Key::Bool(b) => b.to_string(),
    }
}

/// `yaml.parse(s)`: the YAML document as a value.
fn yaml_parse<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string(values(&args)?.first(), "yaml.parse")?;
    let v = verno_jmespath::yaml::parse(&s).map_err(|e| ExecutionError::function_error("yaml.parse", e))?;
    Ok(CowVal::Owned(crate::json_val(&v)))
}

/// `x509.decode(pem)`: a certificate or certificate request (RSA keys only, as Kyverno) with
/// Go's field names.
fn x509_decode<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string(values(&args)?.first(), "x509.decode")?;
    let v = verno_jmespath::x509_decode(&s).map_err(|e| ExecutionError::function_error("x509.decode", e))?;
    Ok(CowVal::Owned(crate::json_val(&v)))
}

/// `time.toCron(t)`: `"minute hour day month weekday"` of the timestamp (Sunday is 0).
fn to_cron<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.as_slice() {
        [Value::Timestamp(t)] => ret(str_value(verno_jmespath::cron_of(t))),
        other => Err(ExecutionError::function_error("time.toCron", format!("expected a timestamp, got {other:?}"))),
    }
}

/// `time.truncate(t, d)`: `t` rounded down to a multiple of `d` since Go's zero time, as Go's
/// `Time.Truncate` (a non-positive `d` leaves `t` as it is).
fn truncate<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    match values(&args)?.as_slice() {
        [Value::Timestamp(t), Value::Duration(d)] => {
            let step = i128::from(d.num_nanoseconds().unwrap_or(i64::MAX));
            let unix = i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos());
            let rem = verno_jmespath::go_truncation(unix, step);
            let back = chrono::Duration::nanoseconds(i64::try_from(rem).unwrap_or(i64::MAX));
            let out = t
                .checked_sub_signed(back)
                .ok_or_else(|| ExecutionError::function_error("time.truncate", "timestamp out of range"))?;
            ret(Value::Timestamp(out))
        }
        other => Err(ExecutionError::function_error(
            "time.truncate",
            format!("expected (timestamp, duration), got {other:?}"),
        )),
    }
}

/// `listObjToMap(keys, values, keyField, valueField)`: a map from each `keys[i][keyField]` to
/// `values[i][valueField]`, in Kyverno's words when the lists do not fit.
fn list_obj_to_map<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "listObjToMap";
    let v = values(&args)?;
    let [Value::List(keys), Value::List(vals), Value::String(key_field), Value::String(value_field)] = v.as_slice()
    else {
        return Err(ExecutionError::function_error(
            F,
            format!("listObjToMap must take 4 arguments, {} were passed", v.len()),
        ));
    };
    if keys.len() != vals.len() {
        return Err(ExecutionError::function_error(
            F,
            format!("listObjToMap must take lists of equal length. list1: {}, list2: {}", keys.len(), vals.len()),
        ));
    }
    let field = |m: &Value, name: &str| match m {
        Value::Map(m) => Ok(m.map.get(&Key::String(Arc::new(name.to_string()))).cloned()),
        _ => Err(()),
    };
    let mut out = HashMap::new();
    for (k, x) in keys.iter().zip(vals.iter()) {
        let key = match field(k, key_field) {
            Ok(Some(Value::String(s))) => s,
            Ok(_) => {
                return Err(ExecutionError::function_error(
                    F,
                    "the passed key name cannot be handled as a string in the key object list",
                ));
            }
            Err(()) => {
                return Err(ExecutionError::function_error(
                    F,
                    "object cannot be handled as a map string to any in the key object list",
                ));
            }
        };
        let value = field(x, value_field).map_err(|()| {
            ExecutionError::function_error(
                F,
                "object cannot be handled as a map string to any in the value object list",
            )
        })?;
        out.insert(Key::String(key), value.unwrap_or(Value::Null));
    }
    ret(Value::Map(Map { map: Arc::new(out) }))
}

/// `gzip.compress(s)`: the string gzipped (no name, time zero).
fn gzip_compress<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let s = string(values(&args)?.first(), "gzip.compress")?;
    let mut w = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    w.write_all(s.as_bytes()).map_err(|e| ExecutionError::function_error("gzip.compress", e))?;
    let bytes = w.finish().map_err(|e| ExecutionError::function_error("gzip.compress", e))?;
    ret(Value::Bytes(Arc::new(bytes)))
}

/// `gzip.decompress(b)`: the gzipped bytes as a string (at most [`MAX_INFLATED`] bytes).
fn gzip_decompress<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "gzip.decompress";
    let bytes = match values(&args)?.first() {
        Some(Value::Bytes(b)) => b.clone(),
        other => return Err(ExecutionError::function_error(F, format!("expected bytes, got {other:?}"))),
    };
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut out)
        .map_err(|e| ExecutionError::function_error(F, e))?;
    if out.len() as u64 > MAX_INFLATED {
        return Err(ExecutionError::function_error(F, format!("the data inflates to more than {MAX_INFLATED} bytes")));
    }
    let s = String::from_utf8(out).map_err(|e| ExecutionError::function_error(F, e))?;
    ret(str_value(s))
}

/// `random()` (eight characters of `[0-9a-z]`) and `random(pattern)`: a string matching the
/// regular expression, drawn with a seed from the host.
fn random<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "random";
    let v = values(&args)?;
    let host = match v.first() {
        Some(Value::Opaque(o)) => o.downcast_ref::<HostValue>().map(|h| h.0.clone()),
        _ => None,
    };
    let seed = host
        .and_then(|h| h.random_seed())
        .ok_or_else(|| ExecutionError::function_error(F, "random values are not available here"))?;
    let pattern = match v.get(1) {
        None => Arc::new("[0-9a-z]{8}".to_string()),
        some => string(some, F)?,
    };
    let out = verno_jmespath::random::generate(&pattern, seed).map_err(|e| ExecutionError::function_error(F, e))?;
    ret(str_value(out))
}

/// `@random(@host, args…)`: the host travels as a hidden first argument (see `host.rs`).
fn random_call(helper: &mut MacroExprHelper<'_>, args: &mut Vec<IdedExpr>) -> IdedExpr {
    let host = helper.next_expr(Ast::Ident(HOST_VAR.to_string()));
    let mut all: Vec<IdedExpr> = vec![host];
    all.append(args);
    helper.next_expr(Ast::Call(CallExpr { func_name: "@random".to_string(), target: None, args: all }))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || vec![STRING_TYPE];
    for prefix in ["", "hash."] {
        env.add_overload(&format!("{prefix}sha1"), &format!("{prefix}sha1_string"), s(), sha1)?;
        env.add_overload(&format!("{prefix}sha256"), &format!("{prefix}sha256_string"), s(), sha256)?;
        env.add_overload(&format!("{prefix}md5"), &format!("{prefix}md5_string"), s(), md5)?;
    }
    for name in ["listObjToMap", "transform.listObjToMap"] {
        let lists = vec![LIST_TYPE, LIST_TYPE, STRING_TYPE, STRING_TYPE];
        env.add_overload(name, &format!("{name}_lists_strings"), lists, list_obj_to_map)?;
    }
    env.add_overload("math.round", "kyverno_math_round_double_int", vec![DOUBLE_TYPE, INT_TYPE], round)?;
    env.add_overload("json.unmarshal", "json_unmarshal_string", s(), json_unmarshal)?;
    env.add_overload("json.marshal", "json_marshal_dyn", vec![DYN_TYPE], json_marshal)?;
    env.add_overload("yaml.parse", "yaml_parse_string", s(), yaml_parse)?;
    env.add_overload("x509.decode", "x509_decode_string", s(), x509_decode)?;
    env.add_overload("time.toCron", "time_to_cron", vec![TIMESTAMP_TYPE], to_cron)?;
    env.add_overload("time.truncate", "time_truncate", vec![TIMESTAMP_TYPE, DURATION_TYPE], truncate)?;
    env.add_overload("gzip.compress", "gzip_compress_dyn", vec![DYN_TYPE], gzip_compress)?;
    env.add_overload("gzip.decompress", "gzip_decompress_bytes", vec![BYTES_TYPE], gzip_decompress)?;
    for n in 1..=2 {
        env.add_overload("@random", &format!("@random_{n}"), (0..n).map(|_| DYN_TYPE).collect(), random)?;
    }
    for arity in 0..=1 {
        env.add_macro(Macro::global("random", arity, |helper, _target, args| Ok(Some(random_call(helper, args)))))?;
    }
    env.add_macro(Macro::receiver_var_arg("random", |helper, target, args| {
        if !matches!(target.as_ref().map(|t| &t.expr), Some(Ast::Ident(n)) if n == "random") || args.len() > 1 {
            return Ok(None);
        }
        Ok(Some(random_call(helper, args)))
    }))?;
    Ok(())
}
