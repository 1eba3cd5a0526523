//! `verifyImages` rules (ClusterPolicy / Policy), as Kyverno runs them in two steps:
//!
//! * the **verify** phase (between mutate and validate): for each image of the resource that a
//!   rule's `imageReferences` select, check the attestor sets (signatures) and attestations
//!   through the [`ImageVerifier`] port, pin the digest (`mutateDigest`: the tag is kept and
//!   `@sha256:…` added) and record the outcome in the `kyverno.io/verify-images` and
//!   `kyverno.io/verify-images-scoped` annotations;
//! * the **validate** phase: on the resource as the verify phase left it, `verifyDigest` needs a
//!   digest and `required` needs this policy's rule to have recorded the image as passed (or
//!   skipped) in the scoped annotation.
//!
//! The engine owns the semantics (which images, attestor set counts and nesting, conditions on
//! attestation predicates, messages, annotations, the cache key); fetching signatures from a
//! registry and checking them cryptographically is the port's job, so the engine stays pure.

use crate::condition::CompiledConditions;
use crate::context::{Context, Saved};
use crate::error::CompileError;
use crate::forms::Entry;
use crate::outcome::{RuleResponse, RuleType, Status};
use crate::policy::{Action, CompiledPolicy};
use crate::ports::{Data, Request};
use crate::template::TValue;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use verno_api::images::{Attestation, Attestor, AttestorSet, ImageVerification};

/// The annotation listing every verified image and its outcome.
pub const ANNOTATION: &str = "kyverno.io/verify-images";
/// The annotation listing outcomes per policy and rule.
pub const ANNOTATION_SCOPED: &str = "kyverno.io/verify-images-scoped";
/// Where the outcomes of this request's earlier policies wait (a key no JMESPath can reach), so
/// the annotations carry every policy's outcomes, as Kyverno's webhook merges them.
const METADATA_KEY: &str = "@verifiedImages";
/// Nested attestor sets deeper than this are refused (the policy is data from users).
const MAX_NESTING: usize = 8;

use crate::attestors::expand_keys;
pub use crate::forms::CompiledVerifyImages;
pub use crate::ports::{ImageError, ImageVerifier, SignatureCheck, Verified};

impl Entry {
    /// The entry as written, or with its variables substituted.
    fn rendered(&self, ctx: &Context) -> Result<std::borrow::Cow<'_, ImageVerification>, String> {
        match &self.template {
            None => Ok(std::borrow::Cow::Borrowed(&self.spec)),
            Some(t) => {
                let v = t.render(ctx, "").map_err(|e| e.to_string())?;
                serde_json::from_value::<ImageVerification>(v.into_owned())
                    .map(std::borrow::Cow::Owned)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

pub(crate) fn compile(
    raw: &Value,
    path: &str,
    policy_action: Option<&str>,
) -> Result<CompiledVerifyImages, CompileError> {
    let list = raw.as_array().ok_or_else(|| CompileError::new(path, "verifyImages must be a list"))?;
    let mut entries = Vec::with_capacity(list.len());
    let mut failure_action = None;
    for (i, item) in list.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let written: ImageVerification =
            serde_json::from_value(item.clone()).map_err(|e| CompileError::new(&p, e.to_string()))?;
        let spec = written.converted();
        let action = match &spec.failure_action {
            Some(a) => Some(Action::parse(a).ok_or_else(|| {
                CompileError::new(
                    format!("{p}.failureAction"),
                    format!("unknown action {a:?}, expected Audit or Enforce"),
                )
            })?),
            None => None,
        };
        // The rule's action as Kyverno resolves it: Enforce when any entry enforces, else the
        // first entry's that sets one.
        if action == Some(Action::Enforce) || failure_action.is_none() {
            failure_action = action.or(failure_action);
        }
        // A policy without validationFailureAction audits (Kyverno's `Audit()` is "not Enforce").
        let audit = match action {
            Some(a) => a == Action::Audit,
            None => policy_action.and_then(Action::parse) != Some(Action::Enforce),
        };
        if audit && written.mutate_digest {
            return Err(CompileError::new(
                format!("{p}.mutateDigest"),
                "mutateDigest must be set to false for ‘Audit’ failure action",
            ));
        }
        if spec.image_references.is_empty() {
            return Err(CompileError::new(&p, "An image reference is required"));
        }
        if !matches!(spec.kind.as_str(), "" | "Cosign" | "Notary" | "SigstoreBundle") {
            return Err(CompileError::new(
                format!("{p}.type"),
                format!("unknown type {:?}, expected Cosign, SigstoreBundle or Notary", spec.kind),
            ));
        }
        for (j, set) in spec.attestors.iter().enumerate() {
            check_set(set, &format!("{p}.attestors[{j}]"), 0)?;
        }
        let mut conditions = Vec::with_capacity(spec.attestations.len());
        for (j, a) in spec.attestations.iter().enumerate() {
            let ap = format!("{p}.attestations[{j}]");
            for (k, set) in a.attestors.iter().enumerate() {
                check_set(set, &format!("{ap}.attestors[{k}]"), 0)?;
            }
            let mut blocks = Vec::with_capacity(a.conditions.len());
            for (k, c) in a.conditions.iter().enumerate() {
                let cp = format!("{ap}.conditions[{k}]");
                let parsed: verno_api::Conditions =
                    serde_json::from_value(c.clone()).map_err(|e| CompileError::new(&cp, e.to_string()))?;
                blocks.push(CompiledConditions::compile(&parsed, &cp)?);
            }
            conditions.push(blocks);
        }
        let deny = match spec.validate.as_ref().and_then(|v| v.deny.as_ref()) {
            Some(d) => {
                let dp = format!("{p}.validate.deny");
                let parsed: verno_api::Deny =
                    serde_json::from_value(d.clone()).map_err(|e| CompileError::new(&dp, e.to_string()))?;
                CompiledConditions::compile_optional(parsed.conditions.as_ref(), &format!("{dp}.conditions"))?
            }
            None => None,
        };
        let mut bare = serde_json::to_value(&spec).map_err(|e| CompileError::new(&p, e.to_string()))?;
        if let Some(list) = bare.get_mut("attestations").and_then(Value::as_array_mut) {
            for a in list {
                if let Some(o) = a.as_object_mut() {
                    o.remove("conditions");
                }
            }
        }
        if let Some(v) = bare.get_mut("validate").and_then(Value::as_object_mut) {
            v.remove("deny");
        }
        let template = if crate::template::contains_vars(&bare) {
            Some(TValue::compile(&bare).map_err(|e| CompileError::new(&p, e))?)
        } else {
            None
        };
        entries.push(Entry { spec, template, conditions, deny });
    }
    Ok(CompiledVerifyImages { entries, failure_action, extractors: None, cache_id: String::new() })
}

fn check_set(set: &AttestorSet, path: &str, depth: usize) -> Result<(), CompileError> {
    if depth > MAX_NESTING {
        return Err(CompileError::new(path, format!("attestor sets nest deeper than {MAX_NESTING} levels")));
    }
    if set.entries.is_empty() {
        return Err(CompileError::new(path, "An entry is required"));
    }
    if let Some(n) = set.count
        && n > set.entries.len() as i64
    {
        return Err(CompileError::new(path, "Count cannot exceed length of entries"));
    }
    for (i, e) in set.entries.iter().enumerate() {
        let p = format!("{path}.entries[{i}]");
        let n = [e.keys.is_some(), e.certificates.is_some(), e.keyless.is_some(), e.attestor.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if n != 1 {
            return Err(CompileError::new(&p, "keys, certificates, keyless, or a nested attestor is required"));
        }
        if let Some(k) = &e.keys {
            if k.public_keys.is_empty() && k.kms.is_empty() && k.secret.is_none() {
                return Err(CompileError::new(format!("{p}.keys"), "A public key, kms key or secret is required"));
            }
            let alg = if k.signature_algorithm.is_empty() { &e.signature_algorithm } else { &k.signature_algorithm };
            if !matches!(alg.as_str(), "" | "sha224" | "sha256" | "sha384" | "sha512") {
                return Err(CompileError::new(format!("{p}.keys"), "Invalid signature algorithm provided"));
            }
        }
        if let Some(c) = &e.certificates
            && c.certificate.is_empty()
            && c.certificate_chain.is_empty()
        {
            return Err(CompileError::new(
                format!("{p}.certificates"),
                "A certificate or a certificate chain is required",
            ));
        }
        if let Some(k) = &e.keyless
            && k.rekor.as_ref().is_none_or(|r| r.url.is_empty() && !r.ignore_tlog)
            && k.roots.is_empty()
        {
            return Err(CompileError::new(format!("{p}.keyless"), "Either Rekor URL or roots are required"));
        }
        if let Some(raw) = &e.attestor {
            let nested = nested_set(raw).map_err(|m| CompileError::new(format!("{p}.attestor"), m))?;
            check_set(&nested, &format!("{p}.attestor"), depth + 1)?;
        }
    }
    Ok(())
}

fn nested_set(raw: &Value) -> Result<AttestorSet, String> {
    serde_json::from_value(raw.clone()).map_err(|e| format!("failed to unmarshal attestor set {raw}: {e}"))
}

/// One image of the resource, as Kyverno's `ImageInfo`.
#[derive(Debug, Clone)]
struct Image {
    registry: String,
    path: String,
    tag: String,
    digest: String,
    pointer: String,
}

impl Image {
    fn from_info(v: &Value) -> Option<Image> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let pointer = s("jsonPointer");
        if pointer.is_empty() {
            return None;
        }
        Some(Image { registry: s("registry"), path: s("path"), tag: s("tag"), digest: s("digest"), pointer })
    }

    /// `registry/path` (just `path` without a registry).
    fn base(&self) -> String {
        if self.registry.is_empty() { self.path.clone() } else { format!("{}/{}", self.registry, self.path) }
    }

    /// Kyverno's `ImageInfo.String()`: the tag is dropped when there is a digest.
    fn name(&self) -> String {
        if self.digest.is_empty() { self.tagged() } else { format!("{}@{}", self.base(), self.digest) }
    }

    /// The image with its tag and without a digest (what a digest is appended to).
    fn tagged(&self) -> String {
        format!("{}:{}", self.base(), self.tag)
    }
}

/// Every image of a resource: the rule's `imageExtractors` for its kind, else the standard
/// ones (containers, init containers, ephemeral containers of Pods and Pod templates).
fn images_of(object: &Value, extractors: Option<&crate::images::Extractors>) -> Result<Vec<Image>, String> {
    let all = match extractors.and_then(|x| crate::images::extract_custom(object, x)) {
        Some(r) => r?,
        None => crate::images::extract(object),
    };
    let mut out = Vec::new();
    if let Some(groups) = all.as_object() {
        // Kyverno's order of the standard groups, then custom ones by name.
        let mut names: Vec<&String> = groups.keys().collect();
        let rank =
            |n: &str| ["initContainers", "containers", "ephemeralContainers"].iter().position(|g| *g == n).unwrap_or(3);
        names.sort_by_key(|n| (rank(n), (*n).clone()));
        for n in names {
            if let Some(m) = groups.get(n).and_then(Value::as_object) {
                out.extend(m.values().filter_map(Image::from_info));
            }
        }
    }
    Ok(out)
}

fn references_match(refs: &[String], image: &str) -> bool {
    refs.iter().any(|r| verno_jmespath::wildcard::matches(r, image))
}

/// The outcome an image gets in the annotations.
fn status_word(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Skip => "skip",
        _ => "fail",
    }
}

/// `namespace/name` for a Policy, `/name` for a ClusterPolicy: the scoped annotation's key.
fn policy_key(policy: &CompiledPolicy) -> String {
    format!("{}/{}", policy.namespace.as_deref().unwrap_or(""), policy.name)
}

/// Image verification outcomes, as the annotations hold them.
#[derive(Debug, Default, Clone)]
struct Metadata {
    data: BTreeMap<String, String>,
    policies: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
}

impl Metadata {
    fn add(&mut self, policy: &str, rule: &str, image: &str, status: &str) {
        self.data.insert(image.to_string(), status.to_string());
        self.policies
            .entry(policy.to_string())
            .or_default()
            .entry(rule.to_string())
            .or_default()
            .insert(image.to_string(), status.to_string());
    }

    fn load(ctx: &Context) -> Metadata {
        let root = ctx.root();
        let v = root.get(METADATA_KEY);
        let data =
            v.and_then(|v| v.get("data")).and_then(|d| serde_json::from_value(d.clone()).ok()).unwrap_or_default();
        let policies =
            v.and_then(|v| v.get("policies")).and_then(|d| serde_json::from_value(d.clone()).ok()).unwrap_or_default();
        Metadata { data, policies }
    }

    fn save(&self, ctx: &mut Context) {
        // Permanent for this request: later policies add to it.
        let _kept: Saved = ctx.set(METADATA_KEY, json!({"data": self.data, "policies": self.policies}));
    }

    /// Writes both annotations into the object (Kyverno's annotation patches).
    fn annotate(&self, object: &mut Value) {
        let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else { return };
        let ann = meta.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
        if !ann.is_object() {
            *ann = Value::Object(Map::new());
        }
        if let Some(a) = ann.as_object_mut() {
            a.insert(ANNOTATION.into(), Value::String(json!(self.data).to_string()));
            if !self.policies.is_empty() {
                a.insert(
                    ANNOTATION_SCOPED.into(),
                    // Kyverno's struct writes `version` before `policies`.
                    Value::String(format!("{{\"version\":1,\"policies\":{}}}", json!(self.policies))),
                );
            }
        }
    }
}

/// Reads an image's status for one policy rule from an object's scoped annotation.
fn recorded_status(object: &Value, policy: &str, rule: &str, image: &str) -> Result<Option<String>, String> {
    let Some(raw) = object.pointer("/metadata/annotations").and_then(|a| a.get(ANNOTATION_SCOPED)) else {
        return Ok(None);
    };
    let text = raw.as_str().unwrap_or("");
    let parsed: Value =
        serde_json::from_str(text).map_err(|e| format!("failed to parse scoped image metadata: {e}"))?;
    if parsed.get("version").and_then(Value::as_i64) != Some(1) {
        return Ok(None);
    }
    Ok(parsed
        .get("policies")
        .and_then(|p| p.get(policy))
        .and_then(|r| r.get(rule))
        .and_then(|i| i.get(image))
        .and_then(Value::as_str)
        .map(str::to_string))
}

/// What one policy rule's verify step produced.
pub(crate) struct Verification {
    pub responses: Vec<RuleResponse>,
    pub patched: Option<Value>,
}

impl CompiledVerifyImages {
    /// Whether some entry selects one of the object's images (Kyverno runs the rule only then).
    fn matched(&self, images: &[Image]) -> Vec<Image> {
        images
            .iter()
            .filter(|i| {
                let n = i.name();
                self.entries.iter().any(|e| references_match(&e.spec.image_references, &n))
            })
            .cloned()
            .collect()
    }

    /// The verify phase of one rule on `object`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn verify(
        &self,
        rule: &str,
        policy: &CompiledPolicy,
        req: &Request,
        object: &Value,
        ctx: &mut Context,
        data: &dyn Data,
    ) -> Option<Verification> {
        if req.is_delete() {
            return None;
        }
        let rt = RuleType::ImageVerify;
        let images = match images_of(object, self.extractors.as_ref()) {
            Ok(i) => i,
            Err(e) => {
                return Some(Verification {
                    responses: vec![RuleResponse::new(
                        rule,
                        rt,
                        Status::Error,
                        format!("failed to extract images: {e}"),
                    )],
                    patched: None,
                });
            }
        };
        let matched = self.matched(&images);
        if matched.is_empty() {
            return None;
        }
        let namespace = crate::ports::str_at(object, "/metadata/namespace");
        let pkey = policy_key(policy);
        let mut meta = Metadata::load(ctx);
        let mut touched = false;
        let mut responses = Vec::new();
        let mut patched = object.clone();
        let mut changed = false;
        for entry in &self.entries {
            let spec = match entry.rendered(ctx) {
                Ok(s) => s,
                Err(e) => {
                    let message = format!("failed to substitute variables: {e}");
                    return Some(Verification {
                        responses: vec![RuleResponse::new(rule, rt, Status::Error, message)],
                        patched: None,
                    });
                }
            };
            let cancel = ctx.env().cancel_flag();
            let verifier = Verifier { entry, spec: &spec, rule, policy, namespace, data, cancel };
            for info in &matched {
                let mut info = info.clone();
                let mut image = info.name();
                if self.previously_verified(req, &pkey, rule, &info, &image) {
                    meta.add(&pkey, rule, &image, "pass");
                    touched = true;
                    continue;
                }
                let (mut resp, digest) = verifier.cached_or_verified(&self.cache_id, &info, &image, ctx);
                if spec.mutate_digest && info.digest.is_empty() {
                    let digest = verifier.pinned_digest(&info, digest);
                    match digest {
                        Err(e) => {
                            responses.push(RuleResponse::new(
                                rule,
                                rt,
                                Status::Error,
                                format!("failed to update digest: {}", e.message()),
                            ));
                        }
                        Ok(d) => {
                            if let Some(slot) = patched.pointer_mut(&info.pointer) {
                                *slot = Value::String(format!("{}@{d}", info.tagged()));
                                changed = true;
                            }
                            if resp.is_none() {
                                resp = Some(RuleResponse::new(rule, rt, Status::Pass, "mutated image digest"));
                            }
                            info.digest = d;
                            image = info.name();
                        }
                    }
                }
                if let Some(r) = resp {
                    if !spec.attestors.is_empty() || !spec.attestations.is_empty() {
                        meta.add(&pkey, rule, &image, status_word(r.status));
                        touched = true;
                    }
                    responses.push(r);
                }
            }
        }
        if touched {
            meta.save(ctx);
            meta.annotate(&mut patched);
            changed = true;
        }
        Some(Verification { responses, patched: changed.then_some(patched) })
    }

    /// Kyverno skips an image an UPDATE did not change when the old object records this
    /// rule's pass (or skip) for it.
    fn previously_verified(&self, req: &Request, pkey: &str, rule: &str, info: &Image, image: &str) -> bool {
        let Some(old) = req.old_object else { return false };
        if old.pointer(&info.pointer) != req.object.pointer(&info.pointer) {
            return false;
        }
        matches!(recorded_status(old, pkey, rule, image), Ok(Some(s)) if s == "pass" || s == "skip")
    }

    /// The validate phase of one rule on `object` (the resource after the verify phase).
    pub(crate) fn validate(
        &self,
        rule: &str,
        policy: &CompiledPolicy,
        req: &Request,
        object: &Value,
    ) -> Option<RuleResponse> {
        if req.is_delete() {
            return None;
        }
        let rt = RuleType::ImageVerify;
        let images = match images_of(object, self.extractors.as_ref()) {
            Ok(i) => i,
            Err(e) => {
                return Some(RuleResponse::new(rule, rt, Status::Error, format!("failed to extract images: {e}")));
            }
        };
        if self.matched(&images).is_empty() {
            return None;
        }
        let pkey = policy_key(policy);
        let mut skipped = Vec::new();
        let mut passed = 0usize;
        for entry in &self.entries {
            for info in &images {
                let image = info.name();
                if !references_match(&entry.spec.image_references, &image) {
                    continue;
                }
                if entry.spec.verify_digest && info.digest.is_empty() {
                    return Some(RuleResponse::new(rule, rt, Status::Fail, format!("missing digest for {image}")));
                }
                if entry.spec.required && !object.is_null() {
                    match recorded_status(object, &pkey, rule, &image) {
                        Err(e) => return Some(RuleResponse::new(rule, rt, Status::Fail, e)),
                        Ok(Some(s)) if s == "pass" => passed += 1,
                        Ok(Some(s)) if s == "skip" => skipped.push(image),
                        Ok(_) => {
                            return Some(RuleResponse::new(
                                rule,
                                rt,
                                Status::Fail,
                                format!("unverified image {image}"),
                            ));
                        }
                    }
                }
            }
        }
        if passed > 0 || skipped.is_empty() {
            if skipped.is_empty() {
                Some(RuleResponse::new(rule, rt, Status::Pass, "image verified"))
            } else {
                Some(RuleResponse::new(
                    rule,
                    rt,
                    Status::Pass,
                    format!("image verified, skipped images: {}", skipped.join(" ")),
                ))
            }
        } else {
            Some(RuleResponse::new(
                rule,
                rt,
                Status::Skip,
                format!("image skipped, skipped images: {}", skipped.join(" ")),
            ))
        }
    }
}

const UNAVAILABLE: &str = "image verification is not available here (no registry access)";

/// The policy's part of Kyverno's cache key `policyUID;resourceVersion;rule;image`. Policies
/// read from files have no uid: their key and a hash of the document stand in for uid and
/// resourceVersion, so an edited policy does not reuse the old one's passes.
pub(crate) fn cache_id(document: &Value, kind: crate::Kind, namespace: Option<&str>, name: &str) -> String {
    let meta = document.get("metadata");
    let s = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("");
    let uid = if s("uid").is_empty() {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        document.to_string().hash(&mut h);
        let key = match (kind, namespace) {
            (crate::Kind::Policy, Some(ns)) if !ns.is_empty() => format!("{ns}/{name}"),
            (crate::Kind::Policy, _) => format!("default/{name}"),
            _ => name.to_string(),
        };
        format!("{key}#{:016x}", h.finish())
    } else {
        s("uid").to_string()
    };
    format!("{uid};{}", s("resourceVersion"))
}

/// One verifyImages entry at work on one rule.
struct Verifier<'a> {
    entry: &'a Entry,
    spec: &'a ImageVerification,
    rule: &'a str,
    policy: &'a CompiledPolicy,
    namespace: &'a str,
    data: &'a dyn Data,
    cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Verifier<'_> {
    /// One image's verification, or a pass remembered for it. A pass is remembered with the
    /// digest it verified, and holds only for that manifest: an image named by digest must be
    /// that one; a tag is pinned to it (mutateDigest) or must still resolve to it, so a tag
    /// moved to an unsigned image is verified again rather than passed from the cache.
    fn cached_or_verified(
        &self,
        cache_id: &str,
        info: &Image,
        image: &str,
        ctx: &mut Context,
    ) -> (Option<RuleResponse>, String) {
        let (spec, rule) = (self.spec, self.rule);
        let key = format!("{cache_id};{rule};{image}");
        let port = self.data.image_verifier();
        let cacheable = spec.use_cache && port.is_some();
        let from_cache = match (cacheable, &port) {
            (true, Some(v)) => v.cached(&key).filter(|d| {
                if !info.digest.is_empty() {
                    *d == info.digest
                } else if spec.mutate_digest {
                    true
                } else {
                    v.digest(&info.tagged(), spec.image_registry_credentials.as_ref(), self.namespace)
                        .is_ok_and(|now| now == *d)
                }
            }),
            _ => None,
        };
        if let Some(d) = from_cache {
            return (Some(RuleResponse::new(rule, RuleType::ImageVerify, Status::Pass, "verified from cache")), d);
        }
        let (r, d) = self.image(info, ctx);
        if cacheable
            && !d.is_empty()
            && r.as_ref().is_some_and(|r| r.status == Status::Pass)
            && let Some(v) = &port
        {
            v.remember(&key, &d);
        }
        (r, d)
    }

    /// The digest to pin a tag to (`mutateDigest`): the one verified, else the registry's.
    fn pinned_digest(&self, info: &Image, verified: String) -> Result<String, ImageError> {
        if !verified.is_empty() {
            return Ok(verified);
        }
        match self.data.image_verifier() {
            Some(v) => v.digest(&info.tagged(), self.spec.image_registry_credentials.as_ref(), self.namespace),
            None => Err(ImageError::Unreachable(UNAVAILABLE.into())),
        }
    }

    fn resp(&self, status: Status, message: impl Into<String>) -> RuleResponse {
        RuleResponse::new(self.rule, RuleType::ImageVerify, status, message)
    }

    /// One leaf attestor on one image through the port (signatures, or the attestations of a
    /// statement type): the entry's repository and annotations, else the rule's.
    fn check(&self, image: &str, a: &Attestor, attestation: Option<&str>) -> Result<Verified, ImageError> {
        let spec = self.spec;
        let check = SignatureCheck {
            image,
            attestor: a,
            repository: if a.repository.is_empty() { &spec.repository } else { &a.repository },
            annotations: if a.annotations.is_empty() { &spec.annotations } else { &a.annotations },
            credentials: spec.image_registry_credentials.as_ref(),
            namespace: self.namespace,
            kind: if spec.kind.is_empty() { "Cosign" } else { &spec.kind },
            cosign_oci11: spec.cosign_oci11,
            attestation,
            cancel: self.cancel.as_deref(),
        };
        match self.data.image_verifier() {
            Some(v) => v.verify(&check),
            None => Err(ImageError::Unreachable(UNAVAILABLE.into())),
        }
    }

    /// Attestors, then attestations, for one image: the response (none when the entry has
    /// neither) and the digest the signatures vouch for.
    fn image(&self, info: &Image, ctx: &mut Context) -> (Option<RuleResponse>, String) {
        let spec = self.spec;
        if spec.attestors.is_empty() && spec.attestations.is_empty() {
            return (None, String::new());
        }
        let image = info.name();
        if !references_match(&spec.image_references, &image) || references_match(&spec.skip_image_references, &image) {
            return (
                Some(self.resp(
                    Status::Skip,
                    format!(
                        "skipping image reference image {image}, policy {} ruleName {}",
                        self.policy.name, self.rule
                    ),
                )),
                String::new(),
            );
        }
        let mut digest = String::new();
        let mut info = info.clone();
        if !spec.attestors.is_empty() {
            let mut last = None;
            for (i, set) in spec.attestors.iter().enumerate() {
                match self.set(set, &image, None, &format!(".attestors[{i}]"), 0) {
                    Ok(v) => last = Some(v),
                    Err(e) => {
                        let resp = match e {
                            ImageError::Unreachable(m) => {
                                self.resp(Status::Error, format!("failed to verify image {image}: {m}"))
                            }
                            ImageError::Failed(m) => {
                                self.resp(Status::Fail, format!("failed to verify image {image}: {m}"))
                            }
                        };
                        return (Some(resp), String::new());
                    }
                }
            }
            let Some(v) = last else {
                return (Some(self.resp(Status::Error, "invalid response: nil")), String::new());
            };
            if info.digest.is_empty() {
                info.digest = v.digest.clone();
            }
            if spec.attestations.is_empty() {
                return (Some(self.resp(Status::Pass, format!("verified image signatures for {image}"))), v.digest);
            }
        }
        self.attestations(&mut info, ctx, &mut digest)
    }

    /// Verifies an attestor set: at least its count of entries must verify; the first error of
    /// each failed entry is kept, and all are reported (joined by `; `) when too few verify.
    fn set(
        &self,
        set: &AttestorSet,
        image: &str,
        attestation: Option<&str>,
        path: &str,
        depth: usize,
    ) -> Result<Verified, ImageError> {
        let entries = expand_keys(set);
        let required = match set.count {
            Some(n) if n > 0 => n as usize,
            _ => entries.len(),
        };
        let mut verified = 0usize;
        let mut errors: Vec<String> = Vec::new();
        let mut unreachable = false;
        for (i, a) in entries.iter().enumerate() {
            let p = format!("{path}.entries[{i}]");
            let result = if let Some(raw) = &a.attestor {
                if depth >= MAX_NESTING {
                    Err(ImageError::Failed(format!("{p}.attestor: attestor sets nest too deep")))
                } else {
                    match nested_set(raw) {
                        Ok(nested) => self.set(&nested, image, attestation, &format!("{p}.attestor"), depth + 1),
                        Err(m) => Err(ImageError::Failed(format!("failed to unmarshal nested attestor {p}: {m}"))),
                    }
                }
            } else {
                let sub = a.path_suffix();
                self.check(image, a, attestation).map_err(|e| match e {
                    ImageError::Unreachable(m) => ImageError::Unreachable(format!("{p}{sub}: {m}")),
                    ImageError::Failed(m) => ImageError::Failed(format!("{p}{sub}: {m}")),
                })
            };
            match result {
                Ok(v) => {
                    verified += 1;
                    if verified >= required {
                        return Ok(v);
                    }
                }
                Err(e) => {
                    unreachable |= matches!(e, ImageError::Unreachable(_));
                    errors.push(e.message().to_string());
                }
            }
        }
        let msg = errors.join("; ");
        if unreachable { Err(ImageError::Unreachable(msg)) } else { Err(ImageError::Failed(msg)) }
    }

    /// The attestations of one image, after its signatures (if any) verified.
    fn attestations(&self, info: &mut Image, ctx: &mut Context, digest: &mut String) -> (Option<RuleResponse>, String) {
        let spec = self.spec;
        let mut image = info.name();
        for (i, attestation) in spec.attestations.iter().enumerate() {
            let path = format!(".attestations[{i}]");
            let kind = attestation.statement_type();
            if kind.is_empty() {
                return (Some(self.resp(Status::Fail, format!("{path}: missing type"))), String::new());
            }
            let sets: Vec<AttestorSet> = if attestation.attestors.is_empty() {
                // No attestors: fetch and decode the statements without checking a signer.
                vec![AttestorSet { count: None, entries: vec![Attestor::default()] }]
            } else {
                attestation.attestors.clone()
            };
            for (j, set) in sets.iter().enumerate() {
                let set_path = format!("{path}.attestors[{j}]");
                let required = set.required();
                let mut verified = 0usize;
                let mut errors: Vec<String> = Vec::new();
                for (k, a) in expand_keys(set).iter().enumerate() {
                    let entry_path = format!("{set_path}.entries[{k}]");
                    let fetched = match self.check(&image, a, Some(kind)) {
                        Ok(f) => f,
                        Err(ImageError::Unreachable(m)) => {
                            return (
                                Some(self.resp(Status::Error, format!("failed to verify image {image}: {m}"))),
                                String::new(),
                            );
                        }
                        Err(e) => {
                            errors.push(e.message().to_string());
                            continue;
                        }
                    };
                    // The first statement's predicate is the attestation's context variable.
                    if !attestation.name.is_empty() {
                        match fetched.statements.iter().find_map(|s| s.get("predicate").filter(|p| p.is_object())) {
                            Some(p) => {
                                let _kept: Saved = ctx.set(&attestation.name, p.clone());
                            }
                            None => {
                                errors.push("predicate not found in any statement".into());
                                continue;
                            }
                        }
                    }
                    if info.digest.is_empty() {
                        info.digest = fetched.digest.clone();
                        image = info.name();
                    }
                    match self.check_statements(
                        &fetched.statements,
                        attestation,
                        self.entry.conditions.get(i).map(Vec::as_slice).unwrap_or(&[]),
                        ctx,
                        &image,
                    ) {
                        Ok(()) => {
                            verified += 1;
                            if verified >= required {
                                break;
                            }
                        }
                        Err(e) => errors.push(format!("{entry_path}: {e}")),
                    }
                }
                if verified < required {
                    let err = if errors.is_empty() {
                        "attestations verification failed".to_string()
                    } else {
                        errors.join("; ")
                    };
                    return (
                        Some(self.resp(
                            Status::Fail,
                            format!(
                                "image attestations verification failed, verifiedCount: {verified}, requiredCount: {required}, error: {err}"
                            ),
                        )),
                        String::new(),
                    );
                }
            }
        }
        *digest = info.digest.clone();
        if let Some(deny) = &self.entry.deny {
            return (Some(self.deny(deny, ctx)), digest.clone());
        }
        (Some(self.resp(Status::Pass, format!("verified image attestations for {image}"))), digest.clone())
    }

    /// The entry's `validate.deny`, once the attestations are verified.
    fn deny(&self, deny: &CompiledConditions, ctx: &Context) -> RuleResponse {
        let spec = self.spec;
        match deny.evaluate(ctx) {
            Err(e) => self
                .resp(Status::Fail, format!("validation in verifyImages failed: failed to check deny conditions: {e}")),
            Ok((true, msg)) => {
                let written = spec.validate.as_ref().map(|v| v.message.as_str()).unwrap_or("");
                let joined: Vec<&str> = [written, msg.as_str()].into_iter().filter(|s| !s.is_empty()).collect();
                let text = if joined.is_empty() {
                    format!("validation error: imageVerify {written} failed")
                } else {
                    let t = joined.join("; ");
                    match crate::template::Template::compile(&t)
                        .map_err(|e| e.to_string())
                        .and_then(|tp| tp.render(ctx, "").map_err(|e| e.to_string()))
                    {
                        Ok(Value::String(s)) => s,
                        Ok(_) => {
                            "the produced message didn't resolve to a string, check your policy definition.".into()
                        }
                        Err(_) => msg,
                    }
                };
                self.resp(Status::Fail, format!("validation in verifyImages failed: {text}"))
            }
            Ok((false, _)) => {
                self.resp(Status::Pass, format!("verifyImages validation is passed in {} rule", self.rule))
            }
        }
    }

    /// Every statement of the wanted type must satisfy every condition block, evaluated with
    /// the statement's predicate fields at the root of the context.
    fn check_statements(
        &self,
        statements: &[Value],
        attestation: &Attestation,
        conditions: &[CompiledConditions],
        ctx: &mut Context,
        image: &str,
    ) -> Result<(), String> {
        let kind = attestation.statement_type();
        let wanted: Vec<&Value> =
            statements.iter().filter(|s| s.get("predicateType").and_then(Value::as_str) == Some(kind)).collect();
        if wanted.is_empty() {
            return Err(format!("attestions not found for predicate type {kind}"));
        }
        if conditions.is_empty() {
            return Ok(());
        }
        for s in wanted {
            let mut saved = Saved::default();
            if let Some(p) = s.get("predicate").and_then(Value::as_object) {
                for (k, v) in p {
                    saved.absorb(ctx.set(k, v.clone()));
                }
            }
            let mut outcome = Ok(());
            for c in conditions {
                match c.evaluate(ctx) {
                    Err(e) => {
                        outcome = Err(format!("failed to check attestations: {e}"));
                        break;
                    }
                    Ok((false, msg)) => {
                        outcome = Err(format!("attestation checks failed for {image} and predicate {kind}: {msg}"));
                        break;
                    }
                    Ok((true, _)) => {}
                }
            }
            ctx.restore(saved);
            outcome?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
