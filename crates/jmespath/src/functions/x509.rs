//! `x509_decode(pem)`: a certificate or certificate request (RSA keys only, as Kyverno) as the
//! JSON Go's `encoding/json` makes of `x509.Certificate` / `x509.CertificateRequest`, with
//! `PublicKey` as `{N: "<modulus in decimal>", E: <exponent>}`. Policies read fields such as
//! `Subject.CommonName`, `NotAfter`, `DNSNames` or `PublicKey.N`; the byte fields are base64, as
//! Go writes them, and numbers (the serial number too) are JSON numbers.

use base64::Engine as _;
use serde_json::{Map, Value, json};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::der_parser::oid::Oid;
use x509_parser::error::X509Error;
use x509_parser::extensions::{
    AuthorityInfoAccess, BasicConstraints, CRLDistributionPoints, ExtendedKeyUsage, GeneralName, KeyUsage,
    ParsedExtension, X509Extension,
};
use x509_parser::prelude::{FromDer, X509Certificate, X509Name};
use x509_parser::public_key::PublicKey;

/// Why `x509_decode` failed, in the words of Go's `encoding/pem` and `crypto/x509` (as Kyverno
/// reports them).
#[derive(Debug, thiserror::Error)]
pub enum X509DecodeError {
    /// No `-----BEGIN …-----` … `-----END …-----` block.
    #[error("failed to decode PEM block")]
    NoPemBlock,
    /// The block's body is not base64.
    #[error("failed to decode PEM block")]
    PemBody(#[source] base64::DecodeError),
    #[error("PEM block neither contains a CERTIFICATE or CERTIFICATE REQUEST")]
    UnknownBlock,
    #[error("x509: malformed certificate: {0}")]
    MalformedCertificate(#[source] x509_parser::nom::Err<X509Error>),
    #[error("x509: malformed certificate request: {0}")]
    MalformedRequest(#[source] x509_parser::nom::Err<X509Error>),
    #[error("certificate should use rsa algorithm")]
    NotRsa,
    #[error("failed to parse subject public key info")]
    PublicKeyInfo(#[source] X509Error),
}

fn b64(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

/// Go's `[]string` in JSON: `null` when empty.
fn strings(v: Vec<String>) -> Value {
    if v.is_empty() { Value::Null } else { json!(v) }
}

fn oid_ints(oid: &Oid) -> Value {
    match oid.iter() {
        Some(it) => json!(it.collect::<Vec<u64>>()),
        None => Value::Null,
    }
}

/// Decodes one PEM block.
pub fn decode(pem_text: &str) -> Result<Value, X509DecodeError> {
    let (block, rest) = first_block(pem_text).ok_or(X509DecodeError::NoPemBlock)?;
    let _ = rest;
    let der = base64::engine::general_purpose::STANDARD
        .decode(block.body.chars().filter(|c| !c.is_whitespace()).collect::<String>())
        .map_err(X509DecodeError::PemBody)?;
    match block.label.as_str() {
        "CERTIFICATE" => certificate(&der),
        "CERTIFICATE REQUEST" => request(&der),
        _ => Err(X509DecodeError::UnknownBlock),
    }
}

struct Block {
    label: String,
    body: String,
}

/// The first `-----BEGIN X-----` … `-----END X-----` block (text before it is skipped, as Go's
/// `pem.Decode` does).
fn first_block(text: &str) -> Option<(Block, &str)> {
    let start = text.find("-----BEGIN ")?;
    let after = text.get(start + 11..)?;
    let label_end = after.find("-----")?;
    let label = after.get(..label_end)?.to_string();
    let body_start = after.get(label_end + 5..)?;
    let end_marker = format!("-----END {label}-----");
    let end = body_start.find(&end_marker)?;
    let body = body_start.get(..end)?;
    // Headers (`Proc-Type: …`) are not part of the body.
    let body = if body.contains(':') { body.split("\n\n").last().unwrap_or(body) } else { body };
    Some((Block { label, body: body.to_string() }, body_start.get(end + end_marker.len()..).unwrap_or("")))
}

fn rsa_key(spki: &x509_parser::x509::SubjectPublicKeyInfo) -> Result<Value, X509DecodeError> {
    match spki.parsed() {
        Ok(PublicKey::RSA(k)) => {
            let e = k.exponent.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            Ok(json!({"N": decimal(k.modulus), "E": e}))
        }
        Ok(_) => Err(X509DecodeError::NotRsa),
        Err(e) => Err(X509DecodeError::PublicKeyInfo(e)),
    }
}

/// A big-endian unsigned integer in decimal.
fn decimal(bytes: &[u8]) -> String {
    // Base 10^9 limbs, least significant first.
    let mut limbs: Vec<u64> = vec![0];
    for &b in bytes {
        let mut carry = u64::from(b);
        for l in limbs.iter_mut() {
            let v = *l * 256 + carry;
            *l = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push(carry % 1_000_000_000);
            carry /= 1_000_000_000;
        }
    }
    let mut out = String::new();
    for (i, l) in limbs.iter().rev().enumerate() {
        if i == 0 {
            out.push_str(&l.to_string());
        } else {
            out.push_str(&format!("{l:09}"));
        }
    }
    out
}

/// Go's `SignatureAlgorithm` numbers.
fn signature_algorithm(oid: &str) -> u64 {
    match oid {
        "1.2.840.113549.1.1.2" => 1,
        "1.2.840.113549.1.1.4" => 2,
        "1.2.840.113549.1.1.5" => 3,
        "1.2.840.113549.1.1.11" => 4,
        "1.2.840.113549.1.1.12" => 5,
        "1.2.840.113549.1.1.13" => 6,
        "1.2.840.10040.4.3" => 7,
        "2.16.840.1.101.3.4.3.2" => 8,
        "1.2.840.10045.4.1" => 9,
        "1.2.840.10045.4.3.2" => 10,
        "1.2.840.10045.4.3.3" => 11,
        "1.2.840.10045.4.3.4" => 12,
        "1.2.840.113549.1.1.10" => 13,
        "1.3.101.112" => 16,
        _ => 0,
    }
}

/// Go's `pkix.Name`.
fn name(n: &X509Name) -> Value {
    let mut by_type: Map<String, Value> = Map::new();
    let mut names = Vec::new();
    let mut serial = String::new();
    let mut common = String::new();
    for attr in n.iter_attributes() {
        let oid = attr.attr_type().to_id_string();
        let value = attr.as_str().map(str::to_string).unwrap_or_default();
        names.push(json!({"Type": oid_ints(attr.attr_type()), "Value": value}));
        let field = match oid.as_str() {
            "2.5.4.6" => "Country",
            "2.5.4.10" => "Organization",
            "2.5.4.11" => "OrganizationalUnit",
            "2.5.4.7" => "Locality",
            "2.5.4.8" => "Province",
            "2.5.4.9" => "StreetAddress",
            "2.5.4.17" => "PostalCode",
            "2.5.4.5" => {
                serial = value;
                continue;
            }
            "2.5.4.3" => {
                common = value;
                continue;
            }
            _ => continue,
        };
        if let Some(Value::Array(a)) = by_type.get_mut(field) {
            a.push(Value::String(value));
        } else {
            by_type.insert(field.into(), json!([value]));
        }
    }
    let mut out = Map::new();
    for f in ["Country", "Organization", "OrganizationalUnit", "Locality", "Province", "StreetAddress", "PostalCode"] {
        out.insert(f.into(), by_type.remove(f).unwrap_or(Value::Null));
    }
    out.insert("SerialNumber".into(), Value::String(serial));
    out.insert("CommonName".into(), Value::String(common));
    out.insert("Names".into(), if names.is_empty() { Value::Null } else { Value::Array(names) });
    out.insert("ExtraNames".into(), Value::Null);
    Value::Object(out)
}

fn time(t: x509_parser::time::ASN1Time) -> Value {
    let dt = chrono::DateTime::from_timestamp(t.timestamp(), 0).unwrap_or_default();
    Value::String(dt.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn extensions(exts: &[X509Extension]) -> Value {
    if exts.is_empty() {
        return Value::Null;
    }
    json!(
        exts.iter()
            .map(|e| json!({"Id": oid_ints(&e.oid), "Critical": e.critical, "Value": b64(e.value)}))
            .collect::<Vec<_>>()
    )
}

/// SAN fields as Go splits them: DNS names, e-mail addresses, IP addresses, URIs.
fn sans(exts: &[X509Extension], out: &mut Map<String, Value>) {
    let (mut dns, mut email, mut ips, mut uris) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in exts {
        if let ParsedExtension::SubjectAlternativeName(san) = e.parsed_extension() {
            for n in &san.general_names {
                match n {
                    GeneralName::DNSName(s) => dns.push(s.to_string()),
                    GeneralName::RFC822Name(s) => email.push(s.to_string()),
                    GeneralName::IPAddress(b) => ips.push(ip(b)),
                    GeneralName::URI(s) => uris.push(uri(s)),
                    _ => {}
                }
            }
        }
    }
    out.insert("DNSNames".into(), strings(dns));
    out.insert("EmailAddresses".into(), strings(email));
    out.insert("IPAddresses".into(), strings(ips));
    out.insert("URIs".into(), if uris.is_empty() { Value::Null } else { Value::Array(uris) });
}

fn ip(b: &[u8]) -> String {
    if let Ok(a) = <[u8; 4]>::try_from(b) {
        std::net::Ipv4Addr::from(a).to_string()
    } else if let Ok(a) = <[u8; 16]>::try_from(b) {
        std::net::Ipv6Addr::from(a).to_string()
    } else {
        String::new()
    }
}

/// Go's `url.URL` as JSON (its exported fields).
fn uri(s: &str) -> Value {
    let (scheme, rest) = s.split_once(':').unwrap_or(("", s));
    let (before_fragment, fragment) = rest.split_once('#').unwrap_or((rest, ""));
    let (before_query, query) = before_fragment.split_once('?').unwrap_or((before_fragment, ""));
    let (host, path) = match before_query.strip_prefix("//") {
        Some(r) => match r.find('/') {
            Some(i) => (r.get(..i).unwrap_or(""), r.get(i..).unwrap_or("")),
            None => (r, ""),
        },
        None => ("", before_query),
    };
    json!({"Scheme": scheme, "Opaque": "", "User": null, "Host": host, "Path": path, "RawPath": "",
        "OmitHost": false, "ForceQuery": false, "RawQuery": query, "Fragment": fragment, "RawFragment": ""})
}

fn certificate(der: &[u8]) -> Result<Value, X509DecodeError> {
    let (_, c) = X509Certificate::from_der(der).map_err(X509DecodeError::MalformedCertificate)?;
    let tbs = &c.tbs_certificate;
    let key = rsa_key(&tbs.subject_pki)?;
    let mut out = Map::new();
    out.insert("Raw".into(), b64(der));
    out.insert("RawTBSCertificate".into(), b64(tbs.as_ref()));
    out.insert("RawSubjectPublicKeyInfo".into(), b64(tbs.subject_pki.raw));
    out.insert("RawSubject".into(), b64(tbs.subject.as_raw()));
    out.insert("RawIssuer".into(), b64(tbs.issuer.as_raw()));
    out.insert("Signature".into(), b64(&c.signature_value.data));
    out.insert(
        "SignatureAlgorithm".into(),
        json!(signature_algorithm(&c.signature_algorithm.algorithm.to_id_string())),
    );
    out.insert("PublicKeyAlgorithm".into(), json!(1));
    out.insert("PublicKey".into(), key);
    out.insert("Version".into(), json!(tbs.version.0 + 1));
    // Kyverno round-trips through JSON into Go values: the serial number becomes a float.
    let serial = tbs.serial.to_string().parse::<f64>().unwrap_or(0.0);
    out.insert("SerialNumber".into(), json!(serial));
    out.insert("Issuer".into(), name(&tbs.issuer));
    out.insert("Subject".into(), name(&tbs.subject));
    out.insert("NotBefore".into(), time(tbs.validity.not_before));
    out.insert("NotAfter".into(), time(tbs.validity.not_after));
    certificate_extension_fields(tbs.extensions(), &mut out);
    Ok(Value::Object(out))
}

/// What a certificate's extensions say, as Go's `x509.Certificate` fields.
#[derive(Default)]
struct CertExtensions {
    key_usage: u64,
    ext_key_usage: Vec<u64>,
    basic_constraints_valid: bool,
    is_ca: bool,
    max_path_len: i64,
    max_path_len_zero: bool,
    subject_key_id: Value,
    authority_key_id: Value,
    ocsp_servers: Vec<String>,
    issuing_certificate_urls: Vec<String>,
    crl_distribution_points: Vec<String>,
}

impl CertExtensions {
    fn read(exts: &[X509Extension]) -> CertExtensions {
        let mut x = CertExtensions::default();
        for e in exts {
            match e.parsed_extension() {
                ParsedExtension::KeyUsage(k) => x.key_usage = key_usage_bits(k),
                ParsedExtension::ExtendedKeyUsage(k) => x.ext_key_usage = ext_key_usage_codes(k),
                ParsedExtension::BasicConstraints(b) => x.basic_constraints(b),
                ParsedExtension::SubjectKeyIdentifier(k) => x.subject_key_id = b64(k.0),
                ParsedExtension::AuthorityKeyIdentifier(k) => {
                    if let Some(id) = &k.key_identifier {
                        x.authority_key_id = b64(id.0);
                    }
                }
                ParsedExtension::AuthorityInfoAccess(a) => x.authority_info_access(a),
                ParsedExtension::CRLDistributionPoints(points) => x.crl_points(points),
                _ => {}
            }
        }
        x
    }

    fn basic_constraints(&mut self, b: &BasicConstraints) {
        self.basic_constraints_valid = true;
        self.is_ca = b.ca;
        match b.path_len_constraint {
            Some(n) => {
                self.max_path_len = i64::from(n);
                self.max_path_len_zero = n == 0;
            }
            None => self.max_path_len = -1,
        }
    }

    /// The OCSP servers and issuing-certificate URLs.
    fn authority_info_access(&mut self, a: &AuthorityInfoAccess) {
        for d in &a.accessdescs {
            if let GeneralName::URI(u) = &d.access_location {
                match d.access_method.to_id_string().as_str() {
                    "1.3.6.1.5.5.7.48.1" => self.ocsp_servers.push(u.to_string()),
                    "1.3.6.1.5.5.7.48.2" => self.issuing_certificate_urls.push(u.to_string()),
                    _ => {}
                }
            }
        }
    }

    /// The distribution points' full-name URIs.
    fn crl_points(&mut self, points: &CRLDistributionPoints) {
        for p in points.iter() {
            if let Some(x509_parser::extensions::DistributionPointName::FullName(names)) = &p.distribution_point {
                for n in names {
                    if let GeneralName::URI(u) = n {
                        self.crl_distribution_points.push(u.to_string());
                    }
                }
            }
        }
    }
}

/// Go's `KeyUsage` bit set.
fn key_usage_bits(k: &KeyUsage) -> u64 {
    let bits = [
        k.digital_signature(),
        k.non_repudiation(),
        k.key_encipherment(),
        k.data_encipherment(),
        k.key_agreement(),
        k.key_cert_sign(),
        k.crl_sign(),
        k.encipher_only(),
        k.decipher_only(),
    ];
    bits.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| 1u64 << i).sum()
}

/// Go's `ExtKeyUsage` numbers.
fn ext_key_usage_codes(k: &ExtendedKeyUsage) -> Vec<u64> {
    let pairs = [
        (k.any, 0),
        (k.server_auth, 1),
        (k.client_auth, 2),
        (k.code_signing, 3),
        (k.email_protection, 4),
        (k.time_stamping, 8),
        (k.ocsp_signing, 9),
    ];
    pairs.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect()
}

/// Go's `x509.Certificate` fields after `NotAfter`, in its order: those the extensions set,
/// the SANs, and the constraint and policy fields (empty, as Kyverno's JSON has them).
fn certificate_extension_fields(exts: &[X509Extension], out: &mut Map<String, Value>) {
    let x = CertExtensions::read(exts);
    out.insert("KeyUsage".into(), json!(x.key_usage));
    out.insert("Extensions".into(), extensions(exts));
    out.insert("ExtraExtensions".into(), Value::Null);
    out.insert("UnhandledCriticalExtensions".into(), Value::Null);
    out.insert("ExtKeyUsage".into(), if x.ext_key_usage.is_empty() { Value::Null } else { json!(x.ext_key_usage) });
    out.insert("UnknownExtKeyUsage".into(), Value::Null);
    out.insert("BasicConstraintsValid".into(), json!(x.basic_constraints_valid));
    out.insert("IsCA".into(), json!(x.is_ca));
    out.insert("MaxPathLen".into(), json!(x.max_path_len));
    out.insert("MaxPathLenZero".into(), json!(x.max_path_len_zero));
    out.insert("SubjectKeyId".into(), x.subject_key_id);
    out.insert("AuthorityKeyId".into(), x.authority_key_id);
    out.insert("OCSPServer".into(), strings(x.ocsp_servers));
    out.insert("IssuingCertificateURL".into(), strings(x.issuing_certificate_urls));
    sans(exts, out);
    out.insert("PermittedDNSDomainsCritical".into(), json!(false));
    for f in [
        "PermittedDNSDomains",
        "ExcludedDNSDomains",
        "PermittedIPRanges",
        "ExcludedIPRanges",
        "PermittedEmailAddresses",
        "ExcludedEmailAddresses",
        "PermittedURIDomains",
        "ExcludedURIDomains",
    ] {
        out.insert(f.into(), Value::Null);
    }
    out.insert("CRLDistributionPoints".into(), strings(x.crl_distribution_points));
    out.insert("PolicyIdentifiers".into(), Value::Null);
    out.insert("Policies".into(), Value::Null);
    for (f, v) in [
        ("InhibitAnyPolicy", json!(0)),
        ("InhibitAnyPolicyZero", json!(false)),
        ("InhibitPolicyMapping", json!(0)),
        ("InhibitPolicyMappingZero", json!(false)),
        ("RequireExplicitPolicy", json!(0)),
        ("RequireExplicitPolicyZero", json!(false)),
        ("PolicyMappings", Value::Null),
    ] {
        out.insert(f.into(), v);
    }
}

fn request(der: &[u8]) -> Result<Value, X509DecodeError> {
    let (_, r) = X509CertificationRequest::from_der(der).map_err(X509DecodeError::MalformedRequest)?;
    let info = &r.certification_request_info;
    let key = rsa_key(&info.subject_pki)?;
    let exts: Vec<X509Extension> = info
        .iter_attributes()
        .find_map(|a| match a.parsed_attribute() {
            x509_parser::cri_attributes::ParsedCriAttribute::ExtensionRequest(r) => Some(r.extensions.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mut out = Map::new();
    out.insert("Raw".into(), b64(der));
    out.insert("RawTBSCertificateRequest".into(), b64(info.raw));
    out.insert("RawSubjectPublicKeyInfo".into(), b64(info.subject_pki.raw));
    out.insert("RawSubject".into(), b64(info.subject.as_raw()));
    out.insert("Version".into(), json!(info.version.0));
    out.insert("Signature".into(), b64(&r.signature_value.data));
    out.insert(
        "SignatureAlgorithm".into(),
        json!(signature_algorithm(&r.signature_algorithm.algorithm.to_id_string())),
    );
    out.insert("PublicKeyAlgorithm".into(), json!(1));
    out.insert("PublicKey".into(), key);
    out.insert("Subject".into(), name(&info.subject));
    out.insert("Attributes".into(), Value::Null);
    out.insert("Extensions".into(), extensions(&exts));
    out.insert("ExtraExtensions".into(), Value::Null);
    sans(&exts, &mut out);
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn decimal_of_big_endian_bytes() {
        assert_eq!(super::decimal(&[0x01, 0x00]), "256");
        assert_eq!(super::decimal(&[0xff; 8]), "18446744073709551615");
        assert_eq!(super::decimal(&[0x01, 0, 0, 0, 0, 0, 0, 0, 0]), "18446744073709551616");
        assert_eq!(super::decimal(&[]), "0");
    }

    #[test]
    fn not_pem() {
        assert_eq!(super::decode("hello").unwrap_err().to_string(), "failed to decode PEM block");
        assert_eq!(
            super::decode("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").unwrap_err().to_string(),
            "PEM block neither contains a CERTIFICATE or CERTIFICATE REQUEST"
        );
    }
}
