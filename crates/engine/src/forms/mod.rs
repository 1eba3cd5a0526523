//! The compiled forms of every rule kind, data only: what [`crate::policy::RuleBody`] holds.
//! They sit below the modules that compile and evaluate them ([`crate::validate`],
//! [`crate::mutate`], [`crate::generate`], [`crate::cleanup`], [`crate::verify_images`] and
//! the CEL kinds), so that a policy's types never import its behaviour.

mod cleanup;
mod generate;
mod image;
mod mutate;
mod validate;
mod verify_images;

pub use cleanup::{CompiledCleanup, Decision};
pub use generate::{
    CelGenerate, CompiledCelGeneration, CompiledGenerateForeach, CompiledGeneration, GenerateSource, GenerateTarget,
    Segment, Tpl,
};
pub use image::{ImageCel, ImageRef};
pub use mutate::{
    CelPatch, CelTargets, CompiledCelMutation, CompiledMutateForeach, CompiledMutation, CompiledTarget, Json6902,
    Patches,
};
pub use validate::{
    Authz, CelValidation, Check, CompiledCel, CompiledForeach, CompiledValidation, KyvernoCel, PatternCheck,
};
pub use verify_images::CompiledVerifyImages;
pub(crate) use verify_images::Entry;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Audit,
    Enforce,
}

impl Action {
    pub(crate) fn parse(s: &str) -> Option<Action> {
        match s {
            "Audit" | "audit" => Some(Action::Audit),
            "Enforce" | "enforce" => Some(Action::Enforce),
            _ => None,
        }
    }
}
