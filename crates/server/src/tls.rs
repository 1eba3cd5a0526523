//! Serving certificates: files given by the user, or a self-made CA and serving pair kept in a
//! directory so restarts reuse them (the CA is what a webhook's `caBundle` needs).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Generated on first start into `dir` (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`).
    Dir {
        dir: PathBuf,
        dns_names: Vec<String>,
    },
    /// In memory (in-cluster: from the TLS Secret); replaced with `Running::set_certificate`.
    Pem {
        cert: Vec<u8>,
        key: Vec<u8>,
    },
}

impl TlsSource {
    /// The certificate and key files in use (after generating them when needed).
    pub fn files(&self) -> (PathBuf, PathBuf) {
        match self {
            TlsSource::Files { cert, key } => (cert.clone(), key.clone()),
            TlsSource::Dir { dir, .. } => (dir.join("tls.crt"), dir.join("tls.key")),
            TlsSource::Pem { .. } => (PathBuf::new(), PathBuf::new()),
        }
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Makes sure the directory holds a CA and a serving pair for `dns_names`; returns the CA path.
pub fn ensure_dir(dir: &Path, dns_names: &[String]) -> Result<PathBuf, String> {
    let ca = dir.join("ca.crt");
    if ca.is_file() && dir.join("tls.crt").is_file() && dir.join("tls.key").is_file() {
        return Ok(ca);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let err = |e: rcgen::Error| format!("generating certificates: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "verno-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(err)?;
    params.distinguished_name.push(DnType::CommonName, dns_names.first().map(String::as_str).unwrap_or("verno"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    write(&ca, &ca_cert.pem())?;
    write(&dir.join("ca.key"), &issuer.key().serialize_pem())?;
    write(&dir.join("tls.crt"), &cert.pem())?;
    write(&dir.join("tls.key"), &key.serialize_pem())?;
    Ok(ca)
}

/// A rustls server configuration (ring provider, TLS 1.2+, ALPN h2 and http/1.1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("reading {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("reading {}: {e}", key.display()))?;
    build(certs, key)
}

/// The same from PEM bytes (a TLS Secret's `tls.crt` and `tls.key`).
pub fn server_config_pem(cert: &[u8], key: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert).collect::<Result<_, _>>().map_err(|e| format!("tls.crt: {e}"))?;
    if certs.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("tls.key: {e}"))?;
    build(certs, key)
}

fn build(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
