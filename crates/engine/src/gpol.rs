//! GeneratingPolicy and NamespacedGeneratingPolicy (`policies.kyverno.io`): CEL generation.
//!
//! A policy's `generate` entries are CEL expressions that call `generator.Apply(namespace,
//! [objects])` (the namespaced kind: `generator.Apply([objects])`) or YAML templates with
//! `(( expr ))` placeholders. They compile into the same [`CompiledPolicy`] as ClusterPolicies:
//! one generate rule named `""` whose match is `matchConstraints`, with `matchConditions` as CEL
//! preconditions. Evaluation collects the objects `generator.Apply` receives (through a host that
//! wraps the caller's, so `resource.*` keeps working) and returns them, with Kyverno's labels,
//! in the rule response: creating them in a cluster is the background controller's job.

use crate::cel_kind::{Shape, cel_policy, constraints, policy_name};
use crate::decode::{decode, json_of};
use crate::error::CompileError;
use crate::forms::{CelGenerate, CompiledCelGeneration, Segment, Tpl};
use crate::forms::{CompiledGeneration, GenerateSource, GenerateTarget};
use crate::matching::Matcher;
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::policy::{
    CompiledPolicy, CompiledRule, RuleBody, cel_expr, compile_cel_preconditions, compile_cel_variables,
};
use serde_json::{Map, Value};
use std::sync::{Arc, Mutex};
use verno_api::cel;
use verno_cel::{Host, HostError};

/// Why a GeneratingPolicy's `(( expr ))` template does not compile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlaceholderError {
    #[error("empty placeholder at offset {0}")]
    Empty(usize),
    #[error("unbalanced parenthesis in placeholder starting at offset {0}")]
    Unbalanced(usize),
    #[error("unterminated string literal in placeholder starting at offset {0}")]
    UnterminatedString(usize),
    #[error("unterminated placeholder starting at offset {0}: missing closing '))'")]
    Unterminated(usize),
    #[error(
        "placeholders are not supported in mapping keys ({0:?}); use a whole-value placeholder on the parent field instead (e.g. `labels: (( variables.labels ))`)"
    )]
    InKey(String),
    /// The expression inside does not compile; `message`: the CEL compiler's.
    #[error("placeholder {expr:?}: {message}")]
    Cel { expr: String, message: String },
}

/// Why a compiled template could not be rendered, with where in the document.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    /// `message`: the CEL evaluation error.
    #[error("failed to evaluate placeholder {expr:?}: {message}")]
    Eval { expr: String, message: String },
    #[error(
        "placeholder {0:?} embedded in a string must evaluate to a scalar; use a whole-value placeholder for structured results"
    )]
    NotAScalar(String),
    #[error("field {0:?}: {1}")]
    Field(String, Box<RenderError>),
    #[error("item {0}: {1}")]
    Item(usize, Box<RenderError>),
}

/// Splits a string into text and `(( expr ))` placeholders; `\((` is a literal `((`. Quotes and
/// nested parentheses inside a placeholder are skipped over, as Kyverno's scanner does.
fn scan(s: &str) -> Result<Vec<(bool, String)>, PlaceholderError> {
    let b = s.as_bytes();
    let mut out: Vec<(bool, String)> = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < b.len() {
        if s.get(i..).is_some_and(|r| r.starts_with("\\((")) {
            text.push_str("((");
            i += 3;
            continue;
        }
        if s.get(i..).is_some_and(|r| r.starts_with("((")) {
            let (expr, next) = placeholder(s, i)?;
            if !text.is_empty() {
                out.push((false, std::mem::take(&mut text)));
            }
            out.push((true, expr));
            i = next;
            continue;
        }
        let ch = s.get(i..).and_then(|r| r.chars().next()).unwrap_or('\u{fffd}');
        text.push(ch);
        i += ch.len_utf8().max(1);
    }
    if !text.is_empty() {
        out.push((false, text));
    }
    Ok(out)
}

fn placeholder(s: &str, start: usize) -> Result<(String, usize), PlaceholderError> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = start + 2;
    while let Some(&c) = b.get(i) {
        if let Some(q) = quote {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' | b'\'' => quote = Some(c),
            b'(' => depth += 1,
            b')' if depth > 0 => depth -= 1,
            b')' if b.get(i + 1) == Some(&b')') => {
                let expr = s.get(start + 2..i).unwrap_or("").trim().to_string();
                if expr.is_empty() {
                    return Err(PlaceholderError::Empty(start));
                }
                return Ok((expr, i + 2));
            }
            b')' => return Err(PlaceholderError::Unbalanced(start)),
            _ => {}
        }
        i += 1;
    }
    if quote.is_some() {
        return Err(PlaceholderError::UnterminatedString(start));
    }
    Err(PlaceholderError::Unterminated(start))
}

fn compile_node(v: &Value, interpolate: bool) -> Result<Tpl, PlaceholderError> {
    Ok(match v {
        Value::Object(m) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, x) in m {
                if interpolate && k.contains("((") && !k.contains("\\((") {
                    return Err(PlaceholderError::InKey(k.clone()));
                }
                out.push((k.clone(), compile_node(x, interpolate)?));
            }
            Tpl::Map(out)
        }
        Value::Array(a) => Tpl::List(a.iter().map(|x| compile_node(x, interpolate)).collect::<Result<_, _>>()?),
        Value::String(s) if interpolate && s.contains("((") => {
            let segs = scan(s)?;
            let compile = |e: &str| {
                verno_cel::Expr::compile(e)
                    .map_err(|err| PlaceholderError::Cel { expr: e.to_string(), message: err.to_string() })
            };
            match segs.as_slice() {
                [(true, e)] => Tpl::Splice(compile(e)?),
                _ if segs.iter().all(|(is_expr, _)| !is_expr) => {
                    Tpl::Literal(Value::String(segs.into_iter().map(|(_, t)| t).collect()))
                }
                _ => Tpl::Interpolate(
                    segs.iter()
                        .map(
                            |(is_expr, t)| {
                                if *is_expr { compile(t).map(Segment::Expr) } else { Ok(Segment::Text(t.clone())) }
                            },
                        )
                        .collect::<Result<_, _>>()?,
                ),
            }
        }
        other => Tpl::Literal(other.clone()),
    })
}

fn render(t: &Tpl, vars: &verno_cel::Vars) -> Result<Value, RenderError> {
    Ok(match t {
        Tpl::Literal(v) => v.clone(),
        Tpl::Splice(e) => {
            e.eval(vars).map_err(|err| RenderError::Eval { expr: e.source().to_string(), message: err.to_string() })?
        }
        Tpl::Interpolate(segs) => {
            let mut s = String::new();
            for seg in segs {
                match seg {
                    Segment::Text(t) => s.push_str(t),
                    Segment::Expr(e) => match e
                        .eval(vars)
                        .map_err(|err| RenderError::Eval { expr: e.source().to_string(), message: err.to_string() })?
                    {
                        Value::String(x) => s.push_str(&x),
                        Value::Null => s.push_str("null"),
                        v @ (Value::Bool(_) | Value::Number(_)) => s.push_str(&v.to_string()),
                        _ => {
                            return Err(RenderError::NotAScalar(e.source().to_string()));
                        }
                    },
                }
            }
            Value::String(s)
        }
        Tpl::Map(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                out.insert(k.clone(), render(x, vars).map_err(|e| RenderError::Field(k.clone(), Box::new(e)))?);
            }
            Value::Object(out)
        }
        Tpl::List(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| render(x, vars).map_err(|e| RenderError::Item(i, Box::new(e))))
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn compile_template(t: &cel::GenerationTemplate, path: &str) -> Result<Vec<Tpl>, CompileError> {
    let path = format!("{path}.value");
    let interpolate = match t.interpolate.as_deref() {
        None | Some("") | Some("None") | Some("none") => false,
        Some("cel") | Some("CEL") => true,
        Some(other) => {
            return Err(CompileError::new(
                path.trim_end_matches(".value").to_string() + ".interpolate",
                format!("unknown interpolation mode {other:?}: expected cel"),
            ));
        }
    };
    let docs = verno_jmespath::yaml::parse_all(&t.value)
        .map_err(|e| CompileError::new(&path, format!("failed to parse YAML: {e}")))?;
    let mut out = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        if d.is_null() {
            continue;
        }
        if !d.is_object() {
            return Err(CompileError::new(
                &path,
                format!("document {}: document must be a mapping describing a resource", i + 1),
            ));
        }
        out.push(
            compile_node(d, interpolate).map_err(|e| CompileError::new(&path, format!("document {}: {e}", i + 1)))?,
        );
    }
    if out.is_empty() {
        return Err(CompileError::new(&path, "template must contain at least one YAML document"));
    }
    Ok(out)
}

/// Compiles a GeneratingPolicy or NamespacedGeneratingPolicy document.
/// Kyverno declares `generator.Apply(namespace, list)` for GeneratingPolicy and
/// `generator.Apply(list)` for NamespacedGeneratingPolicy; the other form does not type-check.
fn apply_arity(kind: verno_api::Kind, expr: &verno_cel::Expr, path: &str) -> Result<(), CompileError> {
    let want = if kind == verno_api::Kind::NamespacedGeneratingPolicy { 1 } else { 2 };
    match expr.generator_apply_arities().into_iter().find(|n| *n != want) {
        Some(n) => Err(CompileError::new(
            path,
            format!(
                "compilation failed: generator.Apply takes {want} argument{} in a {}, not {n}",
                if want == 1 { "" } else { "s" },
                kind.name()
            ),
        )),
        None => Ok(()),
    }
}

pub fn compile_generating_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    policy_name(doc)?;
    let kind = match verno_api::Kind::of_document(doc) {
        Some(verno_api::Kind::NamespacedGeneratingPolicy) => verno_api::Kind::NamespacedGeneratingPolicy,
        _ => verno_api::Kind::GeneratingPolicy,
    };
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let base = constraints(spec.match_constraints.as_ref());
    if base.rules.is_empty() {
        return Err(crate::policy::missing_match_constraints());
    }
    let variables = compile_cel_variables(Some(&json_of(&spec.variables)), "spec")?;
    for (i, (_, e)) in variables.iter().enumerate() {
        apply_arity(kind, e, &format!("spec.variables[{i}].expression"))?;
    }
    let mut generate = Vec::new();
    for (i, g) in spec.generate.iter().enumerate() {
        let p = format!("spec.generate[{i}]");
        generate.push(match (&g.expression, &g.template) {
            (Some(e), None) => {
                let path = format!("{p}.expression");
                let expr = cel_expr(Some(e), &path)?;
                // Kyverno declares `generator.Apply(namespace, list)` for GeneratingPolicy and
                // `generator.Apply(list)` for NamespacedGeneratingPolicy; the other form does
                // not type-check there.
                apply_arity(kind, &expr, &path)?;
                CelGenerate::Expression(expr)
            }
            (None, Some(t)) => CelGenerate::Template(compile_template(t, &format!("{p}.template"))?),
            _ => return Err(CompileError::new(p, "exactly one of expression and template is required")),
        });
    }
    if generate.is_empty() {
        return Err(CompileError::new("spec.generate", "at least one generate entry is required"));
    }
    let on = |s: Option<&cel::Switch>| s.and_then(|s| s.enabled).unwrap_or(false);
    let eval = spec.evaluation.clone().unwrap_or_default();
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let rule = CompiledRule {
        name: String::new(),
        autogen_of: None,
        matcher: Matcher::constraints(base),
        exclude: None,
        context: Vec::new(),
        preconditions: None,
        cel_preconditions: compile_cel_preconditions(&conditions, "spec.matchConditions")?,
        report_properties: Vec::new(),
        body: RuleBody::Generate(Box::new(CompiledGeneration {
            target: GenerateTarget {
                api_version: None,
                kind: None,
                name: None,
                namespace: None,
                source: GenerateSource::None,
            },
            synchronize: on(eval.synchronize.as_ref()),
            orphan_downstream: on(eval.orphan_downstream_on_policy_delete.as_ref()),
            generate_existing: on(eval.generate_existing.as_ref()),
            generate_existing_set: true,
            foreach: Vec::new(),
            cel: Some(Box::new(CompiledCelGeneration {
                variables,
                generate,
                audit_annotations: crate::policy::compile_audit_annotations(spec.audit_annotations.as_ref(), "spec")?,
                use_server_side_apply: spec.use_server_side_apply.or(eval.use_server_side_apply).unwrap_or(false),
            })),
        })),
    };
    cel_policy(doc, kind, Shape::audit(false), vec![rule])
}

/// The host during a generation: the caller's host for everything else, and a collector for
/// `generator.Apply`.
struct Collector {
    inner: Option<Arc<dyn Host>>,
    out: Mutex<Vec<(Option<String>, Value)>>,
    /// What `resource.Get/List` read: (apiVersion, plural resource, namespace, name — empty
    /// for a list); the cluster controller follows these sources.
    reads: Mutex<Vec<(String, String, String, String)>>,
}

impl Collector {
    fn read(&self, a: &str, r: &str, ns: &str, n: &str) {
        if let Ok(mut reads) = self.reads.lock()
            && reads.len() < 256
        {
            let entry = (a.to_string(), r.to_string(), ns.to_string(), n.to_string());
            if !reads.contains(&entry) {
                reads.push(entry);
            }
        }
    }
}

impl Host for Collector {
    fn confined_to(&self) -> Option<&str> {
        self.inner.as_deref().and_then(Host::confined_to)
    }
    fn resource_get(&self, a: &str, r: &str, ns: &str, n: &str) -> Result<Value, HostError> {
        self.read(a, r, ns, n);
        match &self.inner {
            Some(h) => h.resource_get(a, r, ns, n),
            None => Err(HostError::Unavailable("resource.Get is not available here (no cluster)".into())),
        }
    }
    fn resource_list(&self, a: &str, r: &str, ns: &str) -> Result<Vec<Value>, HostError> {
        self.read(a, r, ns, "");
        match &self.inner {
            Some(h) => h.resource_list(a, r, ns),
            None => Err(HostError::Unavailable("resource.List is not available here (no cluster)".into())),
        }
    }
    fn to_gvr(&self, a: &str, k: &str) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.to_gvr(a, k),
            None => NoHost.to_gvr(a, k),
        }
    }
    fn http(&self, call: &verno_cel::HttpCall<'_>) -> Result<Value, HostError> {
        self.inner.as_ref().map_or_else(|| NoHost.http(call), |h| h.http(call))
    }
    fn global_context(&self, n: &str, p: &str) -> Result<Value, HostError> {
        self.inner.as_ref().map_or_else(|| NoHost.global_context(n, p), |h| h.global_context(n, p))
    }
    fn image_metadata(&self, r: &str) -> Result<Value, HostError> {
        self.inner.as_ref().map_or_else(|| NoHost.image_metadata(r), |h| h.image_metadata(r))
    }
    fn authorize(&self, r: &Value) -> Result<Value, HostError> {
        self.inner.as_ref().map_or_else(|| NoHost.authorize(r), |h| h.authorize(r))
    }
    fn now(&self) -> Option<i64> {
        self.inner.as_ref().and_then(|h| h.now())
    }
    fn random_seed(&self) -> Option<u64> {
        self.inner.as_ref().and_then(|h| h.random_seed())
    }
    fn generate(&self, namespace: Option<&str>, resources: Vec<Value>) -> Result<(), HostError> {
        let mut out = self.out.lock().map_err(|_| HostError::Failed("generator state poisoned".into()))?;
        // Bounded: a runaway expression cannot make the engine hold an unbounded list.
        if out.len() + resources.len() > MAX_GENERATED {
            return Err(HostError::Failed(format!(
                "a policy may generate at most {MAX_GENERATED} objects per trigger"
            )));
        }
        out.extend(resources.into_iter().map(|r| (namespace.map(str::to_string), r)));
        Ok(())
    }
}

/// The most objects one evaluation may generate (list items counted one by one later).
const MAX_GENERATED: usize = 10_000;

struct NoHost;
impl Host for NoHost {}

pub use crate::ports::cluster_scoped;

/// Whether a kind's scope is known without asking the cluster: `Some(true)` cluster-scoped,
/// `Some(false)` namespaced (a kind of a group whose cluster-scoped kinds [`cluster_scoped`]
/// lists in full), `None` for any other group (a custom resource: only discovery knows, and a
/// policy must not be refused on a guess).
pub fn known_scope(api_version: &str, kind: &str) -> Option<bool> {
    if cluster_scoped(api_version, kind) {
        return Some(true);
    }
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    const FULLY_LISTED: &[&str] = &[
        "",
        "apps",
        "batch",
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "policy",
        "autoscaling",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "kyverno.io",
        "policies.kyverno.io",
    ];
    FULLY_LISTED.contains(&group).then_some(false)
}

/// Runs a GeneratingPolicy's generate entries for `trigger`.
pub(crate) fn generate(
    g: &CompiledGeneration,
    c: &CompiledCelGeneration,
    policy: &CompiledPolicy,
    trigger: &Value,
    ctx: &crate::context::Context,
    data: &dyn crate::ports::Data,
) -> RuleResponse {
    let collector =
        Arc::new(Collector { inner: data.cel_host(), out: Mutex::new(Vec::new()), reads: Mutex::new(Vec::new()) });
    let resp = |status: Status, msg: String| {
        let mut r = RuleResponse::new("", RuleType::Generation, status, msg);
        r.extra_mut().clone_sources = collector.reads.lock().map(|r| r.clone()).unwrap_or_default();
        r
    };
    let mut vars = match crate::cel_env::cel_env(ctx, data, None, &[]) {
        Ok(v) => v,
        Err(e) => return resp(Status::Error, e),
    };
    vars.set_host(collector.clone());
    for (name, e) in &c.variables {
        let _ = e.eval_into_variable(name, &mut vars);
    }
    let policy_ns = if policy.kind.is_namespaced() { policy.namespace.clone() } else { None };
    for entry in &c.generate {
        match entry {
            CelGenerate::Expression(e) => {
                if let Err(err) = e.eval(&vars) {
                    return resp(Status::Error, format!("failed to evaluate policy: {err}"));
                }
            }
            CelGenerate::Template(docs) => {
                let mut grouped: Vec<(Option<String>, Value)> = Vec::new();
                for (i, d) in docs.iter().enumerate() {
                    let obj = match render(d, &vars) {
                        Ok(o) => o,
                        Err(e) => {
                            return resp(
                                Status::Error,
                                format!(
                                    "failed to evaluate policy: failed to render generation template: document {}: {e}",
                                    i + 1
                                ),
                            );
                        }
                    };
                    let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
                    let ns = match &policy_ns {
                        Some(p) if ns.is_empty() => p.clone(),
                        Some(p) if &ns != p => {
                            return resp(
                                Status::Error,
                                format!(
                                    "failed to evaluate policy: cross-namespace generation denied: a policy in namespace {p:?} cannot generate resources into namespace {ns:?}"
                                ),
                            );
                        }
                        _ => ns,
                    };
                    grouped.push((Some(ns), obj));
                }
                match collector.out.lock() {
                    Ok(mut out) => out.extend(grouped),
                    Err(_) => return resp(Status::Error, "generator state poisoned".into()),
                }
            }
        }
    }
    let collected = match collector.out.lock() {
        Ok(mut out) => std::mem::take(&mut *out),
        Err(_) => return resp(Status::Error, "generator state poisoned".into()),
    };
    let mut objects = Vec::new();
    for (ns, obj) in collected {
        // The namespaced form names no namespace: the policy's own.
        let ns = ns.or_else(|| policy_ns.clone()).unwrap_or_default();
        let items = match obj {
            Value::Object(mut m) if m.get("items").is_some_and(Value::is_array) => match m.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            other => vec![other],
        };
        for item in items {
            match downstream(item, &ns, policy, trigger, data) {
                Ok(o) => objects.push(o),
                Err(e) => {
                    return resp(
                        Status::Error,
                        format!("failed to evaluate policy: failed to generate resources: {e}"),
                    );
                }
            }
            if objects.len() > MAX_GENERATED {
                return resp(
                    Status::Error,
                    format!("a policy may generate at most {MAX_GENERATED} objects per trigger"),
                );
            }
        }
    }
    let props = match crate::policy::audit_annotation_values(&c.audit_annotations, &vars) {
        Ok(p) => p,
        Err(e) => return resp(Status::Error, e),
    };
    let mut r = resp(Status::Pass, "policy evaluated successfully".into());
    r.extra_mut().properties = props;
    r.extra_mut().generated = objects;
    r.synchronize = g.synchronize;
    r.orphan_downstream = g.orphan_downstream;
    r
}

/// One object as Kyverno generates it: placed in `namespace` (none for cluster-scoped kinds),
/// the server's metadata dropped, owner references dropped when it comes from another
/// namespace, Kyverno's labels added.
fn downstream(
    item: Value,
    namespace: &str,
    policy: &CompiledPolicy,
    trigger: &Value,
    data: &dyn crate::ports::Data,
) -> Result<Value, String> {
    let Value::Object(mut obj) = item else {
        return Err("a generated resource must be an object".into());
    };
    let s = |o: &Map<String, Value>, p: &str| o.get(p).and_then(Value::as_str).unwrap_or("").to_string();
    let (api_version, kind) = (s(&obj, "apiVersion"), s(&obj, "kind"));
    if api_version.is_empty() || kind.is_empty() {
        return Err("a generated resource needs apiVersion and kind".into());
    }
    let mut target_ns = namespace.to_string();
    if !data.is_namespaced(&api_version, &kind) {
        if !namespace.is_empty() && policy.kind.is_namespaced() {
            return Err(format!(
                "cross-scope generation denied: a policy scoped to namespace {namespace:?} cannot generate cluster-scoped resource {api_version}/{kind}"
            ));
        }
        target_ns.clear();
    }
    obj.remove("status");
    let meta = obj.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    let Some(meta) = meta.as_object_mut() else { return Err("metadata must be an object".into()) };
    let source_ns = s(meta, "namespace");
    if !source_ns.is_empty() && source_ns != target_ns {
        meta.remove("ownerReferences");
    }
    let source_uid = if s(meta, "resourceVersion").is_empty() { None } else { Some(s(meta, "uid")) };
    for f in ["uid", "selfLink", "creationTimestamp", "managedFields", "resourceVersion", "generation"] {
        meta.remove(f);
    }
    if target_ns.is_empty() {
        meta.remove("namespace");
    } else {
        meta.insert("namespace".into(), Value::String(target_ns));
    }
    let labels = meta.entry("labels").or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    if let Some(l) = labels.as_object_mut() {
        let t = |p: &str| trigger.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        let av = t("/apiVersion");
        let (group, version) = av.rsplit_once('/').map_or((String::new(), av.clone()), |(g, v)| (g.into(), v.into()));
        let mut put = |k: &str, v: String| {
            l.insert(k.into(), Value::String(v));
        };
        put("app.kubernetes.io/managed-by", "kyverno".into());
        put("generate.kyverno.io/policy-name", policy.name.clone());
        if policy.kind.is_namespaced() {
            put("generate.kyverno.io/policy-namespace", policy.namespace.clone().unwrap_or_default());
        }
        // No `trigger-name`, as Kyverno writes none (a label value holds 63 characters).
        put("generate.kyverno.io/trigger-namespace", t("/metadata/namespace"));
        put("generate.kyverno.io/trigger-uid", t("/metadata/uid"));
        put("generate.kyverno.io/trigger-kind", t("/kind"));
        put("generate.kyverno.io/trigger-group", group);
        put("generate.kyverno.io/trigger-version", version);
        if let Some(uid) = source_uid {
            put("generate.kyverno.io/source-uid", uid);
        }
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_scanner_splits_placeholders_and_keeps_escapes() {
        let segs = scan("a-(( variables.x + ')' ))-b \\((c").expect("scans");
        assert_eq!(segs, vec![(false, "a-".into()), (true, "variables.x + ')'".into()), (false, "-b ((c".into())]);
        assert_eq!(scan("(( x ").unwrap_err(), PlaceholderError::Unterminated(0));
        assert_eq!(scan("(( ))").unwrap_err(), PlaceholderError::Empty(0));
    }

    fn run_policy(doc: Value, trigger: Value) -> RuleResponse {
        let p = compile_generating_policy(&doc).expect("compiles");
        let set = crate::PolicySet::new(vec![Arc::new(p)], Vec::new());
        let req = crate::Request::new(crate::Operation::Create, &trigger);
        let out = set.evaluate(&req, crate::Scope::ALL, &verno_jmespath::NoEnv, &crate::NoData, &mut ());
        out.responses.into_iter().flat_map(|(_, r)| r.rules).next().expect("a rule response")
    }

    #[test]
    fn generator_apply_places_objects_and_labels_them_as_kyverno() {
        let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "GeneratingPolicy", "metadata": {"name": "g"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["namespaces"]}]},
                "generate": [{"expression": "generator.Apply(object.metadata.name, [{'apiVersion': dyn('v1'), 'kind': dyn('ConfigMap'), 'metadata': dyn({'name': 'cm', 'namespace': 'elsewhere', 'ownerReferences': [{'uid': 'x'}]})}, {'apiVersion': dyn('rbac.authorization.k8s.io/v1'), 'kind': dyn('ClusterRole'), 'metadata': dyn({'name': 'role'})}])"}]}});
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "uid": "u-1"}});
        let r = run_policy(doc, ns);
        assert_eq!(r.status, Status::Pass, "{}", r.message);
        let cm = &r.generated()[0];
        // Into the namespace given to Apply; owner references from another namespace dropped.
        assert_eq!(cm["metadata"]["namespace"], "team");
        assert!(cm["metadata"].get("ownerReferences").is_none());
        assert_eq!(cm["metadata"]["labels"]["generate.kyverno.io/trigger-uid"], "u-1");
        assert_eq!(cm["metadata"]["labels"]["generate.kyverno.io/policy-name"], "g");
        // A cluster-scoped kind gets no namespace.
        assert!(r.generated()[1]["metadata"].get("namespace").is_none());
    }

    #[test]
    fn generator_apply_arity_follows_the_kind() {
        let doc = |kind: &str, expr: &str| {
            json!({"apiVersion": "policies.kyverno.io/v1", "kind": kind, "metadata": {"name": "g", "namespace": "team"},
                "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
                    "variables": [{"name": "objs", "expression": "[{'kind': dyn('ConfigMap')}]"}],
                    "generate": [{"expression": expr}]}})
        };
        let one = "generator.apply(variables.objs)";
        let two = "generator.Apply('ns', variables.objs)";
        let e = compile_generating_policy(&doc("GeneratingPolicy", one)).expect_err("one argument is refused");
        assert_eq!(e.path, "spec.generate[0].expression");
        assert!(e.message.contains("takes 2 arguments in a GeneratingPolicy, not 1"), "{}", e.message);
        assert!(compile_generating_policy(&doc("GeneratingPolicy", two)).is_ok());
        assert!(compile_generating_policy(&doc("NamespacedGeneratingPolicy", one)).is_ok());
        let e = compile_generating_policy(&doc("NamespacedGeneratingPolicy", two)).expect_err("two are refused");
        assert!(e.message.contains("takes 1 argument in a NamespacedGeneratingPolicy, not 2"), "{}", e.message);
    }

    #[test]
    fn a_failing_generate_expression_is_an_error_result() {
        let doc = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "GeneratingPolicy", "metadata": {"name": "g"},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["namespaces"]}]},
                "generate": [{"expression": "generator.Apply('x', [{'apiVersion': dyn('v1'), 'kind': dyn('ConfigMap'), 'metadata': dyn({'name': object.metadata.uid})}])"}]}});
        let r = run_policy(doc, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
        assert_eq!(r.status, Status::Error);
        assert!(r.message.starts_with("failed to evaluate policy:"), "{}", r.message);
        assert!(r.generated().is_empty());
    }

    #[test]
    fn templates_splice_whole_values_and_interpolate_strings() {
        let t = cel::GenerationTemplate {
            interpolate: Some("cel".into()),
            value: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: (( variables.n ))-cm\n  labels: (( variables.l ))\n".into(),
        };
        let docs = compile_template(&t, "spec.generate[0].template").expect("compiles");
        let mut vars = verno_cel::Vars::default();
        vars.set_variable("n", &json!("team"));
        vars.set_variable("l", &json!({"a": "b"}));
        let out = render(&docs[0], &vars).expect("renders");
        assert_eq!(out["metadata"], json!({"name": "team-cm", "labels": {"a": "b"}}));
        let bad = cel::GenerationTemplate { interpolate: Some("cel".into()), value: "metadata:\n  ((x)): y\n".into() };
        let err = compile_template(&bad, "spec.generate[0].template").expect_err("a key placeholder");
        assert!(err.to_string().contains("mapping keys"), "{err}");
    }
}
