//! Context entries (`variable`, `configMap`, `apiCall`, `globalReference`, `imageRegistry`):
//! compiled with the policy, loaded into the request's context before a rule (or a foreach
//! element, or a mutate target) runs. Data from outside comes through the [`Data`] port.
use crate::condition::CompiledConditions;
use crate::context::{Context, Saved};
use crate::error::CompileError;
use crate::ports::{Data, Loaded};
use crate::template::{Query, tv};
use crate::template::{TValue, Template};
use serde_json::Value;
use std::borrow::Cow;
use verno_api::ContextEntry;
use verno_jmespath::Expression;

#[derive(Debug, Clone)]
pub struct CompiledContextEntry {
    pub name: String,
    pub source: ContextSource,
}

#[derive(Debug, Clone)]
pub enum ContextSource {
    Variable {
        value: Option<TValue>,
        jmes_path: Option<JmesField>,
        default: Option<TValue>,
    },
    ConfigMap {
        name: TValue,
        namespace: Option<TValue>,
    },
    ApiCall {
        url_path: Option<TValue>,
        method: String,
        data: Option<TValue>,
        /// `apiCall.service`, when the call goes to a service.
        service: Option<Box<ServiceSpec>>,
        jmes_path: Option<JmesField>,
        default: Option<TValue>,
    },
    GlobalReference {
        name: String,
        jmes_path: Option<JmesField>,
    },
    /// An image's data from its registry (Kyverno's `imageRegistry`): `reference` rendered,
    /// read with `credentials`, then `jmesPath` applied.
    ImageRegistry {
        reference: TValue,
        jmes_path: Option<JmesField>,
        credentials: Option<verno_api::images::RegistryCredentials>,
    },
}

/// A service an `apiCall` reaches: its URL, PEM CA bundle and headers.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    url: TValue,
    ca_bundle: String,
    headers: Option<TValue>,
}

/// A `jmesPath` field: compiled once unless it holds `{{ }}` variables itself.
#[derive(Debug, Clone)]
pub enum JmesField {
    /// Compiled once, with its DELETE reading (`request.object` as `request.oldObject`).
    Static {
        expr: Box<Expression>,
        delete: Option<Box<Expression>>,
    },
    Templated(Template),
}

impl JmesField {
    fn compile(s: &str, path: &str) -> Result<JmesField, CompileError> {
        if crate::template::has_vars(s) {
            return Template::compile(s).map(JmesField::Templated).map_err(|e| CompileError::new(path, e));
        }
        let q = Query::compile(s, path)?;
        Ok(JmesField::Static { expr: Box::new(q.expr), delete: q.delete.map(Box::new) })
    }
}

pub(crate) fn compile_context(entries: &[ContextEntry], path: &str) -> Result<Vec<CompiledContextEntry>, CompileError> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let source = if let Some(v) = &e.variable {
            ContextSource::Variable {
                value: v.value.as_ref().map(|x| tv(x, &format!("{p}.variable.value"))).transpose()?,
                jmes_path: v
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.variable.jmesPath")))
                    .transpose()?,
                default: v.default.as_ref().map(|x| tv(x, &format!("{p}.variable.default"))).transpose()?,
            }
        } else if let Some(c) = &e.config_map {
            ContextSource::ConfigMap {
                name: tv(&Value::String(c.name.clone()), &format!("{p}.configMap.name"))?,
                namespace: c
                    .namespace
                    .as_ref()
                    .map(|n| tv(&Value::String(n.clone()), &format!("{p}.configMap.namespace")))
                    .transpose()?,
            }
        } else if let Some(a) = &e.api_call {
            ContextSource::ApiCall {
                url_path: a
                    .url_path
                    .as_ref()
                    .map(|u| tv(&Value::String(u.clone()), &format!("{p}.apiCall.urlPath")))
                    .transpose()?,
                method: match a.method.as_deref() {
                    None => "GET".into(),
                    Some(m) if crate::confine::METHODS.contains(&m) => m.to_string(),
                    Some(m) => {
                        return Err(CompileError::new(
                            format!("{p}.apiCall.method"),
                            format!("Unsupported value: {m:?}: supported values: \"GET\", \"POST\""),
                        ));
                    }
                },
                data: a.data.as_ref().map(|d| tv(d, &format!("{p}.apiCall.data"))).transpose()?,
                service: match a.service.as_ref().and_then(|s| s.get("url").map(|u| (s, u))) {
                    Some((svc, url)) => Some(Box::new(ServiceSpec {
                        url: tv(url, &format!("{p}.apiCall.service.url"))?,
                        ca_bundle: svc.get("caBundle").and_then(Value::as_str).unwrap_or("").to_string(),
                        headers: svc
                            .get("headers")
                            .filter(|h| !h.is_null())
                            .map(|h| tv(h, &format!("{p}.apiCall.service.headers")))
                            .transpose()?,
                    })),
                    None => None,
                },
                jmes_path: a
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.apiCall.jmesPath")))
                    .transpose()?,
                default: a.default.as_ref().map(|x| tv(x, &format!("{p}.apiCall.default"))).transpose()?,
            }
        } else if let Some(g) = &e.global_reference {
            ContextSource::GlobalReference {
                name: g.name.clone(),
                jmes_path: g
                    .jmes_path
                    .as_deref()
                    .map(|s| JmesField::compile(s, &format!("{p}.globalReference.jmesPath")))
                    .transpose()?,
            }
        } else if let Some(r) = &e.image_registry {
            let at = format!("{p}.imageRegistry");
            let reference = match r.get("reference") {
                Some(v @ Value::String(_)) => tv(v, &format!("{at}.reference"))?,
                _ => return Err(CompileError::new(format!("{at}.reference"), "Required value")),
            };
            let credentials = match r.get("imageRegistryCredentials") {
                None | Some(Value::Null) => None,
                Some(c) => Some(
                    serde_json::from_value(c.clone())
                        .map_err(|e| CompileError::new(format!("{at}.imageRegistryCredentials"), e.to_string()))?,
                ),
            };
            ContextSource::ImageRegistry {
                reference,
                jmes_path: r
                    .get("jmesPath")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(|s| JmesField::compile(s, &format!("{at}.jmesPath")))
                    .transpose()?,
                credentials,
            }
        } else {
            return Err(CompileError::new(
                p,
                "a context entry needs one of variable, configMap, apiCall, imageRegistry or globalReference",
            ));
        };
        out.push(CompiledContextEntry { name: e.name.clone(), source });
    }
    Ok(out)
}

/// The expression of a `jmesPath` field; `delete` picks the `request.oldObject` reading.
/// Only a field holding `{{ }}` variables is compiled here; the others were compiled with the policy.
fn render_jmes<'f>(f: &'f JmesField, ctx: &Context, delete: bool, entry: &str) -> Result<Cow<'f, Expression>, String> {
    match f {
        JmesField::Static { expr, delete: del } => {
            Ok(Cow::Borrowed(if delete { del.as_ref().unwrap_or(expr) } else { expr }))
        }
        JmesField::Templated(t) => {
            let rendered = t.render(ctx, "").map_err(|e| e.to_string())?;
            let Some(s) = rendered.as_str() else {
                // Kyverno's words (its error value is nil here, printed `<nil>`).
                return Err(format!("jmespath value must be a string {entry} {}: <nil>", t.source()));
            };
            let e = Expression::compile(s).map_err(|e| format!("invalid JMESPath {s:?}: {e}"))?;
            Ok(Cow::Owned(if delete { crate::template::delete_reading(&e).unwrap_or(e) } else { e }))
        }
    }
}

/// Loads a scope's context entries in order. As in Kyverno (whose loaders are deferred until an
/// expression names the entry), an entry that cannot be loaded is no error by itself: its error
/// is kept in the context ([`Context::fail_entry`]) and raised by the first expression that
/// reads the entry — an unreferenced ConfigMap that does not exist refuses nothing. Later
/// entries that read a failed one fail in turn, with their own words.
pub(crate) fn load_context(
    entries: &[CompiledContextEntry],
    ctx: &mut Context,
    data: &dyn Data,
    provided: &[String],
    confined_to: Option<&str>,
    saved: &mut Saved,
) {
    for entry in entries {
        if provided.iter().any(|p| p == &entry.name || p.starts_with(&format!("{}.", entry.name))) {
            continue;
        }
        match load_entry(entry, ctx, data, confined_to) {
            Ok(Some(v)) => saved.absorb(ctx.set_entry(&entry.name, v)),
            Ok(None) => {}
            Err(e) => saved.absorb(ctx.fail_entry(&entry.name, e)),
        }
    }
}

/// One context entry's value (`None`: nothing to set, e.g. no cluster to ask).
fn load_entry(
    entry: &CompiledContextEntry,
    ctx: &Context,
    data: &dyn Data,
    confined_to: Option<&str>,
) -> Result<Option<Value>, String> {
    let name = &entry.name;
    match &entry.source {
        ContextSource::Variable { value, jmes_path, default } => {
            load_variable(name, value.as_ref(), jmes_path.as_ref(), default.as_ref(), ctx)
        }
        ContextSource::ConfigMap { name: cm, namespace } => {
            load_config_map(name, cm, namespace.as_ref(), ctx, data, confined_to)
        }
        ContextSource::ApiCall { .. } => load_api_call(entry, ctx, data, confined_to),
        ContextSource::GlobalReference { name: global, jmes_path } => match data.global_reference(global) {
            Loaded::Value(v) => match jmes_path {
                Some(jp) => {
                    let e = render_jmes(jp, ctx, false, name)?;
                    Ok(Some(e.search(&v, ctx.env()).map(Cow::into_owned).map_err(|e| e.to_string())?))
                }
                None => Ok(Some(v)),
            },
            Loaded::Unavailable => Ok(None),
            Loaded::Error(e) => Err(e),
        },
        ContextSource::ImageRegistry { reference, jmes_path, credentials } => {
            load_image(name, reference, jmes_path.as_ref(), credentials.as_ref(), ctx, data)
        }
    }
}

/// A `variable` entry: `value` (rendered), then `jmesPath` over it (or over the context when
/// there is no value); `default` when that gives nothing or null.
fn load_variable(
    name: &str,
    value: Option<&TValue>,
    jmes_path: Option<&JmesField>,
    default: Option<&TValue>,
    ctx: &Context,
) -> Result<Option<Value>, String> {
    let base: Result<Option<Value>, String> = match value {
        Some(v) => {
            let rendered = v.render(ctx, "").map_err(|e| e.to_string());
            match (rendered, jmes_path) {
                (Ok(r), Some(jp)) => {
                    let e = render_jmes(jp, ctx, false, name)?;
                    e.search(r.as_ref(), ctx.env()).map(|x| Some(x.into_owned())).map_err(|e| e.to_string())
                }
                (Ok(r), None) => Ok(Some(r.into_owned())),
                (Err(e), _) => Err(e),
            }
        }
        None => match jmes_path {
            Some(jp) => {
                let e = render_jmes(jp, ctx, ctx.is_delete(), name)?;
                ctx.query(&e).map(Some).map_err(|e| e.to_string())
            }
            None => Ok(None),
        },
    };
    match base {
        Ok(Some(v)) if !v.is_null() => Ok(Some(v)),
        other => match default {
            Some(d) => Ok(Some(d.render(ctx, "").map_err(|e| e.to_string())?.into_owned())),
            None => {
                other?;
                Err(format!("failed to add context entry for variable {name} since it evaluated to nil"))
            }
        },
    }
}

/// A `configMap` entry: the ConfigMap's data, through the data port.
fn load_config_map(
    entry: &str,
    name: &TValue,
    namespace: Option<&TValue>,
    ctx: &Context,
    data: &dyn Data,
    confined_to: Option<&str>,
) -> Result<Option<Value>, String> {
    let n = name.render(ctx, "").map_err(|e| e.to_string())?;
    let ns = match namespace {
        Some(ns) => ns.render(ctx, "").map_err(|e| e.to_string())?.as_str().unwrap_or("").to_string(),
        None => confined_to.unwrap_or("default").to_string(),
    };
    let ns = if ns.is_empty() { "default".to_string() } else { ns };
    // A namespaced policy reads only its own namespace (Kyverno's words).
    if let Some(own) = confined_to
        && own != ns
    {
        return Err(format!(
            "context entry {entry}: configMap namespace {ns:?} is different from policy namespace {own:?}"
        ));
    }
    match data.config_map(&ns, n.as_str().unwrap_or("")) {
        Loaded::Value(v) => Ok(Some(v)),
        Loaded::Unavailable => Ok(None),
        Loaded::Error(e) => Err(format!("failed to get configmap {ns}/{}: {e}", n.as_str().unwrap_or(""))),
    }
}

/// An `apiCall` entry: a Kubernetes API path or a service, then `jmesPath`; `default` when
/// the call or the path fails.
fn load_api_call(
    entry: &CompiledContextEntry,
    ctx: &Context,
    data: &dyn Data,
    confined_to: Option<&str>,
) -> Result<Option<Value>, String> {
    let ContextSource::ApiCall { url_path, method, data: body, service, jmes_path, default } = &entry.source else {
        return Ok(None);
    };
    let url = match url_path.as_ref().or(service.as_ref().map(|s| &s.url)) {
        Some(u) => u.render(ctx, "").map_err(|e| e.to_string())?.as_str().unwrap_or("").to_string(),
        None => String::new(),
    };
    // A Kubernetes API path is sent cleaned (as Kubernetes' REST client sends it), and a
    // namespaced policy's must address its own namespace; the check comes before `default`,
    // which does not cover a refused path.
    let url = if url_path.is_some() && (url.starts_with('/') || confined_to.is_some()) {
        crate::confine::api_path(&url, confined_to)?
    } else {
        url
    };
    // `data` is a list of key/value pairs; the request body is the object they make.
    let body = match body {
        Some(b) => Some(request_body(b.render(ctx, "").map_err(|e| e.to_string())?.into_owned())),
        None => None,
    };
    let answer = if let (None, Some(svc)) = (url_path, service) {
        let headers = service_headers(svc, ctx)?;
        let service = crate::ports::Service { ca_bundle: &svc.ca_bundle, headers: &headers };
        data.service_call(method, &url, body.as_ref(), &service)
    } else {
        data.api_call(method, &url, body.as_ref())
    };
    let fallback = |e: String| match default {
        Some(d) => Ok(Some(d.render(ctx, "").map_err(|e| e.to_string())?.into_owned())),
        None => Err(e),
    };
    match answer {
        Loaded::Value(v) => {
            let out = match jmes_path {
                Some(jp) => {
                    let e = render_jmes(jp, ctx, false, &entry.name)?;
                    e.search(&v, ctx.env()).map(Cow::into_owned).map_err(|e| e.to_string())
                }
                None => Ok(v),
            };
            match out {
                Ok(v) => Ok(Some(v)),
                Err(e) => fallback(e),
            }
        }
        Loaded::Unavailable => Ok(None),
        Loaded::Error(e) => fallback(e),
    }
}

/// A service call's headers: `key`/`value` pairs, rendered.
fn service_headers(svc: &ServiceSpec, ctx: &Context) -> Result<Vec<(String, String)>, String> {
    let Some(h) = &svc.headers else { return Ok(Vec::new()) };
    Ok(h.render(ctx, "")
        .map_err(|e| e.to_string())?
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            let value = match h.get("value")? {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((h.get("key")?.as_str()?.to_string(), value))
        })
        .collect())
}

/// An `imageRegistry` entry: the image's data from its registry, then `jmesPath`.
fn load_image(
    entry: &str,
    reference: &TValue,
    jmes_path: Option<&JmesField>,
    credentials: Option<&verno_api::images::RegistryCredentials>,
    ctx: &Context,
    data: &dyn Data,
) -> Result<Option<Value>, String> {
    let rendered = reference.render(ctx, "").map_err(|e| e.to_string())?;
    let Some(image) = rendered.as_str() else {
        return Err(format!("invalid image reference {rendered}, image reference must be a string"));
    };
    let found = match data.image_data(image, credentials) {
        Loaded::Value(v) => v,
        // No registry access here: the entry stays unset (Kyverno's disabled loader).
        Loaded::Unavailable => return Ok(None),
        Loaded::Error(e) => return Err(format!("failed to fetch image descriptor: {image}, error: {e}")),
    };
    match jmes_path {
        Some(jp) => {
            let e = render_jmes(jp, ctx, false, entry)?;
            let v = e.search(&found, ctx.env()).map(Cow::into_owned).map_err(|err| {
                format!("failed to apply JMESPath ({}) results to context entry {entry}, error: {err}", e.source())
            })?;
            Ok(Some(v))
        }
        None => Ok(Some(found)),
    }
}

/// An `apiCall`'s request body: the object `data`'s key/value pairs make (a value left out is
/// null), or `data` itself when it is not a list.
pub(crate) fn request_body(data: Value) -> Value {
    match data {
        Value::Array(pairs) => Value::Object(
            pairs
                .into_iter()
                .filter_map(|p| {
                    let key = p.get("key")?.as_str()?.to_string();
                    Some((key, p.get("value").cloned().unwrap_or(Value::Null)))
                })
                .collect(),
        ),
        other => other,
    }
}

/// Why a scope step stopped short.
pub(crate) enum Stop {
    /// The preconditions could not be evaluated.
    Preconditions(String),
    /// The preconditions do not hold.
    NotMet,
}

/// The step every nested scope takes once its element (or target) is bound: load its context
/// entries (recorded in `saved`, for the caller to restore), then check its preconditions.
/// Foreach elements of validate, mutate and generate rules and mutate-existing targets go
/// through here; each words the stop in Kyverno's message for its place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn enter(
    entries: &[CompiledContextEntry],
    preconditions: Option<&CompiledConditions>,
    ctx: &mut Context,
    data: &dyn Data,
    provided: &[String],
    confined_to: Option<&str>,
    saved: &mut Saved,
) -> Result<(), Stop> {
    load_context(entries, ctx, data, provided, confined_to, saved);
    match preconditions.map(|p| p.evaluate(ctx)) {
        None | Some(Ok((true, _))) => Ok(()),
        Some(Ok((false, _))) => Err(Stop::NotMet),
        Some(Err(e)) => Err(Stop::Preconditions(e.to_string())),
    }
}
