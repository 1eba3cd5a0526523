//! The compiled form of a `generate` rule (and of a GeneratingPolicy's CEL generation): data
//! only; it is compiled and evaluated in [`crate::generate`] and [`crate::gpol`].

use crate::condition::CompiledConditions;
use crate::context_entry::CompiledContextEntry;
use crate::template::{Query, TValue};
use serde_json::Value;

/// A compiled `generate` rule. The object is built at evaluation; the cluster controller acts
/// on `synchronize` and `orphan_downstream`.
#[derive(Debug, Clone)]
pub struct CompiledGeneration {
    pub target: GenerateTarget,
    pub synchronize: bool,
    pub orphan_downstream: bool,
    /// Generate for triggers that exist when the policy arrives (`generateExisting`).
    pub generate_existing: bool,
    /// Whether the rule itself set `generateExisting` (it wins over the policy's).
    pub generate_existing_set: bool,
    pub foreach: Vec<CompiledGenerateForeach>,
    /// A GeneratingPolicy's CEL generation (then `target` and `foreach` are empty).
    pub cel: Option<Box<CompiledCelGeneration>>,
}

#[derive(Debug, Clone)]
pub struct GenerateTarget {
    pub api_version: Option<TValue>,
    pub kind: Option<TValue>,
    pub name: Option<TValue>,
    pub namespace: Option<TValue>,
    pub source: GenerateSource,
}

#[derive(Debug, Clone)]
pub enum GenerateSource {
    Data(TValue),
    Clone {
        namespace: TValue,
        name: TValue,
    },
    CloneList {
        namespace: TValue,
        kinds: Vec<String>,
        selector: Option<verno_api::LabelSelector>,
    },
    /// Only foreach entries (the rule itself generates nothing directly).
    None,
}

#[derive(Debug, Clone)]
pub struct CompiledGenerateForeach {
    pub list: Query,
    pub list_source: String,
    pub context: Vec<CompiledContextEntry>,
    pub preconditions: Option<CompiledConditions>,
    pub target: GenerateTarget,
}

/// One `generate` entry.
#[derive(Debug, Clone)]
pub enum CelGenerate {
    /// An expression evaluated for its calls to `generator.Apply`.
    Expression(verno_cel::Expr),
    /// YAML documents, rendered and generated into their own `metadata.namespace`.
    Template(Vec<Tpl>),
}

/// The CEL part of a generate rule.
#[derive(Debug, Clone)]
pub struct CompiledCelGeneration {
    pub variables: Vec<(String, verno_cel::Expr)>,
    pub generate: Vec<CelGenerate>,
    /// `auditAnnotations`: report result properties of a generation that passes.
    pub audit_annotations: Vec<(String, verno_cel::Expr)>,
    pub use_server_side_apply: bool,
}

/// A compiled template node: literal values, whole-value placeholders (any CEL value, spliced),
/// and strings mixing text and placeholders (each placeholder a scalar).
#[derive(Debug, Clone)]
pub enum Tpl {
    Literal(Value),
    Splice(verno_cel::Expr),
    Interpolate(Vec<Segment>),
    Map(Vec<(String, Tpl)>),
    List(Vec<Tpl>),
}

#[derive(Debug, Clone)]
pub enum Segment {
    Text(String),
    Expr(verno_cel::Expr),
}
