//! Keyless certificates carry signed certificate timestamps: checked as cosign checks them
//! (before, any keyless check without `ctlog.ignoreSCT` failed, so a Kyverno policy written
//! with the defaults refused every signed image).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

mod rig;

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};
use rig::Key;
use sha2::Digest as _;
use verno_images::crypto::{Certificate, PublicKey, certificates};
use x509_parser::prelude::{FromDer, X509Certificate};

fn der(pem: &str) -> Certificate {
    certificates(pem).unwrap().remove(0)
}

/// A leaf under `root` signed as a CT log (`log`) would see it: the SCT over the certificate
/// without its SCT list, then the same certificate with the list embedded. `tamper` changes
/// the SCT's timestamp after signing.
fn leaf_with_sct(root: &rcgen::Issuer<'_, KeyPair>, root_spki: &[u8], log: &Key, tamper: bool) -> String {
    let leaf_key = KeyPair::generate().unwrap();
    let mut lp = CertificateParams::new(Vec::<String>::new()).unwrap();
    lp.distinguished_name.push(DnType::CommonName, "signer");
    lp.subject_alt_names = vec![SanType::Rfc822Name("signer@example.com".try_into().unwrap())];
    lp.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    lp.serial_number = Some(rcgen::SerialNumber::from(vec![1, 2, 3, 4]));
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    lp.not_before = now - time::Duration::days(1);
    lp.not_after = now + time::Duration::days(1);
    let pre = lp.signed_by(&leaf_key, root).unwrap();
    let (_, parsed) = X509Certificate::from_der(pre.der()).unwrap();
    let tbs = parsed.tbs_certificate.as_ref().to_vec();
    // What the log signs (RFC 6962 §3.2, a precertificate entry).
    let timestamp: u64 = 1_765_000_000_000;
    let mut msg = vec![0u8, 0u8];
    msg.extend(timestamp.to_be_bytes());
    msg.extend([0u8, 1u8]);
    msg.extend(sha2::Sha256::digest(root_spki));
    msg.extend(&(tbs.len() as u32).to_be_bytes()[1..]);
    msg.extend(&tbs);
    msg.extend([0u8, 0u8]);
    let sig = log.sign(&msg);
    let log_spki = pem::parse(&log.pem).unwrap().contents().to_vec();
    let mut sct = vec![0u8];
    sct.extend(sha2::Sha256::digest(&log_spki));
    sct.extend((if tamper { timestamp + 1 } else { timestamp }).to_be_bytes());
    sct.extend([0u8, 0u8, 4, 3]);
    sct.extend((sig.len() as u16).to_be_bytes());
    sct.extend(&sig);
    let mut list = ((sct.len() + 2) as u16).to_be_bytes().to_vec();
    list.extend((sct.len() as u16).to_be_bytes());
    list.extend(&sct);
    let mut octets = vec![0x04, list.len() as u8];
    octets.extend(&list);
    lp.custom_extensions.push(CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 11129, 2, 4, 2], octets));
    lp.signed_by(&leaf_key, root).unwrap().pem()
}

#[test]
fn an_embedded_sct_signed_by_a_known_log_is_accepted_and_others_are_not() {
    let root_key = KeyPair::generate().unwrap();
    let mut rp = CertificateParams::new(Vec::<String>::new()).unwrap();
    rp.distinguished_name.push(DnType::CommonName, "verno test fulcio");
    rp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root = rp.self_signed(&root_key).unwrap();
    let root_spki = pem::parse(root_key.public_key_pem()).unwrap().contents().to_vec();
    let issuer = rcgen::Issuer::new(rp, root_key);
    let log = Key::generate();
    let log_spki = pem::parse(&log.pem).unwrap().contents().to_vec();
    let logs = vec![(sha2::Sha256::digest(&log_spki).to_vec(), PublicKey::from_pem(&log.pem).unwrap())];
    let chain = vec![der(&root.pem())];

    let good = der(&leaf_with_sct(&issuer, &root_spki, &log, false));
    verno_images::sct::verify_embedded(&good, &chain, &logs).unwrap();

    // A timestamp changed after signing; a log nobody trusts; no issuer in the chain.
    let tampered = der(&leaf_with_sct(&issuer, &root_spki, &log, true));
    let e = verno_images::sct::verify_embedded(&tampered, &chain, &logs).unwrap_err();
    assert!(e.to_string().contains("no SCT of the certificate is signed by a known"), "{e}");
    let stranger = Key::generate();
    let stranger_spki = pem::parse(&stranger.pem).unwrap().contents().to_vec();
    let others = vec![(sha2::Sha256::digest(&stranger_spki).to_vec(), PublicKey::from_pem(&stranger.pem).unwrap())];
    assert!(verno_images::sct::verify_embedded(&good, &chain, &others).is_err());
    assert!(verno_images::sct::verify_embedded(&good, &[], &logs).unwrap_err().to_string().contains("issuer"));
    // A certificate without SCTs.
    let bare = rig::ca("signer@example.com", "https://issuer.example.com", false);
    let e = verno_images::sct::verify_embedded(&der(&bare.leaf_pem), &[der(&bare.root_pem)], &logs).unwrap_err();
    assert!(e.to_string().contains("no embedded SCT"), "{e}");
}
