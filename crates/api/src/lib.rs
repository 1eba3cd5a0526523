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

pub use admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
pub use cli::{Test, TestResult, UserInfoFile, Values};
pub use exception::PolicyException;
pub use kind::{Group, Kind};
pub use meta::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
pub use policy::*;
