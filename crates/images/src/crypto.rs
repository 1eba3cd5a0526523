//! Keys, signatures and certificates: PEM public keys (ECDSA P-256/P-384, RSA, Ed25519)
//! checked with ring; certificate chains with rustls-webpki; certificate fields with
//! x509-parser. These crates are already the project's TLS stack; sigstore-rs would bring a
//! second crypto backend (aws-lc-rs) and cannot read `.att` attestations or keyless
//! certificates without a Rekor bundle (see research/verifyimages.md).

use ring::signature::{self, UnparsedPublicKey};
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::*;

/// A DER parse failure of x509-parser (a certificate, a SubjectPublicKeyInfo).
pub type DerError = x509_parser::nom::Err<X509Error>;

/// Why a key, a certificate, a chain or a signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error("failed to load public key from PEM: {0}")]
    KeyPem(#[source] ::pem::PemError),
    #[error("failed to load public key from PEM: {0}")]
    KeyDer(#[source] DerError),
    /// The PEM block's tag.
    #[error("failed to load public key from PEM: unexpected PEM block {0:?}")]
    KeyBlock(String),
    /// The curve's OID (empty when the key names none).
    #[error("unsupported elliptic curve {0}")]
    Curve(String),
    /// The key algorithm's OID.
    #[error("unsupported public key algorithm {0}")]
    KeyAlgorithm(String),
    /// The hash algorithm asked for.
    #[error("signature algorithm {0} is not supported for this key type")]
    SignatureAlgorithm(String),
    /// The signature does not verify with the key (ring says no more).
    #[error("invalid signature when validating ASN.1 encoded signature")]
    BadSignature,
    #[error("failed to unmarshal certificate from PEM format: {0}")]
    CertificatePem(#[source] ::pem::PemError),
    #[error("no certs found in pem file")]
    NoCertificates,
    #[error("certificate chain too long ({0}), maximum allowed is 10")]
    ChainTooLong(usize),
    #[error("failed to parse certificate: {0}")]
    CertificateDer(#[source] DerError),
    #[error("certificate is not valid before {0}")]
    NotYetValid(ASN1Time),
    #[error("certificate has expired: it was valid until {0}")]
    Expired(ASN1Time),
    #[error("invalid root certificate: {0}")]
    Root(#[source] webpki::Error),
    #[error("invalid certificate: {0}")]
    Leaf(#[source] webpki::Error),
    #[error("certificate chain verification failed: {0}")]
    Chain(#[source] webpki::Error),
}

/// A public key that can check signatures.
#[derive(Debug, Clone)]
pub enum PublicKey {
    P256(Vec<u8>),
    P384(Vec<u8>),
    /// PKCS#1 RSAPublicKey DER.
    Rsa(Vec<u8>),
    Ed25519(Vec<u8>),
}

const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";
const RSA: &str = "1.2.840.113549.1.1.1";
const ED25519: &str = "1.3.101.112";
/// Extended key usage: code signing (what Fulcio and cosign require of a signing certificate).
const CODE_SIGNING: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 3, 3];

impl PublicKey {
    /// The first `PUBLIC KEY` (or a certificate's key) of a PEM text.
    pub fn from_pem(text: &str) -> Result<PublicKey, CryptoError> {
        let block = ::pem::parse(text.trim()).map_err(CryptoError::KeyPem)?;
        match block.tag() {
            "PUBLIC KEY" => {
                let (_, spki) = SubjectPublicKeyInfo::from_der(block.contents()).map_err(CryptoError::KeyDer)?;
                PublicKey::from_spki(&spki)
            }
            "CERTIFICATE" => Certificate::from_der(block.contents().to_vec())?.public_key(),
            other => Err(CryptoError::KeyBlock(other.to_string())),
        }
    }

    /// A DER `SubjectPublicKeyInfo` (as Sigstore's trusted root holds its logs' keys).
    pub fn from_spki_der(der: &[u8]) -> Result<PublicKey, CryptoError> {
        let (_, spki) = SubjectPublicKeyInfo::from_der(der).map_err(CryptoError::KeyDer)?;
        PublicKey::from_spki(&spki)
    }

    fn from_spki(spki: &SubjectPublicKeyInfo) -> Result<PublicKey, CryptoError> {
        let alg = spki.algorithm.algorithm.to_id_string();
        let key = spki.subject_public_key.data.to_vec();
        match alg.as_str() {
            EC_PUBLIC_KEY => {
                let curve = spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok())
                    .map(|o| o.to_id_string())
                    .unwrap_or_default();
                match curve.as_str() {
                    P256 => Ok(PublicKey::P256(key)),
                    P384 => Ok(PublicKey::P384(key)),
                    c => Err(CryptoError::Curve(c.to_string())),
                }
            }
            RSA => Ok(PublicKey::Rsa(key)),
            ED25519 => Ok(PublicKey::Ed25519(key)),
            a => Err(CryptoError::KeyAlgorithm(a.to_string())),
        }
    }

    /// Checks `sig` over `msg` with the hash `algorithm` (`sha256` when empty).
    pub fn verify(&self, algorithm: &str, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        let alg = if algorithm.is_empty() { "sha256" } else { algorithm };
        let unsupported = || CryptoError::SignatureAlgorithm(alg.to_string());
        let ok = match self {
            PublicKey::P256(k) | PublicKey::P384(k) => {
                let v: &dyn signature::VerificationAlgorithm = match (self, alg) {
                    (PublicKey::P256(_), "sha256") => &signature::ECDSA_P256_SHA256_ASN1,
                    (PublicKey::P256(_), "sha384") => &signature::ECDSA_P256_SHA384_ASN1,
                    (PublicKey::P384(_), "sha256") => &signature::ECDSA_P384_SHA256_ASN1,
                    (PublicKey::P384(_), "sha384") => &signature::ECDSA_P384_SHA384_ASN1,
                    _ => return Err(unsupported()),
                };
                UnparsedPublicKey::new(v, k).verify(msg, sig).is_ok()
            }
            PublicKey::Rsa(k) => {
                let (pkcs1, pss): (&dyn signature::VerificationAlgorithm, &dyn signature::VerificationAlgorithm) =
                    match alg {
                        "sha256" => (&signature::RSA_PKCS1_2048_8192_SHA256, &signature::RSA_PSS_2048_8192_SHA256),
                        "sha384" => (&signature::RSA_PKCS1_2048_8192_SHA384, &signature::RSA_PSS_2048_8192_SHA384),
                        "sha512" => (&signature::RSA_PKCS1_2048_8192_SHA512, &signature::RSA_PSS_2048_8192_SHA512),
                        _ => return Err(unsupported()),
                    };
                UnparsedPublicKey::new(pkcs1, k).verify(msg, sig).is_ok()
                    || UnparsedPublicKey::new(pss, k).verify(msg, sig).is_ok()
            }
            PublicKey::Ed25519(k) => UnparsedPublicKey::new(&signature::ED25519, k).verify(msg, sig).is_ok(),
        };
        if ok { Ok(()) } else { Err(CryptoError::BadSignature) }
    }
}

/// Every `CERTIFICATE` block of a PEM text, in order.
pub fn certificates(text: &str) -> Result<Vec<Certificate>, CryptoError> {
    let blocks = ::pem::parse_many(text.trim()).map_err(CryptoError::CertificatePem)?;
    let certs: Vec<Certificate> = blocks
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| Certificate::from_der(b.into_contents()))
        .collect::<Result<_, _>>()?;
    if certs.is_empty() {
        return Err(CryptoError::NoCertificates);
    }
    if certs.len() > 10 {
        return Err(CryptoError::ChainTooLong(certs.len()));
    }
    Ok(certs)
}

/// A DER certificate.
#[derive(Debug, Clone)]
pub struct Certificate {
    pub der: Vec<u8>,
}

/// The identity a keyless certificate carries.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// Every subject alternative name: e-mail addresses, URIs, DNS names, other names.
    pub sans: Vec<String>,
    /// The OIDC issuer (Fulcio's extension 1.3.6.1.4.1.57264.1.1, or .1.8).
    pub issuer: String,
    /// Fulcio extensions by OID (`1.3.6.1.4.1.57264.1.x`) as strings.
    pub extensions: Vec<(String, String)>,
}

impl Certificate {
    pub fn from_der(der: Vec<u8>) -> Result<Certificate, CryptoError> {
        X509Certificate::from_der(&der).map_err(CryptoError::CertificateDer)?;
        Ok(Certificate { der })
    }

    fn parsed(&self) -> Result<X509Certificate<'_>, CryptoError> {
        X509Certificate::from_der(&self.der).map(|(_, c)| c).map_err(CryptoError::CertificateDer)
    }

    pub fn public_key(&self) -> Result<PublicKey, CryptoError> {
        PublicKey::from_spki(self.parsed()?.public_key())
    }

    /// Whether the certificate is valid at `now` (seconds since the epoch).
    pub fn valid_at(&self, now: i64) -> Result<(), CryptoError> {
        let c = self.parsed()?;
        let v = c.validity();
        if now < v.not_before.timestamp() {
            return Err(CryptoError::NotYetValid(v.not_before));
        }
        if now > v.not_after.timestamp() {
            return Err(CryptoError::Expired(v.not_after));
        }
        Ok(())
    }

    pub fn identity(&self) -> Result<Identity, CryptoError> {
        let c = self.parsed()?;
        let mut id = Identity::default();
        if let Ok(Some(san)) = c.subject_alternative_name() {
            for n in &san.value.general_names {
                id.sans.push(match n {
                    GeneralName::RFC822Name(s) | GeneralName::DNSName(s) | GeneralName::URI(s) => s.to_string(),
                    GeneralName::OtherName(_, v) => String::from_utf8_lossy(other_name_value(v)).to_string(),
                    other => other.to_string(),
                });
            }
        }
        for ext in c.extensions() {
            let oid = ext.oid.to_id_string();
            if !oid.starts_with("1.3.6.1.4.1.57264.1.") {
                continue;
            }
            // Fulcio's first extensions hold the raw string; later ones (.8 on) a DER UTF8String.
            let raw = ext.value;
            let value = match raw.first() {
                Some(0x0c) if oid.rsplit('.').next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0) >= 8 => {
                    der_string(raw).unwrap_or_default()
                }
                _ => String::from_utf8_lossy(raw).to_string(),
            };
            if oid == "1.3.6.1.4.1.57264.1.1" || (oid == "1.3.6.1.4.1.57264.1.8" && id.issuer.is_empty()) {
                id.issuer = value.clone();
            }
            id.extensions.push((oid, value));
        }
        Ok(id)
    }
}

/// The value of a DER UTF8String (tag, length, bytes).
fn der_string(raw: &[u8]) -> Option<String> {
    let (len, start) = match *raw.get(1)? {
        l if l < 0x80 => (l as usize, 2),
        0x81 => (*raw.get(2)? as usize, 3),
        0x82 => (((*raw.get(2)? as usize) << 8) | *raw.get(3)? as usize, 4),
        _ => return None,
    };
    raw.get(start..start + len).map(|b| String::from_utf8_lossy(b).to_string())
}

/// An otherName SAN's value: its inner UTF8String when there is one.
fn other_name_value(v: &[u8]) -> &[u8] {
    // [0] EXPLICIT { UTF8String }
    match v {
        [0xa0, _, 0x0c, len, rest @ ..] if (*len as usize) <= rest.len() => rest.get(..*len as usize).unwrap_or(v),
        _ => v,
    }
}

/// Checks `leaf` up to one of `roots` through `intermediates`, for code signing, at `now`.
pub fn verify_chain(
    leaf: &Certificate,
    intermediates: &[Certificate],
    roots: &[Certificate],
    now: i64,
) -> Result<(), CryptoError> {
    let root_ders: Vec<CertificateDer<'_>> = roots.iter().map(|c| CertificateDer::from(c.der.as_slice())).collect();
    let anchors: Vec<_> = root_ders
        .iter()
        .map(|d| webpki::anchor_from_trusted_cert(d).map_err(CryptoError::Root))
        .collect::<Result<_, _>>()?;
    let inter: Vec<CertificateDer<'_>> = intermediates.iter().map(|c| CertificateDer::from(c.der.as_slice())).collect();
    let leaf_der = CertificateDer::from(leaf.der.as_slice());
    let ee = webpki::EndEntityCert::try_from(&leaf_der).map_err(CryptoError::Leaf)?;
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.max(0) as u64));
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        &inter,
        time,
        webpki::KeyUsage::required_if_present(CODE_SIGNING),
        None,
        None,
    )
    .map(|_| ())
    .map_err(CryptoError::Chain)
}
