//! Engine errors: compile errors carry the field path; evaluation errors become `error` results.

use thiserror::Error;

#[derive(Debug, Clone, Error, PartialEq)]
#[error("{path}: {message}")]
pub struct CompileError {
    pub path: String,
    pub message: String,
}

impl CompileError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        CompileError { path: path.into(), message: message.into() }
    }
}

#[derive(Debug, Clone, Error, PartialEq)]
pub enum EvalError {
    #[error("{0}")]
    Substitution(String),
    #[error("{0}")]
    Other(String),
}
