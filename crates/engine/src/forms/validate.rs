//! The compiled form of a `validate` rule (and of the CEL kinds' validations): data only; it is
//! compiled and evaluated in [`crate::validate`].

use super::Action;
use crate::cel_env::ParamRef;
use crate::condition::CompiledConditions;
use crate::context_entry::CompiledContextEntry;
use crate::outcome::Status;
use crate::pattern;
use crate::template::{Query, TValue, Template};
use verno_api::FailureActionOverride;

#[derive(Debug, Clone)]
pub struct CompiledValidation {
    pub message: Option<Template>,
    pub failure_action: Option<Action>,
    pub overrides: Vec<FailureActionOverride>,
    pub allow_existing_violations: bool,
    pub check: Check,
    /// Whether anything in the rule's validation names a numbered foreach variable
    /// (`element0`, `elementIndex1`, …): only then are they set beside `element`.
    pub numbered_elements: bool,
}

/// A `pattern` (or one `anyPattern` entry): compiled once when it has no variables, else
/// compiled after they are substituted.
#[derive(Debug, Clone)]
pub struct PatternCheck {
    pub(crate) value: TValue,
    pub(crate) compiled: Option<pattern::Pattern>,
}

#[derive(Debug, Clone)]
pub enum Check {
    Pattern(PatternCheck),
    AnyPattern(Vec<PatternCheck>),
    /// `anyPattern` that is not a list: an error at evaluation, as Kyverno reports it.
    BadAnyPattern(String),
    Deny(CompiledConditions),
    Foreach(Vec<CompiledForeach>),
    PodSecurity(crate::pss::PodSecurityCheck),
    Cel(Box<CompiledCel>),
    /// `validate.manifests`: signed Kubernetes manifests.
    Manifests(Box<crate::manifests::CompiledManifests>),
    Unsupported(&'static str),
    Nothing,
}

/// `validate.cel`: Kubernetes-style variables and expressions, compiled once.
#[derive(Debug, Clone)]
pub struct CompiledCel {
    pub variables: Vec<(String, verno_cel::Expr)>,
    pub expressions: Vec<CelValidation>,
    /// `paramKind` / `paramRef` are set.
    pub uses_params: bool,
    /// Where `params` comes from (a ValidatingAdmissionPolicy's paramKind + its binding's paramRef).
    pub params: Option<ParamRef>,
    /// What an expression that cannot be evaluated gives: `fail` in a ClusterPolicy's
    /// `validate.cel` (Kyverno runs it with the Fail failure policy, which denies), `error` in
    /// the CEL policy kinds and ValidatingAdmissionPolicy.
    pub on_error: Status,
    /// ValidatingPolicy `evaluation.mode: Envoy` or `HTTP`: the expressions return responses
    /// (or null) and the first response decides.
    pub authz: Option<Authz>,
    /// ImageValidatingPolicy: images, attestors and the verify functions.
    pub image: Option<std::sync::Arc<super::ImageCel>>,
    /// Kyverno's ValidatingPolicy engine (not the API server's admission policies): a failed
    /// validation without a message says "CEL expression validation failed at index N", and
    /// results carry `cel.validationIndex` and the `auditAnnotations` as properties.
    pub kyverno: Option<Box<KyvernoCel>>,
}

/// What Kyverno's ValidatingPolicy engine adds to a CEL validation ([`CompiledCel::kyverno`]).
#[derive(Debug, Clone, Default)]
pub struct KyvernoCel {
    pub audit_annotations: Vec<(String, verno_cel::Expr)>,
}

/// An authorization-mode ValidatingPolicy's evaluation.
#[derive(Debug, Clone, Copy)]
pub struct Authz {
    /// Envoy `CheckResponse`s rather than Kyverno's HTTP ones.
    pub envoy: bool,
    /// `failurePolicy: Ignore`: an expression that fails decides nothing.
    pub ignore_errors: bool,
}

#[derive(Debug, Clone)]
pub struct CelValidation {
    pub expr: verno_cel::Expr,
    pub message: Option<String>,
    pub message_expression: Option<verno_cel::Expr>,
}

#[derive(Debug, Clone)]
pub struct CompiledForeach {
    pub list: Query,
    pub element_scope: Option<bool>,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub check: Check,
}
