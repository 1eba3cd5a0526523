//! Kubernetes' CEL semver library, version 1 (`k8s.io/apiserver/pkg/cel/library/semverlib.go`),
//! which every Kyverno CEL kind has: `semver(s)`, `semver(s, normalize)`, `isSemver(s)`,
//! `isSemver(s, normalize)`, and on a version `major()`, `minor()`, `patch()`,
//! `isGreaterThan(v)`, `isLessThan(v)` and `compareTo(v)`.
//!
//! Versions parse as `github.com/blang/semver/v4` parses them (`Major.Minor.Patch`, then
//! `-pre.release` and `+build.meta`, no leading zeros); `normalize` first drops a leading `v`,
//! leading zeros, and fills a missing minor or patch with `0`, as Kubernetes does. A version is
//! held as `{"@semver": text}` (see `tagged`), the text without its build metadata: versions
//! equal by precedence are equal maps, as Kubernetes' `Semver.Equal` says, and nothing reads the
//! build metadata.
//!
//! `isGreaterThan`, `isLessThan` and `compareTo` are also the quantity library's methods on a
//! map: `quantity` calls [`ordering`] first, which answers for a version receiver.

use crate::tagged::{Args, Ret, kind, ret, string_at, tagged, untag, values};
use cel::common::types::{BOOL_TYPE, MAP_TYPE, STRING_TYPE};
use cel::{DeclarationError, Env, ExecutionError, Value};
use std::cmp::Ordering;

const SEMVER: &str = "@semver";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pre {
    Num(u64),
    Alpha(String),
}

impl Pre {
    /// Numeric identifiers sort before alphanumeric ones; alphanumeric ones byte-wise.
    fn cmp(&self, other: &Pre) -> Ordering {
        match (self, other) {
            (Pre::Num(a), Pre::Num(b)) => a.cmp(b),
            (Pre::Num(_), Pre::Alpha(_)) => Ordering::Less,
            (Pre::Alpha(_), Pre::Num(_)) => Ordering::Greater,
            (Pre::Alpha(a), Pre::Alpha(b)) => a.as_bytes().cmp(b.as_bytes()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<Pre>,
}

impl Version {
    /// Precedence: the numbers, then a release above its pre-releases, then the pre-release
    /// identifiers one by one (more of them sorts higher when all before are equal).
    fn cmp(&self, other: &Version) -> Ordering {
        let numbers = (self.major, self.minor, self.patch).cmp(&(other.major, other.minor, other.patch));
        if numbers != Ordering::Equal {
            return numbers;
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => self
                .pre
                .iter()
                .zip(&other.pre)
                .map(|(a, b)| a.cmp(b))
                .find(|o| *o != Ordering::Equal)
                .unwrap_or_else(|| self.pre.len().cmp(&other.pre.len())),
        }
    }

    /// The version's text without build metadata.
    fn text(&self) -> String {
        let mut s = format!("{}.{}.{}", self.major, self.minor, self.patch);
        for (i, p) in self.pre.iter().enumerate() {
            s.push(if i == 0 { '-' } else { '.' });
            match p {
                Pre::Num(n) => s.push_str(&n.to_string()),
                Pre::Alpha(a) => s.push_str(a),
            }
        }
        s
    }
}

fn digits_only(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

fn alphanumeric(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn leading_zero(s: &str) -> bool {
    s.len() > 1 && s.starts_with('0')
}

/// Go's `strconv.ParseUint(s, 10, 64)` of digits, with its error.
fn parse_u64(s: &str) -> Result<u64, String> {
    let q = crate::tagged::go_quote(s.as_bytes());
    if s.is_empty() {
        return Err(format!("strconv.ParseUint: parsing {q}: invalid syntax"));
    }
    s.parse().map_err(|_| format!("strconv.ParseUint: parsing {q}: value out of range"))
}

/// A number part (`major`, `minor`, `patch`).
fn number(s: &str, part: &str) -> Result<u64, String> {
    let q = crate::tagged::go_quote(s.as_bytes());
    if !digits_only(s) {
        return Err(format!("Invalid character(s) found in {part} number {q}"));
    }
    if leading_zero(s) {
        let part = format!("{}{}", part.get(..1).unwrap_or("").to_uppercase(), part.get(1..).unwrap_or(""));
        return Err(format!("{part} number must not contain leading zeroes {q}"));
    }
    parse_u64(s)
}

/// `blang/semver`'s `Parse`, with its error messages.
fn parse(s: &str) -> Result<Version, String> {
    if s.is_empty() {
        return Err("Version string empty".into());
    }
    let mut parts = s.splitn(3, '.');
    let (Some(major), Some(minor), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("No Major.Minor.Patch elements found".into());
    };
    let major = number(major, "major")?;
    let minor = number(minor, "minor")?;
    let (rest, build) = match rest.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (rest, None),
    };
    let (patch, pre) = match rest.split_once('-') {
        Some((p, pre)) => (p, Some(pre)),
        None => (rest, None),
    };
    let patch = number(patch, "patch")?;
    let mut version = Version { major, minor, patch, pre: Vec::new() };
    for id in pre.map(|p| p.split('.').collect::<Vec<_>>()).unwrap_or_default() {
        let q = crate::tagged::go_quote(id.as_bytes());
        if id.is_empty() {
            return Err("Prerelease is empty".into());
        }
        if digits_only(id) {
            if leading_zero(id) {
                return Err(format!("Numeric PreRelease version must not contain leading zeroes {q}"));
            }
            version.pre.push(Pre::Num(parse_u64(id)?));
        } else if alphanumeric(id) {
            version.pre.push(Pre::Alpha(id.to_string()));
        } else {
            return Err(format!("Invalid character(s) found in prerelease {q}"));
        }
    }
    for id in build.map(|b| b.split('.').collect::<Vec<_>>()).unwrap_or_default() {
        if id.is_empty() {
            return Err("Build meta data is empty".into());
        }
        if !alphanumeric(id) {
            return Err(format!(
                "Invalid character(s) found in build meta data {}",
                crate::tagged::go_quote(id.as_bytes())
            ));
        }
    }
    Ok(version)
}

/// Kubernetes' normalization before parsing: no leading `v`, no leading zeros, a missing minor
/// or patch filled with `0` (a short version may not carry a pre-release or build).
fn normalize_and_parse(s: &str) -> Result<Version, String> {
    let s = s.strip_prefix('v').unwrap_or(s);
    let mut parts: Vec<String> = s
        .splitn(3, '.')
        .map(|p| {
            if p.len() <= 1 {
                return p.to_string();
            }
            let trimmed = p.trim_start_matches('0');
            if trimmed.starts_with(|c: char| c.is_ascii_digit()) { trimmed.to_string() } else { format!("0{trimmed}") }
        })
        .collect();
    if parts.len() < 3 {
        if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
            return Err("short version cannot contain PreRelease/Build meta data".into());
        }
        parts.resize(3, "0".to_string());
    }
    parse(&parts.join("."))
}

fn version_of(v: &Value) -> Option<Version> {
    untag(v, SEMVER).and_then(|s| parse(s).ok())
}

/// The version `semver(s[, normalize])` and `isSemver(s[, normalize])` read.
fn read(args: &[Value], f: &str) -> Result<Result<Version, String>, ExecutionError> {
    let s = string_at(args, 0, f)?;
    let normalize = match args.get(1) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ExecutionError::function_error(f, format!("expected a bool, got {}", kind(other))));
        }
    };
    Ok(if normalize { normalize_and_parse(s) } else { parse(s) })
}

fn semver<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let version = read(&values(&args)?, "semver")?.map_err(|e| ExecutionError::function_error("semver", e))?;
    ret(tagged(SEMVER, version.text()))
}

fn is_semver<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ret(Value::Bool(read(&values(&args)?, "isSemver")?.is_ok()))
}

/// A number of a version (`major()`, `minor()`, `patch()`); Go hands the uint64 on as an int.
fn part<'b, 'v>(args: &[cel::common::value::CowVal<'b, 'v>], f: &str, get: fn(&Version) -> u64) -> Ret<'b, 'v> {
    let v = values(args)?;
    match v.first().and_then(version_of) {
        Some(version) => ret(Value::Int(get(&version) as i64)),
        None => Err(crate::tagged::no_overload(f, &v)),
    }
}

fn major<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    part(&args, "major", |v| v.major)
}

fn minor<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    part(&args, "minor", |v| v.minor)
}

fn patch<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    part(&args, "patch", |v| v.patch)
}

/// `receiver.f(other)` when the receiver is a version: how it compares with `other` (which
/// must be a version too). `None` when the receiver is not a version (a quantity's method).
pub(crate) fn ordering(args: &[Value], f: &str) -> Option<Result<Ordering, ExecutionError>> {
    let receiver = version_of(args.first()?)?;
    Some(match args.get(1).and_then(version_of) {
        Some(other) => Ok(receiver.cmp(&other)),
        None => Err(crate::tagged::no_overload(f, args)),
    })
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver)?;
    env.add_overload("semver", "string_bool_to_semver", vec![STRING_TYPE, BOOL_TYPE], semver)?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload("isSemver", "is_semver_string_bool", vec![STRING_TYPE, BOOL_TYPE], is_semver)?;
    env.add_member_overload("major", "semver_major", MAP_TYPE, vec![], major)?;
    env.add_member_overload("minor", "semver_minor", MAP_TYPE, vec![], minor)?;
    env.add_member_overload("patch", "semver_patch", MAP_TYPE, vec![], patch)?;
    // `isGreaterThan`, `isLessThan` and `compareTo` are registered by `quantity` (see `ordering`).
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_fail_as_blang_semver() {
        assert_eq!(parse("1.2.3-alpha.1+build.5").map(|v| v.text()), Ok("1.2.3-alpha.1".into()));
        for (input, err) in [
            ("", "Version string empty"),
            ("1.2", "No Major.Minor.Patch elements found"),
            ("v1.2.3", r#"Invalid character(s) found in major number "v1""#),
            ("01.2.3", r#"Major number must not contain leading zeroes "01""#),
            ("1.02.3", r#"Minor number must not contain leading zeroes "02""#),
            ("1.2.03", r#"Patch number must not contain leading zeroes "03""#),
            ("1.2.x", r#"Invalid character(s) found in patch number "x""#),
            ("1..3", r#"strconv.ParseUint: parsing "": invalid syntax"#),
            ("1.2.3-", "Prerelease is empty"),
            ("1.2.3-01", r#"Numeric PreRelease version must not contain leading zeroes "01""#),
            ("1.2.3-a_b", r#"Invalid character(s) found in prerelease "a_b""#),
            ("1.2.3+", "Build meta data is empty"),
            ("1.2.3+a_b", r#"Invalid character(s) found in build meta data "a_b""#),
            ("99999999999999999999.0.0", r#"strconv.ParseUint: parsing "99999999999999999999": value out of range"#),
        ] {
            assert_eq!(parse(input), Err(err.to_string()), "{input}");
        }
    }

    #[test]
    fn normalization_fills_and_trims() {
        let n = |s: &str| normalize_and_parse(s).map(|v| v.text());
        assert_eq!(n("v1"), Ok("1.0.0".into()));
        assert_eq!(n("v1.2"), Ok("1.2.0".into()));
        assert_eq!(n("01.02.03"), Ok("1.2.3".into()));
        assert_eq!(n("1.00.0-0.1"), Ok("1.0.0-0.1".into()));
        assert_eq!(n("1.2-rc"), Err("short version cannot contain PreRelease/Build meta data".into()));
        assert_eq!(n("vv1.0.0").map_err(|_| ()), Err(()));
    }

    #[test]
    fn precedence_follows_semver() {
        let v = |s: &str| parse(s).unwrap();
        let ordered =
            ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11"];
        for pair in ordered.windows(2) {
            let [a, b] = pair else { continue };
            assert_eq!(v(a).cmp(&v(b)), Ordering::Less, "{a} < {b}");
        }
        assert_eq!(v("1.0.0-rc.1").cmp(&v("1.0.0")), Ordering::Less);
        assert_eq!(v("1.0.0+a").cmp(&v("1.0.0+b")), Ordering::Equal);
        assert_eq!(v("2.0.0").cmp(&v("10.0.0")), Ordering::Less);
    }
}
