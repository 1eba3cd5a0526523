//! The one front door for policy documents: [`compile`] reads a document's [`Kind`] and
//! compiles it with the compiler of that kind. The CLI loader, `serve --policies`, the
//! cluster's policy watch and the policy validation webhook all come through here, so what
//! `kubectl apply` admits is exactly what the CLI and the webhook evaluate.

use crate::clusterpolicy::compile_policy;
use crate::decode::strict;
use crate::error::{CompileError, DocumentError};
use crate::policy::{CompiledException, CompiledPolicy, compile_cel_exception, compile_exception};
use serde_json::Value;
use verno_api::Kind;

/// What a document compiles to.
#[derive(Debug)]
pub enum Compiled {
    Policy(CompiledPolicy),
    Exception(CompiledException),
}

/// Compiles one document. An admission policy takes the first of `bindings` that names it
/// (`spec.policyName`); other kinds ignore `bindings`.
pub fn compile(doc: &Value, bindings: &[Value]) -> Result<Compiled, DocumentError> {
    let Some(kind) = Kind::of_document(doc) else {
        let s = |f: &str| doc.get(f).and_then(Value::as_str).unwrap_or("").to_string();
        return Err(DocumentError::NotAPolicy { api_version: s("apiVersion"), kind: s("kind") });
    };
    let binding = |binding_kind: Kind| {
        let name = doc.pointer("/metadata/name").and_then(Value::as_str);
        bindings.iter().find(|b| {
            Kind::of_document(b) == Some(binding_kind) && b.pointer("/spec/policyName").and_then(Value::as_str) == name
        })
    };
    Ok(match kind {
        Kind::ClusterPolicy | Kind::Policy => Compiled::Policy(compile_policy(&strict(doc, Some(kind))?)?),
        Kind::PolicyException => Compiled::Exception(compile_exception(&strict(doc, Some(kind))?)?),
        Kind::CelPolicyException => Compiled::Exception(compile_cel_exception(doc)?),
        Kind::ValidatingPolicy | Kind::NamespacedValidatingPolicy => {
            Compiled::Policy(crate::vpol::compile_validating_policy(doc)?)
        }
        Kind::MutatingPolicy | Kind::NamespacedMutatingPolicy => {
            Compiled::Policy(crate::mpol::compile_mutating_policy(doc)?)
        }
        Kind::ValidatingAdmissionPolicy => Compiled::Policy(crate::vpol::compile_admission_policy(
            doc,
            binding(Kind::ValidatingAdmissionPolicyBinding),
        )?),
        Kind::MutatingAdmissionPolicy => Compiled::Policy(crate::mpol::compile_mutating_admission_policy(
            doc,
            binding(Kind::MutatingAdmissionPolicyBinding),
        )?),
        Kind::ValidatingAdmissionPolicyBinding | Kind::MutatingAdmissionPolicyBinding => {
            return Err(DocumentError::Binding(kind));
        }
        Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy => {
            Compiled::Policy(crate::gpol::compile_generating_policy(doc)?)
        }
        Kind::DeletingPolicy | Kind::NamespacedDeletingPolicy => {
            Compiled::Policy(crate::cleanup::compile_deleting_policy(doc)?)
        }
        Kind::CleanupPolicy | Kind::ClusterCleanupPolicy => {
            Compiled::Policy(crate::cleanup::compile_cleanup_policy(doc)?)
        }
        Kind::ImageValidatingPolicy | Kind::NamespacedImageValidatingPolicy => {
            Compiled::Policy(crate::ivpol::compile_image_validating_policy(doc)?)
        }
    })
}

/// Compiles an object as the API stores it: it may lack `apiVersion`/`kind` (a watch's
/// `DynamicObject`), so they are set from `kind` and `api_version`, and `status` is dropped.
pub fn compile_stored(kind: Kind, api_version: &str, object: &Value) -> Result<Compiled, DocumentError> {
    let mut doc = object.clone();
    if let Some(m) = doc.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.into()));
        m.insert("kind".into(), Value::String(kind.name().into()));
        m.remove("status");
    }
    let compiled = compile(&doc, &[])?;
    if matches!(kind, Kind::ClusterPolicy | Kind::Policy) {
        background_subresources(&doc)?;
        generate_scopes(&doc, kind)?;
    }
    cel_kind_checks(&doc, kind)?;
    Ok(compiled)
}

/// The CEL kinds' checks in Kyverno's policy validation beyond compiling (not in `verno
/// test`, as Kyverno's CLI): a MutatingPolicy must keep admission or mutate-existing on, and a
/// namespaced policy may not call `http.*` (a tenant's policy making requests from the
/// engine's network; Kyverno's `--allowHTTPInNamespacedPolicies` is off by default and Verno
/// has no such switch).
fn cel_kind_checks(doc: &Value, kind: Kind) -> Result<(), CompileError> {
    use Kind::*;
    if matches!(kind, MutatingPolicy | NamespacedMutatingPolicy) {
        let on = |p: &str, default: bool| doc.pointer(p).and_then(Value::as_bool).unwrap_or(default);
        if !on("/spec/evaluation/admission/enabled", true) && !on("/spec/evaluation/mutateExisting/enabled", false) {
            return Err(CompileError::new(
                "spec.evaluation",
                "Forbidden: disabling both admission and mutateExisting evaluation modes is not allowed",
            ));
        }
    }
    let namespaced_cel = matches!(
        kind,
        NamespacedValidatingPolicy
            | NamespacedMutatingPolicy
            | NamespacedGeneratingPolicy
            | NamespacedDeletingPolicy
            | NamespacedImageValidatingPolicy
    );
    if namespaced_cel && doc.get("spec").is_some_and(uses_http) {
        return Err(CompileError::new(
            "spec",
            "Forbidden: http.* is not allowed in namespaced policies; set --allowHTTPInNamespacedPolicies to enable",
        ));
    }
    Ok(())
}

/// Whether any CEL expression of a spec (every `expression`, `messageExpression` and
/// `valueExpression` string) names `http`.
fn uses_http(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| match v {
            Value::String(s) if matches!(k.as_str(), "expression" | "messageExpression" | "valueExpression") => {
                s.contains("http") && verno_cel::mentions_ident(s, "http")
            }
            other => uses_http(other),
        }),
        Value::Array(a) => a.iter().any(uses_http),
        _ => false,
    }
}

/// What is wrong with a generate target (at `path`) of a kind whose scope is `cluster`-wide or
/// not, in Kyverno's words (`GeneratePattern.Validate`).
fn scope_error(path: &str, namespace: &str, cluster: bool) -> Option<CompileError> {
    let message = match (cluster, namespace.is_empty()) {
        (true, false) => "Forbidden: target namespace must not be set for a cluster-wide resource",
        (false, true) => "Forbidden: target namespace must be set for a namespaced resource",
        _ => return None,
    };
    Some(CompileError::new(format!("{path}.namespace"), message))
}

/// A namespaced Policy's generate target (at `path`) must be a namespaced kind in the policy's
/// own namespace, and clone from it (Kyverno's `validateNamespacedTargetsScope`, literally:
/// a namespace written with variables is refused too).
fn policy_target_error(path: &str, t: &Value, cluster: bool, policy_ns: &str) -> Option<CompileError> {
    let s = |p: &str| t.pointer(p).and_then(Value::as_str).unwrap_or("");
    let why = if cluster {
        format!("the target must be a namespaced resource: {}/{}", s("/apiVersion"), s("/kind"))
    } else if s("/namespace") != policy_ns {
        format!(
            "a namespaced policy cannot generate resources in other namespaces, expected: {policy_ns}, received: {}",
            s("/namespace")
        )
    } else if !s("/clone/name").is_empty() && s("/clone/namespace") != policy_ns {
        format!(
            "a namespaced policy cannot clone resources from other namespaces, expected: {policy_ns}, received: {}",
            s("/clone/namespace")
        )
    } else {
        return None;
    };
    Some(CompileError::new(format!("{path}.namespace"), format!("Forbidden: target resource scope mismatched: {why} ")))
}

/// A generate rule's patterns with their paths: the rule's own, then each `foreach` entry's.
fn generate_patterns(rule: usize, g: &Value) -> Vec<(String, &Value)> {
    let mut out = vec![(format!("spec.rules[{rule}].generate"), g)];
    for (j, f) in g.get("foreach").and_then(Value::as_array).into_iter().flatten().enumerate() {
        out.push((format!("spec.rules[{rule}].generate.foreach[{j}]"), f));
    }
    out
}

/// A generate target whose kind's scope only the cluster knows (a custom resource): the policy
/// webhook asks discovery, then [`ScopeQuestion::refusal`] says whether the target is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeQuestion {
    pub path: String,
    pub api_version: String,
    pub kind: String,
    /// The target as written.
    target: Value,
    /// The namespace of the Policy (`None`: a ClusterPolicy).
    policy_ns: Option<String>,
}

impl ScopeQuestion {
    /// The policy's refusal (`path: message`) when the kind is `cluster`-wide (or not).
    pub fn refusal(&self, cluster: bool) -> Option<String> {
        let namespace = self.target.get("namespace").and_then(Value::as_str).unwrap_or("");
        let in_policy =
            self.policy_ns.as_deref().and_then(|ns| policy_target_error(&self.path, &self.target, cluster, ns));
        in_policy.or_else(|| scope_error(&self.path, namespace, cluster)).map(|e| e.to_string())
    }
}

/// The generate targets of a ClusterPolicy or Policy whose kind's scope is not known without
/// the cluster (written without variables), in rule order.
pub fn scope_questions(doc: &Value) -> Vec<ScopeQuestion> {
    let policy_ns = (doc.get("kind").and_then(Value::as_str) == Some("Policy")).then(|| {
        doc.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_string()
    });
    let rules = doc.pointer("/spec/rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let Some(g) = rule.get("generate") else { continue };
        for (path, t) in generate_patterns(i, g) {
            let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let (api_version, kind) = (s("apiVersion"), s("kind"));
            if kind.is_empty()
                || kind.contains("{{")
                || api_version.contains("{{")
                || crate::gpol::known_scope(&api_version, &kind).is_some()
            {
                continue;
            }
            out.push(ScopeQuestion { path, api_version, kind, target: t.clone(), policy_ns: policy_ns.clone() });
        }
    }
    out
}

/// A stored policy's generate rules must place what they generate where it can live, as
/// Kyverno's policy validation requires (kyverno/kyverno#7038, #7470, #7801): a namespace for
/// a namespaced kind and none for a cluster-wide one; a `cloneList` of one scope, with a source
/// namespace exactly when its kinds are namespaced; a namespaced Policy generates only
/// namespaced objects. A target's namespace is checked only for kinds whose scope Verno knows
/// (`gpol::known_scope`): a custom kind's scope is the cluster's discovery to say. (Not in
/// `verno test`, as Kyverno's CLI.)
fn generate_scopes(doc: &Value, kind: Kind) -> Result<(), CompileError> {
    let rules = doc.pointer("/spec/rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let templated = |s: &str| s.contains("{{");
    let policy_ns =
        doc.pointer("/metadata/namespace").and_then(Value::as_str).filter(|n| !n.is_empty()).unwrap_or("default");
    for (i, rule) in rules.iter().enumerate() {
        let Some(g) = rule.get("generate") else { continue };
        for (path, t) in generate_patterns(i, g) {
            let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("");
            let (api_version, target_kind, namespace) = (s("apiVersion"), s("kind"), s("namespace"));
            // A foreach generate's patterns are its entries.
            if path.ends_with("generate") && g.get("foreach").is_some() {
                continue;
            }
            // The kind's scope where it is known here: a custom kind's is the cluster's to say
            // (the policy webhook asks discovery, [`scope_questions`]), and refusing a good
            // policy on a guess is worse than letting the API server refuse a bad write later.
            let known = (!target_kind.is_empty() && !templated(target_kind) && !templated(api_version))
                .then(|| crate::gpol::known_scope(api_version, target_kind))
                .flatten();
            // A namespaced Policy stays in its namespace: what it generates, and what it clones
            // from (kyverno/kyverno#5099).
            if kind == Kind::Policy
                && let Some(e) = policy_target_error(&path, t, known == Some(true), policy_ns)
            {
                return Err(e);
            }
            if let Some(e) = known.and_then(|cluster| scope_error(&path, namespace, cluster)) {
                return Err(e);
            }
            let Some(list) = t.get("cloneList") else { continue };
            let kinds: Vec<&str> =
                list.get("kinds").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            let scopes: Vec<bool> = kinds
                .iter()
                .map(|k| {
                    let (av, kd) = k.rsplit_once('/').unwrap_or(("v1", k));
                    crate::gpol::cluster_scoped(av, kd)
                })
                .collect();
            // Kyverno's `ValidateCloneList`, in its words.
            let source_ns = list.get("namespace").and_then(Value::as_str).unwrap_or("");
            let at = |f: &str| format!("{path}.cloneList.{f}");
            if kind == Kind::Policy {
                if let Some(k) = kinds.iter().zip(&scopes).find(|(_, c)| **c).map(|(k, _)| k) {
                    return Err(CompileError::new(
                        at("kinds"),
                        format!("Forbidden: the source in cloneList must be a namespaced resource: {k}"),
                    ));
                }
                if !kinds.is_empty() && source_ns != policy_ns {
                    return Err(CompileError::new(
                        at("namespace"),
                        format!(
                            "Forbidden: a namespaced policy cannot clone resources from other namespace, expected: {policy_ns}, received: {source_ns}"
                        ),
                    ));
                }
            }
            if scopes.iter().any(|c| *c) && scopes.iter().any(|c| !*c) {
                return Err(CompileError::new(at("kinds"), "Forbidden: mixed scope of target resources is forbidden"));
            }
            match scopes.first() {
                Some(false) if source_ns.is_empty() => {
                    return Err(CompileError::new(
                        at("namespace"),
                        "Forbidden: namespace is required for namespaced target resources",
                    ));
                }
                Some(true) if kind != Kind::Policy && !source_ns.is_empty() => {
                    return Err(CompileError::new(
                        at("namespace"),
                        "Forbidden: namespace is forbidden for cluster-wide target resources",
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Kyverno refuses an update of a policy that changes a generate rule's own spec (its name,
/// match, exclude, preconditions, context: what decides which downstream belongs to which
/// trigger) — everything but the `generate` block, and `match` too while no generate rule of
/// the old policy synchronizes (kyverno/kyverno#6440). Removing a rule is allowed.
pub fn generate_update_allowed(old: &Value, new: &Value) -> Result<(), String> {
    let generate_rules = |p: &Value| -> Vec<Value> {
        p.pointer("/spec/rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|r| r.get("generate").is_some())
            .cloned()
            .collect()
    };
    let (old_rules, new_rules) = (generate_rules(old), generate_rules(new));
    let synchronizing =
        old_rules.iter().any(|r| r.pointer("/generate/synchronize").and_then(Value::as_bool).unwrap_or(false));
    let fixed = |r: &Value| {
        let mut r = r.clone();
        if let Some(m) = r.as_object_mut() {
            m.remove("generate");
            if !synchronizing {
                m.remove("match");
            }
        }
        r
    };
    let name = |r: &Value| r.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    for o in &old_rules {
        match new_rules.iter().find(|n| name(n) == name(o)) {
            Some(n) if fixed(n) == fixed(o) => {}
            // Fewer generate rules: this one was removed.
            None if new_rules.len() < old_rules.len() => {}
            _ => return Err("changes of immutable fields of a rule spec in a generate rule is disallowed".into()),
        }
    }
    Ok(())
}

/// Kinds the API serves only as subresources (`deployments/scale` is a `Scale`, …): what
/// Kyverno's discovery finds for them is a subresource.
const SUBRESOURCE_KINDS: [&str; 10] = [
    "Scale",
    "Eviction",
    "Binding",
    "TokenRequest",
    "PodExecOptions",
    "PodAttachOptions",
    "PodPortForwardOptions",
    "PodProxyOptions",
    "NodeProxyOptions",
    "ServiceProxyOptions",
];

/// A stored policy (what the cluster keeps, unlike `verno test`'s files) whose validate rule
/// matches or excludes a subresource (`Pod/status`, `*/*`, `Scale`) while background scans are
/// on is refused, as Kyverno's policy validation does: a scan cannot read subresources.
fn background_subresources(doc: &Value) -> Result<(), CompileError> {
    let spec = doc.get("spec");
    if spec.and_then(|s| s.get("background")).and_then(Value::as_bool) == Some(false) {
        return Ok(());
    }
    let rules = spec.and_then(|s| s.get("rules")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        if rule.get("validate").is_none() {
            continue;
        }
        for block in ["match", "exclude"] {
            let Some(m) = rule.get(block) else { continue };
            let mut places: Vec<(String, &Value)> = Vec::new();
            if let Some(k) = m.pointer("/resources/kinds") {
                places.push((format!("spec.rules[{i}].{block}.resources.kinds"), k));
            }
            for list in ["any", "all"] {
                for (j, f) in m.get(list).and_then(Value::as_array).into_iter().flatten().enumerate() {
                    if let Some(k) = f.pointer("/resources/kinds") {
                        places.push((format!("spec.rules[{i}].{block}.{list}[{j}].resources.kinds"), k));
                    }
                }
            }
            for (path, kinds) in places {
                for k in kinds.as_array().into_iter().flatten().filter_map(Value::as_str) {
                    // `Kind/sub` (and `*/*`, `Pod/*`), or a kind that only exists as a subresource.
                    let sel = crate::matching::KindSelector::parse(k);
                    if sel.names_subresource() || SUBRESOURCE_KINDS.contains(&sel.kind()) {
                        return Err(CompileError::new(&path, format!("background scan enabled with subresource {k}")));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn target_variables_are_read_only_where_a_target_is_known() {
        let policy = |context: Value, preconditions: Value, target_pre: Value| {
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "t"},
                "spec": {"background": false, "rules": [{"name": "r",
                    "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
                    "context": context, "preconditions": preconditions,
                    "mutate": {"targets": [{"apiVersion": "v1", "kind": "ConfigMap", "namespace": "{{ request.namespace }}",
                        "name": "t*", "preconditions": target_pre}],
                        "patchStrategicMerge": {"data": {"old": "{{ target.data.content }}"}}}}]}})
        };
        let none = json!({"all": []});
        let ok = policy(
            json!([]),
            none.clone(),
            json!({"all": [{"key": "{{ target.data.x }}", "operator": "Equals", "value": "1"}]}),
        );
        compile(&ok, &[]).unwrap();
        let in_context = policy(
            json!([{"name": "c", "variable": {"jmesPath": "{{target.data.content}}"}}]),
            none.clone(),
            none.clone(),
        );
        let e = compile(&in_context, &[]).unwrap_err().to_string();
        assert!(e.contains("spec.rules[0].context: policy contains invalid variables: invalid variables defined at mutate.targets[0]: variable target.data.content"), "{e}");
        let in_pre = policy(
            json!([]),
            json!({"all": [{"key": "{{ target.data.content }}", "operator": "Equals", "value": "x"}]}),
            none,
        );
        assert!(compile(&in_pre, &[]).unwrap_err().to_string().contains("spec.rules[0].preconditions"));
    }

    #[test]
    fn custom_generate_targets_are_questions_for_the_cluster() {
        let policy = |kind: &str, generate: Value| {
            json!({"apiVersion": "kyverno.io/v1", "kind": kind, "metadata": {"name": "g", "namespace": "team"},
                "spec": {"rules": [{"name": "r", "generate": generate}]}})
        };
        let custom =
            json!({"apiVersion": "iam.example.io/v1", "kind": "Role", "name": "r", "namespace": "x", "data": {}});
        let qs = scope_questions(&policy("ClusterPolicy", custom.clone()));
        assert_eq!(qs.len(), 1);
        assert_eq!(
            qs[0].refusal(true).as_deref(),
            Some(
                "spec.rules[0].generate.namespace: Forbidden: target namespace must not be set for a cluster-wide resource"
            )
        );
        assert_eq!(qs[0].refusal(false), None);
        let qs = scope_questions(&policy("Policy", custom));
        assert_eq!(
            qs[0].refusal(true).as_deref(),
            Some(
                "spec.rules[0].generate.namespace: Forbidden: target resource scope mismatched: the target must be a namespaced resource: iam.example.io/v1/Role "
            )
        );
        // Known kinds are the compiler's to check; templated ones nobody's.
        let known = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "data": {}});
        assert!(scope_questions(&policy("ClusterPolicy", known)).is_empty());
        let templated = json!({"apiVersion": "x/v1", "kind": "{{ k }}", "name": "c", "data": {}});
        assert!(scope_questions(&policy("ClusterPolicy", templated)).is_empty());
    }

    #[test]
    fn stored_generate_rules_must_fit_their_targets_scope_and_keep_their_spec() {
        let policy = |generate: Value| {
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "g"},
                "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]}, "generate": generate}]}})
        };
        let stored = |doc: &Value| {
            compile_stored(Kind::ClusterPolicy, "kyverno.io/v1", doc).map(|_| ()).map_err(|e| e.with_path())
        };
        let no_ns = policy(json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "data": {}}));
        assert!(stored(&no_ns).unwrap_err().contains("spec.rules[0].generate.namespace"));
        // The CLI does not check it (Kyverno's CLI does not either).
        assert!(compile(&no_ns, &[]).is_ok());
        let cluster_ns = policy(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "c", "namespace": "x", "data": {}}),
        );
        assert!(stored(&cluster_ns).is_err());
        let mixed = policy(
            json!({"namespace": "{{request.object.metadata.name}}", "cloneList": {"namespace": "default", "kinds": ["v1/Secret", "rbac.authorization.k8s.io/v1/ClusterRole"]}}),
        );
        assert!(stored(&mixed).unwrap_err().contains("cloneList.kinds"));
        let ok = policy(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "namespace": "{{request.object.metadata.name}}", "synchronize": true, "data": {}}),
        );
        assert!(stored(&ok).is_ok());
        // An update may change the generate block, not the rule around it; a rule may go.
        let mut new = ok.clone();
        new["spec"]["rules"][0]["generate"]["data"] = json!({"data": {"k": "v"}});
        assert!(generate_update_allowed(&ok, &new).is_ok());
        new["spec"]["rules"][0]["name"] = json!("renamed");
        assert!(generate_update_allowed(&ok, &new).is_err());
        let mut other = ok.clone();
        other["spec"]["rules"][0]["match"] = json!({"any": [{"resources": {"kinds": ["Pod"]}}]});
        assert!(generate_update_allowed(&ok, &other).is_err());
        let mut removed = ok.clone();
        removed["spec"]["rules"] = json!([]);
        assert!(generate_update_allowed(&ok, &removed).is_ok());
    }

    #[test]
    fn every_kind_is_compiled() {
        let ivpol =
            json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ImageValidatingPolicy", "metadata": {"name": "g"}});
        assert_eq!(
            compile(&ivpol, &[]).err().map(|e| e.to_string()).as_deref(),
            Some("spec.matchConstraints.resourceRules: at least one resource rule is required")
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod"});
        assert!(matches!(compile(&pod, &[]), Err(DocumentError::NotAPolicy { .. })));
        let vpol = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": "v"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                     "validations": [{"expression": "true"}]}});
        assert!(matches!(compile(&vpol, &[]), Ok(Compiled::Policy(p)) if p.kind == Kind::ValidatingPolicy));
    }

    #[test]
    fn a_stored_background_policy_may_not_validate_subresources() {
        let policy = |kinds: Value, background: Option<bool>| {
            let mut spec = json!({"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": kinds}}]},
                "validate": {"failureAction": "Audit", "deny": {}}}]});
            if let Some(b) = background {
                spec["background"] = json!(b);
            }
            json!({"metadata": {"name": "p"}, "spec": spec})
        };
        for kinds in [
            json!(["Scale"]),
            json!(["Pod/status"]),
            json!(["*/*"]),
            json!(["Pod/*"]),
            json!(["apps/v1/Deployment/scale"]),
        ] {
            let err = compile_stored(Kind::ClusterPolicy, "kyverno.io/v1", &policy(kinds.clone(), None)).err();
            assert!(
                err.as_ref().is_some_and(|e| e.with_path().starts_with(
                    "spec.rules[0].match.any[0].resources.kinds: background scan enabled with subresource"
                )),
                "{kinds}: {err:?}"
            );
            // Without background scans, or in `verno test`'s files, it is fine.
            assert!(compile_stored(Kind::ClusterPolicy, "kyverno.io/v1", &policy(kinds.clone(), Some(false))).is_ok());
        }
        for kinds in [json!(["Pod"]), json!(["v1/Pod"]), json!(["apps/v1/Deployment"]), json!(["*"])] {
            assert!(
                compile_stored(Kind::ClusterPolicy, "kyverno.io/v1", &policy(kinds.clone(), None)).is_ok(),
                "{kinds}"
            );
        }
    }

    fn policy_with(validate: serde_json::Value) -> Result<Compiled, DocumentError> {
        compile(
            &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
                "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": validate}]}}),
            &[],
        )
    }

    /// A background scan has no request, so a policy in background mode (the default) may not
    /// read who made it; Kyverno refuses such policies with these words.
    #[test]
    fn background_policies_may_not_read_the_requesting_user() {
        let with = |background: Option<bool>, rule: serde_json::Value| {
            let mut spec = json!({"rules": [rule]});
            if let Some(b) = background {
                spec["background"] = json!(b);
            }
            compile(&json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": spec}), &[])
                .err()
                .map(|e| e.to_string())
        };
        let deny_roles = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "validate": {"message": "m", "deny": {"conditions": {"any": [{"key": "{{request.roles}}", "operator": "Equals", "value": "x"}]}}}});
        let e = with(None, deny_roles.clone()).unwrap_or_default();
        assert!(e.contains("only select variables are allowed in background mode. Set spec.background=false to disable background mode for this policy rule: variable {{request.roles}} is not allowed"), "{e}");
        assert_eq!(with(Some(false), deny_roles), None);
        let by_role = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}, "clusterRoles": ["admin"]}]},
            "validate": {"message": "m", "pattern": {"metadata": {"name": "?*"}}}});
        let e = with(Some(true), by_role).unwrap_or_default();
        assert!(e.contains("invalid variable used at path: spec/rules[0]/match/any[0]/clusterRoles"), "{e}");
        // A field of the object that happens to be called serviceAccountName is fine.
        let field = json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
            "validate": {"message": "{{ request.object.spec.serviceAccountName }}", "pattern": {"metadata": {"name": "?*"}}}});
        assert_eq!(with(None, field), None);
    }

    /// A PolicyException in background mode may not match on the requesting user.
    #[test]
    fn background_exceptions_may_not_match_users() {
        let exception = |background: Option<bool>| {
            let mut spec = json!({"exceptions": [{"policyName": "p", "ruleNames": ["r"]}],
                "match": {"any": [{"resources": {"kinds": ["Pod"]}, "subjects": [{"kind": "User", "name": "chip"}]}]}});
            if let Some(b) = background {
                spec["background"] = json!(b);
            }
            compile(&json!({"apiVersion": "kyverno.io/v2", "kind": "PolicyException", "metadata": {"name": "e", "namespace": "n"}, "spec": spec}), &[])
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            exception(None).as_deref(),
            Some("spec.match.any[0].subjects: Forbidden: Usage of user info is forbidden")
        );
        assert_eq!(exception(Some(false)), None);
    }

    /// Kyverno's own checks of a policy spec, each with its words.
    #[test]
    fn kyvernos_spec_checks_refuse_what_kyverno_refuses() {
        let err = |spec: serde_json::Value| {
            compile(&json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": spec}), &[])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let rule =
            json!({"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": {"deny": {}}});
        assert_eq!(
            err(json!({"rules": [rule], "webhookConfiguration": {"timeoutSeconds": 31}})),
            "spec.webhookConfiguration.timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds"
        );
        assert_eq!(err(json!({"rules": [rule], "webhookConfiguration": {"timeoutSeconds": 30}})), "");
        assert_eq!(
            err(json!({"rules": [rule], "admission": false, "background": false})),
            "spec: disabling both admission and background processing is not allowed"
        );
        let mutate = json!({"name": "m", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"a": "b"}}}}});
        assert_eq!(
            err(json!({"rules": [mutate.clone()], "admission": false})),
            "spec.admission: disabling admission processing is only allowed with validation policies"
        );
        let mut with_cel = mutate;
        with_cel["celPreconditions"] = json!([{"name": "c", "expression": "true"}]);
        assert_eq!(
            err(json!({"rules": [with_cel]})),
            "spec.rules[0].celPreconditions: celPrecondition can only be used with validate.cel"
        );
    }

    /// A rule with a typo (`patern:`) enforced nothing, and one with both
    /// `pattern` and `deny` ignored the pattern; Kyverno refuses both.
    #[test]
    fn a_validate_rule_needs_exactly_one_way_to_validate() {
        let err = |v| policy_with(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            err(json!({"message": "m"})),
            "spec.rules[0].validate: one of pattern, anyPattern, deny, foreach, cel must be specified"
        );
        assert_eq!(
            err(json!({"pattern": {"metadata": {"labels": {"a": "?*"}}}, "deny": {}})),
            "spec.rules[0].validate: only one of pattern, anyPattern, deny, foreach, cel can be specified"
        );
        assert_eq!(
            err(json!({"foreach": [{"list": "request.object.spec.containers"}]})),
            "spec.rules[0].validate.foreach[0]: one of pattern, anyPattern, deny, or a nested foreach must be specified"
        );
        assert!(policy_with(json!({"pattern": {"metadata": {"labels": {"a": "?*"}}}})).is_ok());
    }

    /// Unknown fields were dropped, so a typo anywhere in a rule (`patern:`,
    /// `preconditon:`, `exlcude:`) silently changed what the policy enforces. They are refused
    /// with their path, as Kyverno's CLI (CRD schema validation) and the API server refuse them.
    #[test]
    fn unknown_fields_under_spec_are_refused_with_their_path() {
        let err = |v| policy_with(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            err(json!({"message": "m", "patern": {"metadata": {"labels": {"a": "?*"}}}})),
            "spec.rules[0].validate.patern: unknown field: a ClusterPolicy has no such field"
        );
        assert_eq!(
            err(json!({"foreach": [{"list": "request.object.spec.containers", "deny": {}, "elementScop": true}]})),
            "spec.rules[0].validate.foreach[0].elementScop: unknown field: a ClusterPolicy has no such field"
        );
        let at_spec = compile(
            &json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
                "spec": {"validationFailureActon": "Enforce",
                    "rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": {"deny": {}}}]}}),
            &[],
        );
        assert_eq!(
            at_spec.err().map(|e| e.to_string()).unwrap_or_default(),
            "spec.validationFailureActon: unknown field: a ClusterPolicy has no such field"
        );
        // Free-form parts take any key, and so do metadata (all of ObjectMeta) and status.
        let stored = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p", "uid": "u", "resourceVersion": "7", "managedFields": [], "creationTimestamp": "t"},
            "status": {"conditions": []},
            "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "validate": {"pattern": {"metadata": {"anyKey": {"(deep)": "x"}}}}}]}});
        assert!(compile(&stored, &[]).is_ok());
        // The CEL kinds too; fields of Kyverno's schema that Verno does not read are accepted.
        let vpol = |spec: Value| {
            compile(
                &json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy",
                "metadata": {"name": "v"}, "spec": spec}),
                &[],
            )
        };
        let rules = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}]});
        assert_eq!(
            vpol(json!({"matchConstraints": rules, "validaton": [{"expression": "true"}]}))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            "spec.validaton: unknown field: a ValidatingPolicy has no such field"
        );
        assert!(vpol(json!({"matchConstraints": rules, "validations": [{"expression": "true"}],
            "webhookConfiguration": {"timeoutSeconds": 5}, "auditAnnotations": [{"key": "k", "valueExpression": "'v'"}]}))
        .is_ok());
    }

    #[test]
    fn a_stored_object_gets_its_type_and_loses_its_status() {
        let stored = json!({"metadata": {"name": "p", "namespace": "shop"}, "status": {"ready": true},
            "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "validate": {"deny": {}}}]}});
        match compile_stored(Kind::Policy, "kyverno.io/v1", &stored) {
            Ok(Compiled::Policy(p)) => {
                assert_eq!((p.kind, p.key().as_str()), (Kind::Policy, "shop/p"));
                assert!(p.document.get("status").is_none());
            }
            other => panic!("{other:?}"),
        }
        let broken = json!({"metadata": {"name": "p"}, "spec": {"rules": "no"}});
        let e = compile_stored(Kind::ClusterPolicy, "kyverno.io/v1", &broken).err();
        assert!(e.is_some_and(|e| e.with_path().starts_with("spec: invalid type")));
    }
}
