//! The `cleanup.kyverno.io/ttl` label: when an object that carries it is due for deletion.
//!
//! Kyverno reads the value with kube-openapi's `strfmt.ParseDuration` — a Go duration (`90s`,
//! `1h30m`) or `<number><unit>` pieces with longer units (`2d`, `1w`, `3days`, `2weeks`) —
//! counted from the object's `creationTimestamp`, else as an absolute time in the label-safe
//! forms `2006-01-02T150405Z` or `2006-01-02` (UTC). Anything else is never deleted.
//!
//! Pure: the caller passes the creation time and compares the result with its clock.

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, Utc};

/// The label.
pub const TTL_LABEL: &str = "cleanup.kyverno.io/ttl";
/// The annotation that chooses the deletion propagation (`Foreground`, `Background`, `Orphan`).
pub const PROPAGATION_ANNOTATION: &str = "cleanup.kyverno.io/propagation-policy";

/// Units of the `<number><unit>` form: the short name, the names matched exactly, and the long
/// name any unit starting with it matches (`3days`, `2weeks`).
const UNITS: [(&[&str], &str, i64); 8] = [
    (&["ns"], "nanosecond", 1),
    (&["us", "µs"], "microsecond", 1_000),
    (&["ms"], "millisecond", 1_000_000),
    (&["s", "sec"], "second", 1_000_000_000),
    (&["m", "min"], "minute", 60_000_000_000),
    (&["h", "hr"], "hour", 3_600_000_000_000),
    (&["d"], "day", 86_400_000_000_000),
    (&["w", "wk"], "week", 604_800_000_000_000),
];

fn unit_nanos(unit: &str) -> Option<i64> {
    let u = unit.to_lowercase();
    UNITS.iter().find(|(short, long, _)| short.contains(&u.as_str()) || u.starts_with(long)).map(|(_, _, n)| *n)
}

/// `<int><unit>` pieces, optionally separated by spaces (`1d12h`, `3 days`).
fn long_duration(s: &str) -> Option<i64> {
    let mut rest = s.trim();
    let mut total: i64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: i64 = rest.get(..digits)?.parse().ok()?;
        rest = rest.get(digits..)?.trim_start();
        let letters = rest.find(|c: char| !c.is_alphabetic()).unwrap_or(rest.len());
        if letters == 0 {
            return None;
        }
        total = total.checked_add(n.checked_mul(unit_nanos(rest.get(..letters)?)?)?)?;
        rest = rest.get(letters..)?.trim_start();
    }
    Some(total)
}

/// Why a TTL label's value or a propagation policy is not one Kyverno accepts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TtlError {
    #[error("{TTL_LABEL} {0:?} is a negative duration")]
    Negative(String),
    #[error("{0:?} is too long")]
    TooLong(String),
    #[error(
        "the value of {TTL_LABEL}, {0:?}, is neither a duration (\"1h\", \"2d\", \"1w\") nor a time (\"2006-01-02T150405Z\", \"2006-01-02\")"
    )]
    Unreadable(String),
    #[error("unknown propagation policy {0:?}, expected Foreground, Background or Orphan")]
    UnknownPropagation(String),
}

/// When an object with TTL value `value` created at `created` is due; the error says why the
/// value is not one Kyverno accepts.
pub fn expiry(value: &str, created: DateTime<Utc>) -> Result<DateTime<Utc>, TtlError> {
    let nanos = verno_jmespath::duration::parse(value).or_else(|| long_duration(value));
    if let Some(n) = nanos {
        if n < 0 {
            return Err(TtlError::Negative(value.to_string()));
        }
        return created
            .checked_add_signed(Duration::nanoseconds(n))
            .ok_or_else(|| TtlError::TooLong(value.to_string()));
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H%M%SZ") {
        return Ok(t.and_utc());
    }
    if let Ok(d) = NaiveDate::parse_from_str(value, "%Y-%m-%d")
        && let Some(t) = d.and_hms_opt(0, 0, 0)
    {
        return Ok(t.and_utc());
    }
    Err(TtlError::Unreadable(value.to_string()))
}

/// A deletion propagation policy as the API accepts it, or why not.
pub fn propagation(value: &str) -> Result<&'static str, TtlError> {
    match value {
        "Foreground" => Ok("Foreground"),
        "Background" => Ok("Background"),
        "Orphan" => Ok("Orphan"),
        other => Err(TtlError::UnknownPropagation(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-24T10:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn due(v: &str) -> String {
        expiry(v, created()).unwrap().to_rfc3339()
    }

    #[test]
    fn durations_count_from_creation() {
        assert_eq!(due("10s"), "2026-11-24T10:00:10+00:00");
        assert_eq!(due("1h30m"), "2026-11-24T11:30:00+00:00");
        assert_eq!(due("2d"), "2026-11-26T10:00:00+00:00");
        assert_eq!(due("1w"), "2026-12-01T10:00:00+00:00");
        assert_eq!(due("3days"), "2026-11-27T10:00:00+00:00");
        assert_eq!(due("2weeks"), "2026-12-08T10:00:00+00:00");
        assert_eq!(due("1d12h"), "2026-11-25T22:00:00+00:00");
    }

    #[test]
    fn absolute_times_are_utc() {
        assert_eq!(due("2023-07-19T120000Z"), "2023-07-19T12:00:00+00:00");
        assert_eq!(due("2027-01-02"), "2027-01-02T00:00:00+00:00");
    }

    #[test]
    fn anything_else_is_refused_with_the_reason() {
        for v in ["", "soon", "10", "2023-07-19T12:00:00Z", "-5m", "1 fortnight"] {
            let e = expiry(v, created()).unwrap_err().to_string();
            assert!(e.contains(TTL_LABEL) || e.contains("negative"), "{v:?}: {e}");
        }
        assert!(propagation("Orphan").is_ok());
        assert!(propagation("orphan").is_err());
    }
}
