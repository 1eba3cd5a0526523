//! CustomResourceDefinitions for the kinds Verno reads and writes: `kyverno.io` ClusterPolicy,
//! Policy (v1) and PolicyException (v2), and the `wgpolicyk8s.io` PolicyReport and
//! ClusterPolicyReport (v1alpha2) used by reports.
//!
//! Names, versions, short names and printer columns are Kyverno's, so `kubectl get cpol` reads
//! the same and a cluster that already has Kyverno's CRDs keeps its policies (Verno watches the
//! same group, version and plural, whoever installed the CRD). The schemas are structural and
//! type the top-level fields the engine reads; below those, rule bodies are
//! `x-kubernetes-preserve-unknown-fields` so that every Kyverno policy is stored as written and
//! validated by Verno's compiler, whose errors land in `status` with the field path.

// Writing into documents this module has just built with `json!` (always objects), where
// `value["key"] = …` cannot panic and reads far better than `as_object_mut` chains.
#![allow(clippy::indexing_slicing)]

use serde_json::{Value, json};

fn free() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn policy_spec_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            // Kyverno's CRD defaults, so a stored policy reads as Kyverno's does (the engine
            // gives absent fields the same meaning).
            "admission": {"type": "boolean", "default": true},
            "background": {"type": "boolean", "default": true},
            "applyRules": {"type": "string", "enum": ["All", "One"]},
            "emitWarning": {"type": "boolean", "default": false},
            "failurePolicy": {"type": "string", "enum": ["Ignore", "Fail"]},
            "validationFailureAction": {"type": "string", "enum": ["audit", "enforce", "Audit", "Enforce"]},
            "validationFailureActionOverrides": {"type": "array", "items": free()},
            "webhookTimeoutSeconds": {"type": "integer", "format": "int32"},
            "webhookConfiguration": free(),
            "useServerSideApply": {"type": "boolean"},
            "generateExisting": {"type": "boolean"},
            "mutateExistingOnPolicyUpdate": {"type": "boolean"},
            "schemaValidation": {"type": "boolean"},
            "rules": {"type": "array", "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "maxLength": 63},
                    "skipBackgroundRequests": {"type": "boolean", "default": true},
                    "validate": {
                        "type": "object",
                        "properties": {
                            "allowExistingViolations": {"type": "boolean", "default": true},
                            "cel": {
                                "type": "object",
                                "properties": {"generate": {"type": "boolean", "default": false}},
                                "x-kubernetes-preserve-unknown-fields": true,
                            },
                        },
                        "x-kubernetes-preserve-unknown-fields": true,
                    },
                    "verifyImages": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "mutateDigest": {"type": "boolean", "default": true},
                            "required": {"type": "boolean", "default": true},
                            "useCache": {"type": "boolean", "default": true},
                        },
                        "x-kubernetes-preserve-unknown-fields": true,
                    }},
                    // Kyverno's CRD: an API call may only GET or POST (the compiler refuses
                    // other methods wherever a context entry appears, foreach included).
                    "context": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "apiCall": {
                                "type": "object",
                                "properties": {"method": {"type": "string", "enum": ["GET", "POST"], "default": "GET"}},
                                "x-kubernetes-preserve-unknown-fields": true,
                            },
                            // Kyverno's CRD: a global reference names its entry.
                            "globalReference": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}, "jmesPath": {"type": "string"}},
                            },
                        },
                        "x-kubernetes-preserve-unknown-fields": true,
                    }},
                },
                "x-kubernetes-preserve-unknown-fields": true,
            }},
        },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn policy_status_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ready": {"type": "boolean"},
            "conditions": {"type": "array", "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "observedGeneration": {"type": "integer", "format": "int64"},
                },
            }},
            "rulecount": {"type": "object", "properties": {
                "validate": {"type": "integer"}, "mutate": {"type": "integer"}, "generate": {"type": "integer"}, "verifyimages": {"type": "integer"},
            }},
            "autogen": free(),
            "validatingadmissionpolicy": {"type": "object", "properties": {
                "generated": {"type": "boolean"}, "message": {"type": "string"},
            }},
        },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn policy_columns() -> Value {
    let ready = ".status.conditions[?(@.type == \"Ready\")]";
    json!([
        {"name": "ADMISSION", "type": "boolean", "jsonPath": ".spec.admission"},
        {"name": "BACKGROUND", "type": "boolean", "jsonPath": ".spec.background"},
        {"name": "READY", "type": "string", "jsonPath": format!("{ready}.status")},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "FAILURE POLICY", "type": "string", "jsonPath": ".spec.failurePolicy", "priority": 1},
        {"name": "VALIDATE", "type": "integer", "jsonPath": ".status.rulecount.validate", "priority": 1},
        {"name": "MUTATE", "type": "integer", "jsonPath": ".status.rulecount.mutate", "priority": 1},
        {"name": "GENERATE", "type": "integer", "jsonPath": ".status.rulecount.generate", "priority": 1},
        {"name": "VERIFY IMAGES", "type": "integer", "jsonPath": ".status.rulecount.verifyimages", "priority": 1},
        {"name": "MESSAGE", "type": "string", "jsonPath": format!("{ready}.message")},
    ])
}

#[allow(clippy::too_many_arguments)]
fn crd(
    group: &str,
    kind: &str,
    plural: &str,
    singular: &str,
    short: &[&str],
    scope: &str,
    version: &str,
    spec: Value,
    status: Option<Value>,
    columns: Value,
    categories: &[&str],
) -> Value {
    let mut props = json!({"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}, "spec": spec});
    if let Some(st) = &status {
        props["status"] = st.clone();
    }
    let mut v = json!({
        "name": version, "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": props}},
        "additionalPrinterColumns": columns,
    });
    if status.is_some() {
        v["subresources"] = json!({"status": {}});
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"), "labels": {"app.kubernetes.io/part-of": "verno"}},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural, "singular": singular, "shortNames": short, "categories": categories},
            "scope": scope,
            "versions": [v],
        },
    })
}

/// ClusterPolicy or Policy: `v1` stored, `v2beta1` served, the same schema and columns.
fn policy_crd(kind: &str, plural: &str, singular: &str, short: &str, scope: &str) -> Value {
    let c = crd(
        "kyverno.io",
        kind,
        plural,
        singular,
        &[short],
        scope,
        "v1",
        policy_spec_schema(),
        Some(policy_status_schema()),
        policy_columns(),
        &["kyverno"],
    );
    also_serve(c, &["v2beta1"])
}

/// `crd` also served at Kyverno's older `versions` (same schema, not stored), as Kyverno 1.19's
/// CRDs serve them: manifests written for `kyverno.io/v2beta1` keep applying, and a cluster
/// upgraded from Kyverno keeps the versions in its `status.storedVersions`.
fn also_serve(mut crd: Value, versions: &[&str]) -> Value {
    if let Some(Value::Array(vs)) = crd.pointer_mut("/spec/versions")
        && let Some(first) = vs.first().cloned()
    {
        for v in versions {
            let mut extra = first.clone();
            extra["name"] = json!(v);
            extra["storage"] = json!(false);
            vs.push(extra);
        }
    }
    crd
}

/// (Cluster)CleanupPolicy: `kyverno.io/v2` stored, `v2beta1` served; Kyverno's columns.
fn cleanup_crd(kind: &str, plural: &str, short: &str, scope: &str) -> Value {
    let spec = json!({"type": "object", "required": ["match", "schedule"], "properties": {
        "schedule": {"type": "string"}, "match": free(), "exclude": free(), "conditions": free(),
        "context": {"type": "array", "items": free()},
        "deletionPropagationPolicy": {"type": "string", "enum": ["Foreground", "Background", "Orphan"]},
    }, "x-kubernetes-preserve-unknown-fields": true});
    let status = json!({"type": "object", "properties": {
        "conditions": {"type": "array", "items": free()},
        "lastExecutionTime": {"type": "string", "format": "date-time"},
    }, "x-kubernetes-preserve-unknown-fields": true});
    let columns = json!([
        {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]);
    let c = crd(
        "kyverno.io",
        kind,
        plural,
        &kind.to_lowercase(),
        &[short],
        scope,
        "v2",
        spec,
        Some(status),
        columns,
        &["kyverno"],
    );
    also_serve(c, &["v2beta1"])
}

fn report_schema() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn report_columns() -> Value {
    json!([
        {"name": "Kind", "type": "string", "jsonPath": ".scope.kind"},
        {"name": "Name", "type": "string", "jsonPath": ".scope.name"},
        {"name": "Pass", "type": "integer", "jsonPath": ".summary.pass"},
        {"name": "Fail", "type": "integer", "jsonPath": ".summary.fail"},
        {"name": "Warn", "type": "integer", "jsonPath": ".summary.warn"},
        {"name": "Error", "type": "integer", "jsonPath": ".summary.error"},
        {"name": "Skip", "type": "integer", "jsonPath": ".summary.skip"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ])
}

/// GlobalContextEntry (`kyverno.io`, `v2beta1` stored as Kyverno stores it, `v2` and
/// `v2alpha1` served), with the defaults of Kyverno's CRD (`apiCall.method` GET,
/// `refreshInterval` 10m, `retryLimit` 3); the rest is checked by the validation webhook.
fn global_context_entry_crd() -> Value {
    let c = crd(
        "kyverno.io",
        "GlobalContextEntry",
        "globalcontextentries",
        "globalcontextentry",
        &["gctxentry"],
        "Cluster",
        "v2beta1",
        json!({"type": "object", "properties": {
            "apiCall": {"type": "object", "properties": {
                "method": {"type": "string", "enum": ["GET", "POST"], "default": "GET"},
                "refreshInterval": {"type": "string", "default": "10m"},
                "retryLimit": {"type": "integer", "minimum": 1, "default": 3},
            }, "x-kubernetes-preserve-unknown-fields": true},
        }, "x-kubernetes-preserve-unknown-fields": true}),
        Some(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
        json!([
            {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            {"name": "REFRESH INTERVAL", "type": "string", "jsonPath": ".spec.apiCall.refreshInterval"},
            {"name": "LAST REFRESH", "type": "date", "jsonPath": ".status.lastRefreshTime"},
        ]),
        &["kyverno"],
    );
    also_serve(c, &["v2", "v2alpha1"])
}

/// (Cluster)EphemeralReport (`reports.kyverno.io/v1`), with Kyverno's columns.
fn ephemeral_report_crd(kind: &str, plural: &str, short: &str, scope: &str) -> Value {
    let label = |k: &str| format!(".metadata.labels['audit\\.kyverno\\.io/{k}']");
    crd(
        "reports.kyverno.io",
        kind,
        plural,
        &kind.to_lowercase(),
        &[short],
        scope,
        "v1",
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        None,
        json!([
            {"name": "Source", "type": "string", "jsonPath": label("source")},
            {"name": "Group", "type": "string", "jsonPath": label("resource\\.group")},
            {"name": "Kind", "type": "string", "jsonPath": label("resource\\.kind")},
            {"name": "Owner", "type": "string", "jsonPath": ".metadata.annotations['audit\\.kyverno\\.io/resource\\.name']"},
            {"name": "Pass", "type": "integer", "jsonPath": ".spec.summary.pass"},
            {"name": "Fail", "type": "integer", "jsonPath": ".spec.summary.fail"},
            {"name": "Warn", "type": "integer", "jsonPath": ".spec.summary.warn"},
            {"name": "Error", "type": "integer", "jsonPath": ".spec.summary.error"},
            {"name": "Skip", "type": "integer", "jsonPath": ".spec.summary.skip"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            // Kyverno shows the uid by default for cluster reports only.
            {"name": "Uid", "type": "string", "jsonPath": label("resource\\.uid"), "priority": i32::from(scope != "Cluster")},
            {"name": "Hash", "type": "string", "jsonPath": label("resource\\.hash"), "priority": 1},
        ]),
        &["kyverno"],
    )
}

/// Every CRD, in a stable order.
pub fn all() -> Vec<Value> {
    let report_in = |group: &str, version: &str, kind: &str, plural: &str, singular: &str, short: &str, scope: &str| {
        let mut c =
            crd(group, kind, plural, singular, &[short], scope, version, report_schema(), None, report_columns(), &[]);
        // Reports keep their results and summary at the top level, beside metadata.
        c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] =
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        c
    };
    let report = |kind: &str, plural: &str, singular: &str, short: &str, scope: &str| {
        report_in("wgpolicyk8s.io", "v1alpha2", kind, plural, singular, short, scope)
    };
    vec![
        policy_crd("ClusterPolicy", "clusterpolicies", "clusterpolicy", "cpol", "Cluster"),
        policy_crd("Policy", "policies", "policy", "pol", "Namespaced"),
        also_serve(
            crd(
                "kyverno.io",
                "PolicyException",
                "policyexceptions",
                "policyexception",
                &["polex"],
                "Namespaced",
                "v2",
                json!({"type": "object", "required": ["exceptions", "match"], "properties": {"exceptions": {"type": "array", "items": free()}, "match": free(), "conditions": free(), "background": {"type": "boolean"}, "podSecurity": {"type": "array", "items": free()}}, "x-kubernetes-preserve-unknown-fields": true}),
                None,
                json!([]),
                &["kyverno"],
            ),
            &["v2beta1"],
        ),
        // Verno keeps no UpdateRequests (its background controller is level-based); the kind
        // is served so that `kubectl get ur` answers (with nothing) and the ones a Kyverno
        // cluster stored stay readable.
        also_serve(
            crd(
                "kyverno.io",
                "UpdateRequest",
                "updaterequests",
                "updaterequest",
                &["ur"],
                "Namespaced",
                "v2",
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                Some(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
                json!([
                    {"name": "Policy", "type": "string", "jsonPath": ".spec.policy"},
                    {"name": "RuleType", "type": "string", "jsonPath": ".spec.requestType"},
                    {"name": "ResourceKind", "type": "string", "jsonPath": ".spec.resource.kind"},
                    {"name": "ResourceName", "type": "string", "jsonPath": ".spec.resource.name"},
                    {"name": "ResourceNamespace", "type": "string", "jsonPath": ".spec.resource.namespace"},
                    {"name": "status", "type": "string", "jsonPath": ".status.state"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ]),
                &["kyverno"],
            ),
            &["v1beta1"],
        ),
        cel("ValidatingPolicy", &["vpol"], "Cluster", true),
        cel("NamespacedValidatingPolicy", &["nvpol"], "Namespaced", false),
        cel("MutatingPolicy", &["mpol"], "Cluster", true),
        cel("NamespacedMutatingPolicy", &["nmpol"], "Namespaced", false),
        cel("GeneratingPolicy", &["gpol"], "Cluster", true),
        cel("NamespacedGeneratingPolicy", &["ngpol"], "Namespaced", false),
        cel("DeletingPolicy", &["dpol"], "Cluster", true),
        cel("NamespacedDeletingPolicy", &["ndpol"], "Namespaced", false),
        // Installed so that a Kyverno cluster's objects stay readable; Verno reports them as
        // not supported yet (the policy controller writes so into their status).
        cel("ImageValidatingPolicy", &["ivpol"], "Cluster", true),
        cel("NamespacedImageValidatingPolicy", &["nivpol"], "Namespaced", false),
        global_context_entry_crd(),
        cleanup_crd("ClusterCleanupPolicy", "clustercleanuppolicies", "ccleanpol", "Cluster"),
        cleanup_crd("CleanupPolicy", "cleanuppolicies", "cleanpol", "Namespaced"),
        cel("PolicyException", &[], "Namespaced", true),
        report("ClusterPolicyReport", "clusterpolicyreports", "clusterpolicyreport", "cpolr", "Cluster"),
        report("PolicyReport", "policyreports", "policyreport", "polr", "Namespaced"),
        // Kyverno's `--openreportsEnabled` output (Verno's `--openreports`).
        report_in("openreports.io", "v1alpha1", "ClusterReport", "clusterreports", "clusterreport", "creps", "Cluster"),
        report_in("openreports.io", "v1alpha1", "Report", "reports", "report", "reps", "Namespaced"),
        // Kyverno's intermediate reports: Verno aggregates in memory and writes none, but a
        // cluster upgraded from Kyverno holds them (and `kubectl get ephr` should answer).
        ephemeral_report_crd("ClusterEphemeralReport", "clusterephemeralreports", "cephr", "Cluster"),
        ephemeral_report_crd("EphemeralReport", "ephemeralreports", "ephr", "Namespaced"),
    ]
}

/// A `policies.kyverno.io` kind's spec: free below the fields Kyverno's CRD gives defaults,
/// which it declares with them (`evaluation.*.enabled`, `skipBackgroundRequests`, an
/// exception's `reportResult`, an image policy's `validationConfigurations`), so a stored policy
/// reads as Kyverno's does.
fn cel_spec(kind: &str) -> Value {
    let enabled = |on: bool| json!({"type": "object", "properties": {"enabled": {"type": "boolean", "default": on}}, "x-kubernetes-preserve-unknown-fields": true});
    let mut evaluation = serde_json::Map::new();
    let base = kind.trim_start_matches("Namespaced");
    let mut props = serde_json::Map::new();
    match base {
        "ValidatingPolicy" | "ImageValidatingPolicy" => {
            evaluation.insert("admission".into(), enabled(true));
            evaluation.insert("background".into(), enabled(true));
        }
        "MutatingPolicy" => {
            evaluation.insert("admission".into(), enabled(true));
            evaluation.insert("background".into(), enabled(true));
            evaluation.insert("mutateExisting".into(), enabled(false));
            evaluation.insert("skipBackgroundRequests".into(), json!({"type": "boolean", "default": true}));
        }
        "GeneratingPolicy" => {
            evaluation.insert("admission".into(), enabled(true));
            evaluation.insert("generateExisting".into(), enabled(false));
            evaluation.insert("orphanDownstreamOnPolicyDelete".into(), enabled(false));
            evaluation.insert("synchronize".into(), enabled(false));
            evaluation.insert("skipBackgroundRequests".into(), json!({"type": "boolean", "default": true}));
        }
        "PolicyException" => {
            props.insert("reportResult".into(), json!({"type": "string", "default": "skip"}));
        }
        _ => {}
    }
    if matches!(base, "ValidatingPolicy" | "ImageValidatingPolicy") {
        // Kyverno's CRD: the API server refuses any other action
        // (`spec.validationActions[0]: Unsupported value: …`).
        props.insert(
            "validationActions".into(),
            json!({"type": "array", "items": {"type": "string", "enum": ["Deny", "Audit", "Warn"]}, "x-kubernetes-list-type": "set"}),
        );
    }
    if base == "ImageValidatingPolicy" {
        props.insert(
            "validationConfigurations".into(),
            json!({"type": "object", "default": {}, "properties": {
                "mutateDigest": {"type": "boolean", "default": true},
                "required": {"type": "boolean", "default": true},
                "verifyDigest": {"type": "boolean", "default": true},
            }, "x-kubernetes-preserve-unknown-fields": true}),
        );
    }
    if !evaluation.is_empty() {
        props.insert(
            "evaluation".into(),
            json!({"type": "object", "properties": evaluation, "x-kubernetes-preserve-unknown-fields": true}),
        );
    }
    json!({"type": "object", "properties": props, "x-kubernetes-preserve-unknown-fields": true})
}

/// A `policies.kyverno.io` kind: `v1beta1` stored (as Kyverno 1.19 stores it, so a cluster
/// moving between Kyverno and Verno needs no storage migration), `v1` (what Verno reads) and
/// `v1alpha1` where Kyverno had it served with the same schema, so manifests written for any
/// of them apply. Policies show READY from `status.conditionStatus`, as Kyverno's.
fn cel(kind: &str, short: &[&str], scope: &str, had_alpha: bool) -> Value {
    let plural = crate::policies::resource(
        verno_engine::Kind::of("policies.kyverno.io/v1", kind).unwrap_or(verno_engine::Kind::ValidatingPolicy),
    )
    .plural;
    let is_exception = kind == "PolicyException";
    let status = (!is_exception).then(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    let columns = if is_exception {
        json!([])
    } else if kind.ends_with("GeneratingPolicy") {
        json!([{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}])
    } else {
        json!([
            {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            {"name": "READY", "type": "string", "jsonPath": ".status.conditionStatus.ready"},
        ])
    };
    let categories: &[&str] = if is_exception { &[] } else { &["kyverno"] };
    let mut c = crd(
        "policies.kyverno.io",
        kind,
        &plural,
        &kind.to_lowercase(),
        short,
        scope,
        // Kyverno 1.19 stores v1beta1 and serves v1 with the same schema.
        "v1beta1",
        cel_spec(kind),
        status,
        columns,
        categories,
    );
    let older: &[&str] = if had_alpha { &["v1", "v1alpha1"] } else { &["v1"] };
    let stored = c["spec"]["versions"][0].clone();
    for version in older {
        let mut v = stored.clone();
        v["name"] = json!(version);
        v["storage"] = json!(false);
        if let Some(versions) = c["spec"]["versions"].as_array_mut() {
            versions.push(v);
        }
    }
    c
}
