//! A real registry for tests: Debian's `docker-registry` on a free loopback port (plain HTTP,
//! optionally htpasswd auth), images pushed with `skopeo` from OCI layouts written here, and
//! cosign-format signatures and attestations made and pushed by this code (ring and rcgen).
//! `scripts/install-registry.sh` installs the two tools when they are missing.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods
)] // test code fails by panicking

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub fn sha(b: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(b))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Installs docker-registry and skopeo when they are missing (the project's script).
pub fn ensure_tools() {
    let have = |t: &str| {
        Command::new("sh").arg("-c").arg(format!("command -v {t}")).output().is_ok_and(|o| o.status.success())
    };
    if have("docker-registry") && have("skopeo") {
        return;
    }
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/install-registry.sh"))
        .output()
        .expect("run install-registry.sh");
    assert!(
        out.status.success(),
        "scripts/install-registry.sh could not install docker-registry and skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running registry; killed when dropped.
pub struct Registry {
    pub addr: String,
    pub dir: tempfile::TempDir,
    child: Child,
    pub creds: Option<(String, String)>,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

impl Registry {
    /// Starts a registry; with `creds`, every request needs them (htpasswd, bcrypt).
    pub fn start(creds: Option<(&str, &str)>) -> Registry {
        ensure_tools();
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
            dir.path().join("data").display()
        );
        if let Some((u, p)) = creds {
            let hash = bcrypt::hash(p, 5).expect("bcrypt");
            std::fs::write(dir.path().join("htpasswd"), format!("{u}:{hash}\n")).expect("htpasswd");
            config.push_str(&format!(
                "auth: {{htpasswd: {{realm: basic-realm, path: {}}}}}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config).expect("config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let addr = format!("127.0.0.1:{port}");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        // The project's reqwest has no TLS provider of its own; the rig speaks plain HTTP.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let reg = Registry { addr, dir, child, creds: creds.map(|(u, p)| (u.into(), p.into())), rt, http };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = reg.rt.block_on(reg.http.get(format!("http://{}/v2/", reg.addr)).send()).is_ok();
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "docker-registry did not start on {}", reg.addr);
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    /// The registry process (a static registry is never dropped: kill it by pid).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn req(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url);
        match &self.creds {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    /// Uploads a blob (monolithic) and returns its digest.
    pub fn put_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = sha(bytes);
        self.rt.block_on(async {
            let start = self
                .req(reqwest::Method::POST, &format!("http://{}/v2/{repo}/blobs/uploads/", self.addr))
                .send()
                .await
                .expect("upload");
            assert_eq!(start.status().as_u16(), 202, "start upload");
            let loc = start.headers().get("location").and_then(|l| l.to_str().ok()).expect("location").to_string();
            let url = if loc.starts_with("http") { loc } else { format!("http://{}{loc}", self.addr) };
            let sep = if url.contains('?') { '&' } else { '?' };
            let done = self
                .req(reqwest::Method::PUT, &format!("{url}{sep}digest={digest}"))
                .header("Content-Type", "application/octet-stream")
                .body(bytes.to_vec())
                .send()
                .await
                .expect("put blob");
            assert_eq!(done.status().as_u16(), 201, "put blob");
        });
        digest
    }

    /// Stores a manifest under a tag (or digest) and returns its digest.
    pub fn put_manifest(&self, repo: &str, reference: &str, manifest: &Value) -> String {
        let bytes = serde_json::to_vec(manifest).expect("json");
        let media = manifest
            .get("mediaType")
            .and_then(Value::as_str)
            .unwrap_or("application/vnd.oci.image.manifest.v1+json")
            .to_string();
        self.rt.block_on(async {
            let r = self
                .req(reqwest::Method::PUT, &format!("http://{}/v2/{repo}/manifests/{reference}", self.addr))
                .header("Content-Type", media)
                .body(bytes.clone())
                .send()
                .await
                .expect("put manifest");
            assert_eq!(r.status().as_u16(), 201, "put manifest: {:?}", r.text().await);
        });
        sha(&bytes)
    }

    /// Pushes a one-layer image with skopeo (from an OCI layout written here); returns the
    /// manifest digest. `content` makes images differ.
    pub fn push_image(&self, repo: &str, tag: &str, content: &str) -> String {
        let layout = self.dir.path().join(format!("layout-{}", repo.replace('/', "-")));
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("layout");
        let write = |bytes: &[u8]| {
            let d = sha(bytes);
            std::fs::write(blobs.join(d.trim_start_matches("sha256:")), bytes).expect("blob");
            (d, bytes.len())
        };
        // An uncompressed tar: one 512-byte header-less block of content, then the two zero blocks.
        let mut layer = content.as_bytes().to_vec();
        layer.resize(512 * 3, 0);
        let (ld, ls) = write(&layer);
        let config = json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [ld]}, "config": {}});
        let (cd, cs) = write(&serde_json::to_vec(&config).expect("config"));
        let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ls}]});
        let mbytes = serde_json::to_vec(&manifest).expect("manifest");
        let (md, ms) = write(&mbytes);
        std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
        let index = json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms, "annotations": {"org.opencontainers.image.ref.name": tag}}]});
        std::fs::write(layout.join("index.json"), index.to_string()).expect("index");
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"]);
        if let Some((u, p)) = &self.creds {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        cmd.arg(format!("oci:{}:{tag}", layout.display())).arg(format!("docker://{}/{repo}:{tag}", self.addr));
        let out = cmd.output().expect("skopeo");
        assert!(out.status.success(), "skopeo copy: {}", String::from_utf8_lossy(&out.stderr));
        md
    }

    /// Appends layers to the `sha256-<hex>.<suffix>` manifest of `digest` (cosign's layout).
    fn add_layers(&self, repo: &str, digest: &str, suffix: &str, layers: Vec<Value>) {
        let tag = format!("{}.{suffix}", digest.replacen(':', "-", 1));
        let existing: Vec<Value> = self.rt.block_on(async {
            let r = self
                .req(reqwest::Method::GET, &format!("http://{}/v2/{repo}/manifests/{tag}", self.addr))
                .header("Accept", "application/vnd.oci.image.manifest.v1+json")
                .send()
                .await
                .expect("get");
            if r.status().as_u16() != 200 {
                return Vec::new();
            }
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap_or_default()).unwrap_or_default();
            v.get("layers").and_then(Value::as_array).cloned().unwrap_or_default()
        });
        let config = self.put_blob(repo, b"{}");
        let mut all = existing;
        all.extend(layers);
        let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": all});
        self.put_manifest(repo, &tag, &manifest);
    }
}

/// A P-256 signing key and its PEM public key.
pub struct Key {
    pub pair: EcdsaKeyPair,
    pub pem: String,
}

impl Key {
    pub fn generate() -> Key {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("key");
        Key::from_pkcs8(pkcs8.as_ref())
    }

    pub fn from_pkcs8(der: &[u8]) -> Key {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der, &SystemRandom::new()).expect("pkcs8");
        // SubjectPublicKeyInfo for id-ecPublicKey / prime256v1, then the point.
        let mut spki = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
            0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ];
        spki.extend_from_slice(pair.public_key().as_ref());
        let body = b64(&spki);
        let lines: Vec<&str> = body.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or("")).collect();
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", lines.join("\n"));
        Key { pair, pem }
    }

    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.pair.sign(&SystemRandom::new(), msg).expect("sign").as_ref().to_vec()
    }
}

/// How to sign: with a bare key, or with a certificate (and chain) in the annotations.
#[derive(Default, Clone)]
pub struct SignOpts {
    pub optional: Option<Value>,
    pub cert: Option<String>,
    pub chain: Option<String>,
    /// Sign a payload for this digest instead of the image's (a wrong-digest claim).
    pub claim_digest: Option<String>,
    /// Store a payload that differs from the signed one.
    pub tamper: bool,
    pub bundle: Option<String>,
    /// Log the signature in a (test) transparency log: a Rekor bundle signed by this key.
    pub rekor: Option<std::sync::Arc<Key>>,
}

/// A Rekor bundle for a signature over `payload`: the entry (a hashedrekord body) and its signed
/// entry timestamp, Rekor's signature over the canonical JSON of the entry.
pub fn rekor_bundle(rekor: &Key, payload: &[u8], sig: &[u8]) -> String {
    let body = json!({"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
        "data": {"hash": {"algorithm": "sha256", "value": sha(payload).trim_start_matches("sha256:")}},
        "signature": {"content": b64(sig)}}});
    // Keys in canonical (sorted) order.
    let entry = format!(
        r#"{{"body":"{}","integratedTime":{},"logID":"{}","logIndex":{}}}"#,
        b64(body.to_string().as_bytes()),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "c0ffee",
        42
    );
    let set = rekor.sign(entry.as_bytes());
    let payload: Value = serde_json::from_str(&entry).expect("entry");
    json!({"SignedEntryTimestamp": b64(&set), "Payload": payload}).to_string()
}

/// Adds a cosign signature of `digest` to `repo` (under `sha256-<hex>.sig`).
pub fn sign(reg: &Registry, repo: &str, digest: &str, key: &Key, opts: &SignOpts) -> Vec<u8> {
    let claim = opts.claim_digest.clone().unwrap_or_else(|| digest.to_string());
    let payload = json!({"critical": {"identity": {"docker-reference": format!("{}/{repo}", reg.addr)},
        "image": {"docker-manifest-digest": claim}, "type": "cosign container image signature"},
        "optional": opts.optional.clone().unwrap_or(Value::Null)});
    let bytes = serde_json::to_vec(&payload).expect("payload");
    let sig = key.sign(&bytes);
    let stored = if opts.tamper {
        let mut t = payload.clone();
        t["optional"] = json!({"tampered": "yes"});
        serde_json::to_vec(&t).expect("payload")
    } else {
        bytes.clone()
    };
    let blob = reg.put_blob(repo, &stored);
    let mut ann = json!({"dev.cosignproject.cosign/signature": b64(&sig)});
    if let Some(c) = &opts.cert {
        ann["dev.sigstore.cosign/certificate"] = json!(c);
        ann["dev.sigstore.cosign/chain"] = json!(opts.chain.clone().unwrap_or_default());
    }
    if let Some(b) = &opts.bundle {
        ann["dev.sigstore.cosign/bundle"] = json!(b);
    }
    if let Some(r) = &opts.rekor {
        ann["dev.sigstore.cosign/bundle"] = json!(rekor_bundle(r, &bytes, &sig));
    }
    reg.add_layers(
        repo,
        digest,
        "sig",
        vec![json!({"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
        "digest": blob, "size": stored.len(), "annotations": ann})],
    );
    sig
}

/// Adds an in-toto attestation (a DSSE envelope) of `digest` to `repo` (under `.att`).
pub fn attest(reg: &Registry, repo: &str, digest: &str, key: &Key, predicate_type: &str, predicate: Value) {
    let statement = json!({"_type": "https://in-toto.io/Statement/v0.1", "predicateType": predicate_type,
        "subject": [{"name": format!("{}/{repo}", reg.addr), "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
        "predicate": predicate});
    let body = serde_json::to_vec(&statement).expect("statement");
    let ptype = "application/vnd.in-toto+json";
    let mut pae = format!("DSSEv1 {} {ptype} {} ", ptype.len(), body.len()).into_bytes();
    pae.extend_from_slice(&body);
    let env = json!({"payloadType": ptype, "payload": b64(&body), "signatures": [{"keyid": "", "sig": b64(&key.sign(&pae))}]});
    let bytes = serde_json::to_vec(&env).expect("envelope");
    let blob = reg.put_blob(repo, &bytes);
    reg.add_layers(repo, digest, "att", vec![json!({"mediaType": "application/vnd.dsse.envelope.v1+json",
        "digest": blob, "size": bytes.len(), "annotations": {"predicateType": predicate_type, "dev.cosignproject.cosign/signature": ""}})]);
}

/// A root → leaf certificate pair for code signing, the leaf with an e-mail SAN and Fulcio's
/// issuer extension; `days` of validity for the leaf (negative: already expired).
pub struct Ca {
    pub root_pem: String,
    pub leaf_pem: String,
    pub leaf: Key,
}

pub fn ca(email: &str, issuer: &str, expired: bool) -> Ca {
    use rcgen::{
        BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
    };
    let root_key = KeyPair::generate().expect("root key");
    let mut rp = CertificateParams::new(Vec::<String>::new()).expect("params");
    rp.distinguished_name.push(DnType::CommonName, "verno test root");
    rp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root = rp.self_signed(&root_key).expect("root");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let mut lp = CertificateParams::new(Vec::<String>::new()).expect("params");
    lp.distinguished_name.push(DnType::CommonName, "signer");
    lp.subject_alt_names = vec![SanType::Rfc822Name(email.try_into().expect("email"))];
    lp.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    lp.custom_extensions =
        vec![CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 57264, 1, 1], issuer.as_bytes().to_vec())];
    let now = time_now();
    if expired {
        lp.not_before = now - time::Duration::days(30);
        lp.not_after = now - time::Duration::days(1);
    } else {
        lp.not_before = now - time::Duration::days(1);
        lp.not_after = now + time::Duration::days(3650);
    }
    let issuer_cert = rcgen::Issuer::new(rp, root_key);
    let leaf = lp.signed_by(&leaf_key, &issuer_cert).expect("leaf");
    Ca { root_pem: root.pem(), leaf_pem: leaf.pem(), leaf: Key::from_pkcs8(&leaf_key.serialize_der()) }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}
