//! Cleanup policies: `kyverno.io/v2` CleanupPolicy / ClusterCleanupPolicy and
//! `policies.kyverno.io` DeletingPolicy / NamespacedDeletingPolicy.
//!
//! Each compiles into a [`CompiledPolicy`] with one rule, named after the policy (as Kyverno's
//! CLI names it), whose body is a [`CompiledCleanup`]: the match is the policy's `match` /
//! `exclude` (CleanupPolicy) or `matchConstraints` (DeletingPolicy, with every operation), and
//! the body decides whether a matched object is due: `pass` ("resource matched") deletes,
//! `fail` ("resource did not match") keeps. The schedule and the propagation policy ride along
//! for the cleanup controller. The CLI (`Scope::ALL`) and the controller
//! ([`crate::Scope::cleanup`]) evaluate them through the same front door as every other kind.

use crate::cel_env::cel_env;
use crate::cel_kind::Shape;
use crate::condition::CompiledConditions;
use crate::context_entry::compile_context;
use crate::cron::Schedule;
use crate::error::CompileError;
use crate::forms::{CompiledCleanup, Decision};
use crate::matching::Matcher;
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::policy::{CompiledPolicy, CompiledRule, RuleBody, cel_expr};
use crate::ports::Data;
use serde_json::Value;
use verno_api::{CleanupPolicy, Kind, cel};

const MATCHED: &str = "resource matched";
const NOT_MATCHED: &str = "resource did not match";

impl CompiledCleanup {
    /// The rule's verdict on `object` (context loaded, match checked). The caller restores
    /// what it set in `ctx`.
    pub(crate) fn decide(
        &self,
        rule: &str,
        object: &Value,
        ctx: &mut crate::context::Context,
        data: &dyn Data,
        saved: &mut crate::context::Saved,
    ) -> RuleResponse {
        let verdict = |ok: bool| {
            RuleResponse::new(
                rule,
                RuleType::Deletion,
                if ok { Status::Pass } else { Status::Fail },
                if ok { MATCHED } else { NOT_MATCHED },
            )
        };
        match &self.decision {
            Decision::Conditions(None) => verdict(true),
            Decision::Conditions(Some(c)) => {
                saved.absorb(ctx.set("target", object.clone()));
                match c.evaluate(ctx) {
                    Ok((ok, _)) => verdict(ok),
                    Err(e) => RuleResponse::new(rule, RuleType::Deletion, Status::Error, e.to_string()),
                }
            }
            Decision::Cel { variables, conditions } => {
                let vars = match cel_env(ctx, data, None, variables) {
                    Ok(v) => v,
                    Err(e) => return RuleResponse::new(rule, RuleType::Deletion, Status::Error, e),
                };
                // A false condition decides at once; errors only count when none is false
                // (Kyverno's deleting engine).
                let mut errors = Vec::new();
                for (name, e) in conditions {
                    match e.eval_bool(&vars) {
                        Ok(true) => {}
                        Ok(false) => return verdict(false),
                        Err(err) => errors.push(format!("condition {name}: {err}")),
                    }
                }
                if errors.is_empty() {
                    verdict(true)
                } else {
                    RuleResponse::new(rule, RuleType::Deletion, Status::Error, errors.join("; "))
                }
            }
        }
    }
}

fn schedule(s: &str, kind_word: &str, detailed: bool) -> Result<Schedule, CompileError> {
    if s.trim().is_empty() {
        return Err(CompileError::new("spec.schedule", "schedule is required"));
    }
    Schedule::parse(s).map_err(|e| {
        let base = format!("Invalid value: {s:?}: schedule spec in the {kind_word} is not in proper cron format");
        CompileError::new("spec.schedule", if detailed { format!("{base}: {e}") } else { format!("{base} ({e})") })
    })
}

fn propagation(p: Option<&str>) -> Result<Option<&'static str>, CompileError> {
    p.filter(|p| !p.is_empty())
        .map(|p| {
            crate::ttl::propagation(p).map_err(|e| CompileError::new("spec.deletionPropagationPolicy", e.to_string()))
        })
        .transpose()
}

fn policy(doc: &Value, kind: Kind, rule: CompiledRule) -> Result<CompiledPolicy, CompileError> {
    // Cleanup policies are not admission policies: no webhook, no background scan.
    let mut p = crate::cel_kind::cel_policy(doc, kind, Shape::audit(false), vec![rule])?;
    p.admission = false;
    Ok(p)
}

fn rule(name: &str, matcher: Matcher, exclude: Option<Matcher>, body: CompiledCleanup) -> CompiledRule {
    CompiledRule {
        name: name.to_string(),
        autogen_of: None,
        matcher,
        exclude,
        context: Vec::new(),
        preconditions: None,
        cel_preconditions: Vec::new(),
        report_properties: Vec::new(),
        body: RuleBody::Cleanup(Box::new(body)),
    }
}

/// Compiles a DeletingPolicy or NamespacedDeletingPolicy document.
pub fn compile_deleting_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    let name = crate::cel_kind::policy_name(doc)?.to_string();
    let kind = match Kind::of_document(doc) {
        Some(Kind::NamespacedDeletingPolicy) => Kind::NamespacedDeletingPolicy,
        _ => Kind::DeletingPolicy,
    };
    let policy_doc: cel::DeletingPolicy = crate::decode::decode(doc)?;
    let spec = &policy_doc.spec;
    let mut base = crate::cel_kind::constraints(spec.match_constraints.as_ref());
    if base.rules.is_empty() {
        return Err(crate::policy::missing_match_constraints());
    }
    // Deleting policies select stored objects: every operation matches.
    for r in &mut base.rules {
        r.operations = vec!["*".into()];
    }
    let variables = crate::policy::compile_cel_variables(
        Some(&crate::decode::json_of(&spec.variables)).filter(|_| !spec.variables.is_empty()),
        "spec",
    )?;
    let mut conditions = Vec::new();
    for (i, c) in spec.conditions.iter().enumerate() {
        let path = format!("spec.conditions[{i}]");
        let name = c
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CompileError::new(format!("{path}.name"), "a condition needs a name"))?;
        conditions.push((name, cel_expr(Some(&c.expression), &format!("{path}.expression"))?));
    }
    let body = CompiledCleanup {
        schedule: schedule(&spec.schedule, "deletingPolicy", true)?,
        propagation: propagation(spec.deletion_propagation_policy.as_deref())?,
        decision: Decision::Cel { variables, conditions },
    };
    policy(doc, kind, rule(&name, Matcher::constraints(base), None, body))
}

/// Compiles a CleanupPolicy or ClusterCleanupPolicy document, with the checks Kyverno's
/// cleanup webhook makes.
pub fn compile_cleanup_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    let name = crate::cel_kind::policy_name(doc)?.to_string();
    let kind = match Kind::of_document(doc) {
        Some(Kind::CleanupPolicy) => Kind::CleanupPolicy,
        _ => Kind::ClusterCleanupPolicy,
    };
    let p: CleanupPolicy = crate::decode::strict(doc, Some(kind)).map_err(|e| match e {
        crate::error::DocumentError::Invalid(e) => e,
        other => CompileError::new("spec", other.to_string()),
    })?;
    let spec = &p.spec;
    for (i, e) in spec.context.iter().enumerate() {
        let what = if e.image_registry.is_some() {
            "ImageRegistry"
        } else if e.config_map.is_some() {
            "ConfigMap"
        } else {
            continue;
        };
        return Err(CompileError::new(
            format!("spec.context[{i}]"),
            format!("{what} is not allowed in CleanUp Policy"),
        ));
    }
    let no_user = |m: &verno_api::MatchResources, path: &str| -> Result<(), CompileError> {
        let filters = m.any.iter().chain(m.all.iter()).flatten();
        let users = !m.subjects.is_empty()
            || !m.roles.is_empty()
            || !m.cluster_roles.is_empty()
            || filters
                .into_iter()
                .any(|f| !f.subjects.is_empty() || !f.roles.is_empty() || !f.cluster_roles.is_empty());
        if users {
            return Err(CompileError::new(
                path,
                "subjects, roles and clusterRoles are not allowed in a cleanup policy",
            ));
        }
        Ok(())
    };
    no_user(&spec.match_, "spec.match")?;
    if let Some(x) = &spec.exclude {
        no_user(x, "spec.exclude")?;
    }
    let matcher = Matcher::compile(&spec.match_, "spec.match")?;
    if matcher.webhook_scope().is_empty() {
        return Err(CompileError::new("spec.match", "at least one kind is required"));
    }
    if let (Some(x), Some(m_any)) = (&spec.exclude, &spec.match_.any)
        && spec.match_.all.is_none()
        && x.all.is_none()
        && let Some(x_any) = &x.any
        && m_any.iter().any(|m| {
            let m = crate::decode::json_of(m);
            x_any.iter().any(|e| crate::decode::json_of(e) == m)
        })
    {
        return Err(CompileError::new("spec", "CleanupPolicy is matching an empty set"));
    }
    let exclude = spec.exclude.as_ref().map(|x| Matcher::compile(x, "spec.exclude")).transpose()?;
    let body = CompiledCleanup {
        schedule: schedule(&spec.schedule, "cleanupPolicy", false)?,
        propagation: propagation(spec.deletion_propagation_policy.as_deref())?,
        decision: Decision::Conditions(CompiledConditions::compile_optional(
            spec.conditions.as_ref(),
            "spec.conditions",
        )?),
    };
    let mut r = rule(&name, matcher, exclude, body);
    r.context = compile_context(&spec.context, "spec.context")?;
    policy(doc, kind, r)
}

/// Where a cleanup policy's candidates are listed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupTargets {
    /// One entry per kind (CleanupPolicy) or resource (DeletingPolicy) named.
    pub scopes: Vec<crate::matching::WebhookScope>,
    /// A label selector every candidate must satisfy, in the API's query syntax, when the
    /// policy has one that the API server can evaluate (`objectSelector`, or a `selector`
    /// every match entry shares).
    pub label_selector: Option<String>,
}

impl CompiledPolicy {
    /// The cleanup rule's body, for the cleanup kinds.
    pub fn cleanup(&self) -> Option<&CompiledCleanup> {
        self.rules.iter().find_map(|r| match &r.body {
            RuleBody::Cleanup(c) => Some(c.as_ref()),
            _ => None,
        })
    }

    /// What the cleanup controller lists for this policy; `None` for other kinds.
    pub fn cleanup_targets(&self) -> Option<CleanupTargets> {
        let rule = self.rules.iter().find(|r| matches!(r.body, RuleBody::Cleanup(_)))?;
        Some(CleanupTargets {
            scopes: rule.matcher.webhook_scope(),
            label_selector: rule.matcher.pushdown_selector().and_then(|s| s.to_query()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Compiled, PolicySet, Request, Scope, compile};
    use serde_json::json;
    use std::sync::Arc;

    fn set_of(doc: Value) -> PolicySet {
        match compile(&doc, &[]).expect("compiles") {
            Compiled::Policy(p) => PolicySet::new(vec![Arc::new(p)], Vec::new()),
            Compiled::Exception(_) => panic!("not a policy"),
        }
    }

    /// The cleanup verdict for `object`: `None` when the policy does not select it.
    fn verdict(set: &PolicySet, scope: Scope, object: &Value) -> Option<(Status, String)> {
        let req = Request::new(crate::Operation::Create, object);
        let out = set.evaluate(&req, scope, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
        out.responses.into_iter().flat_map(|(_, r)| r.rules).next().map(|r| (r.status, r.message))
    }

    fn pod(ns: &str, name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {"replicas": 1}})
    }

    fn dpol(conditions: Value) -> Value {
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "old-pods"},
            "spec": {"schedule": "*/5 * * * *", "deletionPropagationPolicy": "Orphan",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                    "objectSelector": {"matchLabels": {"tier": "scratch"}}},
                "variables": [{"name": "n", "expression": "object.metadata.name"}],
                "conditions": conditions}})
    }

    #[test]
    fn a_deleting_policy_passes_what_it_would_delete_and_skips_what_it_does_not_select() {
        let set = set_of(dpol(json!([{"name": "named", "expression": "variables.n.startsWith('tmp-')"}])));
        let s = || Scope::cleanup(Kind::DeletingPolicy, None, "old-pods");
        let scratch = json!({"tier": "scratch"});
        assert_eq!(verdict(&set, s(), &pod("a", "tmp-1", scratch.clone())), Some((Status::Pass, MATCHED.into())));
        assert_eq!(verdict(&set, s(), &pod("a", "keep", scratch)), Some((Status::Fail, NOT_MATCHED.into())));
        // Not selected (objectSelector): no verdict at all.
        assert_eq!(verdict(&set, s(), &pod("a", "tmp-2", json!({}))), None);
        // Another policy's scope sees nothing.
        assert_eq!(
            verdict(
                &set,
                Scope::cleanup(Kind::DeletingPolicy, None, "other"),
                &pod("a", "tmp-1", json!({"tier": "scratch"}))
            ),
            None
        );
        // A webhook never runs cleanup policies.
        let route = crate::Route::Kyverno(crate::Hook::Validate, crate::Filter::All);
        assert_eq!(verdict(&set, Scope::webhook(route), &pod("a", "tmp-1", json!({"tier": "scratch"}))), None);
        let p = &set.policies()[0];
        let c = p.cleanup().expect("a cleanup body");
        assert_eq!(c.propagation, Some("Orphan"));
        let t = p.cleanup_targets().expect("targets");
        assert_eq!(t.label_selector.as_deref(), Some("tier=scratch"));
        assert_eq!(t.scopes[0].resource.as_deref(), Some("pods"));
    }

    #[test]
    fn a_false_condition_wins_over_an_error_and_an_error_alone_is_an_error() {
        let set = set_of(dpol(json!([
            {"name": "broken", "expression": "object.spec.missing.field == 1"},
            {"name": "no", "expression": "false"}])));
        let s = || Scope::cleanup(Kind::DeletingPolicy, None, "old-pods");
        let obj = pod("a", "x", json!({"tier": "scratch"}));
        assert_eq!(verdict(&set, s(), &obj).map(|v| v.0), Some(Status::Fail));
        let set = set_of(dpol(json!([{"name": "broken", "expression": "object.spec.missing.field == 1"}])));
        let (status, message) = verdict(&set, s(), &obj).expect("a verdict");
        assert_eq!(status, Status::Error);
        assert!(message.contains("condition broken"), "{message}");
    }

    #[test]
    fn a_cleanup_policy_reads_the_object_as_target_and_honours_exclude() {
        let set = set_of(
            json!({"apiVersion": "kyverno.io/v2", "kind": "CleanupPolicy", "metadata": {"name": "c", "namespace": "a"},
            "spec": {"schedule": "0 * * * *",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "exclude": {"any": [{"resources": {"names": ["precious"], "kinds": ["Pod"]}}]},
                "context": [{"name": "limit", "variable": {"value": 2}}],
                "conditions": {"all": [{"key": "{{ target.spec.replicas }}", "operator": "LessThan", "value": "{{ limit }}"}]}}}),
        );
        let s = || Scope::cleanup(Kind::CleanupPolicy, Some("a"), "c");
        assert_eq!(verdict(&set, s(), &pod("a", "p", json!({}))).map(|v| v.0), Some(Status::Pass));
        assert_eq!(verdict(&set, s(), &pod("a", "precious", json!({}))), None);
        // A namespaced cleanup policy only sees its own namespace.
        assert_eq!(verdict(&set, s(), &pod("b", "p", json!({}))), None);
        let mut big = pod("a", "p", json!({}));
        big["spec"]["replicas"] = json!(3);
        assert_eq!(verdict(&set, s(), &big).map(|v| v.0), Some(Status::Fail));
    }

    #[test]
    fn bad_cleanup_policies_name_the_field() {
        let cases = [
            (
                json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "d"},
                "spec": {"schedule": "61 * * * *", "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}}}),
                "spec.schedule",
                "schedule spec in the deletingPolicy is not in proper cron format: minute field",
            ),
            (
                json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "d"},
                "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}}}),
                "spec.schedule",
                "schedule is required",
            ),
            (
                json!({"apiVersion": "policies.kyverno.io/v1", "kind": "DeletingPolicy", "metadata": {"name": "d"}, "spec": {"schedule": "* * * * *"}}),
                "spec.matchConstraints",
                "at least one resource rule",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "context": [{"name": "cm", "configMap": {"name": "x", "namespace": "y"}}]}}),
                "spec.context[0]",
                "ConfigMap is not allowed in CleanUp Policy",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "context": [{"name": "img", "imageRegistry": {"reference": "ghcr.io/x"}}]}}),
                "spec.context[0]",
                "ImageRegistry is not allowed",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "every minute", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}}}),
                "spec.schedule",
                "schedule spec in the cleanupPolicy is not in proper cron format",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}, "subjects": [{"kind": "User", "name": "x"}]}]}}}),
                "spec.match",
                "not allowed in a cleanup policy",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "exclude": {"any": [{"resources": {"kinds": ["Pod"]}}]}}}),
                "spec",
                "CleanupPolicy is matching an empty set",
            ),
            (
                json!({"apiVersion": "kyverno.io/v2", "kind": "ClusterCleanupPolicy", "metadata": {"name": "c"},
                "spec": {"schedule": "* * * * *", "deletionPropagationPolicy": "Sometimes", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}}}),
                "spec.deletionPropagationPolicy",
                "unknown propagation policy",
            ),
        ];
        for (doc, path, want) in cases {
            match compile(&doc, &[]) {
                Err(crate::DocumentError::Invalid(e)) => {
                    assert_eq!(e.path, path, "{doc}");
                    assert!(e.message.contains(want), "{}: {}", doc, e.message);
                }
                other => panic!("{doc}: {other:?}"),
            }
        }
    }
}
