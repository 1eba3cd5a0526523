//! Kyverno's CEL `http` library in a cluster: `http.Get/Post` (and through
//! `http.Client(caBundle)`) to any URL a policy names, with Kyverno's guard against server-side
//! request forgery — a blocklist of hostnames and address ranges (Kyverno's defaults: the cloud
//! metadata addresses and names, and loopback; `--http-blocklist` replaces them) and an optional
//! allowlist of URL prefixes (`--http-allowlist`).
//!
//! The name is resolved here, every address it resolves to is checked against the blocked
//! ranges, and the connection goes to the checked address (no second lookup a DNS answer
//! could change). Redirects are not followed: a 3xx is the answer (Go's client follows them,
//! re-checking each hop; following one here would reach an address nobody checked).
//! Bounded: 10 s per call, the response limit of the cluster data.

use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The longest one call may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Kyverno's default blocklist (`pkg/toggle`): entries with a `/` are address ranges, the
/// others hostnames.
pub const DEFAULT_BLOCKLIST: &[&str] =
    &["169.254.169.254", "169.254.169.253", "metadata.google.internal", "127.0.0.0/8", "::1/128"];

/// An address range (`10.0.0.0/8`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
    text: String,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        fn masked(bits: u128, prefix: u8, width: u8) -> u128 {
            let shift = u32::from(width - prefix.min(width));
            if shift >= 128 { 0 } else { (bits >> shift) << shift }
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                masked(u128::from(u32::from(n)), self.prefix, 32) == masked(u128::from(u32::from(i)), self.prefix, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                masked(u128::from(n), self.prefix, 128) == masked(u128::from(i), self.prefix, 128)
            }
            // An IPv4 address written in IPv6 form is checked as IPv4, as Go's `IPNet.Contains`.
            (IpAddr::V4(_), IpAddr::V6(i)) => i.to_ipv4_mapped().is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            _ => false,
        }
    }
}

/// A bad `--http-blocklist` / `--http-allowlist` entry.
#[derive(Debug, thiserror::Error)]
pub enum HttpRulesError {
    #[error("invalid CIDR {0:?} in blocklist")]
    Cidr(String),
    #[error("invalid allowlist URL {0:?}: {1}")]
    Url(String, String),
    #[error("allowlist entry {0:?} must include scheme and host (e.g. https://api.example.com)")]
    Incomplete(String),
}

/// Where `http.*` may go.
#[derive(Debug, Clone)]
pub struct HttpRules {
    nets: Vec<Net>,
    hosts: Vec<String>,
    allowed: Vec<reqwest::Url>,
}

impl Default for HttpRules {
    fn default() -> HttpRules {
        let list: Vec<String> = DEFAULT_BLOCKLIST.iter().map(|s| s.to_string()).collect();
        // The defaults are valid: parsing them cannot fail.
        HttpRules::new(&list, &[]).unwrap_or(HttpRules { nets: Vec::new(), hosts: Vec::new(), allowed: Vec::new() })
    }
}

/// A hostname as compared: lower case, no trailing dot.
fn normal_host(h: &str) -> String {
    h.trim_end_matches('.').to_ascii_lowercase()
}

fn port(u: &reqwest::Url) -> Option<u16> {
    u.port_or_known_default()
}

impl HttpRules {
    /// Rules from a blocklist (ranges and hostnames) and an allowlist (URL prefixes).
    pub fn new(blocklist: &[String], allowlist: &[String]) -> Result<HttpRules, HttpRulesError> {
        let mut rules = HttpRules { nets: Vec::new(), hosts: Vec::new(), allowed: Vec::new() };
        for entry in blocklist.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if let Some((addr, prefix)) = entry.split_once('/') {
                let bad = || HttpRulesError::Cidr(entry.to_string());
                let addr: IpAddr = addr.parse().map_err(|_| bad())?;
                let prefix: u8 = prefix.parse().map_err(|_| bad())?;
                if prefix > if addr.is_ipv4() { 32 } else { 128 } {
                    return Err(bad());
                }
                rules.nets.push(Net { addr, prefix, text: entry.to_string() });
            } else {
                rules.hosts.push(normal_host(entry));
            }
        }
        for entry in allowlist.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let u = reqwest::Url::parse(entry).map_err(|e| HttpRulesError::Url(entry.to_string(), e.to_string()))?;
            if u.host_str().is_none_or(str::is_empty) {
                return Err(HttpRulesError::Incomplete(entry.to_string()));
            }
            rules.allowed.push(u);
        }
        Ok(rules)
    }

    /// The allowlist and the hostname blocklist, before anything is resolved (Kyverno's words).
    fn check_url(&self, raw: &str, u: &reqwest::Url) -> Result<(), String> {
        let host = normal_host(u.host_str().unwrap_or(""));
        if !self.allowed.is_empty() && !self.allowed.iter().any(|a| allows(a, u)) {
            return Err(format!("URL {raw:?} is not permitted: no matching allowlist entry"));
        }
        if self.hosts.contains(&host) {
            return Err(format!(
                "URL {raw:?} is blocked: hostname {:?} is on the blocklist",
                u.host_str().unwrap_or("")
            ));
        }
        Ok(())
    }

    fn blocked_by(&self, ip: IpAddr) -> Option<&Net> {
        self.nets.iter().find(|n| n.contains(ip))
    }
}

/// Whether an allowlist entry admits `u`: same scheme, host and port, and the path under the
/// entry's at a segment boundary.
fn allows(entry: &reqwest::Url, u: &reqwest::Url) -> bool {
    if entry.scheme() != u.scheme()
        || normal_host(entry.host_str().unwrap_or("")) != normal_host(u.host_str().unwrap_or(""))
        || port(entry) != port(u)
    {
        return false;
    }
    let p = entry.path();
    if p.is_empty() || p == "/" || u.path() == p {
        return true;
    }
    u.path().strip_prefix(p).is_some_and(|rest| p.ends_with('/') || rest.starts_with('/'))
}

/// One call: the answer as Kyverno shapes it, or the error text the policy sees.
pub async fn call(rules: &HttpRules, c: &verno_cel::HttpCall<'_>, max_bytes: usize) -> Result<Value, String> {
    let failed = |e: String| format!("request failed: {e}");
    let u = reqwest::Url::parse(c.url).map_err(|e| failed(format!("invalid URL: {e}")))?;
    rules.check_url(c.url, &u).map_err(failed)?;
    let verb = if c.method == "POST" { "Post" } else { "Get" };
    // Kyverno wraps a transport error twice: "request failed: request failed: Get \"url\": …".
    let transport = |e: String| format!("request failed: request failed: {verb} {:?}: {e}", c.url);
    if !matches!(u.scheme(), "http" | "https") {
        return Err(transport(format!("unsupported protocol scheme {:?}", u.scheme())));
    }
    let host = u.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']').to_string();
    let port = port(&u).unwrap_or(80);
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
            .await
            .map_err(|_| transport(format!("failed to resolve {host}: timeout")))?
            .map_err(|e| transport(format!("failed to resolve {host}: {e}")))?
            .collect(),
    };
    for a in &addrs {
        if let Some(net) = rules.blocked_by(a.ip()) {
            return Err(transport(format!(
                "connection to {host}:{port} blocked: IP {} falls in blocked range {}",
                a.ip(),
                net.text
            )));
        }
    }
    let first = *addrs.first().ok_or_else(|| transport(format!("no usable addresses resolved for {host}")))?;
    let roots = match c.ca_bundle.filter(|b| !b.trim().is_empty()) {
        None => None,
        // Kyverno's http library words every bundle error the same.
        Some(pem) => Some(
            crate::service_call::ca_roots(pem)
                .map_err(|_| failed("failed to parse PEM CA bundle for APICall".to_string()))?,
        ),
    };
    let client = verno_images::https_client(roots)
        .map_err(|e| failed(e.to_string()))?
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .resolve(&host, first)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let mut req = if c.method == "POST" { client.post(u) } else { client.get(u) };
    for (k, v) in c.headers {
        req = req.header(k, v);
    }
    if c.method == "POST" {
        let body = c.body.cloned().unwrap_or(Value::Null);
        // Go's json.Encoder ends the body with a newline.
        let mut bytes = serde_json::to_vec(&body).unwrap_or_default();
        bytes.push(b'\n');
        req = req.body(bytes);
    }
    let mut resp = req.send().await.map_err(|e| transport(e.to_string()))?;
    let status = resp.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e.to_string()))? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > max_bytes {
            return Err(failed(format!(
                "response length must be less than max allowed response length of {max_bytes}"
            )));
        }
    }
    // A body that is not JSON is `null`, as Kyverno decodes it.
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(match body {
        Value::Object(mut m) => {
            m.insert("statusCode".into(), json!(status));
            Value::Object(m)
        }
        other => json!({"body": other, "statusCode": status}),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails by panicking

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn get(url: &str) -> verno_cel::HttpCall<'_> {
        verno_cel::HttpCall { method: "GET", url, body: None, headers: &[], ca_bundle: None }
    }

    /// A server on loopback answering each connection with `answer`; its port and the
    /// requests it read.
    async fn server(answer: &'static str) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let resp =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len());
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn kyvernos_default_blocklist_refuses_loopback_and_metadata_addresses() {
        let rules = HttpRules::default();
        let (port, _) = server("{}").await;
        let url = format!("http://127.0.0.1:{port}/");
        let e = call(&rules, &get(&url), 1 << 20).await.unwrap_err();
        assert_eq!(
            e,
            format!(
                "request failed: request failed: Get \"{url}\": connection to 127.0.0.1:{port} blocked: IP 127.0.0.1 falls in blocked range 127.0.0.0/8"
            )
        );
        let e = call(&rules, &get("http://169.254.169.254/latest/meta-data"), 1 << 20).await.unwrap_err();
        assert_eq!(
            e,
            "request failed: URL \"http://169.254.169.254/latest/meta-data\" is blocked: hostname \"169.254.169.254\" is on the blocklist"
        );
        let e = call(&rules, &get("http://Metadata.Google.Internal./x"), 1 << 20).await.unwrap_err();
        assert!(e.contains("is on the blocklist"), "{e}");
        // `localhost` resolves to loopback: refused by range, after the lookup.
        let e = call(&rules, &get(&format!("http://localhost:{port}/")), 1 << 20).await.unwrap_err();
        assert!(e.contains("falls in blocked range"), "{e}");
    }

    #[tokio::test]
    async fn answers_carry_their_status_code_and_requests_their_headers_and_body() {
        let rules = HttpRules::new(&[], &[]).unwrap();
        let (port, mut seen) = server(r#"{"allowed": true}"#).await;
        let url = format!("http://127.0.0.1:{port}/check");
        let hs = vec![("X-Team".to_string(), "platform".to_string())];
        let body = json!({"image": "nginx"});
        let post = verno_cel::HttpCall { method: "POST", url: &url, body: Some(&body), headers: &hs, ca_bundle: None };
        assert_eq!(call(&rules, &post, 1 << 20).await, Ok(json!({"allowed": true, "statusCode": 200})));
        let req = seen.recv().await.unwrap().to_ascii_lowercase();
        assert!(req.starts_with("post /check "), "{req}");
        assert!(req.contains("x-team: platform"), "{req}");
        assert!(req.ends_with("{\"image\":\"nginx\"}\n"), "{req}");

        let (port, _) = server("[1, 2]").await;
        let url = format!("http://127.0.0.1:{port}/");
        assert_eq!(call(&rules, &get(&url), 1 << 20).await, Ok(json!({"body": [1, 2], "statusCode": 200})));
        let (port, _) = server("not json").await;
        let url = format!("http://127.0.0.1:{port}/");
        assert_eq!(call(&rules, &get(&url), 1 << 20).await, Ok(json!({"body": null, "statusCode": 200})));
        let (port, _) = server(r#"{"big": "0123456789012345678901234567890123456789"}"#).await;
        let url = format!("http://127.0.0.1:{port}/");
        let e = call(&rules, &get(&url), 16).await.unwrap_err();
        assert!(e.contains("max allowed response length of 16"), "{e}");
    }

    #[test]
    fn the_allowlist_admits_its_prefixes_at_segment_boundaries() {
        let rules = HttpRules::new(&[], &["https://api.example.com/v1".to_string()]).unwrap();
        let ok = |s: &str| rules.check_url(s, &reqwest::Url::parse(s).unwrap()).is_ok();
        assert!(ok("https://api.example.com/v1"));
        assert!(ok("https://API.example.com:443/v1/items"));
        assert!(!ok("https://api.example.com/v10/items"));
        assert!(!ok("http://api.example.com/v1"));
        assert!(!ok("https://other.example.com/v1"));
        assert!(HttpRules::new(&["10.0.0.0/33".to_string()], &[]).is_err());
        assert!(HttpRules::new(&[], &["/relative".to_string()]).is_err());
        let nets = HttpRules::new(&["10.0.0.0/8".to_string(), "fc00::/7".to_string()], &[]).unwrap();
        assert!(nets.blocked_by("10.1.2.3".parse().unwrap()).is_some());
        assert!(nets.blocked_by("11.0.0.1".parse().unwrap()).is_none());
        assert!(nets.blocked_by("fd00::1".parse().unwrap()).is_some());
        assert!(nets.blocked_by("::ffff:10.0.0.1".parse().unwrap()).is_some());
    }
}
