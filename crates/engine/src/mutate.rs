//! Mutate rules: Kyverno's anchor pre-processing of strategic merge patches,
//! `patchesJson6902`, and `foreach`. The patching itself lives in [`crate::smp`]
//! and [`crate::jsonpatch`].

use crate::anchor::{self, Anchor};
use crate::condition::CompiledConditions;
use crate::context::Context;
use crate::context_entry::{CompiledContextEntry, Stop, compile_context, enter};
use crate::error::CompileError;
use crate::forms::{CompiledMutateForeach, CompiledMutation, CompiledTarget, Json6902, Patches};
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::pattern;
use crate::policy::CompiledPolicy;
use crate::ports::Data;
use crate::template::{Query, tv};
use serde_json::{Map, Value};

/// Why a patch with anchors does not apply.
#[derive(Debug, Clone, PartialEq)]
pub enum PreError {
    /// A `(key)` condition failed: the patch (or a list element) is skipped.
    Condition(String),
    /// A `<(key)` global condition failed: the whole rule is skipped.
    Global(String),
}

fn has_anchor(v: &Value, pred: &dyn Fn(Anchor) -> bool) -> bool {
    match v {
        Value::Object(m) => {
            m.iter().any(|(k, x)| anchor::parse(k).is_some_and(|(a, _)| pred(a)) || has_anchor(x, pred))
        }
        Value::Array(a) => a.iter().any(|x| has_anchor(x, pred)),
        _ => false,
    }
}

/// The pattern without `+(key)` entries (they add, they do not check).
fn without_additions(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(anchor::parse(k), Some((Anchor::AddIfNotPresent, _))))
                .map(|(k, x)| (k.clone(), without_additions(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_additions).collect()),
        other => other.clone(),
    }
}

/// What a condition's map value still adds once checked: its `+(key)` entries for keys the
/// resource lacks (conditions and plain scalars are only checks).
fn condition_residue(pattern: &Value, resource: Option<&Value>) -> Option<Value> {
    let p = pattern.as_object()?;
    let r = resource.and_then(Value::as_object);
    let mut out = Map::new();
    for (k, v) in p {
        match anchor::parse(k) {
            Some((Anchor::AddIfNotPresent, key)) => {
                if !r.is_some_and(|o| o.contains_key(key)) {
                    out.insert(key.to_string(), strip(v));
                }
            }
            Some(_) => {}
            None => {
                if let Some(x) = condition_residue(v, r.and_then(|o| o.get(k))) {
                    out.insert(k.clone(), x);
                }
            }
        }
    }
    if out.is_empty() { None } else { Some(Value::Object(out)) }
}

fn check(resource: Option<&Map<String, Value>>, key: &str, pattern_value: &Value) -> Result<(), String> {
    let Some(rv) = resource.and_then(|r| r.get(key)) else {
        return Err(format!("could not found \"{key}\" key in the resource"));
    };
    pattern::match_pattern(rv, &without_additions(pattern_value))
        .map_err(|e| if e.path.is_empty() { e.message } else { format!("{} at path {}", e.message, e.path) })
}

/// Removes anchors without a resource to check them against: conditions go, `+(k)` becomes `k`.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                match anchor::parse(k) {
                    Some((Anchor::AddIfNotPresent, key)) => {
                        out.insert(key.to_string(), strip(x));
                    }
                    Some(_) => {}
                    None => {
                        out.insert(k.clone(), strip(x));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Resolves the anchors of a strategic merge patch against the resource, giving the plain patch
/// to apply. Containers that only held anchors disappear, so they cannot clear fields.
pub fn preprocess(pattern: &Value, resource: Option<&Value>) -> Result<Value, PreError> {
    match pattern {
        Value::Object(p) => preprocess_map(p, resource),
        Value::Array(l) => preprocess_list(l, resource),
        other => Ok(other.clone()),
    }
}

fn preprocess_map(p: &Map<String, Value>, resource: Option<&Value>) -> Result<Value, PreError> {
    let r = resource.and_then(Value::as_object);
    for (k, pv) in p {
        if let Some((Anchor::Global, key)) = anchor::parse(k) {
            check(r, key, pv).map_err(PreError::Global)?;
        }
    }
    for (k, pv) in p {
        match anchor::parse(k) {
            Some((Anchor::Condition | Anchor::Existence, key)) => check(r, key, pv).map_err(PreError::Condition)?,
            Some((Anchor::Equality, key)) if r.is_some_and(|o| o.contains_key(key)) => {
                check(r, key, pv).map_err(PreError::Condition)?;
            }
            Some((Anchor::Negation, key)) if r.is_some_and(|o| o.contains_key(key)) => {
                return Err(PreError::Condition(format!("negation anchor matched in resource: {key}")));
            }
            _ => {}
        }
    }
    let mut out = Map::new();
    for (k, pv) in p {
        match anchor::parse(k) {
            Some((Anchor::AddIfNotPresent, key)) => {
                if !r.is_some_and(|o| o.contains_key(key)) {
                    out.insert(key.to_string(), strip(pv));
                }
            }
            Some((Anchor::Condition | Anchor::Equality | Anchor::Existence, key)) => {
                if let Some(x) = condition_residue(pv, r.and_then(|o| o.get(key))) {
                    out.insert(key.to_string(), x);
                }
            }
            Some(_) => {}
            None => {
                let v = preprocess(pv, r.and_then(|o| o.get(k)))?;
                if is_empty_container(&v) && !is_empty_container(pv) {
                    continue;
                }
                out.insert(k.clone(), v);
            }
        }
    }
    Ok(Value::Object(out))
}

fn preprocess_list(l: &[Value], resource: Option<&Value>) -> Result<Value, PreError> {
    if !l.first().is_some_and(Value::is_object) {
        return Ok(Value::Array(l.to_vec()));
    }
    let elements: &[Value] = resource.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    let mut added = Vec::new();
    for e in l {
        if !has_anchor(e, &|_| true) {
            out.push(e.clone());
            continue;
        }
        let global = has_anchor(e, &|a| a == Anchor::Global);
        let mut passed = false;
        let mut last_global = None;
        for re in elements {
            match preprocess(e, Some(re)) {
                Ok(v) => {
                    if global {
                        passed = true;
                        continue;
                    }
                    // Elements are correlated by name: the resource element's name is copied in.
                    let Some(name) = re.get("name").filter(|n| !n.is_null()) else { continue };
                    if let Value::Object(mut m) = v {
                        if m.is_empty() {
                            continue;
                        }
                        m.insert("name".into(), name.clone());
                        added.push(Value::Object(m));
                    }
                }
                Err(PreError::Condition(_)) => continue,
                Err(PreError::Global(m)) => last_global = Some(m),
            }
        }
        if !passed {
            if let Some(m) = last_global {
                return Err(PreError::Global(m));
            }
            if global && elements.is_empty() {
                return Err(PreError::Global("global anchor: the resource has no list to check".into()));
            }
        }
    }
    out.extend(added);
    Ok(Value::Array(out))
}

/// What applying a rule's (or a foreach element's) patches did.
pub enum Patched {
    Changed(Value),
    /// Nothing changed, with the reason.
    Unchanged(String),
    Error(String),
}

/// Renders and applies one set of patches to `resource`.
pub fn apply_patches(patches: &Patches, resource: &Value, ctx: &Context) -> Patched {
    let kind = resource.get("kind").and_then(Value::as_str).unwrap_or("");
    let mut cur = resource.clone();
    if let Some(t) = &patches.strategic_merge {
        let rendered = match t.render(ctx, "/mutate/patchStrategicMerge") {
            Ok(v) => v,
            Err(e) => return Patched::Error(format!("variable substitution failed: {e}")),
        };
        let patch = match preprocess(&rendered, Some(&cur)) {
            Ok(p) => p,
            // As Kyverno: a failed condition empties the patch, and the rule says only that
            // nothing was patched.
            Err(_) => return Patched::Unchanged("no patches applied".into()),
        };
        cur = match crate::smp::apply(&cur, &patch, kind) {
            Ok(v) => v,
            Err(e) => return Patched::Error(format!("failed to apply patchStrategicMerge: {e}")),
        };
    }
    if let Some(j) = &patches.json6902 {
        let rendered_ops;
        let ops: &[crate::jsonpatch::Op] = match j {
            Json6902::Static(ops) => ops,
            Json6902::Templated(t) => {
                let rendered = match t.render(ctx, "/mutate/patchesJson6902") {
                    Ok(v) => v,
                    Err(e) => return Patched::Error(format!("variable substitution failed: {e}")),
                };
                let doc = match verno_jmespath::yaml::parse(rendered.as_str().unwrap_or_default()) {
                    Ok(d) => d,
                    Err(e) => return Patched::Error(format!("failed to parse patchesJson6902: {e}")),
                };
                rendered_ops = match crate::jsonpatch::parse_ops(&doc) {
                    Ok(o) => o,
                    Err(e) => return Patched::Error(format!("invalid patchesJson6902: {e}")),
                };
                &rendered_ops
            }
        };
        if let Err(e) = crate::jsonpatch::apply(&mut cur, ops) {
            return Patched::Error(format!("failed to apply patchesJson6902: {e}"));
        }
    }
    if crate::equal(&cur, resource) { Patched::Unchanged("no patches applied".into()) } else { Patched::Changed(cur) }
}

pub(crate) struct Mutator<'a> {
    pub rule: &'a str,
    pub data: &'a dyn Data,
    pub policy: &'a CompiledPolicy,
    pub provided: &'a [String],
}

// A failed step ends the rule with its response; that is the rare path, so the size of
// `RuleResponse` in `Err` costs nothing that matters.
#[allow(clippy::result_large_err)]
impl Mutator<'_> {
    /// The scope step (see [`enter`]) with this rule's data, values and policy.
    fn enter_scope(
        &self,
        entries: &[CompiledContextEntry],
        preconditions: Option<&CompiledConditions>,
        ctx: &mut Context,
        saved: &mut crate::context::Saved,
    ) -> Result<(), Stop> {
        enter(entries, preconditions, ctx, self.data, self.provided, self.policy.confined_to(), saved)
    }

    fn resp(&self, status: Status, msg: impl Into<String>) -> RuleResponse {
        RuleResponse::new(self.rule, RuleType::Mutation, status, msg)
    }

    /// The rule's response and, when it changed the resource, the patched resource.
    pub fn run(
        &self,
        patches: &Patches,
        foreach: &[CompiledMutateForeach],
        resource: &Value,
        ctx: &mut Context,
    ) -> (RuleResponse, Option<Value>) {
        if !foreach.is_empty() {
            return match self.foreach(foreach, resource, ctx, 0) {
                Err(e) => (self.resp(Status::Error, e), None),
                Ok(None) => (self.resp(Status::Skip, "0 elements processed"), None),
                Ok(Some(v)) => (self.resp(Status::Pass, mutated(&v)), Some(v)),
            };
        }
        match apply_patches(patches, resource, ctx) {
            Patched::Changed(v) => (self.resp(Status::Pass, mutated(&v)), Some(v)),
            Patched::Unchanged(m) => (self.resp(Status::Skip, m), None),
            Patched::Error(e) => (self.resp(Status::Error, e), None),
        }
    }

    /// Mutate existing: patches each target (available as `target`) instead of the trigger.
    ///
    /// As Kyverno's handler, a target whose context, preconditions or patch fail does not stop
    /// the others: the rule passes with the targets that were patched, and is an error (the
    /// first one) only when none was.
    pub fn run_targets(&self, m: &CompiledMutation, ctx: &mut Context) -> RuleResponse {
        let mut patched = Vec::new();
        let mut first_error: Option<RuleResponse> = None;
        for t in &m.targets {
            let render = |v: &Option<crate::template::TValue>, ctx: &Context| -> Result<String, String> {
                match v {
                    Some(t) => {
                        t.render(ctx, "").map(|x| x.as_str().unwrap_or_default().to_string()).map_err(|e| e.to_string())
                    }
                    None => Ok(String::new()),
                }
            };
            let ns = match render(&t.namespace, ctx) {
                Ok(n) => n,
                Err(e) => {
                    return self
                        .resp(Status::Error, format!("failed to substitute variables in target namespace: {e}"));
                }
            };
            let name = match render(&t.name, ctx) {
                Ok(n) => n,
                Err(e) => {
                    return self.resp(Status::Error, format!("failed to substitute variables in target name: {e}"));
                }
            };
            for candidate in self.data.targets(&t.api_version, &t.kind, &ns) {
                let cname = candidate.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
                if !name.is_empty() && !verno_jmespath::wildcard::matches(&name, cname) {
                    continue;
                }
                if let Some(sel) = &t.selector
                    && !crate::matching::selector_matches(sel, &crate::matching::labels_of(&candidate), false)
                {
                    continue;
                }
                let mut saved = ctx.set("target", candidate.clone());
                let outcome = (|| {
                    match self.enter_scope(&t.context, t.preconditions.as_ref(), ctx, &mut saved) {
                        Ok(()) => {}
                        Err(Stop::Preconditions(e)) => {
                            return Err(
                                self.resp(Status::Error, format!("failed to evaluate target preconditions: {e}"))
                            );
                        }
                        Err(Stop::NotMet) => return Ok(None),
                    }
                    let (r, v) = self.run(&m.patches, &m.foreach, &candidate, ctx);
                    if r.status == Status::Error {
                        return Err(r);
                    }
                    Ok(v)
                })();
                ctx.restore(saved);
                match outcome {
                    Err(r) => {
                        if ctx.env().cancelled() {
                            return r;
                        }
                        first_error.get_or_insert(r);
                    }
                    Ok(Some(v)) => patched.push(v),
                    Ok(None) => {}
                }
            }
        }
        if patched.is_empty() {
            return first_error.unwrap_or_else(|| self.resp(Status::Skip, "no patches applied"));
        }
        let mut r = self.resp(Status::Pass, patched.first().map_or_else(|| "mutated resource".to_string(), mutated));
        r.extra_mut().patched_targets = patched;
        r
    }

    /// Runs foreach entries in order; `Ok(None)` when nothing changed. Errors are worded as
    /// Kyverno's: a list that does not evaluate names the query's error twice (its error
    /// response appends the error to a message that already holds it), and an element's error
    /// is wrapped in "failed to mutate elements: " once per level of foreach around it.
    fn foreach(
        &self,
        fs: &[CompiledMutateForeach],
        resource: &Value,
        ctx: &mut Context,
        nesting: usize,
    ) -> Result<Option<Value>, String> {
        let mut cur: Option<Value> = None;
        for f in fs {
            let list = ctx.query(f.list.pick(ctx.is_delete())).map_err(|e| {
                let e = format!("JMESPath query failed: {e}");
                format!("failed to evaluate list {}: {e}: {e}", f.list_source)
            })?;
            let elements: Vec<Value> = match list {
                Value::Array(a) => a,
                Value::Null => Vec::new(),
                other => vec![other],
            };
            let n = elements.len();
            let order: Vec<usize> = if f.reverse { (0..n).rev().collect() } else { (0..n).collect() };
            for index in order {
                let Some(element) = elements.get(index).filter(|e| !e.is_null()) else { continue };
                if ctx.env().cancelled() {
                    return Err(crate::validate::CANCELLED.to_string());
                }
                let mut saved = ctx.set_element(element, index, nesting, true);
                let base = cur.as_ref().unwrap_or(resource);
                let step = (|| {
                    match self.enter_scope(&f.context, f.preconditions.as_ref(), ctx, &mut saved) {
                        Ok(()) => {}
                        Err(Stop::Preconditions(e)) => {
                            return Err(format!("failed to evaluate mutate.foreach[{index}].preconditions: {e}"));
                        }
                        Err(Stop::NotMet) => return Ok(None),
                    }
                    if !f.nested.is_empty() {
                        return self.foreach(&f.nested, base, ctx, nesting + 1);
                    }
                    match apply_patches(&f.patches, base, ctx) {
                        Patched::Changed(v) => Ok(Some(v)),
                        Patched::Unchanged(_) => Ok(None),
                        Patched::Error(e) => Err(e),
                    }
                })();
                ctx.restore(saved);
                match step {
                    Ok(Some(v)) => cur = Some(v),
                    Ok(None) => {}
                    Err(e) if e == crate::validate::CANCELLED => return Err(e),
                    Err(e) => return Err(format!("failed to mutate elements: {e}")),
                }
            }
        }
        Ok(cur.filter(|v| !crate::equal(v, resource)))
    }
}

impl Patches {
    fn compile(smp: Option<&Value>, json6902: Option<&String>, path: &str) -> Result<Patches, CompileError> {
        let json6902 = match json6902 {
            Some(s) => {
                let p = format!("{path}.patchesJson6902");
                if crate::template::has_vars(s) {
                    Some(Json6902::Templated(tv(&Value::String(s.clone()), &p)?))
                } else {
                    // Parsed once, so a broken policy fails at load.
                    let doc = verno_jmespath::yaml::parse(s)
                        .map_err(|e| CompileError::new(&p, format!("invalid YAML: {e}")))?;
                    Some(Json6902::Static(crate::jsonpatch::parse_ops(&doc).map_err(|e| {
                        match (e, path.strip_suffix(".mutate")) {
                            // A rule's own patch: Kyverno's policy validation words it so.
                            (crate::jsonpatch::PatchError::RelativePath { path: op_path, .. }, Some(rule)) => {
                                CompileError::whole(format!("path must begin with a forward slash: {rule}: {op_path}"))
                            }
                            (e, _) => CompileError::new(&p, e.to_string()),
                        }
                    })?))
                }
            }
            None => None,
        };
        Ok(Patches {
            strategic_merge: smp.map(|v| tv(v, &format!("{path}.patchStrategicMerge"))).transpose()?,
            json6902,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.strategic_merge.is_none() && self.json6902.is_none()
    }
}

fn compile_mutate_foreach(
    fs: &[verno_api::ForEachMutation],
    path: &str,
) -> Result<Vec<CompiledMutateForeach>, CompileError> {
    let mut out = Vec::new();
    for (i, f) in fs.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let reverse = match f.order.as_deref() {
            Some("Descending") => true,
            Some("Ascending") => false,
            Some(o) => {
                return Err(CompileError::new(
                    format!("{p}.order"),
                    format!("unknown order {o:?}, expected Ascending or Descending"),
                ));
            }
            None => f.patch_strategic_merge.is_some(),
        };
        let patches = Patches::compile(f.patch_strategic_merge.as_ref(), f.patches_json6902.as_ref(), &p)?;
        let nested = compile_mutate_foreach(f.foreach.as_deref().unwrap_or_default(), &format!("{p}.foreach"))?;
        if patches.is_empty() && nested.is_empty() {
            return Err(CompileError::new(
                &p,
                "a mutate foreach needs patchStrategicMerge, patchesJson6902 or a nested foreach",
            ));
        }
        out.push(CompiledMutateForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            list_source: f.list.clone(),
            reverse,
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: CompiledConditions::compile_optional(
                f.preconditions.as_ref(),
                &format!("{p}.preconditions"),
            )?,
            patches,
            nested,
        });
    }
    Ok(out)
}

pub(crate) fn compile_mutation(m: &verno_api::Mutation, path: &str) -> Result<CompiledMutation, CompileError> {
    let patches = Patches::compile(m.patch_strategic_merge.as_ref(), m.patches_json6902.as_ref(), path)?;
    let foreach = compile_mutate_foreach(m.foreach.as_deref().unwrap_or_default(), &format!("{path}.foreach"))?;
    if patches.is_empty() && foreach.is_empty() {
        return Err(CompileError::new(path, "a mutate rule needs patchStrategicMerge, patchesJson6902 or foreach"));
    }
    let mut targets = Vec::new();
    for (i, t) in m.targets.iter().enumerate() {
        let p = format!("{path}.targets[{i}]");
        let s = |x: &Option<String>, f: &str| {
            x.as_ref().map(|v| tv(&Value::String(v.clone()), &format!("{p}.{f}"))).transpose()
        };
        targets.push(CompiledTarget {
            api_version: t.api_version.clone(),
            kind: t.kind.clone(),
            namespace: s(&t.namespace, "namespace")?,
            name: s(&t.name, "name")?,
            selector: t.selector.clone(),
            context: compile_context(&t.context, &format!("{p}.context"))?,
            preconditions: CompiledConditions::compile_optional(
                t.preconditions.as_ref(),
                &format!("{p}.preconditions"),
            )?,
        });
    }
    Ok(CompiledMutation { patches, foreach, targets, cel: None })
}

/// Kyverno's message for a mutation that applied: `mutated Pod/web in namespace shop`
/// (`mutated Namespace/web` when cluster-scoped).
pub(crate) fn mutated(v: &Value) -> String {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    match s("/metadata/namespace") {
        "" => format!("mutated {}/{}", s("/kind"), s("/metadata/name")),
        ns => format!("mutated {}/{} in namespace {ns}", s("/kind"), s("/metadata/name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Pods(Vec<Value>);

    impl crate::Data for Pods {
        fn list(&self, _api_version: &str, _kind: &str, _namespace: &str) -> Vec<Value> {
            self.0.clone()
        }
    }

    #[test]
    fn a_target_whose_preconditions_fail_does_not_stop_the_others() {
        let doc = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
            "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
                "mutate": {"targets": [{"apiVersion": "v1", "kind": "Pod", "namespace": "{{request.object.metadata.name}}",
                    "preconditions": {"all": [{"key": "{{ target.metadata.annotations.mark }}", "operator": "Equals", "value": "yes"}]}}],
                    "patchStrategicMerge": {"metadata": {"labels": {"done": "true"}}}}}]}});
        let Ok(crate::Compiled::Policy(policy)) = crate::compile(&doc, &[]) else { panic!("compiles to a policy") };
        let set = crate::PolicySet::new(vec![std::sync::Arc::new(policy)], Vec::new());
        let pod = |name: &str, annotations: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team", "annotations": annotations}});
        let mut bare = pod("bare", json!({}));
        bare["metadata"].as_object_mut().map(|m| m.remove("annotations"));
        let run = |pods: Vec<Value>| {
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
            let req = crate::Request::new(crate::Operation::Create, &ns);
            let out = set.evaluate(&req, crate::Scope::APPLY, &verno_jmespath::NoEnv, &Pods(pods), &mut ());
            out.responses.into_iter().flat_map(|(_, r)| r.rules).next().expect("a rule response")
        };
        // `bare` has no annotations (its precondition cannot be resolved), `no` fails it.
        let r = run(vec![bare.clone(), pod("marked", json!({"mark": "yes"})), pod("no", json!({"mark": "no"}))]);
        assert_eq!(r.status, crate::Status::Pass, "{}", r.message);
        let names: Vec<&str> =
            r.patched_targets().iter().filter_map(|t| t.pointer("/metadata/name").and_then(Value::as_str)).collect();
        assert_eq!(names, ["marked"]);
        assert_eq!(r.patched_targets()[0].pointer("/metadata/labels/done"), Some(&json!("true")));
        // Only the unresolvable one: the rule is that error.
        let r = run(vec![bare]);
        assert_eq!(r.status, crate::Status::Error);
        assert!(r.message.starts_with("failed to evaluate target preconditions"), "{}", r.message);
    }

    #[test]
    fn add_if_not_present_only_adds_missing_keys() {
        let r = json!({"metadata": {"labels": {"a": "1"}}});
        let p = json!({"metadata": {"labels": {"+(a)": "x", "+(b)": "y"}}});
        assert_eq!(preprocess(&p, Some(&r)), Ok(json!({"metadata": {"labels": {"b": "y"}}})));
        // Everything present: the emptied maps disappear.
        let p = json!({"metadata": {"labels": {"+(a)": "x"}}});
        assert_eq!(preprocess(&p, Some(&r)), Ok(json!({})));
    }

    #[test]
    fn conditions_gate_the_patch() {
        let r = json!({"metadata": {"annotations": {"inject": "true"}}});
        let p = json!({"metadata": {"annotations": {"(inject)": "true"}}, "spec": {"x": 1}});
        assert_eq!(preprocess(&p, Some(&r)), Ok(json!({"spec": {"x": 1}})));
        let p = json!({"metadata": {"annotations": {"(inject)": "false"}}, "spec": {"x": 1}});
        assert!(matches!(preprocess(&p, Some(&r)), Err(PreError::Condition(_))));
        let p = json!({"metadata": {"labels": {"(inject)": "*"}}});
        assert!(matches!(preprocess(&p, Some(&r)), Err(PreError::Condition(_))));
    }

    #[test]
    fn list_conditions_copy_names_from_matching_elements() {
        let r = json!({"spec": {"containers": [{"name": "a", "image": "nginx:latest"}, {"name": "b", "image": "redis:1"}]}});
        let p = json!({"spec": {"containers": [{"(image)": "*:latest", "imagePullPolicy": "Always"}]}});
        assert_eq!(
            preprocess(&p, Some(&r)),
            Ok(json!({"spec": {"containers": [{"name": "a", "imagePullPolicy": "Always"}]}}))
        );
    }

    #[test]
    fn a_condition_map_can_still_add_missing_keys() {
        let r = json!({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/"}}]});
        let p = json!({"volumes": [{"(emptyDir)": {"+(sizeLimit)": "20Mi"}, "name": "v"}]});
        assert_eq!(
            preprocess(&p, Some(&r)),
            Ok(json!({"volumes": [{"name": "v", "emptyDir": {"sizeLimit": "20Mi"}}]}))
        );
    }

    #[test]
    fn global_anchors_skip_the_rule_or_vanish() {
        let r = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}});
        let p = json!({"metadata": {"annotations": {"x": "y"}}, "spec": {"volumes": [{"<(emptyDir)": {}}]}});
        assert_eq!(preprocess(&p, Some(&r)), Ok(json!({"metadata": {"annotations": {"x": "y"}}})));
        let r = json!({"spec": {"volumes": [{"name": "v", "hostPath": {}}]}});
        assert!(matches!(preprocess(&p, Some(&r)), Err(PreError::Global(_))));
    }
}

#[cfg(test)]
mod rule_tests {
    use crate::clusterpolicy::compile_policy;
    use crate::context::build_context;
    use crate::evaluate::evaluate_policy;
    use crate::{NoData, Request, Status};
    use serde_json::{Value, json};

    fn run(mutate: Value, pod: &Value) -> (Vec<crate::RuleResponse>, Option<Value>) {
        let policy = json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "m"},
            "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "mutate": mutate}]}});
        let Ok(p) = serde_json::from_value(policy)
            .map_err(|e| e.to_string())
            .and_then(|p| compile_policy(&p).map_err(|e| e.to_string()))
        else {
            return (Vec::new(), None);
        };
        let req = Request::new(crate::Operation::Create, pod);
        let env = verno_jmespath::NoEnv;
        let mut ctx = build_context(&req, &env);
        let r = evaluate_policy(&p, &[], &req, &mut ctx, &NoData);
        (r.rules, r.patched)
    }

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]}})
    }

    #[test]
    fn strategic_merge_foreach_walks_backwards_so_order_is_kept() {
        let (rules, patched) = run(
            json!({"foreach": [{"list": "request.object.spec.containers", "patchStrategicMerge": {"spec": {"containers": [{"name": "{{element.name}}", "image": "mirror/{{element.image}}"}]}}}]}),
            &pod(),
        );
        assert_eq!(rules[0].status, Status::Pass);
        let names: Vec<&str> = patched
            .as_ref()
            .and_then(|p| p.pointer("/spec/containers"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(patched.as_ref().and_then(|p| p.pointer("/spec/containers/1/image")), Some(&json!("mirror/y:1")));
    }

    #[test]
    fn unchanged_is_skip_and_a_bad_path_is_an_error_saying_which() {
        let (rules, patched) =
            run(json!({"patchStrategicMerge": {"spec": {"containers": [{"name": "a", "image": "x:1"}]}}}), &pod());
        assert_eq!((rules[0].status, rules[0].message.as_str()), (Status::Skip, "no patches applied"));
        assert!(patched.is_none());
        let (rules, _) =
            run(json!({"patchesJson6902": "- op: replace\n  path: /spec/nodeName\n  value: n1\n"}), &pod());
        assert_eq!(rules[0].status, Status::Error);
        assert!(rules[0].message.contains("/spec/nodeName"), "{}", rules[0].message);
    }

    #[test]
    fn a_missing_foreach_list_is_an_error_worded_as_kyvernos() {
        let (rules, _) =
            run(json!({"foreach": [{"list": "request.object.spec.initContainers", "patchesJson6902": "[]"}]}), &pod());
        assert_eq!(rules[0].status, Status::Error);
        // Kyverno's error response appends the error to a message that already holds it.
        let e = "JMESPath query failed: Unknown key \"initContainers\" in path";
        assert_eq!(rules[0].message, format!("failed to evaluate list request.object.spec.initContainers: {e}: {e}"));
        // Inside another foreach, the outer level says it could not mutate the elements.
        let nested = json!({"foreach": [{"list": "request.object.spec.containers",
            "foreach": [{"list": "element.ports", "patchesJson6902": "[]"}]}]});
        let (rules, _) = run(nested, &pod());
        assert_eq!(
            rules[0].message,
            "failed to mutate elements: failed to evaluate list element.ports: JMESPath query failed: Unknown key \"ports\" in path: JMESPath query failed: Unknown key \"ports\" in path"
        );
    }

    #[test]
    fn a_foreach_that_changes_nothing_processed_no_elements() {
        let unchanged = json!({"foreach": [{"list": "request.object.spec.containers",
            "patchStrategicMerge": {"spec": {"containers": [{"name": "{{element.name}}", "image": "{{element.image}}"}]}}}]});
        let (rules, patched) = run(unchanged, &pod());
        assert_eq!((rules[0].status, rules[0].message.as_str()), (Status::Skip, "0 elements processed"));
        assert!(patched.is_none());
    }

    #[test]
    fn an_elements_error_is_wrapped_as_kyverno_wraps_it() {
        let bad = json!({"foreach": [{"list": "request.object.spec.containers",
            "preconditions": {"all": [{"key": "{{ element.nope.deeper }}", "operator": "Equals", "value": "x"}]},
            "patchStrategicMerge": {"metadata": {"labels": {"a": "b"}}}}]});
        let (rules, _) = run(bad, &pod());
        assert_eq!(rules[0].status, Status::Error);
        assert!(
            rules[0]
                .message
                .starts_with("failed to mutate elements: failed to evaluate mutate.foreach[1].preconditions: "),
            "{}",
            rules[0].message
        );
    }

    #[test]
    fn a_failed_condition_patches_nothing_and_says_only_that() {
        let global = json!({"patchStrategicMerge": {"spec": {"containers": [{"<(image)": "*:latest"}], "serviceAccountName": "x"}}});
        let (rules, patched) = run(global, &pod());
        assert_eq!((rules[0].status, rules[0].message.as_str()), (Status::Skip, "no patches applied"));
        assert!(patched.is_none());
        let condition = json!({"patchStrategicMerge": {"metadata": {"(name)": "other", "labels": {"a": "b"}}}});
        let (rules, _) = run(condition, &pod());
        assert_eq!((rules[0].status, rules[0].message.as_str()), (Status::Skip, "no patches applied"));
    }
}
