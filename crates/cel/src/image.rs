//! Kyverno's image library: `image(ref)` parses an OCI image reference, read with
//! `.registry()`, `.repository()`, `.tag()`, `.digest()`, `.identifier()` and
//! `.containsDigest()`; `isImage(ref)` says whether it parses (also named
//! `parseImageReference` and `isImageReference`, as Kyverno's newer library). Docker Hub conventions apply, as
//! in go-containerregistry: no registry means `index.docker.io`, a single-segment repository is
//! under `library/`, no tag and no digest means `latest`.
//!
//! The parsed image is a map with those fields, so it also prints and compares as one.

use cel::common::types::{MAP_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::objects::{Key, Map};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

pub struct Parsed {
    pub registry: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
}

/// Why a string is not an image reference.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    /// Empty, or with white space (quoted in the message).
    #[error("could not parse reference: {0:?}")]
    Malformed(String),
    /// The repository is empty or has characters a repository may not.
    #[error("could not parse reference: {0}")]
    InvalidRepository(String),
}

pub fn parse(reference: &str) -> Result<Parsed, ImageError> {
    if reference.is_empty() || reference.chars().any(char::is_whitespace) {
        return Err(ImageError::Malformed(reference.to_string()));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((r, d)) => (r, d.to_string()),
        None => (reference, String::new()),
    };
    // A tag is after the last ':' that comes after the last '/'.
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], rest[slash + i + 1..].to_string()),
        None => (rest, String::new()),
    };
    let (registry, repo) = match name.split_once('/') {
        Some((first, more)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            (first.to_string(), more.to_string())
        }
        _ => ("index.docker.io".to_string(), name.to_string()),
    };
    let registry = if registry == "docker.io" { "index.docker.io".to_string() } else { registry };
    let repository =
        if registry == "index.docker.io" && !repo.contains('/') { format!("library/{repo}") } else { repo };
    let valid_repo = !repository.is_empty()
        && repository.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c));
    if !valid_repo {
        return Err(ImageError::InvalidRepository(reference.to_string()));
    }
    let tag = if tag.is_empty() && digest.is_empty() { "latest".to_string() } else { tag };
    Ok(Parsed { registry, repository, tag, digest })
}

fn string_arg(args: &[CowVal<'_, '_>], f: &str) -> Result<String, ExecutionError> {
    match args.first().map(|a| Value::try_from(&**a)) {
        Some(Ok(Value::String(s))) => Ok(s.to_string()),
        _ => Err(ExecutionError::function_error(f, "expected a string")),
    }
}

fn out<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn image<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let r = string_arg(&args, "image")?;
    let p = parse(&r).map_err(|e| ExecutionError::function_error("image", e))?;
    let identifier = if p.digest.is_empty() { p.tag.clone() } else { p.digest.clone() };
    let mut m: HashMap<Key, Value> = HashMap::new();
    for (k, v) in [
        ("registry", p.registry),
        ("repository", p.repository),
        ("tag", p.tag),
        ("digest", p.digest),
        ("identifier", identifier),
    ] {
        m.insert(Key::String(Arc::new(k.to_string())), Value::String(Arc::new(v)));
    }
    out(Value::Map(Map { map: Arc::new(m) }))
}

fn is_image<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    out(Value::Bool(parse(&string_arg(&args, "isImage")?).is_ok()))
}

fn field(args: &[CowVal<'_, '_>], name: &str) -> Result<Value, ExecutionError> {
    match args.first().map(|a| Value::try_from(&**a)) {
        Some(Ok(Value::Map(m))) => m
            .map
            .get(&Key::String(Arc::new(name.to_string())))
            .cloned()
            .ok_or_else(|| ExecutionError::function_error(name, "not an image")),
        _ => Err(ExecutionError::function_error(name, "not an image")),
    }
}

macro_rules! getter {
    ($f:ident, $name:literal) => {
        fn $f<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            out(field(&args, $name)?)
        }
    };
}
getter!(registry, "registry");
getter!(repository, "repository");
getter!(tag, "tag");
getter!(digest, "digest");
getter!(identifier, "identifier");

fn contains_digest<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    out(Value::Bool(matches!(field(&args, "digest")?, Value::String(s) if !s.is_empty())))
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("image", "image_string", vec![STRING_TYPE], image)?;
    env.add_overload("isImage", "isImage_string", vec![STRING_TYPE], is_image)?;
    // Kyverno's newer names for the same functions.
    env.add_overload("parseImageReference", "parseImageReference_string", vec![STRING_TYPE], image)?;
    env.add_overload("isImageReference", "isImageReference_string", vec![STRING_TYPE], is_image)?;
    env.add_member_overload("registry", "image_registry", MAP_TYPE, vec![], registry)?;
    env.add_member_overload("repository", "image_repository", MAP_TYPE, vec![], repository)?;
    env.add_member_overload("tag", "image_tag", MAP_TYPE, vec![], tag)?;
    env.add_member_overload("digest", "image_digest", MAP_TYPE, vec![], digest)?;
    env.add_member_overload("identifier", "image_identifier", MAP_TYPE, vec![], identifier)?;
    env.add_member_overload("containsDigest", "image_containsDigest", MAP_TYPE, vec![], contains_digest)?;
    Ok(())
}
