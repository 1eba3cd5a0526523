//! The permission questions Kyverno's policy validation asks the API server before it admits a
//! ClusterPolicy or Policy (`pkg/policy/generate`, `pkg/policy/mutate`): may the background
//! controller's account create (and, when synchronized, update and delete) what a generate
//! rule makes, and get and update what a mutate-existing rule patches. Pure: the caller
//! asks the cluster (a SubjectAccessReview per verb) and words the answer with [`denial`].

use serde_json::Value;

/// Whose permissions a check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    /// The background controller's service account (generate, mutate-existing).
    Background,
    /// The admission controller's (Verno's own) service account.
    Admission,
}

/// One resource and the verbs an account needs on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCheck {
    /// The rule's index in `spec.rules`, its action (`generate`, `mutate`) and where in it
    /// (`""`, `foreach`, `targets`), as Kyverno's message names them.
    pub rule: usize,
    pub action: &'static str,
    pub path: &'static str,
    pub account: Account,
    pub verbs: Vec<&'static str>,
    /// `apiVersion/Kind` as the rule names it (the apiVersion may be empty).
    pub api_version: String,
    pub kind: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl AccessCheck {
    /// The resource as Kyverno's message names it: `v1/Secret`, with `/subresource`.
    pub fn resource(&self) -> String {
        let mut r = format!("{}/{}", self.api_version, self.kind);
        if !self.subresource.is_empty() {
            r = format!("{r}/{}", self.subresource);
        }
        r
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `Kind` or `Kind/subresource`.
fn split_sub(kind: &str) -> (String, String) {
    match kind.split_once('/') {
        Some((k, s)) => (k.to_string(), s.to_string()),
        None => (kind.to_string(), String::new()),
    }
}

/// The checks of a ClusterPolicy or Policy document, in the order Kyverno makes them (per rule:
/// mutate, then generate — the admission account's before the background's). Kinds written
/// with variables are not checked, as Kyverno skips them.
pub fn access_checks(doc: &Value) -> Vec<AccessCheck> {
    let mut out = Vec::new();
    let rules = doc.pointer("/spec/rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        for target in rule.pointer("/mutate/targets").and_then(Value::as_array).into_iter().flatten() {
            let kind = str_of(target, "kind");
            if kind.contains("{{") {
                continue;
            }
            // `group/version/Kind`, `version/Kind` or `Kind`, with `/subresource`: the kind
            // is the part that starts with a capital letter.
            let parts: Vec<&str> = kind.split('/').collect();
            let at = parts.iter().position(|p| p.starts_with(|c: char| c.is_ascii_uppercase())).unwrap_or(0);
            let (k, sub) = (parts.get(at).copied().unwrap_or(""), parts.get(at + 1..).map(|s| s.join("/")));
            out.push(AccessCheck {
                rule: i,
                action: "mutate",
                path: "targets",
                account: Account::Background,
                verbs: vec!["get", "update"],
                api_version: str_of(target, "apiVersion").to_string(),
                kind: k.to_string(),
                subresource: sub.unwrap_or_default(),
                namespace: str_of(target, "namespace").to_string(),
                name: str_of(target, "name").to_string(),
            });
        }
        let Some(generate) = rule.get("generate").filter(|g| g.is_object()) else { continue };
        let synchronize = generate.get("synchronize").and_then(Value::as_bool).unwrap_or(false);
        let patterns: Vec<(&Value, &'static str)> = match generate.get("foreach").and_then(Value::as_array) {
            Some(list) if !list.is_empty() => list.iter().map(|f| (f, "foreach")).collect(),
            _ => vec![(generate, "")],
        };
        // Kyverno also asks whether its admission controller may list and get what a
        // synchronized rule makes; Verno's admission role is its own (not Kyverno's chart's),
        // so that question would refuse policies Kyverno admits: it is not asked.
        let background = if synchronize { vec!["get", "create", "update", "delete"] } else { vec!["get", "create"] };
        for (account, verbs) in [(Account::Background, background)] {
            for (pattern, path) in &patterns {
                let namespace = str_of(pattern, "namespace").to_string();
                // A cloneList: its first kind (as Kyverno checks it), `version/Kind`.
                let listed = pattern.pointer("/cloneList/kinds").and_then(Value::as_array).and_then(|k| k.first());
                let (api_version, kind) = match listed.and_then(Value::as_str) {
                    Some(gvk) => match gvk.rsplit_once('/') {
                        Some((gv, k)) if !gv.contains('*') => (gv.to_string(), k.to_string()),
                        Some((_, k)) => (String::new(), k.to_string()),
                        None => (String::new(), gvk.to_string()),
                    },
                    None if listed.is_some() => continue,
                    None => (str_of(pattern, "apiVersion").to_string(), str_of(pattern, "kind").to_string()),
                };
                if kind.is_empty() || kind.contains("{{") || api_version.contains("{{") {
                    continue;
                }
                let (kind, subresource) = split_sub(&kind);
                out.push(AccessCheck {
                    rule: i,
                    action: "generate",
                    path,
                    account,
                    verbs: verbs.clone(),
                    api_version: api_version.clone(),
                    kind,
                    subresource,
                    namespace,
                    name: String::new(),
                });
            }
        }
    }
    out
}

/// Kyverno's refusal of a policy from the answers to its checks (`lacking[i]`: the verbs the
/// account of `checks[i]` may not use; `None`: not answered), or `None` when nothing is
/// lacking. The first rule (and account) with something lacking decides; a rule's
/// mutate-existing targets are reported together, a generate rule's first lack alone.
pub fn verdict(
    checks: &[AccessCheck],
    lacking: &[Option<Vec<&'static str>>],
    user: impl Fn(Account) -> String,
) -> Option<String> {
    let mut at = 0;
    while let Some(first) = checks.get(at) {
        let same = |c: &AccessCheck| (c.rule, c.action, c.account) == (first.rule, first.action, first.account);
        let group = checks.get(at..).unwrap_or_default().iter().take_while(|c| same(c)).count();
        let name = user(first.account);
        let mut requirements = Vec::new();
        for (c, failed) in checks.iter().zip(lacking).skip(at).take(group) {
            if let Some(failed) = failed.as_ref().filter(|f| !f.is_empty()) {
                requirements.push(requirement(c, &name, failed));
                if c.action == "generate" {
                    break;
                }
            }
        }
        if !requirements.is_empty() {
            return Some(refusal(first, &name, &requirements));
        }
        at += group;
    }
    None
}

/// What `user` lacks for `check` (`failed`: its verbs the account may not use), in Kyverno's
/// words.
fn requirement(check: &AccessCheck, user: &str, failed: &[&str]) -> String {
    let mut msg = format!("{user} requires permissions {} for resource {}", failed.join(","), check.resource());
    if !check.namespace.is_empty() {
        msg = format!("{msg} in namespace {}", check.namespace);
    }
    msg
}

/// An [`AccessReview`]'s answer about one check, to await.
pub type Answer<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<&'static str>, String>> + Send + 'a>>;

/// The cluster's answer to Kyverno's policy-admission permission checks
/// (this module's checks): may an account use a verb on a resource (a
/// SubjectAccessReview).
pub trait AccessReview: Send + Sync {
    /// The account's user name as Kyverno's messages write it
    /// (`system:serviceaccount:NAMESPACE:NAME`).
    fn user(&self, account: Account) -> String;
    /// The verbs of `check` its account may not use (empty: all granted); `Err`: the question
    /// could not be answered (the check refuses nothing).
    fn lacking<'a>(&'a self, check: &'a AccessCheck) -> Answer<'a>;
    /// Whether the kind (`apiVersion` may be empty: any version) is cluster-wide, as the
    /// cluster's discovery says; `Err`: not known (the question refuses nothing).
    fn cluster_scoped<'a>(&'a self, api_version: &'a str, kind: &'a str) -> ScopeAnswer<'a> {
        let _ = (api_version, kind);
        Box::pin(async { Err("the cluster's discovery is not available".to_string()) })
    }
}

/// The answer to [`AccessReview::cluster_scoped`].
pub type ScopeAnswer<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, String>> + Send + 'a>>;

/// Kyverno's refusal of a policy for the [`requirement`]s of one rule's `check`s (a rule's
/// mutate-existing targets are all checked and reported together; a generate rule stops at its
/// first).
fn refusal(check: &AccessCheck, user: &str, requirements: &[String]) -> String {
    match check.action {
        "mutate" => format!(
            "path: spec.rules[{}].mutate.{}.: auth check fails, additional privileges are required for the service account '{user}': {}",
            check.rule,
            check.path,
            requirements.join("; ")
        ),
        _ => format!("path: spec.rules[{}].{}.{}.: {}", check.rule, check.action, check.path, requirements.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generate_and_mutate_existing_rules_ask_what_kyverno_asks() {
        let doc = json!({"spec": {"rules": [
            {"name": "clone", "generate": {"apiVersion": "v1", "kind": "Secret", "namespace": "{{request.object.metadata.name}}",
                "synchronize": true, "clone": {"namespace": "default", "name": "s"}}},
            {"name": "label", "mutate": {"targets": [{"apiVersion": "v1", "kind": "Namespace", "name": "prod"},
                {"apiVersion": "v1", "kind": "{{kind}}"}]}},
            {"name": "list", "generate": {"namespace": "n", "cloneList": {"kinds": ["v1/ConfigMap", "v1/Secret"], "namespace": "default"}}}]}});
        let checks = access_checks(&doc);
        let summary: Vec<(usize, Account, Vec<&str>, String)> =
            checks.iter().map(|c| (c.rule, c.account, c.verbs.clone(), c.resource())).collect();
        assert_eq!(
            summary,
            vec![
                (0, Account::Background, vec!["get", "create", "update", "delete"], "v1/Secret".to_string()),
                (1, Account::Background, vec!["get", "update"], "v1/Namespace".to_string()),
                (2, Account::Background, vec!["get", "create"], "v1/ConfigMap".to_string()),
            ]
        );
        let user = "system:serviceaccount:kyverno:kyverno-background-controller";
        let one = |c: &AccessCheck, failed: &[&str]| refusal(c, user, &[requirement(c, user, failed)]);
        assert_eq!(
            one(&checks[0], &["create", "update"]),
            "path: spec.rules[0].generate..: system:serviceaccount:kyverno:kyverno-background-controller requires permissions create,update for resource v1/Secret in namespace {{request.object.metadata.name}}"
        );
        assert_eq!(
            one(&checks[1], &["update"]),
            "path: spec.rules[1].mutate.targets.: auth check fails, additional privileges are required for the service account 'system:serviceaccount:kyverno:kyverno-background-controller': system:serviceaccount:kyverno:kyverno-background-controller requires permissions update for resource v1/Namespace"
        );
    }
}
