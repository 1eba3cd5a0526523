//! `policies.kyverno.io` ImageValidatingPolicy / NamespacedImageValidatingPolicy, compiled into
//! a [`CompiledPolicy`] with one CEL rule named after the policy (as Kyverno reports it). Before
//! the validations run, the rule works out the images (Pod containers by the request's kind,
//! plus the policy's `images` extractors), keeps those `matchImageReferences` select, checks
//! their digests (`verifyDigest`), and gives the expressions `images`, `attestors` and
//! `attestations`; `verifyImageSignatures`, `verifyAttestationSignatures`, `extractPayload` and
//! `getImageData` reach registries through the [`ImageVerifier`] port (an [`ImageHost`] wraps
//! the caller's CEL host for the evaluation). After the validations pass, `required` asks that
//! every selected image was verified by the policy.

use crate::cel_kind::{Shape, constraints, policy_name};
use crate::decode::{decode, json_of};
use crate::error::CompileError;
use crate::forms::CompiledValidation;
use crate::forms::{ImageCel, ImageRef};
use crate::matching::Matcher;
use crate::outcome::Status;
use crate::policy::{Action, CompiledPolicy, CompiledRule, RuleBody, compile_cel_preconditions};
use crate::validate::compile_cel;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use verno_api::images::RegistryCredentials;
use verno_api::{Kind, cel};

fn flag(v: Option<&Value>, key: &str) -> bool {
    v.and_then(|c| c.get(key)).and_then(Value::as_bool).unwrap_or(true)
}

impl CompiledPolicy {
    /// Whether this is an ImageValidatingPolicy that pins digests (`mutateDigest`, the default).
    pub fn pins_digests(&self) -> bool {
        self.rules.iter().any(|r| match &r.body {
            RuleBody::Validate(v) => match &v.check {
                crate::forms::Check::Cel(c) => c.image.as_ref().is_some_and(|i| i.mutate_digest),
                _ => false,
            },
            _ => false,
        })
    }
}

/// Compiles an ImageValidatingPolicy or NamespacedImageValidatingPolicy document.
pub fn compile_image_validating_policy(doc: &Value) -> Result<CompiledPolicy, CompileError> {
    let name = policy_name(doc)?.to_string();
    let kind = match Kind::of_document(doc) {
        Some(Kind::NamespacedImageValidatingPolicy) => Kind::NamespacedImageValidatingPolicy,
        _ => Kind::ImageValidatingPolicy,
    };
    let policy: cel::CelPolicy = decode(doc)?;
    let spec = &policy.spec;
    let actions = &spec.validation_actions;
    let action =
        if actions.is_empty() || actions.iter().any(|a| a == "Deny") { Action::Enforce } else { Action::Audit };
    let base = constraints(spec.match_constraints.as_ref());
    if base.rules.is_empty() {
        return Err(CompileError::new("spec.matchConstraints.resourceRules", "at least one resource rule is required"));
    }
    let mut refs = Vec::new();
    for (i, r) in spec.match_image_references.iter().enumerate() {
        let p = format!("spec.matchImageReferences[{i}]");
        match (r.get("glob").and_then(Value::as_str), r.get("expression").and_then(Value::as_str)) {
            (Some(g), None) => refs.push(ImageRef::Glob(g.to_string())),
            (None, Some(e)) => refs.push(ImageRef::Expr(
                verno_cel::Expr::compile(e).map_err(|err| CompileError::new(format!("{p}.expression"), err))?,
            )),
            _ => return Err(CompileError::new(p, "exactly one of glob or expression is required")),
        }
    }
    let mut extractors = Vec::new();
    for (i, e) in spec.images.iter().enumerate() {
        let p = format!("spec.images[{i}]");
        let n = e.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| CompileError::new(&p, "a name is required"))?;
        let src = e
            .expression
            .as_str()
            .ok_or_else(|| CompileError::new(format!("{p}.expression"), "an expression is required"))?;
        extractors
            .push((n, verno_cel::Expr::compile(src).map_err(|err| CompileError::new(format!("{p}.expression"), err))?));
    }
    let mut attestors = Map::new();
    for (i, a) in spec.attestors.iter().enumerate() {
        let p = format!("spec.attestors[{i}]");
        let n = a.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let n = n.ok_or_else(|| CompileError::new(format!("{p}.name"), "a name is required"))?;
        if a.get("cosign").is_none() == a.get("notary").is_none() {
            return Err(CompileError::new(&p, "exactly one of cosign or notary is required"));
        }
        attestors.insert(n.to_string(), a.clone());
    }
    let mut attestations = BTreeMap::new();
    for (i, a) in spec.attestations.iter().enumerate() {
        let p = format!("spec.attestations[{i}]");
        let n = a.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let n = n.ok_or_else(|| CompileError::new(format!("{p}.name"), "a name is required"))?;
        if a.get("intoto").is_none() == a.get("referrer").is_none() {
            return Err(CompileError::new(&p, "exactly one of intoto or referrer is required"));
        }
        attestations.insert(n.to_string(), a.clone());
    }
    let credentials = match &spec.credentials {
        Some(c) => Some(
            serde_json::from_value::<RegistryCredentials>(c.clone())
                .map_err(|e| CompileError::new("spec.credentials", e.to_string()))?,
        ),
        None => None,
    };
    let vc = spec.validation_configurations.as_ref();
    let image = Arc::new(ImageCel {
        extractors,
        refs,
        verify_digest: flag(vc, "verifyDigest"),
        mutate_digest: flag(vc, "mutateDigest"),
        required: flag(vc, "required"),
        attestors,
        attestations,
        credentials,
    });
    let cel = json!({"variables": json_of(&spec.variables), "expressions": json_of(&spec.validations)});
    let conditions: Vec<Value> = spec.match_conditions.iter().map(json_of).collect();
    let mut check = compile_cel(&cel, "spec")?;
    if let crate::forms::Check::Cel(c) = &mut check {
        c.on_error = Status::Error;
        c.image = Some(image);
    }
    let rule = CompiledRule {
        name: name.clone(),
        autogen_of: None,
        matcher: Matcher::constraints(base),
        exclude: None,
        context: Vec::new(),
        preconditions: None,
        cel_preconditions: compile_cel_preconditions(&conditions, "spec.matchConditions")?,
        report_properties: Vec::new(),
        body: RuleBody::Validate(Box::new(CompiledValidation {
            message: None,
            failure_action: Some(action),
            overrides: Vec::new(),
            allow_existing_violations: true,
            numbered_elements: false,
            check,
        })),
    };
    let background =
        spec.evaluation.as_ref().and_then(|e| e.background.as_ref()).and_then(|b| b.enabled).unwrap_or(true);
    crate::cel_kind::cel_policy(
        doc,
        kind,
        Shape { action, emit_warning: actions.iter().any(|a| a == "Warn"), background },
        vec![rule],
    )
}
