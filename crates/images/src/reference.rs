//! Image references as registries address them: `registry/repository`, then a tag or a digest.

/// Why an image reference does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Empty, over 1024 bytes, or with white space.
    #[error("invalid image reference {image:?}")]
    Invalid { image: String },
    #[error("invalid digest {digest:?} in image reference {image:?}")]
    Digest { digest: String, image: String },
    #[error("invalid image reference {image:?}: no repository")]
    NoRepository { image: String },
}

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// As written (`docker.io`, `ghcr.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// `library/busybox`, `acme/app`.
    pub repository: String,
    pub tag: String,
    /// `sha256:<hex>`, empty when the reference has none.
    pub digest: String,
}

impl Reference {
    /// Parses `[registry/]path[:tag][@digest]`; a first component without `.` or `:` (and not
    /// `localhost`) means Docker Hub, where single names live under `library/`.
    pub fn parse(image: &str) -> Result<Reference, ReferenceError> {
        let image = image.trim();
        if image.is_empty() || image.len() > 1024 || image.chars().any(|c| c.is_whitespace()) {
            return Err(ReferenceError::Invalid { image: image.to_string() });
        }
        let (rest, digest) = match image.split_once('@') {
            Some((r, d)) => (r, d.to_string()),
            None => (image, String::new()),
        };
        if !digest.is_empty() && !valid_digest(&digest) {
            return Err(ReferenceError::Digest { digest, image: image.to_string() });
        }
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], rest[i + 1..].to_string()),
            _ => (rest, String::new()),
        };
        let (registry, mut repository) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_string(), path.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        if registry == "docker.io" && !repository.contains('/') {
            repository = format!("library/{repository}");
        }
        if repository.is_empty() {
            return Err(ReferenceError::NoRepository { image: image.to_string() });
        }
        let tag = if tag.is_empty() && digest.is_empty() { "latest".to_string() } else { tag };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// The host to talk to: Docker Hub's API lives at `registry-1.docker.io`.
    pub fn host(&self) -> &str {
        if self.registry == "docker.io" || self.registry == "index.docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }

    /// The digest if the reference has one, else the tag.
    pub fn version(&self) -> &str {
        if self.digest.is_empty() { &self.tag } else { &self.digest }
    }

    /// The same image in another repository (`repository` overrides where signatures live:
    /// `registry/path`, or a path on the same registry).
    pub fn in_repository(&self, repository: &str) -> Result<Reference, ReferenceError> {
        let mut r = Reference::parse(&format!("{repository}:x"))?;
        r.tag = self.tag.clone();
        r.digest = self.digest.clone();
        Ok(r)
    }
}

/// `sha256:` and 64 lower-case hex digits (the only algorithm registries use for images).
pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_str()),
            ("docker.io", "library/busybox", "latest")
        );
        assert_eq!(r.host(), "registry-1.docker.io");
        let r = Reference::parse("127.0.0.1:5000/acme/app:v1").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.tag.as_str()), ("127.0.0.1:5000", "acme/app", "v1"));
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("ghcr.io/acme/app:v1@{d}")).unwrap();
        assert_eq!((r.tag.as_str(), r.digest.as_str(), r.version()), ("v1", d.as_str(), d.as_str()));
        assert_eq!(
            Reference::parse("ghcr.io/acme/app@sha256:xyz").map_err(|e| e.to_string()),
            Err(r#"invalid digest "sha256:xyz" in image reference "ghcr.io/acme/app@sha256:xyz""#.to_string())
        );
        assert_eq!(Reference::parse("").map_err(|e| e.to_string()), Err(r#"invalid image reference """#.to_string()));
        assert_eq!(
            Reference::parse("ghcr.io/").map_err(|e| e.to_string()),
            Err(r#"invalid image reference "ghcr.io/": no repository"#.to_string())
        );
        let moved = Reference::parse("ghcr.io/acme/app:v1").unwrap().in_repository("127.0.0.1:5000/sigs").unwrap();
        assert_eq!(
            (moved.registry.as_str(), moved.repository.as_str(), moved.tag.as_str()),
            ("127.0.0.1:5000", "sigs", "v1")
        );
    }
}
