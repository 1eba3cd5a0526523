//! Error types: parse errors (compile time) and runtime errors (evaluation).

use thiserror::Error;

/// A syntax error in an expression, with the byte offset where it was found.
#[derive(Debug, Clone, Error, PartialEq)]
#[error("{message} (at position {position} in `{expression}`)")]
pub struct ParseError {
    pub expression: String,
    pub position: usize,
    pub message: String,
}

/// A function called with a number of arguments its signature does not take (a parse error's
/// message).
#[derive(Debug, Clone, Error, PartialEq)]
#[error("invalid arity for function {function}: expected {}{expected} argument(s), got {got}", at_least_word(*.at_least))]
pub(crate) struct ArityError {
    pub function: &'static str,
    /// Whether the function is variadic: `expected` is then a minimum.
    pub at_least: bool,
    pub expected: usize,
    pub got: usize,
}

fn at_least_word(at_least: bool) -> &'static str {
    if at_least { "at least " } else { "" }
}

/// Why [`crate::search`] failed: the expression did not compile, or its evaluation failed.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum SearchError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// An error while evaluating a compiled expression.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum RuntimeError {
    /// Kyverno's fork of go-jmespath reports a missing map key in a plain field path. Most of
    /// these are read as `null` by an enclosing operator, so the key is held inline (no
    /// allocation for names up to 24 bytes: a missing key per container and field was a
    /// malloc and free each).
    #[error("Unknown key \"{0}\" in path")]
    NotFound(compact_str::CompactString),
    /// A function was given an argument of the wrong type.
    #[error("JMESPath function '{function}': argument #{position} is not of type {expected}")]
    ArgType { function: String, position: usize, expected: String },
    /// Any other function failure, already formatted as Kyverno prints it.
    #[error("JMESPath function '{function}': {message}")]
    Function { function: String, message: String },
    /// The evaluation did more work than one expression may (see `interpreter::MAX_WORK`), or
    /// its caller cancelled it; sticky, never read as `null`.
    #[error("{0}")]
    Budget(String),
    /// Generic evaluation failure.
    #[error("{0}")]
    Other(String),
}

impl RuntimeError {
    pub fn func(function: &str, message: impl Into<String>) -> Self {
        RuntimeError::Function { function: function.to_string(), message: message.into() }
    }
    pub fn arg(function: &str, position: usize, expected: &str) -> Self {
        RuntimeError::ArgType { function: function.to_string(), position, expected: expected.to_string() }
    }
}
