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
    let r = &c.resource;
    if r.group == "admissionregistration.k8s.io" {
        return Ok((None, Vec::new()));
    }
    let (hooks, ns_labels, services, schema) = {
        let s = lock(&inner.store);
        let mut hooks = Vec::new();
        for (plural, mutating) in [("mutatingwebhookconfigurations", true), ("validatingwebhookconfigurations", false)]
        {
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
        (hooks, ns_labels, s.services.clone(), schema)
    };
    // A custom resource is checked against its schema after the mutating webhooks and before
    // the validating ones, as the API server validates the object between the two.
    let mut schema = schema;
    let check_schema = |object: Option<&Value>, schema: &mut Option<Value>| -> Result<(), Response> {
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
    };
    let op = c.op.as_str();
    let mut object = c.new.clone();
    let mut mutated = false;
    let mut warnings: Vec<String> = Vec::new();
    for hook in hooks {
        if !hook.mutating {
            check_schema(object.as_ref(), &mut schema)?;
        }
        let w = &hook.entry;
        let rules_ok = w.get("rules").and_then(Value::as_array).is_some_and(|rules| {
            rules.iter().any(|rule| rule_matches(rule, op, r.group, r.version, r.plural, r.namespaced))
        });
        if !rules_ok {
            continue;
        }
        if ns_labels.as_ref().is_some_and(|l| !selector_matches(w.get("namespaceSelector"), l)) {
            continue;
        }
        let obj_sel = w.get("objectSelector");
        if !selector_matches(obj_sel, &labels_of(object.as_ref()))
            && !selector_matches(obj_sel, &labels_of(c.old.as_ref()))
        {
            continue;
        }
        let fail_open = w.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        // A dry run reaches only webhooks that declare no side effects (or none on dry runs),
        // and tells them it is one; the API server refuses the request otherwise.
        let side_effects = w.get("sideEffects").and_then(Value::as_str).unwrap_or("Unknown");
        if dry_run && !matches!(side_effects, "None" | "NoneOnDryRun") {
            let text = format!("admission webhook {:?} does not support dry run", hook.name);
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": text, "reason": "BadRequest", "code": 400});
            return Err(ok_json_headers(StatusCode::BAD_REQUEST, &body, &[]));
        }
        let mut request = review_request(c, object.as_ref(), user);
        if let Some(m) = request.as_object_mut() {
            m.insert("dryRun".into(), Value::Bool(dry_run));
        }
        let call = |outcome: String| Call {
            webhook: hook.name.clone(),
            operation: op.to_string(),
            object: format!("{}/{}", c.k.1, c.k.2),
            outcome,
        };
        match match_conditions(w, &request) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                lock(&inner.store).admission_log.push(call(format!("error: {e}")));
                if fail_open {
                    continue;
                }
                // Kubernetes refuses the request as forbidden, naming the resource.
                let resource =
                    if r.group.is_empty() { r.plural.to_string() } else { format!("{}.{}", r.plural, r.group) };
                return Err(status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!("{resource} {:?} is forbidden: {e}", c.k.2),
                ));
            }
        }
        let result = call_webhook(w, &request, &services).await;
        match result {
            Err(e) => {
                lock(&inner.store).admission_log.push(call(format!("error: {e}")));
                if fail_open {
                    continue;
                }
                return Err(status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    format!("Internal error occurred: failed calling webhook {:?}: {e}", hook.name),
                ));
            }
            Ok(resp) => {
                warnings.extend(strings(resp.get("warnings")).into_iter().map(str::to_string));
                if resp.get("allowed").and_then(Value::as_bool) != Some(true) {
                    lock(&inner.store).admission_log.push(call("denied".into()));
                    return Err(denied(&hook.name, resp.get("status"), &warnings));
                }
                let patch = resp.get("patch").and_then(Value::as_str);
                if let (true, Some(p), Some(o)) = (hook.mutating, patch, object.as_mut()) {
                    let applied = base64::engine::general_purpose::STANDARD
                        .decode(p)
                        .map_err(|e| e.to_string())
                        .and_then(|b| serde_json::from_slice::<json_patch::Patch>(&b).map_err(|e| e.to_string()))
                        .and_then(|p| json_patch::patch(o, &p).map_err(|e| e.to_string()));
                    if let Err(e) = applied {
                        lock(&inner.store).admission_log.push(call(format!("error: {e}")));
                        return Err(status(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "InternalError",
                            format!(
                                "Internal error occurred: JSON patch from webhook {:?} could not be applied: {e}",
                                hook.name
                            ),
                        ));
                    }
                    mutated = true;
                    lock(&inner.store).admission_log.push(call("patched".into()));
                } else {
                    lock(&inner.store).admission_log.push(call("allowed".into()));
                }
            }
        }
    }
    check_schema(object.as_ref(), &mut schema)?;
    Ok((if mutated { object } else { None }, warnings))
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

/// A webhook's matchConditions, as the API server evaluates them: every condition runs; one
/// that is false means no call (whatever failed besides); otherwise the errors, worded as
/// Kubernetes' CEL filter words them (several in brackets, as its aggregate error).
fn match_conditions(w: &Value, request: &Value) -> Result<bool, String> {
    let Some(conds) = w.get("matchConditions").and_then(Value::as_array) else { return Ok(true) };
    let mut vars = verno_cel::Vars::default();
    vars.set("request", request);
    vars.set("object", request.get("object").unwrap_or(&Value::Null));
    vars.set("oldObject", request.get("oldObject").unwrap_or(&Value::Null));
    let mut errors = Vec::new();
    for cond in conds {
        let source = cond.get("expression").and_then(Value::as_str).unwrap_or("");
        match verno_cel::Expr::compile(source).and_then(|e| e.eval_bool(&vars)) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => errors.push(format!("expression '{source}' resulted in error: {e}")),
        }
    }
    match errors.as_slice() {
        [] => Ok(true),
        [one] => Err(one.clone()),
        many => Err(format!("[{}]", many.join(", "))),
    }
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
            match_conditions(&conds(&["2 / 0 == 1"]), &req),
            Err("expression '2 / 0 == 1' resulted in error: division by zero".to_string())
        );
        let two = match_conditions(&conds(&["2 / 0 == 1", "1 % 0 == 1"]), &req).unwrap_err();
        assert!(two.starts_with("[expression '2 / 0 == 1'") && two.contains("modulus by zero"), "{two}");
    }
}
