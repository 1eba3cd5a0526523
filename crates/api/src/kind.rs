//! Every policy-like kind Verno knows, by `apiVersion` group and `kind`. The one place where a
//! document's kind is read from strings; everything after matches on [`Kind`].

use std::fmt;

/// A policy, exception or binding kind. Which of them Verno can compile today is the engine's
/// business (`verno_engine::compile`); this only names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    // kyverno.io
    ClusterPolicy,
    Policy,
    PolicyException,
    CleanupPolicy,
    ClusterCleanupPolicy,
    // policies.kyverno.io
    ValidatingPolicy,
    NamespacedValidatingPolicy,
    MutatingPolicy,
    NamespacedMutatingPolicy,
    GeneratingPolicy,
    NamespacedGeneratingPolicy,
    DeletingPolicy,
    NamespacedDeletingPolicy,
    ImageValidatingPolicy,
    NamespacedImageValidatingPolicy,
    CelPolicyException,
    // admissionregistration.k8s.io
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
    MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding,
}

/// `kyverno.io`, `policies.kyverno.io` or `admissionregistration.k8s.io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Kyverno,
    Policies,
    Admission,
}

impl Group {
    pub fn as_str(self) -> &'static str {
        match self {
            Group::Kyverno => "kyverno.io",
            Group::Policies => "policies.kyverno.io",
            Group::Admission => "admissionregistration.k8s.io",
        }
    }
}

impl Kind {
    pub const ALL: [Kind; 20] = [
        Kind::ClusterPolicy,
        Kind::Policy,
        Kind::PolicyException,
        Kind::CleanupPolicy,
        Kind::ClusterCleanupPolicy,
        Kind::ValidatingPolicy,
        Kind::NamespacedValidatingPolicy,
        Kind::MutatingPolicy,
        Kind::NamespacedMutatingPolicy,
        Kind::GeneratingPolicy,
        Kind::NamespacedGeneratingPolicy,
        Kind::DeletingPolicy,
        Kind::NamespacedDeletingPolicy,
        Kind::ImageValidatingPolicy,
        Kind::NamespacedImageValidatingPolicy,
        Kind::CelPolicyException,
        Kind::ValidatingAdmissionPolicy,
        Kind::ValidatingAdmissionPolicyBinding,
        Kind::MutatingAdmissionPolicy,
        Kind::MutatingAdmissionPolicyBinding,
    ];

    /// The kind of a document with this `apiVersion` and `kind`; `None` for anything else
    /// (resources, test files, unknown groups).
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        let group = api_version.split_once('/').map_or("", |(g, _)| g);
        Kind::ALL.into_iter().find(|k| k.group().as_str() == group && k.name() == kind)
    }

    /// The kind of a JSON document, from its `apiVersion` and `kind` fields.
    pub fn of_document(doc: &serde_json::Value) -> Option<Kind> {
        let s = |f: &str| doc.get(f).and_then(serde_json::Value::as_str).unwrap_or("");
        Kind::of(s("apiVersion"), s("kind"))
    }

    /// The `kind` field (the CEL PolicyException is `PolicyException` in its own group).
    pub fn name(self) -> &'static str {
        match self {
            Kind::ClusterPolicy => "ClusterPolicy",
            Kind::Policy => "Policy",
            Kind::PolicyException | Kind::CelPolicyException => "PolicyException",
            Kind::CleanupPolicy => "CleanupPolicy",
            Kind::ClusterCleanupPolicy => "ClusterCleanupPolicy",
            Kind::ValidatingPolicy => "ValidatingPolicy",
            Kind::NamespacedValidatingPolicy => "NamespacedValidatingPolicy",
            Kind::MutatingPolicy => "MutatingPolicy",
            Kind::NamespacedMutatingPolicy => "NamespacedMutatingPolicy",
            Kind::GeneratingPolicy => "GeneratingPolicy",
            Kind::NamespacedGeneratingPolicy => "NamespacedGeneratingPolicy",
            Kind::DeletingPolicy => "DeletingPolicy",
            Kind::NamespacedDeletingPolicy => "NamespacedDeletingPolicy",
            Kind::ImageValidatingPolicy => "ImageValidatingPolicy",
            Kind::NamespacedImageValidatingPolicy => "NamespacedImageValidatingPolicy",
            Kind::ValidatingAdmissionPolicy => "ValidatingAdmissionPolicy",
            Kind::ValidatingAdmissionPolicyBinding => "ValidatingAdmissionPolicyBinding",
            Kind::MutatingAdmissionPolicy => "MutatingAdmissionPolicy",
            Kind::MutatingAdmissionPolicyBinding => "MutatingAdmissionPolicyBinding",
        }
    }

    pub fn group(self) -> Group {
        match self {
            Kind::ClusterPolicy
            | Kind::Policy
            | Kind::PolicyException
            | Kind::CleanupPolicy
            | Kind::ClusterCleanupPolicy => Group::Kyverno,
            Kind::ValidatingAdmissionPolicy
            | Kind::ValidatingAdmissionPolicyBinding
            | Kind::MutatingAdmissionPolicy
            | Kind::MutatingAdmissionPolicyBinding => Group::Admission,
            _ => Group::Policies,
        }
    }

    /// Namespaced objects: a policy of such a kind applies in its own namespace only.
    pub fn is_namespaced(self) -> bool {
        matches!(
            self,
            Kind::Policy
                | Kind::PolicyException
                | Kind::CleanupPolicy
                | Kind::NamespacedValidatingPolicy
                | Kind::NamespacedMutatingPolicy
                | Kind::NamespacedGeneratingPolicy
                | Kind::NamespacedDeletingPolicy
                | Kind::NamespacedImageValidatingPolicy
                | Kind::CelPolicyException
        )
    }

    /// Exceptions rather than policies.
    pub fn is_exception(self) -> bool {
        matches!(self, Kind::PolicyException | Kind::CelPolicyException)
    }

    /// Bindings, which only parameterise an admission policy.
    pub fn is_binding(self) -> bool {
        matches!(self, Kind::ValidatingAdmissionPolicyBinding | Kind::MutatingAdmissionPolicyBinding)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_by_group_and_name() {
        assert_eq!(Kind::of("kyverno.io/v1", "ClusterPolicy"), Some(Kind::ClusterPolicy));
        assert_eq!(Kind::of("kyverno.io/v2beta1", "PolicyException"), Some(Kind::PolicyException));
        assert_eq!(Kind::of("policies.kyverno.io/v1", "PolicyException"), Some(Kind::CelPolicyException));
        assert_eq!(Kind::of("policies.kyverno.io/v1alpha1", "ValidatingPolicy"), Some(Kind::ValidatingPolicy));
        assert_eq!(Kind::of("v1", "Pod"), None);
        assert_eq!(Kind::of("example.com/v1", "ClusterPolicy"), None);
        for k in Kind::ALL {
            assert_eq!(Kind::of(&format!("{}/v1", k.group().as_str()), k.name()), Some(k));
        }
    }
}
