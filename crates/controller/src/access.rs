//! Verno's own permissions, checked with `SelfSubjectAccessReview`s: a CEL policy's
//! `RBACPermissionsGranted` condition says whether Verno may read (get, list, watch) what the
//! policy's background scan needs, as Kyverno checks its reports controller's service account.
//!
//! Verno is one process with one service account, so it asks about itself rather than naming a
//! service account (Kyverno's `SubjectAccessReview` for `--reportsServiceAccountName`).

use crate::policies::{Gvr, Missing};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use std::collections::HashMap;

/// The verbs a background scan needs, in Kyverno's order.
const VERBS: [&str; 3] = ["get", "list", "watch"];

/// At most this many distinct checks per pass; further resources are reported unchecked rather
/// than sending an unbounded number of reviews for one policy set.
const MAX_CHECKS: usize = 1024;

/// The answers of one pass over the policies (a resource shared by many policies is asked about
/// once).
#[derive(Default)]
pub struct Answers {
    seen: HashMap<(String, Gvr), (bool, String)>,
}

impl Answers {
    /// The permissions Verno lacks among `gvrs` × get/list/watch (empty: all granted).
    pub async fn missing(&mut self, client: &kube::Client, gvrs: &[Gvr]) -> Result<Missing, kube::Error> {
        let mut out = Missing::new();
        for gvr in gvrs {
            for verb in VERBS {
                let key = (verb.to_string(), gvr.clone());
                let (allowed, reason) = match self.seen.get(&key) {
                    Some(a) => a.clone(),
                    None if self.seen.len() >= MAX_CHECKS => {
                        (false, format!("not checked: more than {MAX_CHECKS} permission checks in one pass"))
                    }
                    None => {
                        let a = ask(client, verb, gvr).await?;
                        self.seen.insert(key, a.clone());
                        a
                    }
                };
                if !allowed {
                    out.push((verb.to_string(), gvr.clone(), reason));
                }
            }
        }
        Ok(out)
    }
}

async fn ask(client: &kube::Client, verb: &str, gvr: &Gvr) -> Result<(bool, String), kube::Error> {
    review(client, attributes(gvr, verb)).await
}

/// What a review asks about `verb` on `gvr` (cluster-wide, no name, no subresource).
fn attributes(gvr: &Gvr, verb: &str) -> ResourceAttributes {
    ResourceAttributes {
        group: Some(gvr.group.clone()),
        version: Some(gvr.version.clone()),
        resource: Some(gvr.resource.clone()),
        verb: Some(verb.to_string()),
        ..Default::default()
    }
}

/// A `SelfSubjectAccessReview` made through `client` (as whoever it acts as): allowed, and why.
async fn review(client: &kube::Client, attributes: ResourceAttributes) -> Result<(bool, String), kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec { resource_attributes: Some(attributes), ..Default::default() },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &review).await?;
    let status = answer.status.unwrap_or_default();
    Ok((status.allowed, status.reason.unwrap_or_default()))
}

/// Whether Verno may `verb` the resource `gvr` cluster-wide.
pub async fn allowed(client: &kube::Client, verb: &str, gvr: &Gvr) -> Result<bool, kube::Error> {
    ask(client, verb, gvr).await.map(|(ok, _)| ok)
}

/// A kind discovery does not serve (Kyverno's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to get GVR for kind {api_version}/{kind}")]
pub struct UnknownKind {
    pub api_version: String,
    pub kind: String,
}

/// Kyverno's policy-admission permission checks ([`verno_engine::access_checks`]) answered by
/// the API server: a `SelfSubjectAccessReview` made as the account in question (the
/// background controller's by impersonation, as Verno acts as it), the rule's kind resolved
/// to its resource by discovery.
pub struct PolicyAccess {
    admission: kube::Client,
    background: Option<kube::Client>,
    admission_user: String,
    background_user: String,
    discovery: tokio::sync::Mutex<crate::runtime::DiscoveryCache>,
}

impl PolicyAccess {
    pub fn new(admission: kube::Client, acting: &crate::Acting, namespace: &str) -> PolicyAccess {
        let admission_user = format!("system:serviceaccount:{namespace}:{}", crate::manifests::SERVICE_ACCOUNT);
        PolicyAccess {
            admission,
            background: acting.background.clone(),
            // Without an impersonated background client Verno acts as itself.
            background_user: acting.background_user.clone().unwrap_or_else(|| admission_user.clone()),
            admission_user,
            discovery: tokio::sync::Mutex::new(crate::runtime::DiscoveryCache::new(std::time::Duration::from_secs(30))),
        }
    }

    /// The resource of `api_version` (empty: any) and `kind`, asking discovery again once when
    /// it is not known (a CRD installed since).
    async fn resource(&self, api_version: &str, kind: &str) -> Result<Gvr, UnknownKind> {
        self.discovered(api_version, kind).await.map(|(gvr, _)| gvr)
    }

    /// [`PolicyAccess::resource`] and whether it is cluster-wide.
    async fn discovered(&self, api_version: &str, kind: &str) -> Result<(Gvr, bool), UnknownKind> {
        for fresh in [false, true] {
            let d = self.discovery.lock().await.get(&self.admission, fresh, "permission checks use the last one").await;
            let Some(d) = d else { continue };
            let (group, version) = match api_version.rsplit_once('/') {
                Some((g, v)) => (g, v),
                None => ("", api_version),
            };
            for g in d.groups() {
                if !api_version.is_empty() && g.name() != group {
                    continue;
                }
                let resources =
                    if api_version.is_empty() { g.recommended_resources() } else { g.versioned_resources(version) };
                if let Some((ar, caps)) = resources.into_iter().find(|(ar, _)| ar.kind == kind) {
                    let cluster = caps.scope == kube::discovery::Scope::Cluster;
                    return Ok((Gvr { group: ar.group, version: ar.version, resource: ar.plural }, cluster));
                }
            }
        }
        Err(UnknownKind { api_version: api_version.to_string(), kind: kind.to_string() })
    }
}

/// (`String` errors: the engine's `AccessReview` port fixes them as the message of the policy's
/// refusal.)
impl verno_engine::access_checks::AccessReview for PolicyAccess {
    fn user(&self, account: verno_engine::access_checks::Account) -> String {
        match account {
            verno_engine::access_checks::Account::Background => self.background_user.clone(),
            verno_engine::access_checks::Account::Admission => self.admission_user.clone(),
        }
    }

    fn cluster_scoped<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> verno_engine::access_checks::ScopeAnswer<'a> {
        Box::pin(async move {
            self.discovered(api_version, kind).await.map(|(_, cluster)| cluster).map_err(|e| e.to_string())
        })
    }

    fn lacking<'a>(
        &'a self,
        check: &'a verno_engine::access_checks::AccessCheck,
    ) -> verno_engine::access_checks::Answer<'a> {
        Box::pin(async move {
            let gvr = self.resource(&check.api_version, &check.kind).await.map_err(|e| e.to_string())?;
            let client = match check.account {
                verno_engine::access_checks::Account::Background => self.background.as_ref().unwrap_or(&self.admission),
                verno_engine::access_checks::Account::Admission => &self.admission,
            };
            let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
            let mut out = Vec::new();
            for verb in &check.verbs {
                let asked = ResourceAttributes {
                    subresource: some(&check.subresource),
                    namespace: some(&check.namespace),
                    name: some(&check.name),
                    ..attributes(&gvr, verb)
                };
                if !review(client, asked).await.map_err(|e| e.to_string())?.0 {
                    out.push(*verb);
                }
            }
            Ok(out)
        })
    }
}
