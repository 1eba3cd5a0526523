//! Kyverno's time functions (RFC 3339 unless a Go layout is given). The current time comes from
//! the caller's [`crate::Env`], so evaluation itself never reads a clock.

use super::{Arg, Call, Function, S, str_arg};
use crate::duration;
use crate::error::RuntimeError;
use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use serde_json::Value;

macro_rules! f {
    ($name:literal, [$($p:expr),*], $ret:literal, $note:literal, $imp:expr) => {
        Function { name: $name, params: &[$($p),*], variadic: false, returns: $ret, custom: true, note: $note, imp: $imp }
    };
}

pub(crate) static FUNCTIONS: &[Function] = &[
    f!(
        "time_since",
        [S, S, S],
        "string",
        "calculate the difference between a start and end period of time where the end may either be a static definition or the then-current time",
        time_since
    ),
    f!("time_now", [], "string", "returns current time in RFC 3339 format", |c, _| Ok(Value::String(rfc3339(&now(
        c
    )?)))),
    f!("time_now_utc", [], "string", "returns current time in UTC, in RFC 3339 format", |c, _| Ok(Value::String(
        rfc3339(&now(c)?.with_timezone(&utc()))
    ))),
    f!("time_add", [S, S], "string", "adds duration (second string) to a time value (first string)", |c, a| {
        let t = parse_time(c, str_arg(c, a, 0)?)?;
        let d = parse_dur(c, str_arg(c, a, 1)?)?;
        Ok(Value::String(rfc3339(&(t + chrono::Duration::nanoseconds(d)))))
    }),
    f!("time_parse", [S, S], "string", "changes a time value of a given layout to RFC 3339", |c, a| {
        let layout = str_arg(c, a, 0)?;
        let ts = str_arg(c, a, 1)?;
        let t = parse_layout(c, layout, ts)?;
        Ok(Value::String(rfc3339(&t)))
    }),
    f!("time_to_cron", [S], "string", "converts a time (string) to cron format (string)", |c, a| {
        // In the time's own offset, as Kyverno reads the fields of the parsed time.
        let t = parse_time(c, str_arg(c, a, 0)?)?;
        Ok(Value::String(cron_of(&t)))
    }),
    f!("time_utc", [S], "string", "calcutes time in UTC from a given time in RFC 3339 format", |c, a| {
        Ok(Value::String(rfc3339(&parse_time(c, str_arg(c, a, 0)?)?.with_timezone(&utc()))))
    }),
    f!("time_diff", [S, S], "string", "calculate the difference between two times in RFC 3339 format", |c, a| {
        let t1 = parse_time(c, str_arg(c, a, 0)?)?;
        let t2 = parse_time(c, str_arg(c, a, 1)?)?;
        Ok(Value::String(duration::format(diff_ns(&t1, &t2))))
    }),
    f!("time_before", [S, S], "bool", "checks if a time is before another time, both in RFC3339 format", |c, a| {
        Ok(Value::Bool(parse_time(c, str_arg(c, a, 0)?)? < parse_time(c, str_arg(c, a, 1)?)?))
    }),
    f!("time_after", [S, S], "bool", "checks if a time is after another time, both in RFC3339 format", |c, a| {
        Ok(Value::Bool(parse_time(c, str_arg(c, a, 0)?)? > parse_time(c, str_arg(c, a, 1)?)?))
    }),
    f!(
        "time_between",
        [S, S, S],
        "bool",
        "checks if a time is between a start and end time, all in RFC3339 format",
        |c, a| {
            let t = parse_time(c, str_arg(c, a, 0)?)?;
            Ok(Value::Bool(t > parse_time(c, str_arg(c, a, 1)?)? && t < parse_time(c, str_arg(c, a, 2)?)?))
        }
    ),
    f!(
        "time_truncate",
        [S, S],
        "string",
        "returns the result of rounding time down to a multiple of duration",
        |c, a| {
            let t = parse_time(c, str_arg(c, a, 0)?)?;
            let d = parse_dur(c, str_arg(c, a, 1)?)?;
            if d <= 0 {
                return Ok(Value::String(rfc3339(&t)));
            }
            let unix = i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos());
            let back = go_truncation(unix, i128::from(d));
            let out = i64::try_from(back)
                .ok()
                .and_then(|b| t.checked_sub_signed(chrono::Duration::nanoseconds(b)))
                .ok_or_else(|| RuntimeError::func(c.name, "time out of range"))?;
            Ok(Value::String(rfc3339(&out)))
        }
    ),
];

/// Nanoseconds from Go's zero time (January 1 of year 1, UTC) to the Unix epoch.
const GO_ZERO_TO_UNIX_NANOS: i128 = 62_135_596_800 * 1_000_000_000;

/// How far back Go's `Time.Truncate(step)` moves a time `unix_nanos` after the Unix epoch:
/// Go rounds down to a multiple of `step` counted from its zero time, not from the epoch (the
/// two differ for steps that do not divide a day, e.g. a week). A non-positive `step` moves
/// nothing. Shared by JMESPath's `time_truncate` and CEL's `time.truncate`.
pub fn go_truncation(unix_nanos: i128, step: i128) -> i128 {
    if step <= 0 { 0 } else { (unix_nanos + GO_ZERO_TO_UNIX_NANOS).rem_euclid(step) }
}

/// A time as a cron schedule, `"minute hour day month weekday"` (Sunday is 0), as Kyverno's
/// `time_to_cron` (JMESPath) and `time.toCron` (CEL) write it.
pub fn cron_of<T: Datelike + Timelike>(t: &T) -> String {
    format!("{} {} {} {} {}", t.minute(), t.hour(), t.day(), t.month(), t.weekday().num_days_from_sunday())
}

fn utc() -> FixedOffset {
    Utc.fix()
}

fn now(c: &Call<'_>) -> Result<DateTime<FixedOffset>, RuntimeError> {
    c.env().now().ok_or_else(|| RuntimeError::func(c.name, "the current time is not available in this context"))
}

fn parse_time(c: &Call<'_>, s: &str) -> Result<DateTime<FixedOffset>, RuntimeError> {
    DateTime::parse_from_rfc3339(s)
        .map_err(|e| RuntimeError::func(c.name, format!("parsing time {s:?} as RFC3339: {e}")))
}

fn parse_dur(c: &Call<'_>, s: &str) -> Result<i64, RuntimeError> {
    duration::parse(s).ok_or_else(|| RuntimeError::func(c.name, format!("time: invalid duration {s:?}")))
}

fn diff_ns(t1: &DateTime<FixedOffset>, t2: &DateTime<FixedOffset>) -> i64 {
    (*t2 - *t1).num_nanoseconds().unwrap_or(i64::MAX)
}

/// Go's `time.RFC3339`: seconds precision, `Z` for UTC.
pub(crate) fn rfc3339(t: &DateTime<FixedOffset>) -> String {
    if t.offset().local_minus_utc() == 0 {
        t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        t.format("%Y-%m-%dT%H:%M:%S%:z").to_string()
    }
}

fn time_since(c: &Call<'_>, a: &[Arg<'_, '_>]) -> Result<Value, RuntimeError> {
    let layout = str_arg(c, a, 0)?;
    let t1 = str_arg(c, a, 1)?;
    let t2 = str_arg(c, a, 2)?;
    let p = |s: &str| if layout.is_empty() { parse_time(c, s) } else { parse_layout(c, layout, s) };
    let start = p(t1)?;
    let end = if t2.is_empty() { now(c)? } else { p(t2)? };
    Ok(Value::String(duration::format(diff_ns(&start, &end))))
}

/// Parses `ts` with a Go reference-time layout (`2006-01-02T15:04:05Z07:00`). A purely numeric
/// layout means `ts` is Unix seconds.
fn parse_layout(c: &Call<'_>, layout: &str, ts: &str) -> Result<DateTime<FixedOffset>, RuntimeError> {
    if !layout.is_empty() && layout.bytes().all(|b| b.is_ascii_digit()) {
        let secs: i64 = ts.parse().map_err(|_| RuntimeError::func(c.name, format!("invalid epoch seconds {ts:?}")))?;
        return Utc
            .timestamp_opt(secs, 0)
            .single()
            .map(|t| t.with_timezone(&utc()))
            .ok_or_else(|| RuntimeError::func(c.name, "time out of range"));
    }
    let fmt = go_layout_to_chrono(layout);
    let bad = |e: chrono::ParseError| RuntimeError::func(c.name, format!("parsing time {ts:?} as {layout:?}: {e}"));
    if let Ok(t) = DateTime::parse_from_str(ts, &fmt) {
        return Ok(t);
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(ts, &fmt) {
        return Ok(utc().from_utc_datetime(&t));
    }
    match NaiveDate::parse_from_str(ts, &fmt) {
        Ok(d) => Ok(utc().from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default())),
        Err(e) => {
            if ts.ends_with('Z') && fmt.contains("%:z") {
                let alt = fmt.replace("%:z", "Z");
                if let Ok(t) = NaiveDateTime::parse_from_str(ts, &alt) {
                    return Ok(utc().from_utc_datetime(&t));
                }
            }
            Err(bad(e))
        }
    }
}

fn go_layout_to_chrono(layout: &str) -> String {
    // Longest tokens first.
    const TOKENS: &[(&str, &str)] = &[
        ("January", "%B"),
        ("Monday", "%A"),
        ("Z07:00", "%:z"),
        ("-07:00", "%:z"),
        ("Z0700", "%z"),
        ("-0700", "%z"),
        (".000000000", "%.9f"),
        (".999999999", "%.f"),
        (".000000", "%.6f"),
        (".000", "%.3f"),
        ("2006", "%Y"),
        ("Jan", "%b"),
        ("Mon", "%a"),
        ("MST", "%Z"),
        ("01", "%m"),
        ("02", "%d"),
        ("_2", "%e"),
        ("15", "%H"),
        ("03", "%I"),
        ("04", "%M"),
        ("05", "%S"),
        ("06", "%y"),
        ("PM", "%p"),
        ("pm", "%P"),
        ("1", "%-m"),
        ("2", "%-d"),
        ("3", "%-I"),
        ("4", "%-M"),
        ("5", "%-S"),
    ];
    let mut out = String::new();
    let mut rest = layout;
    'outer: while !rest.is_empty() {
        for (go, ch) in TOKENS {
            if let Some(r) = rest.strip_prefix(go) {
                out.push_str(ch);
                rest = r;
                continue 'outer;
            }
        }
        let mut chars = rest.chars();
        if let Some(ch) = chars.next() {
            if ch == '%' {
                out.push_str("%%");
            } else {
                out.push(ch);
            }
        }
        rest = chars.as_str();
    }
    out
}
