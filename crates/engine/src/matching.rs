//! `match` / `exclude`: kind selectors, names, namespaces, annotations, label and namespace
//! selectors (with wildcards), operations and user info. Compiled once per rule.

use crate::error::CompileError;
use compact_str::CompactString;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use verno_api::{LabelSelector, MatchResources, ResourceDescription, ResourceFilter, Subject};
use verno_jmespath::value::same;
use verno_jmespath::wildcard;

/// Why a resource does not match (static text on the hot path: no allocation).
pub type Reason = Cow<'static, str>;

/// What matching needs to know about the resource and the request.
#[derive(Debug, Clone, Default)]
pub struct MatchInput<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub labels: Option<&'a serde_json::Map<String, serde_json::Value>>,
    pub annotations: Option<&'a serde_json::Map<String, serde_json::Value>>,
    pub operation: verno_api::Operation,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub user: Option<&'a RequestUser>,
}

/// The requesting user, with the roles resolved for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestUser {
    pub username: String,
    pub groups: Vec<String>,
    pub roles: Vec<String>,
    pub cluster_roles: Vec<String>,
}

impl RequestUser {
    fn is_empty(&self) -> bool {
        self.username.is_empty() && self.groups.is_empty() && self.roles.is_empty() && self.cluster_roles.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct KindSelector {
    // In line (short names): matching a request compares them without reading elsewhere.
    group: CompactString,
    version: CompactString,
    kind: CompactString,
    sub: CompactString,
    /// `*/*`: every kind including subresources.
    all: bool,
    /// How `group`, `version` and `kind` match, worked out once.
    shape: [Glob; 3],
}

/// How a selector field matches: anything (`*`), exactly, or as a wildcard pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Glob {
    Any,
    Exact,
    Wild,
}

impl Glob {
    fn of(pattern: &str) -> Glob {
        if pattern == "*" {
            Glob::Any
        } else if wildcard::has_wildcard(pattern) {
            Glob::Wild
        } else {
            Glob::Exact
        }
    }

    /// `wildcard::matches(pattern, text)` for a pattern of this shape.
    fn matches(self, pattern: &str, text: &str) -> bool {
        match self {
            Glob::Any => true,
            Glob::Exact => same(pattern, text),
            Glob::Wild => wildcard::matches(pattern, text),
        }
    }
}

/// What a kind selector without a subresource covers: the main resource; `Pod` also covers
/// ephemeral containers.
fn main_resource(kind: &str, sub: &str) -> bool {
    sub.is_empty() || (kind == "Pod" && sub == "ephemeralcontainers")
}

static VERSION: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(r"^(v\d+((alpha|beta)\d+)?|\*)$").ok());

fn is_version(s: &str) -> bool {
    VERSION.as_ref().is_some_and(|r| r.is_match(s))
}

impl KindSelector {
    /// Whether the selector can name a subresource: `Kind/sub`, `*/*`, `Pod/*`, `*/status`.
    pub(crate) fn names_subresource(&self) -> bool {
        self.all || !self.sub.is_empty()
    }

    pub(crate) fn kind(&self) -> &str {
        &self.kind
    }

    /// Group, version, kind and subresource as written (`*` where the selector leaves them open).
    pub fn parts(&self) -> (&str, &str, &str, &str) {
        (&self.group, &self.version, &self.kind, &self.sub)
    }

    pub fn parse(s: &str) -> KindSelector {
        let parts: Vec<&str> = s.split('/').collect();
        let split_last = |last: &str| -> (String, String) {
            match last.split_once('.') {
                Some((k, sub)) => (k.to_string(), sub.to_string()),
                None => (last.to_string(), String::new()),
            }
        };
        let mk = |g: &str, v: &str, k: String, sub: String| KindSelector {
            group: g.into(),
            version: v.into(),
            shape: [Glob::of(g), Glob::of(v), Glob::of(&k)],
            kind: k.into(),
            sub: sub.into(),
            all: false,
        };
        match parts.as_slice() {
            [k] => {
                let (k, sub) = split_last(k);
                mk("*", "*", k, sub)
            }
            ["*", "*"] => KindSelector {
                group: "*".into(),
                version: "*".into(),
                kind: "*".into(),
                sub: "*".into(),
                all: true,
                shape: [Glob::Any; 3],
            },
            ["*", sub] if sub.chars().next().is_some_and(|c| c.is_lowercase()) => {
                mk("*", "*", "*".into(), (*sub).to_string())
            }
            [v, k] if is_version(v) => {
                let (k, sub) = split_last(k);
                mk("*", v, k, sub)
            }
            [k, sub] => mk("*", "*", (*k).to_string(), (*sub).to_string()),
            [v, k, sub] if is_version(v) => mk("*", v, (*k).to_string(), (*sub).to_string()),
            [g, v, k] => {
                let (k, sub) = split_last(k);
                mk(g, v, k, sub)
            }
            [g, v, k, sub] => mk(g, v, (*k).to_string(), (*sub).to_string()),
            _ => mk("*", "*", s.to_string(), String::new()),
        }
    }

    pub fn matches(&self, group: &str, version: &str, kind: &str, sub: &str) -> bool {
        if self.all {
            return true;
        }
        let [g, v, k] = self.shape;
        if !k.matches(&self.kind, kind) || !g.matches(&self.group, group) || !v.matches(&self.version, version) {
            return false;
        }
        if self.sub.is_empty() {
            return main_resource(kind, sub);
        }
        wildcard::matches(&self.sub.to_lowercase(), &sub.to_lowercase())
    }
}

#[derive(Debug, Clone, Default)]
struct Description {
    kinds: Vec<KindSelector>,
    names: Vec<String>,
    namespaces: Vec<String>,
    annotations: BTreeMap<String, String>,
    selector: Option<LabelSelector>,
    namespace_selector: Option<LabelSelector>,
    operations: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Filter {
    desc: Description,
    subjects: Vec<Subject>,
    roles: Vec<String>,
    cluster_roles: Vec<String>,
}

#[derive(Debug, Clone)]
enum Mode {
    Any(Vec<Filter>),
    All(Vec<Filter>),
    /// Kubernetes `MatchResources` (CEL policy kinds): each must match (a policy's
    /// `matchConstraints` and a binding's `matchResources`).
    Constraints(Vec<Constraints>),
}

/// The kinds of [`Matcher::rules_out_kind`]: with `any`, a filter matches only requests of one
/// of its kinds when it has kinds and each is an exact name (`Pod`, `apps/v1/Deployment`,
/// `Pod/status`); a filter without kinds (or with a wildcard) may match any kind.
fn exact_kinds(mode: &Mode) -> Option<Vec<CompactString>> {
    let Mode::Any(filters) = mode else { return None };
    let mut kinds = Vec::new();
    for f in filters {
        if f.desc.kinds.is_empty() {
            return None;
        }
        for k in &f.desc.kinds {
            if k.all || k.shape[2] != Glob::Exact {
                return None;
            }
            kinds.push(k.kind.clone());
        }
    }
    Some(kinds)
}

/// Whether an `any` list says nothing but bare kind names (`Pod`: any group and version, no
/// subresource) — the usual `match` — so that its kinds alone decide a match.
fn only_kind_names(mode: &Mode) -> bool {
    let Mode::Any(filters) = mode else { return false };
    !filters.is_empty()
        && filters.iter().all(|f| {
            let kinds = &f.desc.kinds;
            !kinds.is_empty()
                && kinds.iter().all(|k| !k.all && k.shape == [Glob::Any, Glob::Any, Glob::Exact] && k.sub.is_empty())
                && f.says_nothing_but_kinds()
        })
}

/// One Kubernetes `resourceRules` / `excludeResourceRules` entry.
#[derive(Debug, Clone, Default)]
pub struct ResourceRule {
    pub api_groups: Vec<String>,
    pub api_versions: Vec<String>,
    /// Plural resource names, optionally `resource/subresource`, or `*`.
    pub resources: Vec<String>,
    pub operations: Vec<String>,
    pub resource_names: Vec<String>,
    /// `Cluster`, `Namespaced` or `*` (none: `*`): which objects of the resources the rule
    /// covers, by where they live.
    pub scope: Option<String>,
}

impl ResourceRule {
    fn matches(&self, i: &MatchInput) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| same(x, "*") || same(x, v));
        // `resources` entries: `*`, `*/*`, `<plural>`, `<plural>/<subresource>`, `<plural>/*`.
        let resource = |r: &str| match r.split_once('/') {
            None => i.subresource.is_empty() && is_plural_of(r, i.kind),
            Some((p, sub)) => {
                !i.subresource.is_empty() && (sub == i.subresource || sub == "*") && is_plural_of(p, i.kind)
            }
        };
        any(&self.api_groups, i.group)
            && any(&self.api_versions, i.version)
            && self.resources.iter().any(|r| same(r, "*") || same(r, "*/*") || resource(r))
            && (self.operations.is_empty() || any(&self.operations, i.operation.as_str()))
            && (self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == i.name))
            && self.scope_matches(i)
    }

    /// Kubernetes' `scope`: a Namespace is cluster-scoped, whatever namespace its request names.
    fn scope_matches(&self, i: &MatchInput) -> bool {
        let is_namespace = i.group.is_empty() && i.kind == "Namespace";
        let namespaced = !i.namespace.is_empty() && !is_namespace;
        match self.scope.as_deref() {
            Some("Cluster") => !namespaced,
            Some("Namespaced") => namespaced,
            _ => true,
        }
    }
}

/// Kubernetes `matchConstraints`.
#[derive(Debug, Clone, Default)]
pub struct Constraints {
    pub rules: Vec<ResourceRule>,
    pub exclude: Vec<ResourceRule>,
    pub namespace_selector: Option<LabelSelector>,
    pub object_selector: Option<LabelSelector>,
}

impl Constraints {
    fn matches(&self, input: &MatchInput) -> Result<(), Reason> {
        if !self.rules.is_empty() && !self.rules.iter().any(|r| r.matches(input)) {
            return Err("no resourceRules entry matches".into());
        }
        if self.exclude.iter().any(|r| r.matches(input)) {
            return Err("excluded by excludeResourceRules".into());
        }
        if let Some(sel) = &self.object_selector
            && !selector_matches(sel, &string_map(input.labels), false)
        {
            return Err("objectSelector does not match".into());
        }
        if let Some(sel) = &self.namespace_selector
            && !input.namespace.is_empty()
        {
            let empty = BTreeMap::new();
            if !selector_matches(sel, input.namespace_labels.unwrap_or(&empty), false) {
                return Err("namespaceSelector does not match".into());
            }
        }
        Ok(())
    }
}

/// Is `resource` [`plural`]`(kind)`? Without building the plural: matching runs per policy
/// per request.
pub fn is_plural_of(resource: &str, kind: &str) -> bool {
    if !kind.is_ascii() {
        return plural(kind) == resource;
    }
    let ends = |suffix: &str| {
        kind.len() >= suffix.len()
            && kind.get(kind.len() - suffix.len()..).is_some_and(|e| e.eq_ignore_ascii_case(suffix))
    };
    let (stem, suffix) = if ends("s") || ends("sh") || ends("ch") || ends("x") {
        (kind, "es")
    } else if ends("y") && !ends("ey") {
        (kind.get(..kind.len() - 1).unwrap_or_default(), "ies")
    } else {
        (kind, "s")
    };
    match (resource.get(..stem.len()), resource.get(stem.len()..)) {
        (Some(head), Some(tail)) => {
            tail == suffix && head.bytes().zip(stem.bytes()).all(|(a, b)| a == b.to_ascii_lowercase())
        }
        _ => false,
    }
}

/// The plural resource name Kubernetes uses for a kind (`NetworkPolicy` → `networkpolicies`).
pub fn plural(kind: &str) -> String {
    let k = kind.to_lowercase();
    if k.ends_with('s') || k.ends_with("sh") || k.ends_with("ch") || k.ends_with('x') {
        format!("{k}es")
    } else if k.ends_with('y') && !k.ends_with("ey") {
        format!("{}ies", &k[..k.len() - 1])
    } else {
        format!("{k}s")
    }
}

/// One kind or resource a matcher can match, for webhook registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookScope {
    /// API group (`*`: any).
    pub group: String,
    /// API version (`*`: any).
    pub version: String,
    /// The kind as written in the policy (`*`: any), when the policy names kinds.
    pub kind: Option<String>,
    /// The plural resource, when the policy names resources (CEL kinds).
    pub resource: Option<String>,
    /// Subresource (`*`: any; empty: none).
    pub subresource: String,
    /// Operations (empty: the default set).
    pub operations: Vec<String>,
}

/// A compiled `match` or `exclude` block.
#[derive(Debug, Clone)]
pub struct Matcher {
    mode: Mode,
    /// The kinds a request must be of for this matcher to match, when its kinds alone say so
    /// (see [`Matcher::rules_out_kind`]); `None`: any kind may match. In line (short names).
    kinds: Option<Vec<CompactString>>,
    /// The `any` list names bare kinds and nothing else ([`only_kind_names`]): a request
    /// matches when it is one of `kinds` (its main resource, or a Pod's ephemeral
    /// containers), decided without reading the filters.
    only_kinds: bool,
}

fn compile_desc(d: &ResourceDescription, path: &str) -> Result<Description, CompileError> {
    if d.name.is_some() && !d.names.is_empty() {
        return Err(CompileError::new(path, "both name and names can not be specified together"));
    }
    let mut names = d.names.clone();
    if let Some(n) = &d.name {
        names.push(n.clone());
    }
    Ok(Description {
        kinds: d.kinds.iter().map(|k| KindSelector::parse(k)).collect(),
        names,
        namespaces: d.namespaces.clone(),
        annotations: d.annotations.clone(),
        selector: d.selector.clone(),
        namespace_selector: d.namespace_selector.clone(),
        operations: d.operations.clone(),
    })
}

fn compile_filter(f: &ResourceFilter, path: &str) -> Result<Filter, CompileError> {
    Ok(Filter {
        desc: compile_desc(&f.resources, &format!("{path}.resources"))?,
        subjects: f.subjects.clone(),
        roles: f.roles.clone(),
        cluster_roles: f.cluster_roles.clone(),
    })
}

impl Matcher {
    /// A matcher for Kubernetes `MatchResources`.
    pub fn constraints(c: Constraints) -> Matcher {
        Matcher { mode: Mode::Constraints(vec![c]), kinds: None, only_kinds: false }
    }

    /// Several `MatchResources` that must all match.
    pub fn all_constraints(c: Vec<Constraints>) -> Matcher {
        Matcher { mode: Mode::Constraints(c), kinds: None, only_kinds: false }
    }

    pub fn compile(m: &MatchResources, path: &str) -> Result<Matcher, CompileError> {
        if m.any.is_some() && m.all.is_some() {
            return Err(CompileError::new(path, "can't specify any and all together"));
        }
        let list = |v: &[ResourceFilter], p: &str| -> Result<Vec<Filter>, CompileError> {
            v.iter().enumerate().map(|(i, f)| compile_filter(f, &format!("{p}[{i}]"))).collect()
        };
        let mode = if let Some(any) = &m.any {
            Mode::Any(list(any, &format!("{path}.any"))?)
        } else if let Some(all) = &m.all {
            Mode::All(list(all, &format!("{path}.all"))?)
        } else {
            let f = Filter {
                desc: match &m.resources {
                    Some(r) => compile_desc(r, &format!("{path}.resources"))?,
                    None => Description::default(),
                },
                subjects: m.subjects.clone(),
                roles: m.roles.clone(),
                cluster_roles: m.cluster_roles.clone(),
            };
            Mode::Any(vec![f])
        };
        let kinds = exact_kinds(&mode);
        let only_kinds = only_kind_names(&mode);
        Ok(Matcher { mode, kinds, only_kinds })
    }

    /// Whether a request of kind `kind` cannot match, known from the kinds alone: every filter
    /// of the `any` list names its kinds exactly (no wildcard, not `*/*`) and none is `kind`.
    /// [`Matcher::matches`] gives an error for such a request whatever else it holds; a caller
    /// that needs no reason skips it on this word.
    pub fn rules_out_kind(&self, kind: &str) -> bool {
        self.kinds.as_ref().is_some_and(|ks| !ks.iter().any(|k| same(k, kind)))
    }

    /// The kinds of [`Matcher::rules_out_kind`]: `Some` when they alone can rule a request out.
    pub(crate) fn exact_kinds(&self) -> Option<&[CompactString]> {
        self.kinds.as_deref()
    }

    /// What a webhook must send for this matcher to see a request: one entry per kind (or
    /// resource rule), with the operations named (empty: any). Used to build the webhook
    /// configuration's `rules`; it over-approximates (names, selectors and subjects are left
    /// to the engine).
    pub fn webhook_scope(&self) -> Vec<WebhookScope> {
        let mut out = Vec::new();
        match &self.mode {
            Mode::Any(fs) | Mode::All(fs) => {
                for f in fs {
                    if f.desc.kinds.is_empty() {
                        continue;
                    }
                    for k in &f.desc.kinds {
                        let (group, version, kind, sub) = if k.all {
                            ("*", "*", "*", "*")
                        } else {
                            (k.group.as_str(), k.version.as_str(), k.kind.as_str(), k.sub.as_str())
                        };
                        out.push(WebhookScope {
                            group: group.into(),
                            version: version.into(),
                            kind: Some(kind.into()),
                            resource: None,
                            subresource: sub.into(),
                            operations: f.desc.operations.clone(),
                        });
                    }
                }
            }
            Mode::Constraints(cs) => {
                // Every constraint must match; the first (the policy's own) bounds the scope.
                if let Some(c) = cs.first() {
                    for r in &c.rules {
                        for res in &r.resources {
                            let (res, sub) = res.split_once('/').unwrap_or((res, ""));
                            for g in if r.api_groups.is_empty() { vec!["*".to_string()] } else { r.api_groups.clone() }
                            {
                                for v in if r.api_versions.is_empty() {
                                    vec!["*".to_string()]
                                } else {
                                    r.api_versions.clone()
                                } {
                                    out.push(WebhookScope {
                                        group: g.clone(),
                                        version: v,
                                        kind: None,
                                        resource: Some(res.to_string()),
                                        subresource: sub.to_string(),
                                        operations: r.operations.clone(),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// A label selector every object this matcher matches satisfies, for listing candidates
    /// with the selector pushed down to the API server: a `matchConstraints.objectSelector`,
    /// the selector of one `all` entry, or the one selector every `any` entry shares.
    pub fn pushdown_selector(&self) -> Option<&LabelSelector> {
        match &self.mode {
            Mode::Constraints(cs) => cs.first().and_then(|c| c.object_selector.as_ref()),
            Mode::All(fs) => fs.iter().find_map(|f| f.desc.selector.as_ref()),
            Mode::Any(fs) => {
                let first = fs.first()?.desc.selector.as_ref()?;
                fs.iter().all(|f| f.desc.selector.as_ref() == Some(first)).then_some(first)
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        match &self.mode {
            Mode::Any(v) | Mode::All(v) => v.iter().all(|f| f.is_empty()),
            Mode::Constraints(c) => c.first().is_none_or(|x| x.rules.is_empty()),
        }
    }

    /// For `match`: does the resource match? `Err` carries the reason it does not.
    pub fn matches(&self, input: &MatchInput) -> Result<(), Reason> {
        // What the filters would say, read from the kinds kept beside them (the filters are
        // large and, on a webhook request, not in cache); a mismatch goes the long way for
        // its reason.
        if self.only_kinds
            && self.kinds.as_ref().is_some_and(|ks| ks.iter().any(|k| same(k, input.kind)))
            && main_resource(input.kind, input.subresource)
        {
            return Ok(());
        }
        self.matches_by_filters(input)
    }

    /// [`Matcher::matches`] read from the filters themselves.
    fn matches_by_filters(&self, input: &MatchInput) -> Result<(), Reason> {
        match &self.mode {
            // One filter (the usual `match.any` of one entry): its reason as it is.
            Mode::Any(fs) if fs.len() == 1 => fs.iter().try_for_each(|f| f.matches(input, false)),
            Mode::Any(fs) => {
                let mut reasons: Vec<Reason> = Vec::new();
                for f in fs {
                    match f.matches(input, false) {
                        Ok(()) => return Ok(()),
                        Err(r) => reasons.push(r),
                    }
                }
                if reasons.len() == 1 {
                    return Err(reasons.swap_remove(0));
                }
                Err(reasons.join("; ").into())
            }
            Mode::All(fs) => {
                for f in fs {
                    f.matches(input, false)?;
                }
                if fs.is_empty() { Err("no resource filters".into()) } else { Ok(()) }
            }
            Mode::Constraints(cs) => {
                for c in cs {
                    c.matches(input)?;
                }
                Ok(())
            }
        }
    }

    /// For `exclude`: is the resource excluded?
    pub fn excludes(&self, input: &MatchInput) -> bool {
        match &self.mode {
            Mode::Any(fs) => fs.iter().any(|f| !f.is_empty() && f.matches(input, true).is_ok()),
            Mode::All(fs) => !fs.is_empty() && fs.iter().all(|f| f.matches(input, true).is_ok()),
            Mode::Constraints(_) => false,
        }
    }
}

impl Filter {
    fn is_empty(&self) -> bool {
        self.desc.kinds.is_empty() && self.says_nothing_but_kinds()
    }

    /// Whether nothing besides `kinds` is set (names, namespaces, selectors, user info, …).
    fn says_nothing_but_kinds(&self) -> bool {
        let d = &self.desc;
        d.names.is_empty()
            && d.namespaces.is_empty()
            && d.annotations.is_empty()
            && d.selector.is_none()
            && d.namespace_selector.is_none()
            && d.operations.is_empty()
            && self.subjects.is_empty()
            && self.roles.is_empty()
            && self.cluster_roles.is_empty()
    }

    fn matches(&self, input: &MatchInput, exclude: bool) -> Result<(), Reason> {
        if self.is_empty() {
            return Err("empty resource filter".into());
        }
        self.desc.matches(input)?;
        let has_user = !self.subjects.is_empty() || !self.roles.is_empty() || !self.cluster_roles.is_empty();
        if has_user {
            match input.user.filter(|u| !u.is_empty()) {
                None => {
                    if exclude {
                        return Err("no user information".into());
                    }
                }
                Some(u) => user_matches(self, u)?,
            }
        }
        Ok(())
    }
}

/// Each of `roles`, `clusterRoles` and `subjects` that a filter sets must hold (Kyverno's
/// `checkUserInfo`: a block naming subjects and cluster roles matches a subject that has one
/// of the roles).
fn user_matches(f: &Filter, u: &RequestUser) -> Result<(), Reason> {
    if !f.roles.is_empty() && !f.roles.iter().any(|r| u.roles.contains(r)) {
        return Err("user info does not match roles".into());
    }
    if !f.cluster_roles.is_empty() && !f.cluster_roles.iter().any(|r| u.cluster_roles.contains(r)) {
        return Err("user info does not match cluster roles".into());
    }
    if f.subjects.is_empty() {
        return Ok(());
    }
    let mut ok = false;
    for s in &f.subjects {
        let hit = match s.kind.as_str() {
            "User" => wildcard::matches(&s.name, &u.username),
            "Group" => u.groups.iter().any(|g| wildcard::matches(&s.name, g)),
            "ServiceAccount" => {
                let sa = format!("system:serviceaccount:{}:{}", s.namespace.as_deref().unwrap_or(""), s.name);
                wildcard::matches(&sa, &u.username)
            }
            _ => false,
        };
        if hit {
            ok = true;
        }
    }
    if ok { Ok(()) } else { Err("user info does not match subjects".into()) }
}

impl Description {
    fn matches(&self, i: &MatchInput) -> Result<(), Reason> {
        if !self.kinds.is_empty() && !self.kinds.iter().any(|k| k.matches(i.group, i.version, i.kind, i.subresource)) {
            return Err("kind does not match".into());
        }
        if !self.names.is_empty() && !self.names.iter().any(|n| wildcard::matches(n, i.name)) {
            return Err("name does not match".into());
        }
        if !self.namespaces.is_empty() {
            let ns = if i.kind == "Namespace" { i.name } else { i.namespace };
            if !self.namespaces.iter().any(|n| wildcard::matches(n, ns)) {
                return Err(format!("namespace {ns} does not match").into());
            }
        }
        if !self.annotations.is_empty() {
            let ann = i.annotations;
            let ok = self.annotations.iter().all(|(k, v)| {
                ann.is_some_and(|a| {
                    a.iter().any(|(rk, rv)| {
                        wildcard::matches(k, rk) && rv.as_str().is_some_and(|rv| wildcard::matches(v, rv))
                    })
                })
            });
            if !ok {
                return Err("annotations do not match".into());
            }
        }
        if let Some(sel) = &self.selector {
            let labels = string_map(i.labels);
            if !selector_matches(sel, &labels, true) {
                return Err("selector does not match".into());
            }
        }
        if let Some(sel) = &self.namespace_selector {
            if i.kind == "Namespace" {
                return Err("namespaceSelector does not apply to Namespaces".into());
            }
            let empty = BTreeMap::new();
            let labels = i.namespace_labels.unwrap_or(&empty);
            if !selector_matches(sel, labels, false) {
                return Err("namespaceSelector does not match".into());
            }
        }
        let op = i.operation.as_str();
        if !self.operations.is_empty() && !self.operations.iter().any(|o| o.eq_ignore_ascii_case(op)) {
            return Err(format!("operation {op} does not match").into());
        }
        Ok(())
    }
}

/// An object's `metadata.labels` as strings (for selectors).
pub fn labels_of(obj: &serde_json::Value) -> BTreeMap<String, String> {
    string_map(obj.pointer("/metadata/labels").and_then(serde_json::Value::as_object))
}

/// The string entries of a JSON map (labels as selectors see them).
pub fn string_map(m: Option<&serde_json::Map<String, serde_json::Value>>) -> BTreeMap<String, String> {
    m.map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
        .unwrap_or_default()
}

/// Label selector matching; `wildcards` enables Kyverno's wildcard keys/values in matchLabels.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>, wildcards: bool) -> bool {
    if let Some(ml) = &sel.match_labels {
        for (k, v) in ml {
            let ok = if wildcards && (wildcard::has_wildcard(k) || wildcard::has_wildcard(v)) {
                labels.iter().any(|(lk, lv)| wildcard::matches(k, lk) && wildcard::matches(v, lv))
            } else {
                labels.get(k) == Some(v)
            };
            if !ok {
                return false;
            }
        }
    }
    if let Some(exprs) = &sel.match_expressions {
        for e in exprs {
            let present = labels.get(&e.key);
            let ok = match e.operator.as_str() {
                "In" => present.is_some_and(|v| e.values.contains(v)),
                "NotIn" => present.is_none_or(|v| !e.values.contains(v)),
                "Exists" => present.is_some(),
                "DoesNotExist" => present.is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn plurals_are_recognised_without_building_them() {
        let kinds =
            ["Pod", "NetworkPolicy", "Ingress", "Gateway", "Mesh", "Batch", "Box", "Key", "CRD", "Ä", "x", "y", ""];
        let tries = |k: &str| {
            let p = super::plural(k);
            vec![
                p.clone(),
                p.to_uppercase(),
                format!("{p}s"),
                p[..p.len().saturating_sub(1)].to_string(),
                k.to_string(),
            ]
        };
        for k in kinds {
            for r in tries(k) {
                assert_eq!(super::is_plural_of(&r, k), super::plural(k) == r, "{k} / {r}");
            }
        }
    }

    use super::*;

    #[test]
    fn kind_selector_grammar() {
        let m = |s: &str, g: &str, v: &str, k: &str, sub: &str| KindSelector::parse(s).matches(g, v, k, sub);
        assert!(m("Pod", "", "v1", "Pod", ""));
        assert!(!m("Pod", "", "v1", "Pod", "status"));
        assert!(m("Pod", "", "v1", "Pod", "ephemeralcontainers"));
        assert!(m("apps/v1/Deployment", "apps", "v1", "Deployment", ""));
        assert!(!m("apps/v1/Deployment", "extensions", "v1", "Deployment", ""));
        assert!(m("v1/Pod", "", "v1", "Pod", ""));
        assert!(m("Pod/exec", "", "v1", "Pod", "exec"));
        assert!(m("Pod.exec", "", "v1", "Pod", "exec"));
        assert!(m("*/*", "", "v1", "Pod", "status"));
        assert!(m("*", "", "v1", "Pod", ""));
        assert!(m("networking.k8s.io/v1/NetworkPolicy", "networking.k8s.io", "v1", "NetworkPolicy", ""));
    }

    #[test]
    fn selectors_with_wildcards() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web*".to_string())].into()),
            match_expressions: None,
        };
        let labels: BTreeMap<String, String> = [("app".to_string(), "web-1".to_string())].into();
        assert!(selector_matches(&sel, &labels, true));
        assert!(!selector_matches(&sel, &BTreeMap::new(), true));
    }

    fn compiled(m: &serde_json::Value) -> Matcher {
        let resources: MatchResources = serde_json::from_value(m.clone()).unwrap_or_else(|e| panic!("{m}: {e}"));
        Matcher::compile(&resources, "match").unwrap_or_else(|e| panic!("{m}: {e}"))
    }

    /// A request of `(group, version, kind, subresource)` named `x` in namespace `d`.
    fn input<'a>(
        (group, version, kind, subresource): (&'a str, &'a str, &'a str, &'a str),
        user: Option<&'a RequestUser>,
    ) -> MatchInput<'a> {
        MatchInput {
            group,
            version,
            kind,
            subresource,
            name: "x",
            namespace: "d",
            labels: None,
            annotations: None,
            operation: verno_api::Operation::Create,
            namespace_labels: None,
            user,
        }
    }

    /// The kind gate rules out only requests the matcher refuses, and rules out those whose
    /// kind no filter of an `any` list names exactly.
    #[test]
    fn the_kind_gate_rules_out_only_what_the_matcher_refuses() {
        let matchers = [
            serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}}]}),
            serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}}, {"resources": {"kinds": ["apps/v1/Deployment", "Job"]}}]}),
            serde_json::json!({"any": [{"resources": {"kinds": ["Pod/status"]}}]}),
            serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}}, {"resources": {"names": ["x"]}}]}),
            serde_json::json!({"any": [{"resources": {"kinds": ["P*"]}}]}),
            serde_json::json!({"any": [{"resources": {"kinds": ["*/*"]}}]}),
            serde_json::json!({"all": [{"resources": {"kinds": ["Pod"]}}]}),
            serde_json::json!({"resources": {"kinds": ["Pod"], "namespaces": ["d"]}}),
            serde_json::json!({"any": []}),
        ];
        // (group, version, kind, subresource)
        let requests = [
            ("", "v1", "Pod", ""),
            ("", "v1", "Pod", "status"),
            ("apps", "v1", "Deployment", ""),
            ("extensions", "v1beta1", "Deployment", ""),
            ("batch", "v1", "Job", ""),
            ("", "v1", "Service", ""),
            ("", "v1", "pod", ""),
        ];
        let mut ruled_out = 0;
        for m in &matchers {
            let matcher = compiled(m);
            for request in requests {
                let (_, _, kind, subresource) = request;
                if matcher.rules_out_kind(kind) {
                    ruled_out += 1;
                    assert!(
                        matcher.matches(&input(request, None)).is_err(),
                        "{m} ruled {kind}/{subresource} out but matches it"
                    );
                }
            }
        }
        // `Pod`-only matchers rule out the other kinds; wildcards, `all`, kindless filters never.
        let first = compiled(&matchers[0]);
        assert!(first.rules_out_kind("Service") && first.rules_out_kind("pod") && !first.rules_out_kind("Pod"));
        // Pod: 5 of the 7 requests; Pod, Deployment, Job: 2; Pod/status: 5; the legacy form: 5;
        // an empty `any`: all 7.
        assert_eq!(ruled_out, 5 + 2 + 5 + 5 + 7, "rulings");
    }

    /// A matcher whose `any` list names only bare kinds answers from its kinds as its filters
    /// would, and only such a matcher takes that way.
    #[test]
    fn a_match_by_kind_names_alone_agrees_with_the_filters() {
        let matchers = [
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}}]}), true),
            (
                serde_json::json!({"any": [{"resources": {"kinds": ["Pod", "Job"]}}, {"resources": {"kinds": ["Service"]}}]}),
                true,
            ),
            (serde_json::json!({"resources": {"kinds": ["Pod"]}}), true),
            (serde_json::json!({"any": [{"resources": {"kinds": ["apps/v1/Deployment"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["v1/Pod"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod/status"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod"], "names": ["y"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["e"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod"], "operations": ["DELETE"]}}]}), false),
            (
                serde_json::json!({"any": [{"resources": {"kinds": ["Pod"], "selector": {"matchLabels": {"a": "b"}}}}]}),
                false,
            ),
            (
                serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}, "subjects": [{"kind": "User", "name": "z"}]}]}),
                false,
            ),
            (serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]}}, {"resources": {"names": ["x"]}}]}), false),
            (serde_json::json!({"any": [{"resources": {"kinds": ["P*"]}}]}), false),
            (serde_json::json!({"all": [{"resources": {"kinds": ["Pod"]}}]}), false),
            (serde_json::json!({"any": []}), false),
        ];
        // (group, version, kind, subresource)
        let requests = [
            ("", "v1", "Pod", ""),
            ("", "v1", "Pod", "status"),
            ("", "v1", "Pod", "ephemeralcontainers"),
            ("apps", "v1", "Deployment", ""),
            ("batch", "v1", "Job", ""),
            ("", "v1", "Service", ""),
            ("", "v1", "Job", "ephemeralcontainers"),
            ("", "v1", "pod", ""),
        ];
        let user = RequestUser { username: "someone".into(), ..RequestUser::default() };
        for (m, only_kinds) in &matchers {
            let matcher = compiled(m);
            assert_eq!(matcher.only_kinds, *only_kinds, "{m}");
            for request in requests {
                let (_, _, kind, subresource) = request;
                let input = input(request, Some(&user));
                assert_eq!(matcher.matches(&input), matcher.matches_by_filters(&input), "{m} on {kind}/{subresource}");
            }
        }
    }

    /// A false deny: within one match block, `subjects`, `roles` and `clusterRoles`
    /// must each hold, as in Kyverno; a subject without the named cluster role is not matched.
    #[test]
    fn user_criteria_of_one_block_must_all_hold() {
        let m = compiled(&serde_json::json!({"any": [{"resources": {"kinds": ["Pod"]},
            "subjects": [{"kind": "Group", "name": "devs"}], "clusterRoles": ["restricted"]}]}));
        let dev = RequestUser { username: "ann".into(), groups: vec!["devs".into()], ..RequestUser::default() };
        assert!(m.matches(&input(("", "v1", "Pod", ""), Some(&dev))).is_err());
        let restricted = RequestUser { cluster_roles: vec!["restricted".into()], ..dev.clone() };
        assert!(m.matches(&input(("", "v1", "Pod", ""), Some(&restricted))).is_ok());
        let other = RequestUser { groups: vec!["ops".into()], ..restricted };
        assert!(m.matches(&input(("", "v1", "Pod", ""), Some(&other))).is_err());
    }
}
