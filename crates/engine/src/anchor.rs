//! Anchors on pattern keys: `(k)` condition, `=(k)` equality, `^(k)` existence, `X(k)`
//! negation, `<(k)` global, `+(k)` add-if-not-present.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Condition,
    Equality,
    Existence,
    Negation,
    Global,
    AddIfNotPresent,
}

/// Splits a pattern key into its anchor and bare key; `None` for a plain key.
pub fn parse(key: &str) -> Option<(Anchor, &str)> {
    // Most keys are plain: an anchor ends with `)` (before any trailing space).
    match key.as_bytes().last() {
        Some(b')') => {}
        Some(b) if b.is_ascii_whitespace() || !b.is_ascii() => {}
        _ => return None,
    }
    let k = key.trim();
    let (modifier, rest) = match k.chars().next() {
        Some(c @ ('+' | '<' | '=' | 'X' | '^')) => (Some(c), &k[1..]),
        _ => (None, k),
    };
    let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
    if inner.is_empty() {
        return None;
    }
    let a = match modifier {
        None => Anchor::Condition,
        Some('+') => Anchor::AddIfNotPresent,
        Some('<') => Anchor::Global,
        Some('=') => Anchor::Equality,
        Some('X') => Anchor::Negation,
        Some(_) => Anchor::Existence,
    };
    Some((a, inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_anchor_kinds() {
        assert_eq!(parse("(name)"), Some((Anchor::Condition, "name")));
        assert_eq!(parse("=(image)"), Some((Anchor::Equality, "image")));
        assert_eq!(parse("^(containers)"), Some((Anchor::Existence, "containers")));
        assert_eq!(parse("X(hostPath)"), Some((Anchor::Negation, "hostPath")));
        assert_eq!(parse("<(x)"), Some((Anchor::Global, "x")));
        assert_eq!(parse("+(y)"), Some((Anchor::AddIfNotPresent, "y")));
        assert_eq!(parse("name"), None);
        assert_eq!(parse("()"), None);
        assert_eq!(parse("X"), None);
    }
}
