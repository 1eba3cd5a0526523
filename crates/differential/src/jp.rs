//! The JMESPath differential: seeded expressions over Kyverno's functions and the standard
//! ones, with arguments near the boundaries (wrong types, nulls, empty strings and lists,
//! quantities, durations, times, versions, unicode, large and fractional numbers), evaluated
//! by `kubectl-kyverno jp query` and `verno jp query` on the same input and compared value by
//! value (an error is compared only as an error: the two word their errors differently).

// Generated values are read by key, which never panics.
#![allow(clippy::indexing_slicing)]

use anyhow::{Context as _, Result};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};

/// The input every expression reads.
pub fn input() -> Value {
    json!({
        "name": "web-1",
        "empty": "",
        "upper": "Hello World",
        "unicode": "naïve-日本",
        "spaces": "  padded  ",
        "mem": "1Gi",
        "mem2": "512Mi",
        "cpu": "500m",
        "dur": "1h30m",
        "dur2": "45s",
        "time": "2026-12-07T10:00:00Z",
        "time2": "2026-01-01T00:00:00+02:00",
        "ver": "1.25.3",
        "ver2": "v2.0.0-rc.1",
        "image": "docker.io/library/nginx:1.25",
        "image2": "nginx",
        "path": "/var/../etc//passwd",
        "url": "https://example.com/x",
        "json": "{\"a\": [1, 2], \"b\": null}",
        "yaml": "a: 1\nb: [x, y]\n",
        "b64": "aGVsbG8=",
        "int": 3,
        "neg": -2,
        "zero": 0,
        "float": 2.5,
        "big": 9007199254740993_i64,
        "t": true,
        "f": false,
        "nul": null,
        "nums": [3, 1, 2],
        "mixed": [1, "a", null, true, [1]],
        "strs": ["b", "a", "c", "a"],
        "none": [],
        "obj": {"app": "web", "tier": "db", "n": 1},
        "labels": {"app": "web"},
        "items": [
            {"name": "a", "v": 2, "tags": ["x"]},
            {"name": "b", "v": 1, "tags": []},
            {"name": "c", "tags": ["y", "z"]}
        ]
    })
}

/// Paths into [`input`] by the type they hold, and some that hold nothing.
const STRINGS: &[&str] = &[
    "name", "empty", "upper", "unicode", "spaces", "mem", "mem2", "cpu", "dur", "dur2", "time", "time2", "ver", "ver2",
    "image", "image2", "path", "url", "json", "yaml", "b64",
];
const NUMBERS: &[&str] = &["int", "neg", "zero", "float", "big", "`1`", "`0.5`", "`-1`", "`1e3`", "`100`"];
const OTHERS: &[&str] = &[
    "t",
    "f",
    "nul",
    "nums",
    "mixed",
    "strs",
    "none",
    "obj",
    "labels",
    "items",
    "missing",
    "obj.missing",
    "items[0]",
    "items[].v",
    "items[].tags[]",
    "`null`",
    "`[]`",
    "`{}`",
    "@",
];
const STRING_LITERALS: &[&str] = &[
    "'web'",
    "''",
    "'1Gi'",
    "'250Mi'",
    "'2'",
    "'1h'",
    "'-30m'",
    "'2026-12-07T12:00:00Z'",
    "'*'",
    "'w?b-*'",
    "'^web-(\\d+)$'",
    "'$1'",
    "'-'",
    "'1.25.0'",
    "'>=1.20.0'",
    "'<2.0.0'",
    "'Hello'",
    "'hello world'",
    "'a,b'",
    "'RFC3339'",
    "'2006-01-02'",
    "'0 * * * *'",
    "'e'",
    "'[x'",
];

/// Kyverno's functions and the standard ones, with their arity; time_now, time_now_utc and
/// random are left out (their values change from run to run).
const FUNCTIONS: &[(&str, usize)] = &[
    ("add", 2),
    ("subtract", 2),
    ("multiply", 2),
    ("divide", 2),
    ("modulo", 2),
    ("round", 2),
    ("sum", 1),
    ("compare", 2),
    ("equal_fold", 2),
    ("base64_decode", 1),
    ("base64_encode", 1),
    ("image_normalize", 1),
    ("is_external_url", 1),
    ("items", 3),
    ("label_match", 2),
    ("lookup", 2),
    ("md5", 1),
    ("sha1", 1),
    ("sha256", 1),
    ("object_from_lists", 2),
    ("parse_json", 1),
    ("parse_yaml", 1),
    ("path_canonicalize", 1),
    ("pattern_match", 2),
    ("regex_match", 2),
    ("regex_replace_all", 3),
    ("regex_replace_all_literal", 3),
    ("replace", 4),
    ("replace_all", 3),
    ("semver_compare", 2),
    ("split", 2),
    ("time_add", 2),
    ("time_after", 2),
    ("time_before", 2),
    ("time_between", 3),
    ("time_diff", 2),
    ("time_parse", 2),
    ("time_to_cron", 1),
    ("time_truncate", 2),
    ("time_utc", 1),
    ("to_boolean", 1),
    ("to_lower", 1),
    ("to_upper", 1),
    ("trim", 2),
    ("trim_prefix", 2),
    ("truncate", 2),
    ("abs", 1),
    ("avg", 1),
    ("ceil", 1),
    ("floor", 1),
    ("contains", 2),
    ("ends_with", 2),
    ("starts_with", 2),
    ("join", 2),
    ("keys", 1),
    ("values", 1),
    ("length", 1),
    ("max", 1),
    ("min", 1),
    ("merge", 2),
    ("not_null", 2),
    ("reverse", 1),
    ("sort", 1),
    ("to_array", 1),
    ("to_string", 1),
    ("to_number", 1),
    ("type", 1),
];

pub struct JpGen {
    rng: StdRng,
}

impl JpGen {
    pub fn new(seed: u64) -> JpGen {
        JpGen { rng: StdRng::seed_from_u64(seed ^ 0x6a70) }
    }

    fn pick(&mut self, xs: &[&str]) -> String {
        xs.choose(&mut self.rng).map(|s| (*s).to_string()).unwrap_or_default()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// An argument: mostly of the type the function wants, sometimes any other.
    fn arg(&mut self, depth: usize) -> String {
        match self.rng.random_range(0..10) {
            0..=3 => {
                if self.chance(0.5) {
                    self.pick(STRINGS)
                } else {
                    self.pick(STRING_LITERALS)
                }
            }
            4 | 5 => self.pick(NUMBERS),
            6 | 7 => self.pick(OTHERS),
            _ if depth < 2 => self.call(depth + 1),
            _ => self.pick(STRINGS),
        }
    }

    fn call(&mut self, depth: usize) -> String {
        let Some(&(name, arity)) = FUNCTIONS.choose(&mut self.rng) else { return "@".into() };
        // Sometimes one argument too many or too few.
        let n = match self.rng.random_range(0..20) {
            0 if arity > 0 => arity - 1,
            1 => arity + 1,
            _ => arity,
        };
        let args: Vec<String> = (0..n).map(|_| self.arg(depth)).collect();
        format!("{name}({})", args.join(", "))
    }

    /// One expression: a call, or a comparison, filter, projection, pipe or logic around one.
    pub fn expression(&mut self) -> String {
        let base = self.call(0);
        match self.rng.random_range(0..12) {
            0 => format!("{base} == {}", self.arg(1)),
            1 => format!("{} < {}", self.arg(1), self.arg(1)),
            2 => format!("{base} || {}", self.arg(1)),
            3 => format!("!{base}"),
            4 => format!("items[?v > `1`].{}", self.pick(&["name", "tags", "v"])),
            5 => format!("items[?{}].name", self.pick(&["v", "tags", "!v", "contains(tags, 'x')", "v == `2`"])),
            6 => format!("{base} | [0]"),
            7 => format!(
                "{}[{}]",
                self.pick(&["nums", "strs", "none", "mixed", "name"]),
                self.pick(&["::-1", "1:", "-1", "0", ":2:2"])
            ),
            8 => format!("{{a: {base}, b: {}}}", self.arg(1)),
            9 => format!("sort_by(items, &{}) [].name", self.pick(&["name", "v", "to_string(v)"])),
            10 => format!("max_by(items, &{}).name", self.pick(&["v", "name", "length(tags)"])),
            _ => base,
        }
    }
}

/// What a program said about one expression.
#[derive(Debug, Clone, PartialEq)]
pub enum JpSaid {
    Value(Value),
    /// An error, in the program's words.
    Error(String),
}

/// Evaluates `queries` on `input` with `program jp query`, one process for as many as it
/// takes: both stop at the first error, so each run goes on after the one that failed.
pub fn query(program: &Path, input: &Path, queries: &[String]) -> Result<Vec<JpSaid>> {
    let mut out = Vec::with_capacity(queries.len());
    let home = tempfile::tempdir()?;
    while out.len() < queries.len() {
        let rest = queries.get(out.len()..).unwrap_or_default();
        let dir = tempfile::tempdir()?;
        let mut cmd = Command::new(program);
        cmd.args(["jp", "query", "-c", "-i"]).arg(input);
        // Each expression from its own file, so that no shell or flag parsing touches it.
        for (i, q) in rest.iter().enumerate() {
            let f = dir.path().join(format!("q{i}"));
            std::fs::write(&f, q)?;
            cmd.arg("-q").arg(f);
        }
        cmd.env("HOME", home.path()).env("KUBECONFIG", "/dev/null").env("NO_COLOR", "1");
        let o = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {}", program.display()))?;
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        let values = parse_query_output(&stdout);
        let answered = values.len().min(rest.len());
        out.extend(values.into_iter().take(answered).map(JpSaid::Value));
        if out.len() < queries.len() {
            if o.status.success() && answered == rest.len() {
                break;
            }
            // The next one failed (or printed nothing readable).
            let why = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            out.push(JpSaid::Error(why.trim().to_string()));
        }
    }
    Ok(out)
}

/// The values of `# query` / value blocks, in order.
fn parse_query_output(stdout: &str) -> Vec<Value> {
    let mut values = Vec::new();
    let mut current: Option<String> = None;
    for line in stdout.lines() {
        if line.starts_with("# ") {
            if let Some(text) = current.take() {
                values.push(serde_json::from_str(text.trim()).unwrap_or(Value::String(text)));
            }
            current = Some(String::new());
        } else if let Some(text) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some(text) = current.take()
        && !text.trim().is_empty()
    {
        values.push(serde_json::from_str(text.trim()).unwrap_or(Value::String(text)));
    }
    values
}

/// The one number of [`input`] beyond 2^53, and what Kyverno makes of it (it decodes JSON
/// numbers into float64).
const BIG: (i64, i64) = (9007199254740993, 9007199254740992);

/// Why a disagreement on `expr` is intended, if it is.
pub fn intended(expr: &str, k: &JpSaid, v: &JpSaid) -> Option<&'static str> {
    if expr.contains("keys(") || expr.contains("values(") {
        return Some(
            "keys() and values() of an object: Kyverno's order is Go's map order, which changes from run to run; Verno's is the keys' order",
        );
    }
    if expr.contains("base64_decode(") {
        return Some(
            "base64_decode of bytes that are not UTF-8: Kyverno keeps the raw bytes in its string, Verno's strings are UTF-8 (invalid bytes replaced)",
        );
    }
    if expr.contains("avg(none)") || expr.contains("avg(`[]`)") {
        return Some(
            "avg of an empty list: Kyverno's is NaN (an error when printed, true as a condition), which JSON cannot hold; Verno's is null",
        );
    }
    match (k, v) {
        (JpSaid::Value(_), JpSaid::Error(e)) if e.contains("invalid arity") || e.contains("unknown function") => Some(
            "Verno checks every call's function and arity when it compiles an expression; Kyverno only when the call is reached (a policy with such a call is refused when loaded)",
        ),
        (JpSaid::Value(kv), JpSaid::Value(vv)) if verno_jmespath::value::values_equal(kv, &rounded(vv)) => Some(
            "integers beyond 2^53: Kyverno decodes JSON numbers as float64 and rounds them; Verno keeps them exact",
        ),
        _ => None,
    }
}

/// `v` with [`BIG`] rounded as Kyverno rounds it.
fn rounded(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.as_i64() == Some(BIG.0) => json!(BIG.1),
        Value::String(s) => Value::String(s.replace(&BIG.0.to_string(), &BIG.1.to_string())),
        Value::Array(a) => Value::Array(a.iter().map(rounded).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), rounded(x))).collect()),
        other => other.clone(),
    }
}

/// Whether two answers are the same: numbers by value (`1` and `1.0` alike).
pub fn same(a: &JpSaid, b: &JpSaid) -> bool {
    match (a, b) {
        (JpSaid::Value(x), JpSaid::Value(y)) => verno_jmespath::value::values_equal(x, y),
        (JpSaid::Error(_), JpSaid::Error(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_output_reads_each_block() {
        let out = "# a\n3\n# b\n\"x\"\n# c\n{\n  \"k\": [1, 2]\n}\n";
        assert_eq!(parse_query_output(out), vec![json!(3), json!("x"), json!({"k": [1, 2]})]);
        assert!(same(&JpSaid::Value(json!([1.0])), &JpSaid::Value(json!([1]))));
        assert!(!same(&JpSaid::Value(json!("1")), &JpSaid::Value(json!(1))));
    }

    #[test]
    fn the_same_seed_gives_the_same_expressions() {
        let run = |s| {
            let mut g = JpGen::new(s);
            (0..20).map(|_| g.expression()).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }
}
