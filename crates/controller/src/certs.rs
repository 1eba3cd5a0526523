//! Serving certificates in Secrets, Kyverno's two-Secret contract:
//! `<svc>.<ns>.svc.verno-tls-ca` holds the CA (every trusted CA certificate in `tls.crt`, the
//! current key in `tls.key`) and `<svc>.<ns>.svc.verno-tls-pair` the serving pair.
//!
//! The leader creates them when missing (AlreadyExists means another replica won: re-read) and
//! renews the serving pair when it enters the last third of its life, by an update with a
//! resourceVersion precondition. Secrets without our `cert.verno.io/managed-by` label (made by
//! cert-manager or by hand) are read but never rewritten. Every replica reads the pair and
//! hot-swaps its serving certificate; the CA's `tls.crt` is the webhook `caBundle`.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use std::collections::BTreeMap;
use std::time::Duration;

pub const MANAGED_BY_LABEL: &str = "cert.verno.io/managed-by";
/// When the certificate in the Secret stops being valid (RFC 3339), written with it.
pub const NOT_AFTER_ANNOTATION: &str = "cert.verno.io/not-after";
/// The names a serving pair was made for (comma-separated): other names make a new pair.
pub const NAMES_ANNOTATION: &str = "cert.verno.io/names";
const CA_NAME: &str = "verno-ca";

/// Secret names and validity periods.
#[derive(Debug, Clone)]
pub struct CertConfig {
    pub namespace: String,
    pub service: String,
    /// Names beyond the Service's (a `--server-url` host, DNS name or IP address).
    pub extra_names: Vec<String>,
    pub ca_validity: Duration,
    pub pair_validity: Duration,
}

impl CertConfig {
    pub fn ca_secret(&self) -> String {
        format!("{}.{}.svc.verno-tls-ca", self.service, self.namespace)
    }
    pub fn pair_secret(&self) -> String {
        format!("{}.{}.svc.verno-tls-pair", self.service, self.namespace)
    }
    /// The names the serving certificate is valid for.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, n) = (&self.service, &self.namespace);
        let mut names = vec![s.clone(), format!("{s}.{n}"), format!("{s}.{n}.svc")];
        names.extend(self.extra_names.iter().filter(|e| !e.is_empty()).cloned());
        names
    }

    /// The names, as the pair's annotation records them.
    fn names_annotation(&self) -> String {
        self.dns_names().join(",")
    }
}

/// The PEM data of a TLS Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

pub fn pem_of(s: &Secret) -> Option<Pem> {
    let data = s.data.as_ref()?;
    let cert = data.get("tls.crt")?.0.clone();
    let key = data.get("tls.key")?.0.clone();
    (!cert.is_empty() && !key.is_empty()).then_some(Pem { cert, key })
}

/// Why a certificate could not be made, read or stored.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("CA key: {0}")]
    CaKey(#[source] std::str::Utf8Error),
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("Secret {0} has no tls.crt / tls.key")]
    Incomplete(String),
}

fn ca_params(validity: Duration) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut p, validity);
    Ok(p)
}

fn set_validity(p: &mut CertificateParams, validity: Duration) {
    let now = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(chrono::Utc::now().timestamp().max(0) as u64);
    // Backdated an hour for clock skew, as Kyverno does.
    p.not_before = now - Duration::from_secs(3600);
    p.not_after = now + validity;
}

fn not_after(validity: Duration) -> String {
    let t = chrono::Utc::now() + chrono::Duration::from_std(validity).unwrap_or(chrono::Duration::zero());
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn tls_secret(name: &str, namespace: &str, pem: &Pem, validity: Duration) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.to_string());
    s.metadata.namespace = Some(namespace.to_string());
    s.metadata.labels = Some(BTreeMap::from([(MANAGED_BY_LABEL.to_string(), "verno".to_string())]));
    s.metadata.annotations = Some(BTreeMap::from([(NOT_AFTER_ANNOTATION.to_string(), not_after(validity))]));
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some(BTreeMap::from([
        ("tls.crt".to_string(), ByteString(pem.cert.clone())),
        ("tls.key".to_string(), ByteString(pem.key.clone())),
    ]));
    s
}

/// A new self-signed CA.
pub fn new_ca(validity: Duration) -> Result<Pem, CertError> {
    let key = KeyPair::generate()?;
    let cert = ca_params(validity)?.self_signed(&key)?;
    Ok(Pem { cert: cert.pem().into_bytes(), key: key.serialize_pem().into_bytes() })
}

/// The PEM certificate blocks of a bundle, each ending in a newline.
fn pem_certificates(bundle: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bundle);
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        cur.push_str(line);
        cur.push('\n');
        if line.starts_with("-----END ") {
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

/// A new CA certificate for the key in `ca` (same subject), valid for `validity`.
fn reissue_ca(ca: &Pem, validity: Duration) -> Result<String, CertError> {
    let key = KeyPair::from_pem(std::str::from_utf8(&ca.key).map_err(CertError::CaKey)?)?;
    Ok(ca_params(validity)?.self_signed(&key)?.pem())
}

/// A serving pair for `dns_names` signed by the CA key in `ca`.
pub fn new_pair(ca: &Pem, dns_names: &[String], validity: Duration) -> Result<Pem, CertError> {
    let ca_key = KeyPair::from_pem(std::str::from_utf8(&ca.key).map_err(CertError::CaKey)?)?;
    // The issuer is named by its subject and identified by its key: re-deriving the parameters
    // with the same name and key signs certificates that chain to the stored CA certificate.
    let issuer = Issuer::new(ca_params(Duration::from_secs(3600))?, ca_key);
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(dns_names.to_vec())?;
    p.distinguished_name.push(DnType::CommonName, dns_names.last().map(String::as_str).unwrap_or("verno"));
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    set_validity(&mut p, validity);
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Pem { cert: cert.pem().into_bytes(), key: key.serialize_pem().into_bytes() })
}

/// Whether a managed Secret's certificate is in the last third of its life (or its expiry is
/// unknown).
fn needs_renewal(s: &Secret, validity: Duration) -> bool {
    let Some(at) = s.metadata.annotations.as_ref().and_then(|a| a.get(NOT_AFTER_ANNOTATION)) else { return true };
    let Ok(at) = chrono::DateTime::parse_from_rfc3339(at) else { return true };
    let left = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    left < chrono::Duration::from_std(validity / 3).unwrap_or(chrono::Duration::zero())
}

fn managed(s: &Secret) -> bool {
    s.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).is_some_and(|v| v == "verno")
}

/// The names annotation of a pair Secret (`None`: written before names were recorded; such a
/// pair is made again, once).
fn names_of(s: &Secret) -> Option<String> {
    s.metadata.annotations.as_ref().and_then(|a| a.get(NAMES_ANNOTATION)).cloned()
}

/// Creates a managed TLS Secret (`resource_version` `None`) or replaces it under that
/// resourceVersion, recording the `names` a serving pair was made for. `Ok(None)` when another
/// writer got there first (409): re-read next pass.
async fn write_secret(
    api: &Api<Secret>,
    name: &str,
    pem: &Pem,
    validity: Duration,
    resource_version: Option<String>,
    what: &str,
    names: Option<&str>,
) -> Result<Option<Secret>, CertError> {
    let mut secret = tls_secret(name, api.namespace().unwrap_or_default(), pem, validity);
    if let Some(n) = names {
        secret.metadata.annotations.get_or_insert_default().insert(NAMES_ANNOTATION.into(), n.to_string());
    }
    let result = match resource_version {
        None => api.create(&PostParams::default(), &secret).await,
        Some(rv) => {
            secret.metadata.resource_version = Some(rv);
            api.replace(name, &PostParams::default(), &secret).await
        }
    };
    match result {
        Ok(s) => {
            tracing::info!(secret = %name, "{what}");
            Ok(Some(s))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(CertError::Api(e)),
    }
}

/// Makes sure both Secrets exist and the serving pair is fresh (leader only). Returns how many
/// Secrets were written.
pub async fn ensure(client: &kube::Client, cfg: &CertConfig) -> Result<usize, CertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut writes = 0;
    let ca_name = cfg.ca_secret();
    let ca = match api.get_opt(&ca_name).await? {
        Some(s) => s,
        None => {
            match write_secret(&api, &ca_name, &new_ca(cfg.ca_validity)?, cfg.ca_validity, None, "CA created", None)
                .await?
            {
                Some(s) => {
                    writes += 1;
                    s
                }
                None => api.get(&ca_name).await?,
            }
        }
    };
    let mut ca_pem = pem_of(&ca).ok_or_else(|| CertError::Incomplete(ca_name.clone()))?;
    // CA renewal: a new certificate for the same key and subject, appended to the bundle. Leaves
    // signed under the old certificate verify against the new one and the other way round, so
    // there is no moment where the API server's caBundle and the serving pair disagree; the
    // bundle keeps the previous certificate for clients that cached it.
    if managed(&ca) && needs_renewal(&ca, cfg.ca_validity) {
        let mut bundle: Vec<String> = pem_certificates(&ca_pem.cert);
        bundle.push(reissue_ca(&ca_pem, cfg.ca_validity)?);
        // The newest two: the current one and its predecessor.
        let keep = bundle.split_off(bundle.len().saturating_sub(2));
        let next = Pem { cert: keep.concat().into_bytes(), key: ca_pem.key.clone() };
        if write_secret(
            &api,
            &ca_name,
            &next,
            cfg.ca_validity,
            ca.metadata.resource_version.clone(),
            "CA renewed (same key, appended to the bundle)",
            None,
        )
        .await?
        .is_some()
        {
            writes += 1;
            ca_pem = next;
        }
    }
    let pair_name = cfg.pair_secret();
    let (rv, what) = match api.get_opt(&pair_name).await? {
        None => (None, "serving certificate created"),
        Some(s) if managed(&s) && managed(&ca) && needs_renewal(&s, cfg.pair_validity) => {
            (s.metadata.resource_version, "serving certificate renewed")
        }
        Some(s) if managed(&s) && managed(&ca) && names_of(&s) != Some(cfg.names_annotation()) => {
            (s.metadata.resource_version, "serving certificate made for new names")
        }
        Some(_) => return Ok(writes),
    };
    let pem = new_pair(&ca_pem, &cfg.dns_names(), cfg.pair_validity)?;
    if write_secret(&api, &pair_name, &pem, cfg.pair_validity, rv, what, Some(&cfg.names_annotation())).await?.is_some()
    {
        writes += 1;
    }
    Ok(writes)
}

/// Every replica serves what the pair Secret holds (readiness waits for it); the CA Secret's
/// certificate is the webhooks' caBundle (the receiver). Both watches kick the leader pass.
pub fn follow(
    shared: &crate::runtime::Shared,
    cfg: &CertConfig,
    kick: &crate::runtime::Kick,
) -> (Vec<tokio::task::JoinHandle<()>>, tokio::sync::watch::Receiver<Option<String>>) {
    use crate::runtime::watch_named;
    use crate::serving::ReadyPart;
    let secrets: Api<Secret> = Api::namespaced(shared.client.clone(), &cfg.namespace);
    let server = shared.server.clone();
    let mut last: Option<Pem> = None;
    let pair =
        watch_named(secrets.clone(), Some(&cfg.pair_secret()), kick.clone(), shared.stop.clone(), move |s: &Secret| {
            let Some(pem) = pem_of(s) else { return };
            if last.as_ref() == Some(&pem) || s.metadata.deletion_timestamp.is_some() {
                return;
            }
            match server.set_certificate(&pem.cert, &pem.key) {
                Ok(()) => {
                    tracing::info!("serving certificate loaded from its Secret");
                    server.set_ready(ReadyPart::Certificate, true);
                    last = Some(pem);
                }
                Err(e) => {
                    tracing::error!(error = %e, "the serving certificate Secret is unusable; keeping the previous one")
                }
            }
        });
    let (ca_tx, ca_rx) = tokio::sync::watch::channel::<Option<String>>(None);
    let ca = watch_named(secrets, Some(&cfg.ca_secret()), kick.clone(), shared.stop.clone(), move |s: &Secret| {
        if let Some(pem) = pem_of(s) {
            let text = String::from_utf8_lossy(&pem.cert).into_owned();
            ca_tx.send_if_modified(|cur| {
                let changed = cur.as_deref() != Some(text.as_str());
                *cur = Some(text.clone());
                changed
            });
        }
    });
    (vec![pair, ca], ca_rx)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_pair_signed_from_the_stored_ca_key_verifies_against_the_stored_ca() {
        let ca = new_ca(Duration::from_secs(86400)).unwrap();
        let pair = new_pair(&ca, &["verno-svc.verno.svc".into()], Duration::from_secs(3600)).unwrap();
        // The key reads back and the certificate is PEM; that a client trusting only the CA
        // verifies it is exercised end to end in the in-cluster tests (crates/cli/tests).
        assert!(rcgen::KeyPair::from_pem(&String::from_utf8_lossy(&pair.key)).is_ok());
        assert!(String::from_utf8_lossy(&pair.cert).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(String::from_utf8_lossy(&ca.cert).contains("BEGIN CERTIFICATE"));
    }
}
