//! Cron schedules of cleanup and deleting policies (`spec.schedule`).
//!
//! Our own parser: Kyverno validates CleanupPolicy schedules with robfig/cron's standard parser
//! (five fields or a descriptor) and runs every schedule with supercronic's cronexpr (which also
//! takes a sixth field, the year). No Rust crate reads that grammar (the common ones put
//! seconds first in six-field expressions), and the part Kyverno accepts is small: five
//! fields, an optional year, lists, ranges, steps, month and day names, `?`, and the
//! `@yearly`…`@hourly` descriptors. Times are UTC, as Kyverno's controllers run.
//!
//! Pure: the next run is computed from a time the caller passes.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Timelike, Utc};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    source: String,
    minutes: u64,
    hours: u32,
    /// Bit d set: day of month d (1..=31).
    days: u32,
    /// Bit m set: month m (1..=12).
    months: u16,
    /// Bit w set: weekday w (0 = Sunday).
    weekdays: u8,
    /// Whether the day-of-month and day-of-week fields were both restricted (then either
    /// matching is enough, as in every cron since Vixie's).
    either_day: bool,
    /// An explicit year field: the years allowed (inclusive range list).
    years: Option<Vec<(i32, i32, i32)>>,
}

const MONTHS: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The longest a schedule can be without a next run before we call it never (cronexpr looks
/// as far; `0 0 30 2 *` never runs).
const HORIZON_DAYS: i64 = 366 * 8;

/// Why a schedule is not a cron expression.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("empty schedule")]
    Empty,
    #[error("unknown descriptor {0:?}")]
    UnknownDescriptor(String),
    #[error("expected 5 fields (minute hour day-of-month month day-of-week) or 6 (with a year), found {0}")]
    FieldCount(usize),
    /// `what`: the field's name (`minute` … `year`); `field`: its text.
    #[error("{what} field {field:?}: {problem}")]
    Field { what: &'static str, field: String, problem: FieldProblem },
}

/// What is wrong inside one field of a schedule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FieldProblem {
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{value} is outside {lo}-{hi}")]
    Outside { value: u32, lo: u32, hi: u32 },
    #[error("empty list item")]
    EmptyItem,
    #[error("step {0:?} is not a number")]
    StepNotANumber(String),
    #[error("step {0} is out of range")]
    StepOutOfRange(u32),
    #[error("'?' is only allowed for days")]
    QuestionMark,
    #[error("range {0}-{1} runs backwards")]
    Backwards(u32, u32),
}

impl Schedule {
    /// Parses `s`; the error says which field is wrong and why.
    pub fn parse(s: &str) -> Result<Schedule, ScheduleError> {
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err(ScheduleError::Empty);
        }
        let expanded = match trimmed.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            d if d.starts_with('@') => return Err(ScheduleError::UnknownDescriptor(trimmed.to_string())),
            _ => trimmed,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 && fields.len() != 6 {
            return Err(ScheduleError::FieldCount(fields.len()));
        }
        let field = |i: usize| fields.get(i).copied().unwrap_or("*");
        let bits = |i: usize, name: &'static str, lo: u32, hi: u32, names: &[&str], name_base: u32| {
            let mut out = 0u64;
            for (a, b, step) in ranges(field(i), name, lo, hi, names, name_base)? {
                let mut v = a;
                while v <= b {
                    out |= 1u64 << v;
                    v += step;
                }
            }
            Ok::<u64, ScheduleError>(out)
        };
        let minutes = bits(0, "minute", 0, 59, &[], 0)?;
        let hours = bits(1, "hour", 0, 23, &[], 0)? as u32;
        let days = bits(2, "day-of-month", 1, 31, &[], 0)? as u32;
        let months = bits(3, "month", 1, 12, &MONTHS, 1)? as u16;
        // 7 is Sunday too.
        let mut weekdays = bits(4, "day-of-week", 0, 7, &WEEKDAYS, 0)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & 0x7f) | 1;
        }
        let restricted = |f: &str| !(f.starts_with('*') || f == "?");
        let years = if fields.len() == 6 {
            let list = ranges(field(5), "year", 1970, 2099, &[], 0)?;
            Some(list.into_iter().map(|(a, b, s)| (a as i32, b as i32, s as i32)).collect())
        } else {
            None
        };
        Ok(Schedule {
            source: s.to_string(),
            minutes,
            hours,
            days,
            months,
            weekdays: weekdays as u8,
            either_day: restricted(field(2)) && restricted(field(4)),
            years,
        })
    }

    /// The schedule as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        if self.months & (1 << d.month()) == 0 {
            return false;
        }
        if let Some(years) = &self.years {
            let y = d.year();
            if !years.iter().any(|(a, b, s)| y >= *a && y <= *b && (y - a) % s.max(&1) == 0) {
                return false;
            }
        }
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().num_days_from_sunday()) != 0;
        if self.either_day { dom || dow } else { dom && dow }
    }

    /// The first time strictly after `after` (to the minute) the schedule fires; `None` when it
    /// never does within eight years (`30 0 31 2 *`).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Start at the next whole minute.
        let base = after.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let mut day = base.date_naive();
        let (mut from_hour, mut from_minute) = (base.hour(), base.minute());
        for _ in 0..HORIZON_DAYS {
            if self.day_matches(day) {
                for h in from_hour..24 {
                    if self.hours & (1 << h) == 0 {
                        continue;
                    }
                    let first = if h == from_hour { from_minute } else { 0 };
                    if let Some(m) = (first..60).find(|m| self.minutes & (1u64 << m) != 0) {
                        return Utc.from_utc_datetime(&day.and_hms_opt(h, m, 0)?).into();
                    }
                }
            }
            day = day.succ_opt()?;
            from_hour = 0;
            from_minute = 0;
        }
        None
    }
}

/// One field: comma-separated `*`, `?`, `a`, `a-b`, each optionally `/step`; names allowed
/// where `names` are given (`names[0]` is value `name_base`).
fn ranges(
    field: &str,
    what: &'static str,
    lo: u32,
    hi: u32,
    names: &[&str],
    name_base: u32,
) -> Result<Vec<(u32, u32, u32)>, ScheduleError> {
    let fail = |problem: FieldProblem| ScheduleError::Field { what, field: field.to_string(), problem };
    let value = |t: &str| -> Result<u32, ScheduleError> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(t)) {
            return Ok(i as u32 + name_base);
        }
        let v: u32 = t.parse().map_err(|_| fail(FieldProblem::NotANumber(t.to_string())))?;
        if v < lo || v > hi {
            return Err(fail(FieldProblem::Outside { value: v, lo, hi }));
        }
        Ok(v)
    };
    let mut out = Vec::new();
    for part in field.split(',') {
        if part.is_empty() {
            return Err(fail(FieldProblem::EmptyItem));
        }
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| fail(FieldProblem::StepNotANumber(s.to_string())))?;
                if step == 0 || step > hi - lo + 1 {
                    return Err(fail(FieldProblem::StepOutOfRange(step)));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (a, b) = if range == "*" || range == "?" {
            if range == "?" && !(what == "day-of-month" || what == "day-of-week") {
                return Err(fail(FieldProblem::QuestionMark));
            }
            (lo, hi)
        } else if let Some((x, y)) = range.split_once('-') {
            let (a, b) = (value(x)?, value(y)?);
            if a > b {
                return Err(fail(FieldProblem::Backwards(a, b)));
            }
            (a, b)
        } else {
            let a = value(range)?;
            // `a/n` runs from a to the end (robfig/cron, cronexpr).
            (a, if step.is_some() { hi } else { a })
        };
        out.push((a, b, step.unwrap_or(1)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(expr: &str, from: &str) -> String {
        Schedule::parse(expr).unwrap().next_after(at(from)).map(|t| t.to_rfc3339()).unwrap_or_default()
    }

    #[test]
    fn every_minute_and_steps() {
        assert_eq!(next("*/1 * * * *", "2026-11-24T10:15:30Z"), "2026-11-24T10:16:00+00:00");
        assert_eq!(next("*/5 * * * *", "2026-11-24T10:15:00Z"), "2026-11-24T10:20:00+00:00");
        assert_eq!(next("*/5 * * * *", "2026-11-24T10:56:00Z"), "2026-11-24T11:00:00+00:00");
        assert_eq!(next("10/20 * * * *", "2026-11-24T10:31:00Z"), "2026-11-24T10:50:00+00:00");
    }

    #[test]
    fn names_lists_ranges_and_descriptors() {
        // 2026-11-24 is a Tuesday.
        assert_eq!(next("0 9 * * MON-FRI", "2026-11-24T10:00:00Z"), "2026-11-25T09:00:00+00:00");
        assert_eq!(next("0 0 1 jan,jul *", "2026-11-24T10:00:00Z"), "2027-01-01T00:00:00+00:00");
        assert_eq!(next("@daily", "2026-11-24T10:00:00Z"), "2026-11-25T00:00:00+00:00");
        assert_eq!(next("@weekly", "2026-11-24T10:00:00Z"), "2026-11-29T00:00:00+00:00");
        assert_eq!(next("0 0 * * 7", "2026-11-24T10:00:00Z"), "2026-11-29T00:00:00+00:00");
        assert_eq!(next("@hourly", "2026-11-24T10:00:00Z"), "2026-11-24T11:00:00+00:00");
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        // The 1st or any Friday, whichever comes first.
        assert_eq!(next("0 0 1 * FRI", "2026-11-24T10:00:00Z"), "2026-11-27T00:00:00+00:00");
        assert_eq!(next("0 0 1 * ?", "2026-11-24T10:00:00Z"), "2026-12-01T00:00:00+00:00");
    }

    #[test]
    fn a_year_field_and_dates_that_never_come() {
        assert_eq!(next("0 0 1 1 * 2028", "2026-11-24T10:00:00Z"), "2028-01-01T00:00:00+00:00");
        assert_eq!(Schedule::parse("0 0 30 2 *").unwrap().next_after(at("2026-11-24T10:00:00Z")), None);
    }

    #[test]
    fn bad_schedules_say_which_field() {
        for (s, want) in [
            ("* * * *", "expected 5 fields"),
            ("61 * * * *", "minute field \"61\": 61 is outside 0-59"),
            ("* 24 * * *", "hour field"),
            ("* * 0 * *", "day-of-month field"),
            ("* * * FOO *", "month field \"FOO\""),
            ("*/0 * * * *", "step 0"),
            ("5-2 * * * *", "runs backwards"),
            ("@every 5m", "unknown descriptor"),
            ("? * * * *", "only allowed for days"),
            ("", "empty schedule"),
        ] {
            let e = Schedule::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
        }
    }
}
