//! Certificate transparency for keyless certificates: a Fulcio certificate carries the signed
//! certificate timestamps (SCTs) of the logs it was submitted to, each a log's signature over
//! the certificate as it was before the SCTs were added (RFC 6962 §3.2, a "precertificate"
//! entry). Cosign — and so Kyverno — requires one that a known log signed; this checks it.
//!
//! Written here: no crate checks embedded SCTs against a TBS certificate with the SCT list
//! taken out (the `sct` crate checks X.509 entries only), and taking it out needs only the
//! DER walk below.

use crate::crypto::{Certificate, CryptoError, PublicKey};
use sha2::Digest as _;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The SCT list extension's OID, 1.3.6.1.4.1.11129.2.4.2, as DER.
const SCT_OID: &[u8] = &[0x06, 0x0a, 0x2b, 0x06, 0x01, 0x04, 0x01, 0xd6, 0x79, 0x02, 0x04, 0x02];

/// Why no SCT of a certificate could be accepted.
#[derive(Debug, thiserror::Error)]
pub enum SctError {
    #[error("the certificate has no embedded SCT")]
    None,
    #[error("the certificate's issuer is not in its chain")]
    NoIssuer,
    #[error("the certificate could not be read: {0}")]
    Certificate(#[source] CryptoError),
    #[error("the certificate's DER could not be walked to take its SCT list out")]
    Der,
    #[error("no SCT of the certificate is signed by a known certificate transparency log")]
    Unverified,
}

/// One DER element of `buf`: (header length, content length).
fn element(buf: &[u8]) -> Option<(usize, usize)> {
    let first = *buf.get(1)?;
    if first < 0x80 {
        return Some((2, usize::from(first)));
    }
    let n = usize::from(first & 0x7f);
    if n == 0 || n > 3 {
        return None;
    }
    let mut len = 0usize;
    for b in buf.get(2..2 + n)? {
        len = (len << 8) | usize::from(*b);
    }
    Some((2 + n, len))
}

/// The elements of a constructed element's content, each whole (header and content).
fn children(content: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = content;
    while !rest.is_empty() {
        let (h, l) = element(rest)?;
        let (whole, tail) = (rest.get(..h + l)?, rest.get(h + l..)?);
        out.push(whole);
        rest = tail;
    }
    Some(out)
}

/// A DER element of tag `tag` around `content`.
fn encode(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The TBS certificate of `cert_der` with the SCT list extension taken out (what the log
/// signed).
fn precert_tbs(cert_der: &[u8]) -> Option<Vec<u8>> {
    let (h, l) = element(cert_der)?;
    let cert = children(cert_der.get(h..h + l)?)?;
    let tbs = cert.first()?;
    let (h, l) = element(tbs)?;
    let fields = children(tbs.get(h..h + l)?)?;
    let mut out = Vec::new();
    for f in fields {
        if f.first() != Some(&0xa3) {
            out.extend_from_slice(f);
            continue;
        }
        // [3] { SEQUENCE OF Extension }
        let (h, l) = element(f)?;
        let seq = f.get(h..h + l)?;
        let (sh, sl) = element(seq)?;
        let kept: Vec<u8> = children(seq.get(sh..sh + sl)?)?
            .into_iter()
            .filter(|ext| {
                element(ext).and_then(|(eh, _)| ext.get(eh..eh + SCT_OID.len())).is_none_or(|oid| oid != SCT_OID)
            })
            .flatten()
            .copied()
            .collect();
        out.extend(encode(0xa3, &encode(0x30, &kept)));
    }
    Some(encode(0x30, &out))
}

/// Checks that `leaf` carries an SCT one of `logs` (id: SHA-256 of the log's key, key) signed,
/// over the certificate before its SCTs, with the issuer found among `chain`.
pub fn verify_embedded(
    leaf: &Certificate,
    chain: &[Certificate],
    logs: &[(Vec<u8>, PublicKey)],
) -> Result<(), SctError> {
    let (_, cert) =
        X509Certificate::from_der(&leaf.der).map_err(|e| SctError::Certificate(CryptoError::CertificateDer(e)))?;
    let scts = cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SCT(list) => Some(list.clone()),
            _ => None,
        })
        .ok_or(SctError::None)?;
    let issuer = chain
        .iter()
        .find_map(|c| {
            let (_, p) = X509Certificate::from_der(&c.der).ok()?;
            (p.subject().as_raw() == cert.issuer().as_raw()).then(|| sha2::Sha256::digest(p.public_key().raw).to_vec())
        })
        .ok_or(SctError::NoIssuer)?;
    let tbs = precert_tbs(&leaf.der).ok_or(SctError::Der)?;
    let tbs_len = u32::try_from(tbs.len()).map_err(|_| SctError::Der)?.to_be_bytes();
    for sct in &scts {
        let Some((_, key)) = logs.iter().find(|(id, _)| id.as_slice() == sct.id.key_id.as_slice()) else { continue };
        let mut msg = vec![0u8, 0u8];
        msg.extend(sct.timestamp.to_be_bytes());
        msg.extend([0u8, 1u8]); // precert_entry
        msg.extend(&issuer);
        msg.extend(tbs_len.get(1..).unwrap_or(&[]));
        msg.extend(&tbs);
        let ext = sct.extensions.0;
        msg.extend(u16::try_from(ext.len()).unwrap_or(u16::MAX).to_be_bytes());
        msg.extend(ext);
        let alg = match sct.signature.hash_alg_id {
            5 => "sha384",
            _ => "sha256",
        };
        if key.verify(alg, &msg, sct.signature.data).is_ok() {
            return Ok(());
        }
    }
    Err(SctError::Unverified)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

    use super::*;

    #[test]
    fn der_lengths_round_trip() {
        for len in [0usize, 5, 127, 128, 255, 256, 70_000] {
            let content = vec![7u8; len];
            let enc = encode(0x30, &content);
            assert_eq!(element(&enc), Some((enc.len() - len, len)));
        }
    }
}
