//! JMESPath in Kyverno's dialect: the 2015 grammar, go-jmespath's "missing key is an error"
//! behaviour, the builtin functions (with Kyverno's `sum`) and Kyverno's custom functions.
//!
//! Compile once with [`Expression::compile`], evaluate many times with [`Expression::search`]
//! on a borrowed `serde_json::Value`. Knows nothing about Kubernetes beyond quantities.

mod ast;
pub mod duration;
mod error;
pub mod functions;
mod interpreter;
mod lexer;
mod parser;
pub mod quantity;
pub mod random;
pub mod semver;
pub mod value;
pub mod wildcard;
pub mod yaml;

pub use ast::Ast;
pub use error::{ParseError, RuntimeError, SearchError};
pub use functions::{Function, all as all_functions};
pub use functions::{ImageRefError, X509DecodeError, cron_of, go_truncation, normalize_image, x509_decode};
pub use interpreter::Items;

use serde_json::Value;
use std::borrow::Cow;

/// What evaluation needs from the outside world. The default answers nothing, which keeps
/// evaluation pure: `time_now` then reports that no clock is available.
pub trait Env: Sync {
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        None
    }
    fn resolve_host(&self, _host: &str) -> Option<Vec<std::net::IpAddr>> {
        None
    }
    /// A fresh seed for `random()`; `None` when this environment offers no randomness (the
    /// function then reports that). The engine never draws from the thread RNG itself.
    fn random_seed(&self) -> Option<u64> {
        None
    }
    /// Whether the caller has given up on this evaluation (its deadline passed): a long
    /// evaluation checks now and then and stops with an error.
    fn cancelled(&self) -> bool {
        self.cancel_flag().is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    }
    /// The flag behind [`Env::cancelled`], for evaluators that outlive one call (CEL variables).
    fn cancel_flag(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicBool>> {
        None
    }
    /// The value of `$name` (community dialect only); `None`: not defined, an error.
    fn variable(&self, _name: &str) -> Option<Value> {
        None
    }
}

/// Which JMESPath an expression is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// Kyverno's (go-jmespath fork): the 2015 grammar, a missing key in a field path is an
    /// error, Kyverno's functions. Everything the engine compiles.
    #[default]
    Kyverno,
    /// jmespath-community as kyverno-json and chainsaw use it: `$name` variables from
    /// [`Env::variable`], a missing key is `null`, and chainsaw's extra functions
    /// (`functions::community`) besides Kyverno's. Only for the test runner's assertions.
    Community,
}

/// A read of the data's root an expression makes, as [`root_reads`] reports it.
enum RootRead<'a> {
    /// `<field>` at the root; with the field of it read right after, if one is
    /// (`request.operation`: `("request", Some("operation"))`).
    Field(&'a str, Option<&'a str>),
    /// A function call, by name (its arguments are walked too).
    Call(&'a str),
}

/// Walks `a`, evaluated against the root when `at_root`, handing each read of the root to
/// `seen`; `false` when `seen` refuses one, or when the root is read as a whole (`@`, an index
/// or slice of it) or a variable is.
fn root_reads<'a>(a: &'a Ast, at_root: bool, seen: &mut dyn FnMut(RootRead<'a>) -> bool) -> bool {
    match a {
        Ast::Subexpr(l, r) if at_root => match (&**l, &**r) {
            (Ast::Field(f), Ast::Field(g)) => seen(RootRead::Field(f, Some(g))),
            _ => root_reads(l, true, seen) && root_reads(r, false, seen),
        },
        Ast::Field(f) if at_root => seen(RootRead::Field(f, None)),
        Ast::Identity | Ast::Index(_) | Ast::Slice { .. } => !at_root,
        Ast::Field(_) | Ast::Literal(_) => true,
        Ast::Variable(_) => false,
        Ast::Subexpr(l, r) | Ast::Projection(l, r) | Ast::ValueProjection(l, r) | Ast::Pipe(l, r) => {
            root_reads(l, at_root, seen) && root_reads(r, false, seen)
        }
        Ast::FilterProjection { lhs, rhs, cond } => {
            root_reads(lhs, at_root, seen) && root_reads(rhs, false, seen) && root_reads(cond, false, seen)
        }
        Ast::Flatten(x) | Ast::Not(x) => root_reads(x, at_root, seen),
        Ast::Expref(x) => root_reads(x, false, seen),
        Ast::MultiList(xs) => xs.iter().all(|x| root_reads(x, at_root, seen)),
        Ast::MultiHash(xs) => xs.iter().all(|(_, x)| root_reads(x, at_root, seen)),
        Ast::And(l, r) | Ast::Or(l, r) | Ast::Compare(_, l, r) => {
            root_reads(l, at_root, seen) && root_reads(r, at_root, seen)
        }
        Ast::Call(f, args) => seen(RootRead::Call(f.name)) && args.iter().all(|x| root_reads(x, at_root, seen)),
    }
}

/// See [`Expression::sole_root_field`]. A Kyverno-dialect expression only: the community
/// dialect reads `$` variables from the caller.
fn sole_root_field(ast: &Ast, dialect: Dialect) -> Option<String> {
    if dialect != Dialect::Kyverno {
        return None;
    }
    let mut field: Option<&str> = None;
    // Every root read through one field, and nothing that depends on the clock or randomness.
    let one = root_reads(ast, true, &mut |read| match read {
        RootRead::Field(f, _) => *field.get_or_insert(f) == f,
        RootRead::Call(name) => !(name.contains("random") || name.starts_with("time_now")),
    });
    if one { field.map(str::to_string) } else { None }
}

/// See [`Expression::request_fields`].
fn request_fields(ast: &Ast, dialect: Dialect) -> Option<Vec<String>> {
    if dialect != Dialect::Kyverno {
        return None;
    }
    let mut fields: Vec<String> = Vec::new();
    // `request` read only as `request.<field>`; other root fields and every call are fine.
    let only_fields = root_reads(ast, true, &mut |read| match read {
        RootRead::Field("request", Some(f)) => {
            if !fields.iter().any(|x| x == f) {
                fields.push(f.to_string());
            }
            true
        }
        RootRead::Field(f, _) => f != "request",
        RootRead::Call(_) => true,
    });
    only_fields.then_some(fields)
}

/// An environment with no clock and no DNS.
pub struct NoEnv;
impl Env for NoEnv {}

/// How an expression reads `request.object` of the data it is evaluated against (see
/// [`Expression::request_object`]).
#[derive(Debug, Clone)]
pub enum ObjectReads {
    /// Never: neither `request.object` nor `request` or the root as a whole. Evaluated against
    /// data without `request.object` it gives the same result.
    No,
    /// Only through `request.object`: this expression, evaluated against `request.object`'s
    /// value, gives the same result as the whole expression against the data.
    Only(Box<Expression>),
    /// `request.object` and something else, or `request` or the root as a whole (or the
    /// expression reads variables, or is in the community dialect): it needs the whole data.
    Whole,
}

/// A compiled expression.
#[derive(Debug, Clone)]
pub struct Expression {
    source: String,
    ast: Ast,
    dialect: Dialect,
    /// The one field of the data's root every read goes through, when there is one (see
    /// [`Expression::sole_root_field`]).
    root_field: Option<String>,
    /// How it reads `request.object` (see [`Expression::request_object`]).
    object: ObjectReads,
    /// How it reads `element` (see [`Expression::element`]).
    element: ObjectReads,
    /// The fields of `request` it reads (see [`Expression::request_fields`]).
    request: Option<Vec<String>>,
}

/// Works out [`ObjectReads`] for `ast`: the tree is walked with whether each node is evaluated
/// against the root; `request.object` at the root becomes the current node of the copy. With
/// `element`, the same for the root's `element` (a foreach element lent the same way).
fn object_reads(ast: &Ast, dialect: Dialect, element: bool) -> ObjectReads {
    #[derive(Default)]
    struct Seen {
        /// What is looked for: `element`, else `request.object`.
        element: bool,
        object: bool,
        other: bool,
        whole: bool,
    }
    fn walk(a: &Ast, at_root: bool, seen: &mut Seen) -> Ast {
        // `l` read where this node is, `r` against `l`'s result.
        let chain = |make: fn(Box<Ast>, Box<Ast>) -> Ast, l: &Ast, r: &Ast, seen: &mut Seen| {
            make(Box::new(walk(l, at_root, seen)), Box::new(walk(r, false, seen)))
        };
        // Both operands read where this node is.
        let both = |make: fn(Box<Ast>, Box<Ast>) -> Ast, l: &Ast, r: &Ast, seen: &mut Seen| {
            make(Box::new(walk(l, at_root, seen)), Box::new(walk(r, at_root, seen)))
        };
        match a {
            Ast::Subexpr(l, r) if at_root && !seen.element && matches!(&**l, Ast::Field(f) if f == "request") => {
                match &**r {
                    Ast::Field(f) if f == "object" => {
                        seen.object = true;
                        Ast::Identity
                    }
                    // `request.operation`, `request.namespace`…: read from the data as it is.
                    Ast::Field(_) => {
                        seen.other = true;
                        a.clone()
                    }
                    _ => {
                        seen.whole = true;
                        a.clone()
                    }
                }
            }
            Ast::Field(f) if at_root && seen.element && f == "element" => {
                seen.object = true;
                Ast::Identity
            }
            Ast::Field(f) if at_root => {
                if f == "request" && !seen.element {
                    seen.whole = true;
                } else {
                    seen.other = true;
                }
                a.clone()
            }
            Ast::Identity | Ast::Index(_) | Ast::Slice { .. } if at_root => {
                seen.whole = true;
                a.clone()
            }
            Ast::Variable(_) => {
                seen.whole = true;
                a.clone()
            }
            Ast::Identity | Ast::Index(_) | Ast::Slice { .. } | Ast::Field(_) | Ast::Literal(_) => a.clone(),
            // `request.object.x` is read as `x` against the object (not `@.x`: the interpreter's
            // shortcuts recognise field paths).
            Ast::Subexpr(l, r) => match walk(l, at_root, seen) {
                Ast::Identity => walk(r, false, seen),
                l => Ast::Subexpr(Box::new(l), Box::new(walk(r, false, seen))),
            },
            Ast::Projection(l, r) => chain(Ast::Projection, l, r, seen),
            Ast::ValueProjection(l, r) => chain(Ast::ValueProjection, l, r, seen),
            Ast::Pipe(l, r) => chain(Ast::Pipe, l, r, seen),
            Ast::FilterProjection { lhs, rhs, cond } => Ast::FilterProjection {
                lhs: Box::new(walk(lhs, at_root, seen)),
                rhs: Box::new(walk(rhs, false, seen)),
                cond: Box::new(walk(cond, false, seen)),
            },
            Ast::Flatten(x) => Ast::Flatten(Box::new(walk(x, at_root, seen))),
            Ast::Not(x) => Ast::Not(Box::new(walk(x, at_root, seen))),
            Ast::Expref(x) => Ast::Expref(Box::new(walk(x, false, seen))),
            Ast::MultiList(xs) => Ast::MultiList(xs.iter().map(|x| walk(x, at_root, seen)).collect()),
            Ast::MultiHash(xs) => Ast::MultiHash(xs.iter().map(|(k, x)| (k.clone(), walk(x, at_root, seen))).collect()),
            Ast::Call(f, args) => Ast::Call(f, args.iter().map(|x| walk(x, at_root, seen)).collect()),
            Ast::And(l, r) => both(Ast::And, l, r, seen),
            Ast::Or(l, r) => both(Ast::Or, l, r, seen),
            Ast::Compare(c, l, r) => {
                Ast::Compare(*c, Box::new(walk(l, at_root, seen)), Box::new(walk(r, at_root, seen)))
            }
        }
    }
    if dialect != Dialect::Kyverno {
        return ObjectReads::Whole;
    }
    let mut seen = Seen { element, ..Seen::default() };
    let rewritten = walk(ast, true, &mut seen);
    match seen {
        Seen { whole: true, .. } | Seen { object: true, other: true, .. } => ObjectReads::Whole,
        Seen { object: false, .. } => ObjectReads::No,
        Seen { object: true, .. } => ObjectReads::Only(Box::new(Expression {
            source: String::new(),
            root_field: sole_root_field(&rewritten, dialect),
            ast: rewritten,
            dialect,
            // Evaluated against the object itself: its own `request.object` means nothing here.
            object: ObjectReads::Whole,
            element: ObjectReads::Whole,
            request: None,
        })),
    }
}

impl Expression {
    pub fn compile(src: &str) -> Result<Expression, ParseError> {
        Expression::compile_in(src, Dialect::Kyverno)
    }

    /// Compiles in the given dialect.
    pub fn compile_in(src: &str, dialect: Dialect) -> Result<Expression, ParseError> {
        let ast = parser::parse(src, dialect)?;
        Ok(Expression::of(src.to_string(), ast, dialect))
    }

    fn of(source: String, ast: Ast, dialect: Dialect) -> Expression {
        Expression {
            root_field: sole_root_field(&ast, dialect),
            object: object_reads(&ast, dialect, false),
            element: object_reads(&ast, dialect, true),
            request: request_fields(&ast, dialect),
            source,
            ast,
            dialect,
        }
    }

    /// How the expression reads `request.object`: a caller whose data lacks it (the engine's
    /// context lends the request's object instead of copying it in) evaluates an
    /// [`ObjectReads::Only`] expression against the object and an [`ObjectReads::No`] one
    /// against the data as it is.
    pub fn request_object(&self) -> &ObjectReads {
        &self.object
    }

    /// How the expression reads the root's `element`, as [`Expression::request_object`] tells
    /// for `request.object` (`Only`: evaluated against the element it gives the same result).
    pub fn element(&self) -> &ObjectReads {
        &self.element
    }

    /// The fields of the root's `request` the expression reads, each as `request.<field>`
    /// (`["operation"]` for `request.operation || 'BACKGROUND'`; empty when it never reads
    /// `request`); `None` when it reads `request` some other way (`keys(request)`, `@`, a
    /// variable) or is in the community dialect. Evaluated against data whose `request` has
    /// these fields as they are in another, it gives the same result as against that other.
    pub fn request_fields(&self) -> Option<&[String]> {
        self.request.as_deref()
    }

    /// The one field of the data's root that everything the expression reads is under
    /// (`request` for `request.object.spec.containers[].image` or
    /// `request.operation || 'BACKGROUND'`), when there is one and the result depends on
    /// nothing else: no variables, no randomness, no clock. Two evaluations against data whose
    /// `field` is the same give the same result.
    pub fn sole_root_field(&self) -> Option<&str> {
        self.root_field.as_deref()
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn ast(&self) -> &Ast {
        &self.ast
    }

    /// The expression with `root.field` (a path from the root of the data) read as
    /// `root.renamed`, rewritten on the tree; `None` when the expression never reads it. Kyverno
    /// reads `request.object` as `request.oldObject` on DELETE this way.
    pub fn with_root_field_renamed(&self, root: &str, field: &str, renamed: &str) -> Option<Expression> {
        let rename = |a: &Ast| match a {
            Ast::Subexpr(l, r)
                if matches!(&**l, Ast::Field(f) if f == root) && matches!(&**r, Ast::Field(f) if f == field) =>
            {
                Some(Ast::Subexpr(l.clone(), Box::new(Ast::Field(renamed.to_string()))))
            }
            _ => None,
        };
        let ast = self.ast.rewrite(&rename)?;
        let source = self.source.replace(&format!("{root}.{field}"), &format!("{root}.{renamed}"));
        Some(Expression::of(source, ast, self.dialect))
    }

    /// Evaluates against `data`; the result may borrow from it.
    pub fn search<'a>(&self, data: &'a Value, env: &dyn Env) -> Result<Cow<'a, Value>, RuntimeError> {
        let meter = interpreter::Meter::new(env, self.dialect);
        let out = interpreter::eval(&self.ast, data, &meter);
        // Running out is sticky: operators that read errors as null must not hide it.
        match meter.exhausted() {
            Some(e) => Err(e),
            None => out,
        }
    }

    /// [`Expression::search`] for a caller that iterates a list result (a foreach): the
    /// elements a flatten picks from `data` are borrowed there instead of copied into a new
    /// list; the budget is charged the same.
    pub fn search_items<'a>(&self, data: &'a Value, env: &dyn Env) -> Result<Items<'a>, RuntimeError> {
        let meter = interpreter::Meter::new(env, self.dialect);
        let out = interpreter::items(&self.ast, data, &meter);
        match meter.exhausted() {
            Some(e) => Err(e),
            None => out,
        }
    }
}

/// Compiles and evaluates in one step (for the playground and tests).
pub fn search(expr: &str, data: &Value) -> Result<Value, SearchError> {
    let e = Expression::compile(expr)?;
    Ok(e.search(data, &NoEnv).map(Cow::into_owned)?)
}

#[cfg(test)]
mod tests {
    use super::{Dialect, Expression};

    fn field(src: &str) -> Option<String> {
        Expression::compile(src).ok().and_then(|e| e.sole_root_field().map(str::to_string))
    }

    /// Flattening a list the expression made (moved) and one read from the data (copied) give
    /// the same: one level flattened, `null` dropped by the projection.
    #[test]
    fn flattening_made_and_read_lists() {
        let data = serde_json::json!({"a": [1, null, [2, [3]]], "b": 4, "c": [{"n": 1}, {"m": 2}]});
        let q = |e: &str| super::search(e, &data);
        assert_eq!(q("[a, b][]"), Ok(serde_json::json!([1, [2, [3]], 4])));
        assert_eq!(q("a[]"), Ok(serde_json::json!([1, 2, [3]])));
        assert_eq!(q("[a, b][][]"), Ok(serde_json::json!([1, 2, [3], 4])));
        assert_eq!(q("[c, c][].n"), Ok(serde_json::json!([1, 1])));
        assert_eq!(q("[c][]"), Ok(serde_json::json!([{"n": 1}, {"m": 2}])));
    }

    #[test]
    fn the_sole_root_field_is_found_through_every_form() {
        let request = Some("request".to_string());
        assert_eq!(field("request.object.spec.[ephemeralContainers, initContainers, containers][]"), request);
        assert_eq!(field("request.operation || 'BACKGROUND'"), request);
        assert_eq!(field("request.object.spec.volumes[].keys(@)[] || ''"), request);
        assert_eq!(field("request.object.spec.containers[?name == 'a'].image | [0]"), request);
        assert_eq!(field("sort_by(request.object.spec.containers, &name)[].name"), request);
        assert_eq!(field("length(request.object.metadata.labels) > `0` && request.operation == 'CREATE'"), request);
        // Something else is read from the root: the element, the whole root, two fields.
        assert_eq!(field("request.operation || element.name"), None);
        assert_eq!(field("request.operation == element.name"), None);
        assert_eq!(field("[request.name, element.name]"), None);
        assert_eq!(field("@"), None);
        assert_eq!(field("length(@)"), None);
        assert_eq!(field("element.image"), Some("element".to_string()));
        // Nothing from the root, randomness, the clock, the caller's variables.
        assert_eq!(field("'literal'"), None);
        assert_eq!(field("random('[a-z]{4}')"), None);
        assert_eq!(field("time_now_utc()"), None);
        let community = Expression::compile_in("request.name", Dialect::Community).ok();
        assert_eq!(community.and_then(|e| e.sole_root_field().map(str::to_string)), None);
    }

    /// How a set of expressions read one lent part of the data (`reads`: `request.object` or
    /// `element`): each of `only` gives against `part` what it gives against `data`, each of `no`
    /// the same against `without` (the data lacking the part), each of `whole` needs all of it.
    fn check_reads(
        reads: fn(&Expression) -> &super::ObjectReads,
        (part, data, without): (&serde_json::Value, &serde_json::Value, &serde_json::Value),
        only: &[&str],
        no: &[&str],
        whole: &[&str],
    ) {
        use super::ObjectReads;
        let compile = |src: &str| Expression::compile(src).unwrap_or_else(|e| panic!("{src} compiles: {e}"));
        let search = |e: &Expression, v| e.search(v, &super::NoEnv).map(|v| v.into_owned());
        for &src in only {
            let e = compile(src);
            let ObjectReads::Only(at) = reads(&e) else { panic!("{src}: {:?}", reads(&e)) };
            assert_eq!(search(at, part), search(&e, data), "{src}");
        }
        for &src in no {
            let e = compile(src);
            assert!(matches!(reads(&e), ObjectReads::No), "{src}: {:?}", reads(&e));
            assert_eq!(search(&e, without), search(&e, data), "{src}");
        }
        for &src in whole {
            let e = compile(src);
            assert!(matches!(reads(&e), ObjectReads::Whole), "{src}: {:?}", reads(&e));
        }
    }

    /// An expression that reads the root only through `request.object` gives, evaluated against
    /// the object, what it gives against the whole data; one that never reads it gives the same
    /// against data without it; anything else is `Whole`.
    #[test]
    fn reads_of_request_object_are_classified_and_rewritten() {
        use super::ObjectReads;
        let object = serde_json::json!({"metadata": {"name": "p", "labels": {"a": "1"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}, {"name": "d", "image": "nginx"}],
                "volumes": [{"name": "v", "emptyDir": {}}]}});
        let data = serde_json::json!({"request": {"operation": "CREATE", "name": "p", "object": object},
            "element": {"name": "c"}, "images": {"x": 1}});
        let mut without = data.clone();
        if let Some(r) = without.get_mut("request").and_then(serde_json::Value::as_object_mut) {
            r.remove("object");
        }
        check_reads(
            Expression::request_object,
            (&object, &data, &without),
            &[
                "request.object.spec.[ephemeralContainers, initContainers, containers][]",
                "request.object.spec.volumes[].keys(@)[] || ''",
                "request.object.spec.containers[?name == 'c'].image | [0]",
                "sort_by(request.object.spec.containers, &name)[].name",
                "length(request.object.metadata.labels) > `0`",
                "request.object",
                "request.object.metadata.missing",
                "{n: request.object.metadata.name, c: length(request.object.spec.containers)}",
                "request.object.spec.containers[*].request.object",
            ],
            &["request.operation || 'BACKGROUND'", "element.name", "'literal'", "images.x", "request.name"],
            &[
                "request",
                "request.object.metadata.name == element.name",
                "request.object.metadata.name == request.name",
                "@",
                "length(@)",
                "keys(request)",
                "request | object",
                "request[0]",
                "request.*",
            ],
        );
        let community = Expression::compile_in("request.object.name", Dialect::Community).ok();
        assert!(community.is_some_and(|e| matches!(e.request_object(), ObjectReads::Whole)));
    }

    /// The fields of `request` an expression reads: listed when every read is
    /// `request.<field>`, `None` when `request` is read any other way.
    #[test]
    fn the_fields_of_request_read_are_listed() {
        let fields = |src: &str| {
            Expression::compile(src)
                .map(|e| e.request_fields().map(|f| f.iter().map(String::as_str).collect::<Vec<_>>().join(",")))
                .unwrap_or_else(|e| panic!("{src}: {e}"))
        };
        for (src, want) in [
            ("request.operation || 'BACKGROUND'", "operation"),
            ("request.object.spec.containers[].name", "object"),
            ("request.userInfo.username == request.name", "userInfo,name"),
            ("request.name == request.name", "name"),
            ("serviceAccountName", ""),
            ("element.name", ""),
            ("length(request.object.spec.volumes[?hostPath])", "object"),
            ("request.object.spec.containers[?name == request.name]", "object"),
            ("request.kind | kind", "kind"),
            ("[request.namespace, request.roles]", "namespace,roles"),
            ("{a: request.clusterRoles}", "clusterRoles"),
            ("sort_by(request.object.x, &name)", "object"),
        ] {
            assert_eq!(fields(src).as_deref(), Some(want), "{src}");
        }
        // Filters and projections read their items, not the root: `request` there is an item's.
        assert_eq!(fields("items[?request == 'x']").as_deref(), Some(""));
        for src in ["request", "keys(request)", "@", "request[0]", "request.*", "request.[name, kind]", "$x", "[0]"] {
            let Ok(e) = Expression::compile(src) else { continue };
            assert_eq!(e.request_fields(), None, "{src}");
        }
        let community = Expression::compile_in("request.name", Dialect::Community).ok();
        assert!(community.is_some_and(|e| e.request_fields().is_none()));
    }

    /// The same for the root's `element`: `Only` expressions give against the element what the
    /// whole gives against the data, `No` ones the same without it.
    #[test]
    fn reads_of_the_element_are_classified_and_rewritten() {
        let element = serde_json::json!({"name": "c", "securityContext": {"capabilities": {"drop": ["ALL"]}},
            "ports": [{"containerPort": 80}, {"containerPort": 8080}]});
        let data = serde_json::json!({"request": {"operation": "CREATE", "object": {"metadata": {"name": "p"}}},
            "element": element, "elementIndex": 0});
        let mut without = data.clone();
        if let Some(m) = without.as_object_mut() {
            m.remove("element");
        }
        check_reads(
            Expression::element,
            (&element, &data, &without),
            &[
                "element.securityContext.capabilities.drop[] || `[]`",
                "element.securityContext.capabilities.add[] || `[]`",
                "element",
                "element.ports[?containerPort > `100`].containerPort | [0]",
                "length(element.ports)",
                "element.missing.deeper",
                "{n: element.name, p: element.ports[].containerPort}",
                "element.ports[*].element",
            ],
            &["request.operation || 'BACKGROUND'", "request.object.metadata.name", "elementIndex", "request"],
            &["element.name == request.object.metadata.name", "element.name == elementIndex", "@", "keys(@)"],
        );
    }
}
