//! CEL expressions for Verno, on the `cel` crate (0.15, with optional syntax `?.`/`orValue`).
//!
//! Kubernetes' conventions are applied here: JSON numbers become signed `int` when they are
//! integral (so `replicas + 1` works), the strings, lists, math and encoders extensions are on,
//! and results convert back to JSON. Programs compile once; evaluation is pure.

mod authz;
mod bind;
pub mod envoy;
mod error;
mod fast;
mod host;
mod image;
mod jwt;
mod kube;
mod meter;
mod net;
mod optional;
mod quantity;
mod rewrite;
mod sdk;
mod semver;
mod shared;
mod tagged;
mod twovar;
mod url;
mod user;

pub use error::{CompileError, EvalError};
pub use host::{Host, HostError, HttpCall};

use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt};
use cel::common::value::{BuiltinRef, CowVal, Val};
use cel::context::VariableResolver;
use cel::objects::Key;
use cel::{Context, Env, IdedExpr, Value};
use shared::SharedVal;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The shared environment: standard library, optional syntax and the extensions.
fn env() -> Option<&'static Arc<Env>> {
    static ENV: OnceLock<Option<Arc<Env>>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib().with_optional_support(true);
        env.add_extension(cel::extensions::strings).ok()?;
        env.add_extension(cel::extensions::lists).ok()?;
        env.add_extension(cel::extensions::math).ok()?;
        env.add_extension(cel::extensions::encoders).ok()?;
        or_value_compat(&mut env).ok()?;
        kube::register(&mut env).ok()?;
        host::register(&mut env).ok()?;
        authz::register(&mut env).ok()?;
        image::register(&mut env).ok()?;
        user::register(&mut env).ok()?;
        bind::register(&mut env).ok()?;
        quantity::register(&mut env).ok()?;
        net::register(&mut env).ok()?;
        url::register(&mut env).ok()?;
        semver::register(&mut env).ok()?;
        optional::register(&mut env).ok()?;
        envoy::register(&mut env).ok()?;
        meter::register(&mut env).ok()?;
        sdk::register(&mut env).ok()?;
        twovar::register(&mut env).ok()?;
        Some(Arc::new(env))
    })
    .as_ref()
}

/// Kyverno's `orValue` compatibility: on a value that is not an optional (a field read without
/// `?.`), `x.orValue(default)` is `x` itself. A macro, as in Kyverno: calls whose target is
/// built as an optional (`?.`, `[?…]`, `optional.*`, `.or(…)`, `first()`, `last()`,
/// `regex.extract(…)`, a conditional) keep the standard optional `orValue`.
fn or_value_compat(env: &mut Env) -> Result<(), cel::DeclarationError> {
    use cel::common::ast::Expr as Ast;
    /// Does this expression produce an optional? Optional selection propagates through later
    /// field selections and indexing (`a.?b.c` is optional).
    fn optional(e: &Ast) -> bool {
        match e {
            Ast::Call(c) => match c.func_name.as_str() {
                "_?._"
                | "_[?_]"
                | "_?_:_"
                | "or"
                | "of"
                | "none"
                | "ofNonZeroValue"
                | "optional.of"
                | "optional.none"
                | "optional.ofNonZeroValue"
                // cel-go's optional list helpers and `regex.extract`.
                | "first"
                | "last"
                | "extract" => true,
                "_[_]" => c.args.first().is_some_and(|a| optional(&a.expr)),
                _ => false,
            },
            Ast::Select(s) => optional(&s.operand.expr),
            Ast::Comprehension(_) => true,
            _ => false,
        }
    }
    env.add_macro(cel::parser::Macro::receiver("orValue", 1, |_helper, target, _args| {
        let keep = match target.as_ref().map(|t| &t.expr) {
            None | Some(Ast::Ident(_)) => true,
            Some(e) => optional(e),
        };
        if keep { Ok(None) } else { Ok(target.take()) }
    }))
}

/// The cost budget, checked when an expression compiles: how deeply comprehensions may nest.
/// Every loop runs over a list from the request (itself bounded by the request size limit), so
/// this bounds the work per expression polynomially; Kubernetes instead estimates a cost from
/// schema sizes, which we do not have offline.
pub const MAX_LOOP_DEPTH: usize = 4;

/// The runtime half of the budget: loop iterations an evaluation may be estimated to run,
/// (the widest list or map in its inputs) ^ (its loop depth). About a second of work; an
/// expression over more is refused before it starts instead of running past the deadline.
pub const MAX_ITERATIONS: u128 = 10_000_000;

/// The runtime cost limit of one evaluation by the crate (see `meter`): loop iterations plus
/// the sizes each iteration builds. Kubernetes' per-call limit for admission policies is the
/// same number of its (finer) cost units, so an expression Kubernetes runs stays well within it.
pub const MAX_RUNTIME_COST: u64 = 1_000_000;

/// A compiled CEL expression with its source (for messages).
#[derive(Clone)]
pub struct Expr {
    ast: Arc<IdedExpr>,
    source: String,
    /// Calls a Kyverno library that needs the host.
    uses_host: bool,
    /// How deeply comprehensions nest (the exponent of the runtime estimate).
    loop_depth: usize,
    /// Reads nothing a policy adds to the request's variables (`params`, composition
    /// variables, the host): as a composition variable its value can be shared between the
    /// policies evaluating one request (see [`Vars::share_results`]).
    shareable: bool,
    /// The expression compiled for the direct evaluator, when it covers it (see `fast`).
    direct: Option<Arc<fast::Node>>,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expr({:?})", self.source)
    }
}

impl Expr {
    pub fn compile(source: &str) -> Result<Expr, CompileError> {
        let env = env().ok_or(CompileError::Environment)?;
        let mut ast = env.parser().parse(source).map_err(CompileError::Parse)?;
        rewrite::structs_to_maps(&mut ast);
        rewrite::variables_to_idents(&mut ast);
        let depth = rewrite::loop_depth(&ast);
        if depth > MAX_LOOP_DEPTH {
            return Err(CompileError::TooManyLoops { depth });
        }
        let uses_host = rewrite::mentions(&ast, host::HOST_VAR);
        let per_policy = |n: &str| n == "params" || n == "variables" || n.starts_with("@var:") || n == host::HOST_VAR;
        let shareable = !uses_host && !rewrite::reads_any(&ast, &per_policy);
        // The direct evaluator takes the expression as written; the crate's loops are metered.
        let direct = fast::compile(&ast).map(Arc::new);
        if depth > 0 {
            let mut next_id = meter::max_id(&ast);
            meter::instrument(&mut ast, &mut next_id);
        }
        Ok(Expr { ast: Arc::new(ast), source: source.to_string(), uses_host, loop_depth: depth, shareable, direct })
    }

    /// Whether the expression calls a library that reads the world through the host
    /// (`resource.*`, `http.*`, `globalContext.Get`, `image.GetMetadata`, the authorizer's
    /// checks, `time.now()`, image verification).
    pub fn uses_host(&self) -> bool {
        self.uses_host
    }

    /// How many arguments each `generator.Apply`/`generator.apply` call in the expression
    /// passes (the kinds differ: GeneratingPolicy takes a namespace and a list,
    /// NamespacedGeneratingPolicy only the list).
    pub fn generator_apply_arities(&self) -> Vec<usize> {
        let mut out = Vec::new();
        rewrite::call_arities(&self.ast, "@generator_apply", &mut out);
        out.into_iter().map(|n| n.saturating_sub(1)).collect()
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates with the given variables (JSON values), returning JSON.
    pub fn eval(&self, vars: &Vars) -> Result<serde_json::Value, EvalError> {
        let v = self.eval_cel(vars)?;
        to_json(&v)
    }

    /// May an evaluation with `vars` start: not cancelled, and within the cost estimate.
    fn admit(&self, vars: &Vars) -> Result<(), EvalError> {
        if vars.cancel.as_ref().is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(EvalError::Cancelled);
        }
        if self.loop_depth > 0 {
            let estimate = (vars.widest as u128).saturating_pow(self.loop_depth as u32);
            if estimate > MAX_ITERATIONS {
                return Err(EvalError::OverBudget { widest: vars.widest, loop_depth: self.loop_depth });
            }
        }
        Ok(())
    }

    /// Evaluates, handing the result (borrowed where the interpreter could) to `then`.
    fn with_result<T>(&self, vars: &Vars, then: impl FnOnce(&dyn Val) -> Result<T, EvalError>) -> Result<T, EvalError> {
        self.admit(vars)?;
        let env = env().ok_or(EvalError::Environment)?;
        let mut ctx = Context::with_env(env.clone());
        // Variables are served by reference: nothing is copied per evaluation.
        ctx.set_variable_resolver(vars);
        if self.uses_host && !vars.has(host::HOST_VAR) {
            // No host: the library functions then say they are not available here.
            ctx.add_variable_from_value(host::HOST_VAR, Value::Null);
        }
        if self.loop_depth > 0 {
            // A fresh meter per evaluation (see `meter`).
            let m = meter::Meter::new(MAX_RUNTIME_COST, vars.cancel.clone());
            ctx.add_variable_from_value(meter::METER_VAR, Value::Opaque(Arc::new(meter::MeterValue(Arc::new(m)))));
        }
        let out = Value::resolve_val(&self.ast, &ctx).map_err(|e| {
            // A composition variable is read as `@var:<name>` (see `rewrite`).
            let var = match &e {
                cel::ExecutionError::UndeclaredReference(r) => r.strip_prefix("@var:").map(str::to_string),
                _ => None,
            };
            match var {
                Some(name) => match vars.failed.iter().find(|(n, _)| *n == name) {
                    Some((_, why)) => EvalError::VariableFailed { name, cause: Box::new(why.clone()) },
                    None => EvalError::VariableUnavailable { name },
                },
                None => EvalError::Execution(e),
            }
        })?;
        then(out.as_ref())
    }

    fn eval_cel(&self, vars: &Vars) -> Result<Value, EvalError> {
        self.with_result(vars, |v| {
            // The result's own size is bounded before it is copied out.
            widest_val(v)?;
            Value::try_from(v).map_err(EvalError::Conversion)
        })
    }

    /// Evaluates and binds the result as `variables.<name>`, without a round trip through JSON.
    ///
    /// When `vars` share results ([`Vars::share_results`]) and the expression reads only the
    /// request's variables, another policy's evaluation of the same expression is reused
    /// (after the same admission checks a fresh evaluation would make).
    pub fn eval_into_variable(&self, name: &str, vars: &mut Vars) -> Result<(), EvalError> {
        let shared = if self.shareable { vars.shared.clone() } else { None };
        self.admit(vars).inspect_err(|e| vars.failed.push((name.to_string(), e.clone())))?;
        if let Some(shared) = &shared {
            let hit = shared
                .lock()
                .ok()
                .and_then(|s| s.iter().find(|r| r.source == self.source).map(|r| (r.value.clone(), r.widest)));
            if let Some((value, widest)) = hit {
                vars.widest = vars.widest.max(widest);
                vars.set_variable_input(name, value);
                return Ok(());
            }
        }
        // Evaluated directly when it can be: the value is kept as JSON (read directly by later
        // expressions, converted for the crate's only if one reads it).
        let direct = self.fast(vars, |v| fast::to_json(v).ok()).map(|json| {
            let widest = widest(&json);
            (Input::from_json(JsonInput { root: Arc::new(json), field: None }), widest)
        });
        // A variable built by the policy (`a.map(x, a)`) is an input of later expressions: its
        // width counts in their estimates, so doubling through variables meets the budget.
        let (value, widest) = match direct {
            Some(d) => d,
            None => {
                let (v, widest) = self
                    .with_result(vars, |v| Ok((shared::to_static(v).map_err(EvalError::Conversion)?, widest_val(v)?)))
                    .inspect_err(|e| vars.failed.push((name.to_string(), e.clone())))?;
                (Input::from_cel(Arc::from(v)), widest)
            }
        };
        let value = Arc::new(value);
        vars.widest = vars.widest.max(widest);
        if let Some(mut s) = shared.as_ref().and_then(|s| s.lock().ok())
            && s.len() < MAX_SHARED_RESULTS
        {
            s.push(SharedResult { source: self.source.clone(), value: value.clone(), widest });
        }
        vars.set_variable_input(name, value);
        Ok(())
    }

    /// Evaluates over the inputs' JSON where the direct evaluator covers the expression
    /// (see `fast`); `None`: the crate's interpreter must.
    fn fast<T>(&self, vars: &Vars, then: impl FnOnce(&fast::V<'_>) -> Option<T>) -> Option<T> {
        let node = self.direct.as_deref()?;
        let mut scope = fast::Scope::new(vars);
        let v = fast::eval(node, &mut scope).ok()?;
        then(&v)
    }

    /// Evaluates with the direct evaluator and with the crate's interpreter and describes how
    /// they differ, if they do: an answer of the direct evaluator that is not the crate's, or
    /// one where the crate fails. `None` also when the direct evaluator declines. For the
    /// differential test and the `cel` fuzz target.
    #[doc(hidden)]
    pub fn direct_disagreement(&self, vars: &Vars) -> Option<String> {
        self.admit(vars).ok()?;
        let slow = self.eval_cel(vars);
        self.fast(vars, |f| match &slow {
            Ok(c) if fast::same(c, f) => None,
            Ok(c) => Some(format!("{}: the crate gives {c:?}, the direct evaluator {f:?}", self.source)),
            Err(e) => Some(format!("{}: the crate fails ({e}), the direct evaluator gives {f:?}", self.source)),
        })
    }

    /// Evaluates to a boolean; any other result is an error naming its type.
    pub fn eval_bool(&self, vars: &Vars) -> Result<bool, EvalError> {
        self.admit(vars)?;
        if let Some(b) = self.fast(vars, |v| match v {
            fast::V::Bool(b) => Some(*b),
            _ => None,
        }) {
            return Ok(b);
        }
        match self.eval_cel(vars)? {
            Value::Bool(b) => Ok(b),
            other => Err(EvalError::NotBool { type_name: type_name(&other) }),
        }
    }
}

/// The most elements of any array or object within `v` (iteratively: inputs may nest deeply).
fn widest(v: &serde_json::Value) -> usize {
    let mut most = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Array(a) => {
                most = most.max(a.len());
                stack.extend(a.iter());
            }
            serde_json::Value::Object(m) => {
                most = most.max(m.len());
                stack.extend(m.values());
            }
            _ => {}
        }
    }
    most
}

/// The most bytes of strings and bytes one result (an expression's or a variable's) may hold:
/// doubling a string through variables (`v2 = v1 + v1`) stops here.
pub const MAX_RESULT_BYTES: usize = 16 << 20;

/// How many composition-variable results one set of [`Vars`] shares (see
/// [`Vars::share_results`]); later ones are evaluated per policy.
pub const MAX_SHARED_RESULTS: usize = 64;

/// A composition variable's value, computed by one policy and read by the next that defines a
/// variable by the same expression.
struct SharedResult {
    source: String,
    value: Arc<Input>,
    widest: usize,
}

/// [`widest`] for a CEL value (a result, or a variable's value before it is kept); an error
/// when the value holds more than [`MAX_ITERATIONS`] elements or [`MAX_RESULT_BYTES`] of text
/// (counted as the value reads, shared parts each time: the walk stops at the limit).
fn widest_val(v: &dyn Val) -> Result<usize, EvalError> {
    let (mut most, mut nodes, mut bytes) = (0usize, 0u128, 0usize);
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        nodes += 1;
        if nodes > MAX_ITERATIONS {
            return Err(EvalError::TooManyElements);
        }
        match v.as_builtin() {
            BuiltinRef::String(s) => bytes += s.inner().len(),
            BuiltinRef::Bytes(b) => bytes += b.inner().len(),
            BuiltinRef::List(l) => {
                most = most.max(l.inner().len());
                stack.extend(l.inner().iter().map(|x| x.as_ref()));
            }
            BuiltinRef::Map(m) => {
                most = most.max(m.inner().len());
                stack.extend(m.inner().values().map(|x| x.as_ref()));
            }
            _ => {}
        }
        if bytes > MAX_RESULT_BYTES {
            return Err(EvalError::TooMuchText);
        }
    }
    Ok(most)
}

/// A value given to the evaluator: JSON (converted to the crate's values only when an
/// expression the direct evaluator does not cover reads it), or a value of the crate's.
struct Input {
    json: Option<JsonInput>,
    cel: std::sync::OnceLock<Arc<dyn Val>>,
}

impl Input {
    fn from_json(json: JsonInput) -> Input {
        Input { json: Some(json), cel: std::sync::OnceLock::new() }
    }

    fn from_cel(v: Arc<dyn Val>) -> Input {
        Input { json: None, cel: std::sync::OnceLock::from(v) }
    }

    fn json(&self) -> Option<&serde_json::Value> {
        self.json.as_ref().and_then(JsonInput::get)
    }

    /// The crate's value, converted on first use.
    fn cel(&self) -> &Arc<dyn Val> {
        self.cel.get_or_init(|| Arc::from(json_val(self.json().unwrap_or(&serde_json::Value::Null))))
    }
}

/// An input's JSON: a value, or a field of one (`object` is `request`'s).
#[derive(Clone)]
struct JsonInput {
    root: Arc<serde_json::Value>,
    field: Option<Arc<str>>,
}

impl JsonInput {
    fn get(&self) -> Option<&serde_json::Value> {
        match &self.field {
            None => Some(&self.root),
            Some(f) => self.root.get(&**f),
        }
    }
}

/// A composition variable.
struct Variable {
    name: String,
    value: Arc<Input>,
}

/// Variables for an evaluation, converted to CEL when first needed and shared (cloning is
/// cheap).
#[derive(Default, Clone)]
pub struct Vars {
    /// Shared between clones (one per policy), copied when a clone sets one.
    vals: Arc<Vec<(Arc<str>, Arc<Input>)>>,
    /// Composition variables, and the `variables` map built from them when an expression
    /// reads the map itself (`variables.<name>` reads the variable directly).
    variables: Vec<Arc<Variable>>,
    variables_map: std::sync::OnceLock<Arc<dyn Val>>,
    /// The most elements of any list or map among the inputs (see [`MAX_ITERATIONS`]).
    widest: usize,
    /// Set by the caller when it gives up (its deadline passed): evaluations not yet started
    /// fail at once. One running evaluation is bounded by [`MAX_ITERATIONS`] instead.
    cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Why composition variables failed, for the message of an expression that reads one.
    failed: Vec<(String, EvalError)>,
    /// Composition-variable results shared by the clones of these variables, keyed by
    /// expression source; dropped by any change of an input but `params`.
    shared: Option<Arc<std::sync::Mutex<Vec<SharedResult>>>>,
}

/// The inputs' JSON, for the direct evaluator: those set from JSON (and the composition
/// variables it evaluated, or that were set from JSON).
impl fast::Inputs for Vars {
    fn input(&self, name: &str) -> Option<&serde_json::Value> {
        self.vals.iter().find(|(k, _)| **k == *name).and_then(|(_, v)| v.json())
    }

    fn variable(&self, name: &str) -> Option<&serde_json::Value> {
        self.variables.iter().find(|v| v.name == name).and_then(|v| v.value.json())
    }
}

impl VariableResolver for Vars {
    fn resolve<'b>(&'b self, name: &str) -> Option<CowVal<'b, 'b>> {
        if let Some(var) = name.strip_prefix("@var:") {
            return self.variables.iter().find(|v| v.name == var).map(|v| CowVal::Borrowed(&**v.value.cel()));
        }
        if name == "variables" {
            let map = self.variables_map.get_or_init(|| {
                let map: HashMap<CelMapKey<'static>, Box<dyn Val>> = self
                    .variables
                    .iter()
                    .map(|v| (CelMapKey::from(v.name.clone()), v.value.cel().clone_as_boxed()))
                    .collect();
                Arc::new(CelMap::from(map))
            });
            return Some(CowVal::Borrowed(&**map));
        }
        self.vals.iter().find(|(k, _)| **k == *name).map(|(_, v)| CowVal::Borrowed(&**v.cel()))
    }
}

impl Vars {
    pub fn set(&mut self, name: &str, v: &serde_json::Value) {
        self.widest = self.widest.max(widest(v));
        self.set_input(name, Input::from_json(JsonInput { root: Arc::new(v.clone()), field: None }));
    }

    /// Whether an input `name` is set.
    fn has(&self, name: &str) -> bool {
        self.vals.iter().any(|(k, _)| **k == *name)
    }

    /// [`Vars::set`] of the map `v` as if it also held `extra`'s fields: a caller that keeps
    /// a large field apart (the engine lends the request's object to its context instead of
    /// copying it in) sets it without first copying it into `v`. A `v` that is not a map is
    /// set as it is.
    pub fn set_with_fields(&mut self, name: &str, v: &serde_json::Value, extra: &[(&str, &serde_json::Value)]) {
        let serde_json::Value::Object(m) = v else { return self.set(name, v) };
        let width = m.len() + extra.iter().filter(|(k, _)| !m.contains_key(*k)).count();
        let deepest = extra.iter().map(|(_, x)| widest(x)).fold(widest(v), usize::max);
        self.widest = self.widest.max(width).max(deepest);
        let mut json = m.clone();
        for (k, x) in extra {
            json.insert((*k).to_string(), (*x).clone());
        }
        let root = Arc::new(serde_json::Value::Object(json));
        self.set_input(name, Input::from_json(JsonInput { root, field: None }));
    }

    fn set_input(&mut self, name: &str, v: Input) {
        // Shared results read none of `params` (see `Expr::shareable`); any other input that
        // changes makes them stale for these variables.
        if name != "params" {
            self.shared = None;
        }
        let vals = Arc::make_mut(&mut self.vals);
        match vals.iter_mut().find(|(k, _)| **k == *name) {
            Some(slot) => slot.1 = Arc::new(v),
            None => vals.push((Arc::from(name), Arc::new(v))),
        }
    }

    /// From here on, these variables and their clones share the values of composition
    /// variables that read only these inputs (`object`, `request`, `namespaceObject`, ...; not
    /// `params`, other variables or the host): a request's policies that define the same
    /// variable (`containers: object.spec.containers + ...`) evaluate it once. Setting an
    /// input other than `params` afterwards stops the sharing for that copy.
    pub fn share_results(&mut self) {
        self.shared = Some(Arc::default());
    }

    /// Sets `name` to the field `field` of the input `source` (a map set from JSON) without
    /// copying it: `object` is `request.object`. Returns false (and sets nothing) when
    /// `source` has no such field.
    pub fn set_field_of(&mut self, name: &str, source: &str, field: &str) -> bool {
        // The field's width is within its source's, counted when that was set.
        let found = self.vals.iter().find(|(k, _)| **k == *source).and_then(|(_, v)| {
            let json = v.json.as_ref().filter(|j| j.field.is_none())?;
            json.root.get(field)?;
            Some(JsonInput { root: json.root.clone(), field: Some(Arc::from(field)) })
        });
        match found {
            Some(json) => {
                self.set_input(name, Input::from_json(json));
                true
            }
            None => false,
        }
    }

    /// Makes `host` answer the Kyverno libraries (`resource.*`, `http.*`, `globalContext.Get`,
    /// `image.GetMetadata`, `time.now()`).
    pub fn set_host(&mut self, host: Arc<dyn Host>) {
        if let Ok(v) = Box::<dyn Val>::try_from(Value::Opaque(Arc::new(host::HostValue(host)))) {
            self.set_input(host::HOST_VAR, Input::from_cel(Arc::from(v)));
        }
    }

    /// Makes evaluations with these variables stop (with an error) once `flag` is set.
    pub fn set_cancel(&mut self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.cancel = Some(flag);
    }

    /// Sets `variables.<name>` (Kubernetes' composition variables).
    pub fn set_variable(&mut self, name: &str, v: &serde_json::Value) {
        let json = JsonInput { root: Arc::new(v.clone()), field: None };
        self.set_variable_input(name, Arc::new(Input::from_json(json)));
    }

    fn set_variable_input(&mut self, name: &str, value: Arc<Input>) {
        let var = Arc::new(Variable { name: name.to_string(), value });
        match self.variables.iter_mut().find(|v| v.name == name) {
            Some(slot) => *slot = var,
            None => self.variables.push(var),
        }
        self.variables_map = std::sync::OnceLock::new();
    }
}

/// JSON straight to a CEL value, with Kubernetes' number rule: integral numbers are `int`.
pub(crate) fn json_val(v: &serde_json::Value) -> Box<dyn Val> {
    match v {
        serde_json::Value::Null => Box::new(CelNull),
        serde_json::Value::Bool(b) => Box::new(CelBool::from(*b)),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(0.0))),
        },
        serde_json::Value::String(s) => Box::new(CelString::from(s.clone())),
        // Lists and maps are shared (see `shared`): the interpreter clones what it binds.
        serde_json::Value::Array(a) => {
            SharedVal::wrap(Box::new(CelList::from(a.iter().map(json_val).collect::<Vec<_>>())))
        }
        serde_json::Value::Object(m) => SharedVal::wrap(Box::new(CelMap::from(
            m.iter().map(|(k, v)| (CelMapKey::from(k.clone()), json_val(v))).collect::<HashMap<_, _>>(),
        ))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Function(..) => "function",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Duration(_) => "duration",
        Value::Timestamp(_) => "timestamp",
        Value::Null => "null",
        _ => "object",
    }
}

/// Whether `source` is a condition the API server can evaluate for a webhook entry, as
/// Kyverno checks before placing a policy's matchConditions on its webhook: it compiles and
/// reads only `object`, `oldObject`, `request` and `authorizer` (and what its own loops
/// bind), calling nothing that needs Kyverno (the host, a Kyverno library namespace, a
/// policy's variables or exceptions). Anything else stays with Verno, which evaluates every
/// condition itself anyway.
pub fn api_server_condition(source: &str) -> bool {
    let Some(env) = env() else { return false };
    let Ok(ast) = env.parser().parse(source) else { return false };
    if rewrite::mentions(&ast, host::HOST_VAR) {
        return false;
    }
    let mut bound = Vec::new();
    rewrite::loop_vars(&ast, &mut bound);
    let known = |n: &str| {
        matches!(n, "object" | "oldObject" | "request" | "authorizer" | "optional") || bound.iter().any(|b| b == n)
    };
    if rewrite::reads_any(&ast, &|n| !known(n)) || !rewrite::request_selects_ok(&ast) {
        return false;
    }
    // Global functions: CEL's own and the Kubernetes libraries' (operators are `_…_`, `!_`,
    // `@in`, `@not_strictly_false`).
    const GLOBAL: &[&str] = &[
        "size",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "bool",
        "type",
        "dyn",
        "duration",
        "timestamp",
        "matches",
        "url",
        "isURL",
        "quantity",
        "isQuantity",
        "ip",
        "isIP",
        "cidr",
        "isCIDR",
        "semver",
        "isSemver",
    ];
    let mut calls = Vec::new();
    rewrite::global_calls(&ast, &mut calls);
    calls.iter().all(|f| f.starts_with('_') || f.starts_with('!') || f.starts_with('@') || GLOBAL.contains(&f.as_str()))
}

/// Whether `source`, read as a CEL expression, names the identifier `name` anywhere (as
/// Kyverno finds `http.*` in a namespaced policy); text that does not parse does not.
pub fn mentions_ident(source: &str, name: &str) -> bool {
    let Some(env) = env() else { return false };
    let Ok(ast) = env.parser().parse(source) else { return false };
    // The host libraries' calls are rewritten while parsing (`http.Get(…)` → `@http_get`).
    let mut calls = Vec::new();
    rewrite::global_calls(&ast, &mut calls);
    rewrite::mentions(&ast, name)
        || calls.iter().any(|f| f.strip_prefix('@').is_some_and(|f| f.starts_with(&format!("{name}_"))))
}

/// Whether `source`, read as a CEL expression, calls a library that needs the host (see
/// [`Expr::uses_host`]); text that does not compile as CEL does not.
pub fn calls_host(source: &str) -> bool {
    Expr::compile(source).is_ok_and(|e| e.uses_host)
}

/// CEL → JSON (durations as Go-style strings, timestamps as RFC 3339, bytes as base64 is not
/// needed by any caller yet and is an error).
pub fn to_json(v: &Value) -> Result<serde_json::Value, EvalError> {
    Ok(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::UInt(u) => serde_json::Value::from(*u),
        Value::Float(f) => {
            serde_json::Number::from_f64(*f).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null)
        }
        Value::String(s) => serde_json::Value::String(s.to_string()),
        Value::List(l) => serde_json::Value::Array(l.iter().map(to_json).collect::<Result<_, _>>()?),
        Value::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m.map.iter() {
                let key = match k {
                    Key::String(s) => s.to_string(),
                    Key::Int(i) => i.to_string(),
                    Key::Uint(u) => u.to_string(),
                    Key::Bool(b) => b.to_string(),
                };
                out.insert(key, to_json(x)?);
            }
            serde_json::Value::Object(out)
        }
        Value::Duration(d) => serde_json::Value::String(format!("{}s", d.num_milliseconds() as f64 / 1000.0)),
        Value::Timestamp(t) => serde_json::Value::String(t.to_rfc3339()),
        other => return Err(EvalError::NoJsonForm { type_name: type_name(other) }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(object: serde_json::Value) -> Vars {
        let mut v = Vars::default();
        v.set("object", &object);
        v
    }

    /// Compiles and evaluates `src`; either error as its message (the text the assertions
    /// compare).
    fn run(src: &str, v: &Vars) -> Result<serde_json::Value, String> {
        Expr::compile(src).map_err(|e| e.to_string())?.eval(v).map_err(|e| e.to_string())
    }

    /// [`run`] of a condition.
    fn run_bool(src: &str, v: &Vars) -> Result<bool, String> {
        Expr::compile(src).map_err(|e| e.to_string())?.eval_bool(v).map_err(|e| e.to_string())
    }

    #[test]
    fn kubernetes_style_expressions() {
        let pod = json!({"spec": {"replicas": 2, "containers": [{"name": "a", "image": "nginx:latest"}, {"name": "b", "image": "redis:7"}]}});
        let v = vars(pod);
        let t = |s: &str| run_bool(s, &v);
        assert_eq!(t("object.spec.replicas + 1 == 3"), Ok(true));
        assert_eq!(t("object.spec.containers.all(c, c.image.contains(':'))"), Ok(true));
        assert_eq!(t("object.spec.containers.exists(c, c.image.endsWith(':latest'))"), Ok(true));
        assert_eq!(t("has(object.spec.hostNetwork)"), Ok(false));
        assert_eq!(t("object.spec.?hostNetwork.orValue(false) == false"), Ok(true));
        assert_eq!(t("'a,b'.split(',').size() == 2"), Ok(true));
        // Kyverno's orValue on a value read without `?.`
        assert_eq!(t("object.spec.containers.orValue([]).size() == 2"), Ok(true));
        assert_eq!(t("object.spec.?containers.orValue([]).size() == 2"), Ok(true));
        assert_eq!(t("object.spec.?nothing.orValue([]).size() == 0"), Ok(true));
        assert_eq!(t("object.spec.?nothing.deeper.orValue(7) == 7"), Ok(true));
        assert_eq!(t("object.spec.containers[0].?securityContext.allowPrivilegeEscalation.orValue(true)"), Ok(true));
        assert_eq!(t("object.spec.containers.map(c, c.name).filter(n, n.startsWith('a')) == ['a']"), Ok(true));
        assert!(t("object.spec.replicas").is_err());
        assert!(Expr::compile("object.spec.(").is_err());
        // The cost budget: four nested loops compile, five do not.
        assert!(Expr::compile("[1].all(a, [1].all(b, [1].all(c, [1].all(d, true))))").is_ok());
        let deep = Expr::compile("[1].all(a, [1].all(b, [1].all(c, [1].all(d, [1].exists(e, true)))))");
        assert!(deep.as_ref().is_err_and(|e| e.to_string().contains("nests 5 loops")), "{deep:?}");
    }

    /// Two loops over a 30 000-item list ran for minutes after the answer was
    /// sent; the estimate refuses them before they start.
    #[test]
    fn loops_over_wide_inputs_are_refused_by_the_runtime_budget() {
        let items: Vec<serde_json::Value> = (0..30_000).map(|i| json!(i)).collect();
        let v = vars(json!({"items": items}));
        let quadratic = Expr::compile("object.items.all(a, object.items.all(b, a + b >= 0))").unwrap();
        let err = quadratic.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(err, "the expression's estimated cost (30000 ^ 2 loop iterations) exceeds the budget of 10000000");
        // One loop over the same list is within the budget, and so are two over small lists.
        assert_eq!(run_bool("object.items.all(a, a >= 0)", &v), Ok(true));
        let small = vars(json!({"items": [1, 2, 3]}));
        assert_eq!(quadratic.eval_bool(&small), Ok(true));
    }

    /// A list the expression builds itself (`split`) escaped the estimate,
    /// and a running evaluation was never interrupted: two 100 KB annotations with this
    /// expression held the server for a minute. The meter stops it with an error, soon.
    #[test]
    fn loops_over_lists_an_expression_builds_meet_the_runtime_limit() {
        let owners = (0..50_000).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let v = vars(json!({"metadata": {"annotations": {"owners": owners}}}));
        let e = Expr::compile(
            "object.metadata.annotations.owners.split(',').all(a, \
             object.metadata.annotations.owners.split(',').exists_one(b, a == b))",
        )
        .unwrap();
        let err = e.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("runtime cost exceeds the budget of 1000000"), "{err}");
        // What one iteration builds is paid too: few iterations, each building a large list.
        let wide = Expr::compile(
            "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(i, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(j, \
             object.metadata.annotations.owners.split(','))).size() > 0",
        )
        .unwrap();
        let err = wide.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("runtime cost exceeds the budget"), "100 splits of 50 000: {err}");
        let wider = Expr::compile(
            "object.metadata.annotations.owners.split(',').map(i, object.metadata.annotations.owners.split(',')).size() > 0",
        )
        .unwrap();
        let err = wider.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("runtime cost exceeds the budget"), "{err}");
        // Small inputs are untouched by it, and the loop's answer is the same.
        let small = vars(json!({"metadata": {"annotations": {"owners": "a,b,c"}}}));
        assert_eq!(e.eval_bool(&small), Ok(true));
    }

    /// The caller's cancel flag stops an evaluation that is running, not only
    /// one that has not started.
    #[test]
    fn a_running_evaluation_stops_when_cancelled() {
        let owners = (0..900).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let mut v = vars(json!({"metadata": {"annotations": {"owners": owners}}}));
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        v.set_cancel(flag.clone());
        // About 810 000 iterations: within the limit, a second or more of work in a debug build.
        let e = Expr::compile(
            "object.metadata.annotations.owners.split(',').all(a, \
             object.metadata.annotations.owners.split(',').exists_one(b, a == b))",
        )
        .unwrap();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let err = e.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        setter.join().unwrap();
        assert!(err.contains("cancelled"), "{err}");
    }

    /// Lists and strings built through composition variables (each one
    /// doubling the last) grew without bound, and a list built by one loop widened the next
    /// loop's input beyond the estimate. Built variables count in the estimate, and a result over
    /// the element or text budget is an error.
    #[test]
    fn values_built_through_variables_are_bounded() {
        let items: Vec<serde_json::Value> = (0..500).map(|i| json!(i)).collect();
        let mut v = vars(json!({"items": items}));
        // A quarter-million-element list from one loop is within the budgets ...
        let square = Expr::compile("object.items.map(a, object.items).flatten()").unwrap();
        assert!(square.eval_into_variable("flat", &mut v).is_ok());
        // ... and two loops over it meet the estimate: the variable's width counts, not only
        // the 500 of the inputs (before, 62 500 million iterations started).
        let wider = Expr::compile("variables.flat.all(x, variables.flat.exists(y, y < 0))").unwrap();
        let err = wider.eval_bool(&v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("exceeds the budget"), "{err}");
        // `variables.<p>N = <p>N-1 + <p>N-1` from `start`, until an evaluation fails: its error.
        let mut doubling = |prefix: &str, start: serde_json::Value, rounds: usize| {
            v.set_variable(&format!("{prefix}0"), &start);
            (1..rounds)
                .find_map(|i| {
                    let e =
                        Expr::compile(&format!("variables.{prefix}{} + variables.{prefix}{}", i - 1, i - 1)).unwrap();
                    e.eval_into_variable(&format!("{prefix}{i}"), &mut v).err().map(|e| e.to_string())
                })
                .unwrap_or_default()
        };
        // Doubling a string through variables stops at the text budget.
        let err = doubling("d", json!("x".repeat(1 << 16)), 20);
        assert!(err.contains("bytes of text"), "{err}");
        // Doubling a list through variables stops at the element budget.
        let err = doubling("l", json!((0..1000).collect::<Vec<_>>()), 30);
        assert!(err.contains("elements"), "{err}");
    }

    /// Policies evaluating one request share the variables they define by the same expression
    /// over the request; a variable reading `params` or another variable is each policy's own,
    /// and a changed input is never served a stale value.
    #[test]
    fn composition_variables_are_shared_between_clones() {
        let mut base = vars(json!({"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}}));
        base.share_results();
        let all = Expr::compile("object.spec.containers + object.spec.?initContainers.orValue([])").unwrap();
        let names = Expr::compile("variables.all.map(c, c.name)").unwrap();
        let with_params = Expr::compile("object.spec.containers.map(c, c.name + params)").unwrap();
        assert!(all.shareable && !names.shareable && !with_params.shareable);
        let eval = |v: &mut Vars, p: &str| {
            v.set("params", &json!(p));
            all.eval_into_variable("all", v).unwrap();
            names.eval_into_variable("names", v).unwrap();
            with_params.eval_into_variable("p", v).unwrap();
            let read = |e: &str| run(e, v).unwrap();
            (read("variables.names"), read("variables.p"))
        };
        let (mut first, mut second) = (base.clone(), base.clone());
        assert_eq!(eval(&mut first, "-1"), (json!(["a", "i"]), json!(["a-1"])));
        assert_eq!(eval(&mut second, "-2"), (json!(["a", "i"]), json!(["a-2"])));
        assert_eq!(base.shared.as_ref().and_then(|s| s.lock().ok().map(|s| s.len())), Some(1));
        // Changing the object (as a mutation does) stops the sharing for that copy.
        let mut changed = base.clone();
        changed.set("object", &json!({"spec": {"containers": [{"name": "b"}]}}));
        assert_eq!(eval(&mut changed, "-3"), (json!(["b"]), json!(["b-3"])));
        // The budget still applies to a shared value: a wide earlier variable refuses it.
        let looping = Expr::compile("object.spec.containers.filter(c, c.name != '')").unwrap();
        let mut wide = base.clone();
        looping.eval_into_variable("l", &mut base.clone()).unwrap();
        wide.widest = 20_000_000;
        let err = looping.eval_into_variable("l", &mut wide).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("exceeds the budget"), "{err}");
    }

    #[test]
    fn composition_variables() {
        let mut v = vars(json!({"metadata": {"name": "x"}}));
        v.set_variable("name", &json!("x"));
        assert_eq!(run_bool("variables.name == object.metadata.name", &v), Ok(true));
    }

    #[test]
    fn mutation_struct_literals_are_maps() {
        let v = vars(json!({"spec": {"containers": [{"name": "a", "image": "nginx"}]}}));
        let e = |s: &str| run(s, &v);
        assert_eq!(
            e(
                "Object{spec: Object.spec{containers: object.spec.containers.map(c, Object.spec.containers{name: c.name, image: 'r.io/' + c.image})}}"
            ),
            Ok(json!({"spec": {"containers": [{"name": "a", "image": "r.io/nginx"}]}}))
        );
        assert_eq!(
            e(
                "[JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('a/b~c'), value: 'x'}].filter(p, p.op == 'add')"
            ),
            Ok(json!([{"op": "add", "path": "/metadata/labels/a~1b~0c", "value": "x"}]))
        );
        // Other struct types are still unknown.
        assert!(e("acme.Thing{a: 1}").is_err());
    }

    #[test]
    fn kubernetes_list_sets_and_regex_functions() {
        let v = vars(json!({"l": [3, 1, 2], "s": ["a", "b"]}));
        let t = |s: &str| run(s, &v);
        assert_eq!(t("object.s.indexOf('b')"), Ok(json!(1)));
        assert_eq!(t("object.s.indexOf('z')"), Ok(json!(-1)));
        assert_eq!(t("[1, 2, 1].lastIndexOf(1)"), Ok(json!(2)));
        assert_eq!(t("'abc'.indexOf('c')"), Ok(json!(2)));
        assert_eq!(t("object.l.sum()"), Ok(json!(6)));
        assert_eq!(t("object.l.min()"), Ok(json!(1)));
        assert_eq!(t("object.l.max()"), Ok(json!(3)));
        assert_eq!(t("object.l.isSorted()"), Ok(json!(false)));
        assert_eq!(t("sets.contains(['a', 'b', 'c'], object.s)"), Ok(json!(true)));
        assert_eq!(t("sets.equivalent(['b', 'a'], object.s)"), Ok(json!(true)));
        assert_eq!(t("sets.intersects(['z'], object.s)"), Ok(json!(false)));
        assert_eq!(t("'abc 123 def 456'.find('[0-9]+')"), Ok(json!("123")));
        assert_eq!(t("'abc 123 def 456'.findAll('[0-9]+')"), Ok(json!(["123", "456"])));
        assert_eq!(t("'a1b2c3'.findAll('[0-9]', 2)"), Ok(json!(["1", "2"])));
        assert!(t("[].min()").is_err());
        assert_eq!(
            t(r#"regex.replace('docker.io/nginx', '^docker\\.io/(.*)', r'my.io/\1')"#),
            Ok(json!("my.io/nginx"))
        );
    }

    struct TestHost;
    impl Host for TestHost {
        fn resource_get(
            &self,
            api_version: &str,
            resource: &str,
            namespace: &str,
            name: &str,
        ) -> Result<serde_json::Value, HostError> {
            match (api_version, resource, namespace, name) {
                ("v1", "configmaps", "default", "cfg") => Ok(json!({"data": {"env": "prod"}})),
                _ => Err(HostError::Failed(format!("{resource} {namespace}/{name} not found"))),
            }
        }
        fn resource_list(&self, _: &str, _: &str, _: &str) -> Result<Vec<serde_json::Value>, HostError> {
            Ok(vec![json!({"metadata": {"name": "a", "labels": {"t": "x"}}}), json!({"metadata": {"name": "b"}})])
        }
        fn now(&self) -> Option<i64> {
            Some(1_700_000_000)
        }
        fn authorize(&self, review: &serde_json::Value) -> Result<serde_json::Value, HostError> {
            // Only `deploy-bot` may delete deployments in `apps`.
            let ok = review["user"] == "system:serviceaccount:apps:deploy-bot"
                && review["resourceAttributes"]["group"] == "apps"
                && review["resourceAttributes"]["resource"] == "deployments"
                && review["resourceAttributes"]["namespace"] == "apps"
                && review["resourceAttributes"]["verb"] == "delete";
            Ok(json!({"allowed": ok, "reason": if ok { "bound" } else { "" }}))
        }
    }

    #[test]
    fn the_authorizer_library_asks_the_host_for_an_access_review() {
        let mut v = vars(json!({}));
        v.set("request", &json!({"userInfo": {"username": "alice", "groups": ["devs"]}}));
        let t = |s: &str, v: &Vars| run(s, v);
        let sa =
            "authorizer.serviceAccount('apps', 'deploy-bot').group('apps').resource('deployments').namespace('apps')";
        let err = t(&format!("{sa}.check('delete').allowed()"), &v);
        assert!(err.as_ref().is_err_and(|e| e.contains("not available")), "{err:?}");
        v.set_host(Arc::new(TestHost));
        assert_eq!(t(&format!("{sa}.check('delete').allowed()"), &v), Ok(json!(true)));
        assert_eq!(t(&format!("{sa}.check('delete').reason()"), &v), Ok(json!("bound")));
        assert_eq!(t(&format!("{sa}.check('create').allowed()"), &v), Ok(json!(false)));
        assert_eq!(t(&format!("{sa}.check('delete').errored()"), &v), Ok(json!(false)));
        // `authorizer` alone is the requesting user.
        assert_eq!(
            t("authorizer.group('apps').resource('deployments').namespace('apps').check('delete').allowed()", &v),
            Ok(json!(false))
        );
        // Only authorizer values have these methods.
        assert!(t("'x'.check('get')", &v).is_err());
    }

    #[test]
    fn kyverno_libraries_ask_the_host() {
        let mut v = vars(json!({}));
        let t = |s: &str, v: &Vars| run(s, v);
        // Without a host the functions say they are not available.
        let err = t("resource.Get('v1', 'configmaps', 'default', 'cfg')", &v);
        assert!(err.as_ref().is_err_and(|e| e.contains("not available")), "{err:?}");
        v.set_host(Arc::new(TestHost));
        assert_eq!(t("resource.Get('v1', 'configmaps', 'default', 'cfg').data.env", &v), Ok(json!("prod")));
        assert_eq!(t("resource.get('v1', 'configmaps', 'default', 'cfg').data.env", &v), Ok(json!("prod")));
        assert!(t("resource.Get('v1', 'configmaps', 'default', 'nope')", &v).is_err_and(|e| e.contains("not found")));
        assert_eq!(t("resource.List('v1', 'configmaps', '').items.size()", &v), Ok(json!(2)));
        assert_eq!(
            t("resource.List('v1', 'configmaps', '', {'t': 'x'}).items.map(i, i.metadata.name)", &v),
            Ok(json!(["a"]))
        );
        assert_eq!(t("time.now() > timestamp('2023-01-01T00:00:00Z')", &v), Ok(json!(true)));
        assert!(t("http.Get('https://x')", &v).is_err());
        // Through a client with its own CA bundle: still the host's answer.
        let via_client = t("http.Client('-----BEGIN CERTIFICATE-----').Get('https://x')", &v);
        assert!(via_client.as_ref().is_err_and(|e| e.contains("http call to https://x")), "{via_client:?}");
        // A kind's GVR (Kubernetes' guess of the plural) stands for apiVersion and resource.
        assert_eq!(
            t("resource.ToGVR('networking.k8s.io/v1', 'NetworkPolicy')", &v),
            Ok(json!({"group": "networking.k8s.io", "version": "v1", "resource": "networkpolicies"}))
        );
        assert_eq!(t("resource.ToGVR('v1', 'Ingress').resource", &v), Ok(json!("ingresses")));
        assert_eq!(
            t("resource.get(resource.ToGVR('v1', 'ConfigMap'), 'default', 'cfg').data.env", &v),
            Ok(json!("prod"))
        );
        assert_eq!(t("resource.list(resource.ToGVR('v1', 'ConfigMap'), '').items.size()", &v), Ok(json!(2)));
    }

    #[test]
    fn image_references_parse_like_go_containerregistry() {
        let v = vars(json!({}));
        let t = |s: &str| run(s, &v);
        assert_eq!(t("image('nginx').registry()"), Ok(json!("index.docker.io")));
        assert_eq!(t("image('nginx').repository()"), Ok(json!("library/nginx")));
        assert_eq!(t("image('nginx').tag()"), Ok(json!("latest")));
        assert_eq!(t("parseImageReference('ghcr.io/kyverno/kyverno@sha256:0123').containsDigest()"), Ok(json!(true)));
        assert_eq!(t("isImageReference('ghcr.io/kyverno/kyverno:v1')"), Ok(json!(true)));
        assert_eq!(t("image('corp.reg.com/team/app:1.2').registry()"), Ok(json!("corp.reg.com")));
        assert_eq!(t("image('localhost:5000/app@sha256:abc').containsDigest()"), Ok(json!(true)));
        assert_eq!(t("image('ghcr.io/org/app@sha256:abc').identifier()"), Ok(json!("sha256:abc")));
        assert_eq!(t("isImage('UPPER/case')"), Ok(json!(false)));
        assert!(t("image('')").is_err());
    }

    /// Kyverno's `user` library (its sample policies use it to read a request's service account).
    #[test]
    fn service_account_usernames_parse_into_namespace_and_name() {
        let v = vars(json!({}));
        let t = |s: &str| run(s, &v);
        assert_eq!(t("parseServiceAccount('system:serviceaccount:ci:deployer').Namespace"), Ok(json!("ci")));
        assert_eq!(t("user.parseServiceAccount('system:serviceaccount:ci:deployer').Name"), Ok(json!("deployer")));
        assert_eq!(t("parseServiceAccount('alice').Name"), Ok(json!("")));
        assert_eq!(t("parseServiceAccount('system:serviceaccount:ci').Namespace"), Ok(json!("")));
    }

    /// cel-go's `cel.bind` (a false deny when missing: the expression failed to evaluate).
    #[test]
    fn cel_bind_names_a_value_for_an_expression() {
        let v =
            vars(json!({"spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:latest"}]}}));
        let t = |s: &str| run(s, &v);
        assert_eq!(t("cel.bind(x, 2, x * x + x)"), Ok(json!(6)));
        assert_eq!(
            t("cel.bind(cs, object.spec.containers, cs.filter(c, c.image.endsWith(':latest')).map(c, c.name))"),
            Ok(json!(["b"]))
        );
        assert_eq!(t("cel.bind(a, 1, cel.bind(b, a + 1, [a, b]))"), Ok(json!([1, 2])));
    }

    /// Kubernetes' quantity library (a false deny when missing: resource-limit checks failed
    /// to evaluate).
    #[test]
    fn quantities_compare_add_and_convert() {
        let v = vars(json!({"spec": {"containers": [{"resources": {"limits": {"memory": "512Mi", "cpu": "500m"}}}]}}));
        let t = |s: &str| run(s, &v);
        assert_eq!(
            t("quantity(object.spec.containers[0].resources.limits.memory).isLessThan(quantity('1Gi'))"),
            Ok(json!(true))
        );
        assert_eq!(t("quantity('1') == quantity('1000m')"), Ok(json!(true)));
        assert_eq!(t("quantity('1Gi').compareTo(quantity('1G'))"), Ok(json!(1)));
        assert_eq!(t("quantity('500m').add(quantity('1.5')).asInteger()"), Ok(json!(2)));
        assert_eq!(t("quantity('2').sub(1).isGreaterThan(quantity('999m'))"), Ok(json!(true)));
        assert_eq!(t("quantity('-3').sign()"), Ok(json!(-1)));
        assert_eq!(t("quantity('500m').isInteger()"), Ok(json!(false)));
        assert_eq!(t("quantity('250m').asApproximateFloat()"), Ok(json!(0.25)));
        assert_eq!(t("isQuantity('1Gi') && !isQuantity('1GB')"), Ok(json!(true)));
        assert!(t("quantity('500m').asInteger()").is_err());
        assert!(t("quantity('lots')").is_err());
        assert_eq!(
            t("object.spec.containers.all(c, quantity(c.resources.limits.cpu).isLessThan(quantity('1')))"),
            Ok(json!(true))
        );
    }
}
