//! `validate.manifests`: Kubernetes manifests signed with sigstore's k8s-manifest format. The
//! signed YAML travels gzipped and base64-encoded in the `cosign.sigstore.dev/message`
//! annotation, with one signature per signer (`…/signature`, `…/signature_1`, …, and optional
//! `…/certificate_N`). A resource verifies when its message holds a manifest that matches it (the
//! same fields and values, apart from the ignored ones Kubernetes and controllers add) and the
//! message is signed by the attestors (set counts and nesting as in verifyImages). Signatures
//! are checked through the [`ImageVerifier`](crate::ports::ImageVerifier) port.

use crate::error::CompileError;
use crate::ports::Data;
use crate::ports::ImageError;
use base64::Engine as _;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::Read as _;
use verno_api::images::{Attestor, AttestorSet};

/// The largest signed message accepted once decompressed (a manifest bundle, not a bomb).
const MAX_MESSAGE: u64 = 4 << 20;
/// Nested attestor sets deeper than this are refused.
const MAX_NESTING: usize = 8;
const DEFAULT_DOMAIN: &str = "cosign.sigstore.dev";

/// Fields Kubernetes, controllers or Kyverno set on admitted objects, per kind (`*`: all), that
/// a signed manifest need not carry: k8s-manifest-sigstore's defaults and Kyverno's.
const DEFAULT_IGNORED: &[(&str, &[&str])] = &[
    (
        "*",
        &[
            "metadata.namespace",
            "spec.containers.*.imagePullPolicy",
            "spec.containers.*.terminationMessagePath",
            "spec.containers.*.terminationMessagePolicy",
            "spec.dnsPolicy",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.terminationGracePeriodSeconds",
            "metadata.labels.app.kubernetes.io/instance",
            "metadata.managedFields.*",
            "metadata.resourceVersion",
            "metadata.selfLink",
            "metadata.annotations.control-plane.alpha.kubernetes.io/leader",
            "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration",
            "metadata.finalizers*",
            "metadata.annotations.namespace",
            "metadata.annotations.deprecated.daemonset.template.generation",
            "metadata.creationTimestamp",
            "metadata.uid",
            "metadata.generation",
            "status",
            "metadata.annotations.deployment.kubernetes.io/revision",
        ],
    ),
    (
        "Pod",
        &[
            "spec.volumes.*.name",
            "spec.volumes.*.projected.*",
            "spec.volumes.*.configMap.defaultMode",
            "spec.containers.*.volumeMounts.*",
            "spec.tolerations.*",
            "spec.enableServiceLinks",
            "spec.preemptionPolicy",
            "spec.priority",
            "spec.serviceAccount",
        ],
    ),
    (
        "Deployment",
        &[
            "spec.progressDeadlineSeconds",
            "spec.revisionHistoryLimit",
            "spec.strategy.*",
            "spec.template.metadata.creationTimestamp",
            "spec.containers.*.ports.*.protocol",
            "spec.containers.*.resources",
            "spec.securityContext",
        ],
    ),
    ("CustomResourceDefinition", &["spec.conversion.strategy", "spec.names.listKind"]),
    (
        "Service",
        &[
            "spec.ports.*.nodePort",
            "spec.clusterIP",
            "spec.clusterIPs.0",
            "spec.sessionAffinity",
            "spec.type",
            "spec.ipFamilies.*",
            "spec.ipFamilyPolicy",
            "spec.internalTrafficPolicy",
        ],
    ),
    (
        "ClusterPolicy",
        &[
            "metadata.annotations.pod-policies.kyverno.io/autogen-controllers",
            "spec.failurePolicy",
            "spec.background",
            "spec.validationFailureAction",
        ],
    ),
    (
        "Policy",
        &[
            "metadata.annotations.pod-policies.kyverno.io/autogen-controllers",
            "spec.failurePolicy",
            "spec.background",
            "spec.validationFailureAction",
        ],
    ),
    ("ServiceAccount", &["secrets.*.name", "imagePullSecrets.*.name"]),
];

/// One ignore rule: field patterns for objects of some kinds (empty: all).
#[derive(Debug, Clone)]
struct Ignore {
    kinds: Vec<String>,
    /// Patterns as k8s-manifest-sigstore matches them: `*` any run of characters, the rest a
    /// regular expression searched anywhere in the flattened key.
    fields: Vec<regex::Regex>,
}

/// A compiled `validate.manifests`.
#[derive(Debug, Clone)]
pub struct CompiledManifests {
    attestors: Vec<AttestorSet>,
    domain: String,
    ignore: Vec<Ignore>,
}

fn pattern(field: &str, path: &str) -> Result<regex::Regex, CompileError> {
    // k8s-manifest-sigstore appends `*` to every ignored field and turns `*` into `.*`.
    let re = format!("{field}*").replace('*', ".*");
    regex::RegexBuilder::new(&re)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| CompileError::new(path, format!("invalid field pattern {field:?}: {e}")))
}

pub(crate) fn compile(v: &Value, path: &str) -> Result<CompiledManifests, CompileError> {
    let attestors: Vec<AttestorSet> = match v.get("attestors") {
        Some(a) => serde_json::from_value(a.clone())
            .map_err(|e| CompileError::new(format!("{path}.attestors"), e.to_string()))?,
        None => Vec::new(),
    };
    if let Some(r) = v.get("repository").and_then(Value::as_str).filter(|r| !r.is_empty()) {
        return Err(CompileError::new(
            format!("{path}.repository"),
            format!("manifests kept in an OCI image ({r}) are not supported by this build of verno"),
        ));
    }
    let domain = v.get("annotationDomain").and_then(Value::as_str).filter(|d| !d.is_empty()).unwrap_or(DEFAULT_DOMAIN);
    let mut ignore = Vec::new();
    for (kind, fields) in DEFAULT_IGNORED {
        ignore.push(Ignore {
            kinds: if *kind == "*" { Vec::new() } else { vec![kind.to_string()] },
            fields: fields.iter().map(|f| pattern(f, path)).collect::<Result<_, _>>()?,
        });
    }
    // The signature annotations themselves.
    ignore.push(Ignore {
        kinds: Vec::new(),
        fields: ["message", "signature", "certificate", "bundle", "resourceBundleRef"]
            .iter()
            .map(|b| pattern(&format!("metadata.annotations.{domain}/{b}"), path))
            .collect::<Result<_, _>>()?,
    });
    for (i, b) in v.get("ignoreFields").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let p = format!("{path}.ignoreFields[{i}]");
        let kinds: Vec<String> = b
            .get("objects")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("kind").and_then(Value::as_str))
            .filter(|k| *k != "*")
            .map(str::to_string)
            .collect();
        let fields = b
            .get("fields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|f| pattern(f, &p))
            .collect::<Result<_, _>>()?;
        ignore.push(Ignore { kinds, fields });
    }
    Ok(CompiledManifests { attestors, domain: domain.to_string(), ignore })
}

/// Leaves of a JSON value as `a.b.0.c` → value (k8s-manifest-sigstore's flattening).
fn ravel(v: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
    let key = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                ravel(x, &key(k), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                ravel(x, &key(&i.to_string()), out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// A zero value and a missing one are the same to the diff.
fn is_default(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Bool(b)) => !b,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// `docker.io/` and `:latest` are how an image is canonicalized, not a change.
fn same_image(a: &Value, b: &Value) -> bool {
    let norm = |v: &Value| {
        v.as_str().map(|s| {
            let s = s.strip_prefix("docker.io/").unwrap_or(s);
            s.strip_suffix(":latest").unwrap_or(s).to_string()
        })
    };
    matches!((norm(a), norm(b)), (Some(x), Some(y)) if x == y)
}

impl CompiledManifests {
    /// The differences between a signed manifest and the object, ignored fields left out.
    fn diff(&self, manifest: &Value, object: &Value) -> Vec<(String, Value, Value)> {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let mut a = BTreeMap::new();
        let mut b = BTreeMap::new();
        ravel(manifest, "", &mut a);
        ravel(object, "", &mut b);
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let mut out = Vec::new();
        for k in keys {
            let (x, y) = (a.get(k), b.get(k));
            if x == y || (is_default(x) && is_default(y)) {
                continue;
            }
            if let (Some(x), Some(y)) = (x, y)
                && same_image(x, y)
            {
                continue;
            }
            let ignored = self
                .ignore
                .iter()
                .filter(|i| i.kinds.is_empty() || i.kinds.iter().any(|k| k == kind))
                .any(|i| i.fields.iter().any(|f| f.is_match(k)));
            if !ignored {
                out.push((k.clone(), x.cloned().unwrap_or(Value::Null), y.cloned().unwrap_or(Value::Null)));
            }
        }
        out
    }

    /// Verifies `object`'s signed-manifest annotations: `Ok((verified, reason))`, or an error
    /// for a policy or signature that cannot be checked.
    pub(crate) fn verify(&self, object: &Value, data: &dyn Data) -> Result<(bool, String), String> {
        let mut verified = Vec::new();
        for (i, set) in self.attestors.iter().enumerate() {
            let (ok, reason) = self.set(object, set, &format!(".attestors[{i}]"), data, 0)?;
            if !ok {
                return Ok((false, reason));
            }
            verified.push(reason);
        }
        Ok((true, format!("verified manifest signatures; {}", verified.join(","))))
    }

    fn set(
        &self,
        object: &Value,
        set: &AttestorSet,
        path: &str,
        data: &dyn Data,
        depth: usize,
    ) -> Result<(bool, String), String> {
        let entries = crate::attestors::expand_keys(set);
        let required = match set.count {
            Some(n) if n > 0 => n as usize,
            _ => entries.len(),
        };
        let (mut count, mut ok_msgs, mut fail_msgs, mut errors) = (0usize, Vec::new(), Vec::new(), Vec::new());
        for (i, a) in entries.iter().enumerate() {
            let p = format!("{path}.entries[{i}]");
            let r = if let Some(raw) = &a.attestor {
                if depth >= MAX_NESTING {
                    Err(format!("{p}.attestor: attestor sets nest too deep"))
                } else {
                    match serde_json::from_value::<AttestorSet>(raw.clone()) {
                        Ok(nested) => self.set(object, &nested, &format!("{p}.attestor"), data, depth + 1),
                        Err(e) => Err(format!("failed to unmarshal nested attestor {p}: {e}")),
                    }
                }
            } else {
                self.entry(object, a, &p, data)
            };
            match r {
                Ok((true, m)) => {
                    count += 1;
                    ok_msgs.push(m);
                }
                Ok((false, m)) => fail_msgs.push(m),
                Err(e) => errors.push(e),
            }
            if count >= required {
                return Ok((
                    true,
                    format!(
                        "manifest verification succeeded; verifiedCount {count}; requiredCount {required}; message {}",
                        ok_msgs.join(",")
                    ),
                ));
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        Ok((
            false,
            format!(
                "manifest verification failed; verifiedCount {count}; requiredCount {required}; message {}",
                fail_msgs.join(",")
            ),
        ))
    }

    /// One leaf attestor against the object.
    fn entry(&self, object: &Value, a: &Attestor, path: &str, data: &dyn Data) -> Result<(bool, String), String> {
        let ann: Map<String, Value> =
            object.pointer("/metadata/annotations").and_then(Value::as_object).cloned().unwrap_or_default();
        let get = |k: &str| ann.get(k).and_then(Value::as_str).unwrap_or("");
        for (k, want) in &a.annotations {
            if get(k) != want {
                return Err(format!(
                    "annotations mismatch: {} does not match expected value {want} for key {k}",
                    get(k)
                ));
            }
        }
        let p = format!("{path}{}", a.path_suffix());
        let d = &self.domain;
        let message = get(&format!("{d}/message"));
        if message.is_empty() {
            return Ok((
                false,
                format!(
                    "{p}: YAML manifest not found for this resource: message not found in the annotation {d}/message"
                ),
            ));
        }
        let raw = decode_message(message).map_err(|e| format!("{p}: {e}"))?;
        let text = yamls_in(&raw).map_err(|e| format!("{p}: {e}"))?;
        let docs = verno_jmespath::yaml::parse_all(&text)
            .map_err(|e| format!("{p}: failed to read YAMLs in the gzipped message: {e}"))?;
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let candidates: Vec<&Value> = docs
            .iter()
            .filter(|m| {
                m.get("kind").and_then(Value::as_str) == Some(kind)
                    && m.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
            })
            .collect();
        if candidates.is_empty() {
            return Ok((
                false,
                format!(
                    "{p}: YAML manifest not found for this resource: failed to find a YAML manifest in the gzipped message"
                ),
            ));
        }
        let mut first_diff = None;
        let matched = candidates.iter().any(|m| {
            let d = self.diff(m, object);
            let ok = d.is_empty();
            if first_diff.is_none() {
                first_diff = Some(d);
            }
            ok
        });
        // Signatures: `signature`, `signature_1`, … with their certificates.
        let verifier = data.image_verifier();
        let mut signer = None;
        let mut last_err = String::from("signature not found");
        for i in 0..64 {
            let suffix = if i == 0 { String::new() } else { format!("_{i}") };
            let sig = get(&format!("{d}/signature{suffix}"));
            if sig.is_empty() {
                break;
            }
            let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(sig.trim()) else {
                last_err = "the signature is not base64".into();
                continue;
            };
            let cert = match get(&format!("{d}/certificate{suffix}")) {
                "" => None,
                c => Some(String::from_utf8(decode_message(c).map_err(|e| format!("{p}: {e}"))?).unwrap_or_default()),
            };
            let Some(v) = verifier.as_ref() else {
                return Err(format!("{p}: signature verification is not available here"));
            };
            match v.verify_blob(a, &raw, &sig, cert.as_deref()) {
                Ok(s) => {
                    signer = Some(s);
                    break;
                }
                Err(ImageError::Failed(e)) => last_err = e,
                Err(ImageError::Unreachable(e)) => return Err(format!("{p}: {e}")),
            }
        }
        match (matched, signer) {
            (true, Some(s)) => Ok((true, format!("singed by a valid signer: {s}"))),
            (false, _) => {
                let diff: Vec<Value> = first_diff
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, x, y)| serde_json::json!({"key": k, "values": {"before": x, "after": y}}))
                    .collect();
                Ok((
                    false,
                    format!("{p}: failed to verify signature. diff found; {}", serde_json::json!({"items": diff})),
                ))
            }
            (true, None) => Ok((false, format!("{p}: failed to verify signature: {last_err}"))),
        }
    }
}

/// The YAML a signed message carries: the message itself, or (the older, tarball format) the
/// files of a gzipped tar, joined as one multi-document YAML.
fn yamls_in(raw: &[u8]) -> Result<String, String> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return String::from_utf8(raw.to_vec()).map_err(|_| "the signed message is not text".to_string());
    }
    let tar = gunzip(raw)?;
    let mut docs = Vec::new();
    let mut at = 0usize;
    while let Some(header) = tar.get(at..at + 512) {
        if header.iter().all(|b| *b == 0) {
            break;
        }
        let size_field = header.get(124..136).unwrap_or(&[]);
        let size_text: String = size_field.iter().take_while(|b| **b != 0 && **b != b' ').map(|b| *b as char).collect();
        let size = usize::from_str_radix(size_text.trim(), 8)
            .map_err(|_| "failed to read YAMLs in the gzipped message: bad tar header".to_string())?;
        let kind = header.get(156).copied().unwrap_or(0);
        let body =
            tar.get(at + 512..at + 512 + size).ok_or("failed to read YAMLs in the gzipped message: truncated tar")?;
        if kind == b'0' || kind == 0 {
            docs.push(String::from_utf8_lossy(body).into_owned());
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    Ok(docs.join("\n---\n"))
}

/// base64, then gzip (bounded).
fn decode_message(b64: &str) -> Result<Vec<u8>, String> {
    let gz = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("failed to decode base64 message in the annotation: {e}"))?;
    gunzip(&gz)
}

/// gzip, bounded.
fn gunzip(gz: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .take(MAX_MESSAGE + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("failed to decompress the message: {e}"))?;
    if out.len() as u64 > MAX_MESSAGE {
        return Err(format!("the signed message is over {} MiB", MAX_MESSAGE >> 20));
    }
    Ok(out)
}
