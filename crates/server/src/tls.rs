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

/// Why a serving certificate could not be made or loaded; says which file or field.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("creating {path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("reading {what}: {source}")]
    Pem { what: String, source: rustls_pki_types::pem::Error },
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

fn write(path: &Path, text: &str) -> Result<(), TlsError> {
    std::fs::write(path, text).map_err(|source| TlsError::Write { path: path.to_path_buf(), source })
}

/// Makes sure the directory holds a CA and a serving pair for `dns_names`; returns the CA path.
pub fn ensure_dir(dir: &Path, dns_names: &[String]) -> Result<PathBuf, TlsError> {
    let ca = dir.join("ca.crt");
    if ca.is_file() && dir.join("tls.crt").is_file() && dir.join("tls.key").is_file() {
        return Ok(ca);
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::CreateDir { path: dir.to_path_buf(), source })?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "verno-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.distinguished_name.push(DnType::CommonName, dns_names.first().map(String::as_str).unwrap_or("verno"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer)?;
    write(&ca, &ca_cert.pem())?;
    write(&dir.join("ca.key"), &issuer.key().serialize_pem())?;
    write(&dir.join("tls.crt"), &cert.pem())?;
    write(&dir.join("tls.key"), &key.serialize_pem())?;
    Ok(ca)
}

/// A rustls server configuration (ring provider, TLS 1.2+, ALPN h2 and http/1.1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = |what: &Path, source| TlsError::Pem { what: what.display().to_string(), source };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem(cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem(cert, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert.display().to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem(key, e))?;
    build(certs, key)
}

/// The same from PEM bytes (a TLS Secret's `tls.crt` and `tls.key`).
pub fn server_config_pem(cert: &[u8], key: &[u8]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = |what: &str, source| TlsError::Pem { what: what.to_string(), source };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert).collect::<Result<_, _>>().map_err(|e| pem("tls.crt", e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate("tls.crt".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| pem("tls.key", e))?;
    build(certs, key)
}

fn build(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
