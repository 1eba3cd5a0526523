//! Policy report results as Kyverno writes them (`wgpolicyk8s.io/v1alpha2` PolicyReport
//! `results[]`, Kyverno's `ToPolicyReportResult`): what the reports controller stores for a
//! resource. The engine has no clock: the caller stamps `timestamp`.

use crate::outcome::{PolicyResponse, Status};
use crate::policy::{CompiledPolicy, RuleBody};
use serde_json::{Map, Value, json};
use verno_api::Kind;

/// What one admission request leaves for the resource's report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportNotice {
    pub resource: crate::ResourceRef,
    /// Where the object is read back (it must exist before its report is written): API group,
    /// version and plural.
    pub group: String,
    pub version: String,
    pub plural: String,
    /// What was evaluated: the earlier results of these rules are replaced.
    pub evaluated: Vec<Evaluated>,
    /// The new results, without `timestamp`.
    pub results: Vec<Value>,
}

/// The rules of one policy a webhook call or a scan evaluated, by report key and source.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    pub policy: String,
    pub source: &'static str,
    pub rules: Vec<String>,
}

impl Evaluated {
    /// The rules of `p` that `phase` evaluates: its validation rules (and the rules this build
    /// answers with an error, which run with validation), or its mutation rules.
    pub fn of(p: &CompiledPolicy, phase: crate::Phase) -> Evaluated {
        let rules = p
            .rules
            .iter()
            .filter(|r| match phase {
                // Mutate-existing rules are reported by the background controller once their
                // targets are patched, not when the trigger is admitted.
                crate::Phase::Mutate => matches!(&r.body, RuleBody::Mutate(m) if m.targets.is_empty()),
                _ => matches!(r.body, RuleBody::Validate(_) | RuleBody::Unsupported { .. } | RuleBody::VerifyImages(_)),
            })
            .map(|r| r.name.clone())
            .collect::<Vec<_>>();
        // A CEL kind's result decided by an exception is named `exception`.
        let mut rules = rules;
        if !rules.is_empty() && is_cel(p.kind) {
            rules.push(crate::EXCEPTION_RULE.to_string());
        }
        Evaluated { policy: report_key(p), source: source(p.kind), rules }
    }

    /// Whether a stored result is one of these rules' (and so replaced by their new results).
    pub fn covers(&self, result: &Value) -> bool {
        let s = |k: &str| result.get(k).and_then(Value::as_str).unwrap_or("");
        s("policy") == self.policy && s("source") == self.source && self.rules.iter().any(|r| r == s("rule"))
    }
}

/// Whether background scans report this rule of `p` (a validation rule of a background-scanned
/// policy): its admission results are left to the scan.
/// A CEL kind's `exception` result stands for its rules.
pub fn scanned_rule(p: &CompiledPolicy, rule: &str) -> bool {
    let exception = rule == crate::EXCEPTION_RULE && is_cel(p.kind);
    p.in_background_scan()
        && p.rules
            .iter()
            .any(|r| (exception || r.name == rule) && (matches!(r.body, RuleBody::Validate(_)) || p.scans_mutation(r)))
}

/// The CEL kinds (their exceptions decide results named [`crate::EXCEPTION_RULE`]).
pub fn is_cel(kind: Kind) -> bool {
    !matches!(kind, Kind::ClusterPolicy | Kind::Policy)
}

/// The `source` of a policy kind's results.
pub fn source(kind: Kind) -> &'static str {
    match kind {
        Kind::ValidatingPolicy | Kind::NamespacedValidatingPolicy => "KyvernoValidatingPolicy",
        Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy => "KyvernoMutatingPolicy",
        Kind::ValidatingAdmissionPolicy => "ValidatingAdmissionPolicy",
        Kind::MutatingAdmissionPolicy => "MutatingAdmissionPolicy",
        Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy => "KyvernoGeneratingPolicy",
        _ => "kyverno",
    }
}

pub use crate::policy::ReportMeta;

/// Kyverno's `properties.process`: a policy scanned in the background reports as such, even
/// for results of admission requests.
fn process(p: &CompiledPolicy) -> &'static str {
    // Kyverno reports a GeneratingPolicy's results as the admission review's, always.
    if matches!(p.kind, Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy) {
        "admission review"
    } else if p.background {
        "background scan"
    } else if p.admission {
        "admission review"
    } else {
        ""
    }
}

/// A policy's name in reports: `name`, or `namespace/name` for a namespaced policy.
pub fn report_key(p: &CompiledPolicy) -> String {
    if p.kind.is_namespaced() { p.key() } else { p.name.clone() }
}

/// The report results of one policy's response (rules that did not apply leave none).
pub fn results(p: &CompiledPolicy, r: &PolicyResponse) -> Vec<Value> {
    results_with(p, r, false)
}

/// [`results`], with `audit_warn` (the CLI's `--audit-warn`): a failure of an Audit rule is
/// reported as `warn`.
pub fn results_with(p: &CompiledPolicy, r: &PolicyResponse, audit_warn: bool) -> Vec<Value> {
    let meta = &p.report_meta;
    if meta.disabled {
        return Vec::new();
    }
    let scored = meta.scored;
    let (severity, category) = (meta.severity.as_deref(), meta.category.as_deref());
    let src = source(p.kind);
    let policy = report_key(p);
    r.rules
        .iter()
        .map(|rr| {
            let mut result = match rr.status {
                Status::Pass => "pass",
                Status::Fail => "fail",
                Status::Warn => "warn",
                Status::Error => "error",
                Status::Skip => "skip",
            };
            let mut message = rr.message.clone();
            // Kyverno's CEL engines answer "success" for a passing policy.
            if src == "KyvernoValidatingPolicy" && result == "pass" && message.is_empty() && rr.exceptions().is_empty()
            {
                message = "success".into();
            }
            if result == "fail" && (!scored || (audit_warn && p.rule_action(&rr.name) == crate::policy::Action::Audit))
            {
                result = "warn";
            }
            let mut out = Map::new();
            out.insert("source".into(), json!(src));
            out.insert("policy".into(), json!(policy));
            // A CEL kind's Pod-controller rules report as its own rule does: without a name.
            let autogen = is_cel(p.kind) && matches!(rr.name.as_str(), "autogen-" | "autogen-cronjob-");
            if !rr.name.is_empty() && !autogen {
                out.insert("rule".into(), json!(rr.name.as_str()));
            } else if matches!(p.kind, Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy) {
                // Kyverno names a GeneratingPolicy's one result after the policy.
                out.insert("rule".into(), json!(p.name));
            }
            out.insert("result".into(), json!(result));
            if !message.is_empty() {
                out.insert("message".into(), json!(message));
            }
            if scored {
                out.insert("scored".into(), json!(true));
            }
            if let Some(s) = severity {
                out.insert("severity".into(), json!(s));
            }
            if let Some(c) = category {
                out.insert("category".into(), json!(c));
            }
            let mut props = Map::new();
            for (k, v) in rr.properties() {
                props.insert(k.clone(), json!(v));
            }
            // What a generation made (Kyverno's `generated-resources`, joined by `; `).
            if !rr.generated().is_empty() {
                let made: Vec<String> = rr.generated().iter().map(resource_info).collect();
                props.insert("generated-resources".into(), json!(made.join("; ")));
            }
            let proc = process(p);
            if !proc.is_empty() {
                props.insert("process".into(), json!(proc));
            }
            if !rr.exceptions().is_empty() {
                let names: Vec<&str> = rr.exceptions().iter().map(|k| k.rsplit('/').next().unwrap_or(k)).collect();
                props.insert("exceptions".into(), json!(names.join(",")));
            }
            if !props.is_empty() {
                out.insert("properties".into(), Value::Object(props));
            }
            Value::Object(out)
        })
        .collect()
}

/// A resource as Kyverno's report properties name it (`generated-resources`,
/// `patched-target`): `group/version, Kind=KIND Name=NAME Namespace=NS` (`/v1, …` for the
/// core group).
pub fn resource_info(o: &Value) -> String {
    let s = |ptr: &str| o.pointer(ptr).and_then(Value::as_str).unwrap_or("");
    let av = s("/apiVersion");
    let gv = if av.contains('/') { av.to_string() } else { format!("/{av}") };
    format!("{gv}, Kind={} Name={} Namespace={}", s("/kind"), s("/metadata/name"), s("/metadata/namespace"))
}

/// A mutate-existing rule's result for one target it patched, as Kyverno's background
/// controller reports it: `mutated KIND/NAME in namespace NS`, with `patched-target`.
pub fn patched_target_result(rule: &str, target: &Value) -> crate::RuleResponse {
    let message = crate::mutate::mutated(target);
    let mut r = crate::RuleResponse::new(rule, crate::RuleType::Mutation, Status::Pass, message);
    r.extra_mut().properties = vec![("patched-target".into(), resource_info(target))];
    r
}

/// The per-resource report Kyverno 1.19 writes for `resource` holding `results` (sorted here,
/// summary counted): `wgpolicyk8s.io/v1alpha2` PolicyReport in the resource's namespace, or
/// ClusterPolicyReport for a cluster-scoped resource, named after its uid, labelled
/// `app.kubernetes.io/managed-by: kyverno` and owned by it, with `scope`. `None` without
/// results: Kyverno keeps no empty report.
pub fn document(resource: &crate::ResourceRef, mut results: Vec<Value>) -> Option<Value> {
    if results.is_empty() {
        return None;
    }
    sort(&mut results);
    let r = resource;
    let cluster = r.namespace.is_empty();
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(r.uid));
    if !cluster {
        metadata.insert("namespace".into(), json!(r.namespace));
    }
    metadata.insert("labels".into(), json!({"app.kubernetes.io/managed-by": "kyverno"}));
    metadata.insert(
        "ownerReferences".into(),
        json!([{"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "uid": r.uid}]),
    );
    let mut scope = Map::new();
    scope.insert("apiVersion".into(), json!(r.api_version));
    scope.insert("kind".into(), json!(r.kind));
    scope.insert("name".into(), json!(r.name));
    if !cluster {
        scope.insert("namespace".into(), json!(r.namespace));
    }
    scope.insert("uid".into(), json!(r.uid));
    // Counted before the results are fitted: the summary stays true when some are left out.
    let summary = summary(&results);
    let omitted = fit(&mut results, MAX_REPORT_BYTES);
    if omitted > 0 {
        metadata.insert("annotations".into(), json!({OMITTED_ANNOTATION: omitted.to_string()}));
    }
    Some(json!({
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": if cluster { "ClusterPolicyReport" } else { "PolicyReport" },
        "metadata": metadata,
        "scope": scope,
        "summary": summary,
        "results": results,
    }))
}

/// The same report as `openreports.io/v1alpha1` Report / ClusterReport (Kyverno's
/// `--openreportsEnabled`): the shape is the same, only the API and kind change.
pub fn to_openreports(doc: &mut Value) {
    let Some(m) = doc.as_object_mut() else { return };
    let kind = match m.get("kind").and_then(Value::as_str) {
        Some("ClusterPolicyReport") => "ClusterReport",
        _ => "Report",
    };
    m.insert("apiVersion".into(), json!("openreports.io/v1alpha1"));
    m.insert("kind".into(), json!(kind));
}

/// The most a report's results may take, serialized. etcd refuses a request over 1.5 MiB, and a
/// report it refuses is never written (Kyverno has no cap: fifty Audit policies quoting a large
/// annotation make such a report); this leaves room for the rest of the object.
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;

/// On a report whose results had to be cut to fit ([`fit`]): how many were left out.
pub const OMITTED_ANNOTATION: &str = "verno.io/results-omitted";

/// Fits `results` (in report order) into `max` serialized bytes: long messages are cut (to
/// 1,024, then 256, then 64 characters, marked `… (truncated)`), then results' `properties`
/// dropped, then — only if that is not enough — results left out, passes and skips first, then
/// warnings, then failures and errors. Returns how many were left out.
pub fn fit(results: &mut Vec<Value>, max: usize) -> usize {
    let size = |r: &Value| serde_json::to_vec(r).map_or(0, |b| b.len() + 1);
    let total = |rs: &[Value]| rs.iter().map(size).sum::<usize>();
    if total(results) <= max {
        return 0;
    }
    for limit in [1024, 256, 64] {
        for r in results.iter_mut() {
            if let Some(Value::String(m)) = r.get_mut("message")
                && m.chars().count() > limit
            {
                let cut: String = m.chars().take(limit).collect();
                *m = format!("{cut}… (truncated)");
            }
        }
        if total(results) <= max {
            return 0;
        }
    }
    for r in results.iter_mut() {
        if let Some(m) = r.as_object_mut() {
            m.remove("properties");
        }
    }
    let mut used = total(results);
    if used <= max {
        return 0;
    }
    let rank = |r: &Value| match r.get("result").and_then(Value::as_str) {
        Some("fail" | "error") => 0,
        Some("warn") => 1,
        _ => 2,
    };
    // Left out from the end of each class in turn, the least telling class first.
    let sizes: Vec<usize> = results.iter().map(size).collect();
    let mut drop = vec![false; results.len()];
    for class in [2, 1, 0] {
        for (i, r) in results.iter().enumerate().rev() {
            if used <= max {
                break;
            }
            if rank(r) == class {
                used -= sizes.get(i).copied().unwrap_or(0);
                if let Some(d) = drop.get_mut(i) {
                    *d = true;
                }
            }
        }
    }
    let mut flags = drop.iter();
    results.retain(|_| !flags.next().copied().unwrap_or(false));
    drop.iter().filter(|d| **d).count()
}

/// Kyverno's order of results: policy, rule, source, then timestamp.
pub fn sort(results: &mut [Value]) {
    let key = |v: &Value| {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let ts = v.pointer("/timestamp/seconds").and_then(Value::as_i64).unwrap_or(0);
        (s("policy"), s("rule"), s("source"), ts)
    };
    results.sort_by_key(key);
}

/// The five counts, always all present.
pub fn summary(results: &[Value]) -> Value {
    let count = |r: &str| results.iter().filter(|v| v.get("result").and_then(Value::as_str) == Some(r)).count();
    json!({"pass": count("pass"), "fail": count("fail"), "warn": count("warn"), "error": count("error"), "skip": count("skip")})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::{Compiled, RuleResponse, RuleType, compile};

    fn policy(doc: Value) -> CompiledPolicy {
        match compile(&doc, &[]).unwrap() {
            Compiled::Policy(p) => p,
            _ => panic!("not a policy"),
        }
    }

    #[test]
    fn a_report_too_large_for_etcd_is_fitted_under_the_cap_with_a_true_summary() {
        let big = "x".repeat(2048);
        let results: Vec<Value> = (0..800)
            .map(|i| {
                json!({"source": "kyverno", "policy": format!("p{i:03}"), "rule": "r",
                    "result": if i % 2 == 0 { "fail" } else { "pass" }, "message": big,
                    "properties": {"process": "background scan", "note": big}})
            })
            .collect();
        let resource = crate::ResourceRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "shop".into(),
            name: "web".into(),
            uid: "u".into(),
        };
        let doc = document(&resource, results.clone()).unwrap();
        assert!(doc.to_string().len() < 1536 * 1024, "{} bytes", doc.to_string().len());
        assert_eq!(doc["summary"], json!({"pass": 400, "fail": 400, "warn": 0, "error": 0, "skip": 0}));
        let kept = doc["results"].as_array().unwrap();
        assert!(kept.iter().all(|r| r["message"].as_str().unwrap().ends_with("… (truncated)")));
        // Cutting messages and dropping properties was enough: nothing was left out.
        assert_eq!(kept.len(), 800);
        assert!(doc["metadata"].get("annotations").is_none());
        // When even that is not enough, passes go first and the report says how many.
        let mut many: Vec<Value> = (0..10_000)
            .map(|i| {
                json!({"policy": format!("p{i}"), "rule": "r", "result": if i % 2 == 0 { "fail" } else { "pass" },
                "message": "y".repeat(100)})
            })
            .collect();
        let omitted = fit(&mut many, MAX_REPORT_BYTES);
        assert!(omitted > 0);
        assert_eq!(many.iter().filter(|r| r["result"] == "fail").count(), 5_000, "failures are kept before passes");
        assert_eq!(many.len() + omitted, 10_000);
        // A small report is left as it is.
        let mut small = vec![json!({"policy": "p", "rule": "r", "result": "fail", "message": big})];
        assert_eq!(fit(&mut small, MAX_REPORT_BYTES), 0);
        assert_eq!(small[0]["message"], big);
    }

    #[test]
    fn results_carry_kyvernos_fields() {
        let p = policy(json!({"apiVersion": "kyverno.io/v1", "kind": "Policy",
            "metadata": {"name": "team", "namespace": "shop", "annotations": {
                "policies.kyverno.io/severity": "high", "policies.kyverno.io/category": "Labels",
                "policies.kyverno.io/scored": "false"}},
            "spec": {"rules": [{"name": "check", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"message": "m", "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}}));
        let mut skip = RuleResponse::new("other", RuleType::Validation, Status::Skip, "rule is skipped");
        skip.extra_mut().exceptions = vec!["shop/allow".into()];
        let r = PolicyResponse {
            policy: "shop/team".into(),
            rules: vec![RuleResponse::new("check", RuleType::Validation, Status::Fail, "no team"), skip],
            ..Default::default()
        };
        let got = results(&p, &r);
        assert_eq!(
            got[0],
            json!({"source": "kyverno", "policy": "shop/team", "rule": "check", "result": "warn", "message": "no team",
                   "severity": "high", "category": "Labels", "properties": {"process": "background scan"}})
        );
        assert_eq!(got[1]["result"], "skip");
        assert_eq!(got[1]["properties"]["exceptions"], "allow");
        let mut all = vec![got[1].clone(), got[0].clone()];
        sort(&mut all);
        assert_eq!(all[0]["rule"], "check");
        assert_eq!(summary(&all), json!({"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 1}));
    }

    #[test]
    fn a_validating_policy_passes_with_success_and_its_exceptions_skip() {
        let p = policy(
            json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "v"},
            "spec": {"evaluation": {"background": {"enabled": false}},
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                "validations": [{"expression": "true"}]}}),
        );
        let mut exempt =
            RuleResponse::new("", RuleType::Validation, Status::Skip, "rule is skipped due to policy exceptions");
        exempt.extra_mut().exceptions = vec!["ns/skip-this".into()];
        let r = PolicyResponse {
            policy: "v".into(),
            rules: vec![RuleResponse::new("", RuleType::Validation, Status::Pass, ""), exempt],
            ..Default::default()
        };
        let got = results(&p, &r);
        assert_eq!(got[0]["message"], "success");
        assert_eq!(got[0]["source"], "KyvernoValidatingPolicy");
        assert!(got[0].get("rule").is_none());
        assert_eq!(got[1]["result"], "skip");
        assert_eq!(got[1]["properties"]["exceptions"], "skip-this");
    }

    /// Results of `doc` for `object`, through the front door as a background scan runs it.
    fn scanned(doc: Value, object: Value) -> Vec<Value> {
        let set = crate::PolicySet::new(vec![std::sync::Arc::new(policy(doc))], Vec::new());
        let req = crate::Request::new(crate::Operation::Create, &object);
        let out = set.evaluate(&req, crate::Scope::BACKGROUND, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
        out.responses.iter().flat_map(|(i, r)| results(&set.policies()[*i], r)).collect()
    }

    /// A GeneratingPolicy's result as Kyverno's background controller reports it: named after
    /// the policy, what it generated, `process: admission review`, its audit annotations.
    #[test]
    fn a_generating_policys_result_names_what_it_generated() {
        let gpol = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "GeneratingPolicy",
            "metadata": {"name": "per-ns"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["namespaces"]}]},
                "variables": [{"name": "cm", "expression": "[{\"kind\": dyn(\"ConfigMap\"), \"apiVersion\": dyn(\"v1\"), \"metadata\": dyn({\"name\": \"made\"})}]"}],
                "generate": [{"expression": "generator.Apply(object.metadata.name, variables.cm)"}],
                "auditAnnotations": [{"key": "ns", "valueExpression": "object.metadata.name"}]}});
        let set = crate::PolicySet::new(vec![std::sync::Arc::new(policy(gpol))], Vec::new());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
        let req = crate::Request::new(crate::Operation::Create, &ns);
        let out = set.evaluate(&req, crate::Scope::APPLY, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
        let got: Vec<Value> = out.responses.iter().flat_map(|(i, r)| results(&set.policies()[*i], r)).collect();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["rule"], "per-ns");
        assert_eq!(got[0]["source"], "KyvernoGeneratingPolicy");
        assert_eq!(got[0]["message"], "policy evaluated successfully");
        assert_eq!(
            got[0]["properties"],
            json!({"ns": "team", "process": "admission review",
                "generated-resources": "/v1, Kind=ConfigMap Name=made Namespace=team"})
        );
    }

    #[test]
    fn report_properties_are_rendered_and_pod_security_failures_name_their_controls() {
        let got = scanned(
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "owner"},
                "spec": {"rules": [{"name": "check", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
                    "context": [{"name": "objName", "variable": {"jmesPath": "request.object.metadata.name"}}],
                    "reportProperties": {"operation": "{{ request.operation }}", "objName": "{{ objName }}"},
                    "validate": {"message": "m", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bar", "labels": {"owner": "d"}}}),
        );
        assert_eq!(
            got[0]["properties"],
            json!({"objName": "bar", "operation": "CREATE", "process": "background scan"})
        );

        let got = scanned(
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "pss"},
                "spec": {"rules": [{"name": "restricted", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"podSecurity": {"level": "restricted", "version": "latest"}}}]}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "nginx",
                    "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"}}}]}}),
        );
        let props = &got[0]["properties"];
        assert_eq!(got[0]["result"], "fail");
        assert_eq!((&props["standard"], &props["version"]), (&json!("restricted"), &json!("latest")));
        // In the order the message lists the failed checks.
        assert_eq!(props["controls"], "capabilities_restricted,hostNamespaces");
        // Keys in Go's field order.
        assert!(
            props["controlsJSON"]
                .as_str()
                .unwrap()
                .starts_with(r#"[{"ID":"capabilities_restricted","Name":"Capabilities","Images":["#)
        );
        let controls: Value = serde_json::from_str(props["controlsJSON"].as_str().unwrap()).unwrap();
        assert_eq!(
            controls,
            json!([{"ID": "capabilities_restricted", "Name": "Capabilities", "Images": ["docker.io/nginx:latest"]},
                {"ID": "hostNamespaces", "Name": "Host Namespaces", "Images": null}])
        );
    }

    #[test]
    fn a_policy_labelled_reports_disabled_reports_nothing() {
        let got = scanned(
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
                "metadata": {"name": "quiet", "labels": {"reports.kyverno.io/disabled": ""}},
                "spec": {"rules": [{"name": "check", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
                    "validate": {"message": "m", "pattern": {"metadata": {"labels": {"owner": "?*"}}}}}]}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bar"}}),
        );
        assert!(got.is_empty());
    }

    #[test]
    fn webhook_match_conditions_decide_whether_a_policy_applies_with_or_without_a_user() {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "tags"},
            "spec": {"webhookConfiguration": {"matchConditions": [
                    {"name": "ns", "expression": "object.metadata.namespace == 'picked'"},
                    {"name": "admins", "expression": "'system:masters' in request.userInfo.groups"}]},
                "rules": [{"name": "tag", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "m", "pattern": {"spec": {"containers": [{"image": "*:*"}]}}}}]}});
        let pod = |ns: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
        };
        // A background scan has no user: the user condition does not hold.
        assert!(scanned(doc.clone(), pod("picked")).is_empty());
        let set = crate::PolicySet::new(vec![std::sync::Arc::new(policy(doc))], Vec::new());
        let admin = json!({"username": "kubernetes-admin", "groups": ["system:masters"]});
        let results = |ns: &str| {
            let object = pod(ns);
            let req = crate::Request {
                asker: crate::Asker { user: None, info: crate::UserInfoRef::Json(&admin) },
                ..crate::Request::new(crate::Operation::Create, &object)
            };
            let out = set.evaluate(&req, crate::Scope::ALL, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
            out.responses.iter().map(|(_, r)| r.rules.len()).sum::<usize>()
        };
        assert_eq!(results("picked"), 1);
        assert_eq!(results("other"), 0);
    }

    /// A stored object a CEL mutating policy would still change fails with Kyverno's "mutation
    /// is not applied"; one already mutated passes. A MutatingAdmissionPolicy's result is
    /// named after the policy and names its binding.
    #[test]
    fn background_scans_ask_mutating_policies_whether_the_object_is_already_mutated() {
        let mpol = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "MutatingPolicy",
            "metadata": {"name": "label-cms"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    "Object{metadata: Object.metadata{labels: {\"team\": \"a\"}}}"}}]}});
        let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}});
        let labelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default", "labels": {"team": "a"}}});
        let got = scanned(mpol.clone(), bare.clone());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["result"], "fail");
        assert_eq!(got[0]["message"], "mutation is not applied");
        assert_eq!(got[0]["source"], "KyvernoMutatingPolicy");
        assert_eq!(got[0]["properties"], json!({"process": "background scan"}));
        let got = scanned(mpol.clone(), labelled.clone());
        assert_eq!(got[0]["result"], "pass", "{got:?}");
        assert_eq!(got[0]["message"], "success");

        // Background processing off: no result.
        let mut quiet = mpol;
        quiet["spec"]["evaluation"] = json!({"background": {"enabled": false}});
        assert!(scanned(quiet, bare.clone()).is_empty());

        let map = json!({"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": "label-cms"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    "Object{metadata: Object.metadata{labels: {\"team\": \"a\"}}}"}}]}});
        let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": "label-cms-binding"}, "spec": {"policyName": "label-cms"}});
        let compiled = match crate::compile(&map, &[binding]).expect("compiles") {
            crate::Compiled::Policy(p) => p,
            crate::Compiled::Exception(_) => panic!("a policy"),
        };
        let set = crate::PolicySet::new(vec![std::sync::Arc::new(compiled)], Vec::new());
        let req = crate::Request::new(crate::Operation::Create, &bare);
        let out = set.evaluate(&req, crate::Scope::BACKGROUND, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
        let got: Vec<Value> = out.responses.iter().flat_map(|(i, r)| results(&set.policies()[*i], r)).collect();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["result"], "fail");
        assert_eq!(got[0]["rule"], "label-cms");
        assert_eq!(got[0]["source"], "MutatingAdmissionPolicy");
        assert_eq!(got[0]["properties"], json!({"mapBinding": "label-cms-binding", "process": "background scan"}));
        assert!(out.patched.is_none(), "a scan patches nothing");
    }

    /// Kyverno's CEL engines report `auditAnnotations` as properties: a ValidatingPolicy's on
    /// a pass and on a failure (with the failing validation's index and, without a message,
    /// Kyverno's default one), a MutatingPolicy's of the mutated object.
    #[test]
    fn audit_annotations_and_the_validation_index_become_properties() {
        let vpol = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "ValidatingPolicy",
            "metadata": {"name": "cm"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "validations": [{"expression": "true"}, {"expression": "has(object.data)"}],
                "auditAnnotations": [{"key": "who", "valueExpression": "'cm/' + object.metadata.name"},
                    {"key": "none", "valueExpression": "null"}]}});
        let with_data = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": {"k": "v"}});
        let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}});
        let got = scanned(vpol.clone(), with_data);
        assert_eq!(got[0]["result"], "pass");
        assert_eq!(got[0]["properties"], json!({"who": "cm/c", "process": "background scan"}));
        let got = scanned(vpol, bare.clone());
        assert_eq!(got[0]["result"], "fail");
        assert_eq!(got[0]["message"], "CEL expression validation failed at index 1");
        assert_eq!(
            got[0]["properties"],
            json!({"who": "cm/c", "cel.validationIndex": "1", "process": "background scan"})
        );

        let mpol = json!({"apiVersion": "policies.kyverno.io/v1beta1", "kind": "MutatingPolicy",
            "metadata": {"name": "cm"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    "Object{metadata: Object.metadata{labels: {\"team\": \"a\"}}}"}}],
                "auditAnnotations": [{"key": "team", "valueExpression": "object.metadata.labels['team']"}]}});
        let labelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "d", "labels": {"team": "a"}}});
        let got = scanned(mpol.clone(), labelled);
        assert_eq!(got[0]["properties"], json!({"team": "a", "process": "background scan"}));
        // Not mutated yet: a failure, without the annotations.
        let got = scanned(mpol, bare);
        assert_eq!(got[0]["result"], "fail");
        assert_eq!(got[0]["properties"], json!({"process": "background scan"}));
    }
}
