//! Semantic versions and `blang/semver` range expressions, as Kyverno's `semver_compare` uses
//! them (`>=1.2.0 <2.0.0 || 3.x`). Cargo-style requirements differ, hence our own.

use std::cmp::Ordering;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: Vec<String>,
}

impl Version {
    /// Strict `MAJOR.MINOR.PATCH[-pre][+build]`, an optional leading `v` tolerated.
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let s = s.split_once('+').map(|x| x.0).unwrap_or(s);
        let (core, pre) = match s.split_once('-') {
            Some((c, p)) => (c, p.split('.').map(str::to_string).collect()),
            None => (s, Vec::new()),
        };
        let mut it = core.split('.');
        let mut num = || -> Option<u64> {
            let p = it.next()?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || (p.len() > 1 && p.starts_with('0')) {
                return None;
            }
            p.parse().ok()
        };
        let v = Version { major: num()?, minor: num()?, patch: num()?, pre };
        if it.next().is_some() {
            return None;
        }
        Some(v)
    }

    fn cmp_pre(&self, other: &Version) -> Ordering {
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => {
                for (a, b) in self.pre.iter().zip(&other.pre) {
                    let o = match (a.parse::<u64>(), b.parse::<u64>()) {
                        (Ok(x), Ok(y)) => x.cmp(&y),
                        (Ok(_), Err(_)) => Ordering::Less,
                        (Err(_), Ok(_)) => Ordering::Greater,
                        (Err(_), Err(_)) => a.cmp(b),
                    };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                self.pre.len().cmp(&other.pre.len())
            }
        }
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| self.cmp_pre(other))
    }
}

/// Evaluates a range expression against a version; `None` when the range does not parse.
pub fn range_matches(range: &str, v: &Version) -> Option<bool> {
    let mut any = false;
    for alt in range.split("||") {
        let mut all = true;
        let parts: Vec<&str> = alt.split_whitespace().collect();
        if parts.is_empty() {
            return None;
        }
        // blang allows `>= 1.0.0` with a space after the operator
        let mut i = 0;
        while i < parts.len() {
            let mut p = parts.get(i).copied().unwrap_or("").to_string();
            if matches!(p.as_str(), ">" | ">=" | "<" | "<=" | "=" | "==" | "!" | "!=") {
                i += 1;
                p.push_str(parts.get(i).copied().unwrap_or(""));
            }
            if !comparator(&p, v)? {
                all = false;
            }
            i += 1;
        }
        if all {
            any = true;
        }
    }
    Some(any)
}

fn comparator(c: &str, v: &Version) -> Option<bool> {
    let ops = [">=", "<=", "!=", "==", ">", "<", "=", "!"];
    let (op, rest) = ops.iter().find_map(|op| c.strip_prefix(op).map(|r| (*op, r))).unwrap_or(("", c));
    if rest.contains(['x', 'X', '*']) {
        return wildcard(op, rest, v);
    }
    let want = Version::parse(rest)?;
    let o = v.cmp(&want);
    Some(match op {
        ">=" => o != Ordering::Less,
        "<=" => o != Ordering::Greater,
        ">" => o == Ordering::Greater,
        "<" => o == Ordering::Less,
        "!=" | "!" => o != Ordering::Equal,
        _ => o == Ordering::Equal,
    })
}

/// `1.x`, `1.2.x`, `*` ranges, as blang expands them.
fn wildcard(op: &str, rest: &str, v: &Version) -> Option<bool> {
    let parts: Vec<&str> = rest.split('.').collect();
    let is_wild = |s: &str| matches!(s, "x" | "X" | "*");
    let n = |s: &str| s.parse::<u64>().ok();
    let (lo, hi) = match parts.as_slice() {
        [a] if is_wild(a) => return Some(op != "<" && op != ">"),
        [a, b] | [a, b, _] if is_wild(b) => {
            let m = n(a)?;
            (
                Version { major: m, minor: 0, patch: 0, pre: vec![] },
                Version { major: m + 1, minor: 0, patch: 0, pre: vec![] },
            )
        }
        [a, b, c] if is_wild(c) => {
            let (m, mi) = (n(a)?, n(b)?);
            (
                Version { major: m, minor: mi, patch: 0, pre: vec![] },
                Version { major: m, minor: mi + 1, patch: 0, pre: vec![] },
            )
        }
        _ => return None,
    };
    Some(match op {
        ">=" => *v >= lo,
        ">" => *v >= hi,
        "<" => *v < lo,
        "<=" => *v < hi,
        "!=" | "!" => !(*v >= lo && *v < hi),
        _ => *v >= lo && *v < hi,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &str, r: &str) -> Option<bool> {
        range_matches(r, &Version::parse(v)?)
    }

    #[test]
    fn ranges() {
        assert_eq!(m("1.26.3", ">1.25.0"), Some(true));
        assert_eq!(m("1.2.3", ">=1.2.0 <2.0.0"), Some(true));
        assert_eq!(m("2.0.0", ">=1.2.0 <2.0.0"), Some(false));
        assert_eq!(m("3.1.0", "<1.0.0 || >=3.0.0"), Some(true));
        assert_eq!(m("1.4.0", "1.x"), Some(true));
        assert_eq!(m("1.0.0-alpha", "<1.0.0"), Some(true));
        assert_eq!(m("1.0.0", "1.0.0"), Some(true));
    }
}
