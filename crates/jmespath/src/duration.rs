//! Go `time.Duration`: `ParseDuration` and `Duration.String()` reproduced exactly, since Kyverno
//! prints durations the Go way (`1h0m30s`) and compares them in patterns and conditions.

/// Parses a Go duration string (`"1h30m"`, `"1.5s"`, `"-2ms"`, `"0"`) into nanoseconds.
pub fn parse(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let int_part = &rest[..int_end];
        rest = &rest[int_end..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let fe = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            frac_part = &r[..fe];
            rest = &r[fe..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        let unit_end = rest.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let iv: i128 = if int_part.is_empty() { 0 } else { int_part.parse().ok()? };
        let mut v = iv.checked_mul(scale)?;
        if !frac_part.is_empty() {
            let digits = frac_part.len().min(30) as u32;
            let fv: i128 = frac_part.get(..digits as usize)?.parse().ok()?;
            v += fv * scale / 10i128.pow(digits);
        }
        total = total.checked_add(v)?;
        if total > i64::MAX as i128 {
            return None;
        }
    }
    let t = total as i64;
    Some(if neg { -t } else { t })
}

/// Formats nanoseconds as Go's `Duration.String()`.
pub fn format(d: i64) -> String {
    if d == 0 {
        return "0s".into();
    }
    let neg = d < 0;
    let u = d.unsigned_abs() as u128;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if u < 1_000_000_000 {
        let (unit, scale, digits) = if u < 1_000 {
            ("ns", 1u128, 0usize)
        } else if u < 1_000_000 {
            ("µs", 1_000, 3)
        } else {
            ("ms", 1_000_000, 6)
        };
        out.push_str(&frac(u / scale, u % scale, digits));
        out.push_str(unit);
        return out;
    }
    let secs = u / 1_000_000_000;
    let nanos = u % 1_000_000_000;
    let h = secs / 3600;
    let m = (secs / 60) % 60;
    let s = secs % 60;
    if h > 0 {
        out.push_str(&format!("{h}h{m}m"));
    } else if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&frac(s, nanos, 9));
    out.push('s');
    out
}

fn frac(int: u128, frac: u128, digits: usize) -> String {
    if frac == 0 || digits == 0 {
        return int.to_string();
    }
    let f = format!("{frac:0digits$}");
    format!("{int}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("1h"), Some(3_600_000_000_000));
        assert_eq!(parse("1m30s"), Some(90_000_000_000));
        assert_eq!(parse("1.5s"), Some(1_500_000_000));
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("5"), None);
        assert_eq!(parse("10x"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("-2ms"), Some(-2_000_000));
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(0), "0s");
        assert_eq!(format(3_630_000_000_000), "1h0m30s");
        assert_eq!(format(90_000_000_000), "1m30s");
        assert_eq!(format(1_500_000_000), "1.5s");
        assert_eq!(format(1_500_000), "1.5ms");
        assert_eq!(format(1_500), "1.5µs");
        assert_eq!(format(-30_000_000_000), "-30s");
    }
}
