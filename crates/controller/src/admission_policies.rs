//! Kyverno's `generateValidatingAdmissionPolicy` in the cluster (leader only): the
//! ValidatingAdmissionPolicies and bindings the policy plans ask for
//! (`verno_engine::vapgen`) are written, those of policies that no longer qualify are removed,
//! and each policy's status says whether its admission policy is generated. A policy whose live
//! status says so is enforced by the API server and no longer evaluated by Verno (see
//! `policies::generated`). Generated objects are owned by their policy, so the garbage collector
//! removes them with it.
//!
//! MutatingPolicies with `spec.autogen.mutatingAdmissionPolicy.enabled` become
//! MutatingAdmissionPolicies the same way, at the version the API server prefers (v1, v1beta1,
//! v1alpha1: [`map_version`]); Kyverno generates those whatever its
//! `generateMutatingAdmissionPolicy` flag says, so Verno has no flag for them.
//!
//! Not yet: Kyverno's `GeneratedValidatingAdmissionPolicy` event; custom kinds named without
//! group and version (Kyverno asks discovery).

use crate::policies::PolicyStatus;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::Value;
use std::collections::HashMap;
use verno_engine::vapgen::VapPlan;

/// Field manager of the generated objects.
const MANAGER: &str = "verno-admission-policies";

const GROUP: &str = "admissionregistration.k8s.io";

fn api(client: &kube::Client, kind: &str, version: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("policys", "policies"),
    };
    Api::all_with(client.clone(), &ar)
}

/// The MutatingAdmissionPolicy version the API server serves, policies and bindings both, in
/// Kyverno's order of preference (v1, v1beta1, v1alpha1); `None` when it serves none (or
/// discovery fails: then no admission policy is generated, and the policies say why).
pub async fn map_version(client: &kube::Client) -> Option<String> {
    for v in verno_engine::vapgen::MAP_VERSIONS {
        let Ok(list) = client.list_api_group_resources(&format!("{GROUP}/{v}")).await else { continue };
        let served = |plural: &str| list.resources.iter().any(|r| r.name == plural);
        if served("mutatingadmissionpolicies") && served("mutatingadmissionpolicybindings") {
            return Some(v.to_string());
        }
    }
    None
}

/// What the leader has written, per admission policy name: the objects as applied (a pass
/// writes only what changed; a new leader writes everything once).
#[derive(Default)]
pub struct Generator {
    applied: HashMap<String, (Value, Value)>,
}

impl Generator {
    /// Applies the plans among `statuses`, and returns the statuses with the outcome written in.
    /// `validating`: Kyverno's `generateValidatingAdmissionPolicy` (off: ClusterPolicies and
    /// ValidatingPolicies are left as they are); `map_version`: where MutatingAdmissionPolicies
    /// are written.
    pub async fn reconcile(
        &mut self,
        client: &kube::Client,
        statuses: &[PolicyStatus],
        validating: bool,
        map_version: Option<&str>,
    ) -> Vec<PolicyStatus> {
        let mut out = Vec::with_capacity(statuses.len());
        for st in statuses {
            let mut st = st.clone();
            let mutating = st.kind == verno_engine::Kind::MutatingPolicy;
            if !mutating && !validating {
                out.push(st);
                continue;
            }
            let (prefix, kind, version) = match st.kind {
                verno_engine::Kind::ClusterPolicy => ("cpol", "ValidatingAdmissionPolicy", "v1"),
                verno_engine::Kind::MutatingPolicy => ("mpol", "MutatingAdmissionPolicy", map_version.unwrap_or("v1")),
                _ => ("vpol", "ValidatingAdmissionPolicy", "v1"),
            };
            let policies = api(client, kind, version);
            let bindings = api(client, &format!("{kind}Binding"), version);
            let lower = kind.to_lowercase();
            let name = format!("{prefix}-{}", st.name);
            match st.vap.clone() {
                None => {}
                Some(Err(e)) => {
                    tracing::warn!(policy = %st.name, error = %e, "{kind} not generated");
                    st.with_generation(false, &format!("failed to build {lower} {name}: {e}"));
                }
                Some(Ok(VapPlan::Skip(why))) => {
                    // Without a served version there is nothing to remove.
                    if (!mutating || map_version.is_some()) && (self.applied.remove(&name).is_some() || st.generated) {
                        for (api, n) in [(&bindings, format!("{name}-binding")), (&policies, name.clone())] {
                            match api.delete(&n, &DeleteParams::default()).await {
                                Ok(_) => tracing::info!(object = %n, "generated admission policy object removed"),
                                Err(kube::Error::Api(e)) if e.code == 404 => {}
                                Err(e) => {
                                    tracing::warn!(object = %n, error = %e, "generated admission policy object not removed")
                                }
                            }
                        }
                    }
                    st.with_generation(false, &why);
                }
                Some(Ok(VapPlan::Generate { policy, binding })) => {
                    let done = self.applied.get(&name) == Some(&(policy.clone(), binding.clone())) && st.generated;
                    let written = if done {
                        Ok(())
                    } else {
                        let pp = PatchParams::apply(MANAGER).force();
                        let bname = format!("{name}-binding");
                        match policies.patch(&name, &pp, &Patch::Apply(&policy)).await {
                            Ok(_) => bindings.patch(&bname, &pp, &Patch::Apply(&binding)).await.map(|_| ()),
                            Err(e) => Err(e),
                        }
                    };
                    match written {
                        Ok(()) => {
                            if !done {
                                tracing::info!(policy = %st.name, admission_policy = %name, "{kind} generated");
                            }
                            self.applied.insert(name, (policy, binding));
                            st.with_generation(true, "");
                        }
                        Err(e) => {
                            tracing::warn!(policy = %st.name, error = %e, "{kind} not written");
                            self.applied.remove(&name);
                            st.with_generation(false, &format!("failed to create {lower} {name}: {e}"));
                        }
                    }
                }
            }
            out.push(st);
        }
        out
    }
}
