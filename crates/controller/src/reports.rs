//! PolicyReports from admission results, shaped as Kyverno 1.19 writes them
//! (`wgpolicyk8s.io/v1alpha2` PolicyReport, ClusterPolicyReport for cluster-scoped objects):
//! named after the object's uid, in its namespace, labelled
//! `app.kubernetes.io/managed-by: kyverno`, owned by the object (so it goes when the object
//! goes), with `scope`, all five `summary` counts and the results in Kyverno's order.
//!
//! Unlike Kyverno there are no intermediate objects (no EphemeralReports in etcd): the server
//! hands each request's results over through a bounded channel; here they wait in a bounded
//! map, merged per object (a later request replaces the results of the policies it
//! evaluated), until the object exists — a validating webhook sees a CREATE before the object
//! is stored, and a report written before its owner would be garbage-collected at once. Every
//! replica writes the results of the requests it served, with optimistic concurrency on the
//! report (a conflict re-reads and merges again). What cannot be written (the map is full, the
//! object never appears) is dropped and counted in `verno_reports_dropped_total`; the backlog
//! is `verno_reports_backlog`.
//!
//! Background scans write through the same writer (`scan.rs`); results carry the rules'
//! `reportProperties` and Pod Security properties as the engine renders them
//! (`verno_engine::report`), and the group is `wgpolicyk8s.io` or `openreports.io` as
//! configured.

use crate::metrics::Metrics;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use verno_engine::report::{self, ReportNotice};

/// How the report writer paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Objects whose results may wait at once; more are dropped and counted.
    pub max_pending: usize,
    /// How long results wait before the first write attempt (the object is being stored).
    pub delay: Duration,
    /// How long the writer keeps trying for an object that does not appear.
    pub give_up: Duration,
    /// Background scans report the background-scanned policies: their admission results are
    /// not written (the scan's replace them moments later, and two writers of one result
    /// would race).
    pub leave_scanned: bool,
    /// Write `openreports.io` Reports instead of `wgpolicyk8s.io` PolicyReports.
    pub openreports: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pending: 10_000,
            delay: Duration::from_millis(300),
            give_up: Duration::from_secs(15),
            leave_scanned: false,
            openreports: false,
        }
    }
}

struct Pending {
    notice: ReportNotice,
    since: Instant,
}

/// Merges a later request's results for the same object: the rules it evaluated replace
/// their earlier results.
fn merge(into: &mut ReportNotice, later: ReportNotice) {
    into.results.retain(|r| !evaluated_by(&later.evaluated, r));
    into.results.extend(later.results);
    for e in later.evaluated {
        if !into.evaluated.contains(&e) {
            into.evaluated.push(e);
        }
    }
    if into.resource.uid.is_empty() || !later.resource.uid.is_empty() {
        into.resource = later.resource;
    }
}

fn evaluated_by(evaluated: &[report::Evaluated], result: &Value) -> bool {
    evaluated.iter().any(|e| e.covers(result))
}

/// Where pending results wait: the object's uid, or — for a CREATE seen by a mutating webhook,
/// before the API server assigned the uid — its kind, namespace and name.
fn pending_key(n: &ReportNotice) -> String {
    let r = &n.resource;
    if r.uid.is_empty() { format!("{}/{}/{}/{}", r.api_version, r.kind, r.namespace, r.name) } else { r.uid.clone() }
}

/// The report for `n` given the one stored (if any), at `now` (unix seconds); `None` when it
/// has no result left (a stored one is then deleted).
pub fn merged_report(n: &ReportNotice, stored: Option<&Value>, now: i64) -> Option<Value> {
    let mut results: Vec<Value> = stored
        .and_then(|s| s.get("results"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| !evaluated_by(&n.evaluated, r))
        .cloned()
        .collect();
    results.extend(n.results.iter().cloned().map(|mut r| {
        if let Some(m) = r.as_object_mut() {
            m.insert("timestamp".into(), json!({"seconds": now, "nanos": 0}));
        }
        r
    }));
    let mut doc = report::document(&n.resource, results)?;
    if let (Some(rv), Some(m)) = (
        stored.and_then(|s| s.pointer("/metadata/resourceVersion")),
        doc.get_mut("metadata").and_then(Value::as_object_mut),
    ) {
        m.insert("resourceVersion".into(), rv.clone());
    }
    Some(doc)
}

enum Written {
    Done,
    /// The object is not there (yet).
    NotYet,
    /// The object is gone or was replaced: nothing to write.
    Gone,
}

/// The report API for a resource in `namespace` (cluster-scoped: empty).
pub fn report_api(client: &kube::Client, namespace: &str, open: bool) -> Api<DynamicObject> {
    let ar = report_resource(namespace.is_empty(), open);
    if namespace.is_empty() {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), namespace, &ar)
    }
}

/// Where reports live: `wgpolicyk8s.io/v1alpha2` PolicyReports, or with `open`
/// `openreports.io/v1alpha1` Reports (Kyverno's `--openreportsEnabled`).
fn report_resource(cluster: bool, open: bool) -> ApiResource {
    let (group, version, kind, plural) = match (open, cluster) {
        (false, true) => ("wgpolicyk8s.io", "v1alpha2", "ClusterPolicyReport", "clusterpolicyreports"),
        (false, false) => ("wgpolicyk8s.io", "v1alpha2", "PolicyReport", "policyreports"),
        (true, true) => ("openreports.io", "v1alpha1", "ClusterReport", "clusterreports"),
        (true, false) => ("openreports.io", "v1alpha1", "Report", "reports"),
    };
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Every PolicyReport (or every ClusterPolicyReport), in all namespaces.
pub fn all_reports(client: &kube::Client, cluster: bool, open: bool) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &report_resource(cluster, open))
}

async fn write(
    client: &kube::Client,
    n: &ReportNotice,
    metrics: &Metrics,
    limits: &Limits,
) -> Result<Written, kube::Error> {
    let r = &n.resource;
    let ar = ApiResource {
        group: n.group.clone(),
        version: n.version.clone(),
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        plural: n.plural.clone(),
    };
    let objects: Api<DynamicObject> = if r.namespace.is_empty() {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), &r.namespace, &ar)
    };
    let mut adopted;
    let mut n = n;
    match objects.get_metadata_opt(&r.name).await {
        Ok(None) => return Ok(Written::NotYet),
        // Found by name (a mutating webhook's CREATE had no uid yet): the report is the
        // stored object's.
        Ok(Some(o)) if r.uid.is_empty() => {
            adopted = n.clone();
            adopted.resource.uid = o.metadata.uid.unwrap_or_default();
            if adopted.resource.uid.is_empty() {
                return Ok(Written::Gone);
            }
            n = &adopted;
        }
        Ok(Some(o)) if o.metadata.uid.as_deref() != Some(r.uid.as_str()) => return Ok(Written::Gone),
        Ok(Some(_)) => {}
        // Verno may not read every kind (Secrets are outside the `view` role): the request
        // was admitted a moment ago, so the object is taken to exist.
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        Err(e) => return Err(e),
    }
    let r = &n.resource;
    let reports = report_api(client, &r.namespace, limits.openreports);
    for _ in 0..5 {
        let stored = reports.get_opt(&r.uid).await?;
        let stored_json = stored.as_ref().map(serde_json::to_value).transpose().map_err(kube::Error::SerdeError)?;
        let now = chrono::Utc::now().timestamp();
        let result = match (merged_report(n, stored_json.as_ref(), now), stored.is_some()) {
            (None, false) => return Ok(Written::Done),
            (None, true) => reports.delete(&r.uid, &Default::default()).await.map(|_| 0),
            (Some(mut doc), exists) => {
                if limits.openreports {
                    report::to_openreports(&mut doc);
                }
                let bytes = doc.to_string().len() as u64;
                let obj: DynamicObject = serde_json::from_value(doc).map_err(kube::Error::SerdeError)?;
                if exists {
                    reports.replace(&r.uid, &PostParams::default(), &obj).await.map(|_| bytes)
                } else {
                    reports.create(&PostParams::default(), &obj).await.map(|_| bytes)
                }
            }
        };
        match result {
            Ok(bytes) => {
                metrics.report_written(bytes);
                return Ok(Written::Done);
            }
            // Another replica wrote it meanwhile: read it again and merge.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Written::NotYet)
}

/// Drops from `n` the rules background scans report.
fn leave_scanned(n: &mut ReportNotice, set: &verno_engine::PolicySet) {
    let scanned = |policy: &str, source: &str, rule: &str| {
        set.policies().iter().any(|p| {
            report::source(p.kind) == source && report::report_key(p) == policy && report::scanned_rule(p, rule)
        })
    };
    for e in &mut n.evaluated {
        let (policy, source) = (e.policy.clone(), e.source);
        e.rules.retain(|rule| !scanned(&policy, source, rule));
    }
    n.evaluated.retain(|e| !e.rules.is_empty());
    n.results.retain(|r| {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        !scanned(s("policy"), s("source"), s("rule"))
    });
}

/// Writes admission results into reports until Verno stops.
pub async fn run(shared: crate::runtime::Shared, mut rx: mpsc::Receiver<ReportNotice>, limits: Limits) {
    let (client, server, mut stop) = (shared.client.clone(), shared.server.clone(), shared.stop.clone());
    let metrics = &shared.metrics;
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = rx.recv() => {
                let Some(mut n) = n else { return };
                if limits.leave_scanned {
                    leave_scanned(&mut n, &server.current());
                    if n.evaluated.is_empty() {
                        continue;
                    }
                }
                let full = pending.len() >= limits.max_pending;
                let key = pending_key(&n);
                match pending.get_mut(&key) {
                    Some(p) => merge(&mut p.notice, n),
                    None if full => metrics.report_dropped(),
                    None => {
                        pending.insert(key, Pending { notice: n, since: Instant::now() });
                    }
                }
                metrics.set_report_backlog(pending.len());
                continue;
            }
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let due: Vec<String> =
            pending.iter().filter(|(_, p)| p.since.elapsed() >= limits.delay).map(|(k, _)| k.clone()).collect();
        for uid in due {
            let Some(p) = pending.get(&uid) else { continue };
            let outcome = tokio::select! {
                w = write(&client, &p.notice, metrics, &limits) => w,
                _ = stop.wait_for(|s| *s) => return,
            };
            let done = match outcome {
                Ok(Written::Done | Written::Gone) => true,
                Ok(Written::NotYet) => false,
                Err(e) => {
                    tracing::debug!(error = %e, uid = %uid, "report not written yet");
                    false
                }
            };
            if done {
                pending.remove(&uid);
            } else if p.since.elapsed() >= limits.give_up {
                tracing::warn!(uid = %uid, kind = %p.notice.resource.kind, name = %p.notice.resource.name,
                    "admission results dropped: the object did not appear or its report could not be written");
                pending.remove(&uid);
                metrics.report_dropped();
            }
        }
        metrics.set_report_backlog(pending.len());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use verno_engine::ResourceRef;

    fn notice(policy: &str, result: &str) -> ReportNotice {
        ReportNotice {
            resource: ResourceRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "shop".into(),
                name: "web".into(),
                uid: "u-1".into(),
            },
            group: "apps".into(),
            version: "v1".into(),
            plural: "deployments".into(),
            evaluated: vec![report::Evaluated { policy: policy.into(), source: "kyverno", rules: vec!["r".into()] }],
            results: vec![json!({"source": "kyverno", "policy": policy, "rule": "r", "result": result})],
        }
    }

    #[test]
    fn a_report_is_named_and_owned_by_its_object_and_later_results_replace_a_policys() {
        let first = merged_report(&notice("b", "fail"), None, 100).unwrap();
        assert_eq!(first["kind"], "PolicyReport");
        assert_eq!(first["metadata"]["name"], "u-1");
        assert_eq!(first["metadata"]["namespace"], "shop");
        assert_eq!(first["metadata"]["labels"]["app.kubernetes.io/managed-by"], "kyverno");
        assert_eq!(first["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(first["scope"]["kind"], "Deployment");
        assert_eq!(first["results"][0]["timestamp"], json!({"seconds": 100, "nanos": 0}));
        assert_eq!(first["summary"], json!({"pass": 0, "fail": 1, "warn": 0, "error": 0, "skip": 0}));
        // Another policy's results join; the same policy's are replaced.
        let second = merged_report(&notice("a", "pass"), Some(&first), 200).unwrap();
        assert_eq!(second["results"].as_array().unwrap().len(), 2);
        assert_eq!(second["results"][0]["policy"], "a");
        let third = merged_report(&notice("b", "pass"), Some(&second), 300).unwrap();
        assert_eq!(third["summary"], json!({"pass": 2, "fail": 0, "warn": 0, "error": 0, "skip": 0}));
        // A policy that no longer yields a result leaves none behind.
        let mut none = notice("a", "pass");
        none.results.clear();
        let fourth = merged_report(&none, Some(&third), 400).unwrap();
        assert_eq!(fourth["results"].as_array().unwrap().len(), 1);
        let mut gone = notice("b", "pass");
        gone.results.clear();
        assert!(merged_report(&gone, Some(&fourth), 500).is_none());
    }

    #[test]
    fn pending_results_for_one_object_merge() {
        let mut p = notice("a", "fail");
        merge(&mut p, notice("b", "pass"));
        merge(&mut p, notice("a", "pass"));
        assert_eq!(p.results.len(), 2);
        assert!(p.results.iter().all(|r| r["result"] == "pass"));
        let mut cluster = notice("a", "pass");
        cluster.resource.namespace.clear();
        let r = merged_report(&cluster, None, 1).unwrap();
        assert_eq!(r["kind"], "ClusterPolicyReport");
        assert!(r["metadata"].get("namespace").is_none());
    }
}
