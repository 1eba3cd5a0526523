//! Checks Kyverno's policy validation makes on a ClusterPolicy/Policy rule beyond compiling it,
//! in its words (the CLI lists such a policy under "Policies Skipped", the policy webhook
//! refuses it):
//! - a condition (precondition or `deny`) without a key, value or operator;
//! - a condition on `{{ request.operation }}` whose value is not one of CREATE, UPDATE, DELETE,
//!   CONNECT (a `{{ … }}` value is allowed), or not a string or a list;
//! - a pattern or strategic-merge patch whose `metadata.labels`/`annotations` (or, under
//!   `spec`, `spec.template.metadata`'s) hold anything but strings;
//! - a `podSecurity` exclusion that does not fit its control (images on a pod-level control,
//!   none on a container-level one, `restrictedField` without `values` or the reverse, a
//!   restricted-only control excluded at the baseline level).

use crate::error::CompileError;
use serde_json::Value;
use verno_api::Rule;
use verno_api::policy::{Condition, Conditions};

/// The condition checks of rule `i` (Kyverno's `validateConditions`, reached from its
/// `validateResources`): preconditions, then `validate.deny.conditions`.
pub fn conditions(rule: &Rule, i: usize) -> Result<(), CompileError> {
    // Kyverno names the rule's preconditions `validate.preconditions`, whatever the rule does.
    if let Some(c) = &rule.preconditions {
        check_all(c, "preconditions").map_err(|(p, e)| at_rule(i, &format!("validate.{p}"), e))?;
    }
    if let Some(c) = rule.validate.as_ref().and_then(|v| v.deny.as_ref()).and_then(|d| d.conditions.as_ref()) {
        check_all(c, "conditions").map_err(|(p, e)| at_rule(i, &format!("validate.deny.{p}"), e))?;
    }
    Ok(())
}

/// Kyverno's text: `path: spec.rules[I].PATH: ERROR`.
fn at_rule(i: usize, path: &str, error: String) -> CompileError {
    CompileError::new(format!("path: spec.rules[{i}].{path}"), error)
}

fn check_all(c: &Conditions, key: &str) -> Result<(), (String, String)> {
    let check = |list: &[Condition], at: &dyn Fn(usize) -> String| {
        list.iter().enumerate().try_for_each(|(n, c)| check_one(c).map_err(|(p, e)| (format!("{}.{p}", at(n)), e)))
    };
    match c {
        Conditions::AnyAll { any, all } => {
            check(any.as_deref().unwrap_or_default(), &|n| format!("{key}.any[{n}]"))?;
            check(all.as_deref().unwrap_or_default(), &|n| format!("{key}.all[{n}]"))
        }
        Conditions::List(list) => check(list, &|n| format!("{key}[{n}]")),
    }
}

/// One condition: the part of its path after the condition, and the error.
fn check_one(c: &Condition) -> Result<(), (String, String)> {
    if c.key.is_null() || c.value.is_null() || c.operator.is_empty() {
        return Err((String::new(), "entered value of `key`, `value` or `operator` is missing or misspelled".into()));
    }
    let Value::String(key) = &c.key else { return Ok(()) };
    if key.replace(' ', "") != "{{request.operation}}" {
        return Ok(());
    }
    const ALLOWED: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];
    let unknown = |v: &str| {
        format!(
            "unknown value '{v}' found under the 'value' field. Only the following values are allowed: [CREATE, UPDATE, DELETE, CONNECT]"
        )
    };
    match &c.value {
        Value::String(v) => {
            let templated = v.len() >= 4 && v.starts_with("{{") && v.ends_with("}}");
            if !templated && !ALLOWED.contains(&v.as_str()) {
                return Err((format!("value: {v}"), unknown(v)));
            }
        }
        Value::Array(values) => {
            for (n, v) in values.iter().enumerate() {
                let Value::String(v) = v else {
                    return Err((
                        format!("value[{n}]"),
                        format!(
                            "'value[{n}]' found to be of the type {}. The provided values are expected to be strings",
                            go_type(v)
                        ),
                    ));
                };
                if !ALLOWED.contains(&v.as_str()) {
                    return Err((format!("value[{n}]"), unknown(v)));
                }
            }
        }
        other => {
            return Err((
                "value".into(),
                format!(
                    "'value' field found to be of the type {}. The provided value/values are expected to be either in the form of a string or list",
                    go_kind(other)
                ),
            ));
        }
    }
    Ok(())
}

/// The reflect kind Go names for a decoded YAML/JSON scalar or map (Kyverno decodes whole
/// numbers as int64, others as float64).
fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        Value::Object(_) => "map",
        Value::String(_) => "string",
        Value::Array(_) => "slice",
        Value::Null => "invalid",
    }
}

/// The Go type `%T` prints for a list element (scalars as [`go_kind`] names them).
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "map[string]interface {}",
        Value::Array(_) => "[]interface {}",
        Value::Null => "<nil>",
        scalar => go_kind(scalar),
    }
}

/// Kyverno's `PodSecurityStandard.Validate` and `ValidatePSaControlNames` over every rule (part
/// of its spec validation, so all such errors are reported together: one as it is, several as
/// `[a, b]`).
pub fn pod_security(rules: &[Rule]) -> Result<(), CompileError> {
    const CONTAINER_LEVEL: [&str; 5] =
        ["Capabilities", "Privileged Containers", "Host Ports", "/proc Mount Type", "Privilege Escalation"];
    const POD_LEVEL: [&str; 4] = ["Host Namespaces", "HostPath Volumes", "Sysctls", "Volume Types"];
    // Restricted-only controls, as Kyverno lists them (Seccomp and Capabilities have a
    // baseline part too and stay allowed).
    const RESTRICTED_ONLY: [&str; 4] =
        ["Volume Types", "Privilege Escalation", "Running as Non-root", "Running as Non-root user"];
    let mut errors = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let Some(ps) = r.validate.as_ref().and_then(|v| v.pod_security.as_ref()) else { continue };
        for (n, ex) in ps.exclude.iter().enumerate() {
            let at = format!("spec.rules[{i}].podSecurity.exclude[{n}]");
            let control = &ex.control_name;
            if CONTAINER_LEVEL.contains(&control.as_str()) && ex.images.is_empty() {
                errors.push(format!(
                    "{at}.controlName: Invalid value: {control:?}: exclude.images must be specified for the container level control"
                ));
            } else if POD_LEVEL.contains(&control.as_str()) && !ex.images.is_empty() {
                errors.push(format!(
                    "{at}.controlName: Invalid value: {control:?}: exclude.images must not be specified for the pod level control"
                ));
            }
            let field = ex.restricted_field.as_deref().unwrap_or("");
            if !field.is_empty() && ex.values.is_empty() {
                errors.push(format!("{at}.values: Forbidden: values is required"));
            }
            if field.is_empty() && !ex.values.is_empty() {
                errors.push(format!("{at}.restrictedField: Forbidden: restrictedField is required"));
            }
            if ps.level == "baseline" && RESTRICTED_ONLY.contains(&control.as_str()) {
                errors.push(format!(
                    "{at}.controlName: Invalid value: {control:?}: Invalid control name defined at the given level"
                ));
            }
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(CompileError::whole(errors.remove(0))),
        _ => Err(CompileError::whole(format!("[{}]", errors.join(", ")))),
    }
}

/// Kyverno's `isLabelAndAnnotationsString`: the first pattern it looks at (a foreach's, the
/// rule's, each of `anyPattern`'s, a strategic-merge patch) may hold only strings in
/// `metadata.labels` and `metadata.annotations` (or, under `spec`,
/// `spec.template.metadata`'s).
pub fn label_values(rule: &Rule) -> Result<(), CompileError> {
    let ok = if let Some(v) = &rule.validate {
        if let Some(fe) = &v.foreach {
            fe.iter().find_map(|f| f.pattern.as_ref().filter(|p| p.is_object())).is_none_or(metadata_strings)
        } else if let Some(p) = v.pattern.as_ref().filter(|p| p.is_object()) {
            metadata_strings(p)
        } else if let Some(Value::Array(any)) = &v.any_pattern {
            any.iter().filter(|p| p.is_object()).all(metadata_strings)
        } else {
            true
        }
    } else if let Some(m) = &rule.mutate {
        let patch = match &m.foreach {
            Some(fe) => fe.iter().find_map(|f| f.patch_strategic_merge.as_ref().filter(|p| p.is_object())),
            None => m.patch_strategic_merge.as_ref().filter(|p| p.is_object()),
        };
        patch.is_none_or(metadata_strings)
    } else {
        true
    };
    if ok {
        Ok(())
    } else {
        Err(CompileError::whole(
            "labels and annotations supports only string values, \"use double quotes around the non string values\"",
        ))
    }
}

/// Whether a pattern's `metadata` (and its `spec.template.metadata`) labels and annotations are
/// strings. (Kyverno stops at whichever of `metadata` and `spec` its map iteration meets first;
/// both are checked here.)
fn metadata_strings(pattern: &Value) -> bool {
    let strings = |meta: Option<&Value>| {
        ["labels", "annotations"].iter().all(|k| match meta.and_then(|m| m.get(*k)) {
            Some(Value::Object(m)) => m.values().all(Value::is_string),
            _ => true,
        })
    };
    strings(pattern.get("metadata")) && strings(pattern.pointer("/spec/template/metadata"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(v: Value) -> Rule {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    fn text(r: Result<(), CompileError>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn request_operation_values_are_kyvernos_four_in_its_words() {
        let deny = |value: Value, block: &str| {
            rule(json!({"name": "r", "validate": {"deny": {"conditions": {block: [
                {"key": "{{ request.operation }}", "operator": "Equals", "value": "CREATE"},
                {"key": "{{request.operation}}", "operator": "In", "value": value}]}}}}))
        };
        assert_eq!(
            text(conditions(&deny(json!("*"), "any"), 0)),
            "path: spec.rules[0].validate.deny.conditions.any[1].value: *: unknown value '*' found under the 'value' field. Only the following values are allowed: [CREATE, UPDATE, DELETE, CONNECT]"
        );
        assert_eq!(
            text(conditions(&deny(json!(["CREATE", "PATCH"]), "all"), 2)),
            "path: spec.rules[2].validate.deny.conditions.all[1].value[1]: unknown value 'PATCH' found under the 'value' field. Only the following values are allowed: [CREATE, UPDATE, DELETE, CONNECT]"
        );
        assert_eq!(
            text(conditions(&deny(json!(1), "all"), 0)),
            "path: spec.rules[0].validate.deny.conditions.all[1].value: 'value' field found to be of the type int64. The provided value/values are expected to be either in the form of a string or list"
        );
        // Good values, templated values and other keys pass.
        for ok in [json!(["CREATE", "UPDATE"]), json!("{{ op }}"), json!("DELETE")] {
            assert!(conditions(&deny(ok, "any"), 0).is_ok());
        }
        let other = rule(
            json!({"name": "r", "preconditions": {"all": [{"key": "{{ request.object.x }}", "operator": "Equals", "value": 3}]},
            "validate": {"pattern": {}}}),
        );
        assert!(conditions(&other, 0).is_ok());
    }

    #[test]
    fn a_precondition_is_named_under_validate_and_a_missing_value_refused() {
        let r = rule(
            json!({"name": "r", "preconditions": {"all": [{"key": "{{ request.operation }}", "operator": "Equals", "value": true}]},
            "mutate": {"patchStrategicMerge": {}}}),
        );
        assert_eq!(
            text(conditions(&r, 0)),
            "path: spec.rules[0].validate.preconditions.all[0].value: 'value' field found to be of the type bool. The provided value/values are expected to be either in the form of a string or list"
        );
        let r = rule(
            json!({"name": "r", "preconditions": [{"key": "{{ a }}", "operator": "Equals"}], "validate": {"pattern": {}}}),
        );
        assert_eq!(
            text(conditions(&r, 1)),
            "path: spec.rules[1].validate.preconditions[0].: entered value of `key`, `value` or `operator` is missing or misspelled"
        );
    }

    #[test]
    fn pod_security_exclusions_fit_their_control_and_level() {
        let ps = |level: &str, exclude: Value| {
            rule(
                json!({"name": "r", "validate": {"podSecurity": {"level": level, "version": "latest", "exclude": exclude}}}),
            )
        };
        let one = ps("baseline", json!([{"controlName": "Running as Non-root", "images": ["*"]}]));
        assert_eq!(
            text(pod_security(&[rule(json!({"name": "a", "validate": {"pattern": {}}})), one])),
            "spec.rules[1].podSecurity.exclude[0].controlName: Invalid value: \"Running as Non-root\": Invalid control name defined at the given level"
        );
        let several = ps(
            "restricted",
            json!([{"controlName": "Host Ports"}, {"controlName": "Host Namespaces", "images": ["x"], "values": ["true"]}]),
        );
        assert_eq!(
            text(pod_security(&[several])),
            "[spec.rules[0].podSecurity.exclude[0].controlName: Invalid value: \"Host Ports\": exclude.images must be specified for the container level control, spec.rules[0].podSecurity.exclude[1].controlName: Invalid value: \"Host Namespaces\": exclude.images must not be specified for the pod level control, spec.rules[0].podSecurity.exclude[1].restrictedField: Forbidden: restrictedField is required]"
        );
        // Seccomp and Capabilities have a baseline part; restricted may exclude anything.
        let fine = [
            ps("baseline", json!([{"controlName": "Capabilities", "images": ["nginx*"]}, {"controlName": "Seccomp"}])),
            ps("restricted", json!([{"controlName": "Running as Non-root", "images": ["*"]}])),
            ps(
                "baseline",
                json!([{"controlName": "Host Ports", "images": ["*"], "restrictedField": "spec.containers[*].ports[*].hostPort", "values": ["80"]}]),
            ),
        ];
        assert!(pod_security(&fine).is_ok());
    }

    #[test]
    fn labels_and_annotations_in_patterns_are_strings() {
        let msg =
            "labels and annotations supports only string values, \"use double quotes around the non string values\"";
        let pattern = |p: Value| rule(json!({"name": "r", "validate": {"pattern": p}}));
        assert_eq!(text(label_values(&pattern(json!({"metadata": {"labels": {"app": null}}})))), msg);
        assert_eq!(text(label_values(&pattern(json!({"metadata": {"annotations": {"n": 1}}})))), msg);
        assert_eq!(
            text(label_values(&pattern(json!({"spec": {"template": {"metadata": {"labels": {"x": true}}}}})))),
            msg
        );
        let any = rule(
            json!({"name": "r", "validate": {"anyPattern": [{"metadata": {"labels": {"a": "?*"}}}, {"metadata": {"labels": {"a": false}}}]}}),
        );
        assert_eq!(text(label_values(&any)), msg);
        // Strings, anchored keys and other places pass.
        assert!(
            label_values(&pattern(json!({"metadata": {"labels": {"app": "?*"}, "=(annotations)": {"a": 1}}}))).is_ok()
        );
        assert!(label_values(&pattern(json!({"spec": {"containers": [{"name": 1}]}}))).is_ok());
        let patch = rule(json!({"name": "r", "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"n": 5}}}}}));
        assert_eq!(text(label_values(&patch)), msg);
    }
}
