//! `verifyImages` rules of ClusterPolicy / Policy (kyverno.io/v1 `ImageVerification`): which
//! images, who must have signed them, which attestations they must carry, and what to do with
//! the digest. A rule's `verifyImages` stays raw JSON in [`crate::Rule`]; the engine decodes it
//! with these types when it compiles the rule, so a bad field is reported with its path.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

fn yes() -> bool {
    true
}

/// One entry of a rule's `verifyImages`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageVerification {
    /// `Cosign` (the default), `SigstoreBundle` or `Notary`.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default)]
    pub image_references: Vec<String>,
    #[serde(default)]
    pub skip_image_references: Vec<String>,
    #[serde(default)]
    pub attestors: Vec<AttestorSet>,
    #[serde(default)]
    pub attestations: Vec<Attestation>,
    /// Where signatures are kept when not next to the image.
    #[serde(default)]
    pub repository: String,
    #[serde(default = "yes")]
    pub mutate_digest: bool,
    #[serde(default = "yes")]
    pub verify_digest: bool,
    #[serde(default = "yes")]
    pub required: bool,
    #[serde(default = "yes")]
    pub use_cache: bool,
    #[serde(default, rename = "cosignOCI11")]
    pub cosign_oci11: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_registry_credentials: Option<RegistryCredentials>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate: Option<ImageValidation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_action: Option<String>,
    // The deprecated single-attestor form, turned into one attestor set (Kyverno's `Convert`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub roots: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub issuer: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_extensions: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageVerification {
    /// The deprecated fields (`image`, `key`, `roots`, `subject`, `issuer`, ...) folded into
    /// `imageReferences` and one attestor set, as Kyverno's `Convert` does.
    pub fn converted(&self) -> ImageVerification {
        let mut out = self.clone();
        if !self.image.is_empty() && out.image_references.is_empty() {
            out.image_references = vec![self.image.clone()];
        }
        let entry = if !self.key.is_empty() {
            Some(Attestor {
                keys: Some(StaticKeys { public_keys: self.key.clone(), ..Default::default() }),
                ..Default::default()
            })
        } else if !self.roots.is_empty() || !self.subject.is_empty() || !self.issuer.is_empty() {
            Some(Attestor {
                keyless: Some(Keyless {
                    roots: self.roots.clone(),
                    subject: self.subject.clone(),
                    issuer: self.issuer.clone(),
                    additional_extensions: self.additional_extensions.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        } else {
            None
        };
        if let Some(mut e) = entry {
            if !self.annotations.is_empty() {
                e.annotations = self.annotations.clone();
            }
            out.attestors = vec![AttestorSet { count: None, entries: vec![e] }];
        }
        out
    }
}

/// `validate` in a verifyImages entry: deny conditions checked after the attestations.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageValidation {
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Value>,
}

/// Registry access: `allowInsecureRegistry` (plain HTTP and unverified TLS), credential
/// `providers` and docker config `secrets` (`name` or `namespace/name`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryCredentials {
    #[serde(default)]
    pub allow_insecure_registry: bool,
    #[serde(default)]
    pub providers: Vec<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
}

/// `attestors[]`: at least `count` of the entries must verify (all when unset or 0).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestorSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    #[serde(default)]
    pub entries: Vec<Attestor>,
}

impl AttestorSet {
    /// How many entries must verify.
    pub fn required(&self) -> usize {
        match self.count {
            Some(n) if n > 0 => n as usize,
            _ => self.entries.len(),
        }
    }
}

/// One attestor: exactly one of `keys`, `certificates`, `keyless` or a nested `attestor` set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attestor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<StaticKeys>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<Certificates>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<Keyless>,
    /// A nested attestor set, as raw JSON (Kyverno keeps it raw too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestor: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repository: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature_algorithm: String,
}

impl Attestor {
    /// The part of an error path that names the attestor's type (`.keys`, `.certificates`,
    /// `.keyless`; nothing for a nested set), as Kyverno's messages have it.
    pub fn path_suffix(&self) -> &'static str {
        if self.keys.is_some() {
            ".keys"
        } else if self.certificates.is_some() {
            ".certificates"
        } else if self.keyless.is_some() {
            ".keyless"
        } else {
            ""
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticKeys {
    /// One or more PEM public keys.
    #[serde(default)]
    pub public_keys: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature_algorithm: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kms: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekor: Option<Rekor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctlog: Option<CtLog>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretRef {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Certificates {
    #[serde(default, rename = "cert")]
    pub certificate: String,
    #[serde(default, rename = "certChain")]
    pub certificate_chain: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekor: Option<Rekor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctlog: Option<CtLog>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Keyless {
    #[serde(default)]
    pub subject: String,
    #[serde(default, rename = "subjectRegExp")]
    pub subject_regexp: String,
    #[serde(default)]
    pub issuer: String,
    #[serde(default, rename = "issuerRegExp")]
    pub issuer_regexp: String,
    #[serde(default)]
    pub roots: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_extensions: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekor: Option<Rekor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctlog: Option<CtLog>,
}

/// The transparency log: missing means Rekor's public instance, required.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rekor {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub pubkey: String,
    #[serde(default)]
    pub ignore_tlog: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CtLog {
    #[serde(default, rename = "ignoreSCT")]
    pub ignore_sct: bool,
    #[serde(default)]
    pub pubkey: String,
    #[serde(default, rename = "tsaCertChain")]
    pub tsa_cert_chain: String,
}

/// `attestations[]`: in-toto statements of a type, signed by the attestors, whose predicates
/// satisfy the conditions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attestation {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Deprecated spelling of `type`.
    #[serde(default)]
    pub predicate_type: String,
    #[serde(default)]
    pub attestors: Vec<AttestorSet>,
    /// AnyAllConditions blocks, all of which must hold.
    #[serde(default)]
    pub conditions: Vec<Value>,
}

impl Attestation {
    /// `type`, or the deprecated `predicateType`.
    pub fn statement_type(&self) -> &str {
        if self.kind.is_empty() { &self.predicate_type } else { &self.kind }
    }
}
