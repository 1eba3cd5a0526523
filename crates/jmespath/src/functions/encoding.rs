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
    f!("path_canonicalize", [S], "string", "normalizes a filesystem path", |c, a| Ok(Value::String(clean_path(
        str_arg(c, a, 0)?
    )))),
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
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageRefError {
    #[error("invalid reference format: {0:?}")]
    InvalidFormat(String),
    #[error("invalid reference format: repository name must be lowercase")]
    UppercaseRepository,
    #[error("unsupported digest algorithm: {0:?}")]
    UnsupportedDigestAlgorithm(String),
    #[error("invalid checksum digest length or format: {0:?}")]
    InvalidDigest(String),
}

/// Docker reference normalization: default registry `docker.io`, `library/` for official images,
/// tag `latest` when neither tag nor digest is given.
pub fn normalize_image(image: &str) -> Result<String, ImageRefError> {
    let invalid = || ImageRefError::InvalidFormat(image.to_string());
    if image.is_empty() || image.chars().any(char::is_whitespace) {
        return Err(invalid());
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let (name, tag) = match name_tag.rfind(':') {
        Some(i) if !name_tag[i + 1..].contains('/') => (&name_tag[..i], Some(&name_tag[i + 1..])),
        _ => (name_tag, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((d, rest)) if d.contains(['.', ':']) || d == "localhost" || d.chars().any(|c| c.is_ascii_uppercase()) => {
            (d.to_string(), rest.to_string())
        }
        Some(_) => ("docker.io".to_string(), name.to_string()),
        None => ("docker.io".to_string(), format!("library/{name}")),
    };
    let domain = if domain == "index.docker.io" { "docker.io".to_string() } else { domain };
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(ImageRefError::UppercaseRepository);
    }
    // The reference grammar's tag and digest (distribution's `reference` package, which
    // Kyverno parses images with): a digest is `algorithm:hex`, of the algorithm's length.
    if let Some(t) = tag {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let ok =
            t.len() <= 128 && t.chars().next().is_some_and(word) && t.chars().all(|c| word(c) || c == '.' || c == '-');
        if !ok {
            return Err(invalid());
        }
    }
    if let Some(d) = digest {
        let Some((algorithm, hex)) = d.split_once(':') else {
            return Err(invalid());
        };
        let length = match algorithm {
            "sha256" => 64,
            "sha384" => 96,
            "sha512" => 128,
            _ => return Err(ImageRefError::UnsupportedDigestAlgorithm(image.to_string())),
        };
        if !hex.chars().all(|c| c.is_ascii_hexdigit()) || hex.len() < 32 {
            return Err(invalid());
        }
        if hex.len() != length || hex.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(ImageRefError::InvalidDigest(image.to_string()));
        }
    }
    let mut out = format!("{domain}/{path}");
    match (tag, digest) {
        (Some(t), _) => {
            out.push(':');
            out.push_str(t);
        }
        (None, None) => out.push_str(":latest"),
        _ => {}
    }
    if let Some(d) = digest {
        out.push('@');
        out.push_str(d);
    }
    Ok(out)
}

fn is_external_url(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let s = str_arg(c, a, 0)?;
    let rest = s.split_once("://").map(|x| x.1).unwrap_or(s);
    let hostport = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = hostport.rsplit_once('@').map(|x| x.1).unwrap_or(hostport);
    let host = if let Some(h) = hostport.strip_prefix('[') {
        h.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return Err(RuntimeError::func(c.name, format!("invalid URL {s:?}")));
    }
    let ips: Vec<std::net::IpAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => c
            .env()
            .resolve_host(host)
            .ok_or_else(|| RuntimeError::func(c.name, format!("cannot resolve host {host:?} here")))?,
    };
    let internal = |ip: &std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v) => v.is_private() || v.is_loopback() || v.is_link_local() || v.is_unspecified(),
        std::net::IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || (v.segments()[0] & 0xfe00) == 0xfc00
                || (v.segments()[0] & 0xffc0) == 0xfe80
        }
    };
    Ok(Value::Bool(!ips.iter().any(internal)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_normalization() {
        assert_eq!(normalize_image("nginx").as_deref(), Ok("docker.io/library/nginx:latest"));
        assert_eq!(normalize_image("nginx:1.2").as_deref(), Ok("docker.io/library/nginx:1.2"));
        assert_eq!(normalize_image("ghcr.io/a/b:v1").as_deref(), Ok("ghcr.io/a/b:v1"));
        assert_eq!(normalize_image("localhost:5000/x").as_deref(), Ok("localhost:5000/x:latest"));
        let digest = format!("sha256:{}", "0a".repeat(32));
        assert_eq!(normalize_image(&format!("org/app@{digest}")), Ok(format!("docker.io/org/app@{digest}")));
        // The reference grammar refuses a digest that is not one (Kyverno's parser does).
        assert!(normalize_image("org/app@sha256:abc").is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(clean_path("/a/b/../c/./d/"), "/a/c/d");
        assert_eq!(clean_path("a//b"), "a/b");
        assert_eq!(clean_path(""), ".");
        assert_eq!(clean_path("/.."), "/");
    }
}
