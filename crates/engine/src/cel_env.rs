//! The variables Kubernetes CEL expressions read (`object`, `oldObject`, `request`,
//! `namespaceObject`, `params`, `exceptions`), shared by every rule kind that runs CEL, and a
//! binding's `paramRef` resolved through the data port.

use crate::context::{Context, EXCEPTIONS_KEY};
use crate::ports::{Data, NamespaceView, str_at};
use serde_json::Value;

/// The object a policy reads as `params`.
#[derive(Debug, Clone, Default)]
pub struct ParamRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// A binding's `paramRef.selector`: every matching object, read as `params.items`, as
    /// Kyverno's CLI presents them.
    pub selector: Option<verno_api::LabelSelector>,
}

impl ParamRef {
    /// From an admission policy's `paramKind` and its binding's `paramRef`.
    pub fn from_binding(param_kind: &Value, param_ref: &Value) -> ParamRef {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        ParamRef {
            api_version: s(param_kind, "apiVersion"),
            kind: s(param_kind, "kind"),
            namespace: s(param_ref, "namespace"),
            name: s(param_ref, "name"),
            selector: param_ref.get("selector").and_then(|v| serde_json::from_value(v.clone()).ok()),
        }
    }

    /// The `params` value, or why there is none. Without `paramRef.namespace`, a namespaced
    /// param kind is read in the request's namespace (`request_namespace`), as Kubernetes and
    /// Kyverno do; the data port does not say which kinds are namespaced, so when nothing is
    /// found there the object is looked up cluster-wide.
    pub fn resolve(&self, data: &dyn crate::ports::Data, request_namespace: &str) -> Result<Value, String> {
        let namespaces: Vec<&str> = if self.namespace.is_empty() && !request_namespace.is_empty() {
            vec![request_namespace, ""]
        } else {
            vec![self.namespace.as_str()]
        };
        if self.name.is_empty()
            && let Some(sel) = &self.selector
        {
            let mut items = Vec::new();
            for ns in &namespaces {
                items = data
                    .list(&self.api_version, &self.kind, ns)
                    .into_iter()
                    .filter(|o| crate::matching::selector_matches(sel, &crate::matching::labels_of(o), false))
                    .collect();
                if !items.is_empty() {
                    break;
                }
            }
            return Ok(serde_json::json!({ "items": items }));
        }
        namespaces.iter().find_map(|ns| data.resource(&self.api_version, &self.kind, ns, &self.name)).ok_or_else(|| {
            format!(
                "params {}/{} {}/{} not found",
                self.api_version,
                self.kind,
                namespaces.first().copied().unwrap_or(""),
                self.name
            )
        })
    }
}

/// The variables Kubernetes CEL expressions read: `object`, `oldObject`, `request`, and
/// (unavailable offline, so null) `namespaceObject` and `params`.
pub(crate) fn cel_vars(ctx: &Context, data: &dyn Data) -> verno_cel::Vars {
    ctx.cel_vars(|root, object| {
        build_cel_vars(root, object, data, ctx.env(), ctx.namespace_view(), ctx.live_namespace())
    })
}

/// `object`: the request's object when the context lends it (not in `root`'s `request`).
fn build_cel_vars(
    root: &Value,
    object: Option<&Value>,
    data: &dyn Data,
    env: &dyn verno_jmespath::Env,
    view: NamespaceView,
    live: Option<&Value>,
) -> verno_cel::Vars {
    let null = Value::Null;
    let req = root.get("request").unwrap_or(&null);
    let mut vars = verno_cel::Vars::default();
    // `request` is converted once; `object` and `oldObject` share its fields.
    match object {
        Some(o) => vars.set_with_fields("request", req, &[("object", o)]),
        None => vars.set("request", req),
    }
    for (name, field) in [("object", "object"), ("oldObject", "oldObject")] {
        if !vars.set_field_of(name, "request", field) {
            vars.set(name, &Value::Null);
        }
    }
    let mut ns = req.get("namespace").and_then(Value::as_str).unwrap_or("");
    // A Namespace is not in itself (Kyverno unsets it for the kinds it builds the object for).
    if view != NamespaceView::Policy
        && req.pointer("/kind/kind").and_then(Value::as_str) == Some("Namespace")
        && req.pointer("/kind/group").and_then(Value::as_str).unwrap_or("").is_empty()
    {
        ns = "";
    }
    // The caller's copy of the Namespace (a cluster's watch) when it holds this one; else the
    // data port's.
    let held = live.filter(|o| !ns.is_empty() && str_at(o, "/metadata/name") == ns);
    let ns_obj = if held.is_some() {
        None
    } else if !ns.is_empty() {
        data.namespace_object_as(view, ns)
    } else if view == NamespaceView::ValidatingAdmission {
        Some(NamespaceView::made_up("", None))
    } else {
        None
    };
    vars.set("namespaceObject", held.or(ns_obj.as_ref()).unwrap_or(&Value::Null));
    vars.set("params", &Value::Null);
    static NO_EXCEPTIONS: std::sync::LazyLock<Value> =
        std::sync::LazyLock::new(|| serde_json::json!({"allowedImages": [], "allowedValues": []}));
    vars.set("exceptions", root.get(EXCEPTIONS_KEY).unwrap_or(&NO_EXCEPTIONS));
    if let Some(h) = data.cel_host() {
        vars.set_host(h);
    }
    if let Some(flag) = env.cancel_flag() {
        vars.set_cancel(flag);
    }
    // The context keeps these per request (rebuilt when `request` changes): the policies
    // evaluating it share their common composition variables.
    vars.share_results();
    vars
}

/// [`cel_vars`] plus `params` and the policy's variables. Variables are lazy in Kubernetes: one
/// that fails only matters where it is used, so it is left unset and expressions reading it fail.
pub(crate) fn cel_env(
    ctx: &Context,
    data: &dyn Data,
    params: Option<&ParamRef>,
    variables: &[(String, verno_cel::Expr)],
) -> Result<verno_cel::Vars, String> {
    let mut vars = cel_vars(ctx, data);
    if let Some(p) = params {
        let ns = ctx.read(|root| str_at(root, "/request/namespace").to_string());
        vars.set("params", &p.resolve(data, &ns)?);
    }
    for (name, e) in variables {
        let _ = e.eval_into_variable(name, &mut vars);
    }
    Ok(vars)
}
