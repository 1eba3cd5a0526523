//! Sigstore's public-good instance, as cosign (and so Kyverno) trusts it by default: Rekor's
//! keys for transparency log entries, Fulcio's certificate chains for keyless certificates and
//! the certificate transparency logs' keys. Cosign reads them from Sigstore's TUF repository;
//! Verno carries the trusted root that repository serves (`sigstore_trusted_root.json`, as
//! published at tuf-repo-cdn.sigstore.dev and shipped in sigstore-python 4.5.1, Apache-2.0), so
//! a policy written for Kyverno's defaults — `keys.publicKeys` with no `rekor` settings — is
//! checked the same way without a network fetch. Keys and chains that expired stay: an entry
//! is judged at its own time.

use crate::crypto::{Certificate, PublicKey};
use base64::Engine as _;
use serde_json::Value;
use std::sync::OnceLock;

/// The public-good Rekor's address (a `rekor.url` naming it keeps the defaults).
pub const REKOR_URL: &str = "https://rekor.sigstore.dev";

const TRUSTED_ROOT: &str = include_str!("sigstore_trusted_root.json");

/// A transparency log's key with its log id (SHA-256 of the key's DER), which SCTs name.
pub struct LogKey {
    pub id: Vec<u8>,
    pub key: PublicKey,
}

struct Root {
    rekor: Vec<PublicKey>,
    fulcio: Vec<Certificate>,
    ct: Vec<LogKey>,
}

fn root() -> &'static Root {
    static ROOT: OnceLock<Root> = OnceLock::new();
    ROOT.get_or_init(|| {
        let doc: Value = serde_json::from_str(TRUSTED_ROOT).unwrap_or(Value::Null);
        let bytes = |v: &Value| {
            v.as_str().and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok()).unwrap_or_default()
        };
        let keys = |list: &str| -> Vec<(Vec<u8>, PublicKey)> {
            doc.get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|l| {
                    let der = bytes(l.pointer("/publicKey/rawBytes")?);
                    let id = bytes(l.pointer("/logId/keyId")?);
                    PublicKey::from_spki_der(&der).ok().map(|k| (id, k))
                })
                .collect()
        };
        let fulcio = doc
            .get("certificateAuthorities")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|ca| ca.pointer("/certChain/certificates").and_then(Value::as_array).into_iter().flatten())
            .filter_map(|c| Certificate::from_der(bytes(c.get("rawBytes")?)).ok())
            .collect();
        Root {
            rekor: keys("tlogs").into_iter().map(|(_, k)| k).collect(),
            fulcio,
            ct: keys("ctlogs").into_iter().map(|(id, key)| LogKey { id, key }).collect(),
        }
    })
}

/// Rekor's keys (the entries' signed timestamps are checked with them).
pub fn rekor_keys() -> &'static [PublicKey] {
    &root().rekor
}

/// Fulcio's roots and intermediates (keyless certificates chain up to them).
pub fn fulcio_chain() -> &'static [Certificate] {
    &root().fulcio
}

/// The certificate transparency logs' keys (Fulcio's certificates carry their SCTs).
pub fn ct_log_keys() -> &'static [LogKey] {
    &root().ct
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

    use super::*;

    #[test]
    fn the_trusted_root_gives_rekor_fulcio_and_ct_keys() {
        // Rekor v1 (ECDSA P-256) and the 2025 shard (Ed25519).
        assert_eq!(rekor_keys().len(), 2);
        assert!(matches!(rekor_keys()[0], PublicKey::P256(_)));
        // Fulcio's 2021 root, and its 2022 root with the intermediate.
        assert_eq!(fulcio_chain().len(), 3);
        assert_eq!(ct_log_keys().len(), 2);
        assert!(ct_log_keys().iter().all(|k| k.id.len() == 32));
    }
}
