//! What every CEL policy kind (ValidatingPolicy, MutatingPolicy, GeneratingPolicy,
//! ImageValidatingPolicy, DeletingPolicy and the Kubernetes admission policies) compiles the
//! same way: the Kubernetes `matchConstraints`, autogen's controllers, the policy's name and
//! the [`CompiledPolicy`] around the kind's rules.

use crate::error::CompileError;
use crate::matching::{Constraints, ResourceRule};
use crate::policy::{Action, CompiledPolicy, CompiledRule};
use serde_json::Value;
use verno_api::{Kind, cel};

/// How a CEL-kind policy acts, where the kinds differ ([`cel_policy`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Enforce (deny) or Audit (report) a failure.
    pub action: Action,
    /// Also warn the requester (`validationActions: [Warn]`).
    pub emit_warning: bool,
    /// Evaluated by the background scan.
    pub background: bool,
}

impl Shape {
    /// Audit, no warning, `background` as given.
    pub(crate) fn audit(background: bool) -> Shape {
        Shape { action: Action::Audit, emit_warning: false, background }
    }
}

fn rules(rs: &[cel::ResourceRule]) -> Vec<ResourceRule> {
    rs.iter()
        .map(|r| ResourceRule {
            api_groups: r.api_groups.clone(),
            api_versions: r.api_versions.clone(),
            resources: r.resources.clone(),
            operations: r.operations.clone(),
            resource_names: r.resource_names.clone(),
            scope: r.scope.clone(),
        })
        .collect()
}

/// A Kubernetes `MatchResources` as the matcher reads it (absent: matches nothing).
pub(crate) fn constraints(mc: Option<&cel::MatchResources>) -> Constraints {
    let Some(mc) = mc else {
        return Constraints { rules: Vec::new(), exclude: Vec::new(), namespace_selector: None, object_selector: None };
    };
    Constraints {
        rules: rules(&mc.resource_rules),
        exclude: rules(&mc.exclude_resource_rules),
        namespace_selector: mc.namespace_selector.clone(),
        object_selector: mc.object_selector.clone(),
    }
}

/// The controllers autogen covers, or none when autogen does not apply or is turned off
/// (`autogen.podControllers.controllers: []`). It applies as Kyverno's `CanAutoGen` says: the
/// policy matches bare Pods and nothing else — one resource rule of group `""`, version `v1`,
/// resource `pods`, no resource names, no excluded resources, no object selector. Anything
/// wider (a second rule, `pods/ephemeralcontainers`, a wildcard group) is not rewritten for
/// controllers: applying the Pod checks to a Deployment Kyverno never checks would deny it.
pub(crate) fn controllers(autogen: Option<&Value>, c: &Constraints) -> Vec<&'static str> {
    let only = |list: &[String], value: &str| matches!(list, [one] if one == value);
    let selects = c.object_selector.as_ref().is_some_and(|s| {
        s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
            || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
    });
    let pods = match c.rules.as_slice() {
        [r] => {
            only(&r.api_groups, "")
                && only(&r.api_versions, "v1")
                && only(&r.resources, "pods")
                && r.resource_names.is_empty()
        }
        _ => false,
    } && c.exclude.is_empty()
        && !selects;
    if !pods {
        return Vec::new();
    }
    match autogen.and_then(|a| a.pointer("/podControllers/controllers")).and_then(Value::as_array) {
        Some(list) => {
            let names: Vec<String> = list.iter().filter_map(Value::as_str).map(str::to_lowercase).collect();
            ["deployments", "replicasets", "statefulsets", "daemonsets", "jobs", "cronjobs"]
                .into_iter()
                .filter(|c| names.iter().any(|n| n == c))
                .collect()
        }
        None => vec!["deployments", "replicasets", "statefulsets", "daemonsets", "jobs", "cronjobs"],
    }
}

pub(crate) fn controller_rules(ctrls: &[&str], cron: bool, base: &Constraints) -> Constraints {
    let ops: Vec<String> = base
        .rules
        .iter()
        .flat_map(|r| r.operations.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mk = |group: &str, version: &str, res: Vec<String>| ResourceRule {
        api_groups: vec![group.into()],
        api_versions: vec![version.into()],
        resources: res,
        operations: ops.clone(),
        resource_names: Vec::new(),
        scope: None,
    };
    let mut rules = Vec::new();
    if cron {
        rules.push(mk("batch", "v1", vec!["cronjobs".into()]));
    } else {
        let apps: Vec<String> =
            ctrls.iter().filter(|c| **c != "jobs" && **c != "cronjobs").map(|c| c.to_string()).collect();
        if !apps.is_empty() {
            rules.push(mk("apps", "v1", apps));
        }
        if ctrls.contains(&"jobs") {
            rules.push(mk("batch", "v1", vec!["jobs".into()]));
        }
    }
    Constraints {
        rules,
        exclude: Vec::new(),
        namespace_selector: base.namespace_selector.clone(),
        object_selector: base.object_selector.clone(),
    }
}

/// The policy's name; every kind needs one.
pub(crate) fn policy_name(doc: &Value) -> Result<&str, CompileError> {
    match doc.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Ok(n),
        _ => Err(CompileError::new("metadata.name", "a policy needs a name")),
    }
}

/// A CEL-kind policy (ValidatingPolicy, MutatingPolicy, the admission policies) as a
/// [`CompiledPolicy`]: what differs per kind is passed in, the rest is the same for all.
pub(crate) fn cel_policy(
    doc: &Value,
    kind: Kind,
    shape: Shape,
    rules: Vec<CompiledRule>,
) -> Result<CompiledPolicy, CompileError> {
    let Shape { action, emit_warning, background } = shape;
    let name = policy_name(doc)?;
    let namespace = doc.pointer("/metadata/namespace").and_then(Value::as_str).filter(|n| !n.is_empty());
    Ok(CompiledPolicy {
        name: name.to_string(),
        // A namespaced kind without a namespace lives in `default`, as the API server puts it.
        namespace: namespace.map(str::to_string).or_else(|| kind.is_namespaced().then(|| "default".to_string())),
        kind,
        action,
        overrides: Vec::new(),
        background,
        admission: doc.pointer("/spec/evaluation/admission/enabled").and_then(Value::as_bool).unwrap_or(true),
        apply_one: false,
        scored: true,
        emit_warning,
        failure_policy_ignore: doc.pointer("/spec/failurePolicy").and_then(Value::as_str) == Some("Ignore"),
        // The CEL kinds' matchConditions are compiled into their rules.
        match_conditions: Vec::new(),
        report_meta: crate::policy::ReportMeta::of(doc),
        rules,
        document: doc.clone(),
        self_contained_memo: std::sync::OnceLock::new(),
    })
}

/// A Kubernetes admission policy's one rule as Kyverno reports it: named after the policy,
/// its binding's name in the result's properties under `key` (`binding` for a
/// ValidatingAdmissionPolicy, `mapBinding` for a MutatingAdmissionPolicy).
pub(crate) fn admission_rule_identity(
    r: &mut CompiledRule,
    policy: &str,
    key: &str,
    binding: &cel::PolicyBinding,
) -> Result<(), CompileError> {
    r.name = policy.to_string();
    r.autogen_of = None;
    if !binding.metadata.name.is_empty() {
        // An object name (a DNS subdomain) holds no `{{`: the template renders as itself.
        let t = crate::template::Template::compile(&binding.metadata.name)
            .map_err(|e| CompileError::new("binding.metadata.name", e))?;
        r.report_properties.push((key.to_string(), t));
    }
    Ok(())
}
