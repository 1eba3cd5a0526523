//! Kubernetes' CEL URL library (`k8s.io/apiserver/pkg/cel/library/urls.go`), which every
//! Kyverno CEL kind has: `url(s)`, `isURL(s)`, and on a URL `getScheme()`, `getHost()`,
//! `getHostname()`, `getPort()`, `getEscapedPath()` and `getQuery()`.
//!
//! Kubernetes accepts what Go's `url.ParseRequestURI` accepts (an absolute URL, or an absolute
//! path), then reads it with `url.Parse` (which splits off a `#fragment`). Both are Go's
//! `net/url` rules, written here: schemes, userinfo, bracketed IPv6 hosts with RFC 6874 zones,
//! ports, percent-escapes and the characters allowed unescaped in each part, control
//! characters refused; for `http` and `https` only one colon outside brackets (Go 1.26 on,
//! as Kyverno builds). A URL is held as `{"@url": text}` (see `tagged`), the text being Go's
//! `URL.String()`, which is also how Kubernetes compares two URLs; the getters parse it again.

use crate::tagged::{Args, Ret, go_quote, no_overload, ret, str_value, string_at, tagged, untag, values};
use cel::common::types::{MAP_TYPE, STRING_TYPE};
use cel::objects::{Key, Map};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

const URL: &str = "@url";

/// The most `&`-separated parameters Go's `url.ParseQuery` reads (`urlmaxqueryparams`); a
/// query with more reads as none.
const MAX_QUERY_PARAMS: usize = 10_000;

/// The part of a URL a string is escaped or unescaped for (Go's `encoding` modes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
    QueryComponent,
    Fragment,
}

/// Whether `c` is written `%XX` in that part of a URL (RFC 3986, with Go's exceptions).
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    // A host's sub-delimiters, `:` for the port, brackets for IPv6, and `<`, `>`, `"`.
    let hostish = matches!(mode, Mode::Host | Mode::Zone);
    if hostish && b"!$&'()*+,;=:[]<>\"".contains(&c) {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => return false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => return c == b'?',
            Mode::UserPassword => return matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::QueryComponent => return true,
            Mode::Fragment => return false,
            Mode::Host | Mode::Zone => {}
        },
        _ => {}
    }
    !(mode == Mode::Fragment && matches!(c, b'!' | b'(' | b')' | b'*'))
}

/// `s` with its `%XX` escapes decoded (and `+` as a space in a query), checked as Go checks
/// each part: a host may escape only non-ASCII bytes (and `%25`), and holds no character that
/// needs escaping.
fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, String> {
    let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16)).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        match c {
            b'%' => {
                let escape = s.get(i..(i + 3).min(s.len())).unwrap_or_default();
                let (Some(hi), Some(lo)) = (hex(s.get(i + 1)), hex(s.get(i + 2))) else {
                    return Err(format!("invalid URL escape {}", go_quote(escape)));
                };
                let v = hi << 4 | lo;
                let percent = escape == b"%25";
                // RFC 3986: a host escapes only non-ASCII bytes; RFC 6874: `%25` is a zone's `%`.
                if mode == Mode::Host && hi < 8 && !percent {
                    return Err(format!("invalid URL escape {}", go_quote(escape)));
                }
                // A zone may escape only what it could also hold unescaped (and spaces).
                if mode == Mode::Zone && !percent && v != b' ' && should_escape(v, Mode::Host) {
                    return Err(format!("invalid URL escape {}", go_quote(escape)));
                }
                out.push(v);
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                    return Err(format!("invalid character {} in host name", go_quote(&[c])));
                }
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

fn escape(s: &[u8], mode: Mode) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s {
        if c == b' ' && mode == Mode::QueryComponent {
            out.push('+');
        } else if should_escape(c, mode) {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(c as char);
        }
    }
    out
}

/// Whether `s` is a valid escaped form for that part: nothing in it needs escaping (RFC 3986
/// sub-delimiters, `:`, `@`, brackets and `%` may stay).
fn valid_encoded(s: &str, mode: Mode) -> bool {
    s.bytes().all(|c| b"!$&'()*+,;=:@[]%".contains(&c) || !should_escape(c, mode))
}

/// `""` or `:` and digits.
fn valid_optional_port(port: &[u8]) -> bool {
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// A URL as Go's `net/url` holds it (decoded parts as bytes: an escape may decode to bytes that
/// are not UTF-8).
#[derive(Default, Debug, PartialEq)]
struct GoUrl {
    scheme: String,
    opaque: String,
    user: Option<(Vec<u8>, Option<Vec<u8>>)>,
    host: Vec<u8>,
    path: Vec<u8>,
    raw_path: String,
    raw_query: String,
    force_query: bool,
    fragment: Vec<u8>,
    raw_fragment: String,
    omit_host: bool,
}

/// Splits a leading `scheme:` off (`[A-Za-z][A-Za-z0-9+.-]*`); none when there is no valid one.
fn split_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((raw.get(..i).unwrap_or(""), raw.get(i + 1..).unwrap_or(""))),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// Go's `parse`: `via_request` accepts only absolute URLs and absolute paths
/// (`ParseRequestURI`); otherwise relative references too (`Parse`). The text has no fragment.
fn parse(raw: &str, via_request: bool) -> Result<GoUrl, String> {
    if raw.bytes().any(|b| b < b' ' || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let mut url = GoUrl::default();
    if raw == "*" {
        url.path = b"*".to_vec();
        return Ok(url);
    }
    let (scheme, mut rest) = split_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        url.force_query = true;
        rest = rest.get(..rest.len() - 1).unwrap_or("");
    } else if let Some((before, query)) = rest.split_once('?') {
        url.raw_query = query.to_string();
        rest = before;
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            // A rootless path (`mailto:a@b`) is opaque (RFC 3986).
            url.opaque = rest.to_string();
            return Ok(url);
        }
        if via_request {
            return Err("invalid URI for request".into());
        }
        // Not a malformed scheme (`cache_object:foo/bar`): RFC 3986 §3.3.
        if rest.split('/').next().is_some_and(|segment| segment.contains(':')) {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///")) && rest.starts_with("//") {
        let authority = rest.get(2..).unwrap_or("");
        let (authority, path) = authority.find('/').map_or((authority, ""), |i| authority.split_at(i));
        (url.user, url.host) = parse_authority(&url.scheme, authority)?;
        rest = path;
    } else if !url.scheme.is_empty() && rest.starts_with('/') {
        url.omit_host = true;
    }
    url.path = unescape(rest.as_bytes(), Mode::Path)?;
    url.raw_path = if escape(&url.path, Mode::Path) == rest { String::new() } else { rest.to_string() };
    Ok(url)
}

type User = Option<(Vec<u8>, Option<Vec<u8>>)>;

fn parse_authority(scheme: &str, authority: &str) -> Result<(User, Vec<u8>), String> {
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return Ok((None, parse_host(scheme, authority)?));
    };
    let host = parse_host(scheme, host)?;
    let valid = userinfo.chars().all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c));
    if !valid {
        return Err("net/url: invalid userinfo".into());
    }
    let user = match userinfo.split_once(':') {
        None => (unescape(userinfo.as_bytes(), Mode::UserPassword)?, None),
        Some((name, password)) => {
            (unescape(name.as_bytes(), Mode::UserPassword)?, Some(unescape(password.as_bytes(), Mode::UserPassword)?))
        }
    };
    Ok((Some(user), host))
}

/// `host[:port]`, decoded.
fn parse_host(scheme: &str, host: &str) -> Result<Vec<u8>, String> {
    match host.rfind('[') {
        Some(open) if open > 0 => return Err("invalid IP-literal".into()),
        Some(_) => {
            // An IP-literal (RFC 3986, RFC 6874): `[fe80::1]`, `[fe80::1%25en0]:80`.
            let Some(close) = host.rfind(']') else { return Err("missing ']' in host".into()) };
            let colon_port = host.get(close + 1..).unwrap_or("");
            if !valid_optional_port(colon_port.as_bytes()) {
                return Err(format!("invalid port {} after host", go_quote(colon_port.as_bytes())));
            }
            let hostname = host.get(1..close).unwrap_or("");
            // `%25` starts the zone, which may escape more than the address may.
            let mut unescaped = match hostname.find("%25") {
                Some(z) => {
                    let (addr, zone) = hostname.split_at(z);
                    let mut a = unescape(addr.as_bytes(), Mode::Host)?;
                    a.extend(unescape(zone.as_bytes(), Mode::Zone)?);
                    a
                }
                None => unescape(hostname.as_bytes(), Mode::Host)?,
            };
            // Only an IPv6 address may stand in brackets (RFC 3986).
            let (addr, _) = crate::net::parse_addr(&String::from_utf8_lossy(&unescaped))
                .map_err(|e| format!("invalid host: {e}"))?;
            if matches!(addr, crate::net::Addr::V4(_)) {
                return Err("invalid IP-literal".into());
            }
            unescaped.insert(0, b'[');
            unescaped.push(b']');
            unescaped.extend_from_slice(colon_port.as_bytes());
            return Ok(unescaped);
        }
        None => {
            if let (Some(first), Some(last)) = (host.find(':'), host.rfind(':')) {
                // RFC 3986 allows no colon in a host; Go keeps the last one as the port's, but
                // for http and https the first.
                let at = if first != last && scheme != "http" && scheme != "https" { last } else { first };
                let colon_port = host.get(at..).unwrap_or("");
                if !valid_optional_port(colon_port.as_bytes()) {
                    return Err(format!("invalid port {} after host", go_quote(colon_port.as_bytes())));
                }
            }
        }
    }
    unescape(host.as_bytes(), Mode::Host)
}

impl GoUrl {
    /// Go's `url.Parse`: a URL reference with an optional `#fragment`.
    fn parse_reference(raw: &str) -> Result<GoUrl, String> {
        let (before, fragment) = raw.split_once('#').unwrap_or((raw, ""));
        let mut url = parse(before, false).map_err(|e| format!("parse {}: {e}", go_quote(before.as_bytes())))?;
        if !fragment.is_empty() {
            url.fragment = unescape(fragment.as_bytes(), Mode::Fragment)
                .map_err(|e| format!("parse {}: {e}", go_quote(raw.as_bytes())))?;
            if escape(&url.fragment, Mode::Fragment) != fragment {
                url.raw_fragment = fragment.to_string();
            }
        }
        Ok(url)
    }

    /// Go's `url.ParseRequestURI`.
    fn parse_request_uri(raw: &str) -> Result<GoUrl, String> {
        parse(raw, true).map_err(|e| format!("parse {}: {e}", go_quote(raw.as_bytes())))
    }

    /// The path as written when that is a valid escaping of it, else escaped.
    fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty()
            && valid_encoded(&self.raw_path, Mode::Path)
            && unescape(self.raw_path.as_bytes(), Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == b"*" {
            return "*".into();
        }
        escape(&self.path, Mode::Path)
    }

    fn escaped_fragment(&self) -> String {
        if !self.raw_fragment.is_empty()
            && valid_encoded(&self.raw_fragment, Mode::Fragment)
            && unescape(self.raw_fragment.as_bytes(), Mode::Fragment).is_ok_and(|f| f == self.fragment)
        {
            return self.raw_fragment.clone();
        }
        escape(&self.fragment, Mode::Fragment)
    }

    /// Go's `URL.String()`.
    fn text(&self) -> String {
        let mut out = String::new();
        if !self.scheme.is_empty() {
            out.push_str(&self.scheme);
            out.push(':');
        }
        if !self.opaque.is_empty() {
            out.push_str(&self.opaque);
        } else {
            let has_authority = !self.scheme.is_empty() || !self.host.is_empty() || self.user.is_some();
            if has_authority && !(self.omit_host && self.host.is_empty() && self.user.is_none()) {
                if !self.host.is_empty() || !self.path.is_empty() || self.user.is_some() {
                    out.push_str("//");
                }
                if let Some((name, password)) = &self.user {
                    out.push_str(&escape(name, Mode::UserPassword));
                    if let Some(p) = password {
                        out.push(':');
                        out.push_str(&escape(p, Mode::UserPassword));
                    }
                    out.push('@');
                }
                out.push_str(&escape(&self.host, Mode::Host));
            }
            let path = self.escaped_path();
            if !path.is_empty() && !path.starts_with('/') && !self.host.is_empty() {
                out.push('/');
            }
            // A first segment with a colon would read as a scheme (RFC 3986 §4.2).
            if out.is_empty() && path.split('/').next().is_some_and(|s| s.contains(':')) {
                out.push_str("./");
            }
            out.push_str(&path);
        }
        if self.force_query || !self.raw_query.is_empty() {
            out.push('?');
            out.push_str(&self.raw_query);
        }
        if !self.fragment.is_empty() {
            out.push('#');
            out.push_str(&self.escaped_fragment());
        }
        out
    }

    /// The host and the port (`Hostname()`, `Port()`): a valid `:port` is split off the end,
    /// and brackets around an IPv6 address dropped.
    fn host_port(&self) -> (&[u8], &[u8]) {
        let (mut host, mut port): (&[u8], &[u8]) = (&self.host, b"");
        if let Some(colon) = host.iter().rposition(|b| *b == b':')
            && valid_optional_port(host.get(colon..).unwrap_or_default())
        {
            (host, port) = (host.get(..colon).unwrap_or_default(), host.get(colon + 1..).unwrap_or_default());
        }
        if let Some(inner) = host.strip_prefix(b"[").and_then(|h| h.strip_suffix(b"]")) {
            host = inner;
        }
        (host, port)
    }

    /// Go's `URL.Query()`: `url.ParseQuery` of the raw query, malformed pairs left out (a pair
    /// with `;`, or an invalid escape), nothing when there are too many pairs.
    fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        if self.raw_query.matches('&').count() + 1 > MAX_QUERY_PARAMS {
            return out;
        }
        for pair in self.raw_query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Ok(key), Ok(value)) =
                (unescape(key.as_bytes(), Mode::QueryComponent), unescape(value.as_bytes(), Mode::QueryComponent))
            else {
                continue;
            };
            let (key, value) = (lossy(&key), lossy(&value));
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => out.push((key, vec![value])),
            }
        }
        out
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Kubernetes' check and read of a URL: `url.ParseRequestURI` decides, `url.Parse` reads (the
/// first would keep a fragment in the path or query).
fn parse_url(s: &str) -> Result<GoUrl, String> {
    let context = |e: String| format!("URL parse error during conversion from string: {e}");
    GoUrl::parse_request_uri(s).map_err(context)?;
    GoUrl::parse_reference(s).map_err(context)
}

fn url<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let u = parse_url(string_at(&v, 0, "url")?).map_err(|e| ExecutionError::function_error("url", e))?;
    ret(tagged(URL, u.text()))
}

fn is_url<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    ret(Value::Bool(GoUrl::parse_request_uri(string_at(&v, 0, "isURL")?).is_ok()))
}

/// A getter of a URL.
fn getter<'b, 'v>(args: &[cel::common::value::CowVal<'b, 'v>], f: &str, get: fn(&GoUrl) -> Value) -> Ret<'b, 'v> {
    let v = values(args)?;
    // The text is a URL's `String()`, which parses back to the same URL.
    match v.first().and_then(|u| untag(u, URL)).map(GoUrl::parse_reference) {
        Some(Ok(u)) => ret(get(&u)),
        Some(Err(e)) => Err(ExecutionError::function_error(f, e)),
        None => Err(no_overload(f, &v)),
    }
}

fn get_scheme<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getScheme", |u| str_value(u.scheme.clone()))
}

fn get_host<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getHost", |u| str_value(lossy(&u.host)))
}

fn get_hostname<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getHostname", |u| str_value(lossy(u.host_port().0)))
}

fn get_port<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getPort", |u| str_value(lossy(u.host_port().1)))
}

fn get_escaped_path<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getEscapedPath", |u| str_value(u.escaped_path()))
}

fn get_query<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    getter(&args, "getQuery", |u| {
        let map: HashMap<Key, Value> = u
            .query()
            .into_iter()
            .map(|(k, vs)| (Key::String(Arc::new(k)), Value::List(Arc::new(vs.into_iter().map(str_value).collect()))))
            .collect();
        Value::Map(Map { map: Arc::new(map) })
    })
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], url)?;
    env.add_overload("isURL", "is_url_string", vec![STRING_TYPE], is_url)?;
    env.add_member_overload("getScheme", "url_get_scheme", MAP_TYPE, vec![], get_scheme)?;
    env.add_member_overload("getHost", "url_get_host", MAP_TYPE, vec![], get_host)?;
    env.add_member_overload("getHostname", "url_get_hostname", MAP_TYPE, vec![], get_hostname)?;
    env.add_member_overload("getPort", "url_get_port", MAP_TYPE, vec![], get_port)?;
    env.add_member_overload("getEscapedPath", "url_get_escaped_path", MAP_TYPE, vec![], get_escaped_path)?;
    env.add_member_overload("getQuery", "url_get_query", MAP_TYPE, vec![], get_query)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each getter gives.
    fn getters(u: &GoUrl) -> Vec<String> {
        let (h, p) = u.host_port();
        let mut q = u.query();
        q.sort();
        vec![u.scheme.clone(), lossy(&u.host), lossy(h), lossy(p), u.escaped_path(), format!("{q:?}")]
    }

    /// The text a URL is held as reads back to the same URL: the getters answer as they would
    /// on the URL Kubernetes parsed.
    #[test]
    fn the_held_text_reads_back_to_the_same_url() {
        for s in [
            "https://user:p%40ss@example.com:8443/a%2Fb/c d?x=1&y=%zz&x=2#frag%20ment",
            "http://[fe80::1%25en0]:80/p",
            "http://[fe80::1%25en%20x]/",
            "http://h%C3%BC.com/%7e/~?q",
            "http://%C3%BC.com/",
            "mailto:a@b.c?subject=hi#x#y",
            "http:/only/path",
            "http:///triple",
            "/relative/path?q=1",
            "*",
            "http://a/b?",
            "foo://a:1:2/x;y=z",
            "https://a.com/%2e%2E/x#a%23b",
        ] {
            let parsed = parse_url(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            let again = GoUrl::parse_reference(&parsed.text()).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(getters(&parsed), getters(&again), "{s} → {}", parsed.text());
            assert_eq!(parsed.text(), again.text(), "{s}");
        }
    }

    #[test]
    fn escaping_follows_gos_table() {
        assert_eq!(escape(b"a b/c?d", Mode::Path), "a%20b/c%3Fd");
        assert_eq!(escape(b"a b&c", Mode::QueryComponent), "a+b%26c");
        assert_eq!(escape("ü:@".as_bytes(), Mode::UserPassword), "%C3%BC%3A%40");
        assert_eq!(escape(b"[::1%en0]:80", Mode::Host), "[::1%25en0]:80");
        assert_eq!(unescape(b"a%20b+c", Mode::QueryComponent), Ok(b"a b c".to_vec()));
        assert_eq!(unescape(b"a%2", Mode::Path), Err(r#"invalid URL escape "%2""#.to_string()));
        assert_eq!(unescape(b"a%41", Mode::Host), Err(r#"invalid URL escape "%41""#.to_string()));
        assert_eq!(unescape(b"a b", Mode::Host), Err(r#"invalid character " " in host name"#.to_string()));
    }
}
