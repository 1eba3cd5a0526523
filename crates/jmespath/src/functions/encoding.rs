//! Kyverno's encoding, parsing, data-shaping and image functions.

use super::{Arg, ArgType, Call, Function, S, str_arg, val};
use crate::error::RuntimeError;
use crate::semver;
use base64::Engine as _;
use serde_json::{Map, Value};
use sha2::Digest as _;

macro_rules! f {
    ($name:literal, [$($p:expr),*], $ret:literal, $note:literal, $imp:expr) => {
        Function { name: $name, params: &[$($p),*], variadic: false, returns: $ret, custom: true, note: $note, imp: $imp }
    };
}

const OBJ_OR_ARR: &[ArgType] = &[ArgType::Object, ArgType::Array];
const STR_OR_NUM: &[ArgType] = &[ArgType::String, ArgType::Number];

pub(crate) static FUNCTIONS: &[Function] = &[
    f!("base64_decode", [S], "string", "decodes a base 64 string", |c, a| {
        let s = str_arg(c, a, 0)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| RuntimeError::func(c.name, format!("illegal base64 data: {e}")))?;
        Ok(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    }),
    f!(
        "x509_decode",
        [S],
        "object",
        "decodes an x.509 certificate or certificate request (PEM, RSA keys) to an object",
        |c, a| super::x509::decode(str_arg(c, a, 0)?).map_err(|e| RuntimeError::func(c.name, e.to_string()))
    ),
    f!("base64_encode", [S], "string", "encodes a regular, plaintext and unencoded string to base64", |c, a| {
        Ok(Value::String(base64::engine::general_purpose::STANDARD.encode(str_arg(c, a, 0)?)))
    }),
    f!(
        "parse_json",
        [S],
        "any",
        "decodes a valid JSON encoded string to the appropriate type. Opposite of `to_string` function",
        |c, a| {
            serde_json::from_str(str_arg(c, a, 0)?)
                .map_err(|e| RuntimeError::func(c.name, format!("invalid JSON: {e}")))
        }
    ),
    f!(
        "parse_yaml",
        [S],
        "any",
        "decodes a valid YAML encoded string to the appropriate type provided it can be represented in JSON",
        |c, a| {
            crate::yaml::parse(str_arg(c, a, 0)?).map_err(|e| RuntimeError::func(c.name, format!("invalid YAML: {e}")))
        }
    ),
    f!(
        "lookup",
        [OBJ_OR_ARR, STR_OR_NUM],
        "any",
        "returns the value corresponding to the given key/index in the given object/array",
        lookup
    ),
    f!(
        "items",
        [OBJ_OR_ARR, S, S],
        "array",
        "converts a map or array to an array of objects where each key:value is an item in the array",
        items
    ),
    f!(
        "object_from_lists",
        [&[ArgType::Array], &[ArgType::Array]],
        "object",
        "converts a pair of lists containing keys and values to an object",
        |_, a| {
            let keys = val(a, 0).as_array().map(|x| x.as_slice()).unwrap_or_default();
            let vals = val(a, 1).as_array().map(|x| x.as_slice()).unwrap_or_default();
            let mut m = Map::new();
            for (i, k) in keys.iter().enumerate() {
                if let Some(k) = k.as_str() {
                    m.insert(k.to_string(), vals.get(i).cloned().unwrap_or(Value::Null));
                }
            }
            Ok(Value::Object(m))
        }
    ),
    // Kyverno's is Go's `filepath.Join` of the one path: the empty path stays empty (Clean
    // alone would make it ".").
    f!("path_canonicalize", [S], "string", "normalizes a filesystem path", |c, a| {
        let p = str_arg(c, a, 0)?;
        Ok(Value::String(if p.is_empty() { String::new() } else { clean_path(p) }))
    }),
    f!(
        "semver_compare",
        [S, S],
        "bool",
        "compares two strings which comply with the semantic versioning schema and outputs a boolean response as to the position of the second relative to the first",
        |c, a| {
            let v = semver::Version::parse(str_arg(c, a, 0)?).unwrap_or(semver::Version {
                major: 0,
                minor: 0,
                patch: 0,
                pre: vec![],
            });
            let r = str_arg(c, a, 1)?;
            semver::range_matches(r, &v)
                .map(Value::Bool)
                .ok_or_else(|| RuntimeError::func(c.name, format!("invalid semver range {r:?}")))
        }
    ),
    f!("image_normalize", [S], "string", "normalizes an image reference", |c, a| {
        normalize_image(str_arg(c, a, 0)?).map(Value::String).map_err(|e| RuntimeError::func(c.name, e.to_string()))
    }),
    f!("is_external_url", [S], "bool", "determines if the specified URL is external", is_external_url),
    f!("random", [S], "string", "Generates a random sequence of characters", |c, a| {
        let seed =
            c.env().random_seed().ok_or_else(|| RuntimeError::func(c.name, "random values are not available here"))?;
        crate::random::generate(str_arg(c, a, 0)?, seed)
            .map(Value::String)
            .map_err(|e| RuntimeError::func(c.name, e.to_string()))
    }),
    f!("sha256", [S], "string", "generate unique hash value for the given string", |c, a| Ok(Value::String(hex(
        &sha2::Sha256::digest(str_arg(c, a, 0)?.as_bytes())
    )))),
    f!("sha1", [S], "string", "generate unique hash value for the given string", |c, a| Ok(Value::String(hex(
        &sha1::Sha1::digest(str_arg(c, a, 0)?.as_bytes())
    )))),
    f!("md5", [S], "string", "generate unique hash value for the given string", |c, a| Ok(Value::String(hex(
        &md5::Md5::digest(str_arg(c, a, 0)?.as_bytes())
    )))),
];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn lookup(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    match (val(a, 0), val(a, 1)) {
        (Value::Object(o), Value::String(k)) => Ok(o.get(k).cloned().unwrap_or(Value::Null)),
        (Value::Array(arr), Value::Number(n)) => {
            let f = n.as_f64().unwrap_or(-1.0);
            if f.fract() != 0.0 {
                return Err(RuntimeError::arg(c.name, 2, "integer"));
            }
            if f < 0.0 {
                return Ok(Value::Null);
            }
            Ok(arr.get(f as usize).cloned().unwrap_or(Value::Null))
        }
        (Value::Object(_), _) => Err(RuntimeError::arg(c.name, 2, "string")),
        _ => Err(RuntimeError::arg(c.name, 2, "number")),
    }
}

fn items(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let kn = str_arg(c, a, 1)?;
    let vn = str_arg(c, a, 2)?;
    let mk = |k: Value, v: Value| {
        let mut m = Map::new();
        m.insert(kn.to_string(), k);
        m.insert(vn.to_string(), v);
        Value::Object(m)
    };
    Ok(Value::Array(match val(a, 0) {
        Value::Object(o) => o.iter().map(|(k, v)| mk(Value::String(k.clone()), v.clone())).collect(),
        Value::Array(arr) => arr.iter().enumerate().map(|(i, v)| mk(Value::from(i as i64), v.clone())).collect(),
        _ => Vec::new(),
    }))
}

/// Go's `filepath.Clean` (Unix separators).
pub(crate) fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return ".".into();
    }
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|s| *s != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// Why an image reference does not normalize, in the words of distribution's `reference`
/// package (which Kyverno parses images with); each quotes the reference.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageRefError {
    /// Kyverno's words: the reference it parsed (the default registry added), its settings,
    /// and the reference grammar's error (distribution's `reference` and `go-digest`).
    #[error("bad image: {full}, defaultRegistry: {DEFAULT_REGISTRY}, enableDefaultRegistryMutation: true: {reason}")]
    Bad { full: String, reason: &'static str },
}

/// The registry Kyverno adds to a reference without one (its default configuration).
const DEFAULT_REGISTRY: &str = "docker.io";

/// The reference grammar of distribution's `reference` package (which Kyverno parses images
/// with): `name[:tag][@digest]`, the name an optional `domain[:port]/` and `/`-separated
/// lowercase path components. Kept as that grammar's regular expression so the two accept the
/// same strings.
fn reference_grammar() -> &'static (regex::Regex, regex::Regex) {
    static GRAMMAR: std::sync::OnceLock<(regex::Regex, regex::Regex)> = std::sync::OnceLock::new();
    GRAMMAR.get_or_init(|| {
        let alphanumeric = "[a-z0-9]+";
        let separator = "(?:[._]|__|[-]+)";
        let component = format!("{alphanumeric}(?:{separator}{alphanumeric})*");
        let domain_component = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
        let host = format!(r"(?:{domain_component}(?:\.{domain_component})*|\[(?:[a-fA-F0-9:]+)\])");
        let domain = format!("{host}(?::[0-9]+)?");
        let remote = format!("{component}(?:/{component})*");
        let name = format!("(?:{domain}/)?{remote}");
        let tag = r"[\w][\w.-]{0,127}";
        let digest = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][[:xdigit:]]{32,}";
        let reference = format!("^({name})(?::({tag}))?(?:@({digest}))?$");
        let split = format!("^(?:({domain})/)?({remote})$");
        let compile =
            |p: &str| regex::Regex::new(p).unwrap_or_else(|e| unreachable!("the reference grammar compiles: {e}"));
        (compile(&reference), compile(&split))
    })
}

/// Kyverno's `image_normalize` (and its image infos): the default registry added when the
/// first part of the reference is not a registry, parsed by the reference grammar, printed as
/// `registry/path@digest` or `registry/path:tag` (`latest` when neither is given). No
/// `library/` is added: Kyverno parses without Docker's normalization.
pub fn normalize_image(image: &str) -> Result<String, ImageRefError> {
    let first = image.split_once('/').map(|(f, _)| f);
    let full = match first {
        Some(f) if f.contains(['.', ':']) || f == "localhost" || f.to_lowercase() != f => image.to_string(),
        _ => format!("{DEFAULT_REGISTRY}/{image}"),
    };
    let bad = |reason| ImageRefError::Bad { full: full.clone(), reason };
    let (reference, split) = reference_grammar();
    let Some(m) = reference.captures(&full) else {
        if full.is_empty() {
            return Err(bad("repository name must have at least one component"));
        }
        if reference.is_match(&full.to_lowercase()) {
            return Err(bad("repository name must be lowercase"));
        }
        return Err(bad("invalid reference format"));
    };
    let name = m.get(1).map_or("", |x| x.as_str());
    let (domain, path) = match split.captures(name) {
        Some(n) => (n.get(1).map_or("", |x| x.as_str()), n.get(2).map_or("", |x| x.as_str())),
        None => ("", name),
    };
    if path.len() > 255 {
        return Err(bad("repository name must not be more than 255 characters"));
    }
    if let Some(d) = m.get(3).map(|x| x.as_str()) {
        check_digest(d).map_err(bad)?;
    }
    let image = if domain.is_empty() { path.to_string() } else { format!("{domain}/{path}") };
    Ok(match (m.get(3), m.get(2)) {
        (Some(d), _) => format!("{image}@{}", d.as_str()),
        (None, Some(t)) => format!("{image}:{}", t.as_str()),
        (None, None) => format!("{image}:latest"),
    })
}

/// go-digest's checks of `algorithm:hex` (the grammar has already matched its shape).
fn check_digest(d: &str) -> Result<(), &'static str> {
    let (algorithm, hex) = d.split_once(':').unwrap_or((d, ""));
    let size = match algorithm {
        "sha256" => 32,
        "sha384" => 48,
        "sha512" => 64,
        _ => return Err("unsupported digest algorithm"),
    };
    if hex.len() != size * 2 {
        return Err("invalid checksum digest length");
    }
    if !hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
        return Err("invalid checksum digest format");
    }
    Ok(())
}

/// The host of a URL as Go's `url.Parse` finds it: only in an authority (`scheme://host…` or
/// `//host…`); "example.com/x" or "1.2.3" has none. `Err` for what Go refuses to parse.
fn url_host(s: &str) -> Result<&str, String> {
    let s = s.split('#').next().unwrap_or("");
    let mut rest = s;
    for (i, c) in s.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err(format!("parse {s:?}: missing protocol scheme")),
            ':' => {
                rest = s.get(i + 1..).unwrap_or("");
                break;
            }
            _ => break,
        }
    }
    let rest = rest.split('?').next().unwrap_or("");
    let Some(authority) = rest.strip_prefix("//") else { return Ok("") };
    let authority = authority.split('/').next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |x| x.1);
    Ok(match hostport.strip_prefix('[') {
        Some(h) => h.split(']').next().unwrap_or(""),
        None => hostport.split(':').next().unwrap_or(""),
    })
}

/// Kyverno's `is_external_url`: false when the URL's host (an address, or every address the
/// name resolves to) is a loopback or private one (Go's `IsLoopback`/`IsPrivate`: link-local
/// and unspecified addresses count as external, as there).
fn is_external_url(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let s = str_arg(c, a, 0)?;
    let host = url_host(s).map_err(RuntimeError::Other)?;
    let ips: Vec<std::net::IpAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![ip],
        // Go's resolver, asked for no name at all.
        Err(_) if host.is_empty() => return Err(RuntimeError::Other("lookup : no such host".into())),
        Err(_) => c
            .env()
            .resolve_host(host)
            .ok_or_else(|| RuntimeError::func(c.name, format!("cannot resolve host {host:?} here")))?,
    };
    let v4 = |v: &std::net::Ipv4Addr| v.is_private() || v.is_loopback();
    let internal = |ip: &std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v) => v4(v),
        std::net::IpAddr::V6(v) => match v.to_ipv4_mapped() {
            Some(m) => v4(&m),
            None => v.is_loopback() || (v.segments()[0] & 0xfe00) == 0xfc00,
        },
    };
    Ok(Value::Bool(!ips.iter().any(internal)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_has_a_host_only_in_an_authority_as_go_parses_it() {
        assert_eq!(url_host("https://user@example.com:8443/x?q#f"), Ok("example.com"));
        assert_eq!(url_host("//10.0.0.1/x"), Ok("10.0.0.1"));
        assert_eq!(url_host("http://[::1]:80/"), Ok("::1"));
        assert_eq!(url_host("example.com/x"), Ok(""));
        assert_eq!(url_host("1.25.3"), Ok(""));
        assert_eq!(url_host("mailto:a@b.c"), Ok(""));
        assert!(url_host(":x").is_err());
    }

    #[test]
    fn image_normalization() {
        // Kyverno adds the registry but not Docker's `library/` (found by the oracle).
        assert_eq!(normalize_image("nginx").as_deref(), Ok("docker.io/nginx:latest"));
        assert_eq!(normalize_image("nginx:1.2").as_deref(), Ok("docker.io/nginx:1.2"));
        assert_eq!(normalize_image("ghcr.io/a/b:v1").as_deref(), Ok("ghcr.io/a/b:v1"));
        assert_eq!(normalize_image("localhost:5000/x").as_deref(), Ok("localhost:5000/x:latest"));
        let digest = format!("sha256:{}", "0a".repeat(32));
        assert_eq!(normalize_image(&format!("org/app@{digest}")), Ok(format!("docker.io/org/app@{digest}")));
        // The reference grammar refuses a digest that is not one (Kyverno's parser does).
        assert!(normalize_image("org/app@sha256:abc").is_err());
        let reason = |i: &str| match normalize_image(i) {
            Err(ImageRefError::Bad { reason, .. }) => reason,
            Ok(v) => panic!("{i} gave {v}"),
        };
        assert_eq!(reason(&format!("a@sha256:{}", "0A".repeat(32))), "invalid checksum digest format");
        assert_eq!(reason(&format!("a@sha256:{}", "0a".repeat(20))), "invalid checksum digest length");
        assert_eq!(reason(&format!("a@md5:{}", "0a".repeat(16))), "unsupported digest algorithm");
        assert_eq!(reason(&format!("a/{}", "b".repeat(260))), "repository name must not be more than 255 characters");
        assert_eq!(reason("a b"), "invalid reference format");
    }

    #[test]
    fn paths() {
        assert_eq!(clean_path("/a/b/../c/./d/"), "/a/c/d");
        assert_eq!(clean_path("a//b"), "a/b");
        assert_eq!(clean_path(""), ".");
        assert_eq!(clean_path("/.."), "/");
    }
}
