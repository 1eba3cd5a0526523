//! What an ImageValidatingPolicy adds to its CEL validation: data only; it is compiled and
//! evaluated in [`crate::ivpol`].

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use verno_api::images::RegistryCredentials;

/// `matchImageReferences` entry.
#[derive(Debug, Clone)]
pub enum ImageRef {
    Glob(String),
    /// CEL over `ref`.
    Expr(verno_cel::Expr),
}

/// What an ImageValidatingPolicy adds to a CEL validation.
#[derive(Debug)]
pub struct ImageCel {
    /// `spec.images`: named lists of images, each a CEL expression.
    pub(crate) extractors: Vec<(String, verno_cel::Expr)>,
    pub(crate) refs: Vec<ImageRef>,
    pub(crate) verify_digest: bool,
    pub(crate) required: bool,
    pub(crate) mutate_digest: bool,
    /// Attestors by name, as written.
    pub(crate) attestors: Map<String, Value>,
    /// Attestations by name, as written.
    pub(crate) attestations: BTreeMap<String, Value>,
    pub(crate) credentials: Option<RegistryCredentials>,
}
