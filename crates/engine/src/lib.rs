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
pub mod error;
pub mod evaluate;
pub mod images;
pub mod matching;
pub mod outcome;
pub mod pattern;
pub mod policy;
pub mod pss;
pub mod template;

pub use context::Context;
pub use error::{CompileError, EvalError};
pub use evaluate::{Data, Loaded, NoData, Request, build_context, evaluate_policy};
pub use matching::RequestUser;
pub use outcome::{NotApplied, PolicyResponse, RuleResponse, RuleType, Status};
pub use policy::{Action, CompiledException, CompiledPolicy, compile_exception, compile_policy};
