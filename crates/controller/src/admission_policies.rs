//! Kyverno's `generateValidatingAdmissionPolicy` in the cluster (leader only): the
//! ValidatingAdmissionPolicies and bindings the policy plans ask for
//! (`verno_engine::vapgen`) are written, those of policies that no longer qualify are removed,
//! and each policy's status says whether its admission policy is generated. A policy whose live
//! status says so is enforced by the API server and no longer evaluated by Verno (see
//! `policies::generated`). Generated objects are owned by their policy, so the garbage collector
//! removes them with it.
//!
//! Not yet: MutatingAdmissionPolicies from MutatingPolicies (`generateMutatingAdmissionPolicy`,
//! off by default in Kyverno's chart); Kyverno's `GeneratedValidatingAdmissionPolicy` event;
//! custom kinds named without group and version (Kyverno asks discovery).

use crate::policies::PolicyStatus;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::Value;
use std::collections::HashMap;
use verno_engine::vapgen::VapPlan;

/// Field manager of the generated objects.
const MANAGER: &str = "verno-admission-policies";

fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("policys", "policies"),
    };
    Api::all_with(client.clone(), &ar)
}

/// What the leader has written, per admission policy name: the objects as applied (a pass
/// writes only what changed; a new leader writes everything once).
#[derive(Default)]
pub struct Generator {
    applied: HashMap<String, (Value, Value)>,
}

impl Generator {
    /// Applies the plans among `statuses`, and returns the statuses with the outcome written in.
    pub async fn reconcile(&mut self, client: &kube::Client, statuses: &[PolicyStatus]) -> Vec<PolicyStatus> {
        let policies = api(client, "ValidatingAdmissionPolicy");
        let bindings = api(client, "ValidatingAdmissionPolicyBinding");
        let mut out = Vec::with_capacity(statuses.len());
        for st in statuses {
            let mut st = st.clone();
            let prefix = if st.kind == verno_engine::Kind::ClusterPolicy { "cpol" } else { "vpol" };
            let name = format!("{prefix}-{}", st.name);
            match st.vap.clone() {
                None => {}
                Some(Err(e)) => {
                    tracing::warn!(policy = %st.name, error = %e, "ValidatingAdmissionPolicy not generated");
                    st.with_generation(false, &format!("failed to build validatingadmissionpolicy {name}: {e}"));
                }
                Some(Ok(VapPlan::Skip(why))) => {
                    if self.applied.remove(&name).is_some() || st.generated {
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
                                tracing::info!(policy = %st.name, admission_policy = %name, "ValidatingAdmissionPolicy generated");
                            }
                            self.applied.insert(name, (policy, binding));
                            st.with_generation(true, "");
                        }
                        Err(e) => {
                            tracing::warn!(policy = %st.name, error = %e, "ValidatingAdmissionPolicy not written");
                            self.applied.remove(&name);
                            st.with_generation(
                                false,
                                &format!("failed to create validatingadmissionpolicy {name}: {e}"),
                            );
                        }
                    }
                }
            }
            out.push(st);
        }
        out
    }
}
