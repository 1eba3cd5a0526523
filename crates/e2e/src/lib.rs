//! What the end-to-end tools share with the tests: a real control plane with Verno in it
//! ([`real`]), and the set-up of the scale benchmarks ([`scale`]).

pub mod real;
pub mod scale;

/// Kyverno's ServiceAccount names (its chart's defaults in namespace `kyverno`): the runners
/// install Verno under them, as a user moving from Kyverno would, because Kyverno's suite binds
/// roles to them and acts as them (`kubectl --as system:serviceaccount:kyverno:…`). Values
/// keys and the names: admission (Verno's own account), background, cleanup.
pub const KYVERNO_ACCOUNTS: [(&str, &str); 3] = [
    ("admissionController.rbac.serviceAccount.name", "kyverno-admission-controller"),
    ("backgroundController.rbac.serviceAccount.name", "kyverno-background-controller"),
    ("cleanupController.rbac.serviceAccount.name", "kyverno-cleanup-controller"),
];

/// `verno serve` arguments naming the controller accounts of [`KYVERNO_ACCOUNTS`], and the
/// webhook configurations by Kyverno's names (the chart's `kyvernoNames`, which the runners set:
/// the suite asserts `kyverno-resource-validating-webhook-cfg`).
pub fn kyverno_account_args() -> Vec<String> {
    let [_, (_, background), (_, cleanup)] = KYVERNO_ACCOUNTS;
    ["--background-account", background, "--cleanup-account", cleanup, "--kyverno-names", "true"]
        .map(str::to_string)
        .to_vec()
}
