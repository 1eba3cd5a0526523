//! Serde types for what Verno reads: `kyverno.io` ClusterPolicy/Policy and PolicyException, and
//! the Kyverno CLI's `cli.kyverno.io/v1alpha1` Test, Values and UserInfo files. No logic beyond
//! defaults and strict decoding.

pub mod cli;
pub mod exception;
pub mod meta;
pub mod policy;
pub mod strict;

pub use cli::{Test, TestResult, UserInfoFile, Values};
pub use exception::PolicyException;
pub use meta::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
pub use policy::*;
