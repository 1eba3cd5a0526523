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
mod random;
pub mod semver;
pub mod value;
pub mod wildcard;
pub mod yaml;

pub use ast::Ast;
pub use error::{ParseError, RuntimeError};
pub use functions::normalize_image;
pub use functions::{Function, all as all_functions};

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

/// An environment with no clock and no DNS.
pub struct NoEnv;
impl Env for NoEnv {}

/// A compiled expression.
#[derive(Debug, Clone)]
pub struct Expression {
    source: String,
    ast: Ast,
    dialect: Dialect,
}

impl Expression {
    pub fn compile(src: &str) -> Result<Expression, ParseError> {
        Expression::compile_in(src, Dialect::Kyverno)
    }

    /// Compiles in the given dialect.
    pub fn compile_in(src: &str, dialect: Dialect) -> Result<Expression, ParseError> {
        Ok(Expression { source: src.to_string(), ast: parser::parse(src, dialect)?, dialect })
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
        Some(Expression { source, ast, dialect: self.dialect })
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
}

/// Compiles and evaluates in one step (for the playground and tests).
pub fn search(expr: &str, data: &Value) -> Result<Value, String> {
    let e = Expression::compile(expr).map_err(|e| e.to_string())?;
    e.search(data, &NoEnv).map(Cow::into_owned).map_err(|e| e.to_string())
}
