//! Admission emulation: on a write, the stored Mutating- then ValidatingWebhookConfigurations
//! are evaluated the way the API server does and matching webhooks are called over HTTPS with
//! their `caBundle`, honouring `failurePolicy` and `timeoutSeconds`.
//!
//! Modelled: rules (operations, apiGroups, apiVersions, resources, scope), namespaceSelector
//! (from the Namespace's labels plus `kubernetes.io/metadata.name`; a Namespace uses its own),
//! objectSelector (old or new object), matchConditions in CEL (`request`, `object`,
//! `oldObject`), services declared with `set_service` or a `url`, JSONPatch mutations, the
//! denial and call-failure messages of the API server. Webhook configurations themselves are
//! never sent to webhooks (kubernetes/kubernetes#59840). Not modelled: `matchPolicy:
//! Equivalent` conversions, subresource rules, reinvocation, `auditAnnotations`.

use crate::{Change, Inner, Operation, lock, ok_json_headers, status};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// One webhook call, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The webhook's `name`.
    pub webhook: String,
    pub operation: String,
    /// `namespace/name` of the object.
    pub object: String,
    /// `allowed`, `denied`, `patched`, or `error: …` (then `failurePolicy` decided).
    pub outcome: String,
}

struct Hook {
    name: String,
    mutating: bool,
    entry: Value,
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

fn rule_matches(rule: &Value, op: &str, group: &str, version: &str, plural: &str, namespaced: bool) -> bool {
    let has = |field: &str, want: &str| strings(rule.get(field)).iter().any(|x| *x == "*" || *x == want);
    let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Namespaced" => namespaced,
        "Cluster" => !namespaced,
        _ => true,
    };
    has("operations", op)
        && has("apiGroups", group)
        && has("apiVersions", version)
        && has("resources", plural)
        && scope_ok
}

/// A metav1.LabelSelector against a label map.
pub fn selector_matches(sel: Option<&Value>, labels: &serde_json::Map<String, Value>) -> bool {
    let Some(sel) = sel.filter(|s| !s.is_null()) else { return true };
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let eq =
        sel.get("matchLabels").and_then(Value::as_object).is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let exprs = sel.get("matchExpressions").and_then(Value::as_array).is_none_or(|es| {
        es.iter().all(|e| {
            let k = e.get("key").and_then(Value::as_str).unwrap_or("");
            let vals = strings(e.get("values"));
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => label(k).is_some_and(|v| vals.contains(&v)),
                "NotIn" => label(k).is_none_or(|v| !vals.contains(&v)),
                "Exists" => label(k).is_some(),
                "DoesNotExist" => label(k).is_none(),
                _ => false,
            }
        })
    });
    eq && exprs
}

fn labels_of(o: Option<&Value>) -> serde_json::Map<String, Value> {
    o.and_then(|o| o.pointer("/metadata/labels")).and_then(Value::as_object).cloned().unwrap_or_default()
}

/// Runs admission for a write: the object after mutation (when a webhook patched it) and the
/// webhooks' warnings.
pub(crate) async fn admit(
    inner: &Arc<Inner>,
    c: &Change,
    user: &(String, Vec<String>),
    dry_run: bool,
) -> Result<(Option<Value>, Vec<String>), Response> {
    if c.resource.group == "admissionregistration.k8s.io" {
        return Ok((None, Vec::new()));
    }
    let Snapshot { hooks, ns_labels, services, mut schema } = snapshot(inner, c);
    let mut run = Run {
        inner,
        c,
        user,
        dry_run,
        services: &services,
        object: c.new.clone(),
        mutated: false,
        warnings: Vec::new(),
    };
    for hook in hooks {
        // A custom resource is checked against its schema after the mutating webhooks and
        // before the validating ones, as the API server validates the object between the two.
        if !hook.mutating {
            check_schema(c, run.object.as_ref(), &mut schema)?;
        }
        if selected(&hook.entry, c, ns_labels.as_ref(), run.object.as_ref()) {
            run.hook(&hook).await?;
        }
    }
    check_schema(c, run.object.as_ref(), &mut schema)?;
    Ok((if run.mutated { run.object } else { None }, run.warnings))
}

/// What admission reads from the store before calling any webhook.
struct Snapshot {
    /// The mutating webhooks, then the validating ones.
    hooks: Vec<Hook>,
    /// The labels a namespaceSelector sees (`None` for a cluster-scoped object).
    ns_labels: Option<serde_json::Map<String, Value>>,
    services: BTreeMap<(String, String), Option<SocketAddr>>,
    /// A custom resource's schema.
    schema: Option<Value>,
}

fn snapshot(inner: &Inner, c: &Change) -> Snapshot {
    let r = &c.resource;
    let s = lock(&inner.store);
    let mut hooks = Vec::new();
    for (plural, mutating) in [("mutatingwebhookconfigurations", true), ("validatingwebhookconfigurations", false)] {
        let k = format!("admissionregistration.k8s.io/{plural}");
        for (_, cfg) in crate::objects_of(&s.objects, &k) {
            for w in cfg.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
                hooks.push(Hook {
                    name: w.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                    mutating,
                    entry: w.clone(),
                });
            }
        }
    }
    let ns = &c.k.1;
    let ns_labels = if r.kind == "Namespace" && r.group.is_empty() {
        let mut l = labels_of(c.new.as_ref().or(c.old.as_ref()));
        l.insert("kubernetes.io/metadata.name".into(), Value::String(c.k.2.clone()));
        Some(l)
    } else if r.namespaced {
        let mut l = labels_of(s.objects.get(&("/namespaces".to_string(), String::new(), ns.clone())));
        l.insert("kubernetes.io/metadata.name".into(), Value::String(ns.clone()));
        Some(l)
    } else {
        None
    };
    let schema = if r.group.is_empty() { None } else { crate::crd::schema_of(&s, r) };
    Snapshot { hooks, ns_labels, services: s.services.clone(), schema }
}

/// Checks `object` against the custom resource's schema, once (`schema` is taken): the API
/// server's Invalid status when it does not conform.
fn check_schema(c: &Change, object: Option<&Value>, schema: &mut Option<Value>) -> Result<(), Response> {
    let r = &c.resource;
    let (Some(sc), Some(o)) = (schema.take(), object) else { return Ok(()) };
    let mut errs = Vec::new();
    crate::crd::schema_errors(&sc, o, "", &mut errs);
    if errs.is_empty() {
        return Ok(());
    }
    // The API server's Invalid status: the message, and the causes kubectl prints.
    let texts: Vec<String> = errs.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
    let joined = if texts.len() == 1 { texts.join("") } else { format!("[{}]", texts.join(", ")) };
    let causes: Vec<Value> =
        errs.iter().map(|(f, reason, m)| json!({"reason": reason, "message": m, "field": f})).collect();
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{}.{} {:?} is invalid: {joined}", r.kind, r.group, c.k.2), "reason": "Invalid",
        "details": {"name": c.k.2, "group": r.group, "kind": r.kind, "causes": causes}, "code": 422});
    Err(ok_json_headers(StatusCode::UNPROCESSABLE_ENTITY, &body, &[]))
}

/// Whether the webhook's rules, namespaceSelector and objectSelector (old or new object)
/// select the write.
fn selected(w: &Value, c: &Change, ns_labels: Option<&serde_json::Map<String, Value>>, object: Option<&Value>) -> bool {
    let r = &c.resource;
    let op = c.op.as_str();
    let rules_ok = w.get("rules").and_then(Value::as_array).is_some_and(|rules| {
        rules.iter().any(|rule| rule_matches(rule, op, r.group, r.version, r.plural, r.namespaced))
    });
    if !rules_ok {
        return false;
    }
    if ns_labels.is_some_and(|l| !selector_matches(w.get("namespaceSelector"), l)) {
        return false;
    }
    let obj_sel = w.get("objectSelector");
    selector_matches(obj_sel, &labels_of(object)) || selector_matches(obj_sel, &labels_of(c.old.as_ref()))
}

/// One write's pass through the webhooks: the object as the mutating webhooks leave it, and
/// the warnings they gave.
struct Run<'a> {
    inner: &'a Inner,
    c: &'a Change,
    user: &'a (String, Vec<String>),
    dry_run: bool,
    services: &'a BTreeMap<(String, String), Option<SocketAddr>>,
    object: Option<Value>,
    mutated: bool,
    warnings: Vec<String>,
}

impl Run<'_> {
    /// Records a call's outcome in the admission log.
    fn log(&self, hook: &Hook, outcome: String) {
        lock(&self.inner.store).admission_log.push(Call {
            webhook: hook.name.clone(),
            operation: self.c.op.as_str().to_string(),
            object: format!("{}/{}", self.c.k.1, self.c.k.2),
            outcome,
        });
    }

    /// One selected webhook: the dry-run check, its matchConditions, the call and its answer.
    async fn hook(&mut self, hook: &Hook) -> Result<(), Response> {
        let w = &hook.entry;
        let fail_open = w.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        // A dry run reaches only webhooks that declare no side effects (or none on dry runs),
        // and tells them it is one; the API server refuses the request otherwise.
        let side_effects = w.get("sideEffects").and_then(Value::as_str).unwrap_or("Unknown");
        if self.dry_run && !matches!(side_effects, "None" | "NoneOnDryRun") {
            let text = format!("admission webhook {:?} does not support dry run", hook.name);
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": text, "reason": "BadRequest", "code": 400});
            return Err(ok_json_headers(StatusCode::BAD_REQUEST, &body, &[]));
        }
        let mut request = review_request(self.c, self.object.as_ref(), self.user);
        if let Some(m) = request.as_object_mut() {
            m.insert("dryRun".into(), Value::Bool(self.dry_run));
        }
        match match_conditions(w, &request) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => {
                self.log(hook, format!("error: {e}"));
                if fail_open {
                    return Ok(());
                }
                // Kubernetes refuses the request as forbidden, naming the resource.
                let r = &self.c.resource;
                let resource =
                    if r.group.is_empty() { r.plural.to_string() } else { format!("{}.{}", r.plural, r.group) };
                return Err(status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!("{resource} {:?} is forbidden: {e}", self.c.k.2),
                ));
            }
        }
        match call_webhook(w, &request, self.services).await {
            Err(e) => {
                self.log(hook, format!("error: {e}"));
                if fail_open {
                    return Ok(());
                }
                Err(status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    format!("Internal error occurred: failed calling webhook {:?}: {e}", hook.name),
                ))
            }
            Ok(resp) => self.answered(hook, &resp),
        }
    }

    /// A webhook's `response`: its warnings kept, a denial returned, a mutating webhook's
    /// patch applied to the object.
    fn answered(&mut self, hook: &Hook, resp: &Value) -> Result<(), Response> {
        self.warnings.extend(strings(resp.get("warnings")).into_iter().map(str::to_string));
        if resp.get("allowed").and_then(Value::as_bool) != Some(true) {
            self.log(hook, "denied".into());
            return Err(denied(&hook.name, resp.get("status"), &self.warnings));
        }
        let patch = resp.get("patch").and_then(Value::as_str);
        let (true, Some(p), Some(o)) = (hook.mutating, patch, self.object.as_mut()) else {
            self.log(hook, "allowed".into());
            return Ok(());
        };
        let applied = base64::engine::general_purpose::STANDARD
            .decode(p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<json_patch::Patch>(&b).map_err(|e| e.to_string()))
            .and_then(|p| json_patch::patch(o, &p).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            self.log(hook, format!("error: {e}"));
            return Err(status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("Internal error occurred: JSON patch from webhook {:?} could not be applied: {e}", hook.name),
            ));
        }
        self.mutated = true;
        self.log(hook, "patched".into());
        Ok(())
    }
}

fn denied(name: &str, st: Option<&Value>, warnings: &[String]) -> Response {
    let message = st.and_then(|s| s.get("message")).and_then(Value::as_str).unwrap_or("");
    let reason = st.and_then(|s| s.get("reason")).and_then(Value::as_str).unwrap_or("");
    let code = st.and_then(|s| s.get("code")).and_then(Value::as_u64).filter(|c| *c >= 400).unwrap_or(400) as u16;
    let denied_by = format!("admission webhook {name:?} denied the request");
    let text = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": text, "reason": reason, "code": code});
    ok_json_headers(StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST), &body, warnings)
}

fn review_request(c: &Change, object: Option<&Value>, user: &(String, Vec<String>)) -> Value {
    let r = &c.resource;
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr = json!({"group": r.group, "version": r.version, "resource": r.plural});
    let options = match c.op {
        Operation::Create => json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}),
        Operation::Update => json!({"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}),
        Operation::Delete => json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}),
    };
    let mut req = json!({
        "uid": format!("fake-{}-{}", c.k.2, chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)),
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": c.k.2, "operation": c.op.as_str(),
        "userInfo": {"username": user.0, "groups": user.1},
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": c.old.clone().filter(|_| c.op != Operation::Create).unwrap_or(Value::Null),
        "dryRun": false, "options": options,
    });
    if r.namespaced
        && let Some(m) = req.as_object_mut()
    {
        m.insert("namespace".into(), Value::String(c.k.1.clone()));
    }
    // As the API server: a Namespace's request carries its own name as the namespace.
    if r.group.is_empty()
        && r.kind == "Namespace"
        && let Some(m) = req.as_object_mut()
    {
        m.insert("namespace".into(), Value::String(c.k.2.clone()));
    }
    req
}

/// The matchConditions that failed to evaluate, each worded as Kubernetes' CEL filter words it
/// (`expression '…' resulted in error: …`); several show in brackets, as its aggregate error.
#[derive(Debug, PartialEq)]
struct ConditionErrors(Vec<String>);

impl fmt::Display for ConditionErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => f.write_str(one),
            many => write!(f, "[{}]", many.join(", ")),
        }
    }
}

impl std::error::Error for ConditionErrors {}

/// A webhook's matchConditions, as the API server evaluates them: every condition runs; one
/// that is false means no call (whatever failed besides); otherwise the errors.
fn match_conditions(w: &Value, request: &Value) -> Result<bool, ConditionErrors> {
    let Some(conds) = w.get("matchConditions").and_then(Value::as_array) else { return Ok(true) };
    let mut vars = verno_cel::Vars::default();
    vars.set("request", request);
    vars.set("object", request.get("object").unwrap_or(&Value::Null));
    vars.set("oldObject", request.get("oldObject").unwrap_or(&Value::Null));
    let mut errors = Vec::new();
    for cond in conds {
        let source = cond.get("expression").and_then(Value::as_str).unwrap_or("");
        let verdict = match verno_cel::Expr::compile(source) {
            Ok(e) => e.eval_bool(&vars).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match verdict {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => errors.push(format!("expression '{source}' resulted in error: {e}")),
        }
    }
    if errors.is_empty() { Ok(true) } else { Err(ConditionErrors(errors)) }
}

/// POSTs the AdmissionReview; returns its `response`.
async fn call_webhook(
    w: &Value,
    request: &Value,
    services: &std::collections::BTreeMap<(String, String), Option<SocketAddr>>,
) -> Result<Value, String> {
    let cc = w.get("clientConfig").cloned().unwrap_or(Value::Null);
    let timeout = w.get("timeoutSeconds").and_then(Value::as_u64).unwrap_or(10);
    let (url, resolve) = if let Some(url) = cc.get("url").and_then(Value::as_str) {
        (url.to_string(), None)
    } else if let Some(svc) = cc.get("service") {
        let ns = svc.get("namespace").and_then(Value::as_str).unwrap_or("");
        let name = svc.get("name").and_then(Value::as_str).unwrap_or("");
        let port = svc.get("port").and_then(Value::as_u64).unwrap_or(443);
        let path = svc.get("path").and_then(Value::as_str).unwrap_or("/");
        let host = format!("{name}.{ns}.svc");
        let url = format!("https://{host}:{port}{path}?timeout={timeout}s");
        match services.get(&(ns.to_string(), name.to_string())) {
            None => return Err(format!("failed to call webhook: Post {url:?}: service {name:?} not found")),
            Some(None) => {
                return Err(format!(
                    "failed to call webhook: Post {url:?}: no endpoints available for service {name:?}"
                ));
            }
            Some(Some(addr)) => (url, Some((host, *addr))),
        }
    } else {
        return Err("clientConfig has neither url nor service".into());
    };
    let post_err = |e: String| format!("failed to call webhook: Post {url:?}: {e}");
    let mut roots = rustls::RootCertStore::empty();
    if let Some(b) = cc.get("caBundle").and_then(Value::as_str) {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| post_err(format!("invalid caBundle: {e}")))?;
        use rustls_pki_types::pem::PemObject;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| post_err(format!("invalid caBundle: {e}")))?;
            roots.add(cert).map_err(|e| post_err(format!("invalid caBundle: {e}")))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| post_err(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut builder = reqwest::Client::builder().use_preconfigured_tls(tls).timeout(Duration::from_secs(timeout));
    if let Some((host, addr)) = &resolve {
        builder = builder.resolve(host, *addr);
    }
    let client = builder.build().map_err(|e| post_err(e.to_string()))?;
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
    let resp =
        client.post(&url).header("Content-Type", "application/json").body(body.to_string()).send().await.map_err(
            |e| {
                if e.is_timeout() { post_err("context deadline exceeded".into()) } else { post_err(error_chain(&e)) }
            },
        )?;
    let code = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| post_err(e.to_string()))?;
    if !(200..300).contains(&code) {
        return Err(format!("received invalid webhook response: status code {code}: {text}"));
    }
    let review: Value = serde_json::from_str(&text).map_err(|e| format!("received invalid webhook response: {e}"))?;
    review.get("response").cloned().ok_or_else(|| "received invalid webhook response: no response".to_string())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn conds(exprs: &[&str]) -> Value {
        let list: Vec<Value> =
            exprs.iter().enumerate().map(|(i, e)| json!({"name": format!("c{i}"), "expression": e})).collect();
        json!({"matchConditions": list})
    }

    #[test]
    fn match_conditions_are_judged_as_the_api_server_judges_them() {
        let req = json!({"operation": "CREATE", "object": {"metadata": {"name": "x"}}});
        assert_eq!(match_conditions(&conds(&["true"]), &req), Ok(true));
        // A false condition wins over an error before it.
        assert_eq!(match_conditions(&conds(&["2 / 0 == 1", "false"]), &req), Ok(false));
        // Errors are worded as Kubernetes' CEL filter words them (cel-go's message).
        assert_eq!(
            match_conditions(&conds(&["2 / 0 == 1"]), &req).map_err(|e| e.to_string()),
            Err("expression '2 / 0 == 1' resulted in error: division by zero".to_string())
        );
        let two = match_conditions(&conds(&["2 / 0 == 1", "1 % 0 == 1"]), &req).unwrap_err().to_string();
        assert!(two.starts_with("[expression '2 / 0 == 1'") && two.contains("modulus by zero"), "{two}");
    }
}
