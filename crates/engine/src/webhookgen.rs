//! Kyverno's layout of the two resource webhook configurations, worked out from a policy set.
//!
//! With Kyverno's names (`kyvernoNames`), Verno writes the configurations' entries the way
//! Kyverno's webhook controller does, so that what a Kyverno user's tests, runbooks and
//! dashboards read there is what Kyverno would have written:
//! - ClusterPolicies and Policies share two entries per configuration, `…-fail` and
//!   `…-ignore` by failure policy; a policy with `webhookConfiguration.matchConditions` gets
//!   its own (`…-fail-finegrained-<name>`, path `…/fail/finegrained/<name>`) carrying them.
//!   Rules come from each rule's kinds and operations (validate, generate, mutate-existing and
//!   image checks on the validating side with every operation by default; mutate and image
//!   verification on the mutating side with CREATE and UPDATE), less what an `exclude.any`
//!   entry naming only kinds and operations removes; generated kinds add CREATE, UPDATE and
//!   DELETE. They are grouped by group, version and scope, a rule covered by a wider one is
//!   dropped, `pods` brings `pods/ephemeralcontainers`, and every list is sorted.
//! - Each CEL kind has its entries on its own path (`/vpol/<names>`, `/ivpol/validate/…`): one
//!   per failure policy for the policies without their own needs, and one per policy with
//!   matchConditions, an `Exact` match policy or a timeout (`…-fail-finegrained-<name>`), its
//!   conditions rewritten for the Pod controllers autogen adds.
//! - Only entries with rules exist; the entries are sorted by name.
//!
//! Pure: the controller renders the entries' client configuration and writes them.

use crate::{CompiledPolicy, Kind, KindSelector};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// Built-in kinds: kind, group, version, plural, namespaced. A kind not listed resolves to
/// the group and version its selector names (`*` when it names none) with the usual plural,
/// scope unknown (`*`): Kyverno asks discovery, which Verno's plan does not.
pub const KINDS: &[(&str, &str, &str, &str, bool)] = &[
    ("Pod", "", "v1", "pods", true),
    ("Service", "", "v1", "services", true),
    ("ConfigMap", "", "v1", "configmaps", true),
    ("Secret", "", "v1", "secrets", true),
    ("Namespace", "", "v1", "namespaces", false),
    ("Node", "", "v1", "nodes", false),
    ("ServiceAccount", "", "v1", "serviceaccounts", true),
    ("PersistentVolume", "", "v1", "persistentvolumes", false),
    ("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", true),
    ("ReplicationController", "", "v1", "replicationcontrollers", true),
    ("Endpoints", "", "v1", "endpoints", true),
    ("LimitRange", "", "v1", "limitranges", true),
    ("ResourceQuota", "", "v1", "resourcequotas", true),
    ("Event", "", "v1", "events", true),
    ("Deployment", "apps", "v1", "deployments", true),
    ("StatefulSet", "apps", "v1", "statefulsets", true),
    ("DaemonSet", "apps", "v1", "daemonsets", true),
    ("ReplicaSet", "apps", "v1", "replicasets", true),
    ("Job", "batch", "v1", "jobs", true),
    ("CronJob", "batch", "v1", "cronjobs", true),
    ("Ingress", "networking.k8s.io", "v1", "ingresses", true),
    ("IngressClass", "networking.k8s.io", "v1", "ingressclasses", false),
    ("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies", true),
    ("Role", "rbac.authorization.k8s.io", "v1", "roles", true),
    ("ClusterRole", "rbac.authorization.k8s.io", "v1", "clusterroles", false),
    ("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings", true),
    ("ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", "clusterrolebindings", false),
    ("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", true),
    ("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers", true),
    ("StorageClass", "storage.k8s.io", "v1", "storageclasses", false),
    ("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", false),
    ("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions", false),
    ("Lease", "coordination.k8s.io", "v1", "leases", true),
];

/// The subresources of a built-in resource, as discovery lists them.
fn subresources(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &[
            "attach",
            "binding",
            "ephemeralcontainers",
            "eviction",
            "exec",
            "log",
            "portforward",
            "proxy",
            "resize",
            "status",
        ],
        "deployments" | "statefulsets" | "replicasets" | "replicationcontrollers" => &["scale", "status"],
        "services" => &["proxy", "status"],
        "nodes" => &["proxy", "status"],
        "serviceaccounts" => &["token"],
        "namespaces" => &["finalize", "status"],
        _ => &["status"],
    }
}

/// What the configuration says besides the policies.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Kyverno's `config.webhooks.namespaceSelector` (with its namespace's exclusion added).
    pub namespace_selector: Option<Value>,
    /// Kyverno's `config.webhooks.objectSelector`.
    pub object_selector: Option<Value>,
    /// Kyverno's `config.matchConditions`.
    pub match_conditions: Vec<Value>,
    /// The default timeout (Kyverno's `--webhookTimeout`).
    pub timeout: i64,
    /// Admission reports on: validating entries have `NoneOnDryRun` side effects, else `None`.
    pub admission_reports: bool,
    /// Kyverno's `--forceFailurePolicyIgnore`: every entry is fail-open.
    pub force_ignore: bool,
}

/// One webhook entry, less its client configuration's base (Service or URL).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    /// The path on Verno's server.
    pub path: String,
    pub ignore: bool,
    pub rules: Vec<Value>,
    pub namespace_selector: Value,
    pub object_selector: Value,
    pub match_conditions: Vec<Value>,
    pub timeout: i64,
    /// `Exact` instead of `Equivalent`.
    pub exact: bool,
    /// Mutating entries only: `IfNeeded` or `Never`.
    pub reinvocation: Option<&'static str>,
    pub side_effects: &'static str,
}

impl Entry {
    /// The entry as the API server stores it, given its client configuration.
    pub fn render(&self, client_config: Value) -> Value {
        let mut e = json!({
            "name": self.name,
            "clientConfig": client_config,
            "rules": self.rules,
            "failurePolicy": if self.ignore { "Ignore" } else { "Fail" },
            "matchPolicy": if self.exact { "Exact" } else { "Equivalent" },
            "namespaceSelector": self.namespace_selector,
            "objectSelector": self.object_selector,
            "sideEffects": self.side_effects,
            "timeoutSeconds": self.timeout,
            "admissionReviewVersions": ["v1"],
        });
        if let Some(m) = e.as_object_mut() {
            if !self.match_conditions.is_empty() {
                m.insert("matchConditions".into(), Value::Array(self.match_conditions.clone()));
            }
            if let Some(r) = self.reinvocation {
                m.insert("reinvocationPolicy".into(), json!(r));
            }
        }
        e
    }
}

/// Both configurations' entries, each list sorted by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    pub validating: Vec<Entry>,
    pub mutating: Vec<Entry>,
}

const OPS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];
const ALL: u8 = 0b1111;
const CREATE_UPDATE: u8 = 0b0011;
const CREATE_UPDATE_DELETE: u8 = 0b0111;

fn ops_mask(list: Option<&Value>) -> u8 {
    let mut m = 0;
    for o in list.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if o == "*" {
            m = ALL;
        } else if let Some(i) = OPS.iter().position(|x| *x == o) {
            m |= 1 << i;
        }
    }
    m
}

fn ops_of(mask: u8) -> Vec<&'static str> {
    OPS.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, o)| *o).collect()
}

/// One (group, version, resource, subresource, scope) with its operations.
type Gvrs = (String, String, String, String, &'static str);

/// Kyverno's webhook object for the ClusterPolicy kinds: rules by resource, timeout, conditions.
struct Hook {
    ignore: bool,
    /// `Some(key)` for a policy's own entry.
    fine: Option<String>,
    timeout: i64,
    rules: BTreeMap<Gvrs, u8>,
    conditions: Vec<Value>,
}

impl Hook {
    fn new(ignore: bool, settings: &Settings) -> Hook {
        Hook {
            ignore,
            fine: None,
            timeout: settings.timeout,
            rules: BTreeMap::new(),
            conditions: settings.match_conditions.clone(),
        }
    }

    /// Whether `op` on `r` is already covered by a wider entry (Kyverno's `hasRule`).
    fn covered(&self, r: &Gvrs, op: u8) -> bool {
        let (g, v, res, sub, scope) = r;
        let scopes: &[&str] = if *scope == "*" { &["*"] } else { &[scope, "*"] };
        let groups: Vec<&str> = if g == "*" { vec!["*"] } else { vec![g, "*"] };
        let versions: Vec<&str> = if v == "*" { vec!["*"] } else { vec![v, "*"] };
        let resources: Vec<(&str, &str)> = match (res.as_str(), sub.as_str()) {
            ("*", "") => vec![("*", ""), ("*", "*")],
            (r, "") => vec![(r, ""), ("*", ""), ("*", "*")],
            ("*", "*") => vec![("*", "*")],
            (r, "*") => vec![(r, "*"), ("*", "*")],
            ("*", s) => vec![("*", s), ("*", "*")],
            (r, s) => vec![(r, s), (r, "*"), ("*", s), ("*", "*")],
        };
        for s in scopes {
            for gg in &groups {
                for vv in &versions {
                    for (rr, ss) in &resources {
                        if (*s, *gg, *vv, *rr, *ss) == (*scope, g.as_str(), v.as_str(), res.as_str(), sub.as_str()) {
                            continue;
                        }
                        let key = (gg.to_string(), vv.to_string(), rr.to_string(), ss.to_string(), *s);
                        let key_scope: &'static str = if *s == "*" { "*" } else { "Namespaced" };
                        let key = (key.0, key.1, key.2, key.3, key_scope);
                        if self.rules.get(&key).is_some_and(|m| m & op != 0) {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Kyverno's `buildRulesWithOperations`: grouped by group, version and scope, then by the
    /// operations each resource has.
    fn build_rules(&self) -> Vec<Value> {
        let mut by_gvs: BTreeMap<(String, String, &'static str), BTreeMap<String, u8>> = BTreeMap::new();
        for (r, mask) in &self.rules {
            for i in 0..4u8 {
                let op = 1 << i;
                if mask & op == 0 || self.covered(r, op) {
                    continue;
                }
                let resource = if r.3.is_empty() { r.2.clone() } else { format!("{}/{}", r.2, r.3) };
                *by_gvs.entry((r.0.clone(), r.1.clone(), r.4)).or_default().entry(resource).or_default() |= op;
            }
        }
        let mut out = Vec::new();
        for ((g, v, scope), resources) in by_gvs {
            let mut by_ops: BTreeMap<u8, BTreeSet<String>> = BTreeMap::new();
            for (res, mask) in resources {
                by_ops.entry(mask).or_default().insert(res);
            }
            for (mask, mut res) in by_ops {
                if (g.is_empty() || g == "*") && (v == "v1" || v == "*") && (res.contains("pods") || res.contains("*"))
                {
                    res.insert("pods/ephemeralcontainers".into());
                }
                out.push(json!({"apiGroups": [g], "apiVersions": [v], "operations": ops_of(mask),
                    "resources": res.into_iter().collect::<Vec<_>>(), "scope": scope}));
            }
        }
        sorted_rules(out)
    }
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    let mut out: Vec<String> = v
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// Kyverno's `sortedRules` after `deDuplicatedRules`: each rule's lists sorted, rules ordered
/// by groups, versions, resources, operations (a shorter list first), then scope.
fn sorted_rules(rules: Vec<Value>) -> Vec<Value> {
    let mut keyed: Vec<(Vec<Vec<String>>, String, Value)> = rules
        .into_iter()
        .map(|r| {
            let [groups, versions, resources, operations] =
                ["apiGroups", "apiVersions", "resources", "operations"].map(|k| strings(&r, k));
            let scope = r.get("scope").and_then(Value::as_str).unwrap_or("*").to_string();
            let rule = json!({"apiGroups": groups, "apiVersions": versions, "operations": operations,
                "resources": resources, "scope": scope});
            (vec![groups, versions, resources, operations], scope, rule)
        })
        .collect();
    keyed.sort_by(|a, b| {
        for (x, y) in a.0.iter().zip(&b.0) {
            let o = x.len().cmp(&y.len()).then_with(|| x.cmp(y));
            if o.is_ne() {
                return o;
            }
        }
        a.1.cmp(&b.1)
    });
    keyed.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    keyed.into_iter().map(|(_, _, r)| r).collect()
}

/// Where a kind selector's kind is served: (group, version, resource, subresource, namespaced).
fn find_resources(selector: &str) -> Vec<(String, String, String, String, Option<bool>)> {
    let ks = KindSelector::parse(selector);
    let (g, v, kind, sub) = ks.parts();
    if let Some((_, kg, kv, plural, namespaced)) =
        KINDS.iter().find(|(k, g2, v2, ..)| *k == kind && (g == "*" || g == *g2) && (v == "*" || v == *v2))
    {
        let base =
            |s: &str| ((*kg).to_string(), (*kv).to_string(), (*plural).to_string(), s.to_string(), Some(*namespaced));
        return match sub {
            "" => vec![base("")],
            "*" => subresources(plural).iter().map(|s| base(s)).collect(),
            s if subresources(plural).contains(&s) => vec![base(s)],
            _ => Vec::new(),
        };
    }
    if KINDS.iter().any(|(k, ..)| *k == kind) {
        // A built-in kind named in a group or version it is not served in.
        return Vec::new();
    }
    vec![(g.to_string(), v.to_string(), crate::plural(kind), sub.to_string(), None)]
}

/// Kind selector → operations of one rule's match (Kyverno's `collectResourceDescriptions`).
fn collect(rule: &Value, default_ops: u8) -> BTreeMap<String, u8> {
    let mut out: BTreeMap<String, u8> = BTreeMap::new();
    let mut add = |desc: &Value| {
        let ops = match ops_mask(desc.get("operations")) {
            0 => default_ops,
            m => m,
        };
        for k in desc.get("kinds").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            *out.entry(k.to_string()).or_default() |= ops;
        }
    };
    if let Some(d) = rule.pointer("/match/resources") {
        add(d);
    }
    for block in ["all", "any"] {
        for f in rule.pointer(&format!("/match/{block}")).and_then(Value::as_array).into_iter().flatten() {
            if let Some(d) = f.get("resources") {
                add(d);
            }
        }
    }
    // Only `exclude.any` entries that name nothing but kinds and operations narrow the webhook.
    for f in rule.pointer("/exclude/any").and_then(Value::as_array).into_iter().flatten() {
        let user = ["subjects", "roles", "clusterRoles"]
            .iter()
            .any(|k| f.get(*k).and_then(Value::as_array).is_some_and(|a| !a.is_empty()));
        let d = f.get("resources").cloned().unwrap_or(Value::Null);
        let narrows = |k: &str| match d.get(k) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => k == "selector" || k == "namespaceSelector" || !o.is_empty(),
            Some(_) => true,
        };
        if user
            || ["name", "names", "namespaces", "annotations", "selector", "namespaceSelector"]
                .iter()
                .any(|k| narrows(k))
        {
            continue;
        }
        let kinds: Vec<String> = match d.get("kinds").and_then(Value::as_array) {
            Some(k) if !k.is_empty() => k.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            _ => out.keys().cloned().collect(),
        };
        let ops = match ops_mask(d.get("operations")) {
            0 => ALL,
            m => m,
        };
        for k in kinds {
            if let Some(m) = out.get_mut(&k) {
                *m &= !ops;
            }
        }
    }
    out
}

/// The kinds a generate rule writes.
fn generated_kinds(generate: &Value) -> Vec<String> {
    let one = |g: &Value| -> Vec<String> {
        match g.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty()) {
            Some(k) => vec![k.to_string()],
            None => strings(g.get("cloneList").unwrap_or(&Value::Null), "kinds"),
        }
    };
    let mut out: Vec<String> =
        generate.get("foreach").and_then(Value::as_array).into_iter().flatten().flat_map(one).collect();
    out.extend(one(generate));
    out
}

struct RuleKinds {
    generate: bool,
    validate: bool,
    mutate_existing: bool,
    mutate_standard: bool,
    verify_images: bool,
    verify_image_checks: bool,
    verify_manifests: bool,
}

fn rule_kinds(r: &Value) -> RuleKinds {
    let mutate = r.get("mutate").filter(|m| m.is_object());
    let existing = mutate.is_some_and(|m| m.get("targets").and_then(Value::as_array).is_some_and(|t| !t.is_empty()));
    let images: Vec<&Value> = r.get("verifyImages").and_then(Value::as_array).into_iter().flatten().collect();
    RuleKinds {
        generate: r.get("generate").is_some_and(Value::is_object),
        validate: r.get("validate").is_some_and(Value::is_object),
        mutate_existing: existing,
        mutate_standard: mutate.is_some() && !existing,
        verify_images: !images.is_empty(),
        verify_image_checks: images.iter().any(|i| {
            i.get("verifyDigest").and_then(Value::as_bool).unwrap_or(true)
                || i.get("required").and_then(Value::as_bool).unwrap_or(true)
        }),
        verify_manifests: r.pointer("/validate/manifests").is_some_and(Value::is_object),
    }
}

/// A ClusterPolicy's or Policy's rules as Kyverno's webhook controller reads them: its own
/// and those autogen adds.
fn cpol_rules(p: &CompiledPolicy) -> Vec<Value> {
    let own = p.document.pointer("/spec/rules").and_then(Value::as_array).cloned().unwrap_or_default();
    own.into_iter()
        .filter(|r| !r.get("name").and_then(Value::as_str).is_some_and(|n| n.starts_with("autogen-")))
        .chain(p.autogen_rules().iter().filter_map(|r| serde_json::to_value(r).ok()))
        .collect()
}

/// Kyverno's `mergeWebhook`: the policy's kinds into `dst`.
fn merge(dst: &mut Hook, p: &CompiledPolicy, rules: &[Value], validating: bool) {
    let mut matched: BTreeMap<String, u8> = BTreeMap::new();
    let mut union = |m: BTreeMap<String, u8>| {
        for (k, ops) in m {
            *matched.entry(k).or_default() |= ops;
        }
    };
    for r in rules {
        let k = rule_kinds(r);
        if k.generate {
            union(collect(r, ALL));
            let kinds = r.get("generate").map(generated_kinds).unwrap_or_default();
            union(kinds.into_iter().map(|k| (k, CREATE_UPDATE_DELETE)).collect());
        } else if (validating && k.validate)
            || k.verify_image_checks
            || (validating && k.mutate_existing)
            || (!validating && (k.mutate_standard || k.verify_images || k.verify_manifests))
        {
            union(collect(r, if validating { ALL } else { CREATE_UPDATE }));
        }
    }
    let policy_scope: &'static str = if p.kind == Kind::Policy { "Namespaced" } else { "*" };
    for (selector, ops) in matched {
        if ops == 0 {
            continue;
        }
        let ks = KindSelector::parse(&selector);
        let (g, v, kind, sub) = ks.parts();
        let found: Vec<Gvrs> = if kind == "*" {
            vec![(g.to_string(), v.to_string(), "*".to_string(), sub.to_string(), policy_scope)]
        } else {
            find_resources(&selector)
                .into_iter()
                .map(|(g, v, r, s, ns)| (g, v, r, s, if ns == Some(true) { "Namespaced" } else { "*" }))
                .collect()
        };
        for gvrs in found {
            *dst.rules.entry(gvrs).or_default() |= ops;
        }
    }
    if let Some(t) = p.document.pointer("/spec/webhookTimeoutSeconds").and_then(Value::as_i64) {
        dst.timeout = dst.timeout.max(t);
    }
}

/// The ClusterPolicy kinds' entries of one configuration.
fn cpol_entries(policies: &[&CompiledPolicy], s: &Settings, validating: bool) -> Vec<Entry> {
    let mut ignore = Hook::new(true, s);
    let mut fail = Hook::new(false, s);
    let mut fine = Vec::new();
    for p in policies.iter().filter(|p| matches!(p.kind, Kind::ClusterPolicy | Kind::Policy) && p.admission) {
        let rules = cpol_rules(p);
        let kinds: Vec<RuleKinds> = rules.iter().map(rule_kinds).collect();
        let wanted = if validating {
            kinds
                .iter()
                .any(|k| k.validate || k.generate || k.mutate_existing || k.verify_image_checks || k.verify_manifests)
        } else {
            kinds.iter().any(|k| k.mutate_standard || k.verify_images)
        };
        if !wanted {
            continue;
        }
        let ig = s.force_ignore || p.failure_policy_ignore;
        let conditions = p
            .document
            .pointer("/spec/webhookConfiguration/matchConditions")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty());
        match conditions {
            Some(c) => {
                let mut h = Hook::new(ig, s);
                h.fine = Some(p.key());
                h.conditions = c.clone();
                merge(&mut h, p, &rules, validating);
                fine.push(h);
            }
            None => merge(if ig { &mut ignore } else { &mut fail }, p, &rules, validating),
        }
    }
    let (base_name, base_path) =
        if validating { ("validate.kyverno.svc", "/validate") } else { ("mutate.kyverno.svc", "/mutate") };
    let side_effects = if validating && !s.admission_reports { "None" } else { "NoneOnDryRun" };
    [ignore, fail]
        .into_iter()
        .chain(fine)
        .filter(|h| !h.rules.is_empty())
        .filter_map(|h| {
            let rules = h.build_rules();
            if rules.is_empty() {
                return None;
            }
            let fp = if h.ignore { "ignore" } else { "fail" };
            let (name, path) = match &h.fine {
                Some(key) => (
                    format!("{base_name}-{fp}-finegrained-{}", key.replace('/', "-")),
                    format!("{base_path}/{fp}/finegrained/{key}"),
                ),
                None => (format!("{base_name}-{fp}"), format!("{base_path}/{fp}")),
            };
            Some(Entry {
                name,
                path,
                ignore: h.ignore,
                rules,
                namespace_selector: s.namespace_selector.clone().unwrap_or_else(|| json!({})),
                object_selector: s.object_selector.clone().unwrap_or_else(|| json!({})),
                match_conditions: h.conditions,
                timeout: h.timeout.min(30),
                exact: false,
                reinvocation: (!validating).then_some("IfNeeded"),
                side_effects,
            })
        })
        .collect()
}

/// Kyverno's `mergeLabelSelectors`: labels of both, `a`'s expressions then `b`'s.
fn merge_selectors(a: Option<&Value>, b: Option<&Value>) -> Option<Value> {
    match (a.filter(|v| v.is_object()), b.filter(|v| v.is_object())) {
        (None, b) => b.cloned(),
        (a, None) => a.cloned(),
        (Some(a), Some(b)) => {
            let mut labels = serde_json::Map::new();
            let mut exprs = Vec::new();
            for s in [a, b] {
                if let Some(m) = s.get("matchLabels").and_then(Value::as_object) {
                    labels.extend(m.clone());
                }
                exprs.extend(s.get("matchExpressions").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            let mut out = serde_json::Map::new();
            if !labels.is_empty() {
                out.insert("matchLabels".into(), Value::Object(labels));
            }
            if !exprs.is_empty() {
                out.insert("matchExpressions".into(), Value::Array(exprs));
            }
            Some(Value::Object(out))
        }
    }
}

/// A policy's matchConditions if the API server can compile every one of them, else none
/// (Kyverno's `validConditions`: then the policy shares the common entry and Verno evaluates
/// its conditions alone). A condition the API server cannot compile would make it refuse the
/// whole configuration, or fail every call with an error: under Fail, a denial.
fn valid_conditions(list: Option<&Value>) -> Vec<Value> {
    let list = list.and_then(Value::as_array).cloned().unwrap_or_default();
    let valid =
        list.iter().all(|c| c.get("expression").and_then(Value::as_str).is_some_and(verno_cel::api_server_condition));
    if valid { list } else { Vec::new() }
}

/// A match condition the API server can evaluate for a webhook: not one reading
/// `namespaceObject`, which it never binds there (Kyverno's `webhookMatchConditions`).
fn offloadable(c: &Value) -> bool {
    let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
    !expr.match_indices("namespaceObject").any(|(i, m)| {
        let before = expr[..i].chars().next_back();
        let after = expr[i + m.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after) && before != Some('.')
    })
}

/// Kyverno's `CreateMatchConditions`: each condition applies only to the targets' kinds.
fn autogen_conditions(config: &str, targets: &[(String, String)], conditions: &[Value]) -> Vec<Value> {
    if targets.is_empty() {
        return Vec::new();
    }
    let pre: BTreeSet<String> = targets
        .iter()
        .map(|(api_version, kind)| format!("(object.apiVersion == '{api_version}' && object.kind =='{kind}')"))
        .collect();
    let pre = pre.into_iter().collect::<Vec<_>>().join(" || ");
    let prefix = if config.is_empty() { "autogen".to_string() } else { format!("autogen-{config}") };
    conditions
        .iter()
        .map(|c| {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
            json!({"name": format!("{prefix}-{name}"), "expression": format!("!({pre}) || ({expr})")})
        })
        .collect()
}

/// A CEL policy's resource rules as webhook rules (names dropped, scope defaulted).
fn resource_rules(spec: &Value, all_ops: bool) -> Vec<Value> {
    spec.pointer("/matchConstraints/resourceRules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let ops = if all_ops { json!(OPS) } else { r.get("operations").cloned().unwrap_or(json!([])) };
            json!({"apiGroups": r.get("apiGroups").cloned().unwrap_or(json!([])),
                "apiVersions": r.get("apiVersions").cloned().unwrap_or(json!([])),
                "operations": ops,
                "resources": r.get("resources").cloned().unwrap_or(json!([])),
                "scope": r.get("scope").cloned().unwrap_or(json!("*"))})
        })
        .collect()
}

/// One autogen config: its name, its targets (apiVersion, kind), its rewritten spec.
type AutogenConfig = (String, Vec<(String, String)>, Value);

/// The policies sharing an entry: its namespace and object selectors, the policies.
type SelectorGroup<'a> = (Option<Value>, Option<Value>, Vec<&'a CompiledPolicy>);

/// The autogen configs of a CEL policy, as Kyverno computes them: name, targets (apiVersion,
/// kind) and the rewritten spec.
fn autogen_configs(p: &CompiledPolicy) -> Vec<AutogenConfig> {
    let spec = p.document.get("spec").cloned().unwrap_or(Value::Null);
    // Only what autogen reads, so that every CEL kind decodes as a ValidatingPolicy.
    let mut lean = serde_json::Map::new();
    for k in ["matchConstraints", "matchConditions", "autogen"] {
        if let Some(v) = spec.get(k) {
            lean.insert(k.into(), v.clone());
        }
    }
    let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy",
        "metadata": {"name": p.name}, "spec": lean});
    let status = crate::vpol::autogen_status(&doc);
    status
        .get("configs")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, c)| {
            let targets = c
                .get("targets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|t| {
                    let g = t.get("group").and_then(Value::as_str).unwrap_or("");
                    let v = t.get("version").and_then(Value::as_str).unwrap_or("v1");
                    let api_version = if g.is_empty() { v.to_string() } else { format!("{g}/{v}") };
                    (api_version, t.get("kind").and_then(Value::as_str).unwrap_or("").to_string())
                })
                .collect();
            (name.clone(), targets, c.get("spec").cloned().unwrap_or(Value::Null))
        })
        .collect()
}

/// A fine-grained entry's match conditions: the policy's own that the API server can evaluate
/// (a synchronized GeneratingPolicy's only on CREATE), and autogen's for its controllers.
fn fine_conditions(p: &CompiledPolicy, generating: bool, autogen: bool) -> Vec<Value> {
    let spec = p.document.get("spec").cloned().unwrap_or(Value::Null);
    let own: Vec<Value> = valid_conditions(spec.get("matchConditions")).into_iter().filter(offloadable).collect();
    let own = if generating && spec.pointer("/evaluation/synchronize/enabled").and_then(Value::as_bool).unwrap_or(false)
    {
        own.into_iter()
            .map(|c| {
                let e = c.get("expression").and_then(Value::as_str).unwrap_or("");
                json!({"name": c.get("name").cloned().unwrap_or(json!("")),
                    "expression": format!("request.operation != 'CREATE' || ({e})")})
            })
            .collect()
    } else {
        own
    };
    let configs = if autogen { autogen_configs(p) } else { Vec::new() };
    let mut mc = if configs.is_empty() { own } else { autogen_conditions("", &[("v1".into(), "Pod".into())], &own) };
    for (config, targets, aspec) in &configs {
        let c: Vec<Value> = valid_conditions(aspec.get("matchConditions")).into_iter().filter(offloadable).collect();
        mc.extend(autogen_conditions(config, targets, &c));
    }
    mc
}

/// The entries of one CEL kind (Kyverno's `buildWebhookRules`).
fn cel_entries(
    policies: &[&CompiledPolicy],
    kind: Kind,
    name: &str,
    path: &str,
    s: &Settings,
    mutating: bool,
) -> Vec<Entry> {
    let generating = matches!(kind, Kind::GeneratingPolicy | Kind::NamespacedGeneratingPolicy);
    let mine: Vec<&CompiledPolicy> = policies.iter().copied().filter(|p| p.kind == kind && p.admission).collect();
    let spec = |p: &CompiledPolicy| p.document.get("spec").cloned().unwrap_or(Value::Null);
    let conditions = |p: &CompiledPolicy| -> Vec<Value> { valid_conditions(spec(p).get("matchConditions")) };
    let exact =
        |p: &CompiledPolicy| spec(p).pointer("/matchConstraints/matchPolicy").and_then(Value::as_str) == Some("Exact");
    let timeout = |p: &CompiledPolicy| {
        spec(p).get("webhookConfiguration").and_then(|w| w.get("timeoutSeconds")).and_then(Value::as_i64)
    };
    // A GeneratingPolicy's entries are always fail-open (it has no failure policy of its own).
    let ignore = |p: &CompiledPolicy| s.force_ignore || p.failure_policy_ignore || generating;
    let namespace_selector = |p: &CompiledPolicy| -> Option<Value> {
        match &p.namespace {
            Some(ns) if kind.is_namespaced() => merge_selectors(
                Some(
                    &json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]}),
                ),
                s.namespace_selector.as_ref(),
            ),
            _ => merge_selectors(spec(p).pointer("/matchConstraints/namespaceSelector"), s.namespace_selector.as_ref()),
        }
    };
    let object_selector = |p: &CompiledPolicy| {
        merge_selectors(spec(p).pointer("/matchConstraints/objectSelector"), s.object_selector.as_ref())
    };
    // Which paths add autogen's rules, as Kyverno's: not a GeneratingPolicy's, not a
    // NamespacedValidatingPolicy's shared entry, not a NamespacedImageValidatingPolicy's own.
    let autogen_basic = !generating && kind != Kind::NamespacedValidatingPolicy;
    let autogen_fine = !generating && kind != Kind::NamespacedImageValidatingPolicy;
    // Every rule of a policy: its own and those autogen adds.
    let rules_of = |p: &CompiledPolicy, autogen: bool| -> Vec<Value> {
        let mut r = resource_rules(&spec(p), generating);
        if autogen {
            for (_, _, aspec) in autogen_configs(p) {
                r.extend(resource_rules(&aspec, false));
            }
        }
        r
    };
    let entry = |name: String, path: String, ig: bool, rules: Vec<Value>, ns: Option<Value>, os: Option<Value>| Entry {
        name,
        path,
        ignore: ig,
        rules: sorted_rules(rules),
        namespace_selector: ns.unwrap_or_else(|| json!({})),
        object_selector: os.unwrap_or_else(|| json!({})),
        match_conditions: Vec::new(),
        timeout: s.timeout,
        exact: false,
        reinvocation: mutating.then_some("Never"),
        side_effects: "NoneOnDryRun",
    };
    let (mut fine, basic): (Vec<&CompiledPolicy>, Vec<&CompiledPolicy>) =
        mine.into_iter().partition(|p| !conditions(p).is_empty() || exact(p) || timeout(p).is_some());
    fine.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut fails = Vec::new();
    let mut ignores = Vec::new();
    for p in fine {
        let mc = fine_conditions(p, generating, autogen_fine);
        let ig = ignore(p);
        let suffix = match (&p.namespace, kind.is_namespaced()) {
            (Some(ns), true) => format!("{ns}-{}", p.name),
            _ => p.name.clone(),
        };
        let mut e = entry(
            format!("{name}-{}-finegrained-{suffix}", if ig { "ignore" } else { "fail" }),
            format!("{path}/{}", p.name),
            ig,
            rules_of(p, autogen_fine),
            namespace_selector(p),
            object_selector(p),
        );
        e.match_conditions = mc;
        // Kyverno copies the CEL kinds' mutating entries without their match policy.
        e.exact = exact(p) && !mutating;
        if let Some(t) = timeout(p) {
            e.timeout = t;
        }
        if ig { ignores.push(e) } else { fails.push(e) }
    }
    // The other policies share entries, one per selectors they resolve to.
    let mut groups: BTreeMap<String, SelectorGroup> = BTreeMap::new();
    for p in basic {
        let (ns, os) = (namespace_selector(p), object_selector(p));
        let key = serde_json::to_string(&json!([ns, os])).unwrap_or_default();
        groups.entry(key).or_insert_with(|| (ns, os, Vec::new())).2.push(p);
    }
    let several = groups.len() > 1;
    let mut out: Vec<Entry> = fails.into_iter().chain(ignores).collect();
    for (key, (ns, os, ps)) in groups {
        let suffix = if several { format!("-{}", short_digest(&key)) } else { String::new() };
        let mut names: Vec<&str> = ps.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        let dynamic = format!("{path}/{}", names.join("/"));
        let (mut f, mut i) = (Vec::new(), Vec::new());
        for p in &ps {
            if ignore(p) { i.extend(rules_of(p, autogen_basic)) } else { f.extend(rules_of(p, autogen_basic)) }
        }
        if !f.is_empty() {
            out.push(entry(format!("{name}-fail{suffix}"), dynamic.clone(), false, f, ns.clone(), os.clone()));
        }
        if !i.is_empty() {
            out.push(entry(format!("{name}-ignore{suffix}"), dynamic, true, i, ns, os));
        }
    }
    out
}

/// The first 8 hex digits of the SHA-256 of `text` (Kyverno's selector-group suffix).
fn short_digest(text: &str) -> String {
    use sha2::Digest as _;
    let sum = sha2::Sha256::digest(text.as_bytes());
    sum.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// Kyverno's layout of both configurations for these policies.
pub fn layout<'a>(policies: impl IntoIterator<Item = &'a CompiledPolicy>, s: &Settings) -> Layout {
    let all: Vec<&CompiledPolicy> = policies.into_iter().collect();
    let pins = |p: &&CompiledPolicy| p.pins_digests();
    let mut validating = cpol_entries(&all, s, true);
    let cel = [
        (Kind::ValidatingPolicy, "vpol.validate.kyverno.svc", "/vpol"),
        (Kind::NamespacedValidatingPolicy, "nvpol.validate.kyverno.svc", "/nvpol"),
        (Kind::GeneratingPolicy, "gpol.validate.kyverno.svc", "/gpol"),
        (Kind::NamespacedGeneratingPolicy, "ngpol.validate.kyverno.svc", "/ngpol"),
        (Kind::ImageValidatingPolicy, "ivpol.validate.kyverno.svc", "/ivpol/validate"),
        (Kind::NamespacedImageValidatingPolicy, "nivpol.validate.kyverno.svc", "/nivpol/validate"),
    ];
    for (kind, name, path) in cel {
        validating.extend(cel_entries(&all, kind, name, path, s, false));
    }
    let mut mutating = cpol_entries(&all, s, false);
    let pinning: Vec<&CompiledPolicy> = all.iter().copied().filter(pins).collect();
    for (kind, name, path, set) in [
        (Kind::MutatingPolicy, "mpol.validate.kyverno.svc", "/mpol", &all),
        (Kind::NamespacedMutatingPolicy, "nmpol.validate.kyverno.svc", "/nmpol", &all),
        (Kind::ImageValidatingPolicy, "ivpol.mutate.kyverno.svc", "/ivpol/mutate", &pinning),
        (Kind::NamespacedImageValidatingPolicy, "nivpol.mutate.kyverno.svc", "/nivpol/mutate", &pinning),
    ] {
        mutating.extend(cel_entries(set, kind, name, path, s, true));
    }
    validating.sort_by(|a, b| a.name.cmp(&b.name));
    mutating.sort_by(|a, b| a.name.cmp(&b.name));
    Layout { validating, mutating }
}
