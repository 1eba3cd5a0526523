//! The errors of compiling and evaluating an expression. Their texts are what Kubernetes and
//! Kyverno users see (in policy reports and admission messages), so each reproduces the wording
//! callers and tests compare.

use crate::{MAX_ITERATIONS, MAX_LOOP_DEPTH, MAX_RESULT_BYTES};
use thiserror::Error;

/// Why an expression did not compile.
#[derive(Debug, Error)]
pub enum CompileError {
    /// The shared environment (standard library and extensions) failed to build.
    #[error("the CEL environment could not be built")]
    Environment,
    /// The source is not a CEL expression.
    #[error("compilation failed: {0}")]
    Parse(#[source] cel::ParseErrors),
    /// Comprehensions nest deeper than the cost budget allows (see [`MAX_LOOP_DEPTH`]).
    #[error("the expression nests {depth} loops (all/exists/map/filter); the cost budget allows {MAX_LOOP_DEPTH}")]
    TooManyLoops { depth: usize },
}

/// Why an evaluation failed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EvalError {
    /// The shared environment (standard library and extensions) failed to build.
    #[error("the CEL environment could not be built")]
    Environment,
    /// The caller's cancel flag was set before the evaluation started.
    #[error("the evaluation was cancelled (its deadline passed)")]
    Cancelled,
    /// The runtime estimate (widest input ^ loop depth) is over [`MAX_ITERATIONS`].
    #[error(
        "the expression's estimated cost ({widest} ^ {loop_depth} loop iterations) exceeds the budget of {MAX_ITERATIONS}"
    )]
    OverBudget { widest: usize, loop_depth: usize },
    /// A result holds more than [`MAX_ITERATIONS`] elements.
    #[error("the result has over {MAX_ITERATIONS} elements; the cost budget refuses it")]
    TooManyElements,
    /// A result holds more than [`MAX_RESULT_BYTES`] of strings and bytes.
    #[error("the result holds over {MAX_RESULT_BYTES} bytes of text; the cost budget refuses it")]
    TooMuchText,
    /// The expression read a composition variable whose own evaluation failed.
    #[error("composited variable \"{name}\" failed to evaluate: {cause}")]
    VariableFailed {
        name: String,
        #[source]
        cause: Box<EvalError>,
    },
    /// The expression read a composition variable that is not defined.
    #[error("composited variable \"{name}\" is not available: it failed to evaluate or is not defined")]
    VariableUnavailable { name: String },
    /// The interpreter failed, worded as cel-go words it (see [`go_words`]).
    #[error("{}", go_words(.0))]
    Execution(#[source] cel::ExecutionError),
    /// The result could not be converted out of the interpreter's values.
    #[error("{0}")]
    Conversion(#[source] cel::ExecutionError),
    /// The result is of a type with no JSON form (see [`crate::to_json`]).
    #[error("a CEL {type_name} has no JSON form")]
    NoJsonForm { type_name: &'static str },
    /// A condition returned something other than a boolean.
    #[error("expression must return a boolean, got {type_name}")]
    NotBool { type_name: &'static str },
    /// An Envoy-mode validation returned something other than a `CheckResponse`
    /// (see [`crate::envoy::decision`]).
    #[error("rule result is expected to be *v3.CheckResponse")]
    NotEnvoyResponse,
    /// An HTTP-mode validation returned something other than an HTTP `CheckResponse`
    /// (see [`crate::envoy::http_decision`]).
    #[error("rule result is expected to be *http.CheckResponse")]
    NotHttpResponse,
}

/// An evaluation error in cel-go's words, which Kubernetes and Kyverno users see (`division
/// by zero`, `modulus by zero`, `no such key: k`), where the interpreter words it otherwise.
fn go_words(e: &cel::ExecutionError) -> String {
    let msg = e.to_string();
    if msg.starts_with("Division by zero of") {
        "division by zero".into()
    } else if msg.starts_with("Remainder by zero of") {
        "modulus by zero".into()
    } else if let Some(key) = msg.strip_prefix("No such key: ") {
        format!("no such key: {key}")
    } else {
        msg
    }
}
