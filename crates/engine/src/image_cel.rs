//! An ImageValidatingPolicy at evaluation: the images a request holds (Pod containers by kind,
//! plus the policy's extractors), which `matchImageReferences` select, digests checked and
//! pinned, and [`ImageHost`], the CEL host whose verify functions (`verifyImageSignatures`,
//! `verifyAttestationSignatures`, `extractPayload`, `getImageData`) reach registries through
//! the [`ImageVerifier`] port. Compiled in [`crate::ivpol`]; run by [`crate::validate`].

use crate::forms::{ImageCel, ImageRef};
use crate::outcome::Status;
use crate::ports::{ImageError, ImageVerifier, SignatureCheck};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use verno_api::images::{Attestor, Certificates, CtLog, Keyless, Rekor, StaticKeys};
use verno_cel::HostError;

/// The Pod spec of a workload, by its kind (Kyverno's default image extractors).
fn pod_spec(object: &Value) -> Option<&Value> {
    match object.get("kind").and_then(Value::as_str)? {
        "Pod" => object.get("spec"),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => object.pointer("/spec/template/spec"),
        "CronJob" => object.pointer("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

impl ImageCel {
    /// Whether `matchImageReferences` select an image (all are selected when there are none).
    fn selects(&self, image: &str) -> Result<bool, String> {
        if self.refs.is_empty() {
            return Ok(true);
        }
        for r in &self.refs {
            let hit = match r {
                ImageRef::Glob(g) => verno_jmespath::wildcard::matches(g, image),
                ImageRef::Expr(e) => {
                    let mut vars = verno_cel::Vars::default();
                    vars.set("ref", &Value::String(image.to_string()));
                    e.eval_bool(&vars).map_err(|e| e.to_string())?
                }
            };
            if hit {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The images of `object` by list name, only those selected; an error names the list.
    pub(crate) fn images(
        &self,
        object: &Value,
        vars: &verno_cel::Vars,
    ) -> Result<BTreeMap<String, Vec<String>>, String> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(spec) = pod_spec(object) {
            for list in ["containers", "initContainers", "ephemeralContainers"] {
                let images: Vec<String> = spec
                    .get(list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("image").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect();
                out.insert(list.to_string(), images);
            }
        }
        for (name, e) in &self.extractors {
            let v = e.eval(vars).map_err(|err| format!("failed to extract images {name}: {err}"))?;
            let list = v
                .as_array()
                .ok_or_else(|| {
                    format!("failed to extract images {name}: the expression must return a list of strings")
                })?
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("failed to extract images {name}: not a string: {x}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.insert(name.clone(), list);
        }
        for list in out.values_mut() {
            let mut kept = Vec::with_capacity(list.len());
            for i in list.drain(..) {
                if self.selects(&i)? {
                    kept.push(i);
                }
            }
            *list = kept;
        }
        Ok(out)
    }

    /// `mutateDigest` (the ImageValidatingPolicy mutating webhook): every selected container
    /// image without a digest gets the registry's (`image:tag@sha256:…`, tag kept). Images the
    /// registry cannot resolve keep their tag and make an `error` result (which denies under
    /// `Deny`); the others are still pinned.
    pub(crate) fn pin_digests(
        &self,
        rule: &str,
        object: &Value,
        data: &dyn crate::ports::Data,
    ) -> (Option<crate::outcome::RuleResponse>, Option<Value>) {
        if !self.mutate_digest {
            return (None, None);
        }
        let all = crate::images::extract(object);
        let verifier = data.image_verifier();
        let mut patched = object.clone();
        let (mut changed, mut errors) = (false, Vec::new());
        for group in ["initContainers", "containers", "ephemeralContainers"] {
            for info in all.get(group).and_then(Value::as_object).into_iter().flat_map(|m| m.values()) {
                let s = |k: &str| info.get(k).and_then(Value::as_str).unwrap_or("");
                if !s("digest").is_empty() {
                    continue;
                }
                let pointer = s("jsonPointer");
                let tagged = s("referenceWithTag");
                match self.selects(tagged) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                }
                let digest = match &verifier {
                    Some(v) => v.digest(tagged, self.credentials.as_ref(), ""),
                    None => Err(ImageError::Unreachable(
                        "image verification is not available here (no registry access)".into(),
                    )),
                };
                match digest {
                    Ok(d) => {
                        if let Some(slot) = patched.pointer_mut(pointer) {
                            // As Kyverno: the normalized image, tag kept, then the digest.
                            *slot = Value::String(format!("{tagged}@{d}"));
                            changed = true;
                        }
                    }
                    Err(e) => errors.push(format!("failed to resolve digest for image {tagged}: {}", e.message())),
                }
            }
        }
        let resp = (!errors.is_empty()).then(|| {
            crate::outcome::RuleResponse::new(
                rule,
                crate::outcome::RuleType::ImageVerify,
                Status::Error,
                format!("failed to update digest: {}", errors.join("; ")),
            )
        });
        (resp, changed.then_some(patched))
    }

    /// The first selected image without a digest, when digests are required.
    pub(crate) fn missing_digest<'a>(&self, images: &'a BTreeMap<String, Vec<String>>) -> Option<&'a str> {
        if !self.verify_digest {
            return None;
        }
        images.values().flatten().map(String::as_str).find(|i| !i.contains("@sha256:"))
    }

    /// The CEL variables the validations read about images.
    pub(crate) fn set_vars(&self, vars: &mut verno_cel::Vars, images: &BTreeMap<String, Vec<String>>) {
        vars.set("images", &json!(images));
        vars.set("attestors", &Value::Object(self.attestors.clone()));
        let names: Map<String, Value> =
            self.attestations.keys().map(|k| (k.clone(), Value::String(k.clone()))).collect();
        vars.set("attestations", &Value::Object(names));
    }

    /// `required`: after the validations passed, every selected image must have been verified.
    pub(crate) fn unverified(&self, host: &ImageHost, images: &BTreeMap<String, Vec<String>>) -> Option<String> {
        if !self.required {
            return None;
        }
        let seen = host.verified.lock().map(|m| m.clone()).unwrap_or_default();
        for image in images.values().flatten() {
            match seen.get(image) {
                Some(true) => {}
                Some(false) => return Some(format!("image {image} failed signature or attestation verification")),
                None => {
                    return Some(format!(
                        "image {image} is not verified: no policy performed a signature or attestation check on it"
                    ));
                }
            }
        }
        None
    }
}

/// The CEL host of one ImageValidatingPolicy evaluation: the verify functions on the
/// [`ImageVerifier`] port, everything else from the caller's host.
pub struct ImageHost {
    inner: Option<Arc<dyn verno_cel::Host>>,
    verifier: Option<Arc<dyn ImageVerifier>>,
    cfg: Arc<ImageCel>,
    namespace: String,
    /// Per image: whether a verification of it passed (`false`: tried and failed).
    verified: Mutex<BTreeMap<String, bool>>,
    /// Verified attestation predicates by (image, attestation).
    payloads: Mutex<BTreeMap<(String, String), Value>>,
}

impl ImageHost {
    pub(crate) fn new(
        inner: Option<Arc<dyn verno_cel::Host>>,
        verifier: Option<Arc<dyn ImageVerifier>>,
        cfg: Arc<ImageCel>,
        namespace: &str,
    ) -> ImageHost {
        ImageHost {
            inner,
            verifier,
            cfg,
            namespace: namespace.to_string(),
            verified: Mutex::new(BTreeMap::new()),
            payloads: Mutex::new(BTreeMap::new()),
        }
    }

    fn record(&self, image: &str, ok: bool) {
        if let Ok(mut m) = self.verified.lock() {
            let e = m.entry(image.to_string()).or_insert(false);
            *e |= ok;
        }
    }

    /// Checks one written attestor against an image: `Ok(Some(statements))` when it verified.
    fn check(&self, image: &str, attestor: &Value, attestation: Option<&str>) -> Result<Option<Vec<Value>>, String> {
        let verifier = self
            .verifier
            .as_ref()
            .ok_or("failed to get imagedata: image verification is not available here (no registry access)")?;
        let entries = to_attestors(attestor)?;
        let annotations: BTreeMap<String, String> = attestor
            .pointer("/cosign/annotations")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default();
        let repository = attestor.pointer("/cosign/source/repository").and_then(Value::as_str).unwrap_or("");
        // Keyless identities: any one of them.
        for a in &entries {
            let check = SignatureCheck {
                image,
                attestor: a,
                repository,
                annotations: &annotations,
                credentials: self.cfg.credentials.as_ref(),
                namespace: &self.namespace,
                kind: "Cosign",
                cosign_oci11: false,
                attestation,
                cancel: None,
            };
            match verifier.verify(&check) {
                Ok(v) => return Ok(Some(v.statements)),
                Err(ImageError::Unreachable(m)) => return Err(format!("failed to get imagedata: {m}")),
                Err(ImageError::Failed(_)) => {}
            }
        }
        Ok(None)
    }
}

/// An ImageValidatingPolicy's cosign attestor as the verifier's attestor entries (one per
/// keyless identity). Notary attestors, KMS keys and key expressions are refused.
fn to_attestors(a: &Value) -> Result<Vec<Attestor>, String> {
    let Some(c) = a.get("cosign") else {
        return Err("notary attestors are not supported by this build of verno".into());
    };
    let s = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    let b = |p: &str| c.pointer(p).and_then(Value::as_bool).unwrap_or(false);
    let ctlog = c.get("ctlog");
    let rekor = Some(Rekor {
        url: s("/ctlog/url"),
        pubkey: s("/ctlog/rekorPubKey"),
        ignore_tlog: ctlog.is_some() && b("/ctlog/insecureIgnoreTlog"),
    });
    let ct = Some(CtLog {
        ignore_sct: b("/ctlog/insecureIgnoreSCT"),
        pubkey: s("/ctlog/ctLogPubKey"),
        tsa_cert_chain: s("/ctlog/tsaCertChain"),
    });
    if let Some(k) = c.get("key") {
        if !s("/key/kms").is_empty() || !s("/key/expression").is_empty() {
            return Err("KMS keys and key expressions are not supported by this build of verno".into());
        }
        return Ok(vec![Attestor {
            keys: Some(StaticKeys {
                public_keys: k.get("data").and_then(Value::as_str).unwrap_or("").to_string(),
                signature_algorithm: s("/key/hashAlgorithm"),
                rekor,
                ctlog: ct,
                ..Default::default()
            }),
            ..Default::default()
        }]);
    }
    if c.get("certificate").is_some() {
        return Ok(vec![Attestor {
            certificates: Some(Certificates {
                certificate: s("/certificate/cert/value"),
                certificate_chain: s("/certificate/certChain/value"),
                rekor,
                ctlog: ct,
            }),
            ..Default::default()
        }]);
    }
    if let Some(kl) = c.get("keyless") {
        // Kyverno's schema types `roots` as the PEM text itself; `{value: …}` (the shape of
        // `certificate.cert`) is read too.
        let roots = kl
            .get("roots")
            .and_then(|r| r.as_str().or_else(|| r.get("value").and_then(Value::as_str)))
            .unwrap_or("")
            .to_string();
        let ids = kl.get("identities").and_then(Value::as_array).cloned().unwrap_or_default();
        let extensions: BTreeMap<String, String> = kl
            .get("additionalExtensions")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default();
        return Ok(ids
            .iter()
            .map(|id| {
                let g = |k: &str| id.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                Attestor {
                    keyless: Some(Keyless {
                        subject: g("subject"),
                        subject_regexp: g("subjectRegExp"),
                        issuer: g("issuer"),
                        issuer_regexp: g("issuerRegExp"),
                        roots: roots.clone(),
                        additional_extensions: extensions.clone(),
                        rekor: rekor.clone(),
                        ctlog: ct.clone(),
                    }),
                    ..Default::default()
                }
            })
            .collect());
    }
    Err("a cosign attestor needs key, keyless or certificate".into())
}

impl verno_cel::Host for ImageHost {
    fn confined_to(&self) -> Option<&str> {
        self.inner.as_deref().and_then(verno_cel::Host::confined_to)
    }
    fn resource_get(&self, api_version: &str, resource: &str, namespace: &str, name: &str) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.resource_get(api_version, resource, namespace, name),
            None => Err(HostError::Unavailable("resource.Get is not available here (no cluster)".into())),
        }
    }
    fn resource_list(&self, api_version: &str, resource: &str, namespace: &str) -> Result<Vec<Value>, HostError> {
        match &self.inner {
            Some(h) => h.resource_list(api_version, resource, namespace),
            None => Err(HostError::Unavailable("resource.List is not available here (no cluster)".into())),
        }
    }
    fn http(&self, call: &verno_cel::HttpCall<'_>) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.http(call),
            None => Err(HostError::Unavailable(format!("http call to {} is not available here", call.url))),
        }
    }
    fn global_context(&self, name: &str, projection: &str) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.global_context(name, projection),
            None => Err(HostError::Unavailable(format!("global context entry {name:?} is not available here"))),
        }
    }
    fn image_metadata(&self, reference: &str) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.image_metadata(reference),
            None => Err(HostError::Unavailable(format!(
                "failed to get imagedata: metadata for image {reference:?} is not available here"
            ))),
        }
    }
    fn authorize(&self, review: &Value) -> Result<Value, HostError> {
        match &self.inner {
            Some(h) => h.authorize(review),
            None => Err(HostError::Unavailable("the authorizer is not available here (no cluster)".into())),
        }
    }
    fn now(&self) -> Option<i64> {
        self.inner.as_ref().and_then(|h| h.now())
    }
    fn random_seed(&self) -> Option<u64> {
        self.inner.as_ref().and_then(|h| h.random_seed())
    }

    fn verify_image_signatures(&self, image: &str, attestors: &[Value]) -> Result<i64, HostError> {
        if !self.cfg.selects(image).map_err(HostError::Failed)? {
            return Ok(0);
        }
        let mut count = 0;
        for a in attestors {
            if self.check(image, a, None).map_err(HostError::Failed)?.is_some() {
                count += 1;
            }
        }
        if !attestors.is_empty() {
            self.record(image, count > 0);
        }
        Ok(count)
    }

    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[Value],
    ) -> Result<i64, HostError> {
        if !self.cfg.selects(image).map_err(HostError::Failed)? {
            return Ok(0);
        }
        let spec = self
            .cfg
            .attestations
            .get(attestation)
            .ok_or_else(|| HostError::Failed(format!("attestation not found in policy: {attestation}")))?;
        let Some(kind) = spec.pointer("/intoto/type").and_then(Value::as_str) else {
            return Err(HostError::Unavailable(
                "referrer attestations (OCI 1.1 referrers) are not supported by this build of verno".into(),
            ));
        };
        let mut count = 0;
        for a in attestors {
            if let Some(statements) = self.check(image, a, Some(kind)).map_err(HostError::Failed)? {
                let wanted: Vec<&Value> = statements
                    .iter()
                    .filter(|s| s.get("predicateType").and_then(Value::as_str) == Some(kind))
                    .collect();
                if let Some(first) = wanted.first() {
                    count += 1;
                    if let Ok(mut p) = self.payloads.lock() {
                        p.insert(
                            (image.to_string(), attestation.to_string()),
                            first.get("predicate").cloned().unwrap_or(Value::Null),
                        );
                    }
                }
            }
        }
        if !attestors.is_empty() {
            self.record(image, count > 0);
        }
        Ok(count)
    }

    fn extract_payload(&self, image: &str, attestation: &str) -> Result<Value, HostError> {
        if !self.cfg.attestations.contains_key(attestation) {
            return Err(HostError::Failed(format!("attestation not found in policy: {attestation}")));
        }
        self.payloads
            .lock()
            .ok()
            .and_then(|p| p.get(&(image.to_string(), attestation.to_string())).cloned())
            .ok_or_else(|| {
                HostError::Failed(format!(
                    "no verified payload for attestation {attestation} of image {image}: call verifyAttestationSignatures first"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

    use super::*;
    use serde_json::json;

    /// Kyverno's schema gives keyless `roots` as a string (before, only `roots.value` was read,
    /// so the roots of a policy written as Kyverno documents it were dropped and every keyless
    /// check failed against the wrong trust).
    #[test]
    fn keyless_roots_are_read_as_kyvernos_schema_writes_them() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        for roots in [json!(pem), json!({"value": pem})] {
            let a = json!({"name": "a", "cosign": {"keyless": {"roots": roots,
                "identities": [{"subject": "https://github.com/org/repo", "issuer": "https://token.actions.githubusercontent.com"}]}}});
            let got = to_attestors(&a).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].keyless.as_ref().unwrap().roots, pem);
        }
    }
}
