//! Serde types for what Verno reads: `kyverno.io` ClusterPolicy/Policy and PolicyException,
//! `admission.k8s.io/v1` AdmissionReview, and the Kyverno CLI's `cli.kyverno.io/v1alpha1` Test,
//! Values and UserInfo files. No logic beyond
//! defaults and strict decoding.

pub mod admission;
pub mod cel;
pub mod cli;
pub mod exception;
pub mod images;
pub mod kind;
pub mod meta;
pub mod policy;
pub mod strict;

/// The parts an in-cluster replica's readiness waits for: the controller says when each is
/// done, the server's `/readyz` answers with what is missing. Declared here, the one crate both
/// depend on, so the two agree without depending on each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyPart {
    /// The policy watch has synced and a set is installed.
    Policies = 1,
    /// The serving certificate from the pair Secret is loaded.
    Certificate = 2,
}

pub use admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
pub use cli::{Test, TestResult, UserInfoFile, Values};
pub use exception::PolicyException;
pub use kind::{Group, Kind};
pub use meta::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
pub use policy::*;
