//! Generate rules: build the downstream objects from `data`, a `clone` source or a
//! `cloneList`, with Kyverno's labels. Creating them in a cluster (and keeping them in sync) is
//! the controller's job; here they are data in the rule response.

use crate::condition::CompiledConditions;
use crate::context::Context;
use crate::context_entry::{Stop, compile_context, enter};
use crate::error::CompileError;
use crate::forms::{CompiledGenerateForeach, CompiledGeneration, GenerateSource, GenerateTarget};
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::policy::CompiledPolicy;
use crate::ports::Data;
use crate::template::TValue;
use crate::template::{Query, tv};
use serde_json::{Map, Value};

fn render_str(t: &Option<TValue>, ctx: &Context, field: &str) -> Result<String, String> {
    match t {
        None => Ok(String::new()),
        Some(t) => match t.render(ctx, "") {
            Ok(v) => Ok(match v.as_ref() {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            }),
            Err(e) => Err(format!("failed to substitute variables in {field}: {e}")),
        },
    }
}

/// Metadata the cluster owns: never copied into a clone.
const SERVER_FIELDS: [&str; 7] =
    ["resourceVersion", "uid", "creationTimestamp", "managedFields", "selfLink", "generation", "ownerReferences"];

fn labels_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = obj.as_object_mut()?.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let labels = meta.as_object_mut()?.entry("labels").or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    labels.as_object_mut()
}

fn set_meta(obj: &mut Value, key: &str, v: &str) {
    if let Some(m) = obj.as_object_mut() {
        let meta = m.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
        if let Some(mm) = meta.as_object_mut() {
            if v.is_empty() {
                mm.remove(key);
            } else {
                mm.insert(key.into(), Value::String(v.into()));
            }
        }
    }
}

/// Labels and annotations are strings in Kubernetes: a number or boolean a variable put there
/// (`elementIndex: '{{ elementIndex }}'`) is written as its text, as Kyverno's generated
/// objects have it.
fn string_metadata(obj: &mut Value) {
    for field in ["labels", "annotations"] {
        if let Some(m) = obj.pointer_mut(&format!("/metadata/{field}")).and_then(Value::as_object_mut) {
            for v in m.values_mut() {
                if matches!(v, Value::Number(_) | Value::Bool(_)) {
                    *v = Value::String(v.to_string());
                }
            }
        }
    }
}

struct Gen<'a> {
    policy: &'a CompiledPolicy,
    rule: &'a str,
    trigger: &'a Value,
    data: &'a dyn Data,
    /// Where clones were read from (see [`RuleResponse::clone_sources`]).
    sources: std::cell::RefCell<Vec<(String, String, String, String)>>,
}

impl Gen<'_> {
    fn label(&self, obj: &mut Value, clone_source: Option<&Value>) {
        let t = |p: &str| self.trigger.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        let (group, version) = {
            let av = t("/apiVersion");
            match av.split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (String::new(), av),
            }
        };
        let Some(l) = labels_mut(obj) else { return };
        let mut put = |k: &str, v: String| {
            l.insert(k.into(), Value::String(v));
        };
        put("app.kubernetes.io/managed-by", "kyverno".into());
        put("generate.kyverno.io/policy-name", self.policy.name.clone());
        put(
            "generate.kyverno.io/policy-namespace",
            if self.policy.kind.is_namespaced() {
                self.policy.namespace.clone().unwrap_or_default()
            } else {
                String::new()
            },
        );
        put("generate.kyverno.io/rule-name", self.rule.to_string());
        put("generate.kyverno.io/trigger-group", group);
        put("generate.kyverno.io/trigger-version", version);
        put("generate.kyverno.io/trigger-kind", t("/kind"));
        put("generate.kyverno.io/trigger-namespace", t("/metadata/namespace"));
        // No `trigger-name`, as Kyverno writes none: a label value holds 63 characters, and
        // a trigger's name may be longer (the API server would refuse the downstream).
        put("generate.kyverno.io/trigger-uid", t("/metadata/uid"));
        if let Some(src) = clone_source {
            put("generate.kyverno.io/clone-source", String::new());
            let s = |p: &str| src.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
            put("generate.kyverno.io/source-kind", s("/kind"));
            put("generate.kyverno.io/source-namespace", s("/metadata/namespace"));
            put("generate.kyverno.io/source-name", s("/metadata/name"));
        }
    }

    fn cloned(&self, src: &Value, name: &str, namespace: &str) -> Value {
        let mut obj = src.clone();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in SERVER_FIELDS {
                meta.remove(f);
            }
        }
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
        set_meta(&mut obj, "name", name);
        set_meta(&mut obj, "namespace", namespace);
        self.label(&mut obj, Some(src));
        obj
    }

    /// The objects one target produces.
    fn build(&self, t: &GenerateTarget, ctx: &Context) -> Result<Vec<Value>, String> {
        let api_version = render_str(&t.api_version, ctx, "apiVersion")?;
        let kind = render_str(&t.kind, ctx, "kind")?;
        let name = render_str(&t.name, ctx, "name")?;
        let namespace = render_str(&t.namespace, ctx, "namespace")?;
        // A namespaced Policy generates only into (and clones only from) its own namespace,
        // whatever its variables made of the names (see `crate::confine`).
        let own = self.policy.confined_to();
        if let Some(own) = own
            && namespace != own
        {
            return Err(format!(
                "a namespaced policy cannot generate resources in other namespaces, expected: {own}, received: {namespace}"
            ));
        }
        let clone_outside = |sns: &str| match own {
            Some(own) if sns != own => Err(format!(
                "a namespaced policy cannot clone resources from other namespaces, expected: {own}, received: {sns}"
            )),
            _ => Ok(()),
        };
        match &t.source {
            GenerateSource::None => Ok(Vec::new()),
            GenerateSource::Data(d) => {
                let d = d
                    .render(ctx, "/generate/data")
                    .map_err(|e| format!("failed to substitute variables in data: {e}"))?;
                let mut obj = match d.into_owned() {
                    Value::Object(m) => Value::Object(m),
                    Value::Null => Value::Object(Map::new()),
                    other => {
                        return Err(format!(
                            "generate data must be a map, got {}",
                            verno_jmespath::value::type_name(&other)
                        ));
                    }
                };
                if let Some(o) = obj.as_object_mut() {
                    o.insert("apiVersion".into(), Value::String(api_version));
                    o.insert("kind".into(), Value::String(kind));
                }
                set_meta(&mut obj, "name", &name);
                set_meta(&mut obj, "namespace", &namespace);
                string_metadata(&mut obj);
                self.label(&mut obj, None);
                Ok(vec![obj])
            }
            GenerateSource::Clone { namespace: sns, name: sname } => {
                let sns = render_str(&Some(sns.clone()), ctx, "clone.namespace")?;
                let sname = render_str(&Some(sname.clone()), ctx, "clone.name")?;
                clone_outside(&sns)?;
                self.sources.borrow_mut().push((api_version.clone(), kind.clone(), sns.clone(), sname.clone()));
                let Some(src) = self.data.resource(&api_version, &kind, &sns, &sname) else {
                    return Err(format!("source resource {api_version}/{kind} {sns}/{sname} not found"));
                };
                Ok(vec![self.cloned(&src, &name, &namespace)])
            }
            GenerateSource::CloneList { namespace: sns, kinds, selector } => {
                let sns = render_str(&Some(sns.clone()), ctx, "cloneList.namespace")?;
                clone_outside(&sns)?;
                let mut out = Vec::new();
                for k in kinds {
                    let (av, kd) = match k.rsplit_once('/') {
                        Some((av, kd)) => (av, kd),
                        None => ("", k.as_str()),
                    };
                    self.sources.borrow_mut().push((av.to_string(), kd.to_string(), sns.clone(), String::new()));
                    for src in self.data.list(av, kd, &sns) {
                        if let Some(sel) = selector
                            && !crate::matching::selector_matches(sel, &crate::matching::labels_of(&src), false)
                        {
                            continue;
                        }
                        let sname = src.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
                        out.push(self.cloned(&src, &sname, &namespace));
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Runs a generate rule for `trigger`.
pub(crate) fn generate(
    g: &CompiledGeneration,
    policy: &CompiledPolicy,
    rule: &str,
    trigger: &Value,
    ctx: &mut Context,
    data: &dyn Data,
    provided: &[String],
) -> RuleResponse {
    let builder = Gen { policy, rule, trigger, data, sources: std::cell::RefCell::new(Vec::new()) };
    let resp = |status: Status, msg: String| {
        let mut r = RuleResponse::new(rule, RuleType::Generation, status, msg);
        r.extra_mut().clone_sources = builder.sources.borrow().clone();
        r
    };
    let mut objects = match builder.build(&g.target, ctx) {
        Ok(o) => o,
        Err(e) => return resp(Status::Error, e),
    };
    for (i, f) in g.foreach.iter().enumerate() {
        let list = match ctx.query(f.list.pick(ctx.is_delete())) {
            Ok(Value::Array(a)) => a,
            Ok(Value::Null) => Vec::new(),
            Ok(other) => vec![other],
            Err(e) => return resp(Status::Error, format!("failed to evaluate list {}: {e}", f.list_source)),
        };
        for (index, element) in list.iter().enumerate() {
            if element.is_null() {
                continue;
            }
            let mut saved = ctx.set_element(element, index, 0, true);
            let step = (|| {
                match enter(&f.context, f.preconditions.as_ref(), ctx, data, provided, policy.confined_to(), &mut saved)
                {
                    Ok(()) => {}
                    Err(Stop::Preconditions(e)) => {
                        return Err(format!("failed to evaluate generate.foreach[{i}].preconditions: {e}"));
                    }
                    Err(Stop::NotMet) => return Ok(Vec::new()),
                }
                builder.build(&f.target, ctx)
            })();
            ctx.restore(saved);
            match step {
                Ok(o) => objects.extend(o),
                Err(e) => return resp(Status::Error, e),
            }
        }
    }
    let mut r = resp(Status::Pass, String::new());
    r.extra_mut().generated = objects;
    r.synchronize = g.synchronize;
    r.orphan_downstream = g.orphan_downstream;
    r
}

#[allow(clippy::too_many_arguments)]
fn compile_generate_target(
    api_version: &Option<String>,
    kind: &Option<String>,
    name: &Option<String>,
    namespace: &Option<String>,
    data: Option<&Value>,
    clone: Option<&verno_api::CloneFrom>,
    clone_list: Option<&verno_api::CloneList>,
    path: &str,
) -> Result<GenerateTarget, CompileError> {
    let s = |x: &Option<String>, f: &str| {
        x.as_ref().map(|v| tv(&Value::String(v.clone()), &format!("{path}.{f}"))).transpose()
    };
    let n = [data.is_some(), clone.is_some(), clone_list.is_some()].iter().filter(|b| **b).count();
    if n > 1 {
        return Err(CompileError::new(path, "only one of data, clone and cloneList may be set"));
    }
    let source = if let Some(d) = data {
        GenerateSource::Data(tv(d, &format!("{path}.data"))?)
    } else if let Some(c) = clone {
        GenerateSource::Clone {
            namespace: tv(&Value::String(c.namespace.clone()), &format!("{path}.clone.namespace"))?,
            name: tv(&Value::String(c.name.clone()), &format!("{path}.clone.name"))?,
        }
    } else if let Some(c) = clone_list {
        GenerateSource::CloneList {
            namespace: tv(&Value::String(c.namespace.clone()), &format!("{path}.cloneList.namespace"))?,
            kinds: c.kinds.clone(),
            selector: c.selector.clone(),
        }
    } else {
        GenerateSource::None
    };
    Ok(GenerateTarget {
        api_version: s(api_version, "apiVersion")?,
        kind: s(kind, "kind")?,
        name: s(name, "name")?,
        namespace: s(namespace, "namespace")?,
        source,
    })
}

pub(crate) fn compile_generation(g: &verno_api::Generation, path: &str) -> Result<CompiledGeneration, CompileError> {
    let target = compile_generate_target(
        &g.api_version,
        &g.kind,
        &g.name,
        &g.namespace,
        g.data.as_ref(),
        g.clone.as_ref(),
        g.clone_list.as_ref(),
        path,
    )?;
    let mut foreach = Vec::new();
    for (i, f) in g.foreach.iter().flatten().enumerate() {
        let p = format!("{path}.foreach[{i}]");
        foreach.push(CompiledGenerateForeach {
            list: Query::compile(&f.list, &format!("{p}.list"))?,
            list_source: f.list.clone(),
            context: compile_context(&f.context, &format!("{p}.context"))?,
            preconditions: CompiledConditions::compile_optional(
                f.preconditions.as_ref(),
                &format!("{p}.preconditions"),
            )?,
            target: compile_generate_target(
                &f.api_version,
                &f.kind,
                &f.name,
                &f.namespace,
                f.data.as_ref(),
                f.clone.as_ref(),
                f.clone_list.as_ref(),
                &p,
            )?,
        });
    }
    let mut target = target;
    if matches!(target.source, GenerateSource::None) && foreach.is_empty() {
        // Only the identity: Kyverno generates the bare object.
        target.source = GenerateSource::Data(tv(&Value::Object(serde_json::Map::new()), &format!("{path}.data"))?);
    }
    Ok(CompiledGeneration {
        target,
        synchronize: g.synchronize.unwrap_or(false),
        orphan_downstream: g.orphan_downstream_on_policy_delete.unwrap_or(false),
        // The policy's `spec.generateExisting` fills this in when the rule does not say.
        generate_existing: g.generate_existing.unwrap_or(false),
        generate_existing_set: g.generate_existing.is_some(),
        foreach,
        cel: None,
    })
}

#[cfg(test)]
mod tests {
    use crate::clusterpolicy::compile_policy;
    use crate::context::build_context;
    use crate::evaluate::evaluate_policy;
    use crate::{NoData, Request, Status};
    use serde_json::{Value, json};

    fn run(policy: Value, trigger: &Value) -> Vec<crate::RuleResponse> {
        let p = serde_json::from_value(policy)
            .map_err(|e| e.to_string())
            .and_then(|p| compile_policy(&p).map_err(|e| e.to_string()));
        let Ok(p) = p else { return Vec::new() };
        let req = Request::new(crate::Operation::Create, trigger);
        let env = verno_jmespath::NoEnv;
        let mut ctx = build_context(&req, &env);
        evaluate_policy(&p, &[], &req, &mut ctx, &NoData).rules
    }

    fn policy(generate: Value) -> Value {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "gen"},
            "spec": {"rules": [{"name": "r", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]}, "generate": generate}]}})
    }

    #[test]
    fn foreach_generates_one_object_per_element_with_kyverno_labels() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "annotations": {"tiers": "gold,silver"}}});
        let rules = run(
            policy(json!({"synchronize": true, "foreach": [{
                "list": "request.object.metadata.annotations.tiers | split(@, ',')",
                "apiVersion": "v1", "kind": "ConfigMap", "name": "tier-{{element}}", "namespace": "{{request.object.metadata.name}}",
                "data": {"data": {"index": "{{elementIndex}}"}}}]})),
            &ns,
        );
        let r = &rules[0];
        assert_eq!(r.status, Status::Pass);
        assert!(r.synchronize);
        let names: Vec<&str> =
            r.generated().iter().filter_map(|g| g.pointer("/metadata/name").and_then(Value::as_str)).collect();
        assert_eq!(names, ["tier-gold", "tier-silver"]);
        assert_eq!(r.generated()[1].pointer("/data/index"), Some(&json!(1)));
        assert_eq!(r.generated()[0].pointer("/metadata/namespace"), Some(&json!("team-a")));
        assert_eq!(r.generated()[0].pointer("/metadata/labels/app.kubernetes.io~1managed-by"), Some(&json!("kyverno")));
        assert_eq!(
            r.generated()[0].pointer("/metadata/labels/generate.kyverno.io~1trigger-kind"),
            Some(&json!("Namespace"))
        );
        // Kyverno writes no trigger name (a label value holds 63 characters, a name may not fit).
        assert_eq!(r.generated()[0].pointer("/metadata/labels/generate.kyverno.io~1trigger-name"), None);
    }

    #[test]
    fn a_missing_clone_source_is_an_error_naming_it() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}});
        let rules = run(
            policy(
                json!({"apiVersion": "v1", "kind": "Secret", "name": "regcred", "namespace": "team-a", "clone": {"namespace": "platform", "name": "regcred"}}),
            ),
            &ns,
        );
        assert_eq!(rules[0].status, Status::Error);
        assert_eq!(rules[0].message, "source resource v1/Secret platform/regcred not found");
    }
}
