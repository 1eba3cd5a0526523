//! Operator escape hatches: `verno break-glass` and `verno doctor`.
//!
//! Webhook configurations are never sent to admission webhooks by the API server, so these
//! always work, even when Verno is down and its entries are fail-closed.

use crate::webhooks::{BREAK_GLASS_ANNOTATION, ConfigNames, as_json, config_api};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

/// Where the failure policies in force before break-glass are kept, for `--restore`.
pub const ORIGINAL_ANNOTATION: &str = "verno.io/break-glass-original";
pub const PART_OF_SELECTOR: &str = "app.kubernetes.io/part-of=verno";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every entry to `failurePolicy: Ignore`.
    Ignore,
    /// Put back what was there before.
    Restore,
}

/// Verno's configurations: those labelled part-of=verno (under either set of names), and
/// Verno's own names in case the labels were stripped (not Kyverno's: those could be a Kyverno
/// install's).
async fn configs(client: &kube::Client) -> Result<Vec<(&'static str, Value)>, kube::Error> {
    let lp = ListParams::default().labels(PART_OF_SELECTOR);
    let mut out = Vec::new();
    for (kind, name, _) in ConfigNames::VERNO.configs() {
        let api = config_api(client, kind);
        let listed: Vec<Value> = api.list(&lp).await?.items.into_iter().map(as_json).collect();
        let named = listed.iter().any(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
        out.extend(listed.into_iter().map(|o| (kind, o)));
        if !named && let Some(o) = api.get_opt(name).await? {
            out.push((kind, as_json(o)));
        }
    }
    Ok(out)
}

/// Flips (or restores) every Verno webhook entry's failure policy. Returns one line per
/// configuration saying what was done.
pub async fn break_glass(client: &kube::Client, mode: Mode, dry_run: bool) -> Result<Vec<String>, kube::Error> {
    let mut report = Vec::new();
    for (kind, cfg) in configs(client).await? {
        let name = cfg.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let entries = cfg.get("webhooks").and_then(Value::as_array).cloned().unwrap_or_default();
        let annotations = cfg.pointer("/metadata/annotations").cloned().unwrap_or(json!({}));
        let mut ops = Vec::new();
        if cfg.pointer("/metadata/annotations").is_none() {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        }
        match mode {
            Mode::Ignore => {
                let original: Value = entries
                    .iter()
                    .map(|w| {
                        (
                            w["name"].as_str().unwrap_or("").to_string(),
                            w.get("failurePolicy").cloned().unwrap_or(json!("Fail")),
                        )
                    })
                    .collect::<serde_json::Map<_, _>>()
                    .into();
                for (i, _) in entries.iter().enumerate() {
                    ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/failurePolicy"), "value": "Ignore"}));
                }
                ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", BREAK_GLASS_ANNOTATION.replace('/', "~1")), "value": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}));
                if annotations.get(ORIGINAL_ANNOTATION).is_none() {
                    ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", ORIGINAL_ANNOTATION.replace('/', "~1")), "value": original.to_string()}));
                }
                report.push(format!("{kind} {name}: {} entries set to failurePolicy Ignore", entries.len()));
            }
            Mode::Restore => {
                let Some(original) = annotations
                    .get(ORIGINAL_ANNOTATION)
                    .and_then(Value::as_str)
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                else {
                    report.push(format!("{kind} {name}: not under break-glass, left alone"));
                    continue;
                };
                for (i, w) in entries.iter().enumerate() {
                    if let Some(fp) = w["name"].as_str().and_then(|n| original.get(n)) {
                        ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/failurePolicy"), "value": fp}));
                    }
                }
                for a in [BREAK_GLASS_ANNOTATION, ORIGINAL_ANNOTATION] {
                    if annotations.get(a).is_some() {
                        ops.push(
                            json!({"op": "remove", "path": format!("/metadata/annotations/{}", a.replace('/', "~1"))}),
                        );
                    }
                }
                report.push(format!("{kind} {name}: failure policies restored"));
            }
        }
        if dry_run {
            continue;
        }
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
        let pp = PatchParams { field_manager: Some("verno-break-glass".into()), ..Default::default() };
        config_api(client, kind).patch(&name, &pp, &Patch::<()>::Json(patch)).await?;
    }
    if report.is_empty() {
        report.push("no Verno webhook configurations found".into());
    }
    Ok(report)
}

/// A health report: fail-closed entries and what they match, ready endpoints behind the
/// Service, break-glass state, and the leader's lease age.
pub async fn doctor(client: &kube::Client, namespace: &str, lease_name: &str) -> Result<String, kube::Error> {
    let mut out = String::new();
    for (kind, cfg) in configs(client).await? {
        let name = cfg.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        out.push_str(&format!("{kind} {name}"));
        if let Some(at) = cfg
            .pointer(&format!("/metadata/annotations/{}", BREAK_GLASS_ANNOTATION.replace('/', "~1")))
            .and_then(Value::as_str)
        {
            out.push_str(&format!(" (break-glass since {at})"));
        }
        out.push('\n');
        for w in cfg.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
            let fp = w.get("failurePolicy").and_then(Value::as_str).unwrap_or("Fail");
            let rules = w.get("rules").and_then(Value::as_array).map(Vec::len).unwrap_or(0);
            let resources: Vec<&str> = w
                .get("rules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .flat_map(|r| {
                    r.get("resources").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
                })
                .collect();
            let svc = w.pointer("/clientConfig/service");
            let target = svc
                .map(|s| format!("{}/{}", s["namespace"].as_str().unwrap_or(""), s["name"].as_str().unwrap_or("")))
                .unwrap_or_else(|| w.pointer("/clientConfig/url").and_then(Value::as_str).unwrap_or("?").to_string());
            let ready = match svc {
                Some(s) => {
                    ready_endpoints(client, s["namespace"].as_str().unwrap_or(""), s["name"].as_str().unwrap_or(""))
                        .await
                        .map(|n| n.to_string())
                        .unwrap_or_else(|_| "unknown".into())
                }
                None => "n/a".into(),
            };
            let warn = if fp == "Fail" && rules > 0 && ready == "0" {
                "  ← fail-closed with no ready endpoints: matching writes are refused"
            } else {
                ""
            };
            out.push_str(&format!(
                "  {}: failurePolicy {fp}, timeout {}s, {rules} rule groups{}, service {target}, ready endpoints {ready}{warn}\n",
                w["name"].as_str().unwrap_or(""),
                w.get("timeoutSeconds").and_then(Value::as_i64).unwrap_or(10),
                if resources.is_empty() { String::new() } else { format!(" ({})", resources.join(", ")) },
            ));
        }
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    match leases.get_opt(lease_name).await? {
        Some(l) => {
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_else(|| "(none)".into());
            let age = spec
                .renew_time
                .map(|t| format!("{}s ago", (k8s_openapi::jiff::Timestamp::now().as_second() - t.0.as_second()).max(0)))
                .unwrap_or_else(|| "never".into());
            out.push_str(&format!("leader: {holder}, lease renewed {age}\n"));
        }
        None => out.push_str(&format!("leader: none (no Lease {namespace}/{lease_name})\n")),
    }
    let deadline = crate::probe::IDLE_DEADLINE.as_secs() as i64;
    out.push_str(&probe_line(
        leases.get_opt(crate::probe::PROBE_LEASE).await?.as_ref(),
        k8s_openapi::jiff::Timestamp::now(),
        deadline,
    ));
    Ok(out)
}

/// The probe's line of the report: how long ago the API server last reached Verno.
pub fn probe_line(lease: Option<&Lease>, now: k8s_openapi::jiff::Timestamp, deadline: i64) -> String {
    let Some(lease) = lease else { return "probe: no probe Lease yet (the leader creates it)\n".into() };
    match crate::probe::last_request(lease) {
        Some(t) => {
            let age = (now.as_second() - t.as_second()).max(0);
            let warn = if age > deadline { format!("  ← over {deadline}s: the API server cannot reach Verno (Service, endpoints, network policy or caBundle)") } else { String::new() };
            format!("probe: the API server last reached Verno {age}s ago{warn}\n")
        }
        None => "probe: the API server has never reached Verno through the probe entry  ← check the Service, endpoints, network policy and caBundle\n".into(),
    }
}

/// Ready endpoints of a Service, from its EndpointSlices.
async fn ready_endpoints(client: &kube::Client, namespace: &str, service: &str) -> Result<usize, kube::Error> {
    let api: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let slices = api.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}"))).await?;
    Ok(slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .count())
}
