//! Engine errors: compile errors carry the field path; evaluation errors become `error` results.
//!
//! Where a caller can act on the cause, the error is a type: [`CompileError`] (with the field
//! path), [`DocumentError`], `jsonpatch::PatchError`, `smp::MergeError`,
//! `cron::ScheduleError`, `ttl::TtlError`, `template::TemplateError`,
//! `gpol::{PlaceholderError, RenderError}`, and at the CEL libraries' host port
//! `verno_cel::HostError` (unavailable here, out of a namespaced policy's reach, failed).
//!
//! A function of the engine that still returns `Result<_, String>` returns **message text**:
//! the words a rule's `error`/`fail` result, a denial, a policy status or Kyverno's policy
//! validation shows, byte for byte as Kyverno words them. They are: context loading
//! (`context_entry::{render_jmes, service_headers}`, `cel_env::resolve`,
//! `evaluate::rule_cel_vars`), a namespaced policy's `apiCall` refusal (`confine::api_path`),
//! a rule's message, anchor and generate rendering (`validate`, `mutate::check`,
//! `generate::{render_str, build}`, `mpol::run`), image verification (`verify_images`,
//! `image_cel`, `manifests`, `images::extract_custom`), a GlobalContextEntry's field errors and
//! projections (`global_context`), the reasons a ValidatingAdmissionPolicy is not generated
//! (`vapgen`, written to the policy's status) and a generate rule's update check
//! (`document::generate_update_allowed`). Nothing matches on that text; it is carried to the
//! report, the status or the AdmissionReview as it is.

use thiserror::Error;
use verno_api::Kind;

/// `path: message`, or the message alone when the error has no path (Kyverno words some
/// policy-validation errors without one).
#[derive(Debug, Clone, Error, PartialEq)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct CompileError {
    pub path: String,
    pub message: String,
}

impl CompileError {
    /// `message`: a text, or a typed error whose text is what the user reads.
    pub fn new(path: impl Into<String>, message: impl std::fmt::Display) -> Self {
        CompileError { path: path.into(), message: message.to_string() }
    }

    /// An error about the whole policy, without a path.
    pub fn whole(message: impl std::fmt::Display) -> Self {
        CompileError { path: String::new(), message: message.to_string() }
    }
}

#[derive(Debug, Clone, Error, PartialEq)]
pub enum EvalError {
    #[error("{0}")]
    Substitution(String),
    #[error("{0}")]
    Other(String),
}

/// Why a document could not be compiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DocumentError {
    /// Not one of the kinds in [`Kind`] (a resource, a test file, an unknown group).
    #[error("not a policy: apiVersion {api_version:?}, kind {kind:?}")]
    NotAPolicy { api_version: String, kind: String },
    /// A kind Verno knows but does not evaluate yet.
    #[error("{0} policies are not supported by this build of verno yet")]
    Unsupported(Kind),
    /// A binding is compiled with the admission policy it names (see [`compile`]).
    #[error("a {0} is compiled with the policy it binds")]
    Binding(Kind),
    /// The document does not have the kind's shape.
    #[error("{0}")]
    Decode(String),
    #[error(transparent)]
    Invalid(#[from] CompileError),
}

impl DocumentError {
    /// The error as a policy's status or the validation webhook shows it: `path: message`.
    pub fn with_path(&self) -> String {
        match self {
            DocumentError::Invalid(e) if e.path.is_empty() => e.message.clone(),
            DocumentError::Decode(m) => format!("spec: {m}"),
            other => other.to_string(),
        }
    }
}
