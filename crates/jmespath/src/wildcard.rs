//! Glob matching as Kyverno does it (`IGLOU-EU/go-wildcard`): `*` is any run of characters,
//! `?` exactly one; no escapes, no classes, case-sensitive; `"*"` matches everything.

/// True when `text` matches `pattern`.
pub fn matches(pattern: &str, text: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    if pattern.is_empty() {
        return text.is_empty();
    }
    if !pattern.contains(['*', '?']) {
        return pattern == text;
    }
    // `?` is one character: ASCII text can be matched byte by byte, without decoding.
    if pattern.is_ascii() && text.is_ascii() {
        return glob(pattern.as_bytes(), text.as_bytes());
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob(&p, &t)
}

/// `*` any run, `?` any one element; the greedy match with one backtrack point.
fn glob<T: PartialEq + Copy + Wild>(p: &[T], t: &[T]) -> bool {
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(c) if c.is_star() => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c.is_any() || Some(&c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    while p.get(pi).is_some_and(|c| c.is_star()) {
        pi += 1;
    }
    pi == p.len()
}

trait Wild {
    fn is_star(&self) -> bool;
    fn is_any(&self) -> bool;
}

impl Wild for u8 {
    fn is_star(&self) -> bool {
        *self == b'*'
    }
    fn is_any(&self) -> bool {
        *self == b'?'
    }
}

impl Wild for char {
    fn is_star(&self) -> bool {
        *self == '*'
    }
    fn is_any(&self) -> bool {
        *self == '?'
    }
}

/// True when the string contains a wildcard character.
pub fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?'])
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn wildcard_semantics() {
        assert!(matches("*", ""));
        assert!(matches("", ""));
        assert!(!matches("", "a"));
        assert!(matches("nginx:*", "nginx:1.2"));
        assert!(!matches("nginx:1.2", "nginx:*"));
        assert!(matches("?*", "a"));
        assert!(!matches("?*", ""));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("*:latest", "repo/nginx:latest"));
        assert!(!matches("A*", "abc"));
    }
}
