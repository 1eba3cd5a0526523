//! The compiled form of a `mutate` rule (and of the CEL kinds' mutations): data only; it is
//! compiled and evaluated in [`crate::mutate`] and [`crate::mpol`].

use crate::cel_env::ParamRef;
use crate::condition::CompiledConditions;
use crate::context_entry::CompiledContextEntry;
use crate::matching::Matcher;
use crate::template::{Query, TValue};

/// A compiled `mutate` rule.
#[derive(Debug, Clone)]
pub struct CompiledMutation {
    pub patches: Patches,
    pub foreach: Vec<CompiledMutateForeach>,
    pub targets: Vec<CompiledTarget>,
    /// A MutatingPolicy's / MutatingAdmissionPolicy's CEL mutations.
    pub cel: Option<Box<CompiledCelMutation>>,
}

/// A strategic merge patch and/or RFC 6902 patches, with their variables.
#[derive(Debug, Clone, Default)]
pub struct Patches {
    pub strategic_merge: Option<TValue>,
    pub json6902: Option<Json6902>,
}

/// `patchesJson6902`: parsed at compile time unless it holds variables.
#[derive(Debug, Clone)]
pub enum Json6902 {
    Static(Vec<crate::jsonpatch::Op>),
    /// The string, a template until rendered and parsed.
    Templated(TValue),
}

#[derive(Debug, Clone)]
pub struct CompiledMutateForeach {
    pub list: Query,
    pub list_source: String,
    /// Descending iteration (the default for strategic merge patches).
    pub reverse: bool,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub patches: Patches,
    pub nested: Vec<CompiledMutateForeach>,
}

/// A mutate-existing target: which objects to fetch and patch.
#[derive(Debug, Clone)]
pub struct CompiledTarget {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<TValue>,
    pub name: Option<TValue>,
    pub selector: Option<verno_api::LabelSelector>,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
}

/// One mutation of a CEL policy.
#[derive(Debug, Clone)]
pub enum CelPatch {
    ApplyConfiguration(verno_cel::Expr),
    JsonPatch(verno_cel::Expr),
}

/// The CEL part of a mutate rule: variables, then mutations in order.
#[derive(Debug, Clone)]
pub struct CompiledCelMutation {
    pub variables: Vec<(String, verno_cel::Expr)>,
    pub mutations: Vec<CelPatch>,
    pub params: Option<ParamRef>,
    /// MutatingPolicy `evaluation.mutateExisting`: the existing objects to patch (the trigger
    /// is left as it is).
    pub targets: Option<Box<CelTargets>>,
    /// MutatingPolicy `auditAnnotations`, evaluated on the mutated object: report properties.
    pub audit_annotations: Vec<(String, verno_cel::Expr)>,
}

/// Which existing objects a mutate-existing MutatingPolicy patches: those
/// `targetMatchConstraints` matches (any operation; `matchConstraints` when it names no
/// resources), or those its CEL `expression` returns, and for which every
/// `targetMatchConditions` holds.
#[derive(Debug, Clone)]
pub struct CelTargets {
    pub matcher: Matcher,
    /// The (group, version, plural resource) the constraints name, for listing candidates.
    pub resources: Vec<(String, String, String)>,
    pub expression: Option<verno_cel::Expr>,
    pub conditions: Vec<(String, verno_cel::Expr)>,
}
