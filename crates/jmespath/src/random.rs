//! `random(pattern)`: a random string matching a regular expression, as goregen produces.
//! Unbounded repetitions are capped (at 10 extra), like goregen's default.

use rand::{Rng, SeedableRng};
use regex_syntax::hir::{Class, Hir, HirKind};

const MAX_EXTRA: u32 = 10;

/// The longest string `random()` makes: a pattern such as `[a-z]{100000000}` is refused instead
/// of taking the memory.
pub const MAX_LEN: usize = 4096;

/// Why `random()` could not make a string for a pattern.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RandomError {
    #[error("invalid regular expression: {0}")]
    Pattern(#[source] Box<regex_syntax::Error>),
    #[error("regular expression too deeply nested")]
    TooDeep,
    #[error("empty character class")]
    EmptyClass,
    #[error("the pattern makes strings longer than {MAX_LEN} bytes")]
    TooLong,
}

/// A string matching `pattern`, drawn from a generator seeded with `seed` (from the caller's
/// [`crate::Env`]), so the same seed gives the same string.
pub fn generate(pattern: &str, seed: u64) -> Result<String, RandomError> {
    let hir = regex_syntax::Parser::new().parse(pattern).map_err(|e| RandomError::Pattern(Box::new(e)))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = String::new();
    gen_into(&hir, &mut rng, &mut out, 0)?;
    Ok(out)
}

fn gen_into(h: &Hir, rng: &mut impl Rng, out: &mut String, depth: usize) -> Result<(), RandomError> {
    if depth > 100 {
        return Err(RandomError::TooDeep);
    }
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => Ok(()),
        HirKind::Literal(l) => {
            out.push_str(&String::from_utf8_lossy(&l.0));
            Ok(())
        }
        HirKind::Class(Class::Unicode(c)) => {
            let ranges = c.ranges();
            let total: u64 = ranges.iter().map(|r| r.end() as u64 - r.start() as u64 + 1).sum();
            if total == 0 {
                return Err(RandomError::EmptyClass);
            }
            let mut pick = rng.random_range(0..total);
            for r in ranges {
                let n = r.end() as u64 - r.start() as u64 + 1;
                if pick < n {
                    if let Some(ch) = char::from_u32(r.start() as u32 + pick as u32) {
                        out.push(ch);
                    }
                    return Ok(());
                }
                pick -= n;
            }
            Ok(())
        }
        HirKind::Class(Class::Bytes(c)) => {
            let ranges = c.ranges();
            let total: u64 = ranges.iter().map(|r| r.end() as u64 - r.start() as u64 + 1).sum();
            if total == 0 {
                return Err(RandomError::EmptyClass);
            }
            let mut pick = rng.random_range(0..total);
            for r in ranges {
                let n = r.end() as u64 - r.start() as u64 + 1;
                if pick < n {
                    out.push((r.start() + pick as u8) as char);
                    return Ok(());
                }
                pick -= n;
            }
            Ok(())
        }
        HirKind::Repetition(rep) => {
            let max = rep.max.unwrap_or(rep.min.saturating_add(MAX_EXTRA));
            let n = if max > rep.min { rng.random_range(rep.min..=max) } else { rep.min };
            for _ in 0..n {
                gen_into(&rep.sub, rng, out, depth + 1)?;
                if out.len() > MAX_LEN {
                    return Err(RandomError::TooLong);
                }
            }
            Ok(())
        }
        HirKind::Capture(c) => gen_into(&c.sub, rng, out, depth + 1),
        HirKind::Concat(xs) => {
            for x in xs {
                gen_into(x, rng, out, depth + 1)?;
            }
            Ok(())
        }
        HirKind::Alternation(xs) => {
            if xs.is_empty() {
                return Ok(());
            }
            let i = rng.random_range(0..xs.len());
            match xs.get(i) {
                Some(x) => gen_into(x, rng, out, depth + 1),
                None => Ok(()),
            }
        }
    }
}
