//! The webhook configurations' `rules`, `caBundle` and owner, kept in step with the policy set.
//!
//! The installer (chart or `verno manifests`) owns the configuration objects and every field
//! of their entries but these three. Verno writes them by server-side apply under the field
//! manager `verno`, only when the object exists and is not being deleted, only when the owner
//! ClusterRole exists, and only when something differs from the live object, so a steady
//! state makes no writes. The applied body names no field the API server requires, so an apply
//! that races an uninstall fails validation instead of re-creating a deleted configuration.

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use verno_engine::CompiledPolicy;
use verno_engine::RuleBody;
use verno_engine::{Hook, Kind, PolicySet, fail_closed};

/// The `policies.kyverno.io` resources Verno serves and validates.
pub const CEL_RESOURCES: [&str; 9] = [
    "deletingpolicies",
    "generatingpolicies",
    "mutatingpolicies",
    "namespaceddeletingpolicies",
    "namespacedgeneratingpolicies",
    "namespacedmutatingpolicies",
    "namespacedvalidatingpolicies",
    "policyexceptions",
    "validatingpolicies",
];

/// Field manager for everything Verno applies.
pub const MANAGER: &str = "verno";
/// The configuration objects the installer renders.
pub const VALIDATING_CONFIG: &str = "verno-resource-validating-webhook-cfg";
pub const MUTATING_CONFIG: &str = "verno-resource-mutating-webhook-cfg";
/// Their entries carry Kyverno's entry names (`-fail` / `-ignore` pairs): the API server puts
/// the entry name in every denial (`admission webhook "validate.kyverno.svc-fail" denied the
/// request: …`), and a Kyverno user's scripts and tests match those messages. The configuration
/// objects stay Verno's own (`verno-…-webhook-cfg`, owned by the installer, see above).
pub const VALIDATE_FAIL: &str = "validate.kyverno.svc-fail";
pub const VALIDATE_IGNORE: &str = "validate.kyverno.svc-ignore";
pub const MUTATE_FAIL: &str = "mutate.kyverno.svc-fail";
pub const MUTATE_IGNORE: &str = "mutate.kyverno.svc-ignore";
/// The entries of the CEL policy kinds (Kyverno names the mutating ones `mpol.validate…` too), on
/// Kyverno's paths (`/vpol`, `/nvpol`, `/mpol`, `/nmpol`). Kyverno puts policy names in the
/// path; Verno's installer owns the paths, so they carry the failure policy instead, as a
/// segment that cannot be a policy name (`_fail`, `_ignore`).
pub const VPOL_FAIL: &str = "vpol.validate.kyverno.svc-fail";
pub const VPOL_IGNORE: &str = "vpol.validate.kyverno.svc-ignore";
pub const NVPOL_FAIL: &str = "nvpol.validate.kyverno.svc-fail";
pub const NVPOL_IGNORE: &str = "nvpol.validate.kyverno.svc-ignore";
pub const MPOL_FAIL: &str = "mpol.validate.kyverno.svc-fail";
pub const MPOL_IGNORE: &str = "mpol.validate.kyverno.svc-ignore";
pub const NMPOL_FAIL: &str = "nmpol.validate.kyverno.svc-fail";
pub const NMPOL_IGNORE: &str = "nmpol.validate.kyverno.svc-ignore";
/// ImageValidatingPolicy entries: the validating ones verify, the mutating ones pin digests.
pub const IVPOL_VALIDATE_FAIL: &str = "ivpol.validate.kyverno.svc-fail";
pub const IVPOL_VALIDATE_IGNORE: &str = "ivpol.validate.kyverno.svc-ignore";
pub const NIVPOL_VALIDATE_FAIL: &str = "nivpol.validate.kyverno.svc-fail";
pub const NIVPOL_VALIDATE_IGNORE: &str = "nivpol.validate.kyverno.svc-ignore";
pub const IVPOL_MUTATE_FAIL: &str = "ivpol.mutate.kyverno.svc-fail";
pub const IVPOL_MUTATE_IGNORE: &str = "ivpol.mutate.kyverno.svc-ignore";
pub const NIVPOL_MUTATE_FAIL: &str = "nivpol.mutate.kyverno.svc-fail";
pub const NIVPOL_MUTATE_IGNORE: &str = "nivpol.mutate.kyverno.svc-ignore";
/// Every policy entry: name, path, fail-closed, and whether it is in the validating (or the
/// mutating) configuration, in the order the installer renders them.
pub const POLICY_ENTRIES: [(&str, &str, bool, bool); 20] = [
    (VALIDATE_FAIL, "/validate/fail", true, true),
    (VALIDATE_IGNORE, "/validate/ignore", false, true),
    (VPOL_FAIL, "/vpol/_fail", true, true),
    (VPOL_IGNORE, "/vpol/_ignore", false, true),
    (NVPOL_FAIL, "/nvpol/_fail", true, true),
    (NVPOL_IGNORE, "/nvpol/_ignore", false, true),
    (IVPOL_VALIDATE_FAIL, "/ivpol/validate/_fail", true, true),
    (IVPOL_VALIDATE_IGNORE, "/ivpol/validate/_ignore", false, true),
    (NIVPOL_VALIDATE_FAIL, "/nivpol/validate/_fail", true, true),
    (NIVPOL_VALIDATE_IGNORE, "/nivpol/validate/_ignore", false, true),
    (MUTATE_FAIL, "/mutate/fail", true, false),
    (MUTATE_IGNORE, "/mutate/ignore", false, false),
    (MPOL_FAIL, "/mpol/_fail", true, false),
    (MPOL_IGNORE, "/mpol/_ignore", false, false),
    (NMPOL_FAIL, "/nmpol/_fail", true, false),
    (NMPOL_IGNORE, "/nmpol/_ignore", false, false),
    (IVPOL_MUTATE_FAIL, "/ivpol/mutate/_fail", true, false),
    (IVPOL_MUTATE_IGNORE, "/ivpol/mutate/_ignore", false, false),
    (NIVPOL_MUTATE_FAIL, "/nivpol/mutate/_fail", true, false),
    (NIVPOL_MUTATE_IGNORE, "/nivpol/mutate/_ignore", false, false),
];
/// The end-to-end probe's entry (Kyverno's verify webhook): fail-open, it matches only
/// updates of the probe Lease in Verno's namespace, and Verno stamps the time it was called.
pub const MONITOR: &str = "monitor-webhooks.kyverno.svc";
/// The policy validation entry (Kyverno's `validate-policy.kyverno.svc`): refuses a policy or
/// exception that does not compile when it is applied. Fail-open: Verno being down must not
/// stop a GitOps sync; a policy stored then is still reported in its status.
pub const POLICY_VALIDATE: &str = "validate-policy.kyverno.svc";
/// Kyverno's names for the two configuration objects (`--kyverno-names`, the chart's
/// `kyvernoNames`): a Kyverno user's runbooks, dashboards and tests that name them keep working.
pub const KYVERNO_VALIDATING_CONFIG: &str = "kyverno-resource-validating-webhook-cfg";
pub const KYVERNO_MUTATING_CONFIG: &str = "kyverno-resource-mutating-webhook-cfg";
/// In Kyverno's layout the policy validation and probe entries have their own configurations,
/// under Kyverno's names.
pub const KYVERNO_POLICY_CONFIG: &str = "kyverno-policy-validating-webhook-cfg";
pub const KYVERNO_VERIFY_CONFIG: &str = "kyverno-verify-mutating-webhook-cfg";
/// On a configuration whose entries Verno writes whole (Kyverno's layout): what every entry
/// shares, as the installer renders it from its values — `clientConfig` without its path
/// (`service` or `url`), `namespaceSelector`, `objectSelector`, `matchConditions`,
/// `timeoutSeconds`, `admissionReports`, `forceFailurePolicyIgnore`.
pub const TEMPLATE_ANNOTATION: &str = "verno.io/webhook-template";

/// The names of the two configuration objects an install uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigNames {
    pub validating: &'static str,
    pub mutating: &'static str,
}

impl Default for ConfigNames {
    fn default() -> Self {
        ConfigNames::VERNO
    }
}

impl ConfigNames {
    pub const VERNO: ConfigNames = ConfigNames { validating: VALIDATING_CONFIG, mutating: MUTATING_CONFIG };
    pub const KYVERNO: ConfigNames =
        ConfigNames { validating: KYVERNO_VALIDATING_CONFIG, mutating: KYVERNO_MUTATING_CONFIG };

    /// Kyverno's names when `kyverno`, else Verno's.
    pub fn of(kyverno: bool) -> ConfigNames {
        if kyverno { ConfigNames::KYVERNO } else { ConfigNames::VERNO }
    }

    /// Whether the resource configurations follow Kyverno's layout (entries written whole by
    /// Verno, see [`verno_engine::webhookgen`]): with Kyverno's names.
    pub fn kyverno_layout(self) -> bool {
        self == ConfigNames::KYVERNO
    }

    /// The configurations of this install whose installer-rendered entries Verno completes:
    /// kind, name, and the entries whose rules Verno owns.
    pub fn configs(self) -> [(&'static str, &'static str, &'static [&'static str]); 2] {
        if self.kyverno_layout() {
            return [
                ("ValidatingWebhookConfiguration", KYVERNO_POLICY_CONFIG, &[POLICY_VALIDATE]),
                ("MutatingWebhookConfiguration", KYVERNO_VERIFY_CONFIG, &[MONITOR]),
            ];
        }
        [
            ("ValidatingWebhookConfiguration", self.validating, VALIDATING_ENTRIES),
            ("MutatingWebhookConfiguration", self.mutating, MUTATING_ENTRIES),
        ]
    }

    /// The configurations whose entries Verno writes whole (Kyverno's layout): kind, name.
    pub fn dynamic(self) -> Vec<(&'static str, &'static str)> {
        if !self.kyverno_layout() {
            return Vec::new();
        }
        vec![("ValidatingWebhookConfiguration", self.validating), ("MutatingWebhookConfiguration", self.mutating)]
    }

    /// Every configuration of the install, by name (what Verno's ClusterRole may patch).
    pub fn all(self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self.dynamic().iter().map(|d| d.1).collect();
        out.extend(self.configs().iter().map(|c| c.1));
        out
    }
}

/// The entries of the validating configuration whose rules Verno owns.
pub const VALIDATING_ENTRIES: &[&str] = &[
    VALIDATE_FAIL,
    VALIDATE_IGNORE,
    VPOL_FAIL,
    VPOL_IGNORE,
    NVPOL_FAIL,
    NVPOL_IGNORE,
    IVPOL_VALIDATE_FAIL,
    IVPOL_VALIDATE_IGNORE,
    NIVPOL_VALIDATE_FAIL,
    NIVPOL_VALIDATE_IGNORE,
    POLICY_VALIDATE,
];
/// The entries of the mutating configuration whose rules Verno owns.
pub const MUTATING_ENTRIES: &[&str] = &[
    MUTATE_FAIL,
    MUTATE_IGNORE,
    MPOL_FAIL,
    MPOL_IGNORE,
    NMPOL_FAIL,
    NMPOL_IGNORE,
    IVPOL_MUTATE_FAIL,
    IVPOL_MUTATE_IGNORE,
    NIVPOL_MUTATE_FAIL,
    NIVPOL_MUTATE_IGNORE,
    MONITOR,
];

/// One client for either configuration kind, so both go through the same code.
pub fn config_api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let plural = if kind == "MutatingWebhookConfiguration" {
        "mutatingwebhookconfigurations"
    } else {
        "validatingwebhookconfigurations"
    };
    let ar = ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(client.clone(), &ar)
}

/// An object as plain JSON.
pub fn as_json(o: DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// Set by `verno break-glass`: the configuration's failure policies were forced to Ignore.
pub const BREAK_GLASS_ANNOTATION: &str = "verno.io/break-glass";

/// Built-in kinds: group, version, plural. Kinds not listed keep the policy's group and version
/// (`*` when not given) and the usual plural.
const KINDS: &[(&str, &str, &str, &str)] = &[
    ("Pod", "", "v1", "pods"),
    ("Service", "", "v1", "services"),
    ("ConfigMap", "", "v1", "configmaps"),
    ("Secret", "", "v1", "secrets"),
    ("Namespace", "", "v1", "namespaces"),
    ("Node", "", "v1", "nodes"),
    ("ServiceAccount", "", "v1", "serviceaccounts"),
    ("PersistentVolume", "", "v1", "persistentvolumes"),
    ("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
    ("ReplicationController", "", "v1", "replicationcontrollers"),
    ("Endpoints", "", "v1", "endpoints"),
    ("LimitRange", "", "v1", "limitranges"),
    ("ResourceQuota", "", "v1", "resourcequotas"),
    ("Deployment", "apps", "v1", "deployments"),
    ("StatefulSet", "apps", "v1", "statefulsets"),
    ("DaemonSet", "apps", "v1", "daemonsets"),
    ("ReplicaSet", "apps", "v1", "replicasets"),
    ("Job", "batch", "v1", "jobs"),
    ("CronJob", "batch", "v1", "cronjobs"),
    ("Ingress", "networking.k8s.io", "v1", "ingresses"),
    ("IngressClass", "networking.k8s.io", "v1", "ingressclasses"),
    ("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    ("Role", "rbac.authorization.k8s.io", "v1", "roles"),
    ("ClusterRole", "rbac.authorization.k8s.io", "v1", "clusterroles"),
    ("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
    ("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    ("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers"),
    ("StorageClass", "storage.k8s.io", "v1", "storageclasses"),
    ("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses"),
    ("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions"),
];

/// Operations in the API server's canonical order (a stable order avoids update churn,
/// kyverno/kyverno#10237).
const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];

/// Where a kind selector's kind is served, for a generated ValidatingAdmissionPolicy: the
/// built-in kinds from their table (when the selector's group and version agree), other kinds
/// where the selector names their group and version, with the usual plural. Kyverno asks
/// discovery; without it, a custom kind named without its group resolves to nothing (the
/// policy is then not generated, and says why).
pub fn resolve_kind(group: &str, version: &str, kind: &str, sub: &str) -> Vec<(String, String, String)> {
    let with_sub = |plural: &str| if sub.is_empty() { plural.to_string() } else { format!("{plural}/{sub}") };
    if let Some((_, g, v, plural)) = KINDS.iter().find(|(k, ..)| *k == kind) {
        if (group == "*" || group == *g) && (version == "*" || version == *v) {
            return vec![((*g).to_string(), (*v).to_string(), with_sub(plural))];
        }
        return Vec::new();
    }
    if group == "*" || version == "*" || kind.contains('*') || kind.contains('?') {
        return Vec::new();
    }
    vec![(group.to_string(), version.to_string(), with_sub(&verno_engine::plural(kind)))]
}

/// (group, version, resource) for one scope entry.
fn resources(s: &verno_engine::WebhookScope) -> Vec<(String, String, String)> {
    let with_sub = |plural: &str| match s.subresource.as_str() {
        "" => plural.to_string(),
        sub => format!("{plural}/{sub}"),
    };
    if let Some(r) = &s.resource {
        return vec![(s.group.clone(), s.version.clone(), with_sub(r))];
    }
    let kind = s.kind.as_deref().unwrap_or("*");
    if kind == "*" || kind.contains('*') || kind.contains('?') {
        return vec![(s.group.clone(), s.version.clone(), with_sub("*"))];
    }
    match KINDS.iter().find(|(k, ..)| *k == kind) {
        Some((_, g, v, plural)) => {
            let g = if s.group == "*" { (*g).to_string() } else { s.group.clone() };
            let v = if s.version == "*" { (*v).to_string() } else { s.version.clone() };
            // A Pod rule covers the ephemeral containers `kubectl debug` adds (the engine
            // matches them as the Pod), so the API server must ask about them too, as Kyverno
            // registers them.
            let debug = (kind == "Pod" && s.subresource.is_empty())
                .then(|| (g.clone(), v.clone(), format!("{plural}/ephemeralcontainers")));
            std::iter::once((g, v, with_sub(plural))).chain(debug).collect()
        }
        None => vec![(s.group.clone(), s.version.clone(), with_sub(&verno_engine::plural(kind)))],
    }
}

/// Which entries a rule of a policy needs: none, one, or (verifyImages) the mutate entry, where
/// images are verified and digests pinned, and the validate entry, where `required` and
/// `verifyDigest` are checked.
fn entries_for(p: &CompiledPolicy, body: &RuleBody) -> Vec<&'static str> {
    // An ImageValidatingPolicy is verified on the validating entry and has its digests pinned
    // on the mutating one (unless `mutateDigest` is off).
    if matches!(p.kind, Kind::ImageValidatingPolicy | Kind::NamespacedImageValidatingPolicy) {
        let mutate = if p.pins_digests() { entry_for(p, Hook::Mutate) } else { None };
        return entry_for(p, Hook::Validate).into_iter().chain(mutate).collect();
    }
    match body {
        RuleBody::VerifyImages(_) => {
            entry_for(p, Hook::Mutate).into_iter().chain(entry_for(p, Hook::Validate)).collect()
        }
        _ => hook_for(body).and_then(|h| entry_for(p, h)).into_iter().collect(),
    }
}

/// The hook a (non-verifyImages) rule runs on, if any.
fn hook_for(body: &RuleBody) -> Option<Hook> {
    Some(match body {
        RuleBody::Validate(_) | RuleBody::VerifyImages(_) => Hook::Validate,
        RuleBody::Mutate(_) => Hook::Mutate,
        // Generate rules run in the background controller, not at admission.
        RuleBody::Generate(_) => return None,
        // Cleanup policies run on their schedule, never at admission.
        RuleBody::Cleanup(_) => return None,
        // Unsupported rule types answer with an error result: route them with validation.
        RuleBody::Unsupported { .. } => Hook::Validate,
    })
}

/// The entry of a policy's rules on `hook`, if it is admitted at all.
fn entry_for(p: &CompiledPolicy, hook: Hook) -> Option<&'static str> {
    // Admission processing off: only background scans evaluate it.
    if !p.admission {
        return None;
    }
    let fail = fail_closed(hook, p);
    let pick = |f: &'static str, i: &'static str| if fail { f } else { i };
    Some(match (p.kind, hook) {
        (Kind::ClusterPolicy | Kind::Policy, Hook::Validate) => pick(VALIDATE_FAIL, VALIDATE_IGNORE),
        (Kind::ClusterPolicy | Kind::Policy, Hook::Mutate) => pick(MUTATE_FAIL, MUTATE_IGNORE),
        (Kind::ValidatingPolicy, Hook::Validate) => pick(VPOL_FAIL, VPOL_IGNORE),
        (Kind::NamespacedValidatingPolicy, Hook::Validate) => pick(NVPOL_FAIL, NVPOL_IGNORE),
        (Kind::MutatingPolicy, Hook::Mutate) => pick(MPOL_FAIL, MPOL_IGNORE),
        (Kind::NamespacedMutatingPolicy, Hook::Mutate) => pick(NMPOL_FAIL, NMPOL_IGNORE),
        (Kind::ImageValidatingPolicy, Hook::Validate) => pick(IVPOL_VALIDATE_FAIL, IVPOL_VALIDATE_IGNORE),
        (Kind::NamespacedImageValidatingPolicy, Hook::Validate) => pick(NIVPOL_VALIDATE_FAIL, NIVPOL_VALIDATE_IGNORE),
        (Kind::ImageValidatingPolicy, Hook::Mutate) => pick(IVPOL_MUTATE_FAIL, IVPOL_MUTATE_IGNORE),
        (Kind::NamespacedImageValidatingPolicy, Hook::Mutate) => pick(NIVPOL_MUTATE_FAIL, NIVPOL_MUTATE_IGNORE),
        // Admission policies are the API server's; other kinds are not served at admission.
        _ => return None,
    })
}

/// The `rules` each entry needs for `set`, canonical: grouped by (group, version, operations),
/// every list sorted and deduplicated. Entries that need nothing are absent.
pub fn desired_rules(set: &PolicySet) -> BTreeMap<&'static str, Vec<Value>> {
    // entry → (group, version, operations) → resources
    type Groups = BTreeMap<(String, String, Vec<&'static str>), BTreeSet<String>>;
    let mut acc: BTreeMap<&'static str, Groups> = BTreeMap::new();
    for p in set.policies() {
        for r in &p.rules {
            // A ClusterPolicy's validate rule that names no operations is registered for every
            // one, as Kyverno registers it: DELETE and CONNECT (`pods/exec`) too — a policy
            // refusing `kubectl exec` must be asked. (The engine skips pattern rules on DELETE.)
            let every = matches!(r.body, RuleBody::Validate(_)) && matches!(p.kind, Kind::ClusterPolicy | Kind::Policy);
            for entry in entries_for(p, &r.body) {
                for scope in r.matcher.webhook_scope() {
                    let ops: Vec<&'static str> = if scope.operations.is_empty() {
                        if every { OPERATIONS.to_vec() } else { vec!["CREATE", "UPDATE"] }
                    } else {
                        OPERATIONS
                            .iter()
                            .copied()
                            .filter(|o| scope.operations.iter().any(|x| x == o || x == "*"))
                            .collect()
                    };
                    for (g, v, res) in resources(&scope) {
                        acc.entry(entry).or_default().entry((g, v, ops.clone())).or_default().insert(res);
                    }
                }
            }
        }
    }
    let mut out: BTreeMap<&'static str, Vec<Value>> = acc
        .into_iter()
        .map(|(entry, groups)| {
            let rules = groups
                .into_iter()
                .map(|((g, v, ops), res)| json!({"apiGroups": [g], "apiVersions": [v], "operations": ops, "resources": res.into_iter().collect::<Vec<_>>(), "scope": "*"}))
                .collect();
            (entry, rules)
        })
        .collect();
    // Verno's own kinds, validated on write, in every version they are served in (`v2beta1`,
    // `v1beta1` … manifests keep working, and are validated the same).
    out.insert(POLICY_VALIDATE, vec![
        json!({"apiGroups": ["kyverno.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["clusterpolicies", "policies"], "scope": "*"}),
        json!({"apiGroups": ["kyverno.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["policyexceptions"], "scope": "*"}),
        json!({"apiGroups": ["kyverno.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["cleanuppolicies", "clustercleanuppolicies"], "scope": "*"}),
        json!({"apiGroups": ["kyverno.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["globalcontextentries"], "scope": "*"}),
        json!({"apiGroups": ["policies.kyverno.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": CEL_RESOURCES, "scope": "*"}),
    ]);
    // The probe's entry (its namespace and object selectors narrow it to the probe Lease).
    out.insert(MONITOR, vec![json!({"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["leases"], "scope": "Namespaced"})]);
    out
}

/// What the reconciler needs besides the policy set.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// PEM of every trusted CA (base64-encoded into `caBundle`); `None` leaves it alone.
    pub ca_bundle: Option<String>,
    /// The ClusterRole whose ownerReference the configurations carry (the chart's).
    pub owner_cluster_role: Option<String>,
    /// The Deployment is deleted or scaled to zero: every entry's rules are emptied.
    pub going_down: bool,
    /// The configuration objects' names.
    pub names: ConfigNames,
}

/// One configuration's owned fields as Verno wants them.
fn apply_body(
    kind: &str,
    name: &str,
    live_entries: &[String],
    rules: &BTreeMap<&'static str, Vec<Value>>,
    inputs: &Inputs,
    owner: Option<&Value>,
    managed: &[&str],
) -> Value {
    let mut webhooks = Vec::new();
    for entry in live_entries.iter().filter(|e| managed.contains(&e.as_str())) {
        let mut w = serde_json::Map::new();
        w.insert("name".into(), Value::String(entry.clone()));
        if !inputs.going_down
            && let Some(r) = rules.get(entry.as_str()).filter(|r| !r.is_empty())
        {
            w.insert("rules".into(), Value::Array(r.clone()));
        }
        if let Some(ca) = &inputs.ca_bundle {
            use base64::Engine as _;
            w.insert("clientConfig".into(), json!({"caBundle": base64::engine::general_purpose::STANDARD.encode(ca)}));
        }
        webhooks.push(Value::Object(w));
    }
    let meta = match owner {
        Some(o) => json!({"name": name, "ownerReferences": [o]}),
        None => json!({"name": name}),
    };
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": meta, "webhooks": webhooks})
}

/// Whether the live object already carries everything in `body` (rules equal, caBundle equal,
/// owner present).
fn satisfied(live: &Value, body: &Value) -> bool {
    let live_entries = live.get("webhooks").and_then(Value::as_array).cloned().unwrap_or_default();
    for want in body.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
        let name = want.get("name");
        let Some(have) = live_entries.iter().find(|w| w.get("name") == name) else { return false };
        if want.get("rules") != have.get("rules").filter(|r| r.as_array().is_some_and(|a| !a.is_empty())) {
            return false;
        }
        if let Some(ca) = want.pointer("/clientConfig/caBundle")
            && have.pointer("/clientConfig/caBundle") != Some(ca)
        {
            return false;
        }
    }
    match body.pointer("/metadata/ownerReferences/0/uid") {
        Some(uid) => live
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|refs| refs.iter().any(|r| r.get("uid") == Some(uid))),
        None => true,
    }
}

/// What a Kyverno-layout configuration's template annotation says.
#[derive(Debug, Clone)]
pub struct Template {
    /// `{"service": {name, namespace, port}}` or `{"url": "https://host:port"}`: the paths are
    /// added per entry.
    pub client: Value,
    pub settings: verno_engine::webhookgen::Settings,
}

impl Template {
    /// The template on a live configuration, if it has one that reads.
    pub fn of(live: &Value) -> Option<Template> {
        let text =
            live.pointer(&format!("/metadata/annotations/{}", TEMPLATE_ANNOTATION.replace('/', "~1")))?.as_str()?;
        let t: Value = serde_json::from_str(text).ok()?;
        let client = t.get("clientConfig").filter(|c| c.get("service").is_some() || c.get("url").is_some())?.clone();
        let settings = verno_engine::webhookgen::Settings {
            namespace_selector: t.get("namespaceSelector").filter(|v| v.is_object()).cloned(),
            object_selector: t.get("objectSelector").filter(|v| v.is_object()).cloned(),
            match_conditions: t.get("matchConditions").and_then(Value::as_array).cloned().unwrap_or_default(),
            timeout: t.get("timeoutSeconds").and_then(Value::as_i64).unwrap_or(10).clamp(1, 30),
            admission_reports: t.get("admissionReports").and_then(Value::as_bool).unwrap_or(true),
            force_ignore: t.get("forceFailurePolicyIgnore").and_then(Value::as_bool).unwrap_or(false),
        };
        Some(Template { client, settings })
    }

    /// The client configuration of an entry on `path`, trusting `ca`.
    fn client_config(&self, path: &str, ca: Option<&str>) -> Value {
        let mut c = match (self.client.get("service"), self.client.get("url").and_then(Value::as_str)) {
            (Some(svc), _) => {
                let mut svc = svc.clone();
                if let Some(m) = svc.as_object_mut() {
                    m.insert("path".into(), json!(path));
                }
                json!({"service": svc})
            }
            (None, Some(url)) => json!({"url": format!("{}{path}", url.trim_end_matches('/'))}),
            (None, None) => json!({}),
        };
        if let (Some(ca), Some(m)) = (ca, c.as_object_mut()) {
            use base64::Engine as _;
            m.insert("caBundle".into(), json!(base64::engine::general_purpose::STANDARD.encode(ca)));
        }
        c
    }
}

/// A Kyverno-layout configuration's entries for `set`: none while going down; every entry
/// fail-open under break-glass.
pub fn layout_entries(
    set: &PolicySet,
    template: &Template,
    validating: bool,
    inputs: &Inputs,
    break_glass: bool,
) -> Vec<Value> {
    if inputs.going_down {
        return Vec::new();
    }
    let mut settings = template.settings.clone();
    settings.force_ignore |= break_glass;
    let layout = verno_engine::webhookgen::layout(set.policies().iter().map(|p| p.as_ref()), &settings);
    let entries = if validating { layout.validating } else { layout.mutating };
    entries.iter().map(|e| e.render(template.client_config(&e.path, inputs.ca_bundle.as_deref()))).collect()
}

/// Whether `live` already holds what `want` says (the API server adds defaults; an empty list
/// or object stands for an absent field).
fn holds(live: Option<&Value>, want: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
        _ => false,
    };
    match (live, want) {
        (None | Some(Value::Null), w) => empty(w),
        (Some(Value::Object(l)), Value::Object(w)) => w.iter().all(|(k, v)| holds(l.get(k), v)),
        (Some(Value::Array(l)), Value::Array(w)) => {
            l.len() == w.len() && l.iter().zip(w).all(|(a, b)| holds(Some(a), b))
        }
        (Some(l), w) => l == w,
    }
}

/// Brings the Kyverno-layout configurations in line with `set` (JSON patches that test the
/// object's uid: never a create, so an uninstall cannot be undone). Returns the writes.
async fn reconcile_layout(
    client: &kube::Client,
    set: &PolicySet,
    inputs: &Inputs,
    owner: Option<&Value>,
) -> Result<usize, kube::Error> {
    let mut writes = 0;
    for (kind, name) in inputs.names.dynamic() {
        let api = config_api(client, kind);
        let Some(live) =
            api.get_opt(name).await?.map(as_json).filter(|l| l.pointer("/metadata/deletionTimestamp").is_none())
        else {
            continue;
        };
        let Some(template) = Template::of(&live) else {
            tracing::warn!(config = %name, annotation = TEMPLATE_ANNOTATION, "webhook configuration without a readable template; left alone");
            continue;
        };
        let glass =
            live.pointer(&format!("/metadata/annotations/{}", BREAK_GLASS_ANNOTATION.replace('/', "~1"))).is_some();
        let want =
            Value::Array(layout_entries(set, &template, kind == "ValidatingWebhookConfiguration", inputs, glass));
        let owned = match owner.and_then(|o| o.get("uid")) {
            Some(uid) => live
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|r| r.get("uid") == Some(uid))),
            None => true,
        };
        if holds(live.get("webhooks"), &want) && owned {
            continue;
        }
        let uid = live.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/uid", "value": uid}),
            json!({"op": "add", "path": "/webhooks", "value": want}),
        ];
        if let (Some(o), false) = (owner, owned) {
            ops.push(json!({"op": "add", "path": "/metadata/ownerReferences", "value": [o]}));
        }
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
        let pp = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
        match api.patch(name, &pp, &Patch::<()>::Json(patch)).await {
            Ok(_) => {
                writes += 1;
                tracing::info!(config = %name, "webhook configuration updated");
            }
            // Gone, or replaced by another object of the same name, since it was read.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                tracing::info!(config = %name, "webhook configuration changed during the update")
            }
            // Refused (or the uid test failed): the entries in place stay; said loudly, since
            // policies changed since then are not called as they should be.
            Err(kube::Error::Api(e)) if e.code == 422 => {
                tracing::warn!(config = %name, error = %e.message, "webhook configuration update refused")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(writes)
}

/// Brings both configurations in line with `set`. Returns how many objects were written.
pub async fn reconcile(client: &kube::Client, set: &PolicySet, inputs: &Inputs) -> Result<usize, kube::Error> {
    let rules = desired_rules(set);
    let owner = match &inputs.owner_cluster_role {
        Some(name) => {
            let roles: Api<ClusterRole> = Api::all(client.clone());
            match roles.get_opt(name).await? {
                Some(r) if r.metadata.deletion_timestamp.is_none() => r.metadata.uid.map(|uid| json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": name, "uid": uid})),
                // The owner is gone or going: an uninstall is under way. Writing now could only
                // leave an orphan behind, so nothing is written.
                _ => {
                    tracing::info!(cluster_role = %name, "owner ClusterRole absent or terminating; webhook configurations left alone");
                    return Ok(0);
                }
            }
        }
        None => None,
    };
    // The resource configurations first (where a policy's rules go), then the others.
    let mut writes = reconcile_layout(client, set, inputs, owner.as_ref()).await?;
    for (kind, name, managed) in inputs.names.configs() {
        let api = config_api(client, kind);
        // Never create: the installer owns the object; absent or terminating means uninstall.
        let Some(live) =
            api.get_opt(name).await?.map(as_json).filter(|l| l.pointer("/metadata/deletionTimestamp").is_none())
        else {
            continue;
        };
        let entries: Vec<String> = live
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|w| w.get("name").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        let body = apply_body(kind, name, &entries, &rules, inputs, owner.as_ref(), managed);
        if satisfied(&live, &body) {
            continue;
        }
        match api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await {
            Ok(_) => {
                writes += 1;
                tracing::info!(config = %name, "webhook configuration updated");
            }
            // Deleted between our read and the apply: the apply cannot re-create it.
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 404 => {
                tracing::info!(config = %name, "webhook configuration went away during the update")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(writes)
}
