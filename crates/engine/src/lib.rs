//! Verno's policy engine: pure, compile once, evaluate many.
//!
//! [`compile_policy`] turns a `kyverno.io` ClusterPolicy/Policy into an immutable
//! [`CompiledPolicy`] (templates, JMESPath, matchers, conditions and autogen rules parsed once).
//! [`evaluate_policy`] runs it on a [`Request`] and returns a [`PolicyResponse`]. Nothing here
//! touches the network, the filesystem, the environment or the clock; outside data comes in
//! through the [`Data`] port and [`verno_jmespath::Env`].

pub mod anchor;
pub mod autogen;
pub mod condition;
pub mod context;
mod context_entry;
mod document;
pub mod error;
pub mod evaluate;
pub mod generate;
pub mod images;
pub mod jsonpatch;
pub mod matching;
pub mod mpol;
pub mod mutate;
pub mod outcome;
pub mod pattern;
pub mod policy;
pub mod pss;
mod set;
pub mod smp;
pub mod template;
mod validate;
mod verdict;
pub mod vpol;

pub use context::Context;
pub use document::{Compiled, DocumentError, compile, compile_stored};
pub use error::{CompileError, EvalError};
pub use evaluate::{Data, Loaded, NoData, Phase, Request, Sequence, build_context, evaluate_phase, evaluate_policy};
pub use matching::RequestUser;
pub use outcome::{NotApplied, PolicyResponse, RuleResponse, RuleType, Status};
pub use policy::{Action, CompiledException, CompiledPolicy, compile_cel_exception, compile_exception, compile_policy};
pub use set::{
    Filter, Hook, Labels, NamespaceLabels, Observer, Outcome, PolicyMeta, PolicySet, Route, Scope, fail_closed,
};
pub use verdict::{ResourceRef, RuleViolation, Violation, blocked_message, yaml_scalar};
pub use verno_api::Kind;

/// JSON equality where numbers compare by value (`1` equals `1.0`), as Go's decoded maps do.
pub fn equal(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}
