//! The requests Kyverno's ConfigMap tells it to leave alone: `resourceFilters` (`[Kind,
//! Namespace,Name]` entries, wildcards allowed, `Kind` a kind selector such as `ReplicaSet/?*`)
//! and `excludeGroups` / `excludeUsernames` / `excludeRoles` / `excludeClusterRoles`
//! (comma-separated, wildcards allowed, `!name` keeps a user the others would exclude). A
//! filtered request is admitted without evaluating any policy, as Kyverno's webhook filter
//! answers it.
//!
//! Without a ConfigMap, [`RequestFilters::kyverno_defaults`] holds what Kyverno's chart writes
//! into it: events, nodes, API services, token and access reviews, bindings, ReplicaSets (their
//! Deployments are judged instead) and ephemeral reports are not reviewed, nor are requests by
//! the `system:nodes` group (the kubelet's mirror Pods).

use crate::matching::KindSelector;
use std::collections::BTreeMap;
use verno_jmespath::wildcard;

/// Kyverno chart's `config.resourceFilters` (less the entries naming its own ClusterRoles).
pub const KYVERNO_RESOURCE_FILTERS: &str = "[Event,*,*][*/*,kube-system,*][*/*,kube-public,*][*/*,kube-node-lease,*]\
[Node,*,*][Node/?*,*,*][APIService,*,*][APIService/?*,*,*][TokenReview,*,*][SubjectAccessReview,*,*]\
[SelfSubjectAccessReview,*,*][Binding,*,*][Pod/binding,*,*][ReplicaSet,*,*][ReplicaSet/?*,*,*]\
[EphemeralReport,*,*][ClusterEphemeralReport,*,*]";

/// Kyverno chart's `config.excludeGroups`.
pub const KYVERNO_EXCLUDE_GROUPS: &str = "system:nodes";

/// The most entries read from one key (a ConfigMap is user input).
const MAX_ENTRIES: usize = 1000;

#[derive(Debug, Clone)]
struct ResourceFilter {
    kind: KindSelector,
    namespace: String,
    name: String,
}

/// Users named by the exclusion keys (or, with `!`, kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Users {
    usernames: Vec<String>,
    groups: Vec<String>,
    roles: Vec<String>,
    cluster_roles: Vec<String>,
}

impl Users {
    fn is_empty(&self) -> bool {
        self.usernames.is_empty() && self.groups.is_empty() && self.roles.is_empty() && self.cluster_roles.is_empty()
    }

    fn matches(&self, username: &str, groups: &[String], roles: &[String], cluster_roles: &[String]) -> bool {
        let any = |patterns: &[String], candidates: &[String]| {
            patterns.iter().any(|p| candidates.iter().any(|c| wildcard::matches(p, c)))
        };
        self.usernames.iter().any(|p| wildcard::matches(p, username))
            || any(&self.groups, groups)
            || any(&self.roles, roles)
            || any(&self.cluster_roles, cluster_roles)
    }
}

/// What a Kyverno ConfigMap says to leave alone.
#[derive(Debug, Clone, Default)]
pub struct RequestFilters {
    resources: Vec<ResourceFilter>,
    excluded: Users,
    kept: Users,
}

impl RequestFilters {
    /// What Kyverno's chart puts in its ConfigMap.
    pub fn kyverno_defaults() -> RequestFilters {
        let data: BTreeMap<String, String> = [
            ("resourceFilters".to_string(), KYVERNO_RESOURCE_FILTERS.to_string()),
            ("excludeGroups".to_string(), KYVERNO_EXCLUDE_GROUPS.to_string()),
        ]
        .into();
        RequestFilters::from_config_map(&data)
    }

    /// The filters of a Kyverno ConfigMap's `data` (a key that is absent filters nothing).
    pub fn from_config_map(data: &BTreeMap<String, String>) -> RequestFilters {
        let mut f = RequestFilters {
            resources: data.get("resourceFilters").map(|s| parse_resources(s)).unwrap_or_default(),
            ..RequestFilters::default()
        };
        for (key, excluded, kept) in [
            ("excludeUsernames", &mut f.excluded.usernames, &mut f.kept.usernames),
            ("excludeGroups", &mut f.excluded.groups, &mut f.kept.groups),
            ("excludeRoles", &mut f.excluded.roles, &mut f.kept.roles),
            ("excludeClusterRoles", &mut f.excluded.cluster_roles, &mut f.kept.cluster_roles),
        ] {
            for item in data.get(key).map(String::as_str).unwrap_or("").split(',').take(MAX_ENTRIES) {
                let item = item.trim();
                match item.strip_prefix('!').map(str::trim) {
                    Some("") => {}
                    Some(k) => kept.push(k.to_string()),
                    None if item.is_empty() => {}
                    None => excluded.push(item.to_string()),
                }
            }
        }
        f
    }

    /// Whether nothing is filtered.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.excluded.is_empty()
    }

    /// Whether the user exclusions name roles or cluster roles (the caller then works out the
    /// user's, which costs a look through the bindings).
    pub fn reads_roles(&self) -> bool {
        [&self.excluded, &self.kept].iter().any(|u| !u.roles.is_empty() || !u.cluster_roles.is_empty())
    }

    /// Whether a request by this user is left alone (`excludeGroups` and friends, unless a
    /// `!` entry keeps the user).
    pub fn excludes_user(&self, username: &str, groups: &[String], roles: &[String], cluster_roles: &[String]) -> bool {
        !self.excluded.is_empty()
            && !self.kept.matches(username, groups, roles, cluster_roles)
            && self.excluded.matches(username, groups, roles, cluster_roles)
    }

    /// Whether a request about this resource is left alone (`resourceFilters`). A Namespace is
    /// also filtered by an entry naming it as the namespace (`[*,kube-system,*]`).
    pub fn filters_resource(&self, gvk: (&str, &str, &str), subresource: &str, namespace: &str, name: &str) -> bool {
        let (group, version, kind) = gvk;
        self.resources.iter().any(|f| {
            kind_matches(&f.kind, group, version, kind, subresource)
                && ((wildcard::matches(&f.namespace, namespace) && wildcard::matches(&f.name, name))
                    || (group.is_empty()
                        && version == "v1"
                        && kind == "Namespace"
                        && wildcard::matches(&f.namespace, name)))
        })
    }
}

/// A filter's kind selector, its subresource matched as written (`Kind` alone: the resource
/// itself, never a subresource).
fn kind_matches(k: &KindSelector, group: &str, version: &str, kind: &str, subresource: &str) -> bool {
    if !k.names_subresource() && !subresource.is_empty() {
        return false;
    }
    k.matches(group, version, kind, subresource)
}

fn parse_resources(s: &str) -> Vec<ResourceFilter> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = rest.get(open + 1..).unwrap_or("");
        let Some(close) = after.find(']') else { break };
        let inner = after.get(..close).unwrap_or("");
        rest = after.get(close + 1..).unwrap_or("");
        // An entry holding another `[` is not one (Kyverno's pattern takes the innermost).
        let inner = inner.rsplit('[').next().unwrap_or(inner);
        let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
        let (kind, namespace, name) = match parts.as_slice() {
            [k, ns, n] => (*k, *ns, *n),
            [k, ns] => (*k, *ns, ""),
            [k] => (*k, "", ""),
            _ => continue,
        };
        if kind.is_empty() || out.len() >= MAX_ENTRIES {
            continue;
        }
        out.push(ResourceFilter { kind: KindSelector::parse(kind), namespace: namespace.into(), name: name.into() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kyvernos_default_filters() {
        let f = RequestFilters::kyverno_defaults();
        let rs = ("apps", "v1", "ReplicaSet");
        assert!(f.filters_resource(rs, "", "shop", "web-7d9f"));
        assert!(f.filters_resource(rs, "scale", "shop", "web-7d9f"));
        assert!(!f.filters_resource(("apps", "v1", "Deployment"), "", "shop", "web"));
        assert!(f.filters_resource(("", "v1", "Pod"), "", "kube-system", "p"));
        assert!(f.filters_resource(("", "v1", "Pod"), "binding", "shop", "p"));
        assert!(!f.filters_resource(("", "v1", "Pod"), "", "shop", "p"));
        assert!(f.filters_resource(("", "v1", "Namespace"), "", "", "kube-public"));
        assert!(!f.filters_resource(("", "v1", "Namespace"), "", "", "shop"));
        assert!(f.filters_resource(("", "v1", "Event"), "", "shop", "e"));
        assert!(f.filters_resource(("", "v1", "Node"), "status", "", "n"));
        assert!(f.filters_resource(("authentication.k8s.io", "v1", "TokenReview"), "", "", ""));
        let nodes = ["system:nodes".to_string(), "system:authenticated".to_string()];
        assert!(f.excludes_user("system:node:n1", &nodes, &[], &[]));
        assert!(!f.excludes_user("alice", &["devs".to_string()], &[], &[]));
    }

    #[test]
    fn config_map_keys_with_wildcards_and_exceptions() {
        let data: BTreeMap<String, String> = [
            ("resourceFilters".to_string(), "[ConfigMap,team-*,cache-*] [*/status,*,*] [Secret]".to_string()),
            (
                "excludeUsernames".to_string(),
                "system:serviceaccount:ci:*, !system:serviceaccount:ci:deployer".to_string(),
            ),
            ("excludeClusterRoles".to_string(), "break-glass".to_string()),
        ]
        .into();
        let f = RequestFilters::from_config_map(&data);
        assert!(f.filters_resource(("", "v1", "ConfigMap"), "", "team-a", "cache-1"));
        assert!(!f.filters_resource(("", "v1", "ConfigMap"), "", "team-a", "other"));
        assert!(f.filters_resource(("apps", "v1", "Deployment"), "status", "x", "y"));
        // `[Secret]`: namespace and name are empty patterns, matching only the empty values.
        assert!(f.filters_resource(("", "v1", "Secret"), "", "", ""));
        assert!(!f.filters_resource(("", "v1", "Secret"), "", "shop", "s"));
        assert!(f.excludes_user("system:serviceaccount:ci:runner", &[], &[], &[]));
        assert!(!f.excludes_user("system:serviceaccount:ci:deployer", &[], &[], &[]));
        assert!(f.excludes_user("bob", &[], &[], &["break-glass".to_string()]));
        assert!(RequestFilters::from_config_map(&BTreeMap::new()).is_empty());
    }
}
