//! The compiled form of a `verifyImages` rule: data only; it is compiled and evaluated in
//! [`crate::verify_images`].

use super::Action;
use crate::condition::CompiledConditions;
use crate::template::TValue;
use verno_api::images::ImageVerification;

/// A compiled `verifyImages` list.
#[derive(Debug, Clone)]
pub struct CompiledVerifyImages {
    pub(crate) entries: Vec<Entry>,
    /// The rule's `imageExtractors` (custom resources' image fields).
    pub(crate) extractors: Option<crate::images::Extractors>,
    /// The policy's part of the cache key (Kyverno's `policyUID;resourceVersion`), set once
    /// the policy is compiled.
    pub(crate) cache_id: String,
    /// The first entry's `failureAction`, which Kyverno applies to the rule.
    pub failure_action: Option<Action>,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The entry as written, deprecated fields folded in.
    pub(crate) spec: ImageVerification,
    /// The entry with variables, rendered per request (conditions and `deny` left out: they
    /// are evaluated later, against each statement).
    pub(crate) template: Option<TValue>,
    /// Per attestation, its condition blocks.
    pub(crate) conditions: Vec<Vec<CompiledConditions>>,
    pub(crate) deny: Option<CompiledConditions>,
}
