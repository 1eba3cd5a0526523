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
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(gvr.group.clone()),
                version: Some(gvr.version.clone()),
                resource: Some(gvr.resource.clone()),
                verb: Some(verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
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
