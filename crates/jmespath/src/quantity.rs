//! Kubernetes `resource.Quantity`: parsing, exact comparison, arithmetic and canonical printing.
//!
//! Written here (not taken from a crate) because Kyverno's arithmetic functions and pattern
//! operators need Kubernetes' exact canonical form (`1536Mi` + `512Mi` = `2Gi`) and no Rust
//! crate reproduces it. A value is `mantissa × 10^exp`, with binary suffixes expanded exactly.

use std::cmp::Ordering;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    BinarySI,
    DecimalSI,
    DecimalExponent,
}

#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    pub mantissa: i128,
    pub exp: i32,
    pub format: Format,
}

const MAX_EXP: i32 = 60;

impl Quantity {
    /// Parses a quantity string (`"1.5Gi"`, `"100m"`, `"2e3"`, `"10"`). Surrounding spaces are not allowed.
    pub fn parse(s: &str) -> Option<Quantity> {
        if s.is_empty() {
            return None;
        }
        let bytes = s.as_bytes();
        let mut i = 0;
        let mut neg = false;
        if let Some(&c) = bytes.first()
            && (c == b'+' || c == b'-')
        {
            neg = c == b'-';
            i = 1;
        }
        let num_start = i;
        let mut seen_dot = false;
        while let Some(&c) = bytes.get(i) {
            if c == b'.' && !seen_dot {
                seen_dot = true;
            } else if !c.is_ascii_digit() {
                break;
            }
            i += 1;
        }
        // As Kubernetes' parser, no digit is needed: a sign, a dot or a suffix alone is zero
        // ("-", ".", "Mi" are quantities).
        let number = &s[num_start..i];
        let suffix = &s[i..];
        let (mut mantissa, mut exp) = decimal_parts(number)?;
        let format;
        match suffix {
            "" => format = Format::DecimalSI,
            "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => {
                format = Format::DecimalSI;
                exp += match suffix {
                    "n" => -9,
                    "u" => -6,
                    "m" => -3,
                    "k" => 3,
                    "M" => 6,
                    "G" => 9,
                    "T" => 12,
                    "P" => 15,
                    _ => 18,
                };
            }
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                format = Format::BinarySI;
                let pow = match suffix {
                    "Ki" => 1,
                    "Mi" => 2,
                    "Gi" => 3,
                    "Ti" => 4,
                    "Pi" => 5,
                    _ => 6,
                };
                for _ in 0..pow {
                    mantissa = mantissa.checked_mul(1024)?;
                }
            }
            _ => {
                let rest = suffix.strip_prefix('e').or_else(|| suffix.strip_prefix('E'))?;
                if rest.is_empty() {
                    return None;
                }
                let e: i32 = rest.parse().ok()?;
                if !rest.trim_start_matches(['+', '-']).bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                format = Format::DecimalExponent;
                exp = exp.checked_add(e)?;
            }
        }
        if exp.abs() > MAX_EXP {
            return None;
        }
        if neg {
            mantissa = -mantissa;
        }
        Some(Quantity { mantissa, exp, format }.normalized())
    }

    fn normalized(mut self) -> Quantity {
        if self.mantissa == 0 {
            self.exp = 0;
            return self;
        }
        while self.mantissa % 10 == 0 {
            self.mantissa /= 10;
            self.exp += 1;
        }
        self
    }

    /// Brings two quantities to the same exponent; `None` on overflow.
    fn align(a: &Quantity, b: &Quantity) -> Option<(i128, i128, i32)> {
        let e = a.exp.min(b.exp);
        let am = scale_up(a.mantissa, a.exp - e)?;
        let bm = scale_up(b.mantissa, b.exp - e)?;
        Some((am, bm, e))
    }

    pub fn as_f64(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exp)
    }

    pub fn add(&self, other: &Quantity) -> Option<Quantity> {
        let (a, b, e) = Quantity::align(self, other)?;
        Some(Quantity { mantissa: a.checked_add(b)?, exp: e, format: self.format }.normalized())
    }

    pub fn sub(&self, other: &Quantity) -> Option<Quantity> {
        let (a, b, e) = Quantity::align(self, other)?;
        Some(Quantity { mantissa: a.checked_sub(b)?, exp: e, format: self.format }.normalized())
    }

    /// Multiplies by a plain number (given as a quantity so that it is exact).
    pub fn mul(&self, other: &Quantity) -> Option<Quantity> {
        Some(
            Quantity {
                mantissa: self.mantissa.checked_mul(other.mantissa)?,
                exp: self.exp + other.exp,
                format: self.format,
            }
            .normalized(),
        )
    }

    /// Builds a quantity from a float, keeping up to 9 fractional digits.
    pub fn from_f64(f: f64, format: Format) -> Option<Quantity> {
        if !f.is_finite() {
            return None;
        }
        let s = format!("{f:.9}");
        let (m, e) = decimal_parts(s.trim_start_matches('-'))?;
        let m = if f < 0.0 { -m } else { m };
        Some(Quantity { mantissa: m, exp: e, format }.normalized())
    }

    /// Kubernetes' canonical string form.
    pub fn canonical(&self) -> String {
        let q = self.normalized();
        if q.mantissa == 0 {
            return "0".into();
        }
        if q.format == Format::BinarySI {
            let one_k = Quantity { mantissa: 1024, exp: 0, format: Format::DecimalSI };
            let minus_k = Quantity { mantissa: -1024, exp: 0, format: Format::DecimalSI };
            if q.cmp(&minus_k) == Ordering::Greater && q.cmp(&one_k) == Ordering::Less || q.exp < 0 {
                return Quantity { format: Format::DecimalSI, ..q }.canonical();
            }
            let Some(mut n) = scale_up(q.mantissa, q.exp) else {
                return Quantity { format: Format::DecimalSI, ..q }.canonical();
            };
            let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            let mut k = 0usize;
            while k < 6 && n % 1024 == 0 {
                n /= 1024;
                k += 1;
            }
            return format!("{n}{}", suffixes.get(k).copied().unwrap_or(""));
        }
        let mut m = q.mantissa;
        let mut e = q.exp;
        while e.rem_euclid(3) != 0 {
            m *= 10;
            e -= 1;
        }
        if e < -9 {
            // round up to nano, as Kubernetes does
            let shift = (-9 - e) as u32;
            let div = 10i128.pow(shift.min(30));
            let r = m / div + if m % div > 0 { 1 } else { 0 };
            m = r;
            e = -9;
        }
        while e > 18 {
            m *= 10;
            e -= 1;
        }
        if q.format == Format::DecimalExponent {
            if e == 0 {
                return m.to_string();
            }
            return format!("{m}e{e}");
        }
        let suffix = match e {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            _ => "E",
        };
        format!("{m}{suffix}")
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

/// By value: `1Gi` equals `1024Mi`; past `i128` the comparison falls back to `f64`.
impl Ord for Quantity {
    fn cmp(&self, other: &Quantity) -> Ordering {
        match Quantity::align(self, other) {
            Some((a, b, _)) => a.cmp(&b),
            None => self.as_f64().total_cmp(&other.as_f64()),
        }
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Quantity) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn scale_up(m: i128, by: i32) -> Option<i128> {
    if by < 0 {
        return None;
    }
    let mut m = m;
    for _ in 0..by {
        m = m.checked_mul(10)?;
    }
    Some(m)
}

fn decimal_parts(number: &str) -> Option<(i128, i32)> {
    let (int, frac) = match number.split_once('.') {
        Some((a, b)) => (a, b),
        None => (number, ""),
    };
    let frac = frac.trim_end_matches('0');
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let m: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    Some((m, -(frac.len() as i32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or(Quantity { mantissa: i128::MIN, exp: 0, format: Format::DecimalSI })
    }

    #[test]
    fn a_sign_a_dot_or_a_suffix_alone_is_zero_as_in_kubernetes() {
        for zero in ["-", "+", ".", "+.", "m", "Mi", "E", "-Ki", ".Gi"] {
            assert_eq!(Quantity::parse(zero), Some(q("0")), "{zero}");
        }
        for bad in ["", "e", "i", "KI", "1e", "ns", "0.0.1", " 1"] {
            assert_eq!(Quantity::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn parses_and_compares_binary_and_decimal() {
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert!(q("2Gi").cmp(&q("1Gi")) == Ordering::Greater);
        assert_eq!(q("10Mi"), q("10485760"));
        assert_eq!(q("0.1"), q("100m"));
        assert!(Quantity::parse("1h").is_none());
        assert!(Quantity::parse("abc").is_none());
        assert!(Quantity::parse("").is_none());
        assert_eq!(q("1e3"), q("1k"));
    }

    #[test]
    fn canonical_forms_match_kubernetes() {
        let cases = [
            ("1536Mi", "1536Mi"),
            ("2048Mi", "2Gi"),
            ("1.5", "1500m"),
            ("2000", "2k"),
            ("1500", "1500"),
            ("512", "512"),
            ("0.5Gi", "512Mi"),
            ("100m", "100m"),
            ("0", "0"),
        ];
        for (inp, out) in cases {
            assert_eq!(q(inp).canonical(), out, "{inp}");
        }
        assert_eq!(q("1536Mi").add(&q("512Mi")).map(|x| x.canonical()), Some("2Gi".into()));
        assert_eq!(q("2Gi").sub(&q("1Gi")).map(|x| x.canonical()), Some("1Gi".into()));
    }
}
