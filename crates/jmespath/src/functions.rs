//! The function registry: JMESPath's builtins (with Kyverno's `sum`) and Kyverno's 51 custom
//! functions, one module per family. Names are resolved at parse time.

mod arithmetic;
mod builtin;
mod community;
mod encoding;
pub use encoding::{ImageRefError, normalize_image};
mod strings;
mod time;
pub use time::{cron_of, go_truncation};
mod x509;
pub use x509::{X509DecodeError, decode as x509_decode};

use crate::Env;
use crate::ast::Ast;
use crate::error::{ArityError, RuntimeError};
use crate::interpreter::{Cv, Meter};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::LazyLock;

/// The type a parameter accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgType {
    Any,
    String,
    Number,
    Bool,
    Array,
    Object,
    ArrayString,
    ArrayNumber,
    Expref,
    Null,
}

impl ArgType {
    fn name(self) -> &'static str {
        match self {
            ArgType::Any => "any",
            ArgType::String => "string",
            ArgType::Number => "number",
            ArgType::Bool => "boolean",
            ArgType::Array => "array",
            ArgType::Object => "object",
            ArgType::ArrayString => "array[string]",
            ArgType::ArrayNumber => "array[number]",
            ArgType::Expref => "expref",
            ArgType::Null => "null",
        }
    }

    fn accepts(self, a: &Arg<'_, '_>) -> bool {
        match (self, a) {
            (ArgType::Expref, Arg::Expref(_)) => true,
            (_, Arg::Expref(_)) => false,
            (ArgType::Expref, _) => false,
            (t, Arg::Value(v)) => match t {
                ArgType::Any => true,
                ArgType::String => v.is_string(),
                ArgType::Number => v.is_number(),
                ArgType::Bool => v.is_boolean(),
                ArgType::Array => v.is_array(),
                ArgType::Object => v.is_object(),
                ArgType::Null => v.is_null(),
                ArgType::ArrayString => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                ArgType::ArrayNumber => v.as_array().is_some_and(|a| a.iter().all(Value::is_number)),
                ArgType::Expref => false,
            },
        }
    }
}

/// One argument as passed to a function: a value, or an expression reference (`&expr`).
pub enum Arg<'e, 'a> {
    Value(Cv<'a>),
    Expref(&'e Ast),
}

impl Arg<'_, '_> {
    pub fn value(&self) -> &Value {
        static NULL: Value = Value::Null;
        match self {
            Arg::Value(v) => v.as_ref(),
            Arg::Expref(_) => &NULL,
        }
    }
}

pub(crate) type Impl = fn(&Call<'_>, &[Arg<'_, '_>]) -> Result<Value, RuntimeError>;

/// What a function implementation can see besides its arguments.
pub(crate) struct Call<'c> {
    pub name: &'static str,
    /// The evaluation's work budget (for functions that evaluate expression references) and,
    /// through it, the caller's environment.
    pub meter: &'c crate::interpreter::Meter<'c>,
}

impl Call<'_> {
    /// The caller's clock, DNS and randomness.
    pub fn env(&self) -> &dyn Env {
        self.meter.env
    }
}

/// A registered function: its signature and documentation, as `verno jp function` prints them.
pub struct Function {
    pub name: &'static str,
    pub params: &'static [&'static [ArgType]],
    pub variadic: bool,
    pub returns: &'static str,
    pub custom: bool,
    pub note: &'static str,
    pub(crate) imp: Impl,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}()", self.name)
    }
}

impl Function {
    pub fn signature(&self) -> String {
        let ps: Vec<String> =
            self.params.iter().map(|alts| alts.iter().map(|t| t.name()).collect::<Vec<_>>().join("|")).collect();
        let mut s = ps.join(", ");
        if self.variadic {
            s.push_str(", ...");
        }
        format!("{}({}) {}", self.name, s, self.returns)
    }

    pub(crate) fn check_arity(&self, n: usize) -> Result<(), ArityError> {
        let want = self.params.len();
        if (self.variadic && n < want) || (!self.variadic && n != want) {
            return Err(ArityError { function: self.name, at_least: self.variadic, expected: want, got: n });
        }
        Ok(())
    }

    pub(crate) fn call(&'static self, args: &[Arg<'_, '_>], meter: &Meter<'_>) -> Result<Value, RuntimeError> {
        for (i, a) in args.iter().enumerate() {
            let alts = match self.params.get(i) {
                Some(p) => *p,
                None => match self.params.last() {
                    Some(p) if self.variadic => *p,
                    _ => continue,
                },
            };
            if !alts.iter().any(|t| t.accepts(a)) {
                let expected = alts.iter().map(|t| t.name()).collect::<Vec<_>>().join("|");
                return Err(RuntimeError::arg(self.name, i + 1, &expected));
            }
        }
        (self.imp)(&Call { name: self.name, meter }, args)
    }
}

static REGISTRY: LazyLock<HashMap<&'static str, &'static Function>> = LazyLock::new(|| {
    let mut m = HashMap::new();
    for f in builtin::FUNCTIONS
        .iter()
        .chain(strings::FUNCTIONS)
        .chain(arithmetic::FUNCTIONS)
        .chain(encoding::FUNCTIONS)
        .chain(time::FUNCTIONS)
    {
        // Later registrations replace earlier ones: Kyverno's `sum` replaces the builtin.
        m.insert(f.name, f);
    }
    m
});

pub(crate) fn lookup(name: &str) -> Option<&'static Function> {
    REGISTRY.get(name).copied()
}

/// `name` as the dialect resolves it: the community dialect sees its extra functions first.
pub(crate) fn lookup_in(name: &str, dialect: crate::Dialect) -> Option<&'static Function> {
    match dialect {
        crate::Dialect::Community => community::FUNCTIONS.iter().find(|f| f.name == name).or_else(|| lookup(name)),
        crate::Dialect::Kyverno => lookup(name),
    }
}

/// Every function, builtins first, each family in declaration order.
pub fn all() -> Vec<&'static Function> {
    let mut v: Vec<&'static Function> = Vec::new();
    for f in builtin::FUNCTIONS
        .iter()
        .chain(strings::FUNCTIONS)
        .chain(arithmetic::FUNCTIONS)
        .chain(encoding::FUNCTIONS)
        .chain(time::FUNCTIONS)
    {
        if lookup(f.name).is_some_and(|g| std::ptr::eq(g, f)) {
            v.push(f);
        }
    }
    v
}

// Shorthands for signatures.
pub(crate) const S: &[ArgType] = &[ArgType::String];
pub(crate) const N: &[ArgType] = &[ArgType::Number];
pub(crate) const A: &[ArgType] = &[ArgType::Array];
pub(crate) const O: &[ArgType] = &[ArgType::Object];
pub(crate) const ANY: &[ArgType] = &[ArgType::Any];
pub(crate) const E: &[ArgType] = &[ArgType::Expref];

pub(crate) fn str_arg<'v>(call: &Call<'_>, args: &'v [Arg<'_, '_>], i: usize) -> Result<&'v str, RuntimeError> {
    args.get(i).and_then(|a| a.value().as_str()).ok_or_else(|| RuntimeError::arg(call.name, i + 1, "string"))
}

pub(crate) fn num_arg(call: &Call<'_>, args: &[Arg<'_, '_>], i: usize) -> Result<f64, RuntimeError> {
    args.get(i).and_then(|a| a.value().as_f64()).ok_or_else(|| RuntimeError::arg(call.name, i + 1, "number"))
}

pub(crate) fn val<'v>(args: &'v [Arg<'_, '_>], i: usize) -> &'v Value {
    static NULL: Value = Value::Null;
    args.get(i).map(|a| a.value()).unwrap_or(&NULL)
}
