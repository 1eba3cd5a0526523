//! Chainsaw's expressions: `(…)` strings in JMESPath (jmespath-community, our
//! `Dialect::Community`), `$name` bindings, `\…\` escapes, the `~name.` foreach prefix and the
//! `-> name` binding suffix of assertion keys, and templating of documents sent to the API.

use anyhow::{Result, bail};
use serde_json::Value;
use verno_jmespath::{Dialect, Env, Expression};

/// Variables in scope; a later entry shadows an earlier one of the same name.
#[derive(Debug, Clone, Default)]
pub struct Bindings(Vec<(String, Value)>);

impl Bindings {
    pub fn with(&self, name: &str, value: Value) -> Bindings {
        let mut b = self.clone();
        b.0.push((name.to_string(), value));
        b
    }

    pub fn set(&mut self, name: &str, value: Value) {
        self.0.push((name.to_string(), value));
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

impl Env for Bindings {
    fn variable(&self, name: &str) -> Option<Value> {
        self.get(name).cloned()
    }
    fn now(&self) -> Option<chrono_now::DateTime> {
        Some(chrono_now::now())
    }
}

/// The clock chainsaw's `time_*` functions read (a test runner may read the clock).
mod chrono_now {
    pub type DateTime = chrono::DateTime<chrono::FixedOffset>;
    pub fn now() -> DateTime {
        chrono::Utc::now().fixed_offset()
    }
}

/// A string as kyverno-json's `expression.Parse` reads it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub foreach: bool,
    pub foreach_name: String,
    pub binding: String,
    /// `None`: not an expression (a plain or escaped string; `statement` is its text).
    pub compiler: Option<String>,
    pub statement: String,
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

pub fn parse(input: &str) -> Parsed {
    let mut p = Parsed::default();
    let mut s = input;
    // 1. `~name.rest` / `~.rest`
    if let Some(rest) = s.strip_prefix('~')
        && let Some(dot) = rest.find('.')
        && (dot == 0 || is_word(&rest[..dot]))
    {
        p.foreach = true;
        p.foreach_name = rest[..dot].to_string();
        s = &rest[dot + 1..];
    }
    // 2. `rest -> name` (the last `->` followed only by a word)
    if let Some(arrow) = s.rfind("->") {
        let name = s[arrow + 2..].trim_start();
        if is_word(name) {
            p.binding = name.to_string();
            s = s[..arrow].trim_end();
        }
    }
    // 3. `\text\` escapes; else `(compiler;statement)` / `(statement)`. Chainsaw matches both
    // with Go regular expressions whose `.` stops at a line break: a multi-line string is never
    // an expression (a CEL policy's `(a + b)\n  .map(…)` is applied as written).
    if s.contains('\n') {
        p.statement = s.to_string();
        return p;
    }
    if s.len() >= 3 && s.starts_with('\\') && s.ends_with('\\') {
        p.statement = s[1..s.len() - 1].to_string();
        return p;
    }
    if s.len() >= 3 && s.starts_with('(') && s.ends_with(')') {
        let inner = &s[1..s.len() - 1];
        match inner.find(';') {
            Some(semi) if is_word(&inner[..semi]) && semi + 1 < inner.len() => {
                p.compiler = Some(inner[..semi].to_string());
                p.statement = inner[semi + 1..].to_string();
            }
            _ => {
                p.compiler = Some("default".into());
                p.statement = inner.to_string();
            }
        }
        return p;
    }
    p.statement = s.to_string();
    p
}

/// Evaluates `statement` in `compiler` with `@` = `current`.
pub fn eval(compiler: &str, statement: &str, current: &Value, bindings: &Bindings) -> Result<Value> {
    match compiler {
        "default" | "jp" => {
            let e = Expression::compile_in(statement, Dialect::Community)?;
            Ok(e.search(current, bindings)?.into_owned())
        }
        "cel" => bail!("CEL expressions in chainsaw files are not supported yet: {statement}"),
        other => bail!("unknown expression engine {other:?} in ({other};{statement})"),
    }
}

/// A string value that is an expression evaluated; anything else returned as it is.
pub fn value_of(v: &Value, bindings: &Bindings) -> Result<Value> {
    match v {
        Value::String(s) => {
            let p = parse(s);
            match &p.compiler {
                Some(c) => eval(c, &p.statement, v, bindings),
                None => Ok(v.clone()),
            }
        }
        _ => Ok(v.clone()),
    }
}

/// Templating of a document sent to the API: every string value that is an expression is
/// replaced by its result; keys are never rewritten; escaped strings stay as they are.
pub fn template(doc: &Value, bindings: &Bindings) -> Result<Value> {
    Ok(match doc {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                out.insert(k.clone(), template(v, bindings)?);
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| template(x, bindings)).collect::<Result<_, _>>()?),
        Value::String(s) => {
            let p = parse(s);
            match (&p.compiler, p.foreach || !p.binding.is_empty()) {
                (Some(c), false) => eval(c, &p.statement, doc, bindings)?,
                _ => doc.clone(),
            }
        }
        _ => doc.clone(),
    })
}

/// Templating of the lookup fields of an assert/error document (apiVersion, kind, name,
/// namespace, labels); the rest stays an assertion tree.
pub fn template_lookup(doc: &Value, bindings: &Bindings) -> Result<Value> {
    let mut out = doc.clone();
    for ptr in ["/apiVersion", "/kind", "/metadata/name", "/metadata/namespace"] {
        if let Some(v) = out.pointer_mut(ptr) {
            *v = template(v, bindings)?;
        }
    }
    if let Some(Value::Object(labels)) = out.pointer_mut("/metadata/labels") {
        for v in labels.values_mut() {
            *v = template(v, bindings)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_parse_as_kyverno_json_reads_them() {
        let p = parse("(contains($stderr, 'x'))");
        assert_eq!(p.compiler.as_deref(), Some("default"));
        assert_eq!(p.statement, "contains($stderr, 'x')");
        let p = parse("(jp;a.b)");
        assert_eq!((p.compiler.as_deref(), p.statement.as_str()), (Some("jp"), "a.b"));
        let p = parse("~index.(containers) -> c");
        assert!(p.foreach);
        assert_eq!((p.foreach_name.as_str(), p.binding.as_str(), p.statement.as_str()), ("index", "c", "containers"));
        let p = parse("\\(not evaluated)\\");
        assert_eq!((p.compiler, p.statement.as_str()), (None, "(not evaluated)"));
        assert_eq!(parse("plain").compiler, None);
        assert_eq!(parse("()").compiler, None);
        // Go's `.` stops at a line break: a multi-line value is text.
        let cel = "(images.containers + images.init)\n  .all(i, i != '')";
        assert_eq!((parse(cel).compiler, parse(cel).statement.as_str()), (None, cel));
    }

    #[test]
    fn templating_replaces_values_not_keys() {
        let b = Bindings::default().with("namespace", json!("ns-1"));
        let doc = json!({"metadata": {"name": "x", "namespace": "($namespace)", "labels": {"($k)": "v"}}, "n": 1});
        let t = template(&doc, &b).unwrap();
        assert_eq!(t, json!({"metadata": {"name": "x", "namespace": "ns-1", "labels": {"($k)": "v"}}, "n": 1}));
        assert!(template(&json!({"a": "($undefined)"}), &b).is_err());
    }
}
