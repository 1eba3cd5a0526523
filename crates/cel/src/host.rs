//! Kyverno's CEL libraries that read the world — `resource.Get/List/Post`, `http.Get/Post`,
//! `globalContext.Get`, `image.GetMetadata`, `time.now()` — answered by a [`Host`] the caller
//! provides (the CLI answers from its test files; no host means "not available here").
//!
//! The `cel` crate's functions are plain `fn` pointers with no access to the evaluation, so the
//! host travels as a hidden variable: a parse-time macro rewrites `resource.Get(a, b, c, d)` into
//! `@resource_get(@host, a, b, c, d)` (names no CEL source can spell), and [`crate::Vars`] binds
//! `@host` to an opaque value holding the host. Both PascalCase and camelCase member names are
//! accepted, as Kyverno accepts them.

use cel::common::ast::{CallExpr, Expr as Ast, IdedExpr};
use cel::common::types::DYN_TYPE as DYN;
use cel::common::value::{CowVal, Val};
use cel::objects::Opaque;
use cel::parser::Macro;
use cel::{DeclarationError, Env, ExecutionError, Value};
use serde_json::Value as Json;
use std::sync::Arc;

/// Why a [`Host`] could not answer a Kyverno library call. The text is what the policy's error
/// shows; the variant is what a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// This host has no such data: the CLI without a cluster, a library outside the policy
    /// kind that provides it, a test file that does not hold the answer.
    #[error("{0}")]
    Unavailable(String),
    /// Outside what the policy may reach (a namespaced policy's own namespace).
    #[error("{0}")]
    OutOfReach(String),
    /// The call was made and failed (the API server's or the service's answer, a limit).
    #[error("{0}")]
    Failed(String),
}

/// Where the Kyverno libraries get their data. Every method has a default saying the data is
/// not available, so a host implements only what it has.
///
/// A [`HostError`] says what kind of failure it was; its text is the host's message for the
/// user (a cluster's or a test file's answer, "not available here"), carried verbatim into the
/// CEL function error the policy reports.
pub trait Host: Send + Sync {
    /// The namespace this host is held to: a namespaced policy's. Kyverno's namespaced
    /// policies call `resource.Get(apiVersion, resource, name)` and `resource.List(apiVersion,
    /// resource[, labels])` (or with a `ToGVR` value) without a namespace: it is this one, and
    /// a namespace named anyway must be this one (the host refuses others).
    fn confined_to(&self) -> Option<&str> {
        None
    }
    /// `resource.Get(apiVersion, resource, namespace, name)`; `resource` is the plural.
    fn resource_get(&self, api_version: &str, resource: &str, namespace: &str, name: &str) -> Result<Json, HostError> {
        let _ = (api_version, resource, namespace, name);
        Err(HostError::Unavailable("resource.Get is not available here (no cluster)".into()))
    }
    /// `resource.List(apiVersion, resource, namespace)`: the objects (the caller wraps `items`).
    fn resource_list(&self, api_version: &str, resource: &str, namespace: &str) -> Result<Vec<Json>, HostError> {
        let _ = (api_version, resource, namespace);
        Err(HostError::Unavailable("resource.List is not available here (no cluster)".into()))
    }
    /// `resource.ToGVR(apiVersion, kind)`: the group, version and plural resource of a kind.
    /// Without discovery, Kubernetes' own guess (`UnsafeGuessKindToResource`: lower case, then
    /// `-s` → `-ses`, `-y` → `-ies`, else `-s`).
    fn to_gvr(&self, api_version: &str, kind: &str) -> Result<Json, HostError> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let lower = kind.to_lowercase();
        let resource = if let Some(stem) = lower.strip_suffix('y') {
            format!("{stem}ies")
        } else if lower.ends_with('s') {
            format!("{lower}es")
        } else if lower.is_empty() {
            lower
        } else {
            format!("{lower}s")
        };
        Ok(serde_json::json!({"group": group, "version": version, "resource": resource}))
    }
    /// `http.Get(url[, headers])` / `http.Post(url, body[, headers])`, optionally through
    /// `http.Client(caBundle)`: Kyverno's answer is the response's JSON object with its
    /// `statusCode` added, or `{"body": …, "statusCode": …}` for any other body.
    fn http(&self, call: &HttpCall<'_>) -> Result<Json, HostError> {
        Err(HostError::Unavailable(format!("http call to {} is not available here", call.url)))
    }
    /// `globalContext.Get(name, projection)`.
    fn global_context(&self, name: &str, projection: &str) -> Result<Json, HostError> {
        let _ = projection;
        Err(HostError::Unavailable(format!("global context entry {name:?} is not available here")))
    }
    /// `image.GetMetadata(reference)`: the image's metadata (`config`, `manifest`, ...).
    fn image_metadata(&self, reference: &str) -> Result<Json, HostError> {
        Err(HostError::Unavailable(format!("metadata for image {reference:?} is not available here")))
    }
    /// The Kubernetes authorizer library's `.check(verb)`: a SubjectAccessReview spec (`user`,
    /// `groups`, `resourceAttributes` or `nonResourceAttributes`) → its status (`allowed`,
    /// `reason`).
    fn authorize(&self, review: &Json) -> Result<Json, HostError> {
        let _ = review;
        Err(HostError::Unavailable("the authorizer is not available here (no cluster)".into()))
    }
    /// `time.now()`, seconds since the Unix epoch; `None` when there is no clock.
    fn now(&self) -> Option<i64> {
        None
    }
    /// A fresh seed for `random()`; `None` when this host offers no randomness.
    fn random_seed(&self) -> Option<u64> {
        None
    }
    /// ImageValidatingPolicy's `verifyImageSignatures(image, attestors)`: how many of the
    /// attestors (as the policy writes them) verified the image's signatures.
    fn verify_image_signatures(&self, image: &str, attestors: &[Json]) -> Result<i64, HostError> {
        let _ = (image, attestors);
        Err(HostError::Unavailable("verifyImageSignatures is only available in an ImageValidatingPolicy".into()))
    }
    /// `verifyAttestationSignatures(image, attestation, attestors)`: how many attestors signed
    /// the image's attestation of that name.
    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[Json],
    ) -> Result<i64, HostError> {
        let _ = (image, attestation, attestors);
        Err(HostError::Unavailable("verifyAttestationSignatures is only available in an ImageValidatingPolicy".into()))
    }
    /// `extractPayload(image, attestation)`: the predicate of the image's attestation, once a
    /// verification of it succeeded.
    fn extract_payload(&self, image: &str, attestation: &str) -> Result<Json, HostError> {
        let _ = (image, attestation);
        Err(HostError::Unavailable("extractPayload is only available in an ImageValidatingPolicy".into()))
    }
    /// GeneratingPolicy's `generator.Apply(namespace, resources)` (`namespace` is `None` in
    /// the namespaced form `generator.Apply(resources)`): hands the objects to generate to the
    /// host, which collects them.
    fn generate(&self, namespace: Option<&str>, resources: Vec<Json>) -> Result<(), HostError> {
        let _ = (namespace, resources);
        Err(HostError::Unavailable("generator.Apply is only available in a GeneratingPolicy".into()))
    }
}

/// One call of Kyverno's `http` library.
#[derive(Debug, Clone, Copy)]
pub struct HttpCall<'a> {
    /// `GET` or `POST`.
    pub method: &'a str,
    pub url: &'a str,
    /// What a POST sends (as JSON).
    pub body: Option<&'a Json>,
    /// The headers the policy gives (a map of strings in CEL).
    pub headers: &'a [(String, String)],
    /// `http.Client(caBundle)`'s PEM bundle: the roots the server's certificate must chain to.
    pub ca_bundle: Option<&'a str>,
}

/// The host, as the opaque value bound to `@host`.
#[derive(Clone)]
pub struct HostValue(pub Arc<dyn Host>);

impl std::fmt::Debug for HostValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("host")
    }
}

impl PartialEq for HostValue {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for HostValue {}

impl Opaque for HostValue {
    fn runtime_type_name(&self) -> &str {
        "verno.host"
    }
}

pub const HOST_VAR: &str = "@host";

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// The host and the other arguments as JSON.
fn split(args: &[CowVal<'_, '_>], f: &str) -> Result<(Arc<dyn Host>, Vec<Json>), ExecutionError> {
    let mut vals = args.iter().map(|a| Value::try_from(&**a));
    let host = match vals.next() {
        Some(Ok(Value::Opaque(o))) => o.downcast_ref::<HostValue>().map(|h| h.0.clone()),
        _ => None,
    }
    .ok_or_else(|| ExecutionError::function_error(f, "not available here"))?;
    let rest = vals
        .map(|v| v.and_then(|v| crate::to_json(&v).map_err(|e| ExecutionError::function_error(f, e))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((host, rest))
}

fn s(v: &[Json], i: usize) -> &str {
    v.get(i).and_then(Json::as_str).unwrap_or("")
}

fn ret<'b, 'v>(v: &Json) -> Ret<'b, 'v> {
    Ok(CowVal::Owned(crate::json_val(v)))
}

fn fail<E: ToString>(f: &str) -> impl Fn(E) -> ExecutionError + '_ {
    move |e| ExecutionError::function_error(f, e)
}

/// A `resource.ToGVR` value as the first argument stands for `apiVersion, resource`.
fn expand_gvr(mut a: Vec<Json>) -> Vec<Json> {
    if let Some(Json::Object(gvr)) = a.first() {
        // Go's field names (`Group`) or JSON's (`group`).
        let get = |lower: &str, upper: &str| {
            gvr.get(lower).or_else(|| gvr.get(upper)).and_then(Json::as_str).unwrap_or("").to_string()
        };
        let (group, version, resource) =
            (get("group", "Group"), get("version", "Version"), get("resource", "Resource"));
        let api_version = if group.is_empty() { version } else { format!("{group}/{version}") };
        a.splice(0..1, [Json::String(api_version), Json::String(resource)]);
    }
    a
}

fn resource_to_gvr<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "resource.ToGVR")?;
    ret(&h.to_gvr(s(&a, 0), s(&a, 1)).map_err(fail("resource.ToGVR"))?)
}

fn resource_get<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "resource.Get")?;
    let mut a = expand_gvr(a);
    // The namespaced form names no namespace: the host's.
    if let (Some(ns), 3) = (h.confined_to(), a.len()) {
        a.insert(2, Json::String(ns.to_string()));
    }
    ret(&h.resource_get(s(&a, 0), s(&a, 1), s(&a, 2), s(&a, 3)).map_err(fail("resource.Get"))?)
}

fn resource_list<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "resource.List")?;
    let mut a = expand_gvr(a);
    // The namespaced form names no namespace (labels, if any, come third): the host's.
    if let Some(ns) = h.confined_to()
        && (a.len() == 2 || a.get(2).is_some_and(Json::is_object))
    {
        a.insert(2, Json::String(ns.to_string()));
    }
    let mut items = h.resource_list(s(&a, 0), s(&a, 1), s(&a, 2)).map_err(fail("resource.List"))?;
    // An optional fourth argument: labels every item must carry.
    if let Some(Json::Object(want)) = a.get(3) {
        items.retain(|o| want.iter().all(|(k, v)| o.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v)));
    }
    ret(&serde_json::json!({ "items": items }))
}

/// A header map's entries (Kyverno's `map[string]string`: any other value is refused).
fn headers(v: Option<&Json>, f: &str) -> Result<Vec<(String, String)>, ExecutionError> {
    match v {
        None => Ok(Vec::new()),
        Some(Json::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Json::String(s) => Ok((k.clone(), s.clone())),
                other => Err(ExecutionError::function_error(f, format!("header {k:?} must be a string, not {other}"))),
            })
            .collect(),
        Some(other) => {
            Err(ExecutionError::function_error(f, format!("the headers must be a map of strings, not {other}")))
        }
    }
}

/// `[caBundle,] url[, headers]` of a GET (`with_ca`: through `http.Client(caBundle)`).
fn http_get_with(args: Args<'_, '_>, with_ca: bool) -> Result<Json, ExecutionError> {
    const F: &str = "http.Get";
    let (h, mut a) = split(&args, F)?;
    let ca = if with_ca { Some(a.remove(0)) } else { None };
    let hs = headers(a.get(1), F)?;
    let call = HttpCall {
        method: "GET",
        url: s(&a, 0),
        body: None,
        headers: &hs,
        ca_bundle: ca.as_ref().and_then(Json::as_str),
    };
    h.http(&call).map_err(fail(F))
}

/// `[caBundle,] url, body[, headers]` of a POST.
fn http_post_with(args: Args<'_, '_>, with_ca: bool) -> Result<Json, ExecutionError> {
    const F: &str = "http.Post";
    let (h, mut a) = split(&args, F)?;
    let ca = if with_ca { Some(a.remove(0)) } else { None };
    let hs = headers(a.get(2), F)?;
    let call = HttpCall {
        method: "POST",
        url: s(&a, 0),
        body: a.get(1),
        headers: &hs,
        ca_bundle: ca.as_ref().and_then(Json::as_str),
    };
    h.http(&call).map_err(fail(F))
}

fn http_get<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&http_get_with(args, false)?)
}

fn http_post<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&http_post_with(args, false)?)
}

fn http_get_ca<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&http_get_with(args, true)?)
}

fn http_post_ca<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(&http_post_with(args, true)?)
}

fn global_context<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "globalContext.Get")?;
    ret(&h.global_context(s(&a, 0), s(&a, 1)).map_err(fail("globalContext.Get"))?)
}

fn image_metadata<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "image.GetMetadata")?;
    ret(&h.image_metadata(s(&a, 0)).map_err(fail("image.GetMetadata"))?)
}

fn generator_apply<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, mut a) = split(&args, "generator.Apply")?;
    let list = a.pop().unwrap_or(Json::Null);
    let Json::Array(resources) = list else {
        return Err(ExecutionError::function_error("generator.Apply", "the resources must be a list of objects"));
    };
    let namespace = a.first().map(|n| n.as_str().unwrap_or(""));
    h.generate(namespace, resources).map_err(|e| ExecutionError::function_error("generator.Apply", e))?;
    ret(&Json::Bool(true))
}

fn jwt_decode<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, a) = split(&args, "jwt.Decode")?;
    let Some(Json::String(key)) = a.get(1) else {
        return Err(ExecutionError::function_error(
            "jwt.Decode",
            "the key must be a string (JWK sets are not supported)",
        ));
    };
    let now = h.now().ok_or_else(|| ExecutionError::function_error("jwt.Decode", "no clock here"))?;
    ret(&crate::jwt::decode(s(&a, 0), key, now).map_err(fail("jwt.Decode"))?)
}

/// A CEL list of attestors as JSON values.
fn attestor_list(a: &[Json], i: usize, f: &str) -> Result<Vec<Json>, ExecutionError> {
    match a.get(i) {
        Some(Json::Array(l)) => Ok(l.clone()),
        _ => Err(ExecutionError::function_error(f, "the attestors must be a list")),
    }
}

fn verify_image_signatures<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "verifyImageSignatures";
    let (h, a) = split(&args, F)?;
    let attestors = attestor_list(&a, 1, F)?;
    ret(&Json::from(h.verify_image_signatures(s(&a, 0), &attestors).map_err(fail(F))?))
}

fn verify_attestation_signatures<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "verifyAttestationSignatures";
    let (h, a) = split(&args, F)?;
    let attestors = attestor_list(&a, 2, F)?;
    ret(&Json::from(h.verify_attestation_signatures(s(&a, 0), s(&a, 1), &attestors).map_err(fail(F))?))
}

fn extract_payload<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "extractPayload";
    let (h, a) = split(&args, F)?;
    ret(&h.extract_payload(s(&a, 0), s(&a, 1)).map_err(fail(F))?)
}

fn time_now<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (h, _) = split(&args, "time.now")?;
    let secs = h.now().ok_or_else(|| ExecutionError::function_error("time.now", "no clock here"))?;
    let ts = chrono::DateTime::from_timestamp(secs, 0)
        .ok_or_else(|| ExecutionError::function_error("time.now", "clock out of range"))?;
    let b: Box<dyn Val> = Value::Timestamp(ts.fixed_offset()).try_into()?;
    Ok(CowVal::Owned(b))
}

/// (library, member names, argument counts, function).
const CALLS: &[(&str, &[&str], &[usize], &str)] = &[
    ("resource", &["Get", "get"], &[2, 3, 4], "@resource_get"),
    ("resource", &["List", "list"], &[1, 2, 3, 4], "@resource_list"),
    ("resource", &["ToGVR", "toGVR"], &[2], "@resource_to_gvr"),
    ("http", &["Get", "get"], &[1, 2], "@http_get"),
    ("http", &["Post", "post"], &[2, 3], "@http_post"),
    ("globalContext", &["Get", "get"], &[1, 2], "@global_context"),
    ("image", &["GetMetadata", "getMetadata"], &[1], "@image_metadata"),
    ("time", &["now", "Now"], &[0], "@time_now"),
    ("generator", &["Apply", "apply"], &[1, 2], "@generator_apply"),
    ("jwt", &["Decode"], &[2], "@jwt_decode"),
];

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let fns: [(&str, cel::common::functions::Function); 15] = [
        ("@verify_image_signatures", verify_image_signatures),
        ("@verify_attestation_signatures", verify_attestation_signatures),
        ("@extract_payload", extract_payload),
        ("@resource_get", resource_get),
        ("@resource_to_gvr", resource_to_gvr),
        ("@resource_list", resource_list),
        ("@http_get", http_get),
        ("@http_post", http_post),
        ("@http_get_ca", http_get_ca),
        ("@http_post_ca", http_post_ca),
        ("@global_context", global_context),
        ("@image_metadata", image_metadata),
        ("@time_now", time_now),
        ("@generator_apply", generator_apply),
        ("@jwt_decode", jwt_decode),
    ];
    for (name, f) in fns {
        for n in 1..=5 {
            env.add_overload(name, &format!("{name}_{n}"), (0..n).map(|_| DYN).collect(), f)?;
        }
    }
    // ImageValidatingPolicy's global functions, with the host as a hidden first argument.
    for (name, arity, f) in [
        ("verifyImageSignatures", 2, "@verify_image_signatures"),
        ("verifyAttestationSignatures", 3, "@verify_attestation_signatures"),
        ("extractPayload", 2, "@extract_payload"),
        ("getImageData", 1, "@image_metadata"),
    ] {
        env.add_macro(Macro::global(name, arity, move |helper, _target, args| {
            let host = helper.next_expr(Ast::Ident(HOST_VAR.to_string()));
            let mut all: Vec<IdedExpr> = vec![host];
            all.append(args);
            Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name: f.to_string(), target: None, args: all }))))
        }))?;
    }
    let mut members: Vec<&str> = CALLS.iter().flat_map(|c| c.1.iter().copied()).collect();
    members.sort_unstable();
    members.dedup();
    for m in members {
        env.add_macro(Macro::receiver_var_arg(m, move |helper, target, args| {
            // `http.Client(caBundle).Get(…)`: the CA bundle goes first, and the call is the
            // `_ca` form of `http.Get`.
            let (lib, through_client) = match target.as_ref().map(|t| &t.expr) {
                Some(Ast::Ident(name)) => (name.clone(), false),
                Some(Ast::Call(c))
                    if matches!(c.func_name.as_str(), "Client" | "client")
                        && c.args.len() == 1
                        && matches!(c.target.as_deref().map(|t| &t.expr), Some(Ast::Ident(n)) if n == "http") =>
                {
                    ("http".to_string(), true)
                }
                _ => return Ok(None),
            };
            let Some(call) = CALLS.iter().find(|c| c.0 == lib && c.1.contains(&m) && c.2.contains(&args.len())) else {
                return Ok(None);
            };
            let ca = match target.as_mut().map(|t| &mut t.expr) {
                Some(Ast::Call(c)) if through_client => c.args.pop(),
                _ => None,
            };
            if let Some(ca) = ca {
                let host = helper.next_expr(Ast::Ident(HOST_VAR.to_string()));
                let mut all: Vec<IdedExpr> = vec![host, ca];
                all.append(args);
                let func_name = format!("{}_ca", call.3);
                return Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name, target: None, args: all }))));
            }
            let host = helper.next_expr(Ast::Ident(HOST_VAR.to_string()));
            let mut all: Vec<IdedExpr> = vec![host];
            all.append(args);
            Ok(Some(helper.next_expr(Ast::Call(CallExpr { func_name: call.3.to_string(), target: None, args: all }))))
        }))?;
    }
    Ok(())
}
