//! `{{ }}` variables, parsed at compile time.
//!
//! A string leaf or key of a rule may hold variables. When the whole string is exactly one
//! variable the result keeps its JSON type; otherwise values are spliced in (strings raw, other
//! values JSON-encoded). Nested variables (`{{ a.{{b}} }}`) are resolved innermost first by
//! re-scanning, and `\{{` escapes.
//!
//! A value spliced in is data, never a template: `{{` inside it (a Pod's image, an annotation,
//! a ConfigMap value) is never evaluated, so a resource cannot make Verno run its own JMESPath,
//! grow a message pass after pass, or read `request.userInfo` into a denial. Kyverno re-scans
//! substituted text unless `{{- }}` is used; Verno treats every variable as `{{- }}` does.

use crate::context::Context;
use crate::error::CompileError;
use crate::error::EvalError;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::LazyLock;
use verno_jmespath::Expression;

static VAR: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"(^|[^\\])(\{\{(?:\{[^{}]*\}|[^{}])*\}\})").unwrap_or_else(|_| unreachable_regex())
});

#[allow(clippy::panic)]
fn unreachable_regex() -> regex::Regex {
    // The pattern above is a constant; failing to compile it is a programming error caught by tests.
    panic!("invalid built-in variable regex")
}

/// One variable occurrence: the text to replace and its compiled expression.
#[derive(Debug, Clone)]
struct Var {
    /// The `{{ ... }}` text as it appears.
    raw: String,
    /// Where it appears in the source (byte range).
    span: (usize, usize),
    /// The JMESPath inside, trimmed (`@` stays `@`).
    query: String,
    shallow: bool,
    expr: Option<Expression>,
    /// The same query with `request.object` rewritten to `request.oldObject`, for DELETE.
    delete_expr: Option<Expression>,
}

/// A compiled string that may contain variables.
#[derive(Debug, Clone)]
pub struct Template {
    source: String,
    vars: Vec<Var>,
    /// Variables nest: resolved by re-scanning at run time.
    nested: bool,
}

pub fn has_vars(s: &str) -> bool {
    s.contains("{{")
}

/// A variable of a template whose JMESPath does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("incorrect query {query}: {source}")]
pub struct TemplateError {
    pub query: String,
    #[source]
    pub source: verno_jmespath::ParseError,
}

impl Template {
    /// Parses `s`; JMESPath errors are reported as `incorrect query`.
    pub fn compile(s: &str) -> Result<Template, TemplateError> {
        let mut vars = Vec::new();
        let mut nested = false;
        for cap in VAR.captures_iter(s) {
            let Some(m) = cap.get(2) else { continue };
            let raw = m.as_str().to_string();
            let span = (m.start(), m.end());
            let inner = &raw[2..raw.len() - 2];
            if inner.contains("{{") {
                nested = true;
                continue;
            }
            let (shallow, q) = match inner.strip_prefix('-') {
                Some(r) => (true, r.trim()),
                None => (false, inner.trim()),
            };
            let query = q.to_string();
            let (expr, delete_expr) = if query == "@" {
                (None, None)
            } else {
                let e = Expression::compile(&query).map_err(|source| TemplateError { query: query.clone(), source })?;
                let d = delete_reading(&e);
                (Some(e), d)
            };
            vars.push(Var { raw, span, query, shallow, expr, delete_expr });
        }
        if s.contains("{{") && vars.is_empty() {
            // Only nested or malformed: decided at run time.
            nested = true;
        }
        Ok(Template { source: s.to_string(), vars, nested })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text, when it has no variables: what it renders to (with no `{{` in it, nested
    /// or escaped, there is nothing to unescape either).
    pub fn plain(&self) -> Option<&str> {
        (self.vars.is_empty() && !self.nested).then_some(self.source.as_str())
    }

    /// Renders to a JSON value. `at` is the JSON pointer of this string for `{{@}}`.
    pub fn render(&self, ctx: &Context, at: &str) -> Result<Value, EvalError> {
        if let Some(plain) = self.plain() {
            return Ok(Value::String(plain.to_string()));
        }
        if !self.nested {
            if let [v] = self.vars.as_slice()
                && v.raw == self.source
            {
                let out = resolve(v, ctx, at)?;
                return Ok(match out {
                    // Copied for unescaping only when it holds an escaped `\{{`.
                    // (A byte search first: most values hold no backslash, and setting up the
                    // substring search cost more than the rest of a short value's rendering.)
                    Value::String(s) if !v.shallow && s.as_bytes().contains(&b'\\') && s.contains("\\{{") => {
                        Value::String(unescape(&s))
                    }
                    other => other,
                });
            }
            // One pass over the source: each occurrence replaced by its value, in place, so a
            // value is never scanned for variables (nor for another variable's text).
            let mut out = String::with_capacity(self.source.len());
            let mut last = 0;
            for v in &self.vars {
                let (start, end) = v.span;
                out.push_str(self.source.get(last..start).unwrap_or_default());
                out.push_str(&protect(&splice_text(&resolve(v, ctx, at)?)));
                last = end;
            }
            out.push_str(self.source.get(last..).unwrap_or_default());
            // Variables the policy nests in its own text (`"{{element.name}}"` inside a larger
            // `{{ }}` the scan could not see whole) appear now; values cannot, being protected.
            if VAR.is_match(&out) {
                return render_dynamic(&out, ctx, at);
            }
            return Ok(Value::String(restore(&unescape(&out))));
        }
        render_dynamic(&self.source, ctx, at)
    }
}

fn splice_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// Marks `{{` in a spliced value so no later scan sees a variable there; [`restore`] puts it
/// back once substitution is over. The marker is a private-use character: a value that holds
/// it only turns it into `{`, after all evaluation.
fn protect(text: &str) -> Cow<'_, str> {
    if text.contains("{{") { Cow::Owned(text.replace("{{", "\u{E000}{")) } else { Cow::Borrowed(text) }
}

fn restore(s: &str) -> String {
    if s.contains('\u{E000}') { s.replace('\u{E000}', "{") } else { s.to_string() }
}

fn unescape(s: &str) -> String {
    if s.contains("\\{{") { s.replace("\\{{", "{{") } else { s.to_string() }
}

const MAX_ROUNDS: usize = 32;

/// Kyverno's re-scanning loop for nested variables, compiling as it goes.
fn render_dynamic(s: &str, ctx: &Context, at: &str) -> Result<Value, EvalError> {
    let mut value = s.to_string();
    for _ in 0..MAX_ROUNDS {
        let caps: Vec<String> =
            VAR.captures_iter(&value).filter_map(|c| c.get(2).map(|m| m.as_str().to_string())).collect();
        if caps.is_empty() {
            return Ok(Value::String(restore(&unescape(&value))));
        }
        let original = value.clone();
        for raw in caps {
            let inner = &raw[2..raw.len() - 2];
            if inner.contains("{{") {
                continue;
            }
            let t = Template::compile(&raw).map_err(|e| EvalError::Substitution(e.to_string()))?;
            let Some(v) = t.vars.first() else { continue };
            let out = resolve(v, ctx, at)?;
            if original == raw {
                return Ok(out);
            }
            value = value.replace(&raw, &protect(&splice_text(&out)));
        }
        if value == original {
            break;
        }
    }
    Ok(Value::String(restore(&unescape(&value))))
}

fn resolve(v: &Var, ctx: &Context, at: &str) -> Result<Value, EvalError> {
    if v.query == "@" {
        let path = at_path(at, ctx);
        let e =
            Expression::compile(&path).map_err(|e| EvalError::Substitution(format!("incorrect query {path}: {e}")))?;
        return ctx
            .query(&e)
            .map_err(|e| EvalError::Substitution(format!("failed to resolve {} at path {at}: {e}", v.query)));
    }
    let expr = if ctx.is_delete() { v.delete_expr.as_ref().or(v.expr.as_ref()) } else { v.expr.as_ref() };
    let Some(expr) = expr else { return Ok(Value::Null) };
    ctx.query(expr).map_err(|e| {
        EvalError::Substitution(format!("failed to resolve {} at path {at}: JMESPath query failed: {e}", v.query))
    })
}

/// `{{@}}`: the JMESPath of the current pattern position in the resource.
fn at_path(pointer: &str, ctx: &Context) -> String {
    let segs: Vec<&str> = pointer.split('/').filter(|s| !s.is_empty()).collect();
    let after_foreach = match segs.iter().rposition(|s| *s == "foreach") {
        Some(i) => segs.get(i + 1..).unwrap_or_default().to_vec(),
        None => segs,
    };
    let rest: Vec<String> = after_foreach
        .into_iter()
        .skip(2)
        .map(|s| {
            let s = s.replace("~1", "/").replace("~0", "~");
            let s = crate::pattern::strip_anchor(&s);
            if s.parse::<usize>().is_ok() { format!("[{s}]") } else { format!(".\"{s}\"") }
        })
        .collect();
    let base = if ctx.has_key("target") { "target" } else { "request.object" };
    format!("{base}{}", rest.join("")).replace(".[", "[")
}

/// A JSON tree whose string leaves and keys may hold templates, compiled once.
#[derive(Debug, Clone)]
pub enum TValue {
    Static(Value),
    Str(Template),
    Array(Vec<TValue>),
    Object(Vec<(TKey, TValue)>),
}

#[derive(Debug, Clone)]
pub enum TKey {
    Static(String),
    Template(Template),
}

impl TValue {
    pub fn compile(v: &Value) -> Result<TValue, TemplateError> {
        if !contains_vars(v) {
            return Ok(TValue::Static(v.clone()));
        }
        Ok(match v {
            Value::String(s) => TValue::Str(Template::compile(s)?),
            Value::Array(a) => TValue::Array(a.iter().map(TValue::compile).collect::<Result<_, _>>()?),
            Value::Object(m) => TValue::Object(
                m.iter()
                    .map(|(k, x)| {
                        let key =
                            if has_vars(k) { TKey::Template(Template::compile(k)?) } else { TKey::Static(k.clone()) };
                        Ok((key, TValue::compile(x)?))
                    })
                    .collect::<Result<_, TemplateError>>()?,
            ),
            other => TValue::Static(other.clone()),
        })
    }

    pub fn is_static(&self) -> bool {
        matches!(self, TValue::Static(_))
    }

    /// Renders with variables substituted; borrows when there is nothing to substitute.
    pub fn render<'a>(&'a self, ctx: &Context, at: &str) -> Result<Cow<'a, Value>, EvalError> {
        match self {
            TValue::Static(v) => Ok(Cow::Borrowed(v)),
            TValue::Str(t) => t.render(ctx, at).map(Cow::Owned),
            TValue::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for (i, x) in a.iter().enumerate() {
                    out.push(x.render(ctx, &format!("{at}/{i}"))?.into_owned());
                }
                Ok(Cow::Owned(Value::Array(out)))
            }
            TValue::Object(m) => {
                let mut out = Map::new();
                for (k, x) in m {
                    let key = match k {
                        TKey::Static(s) => s.clone(),
                        TKey::Template(t) => splice_text(&t.render(ctx, at)?),
                    };
                    // A JSON Pointer: `/` and `~` inside a key are escaped (RFC 6901), so that
                    // `{{@}}` under `corp.com/retention` finds that one key.
                    let child = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    out.insert(key, x.render(ctx, &child)?.into_owned());
                }
                Ok(Cow::Owned(Value::Object(out)))
            }
        }
    }
}

pub fn contains_vars(v: &Value) -> bool {
    match v {
        Value::String(s) => has_vars(s),
        Value::Array(a) => a.iter().any(contains_vars),
        Value::Object(m) => m.iter().any(|(k, x)| has_vars(k) || contains_vars(x)),
        _ => false,
    }
}

/// A JMESPath with its DELETE variant (`request.object` read as `request.oldObject`).
#[derive(Debug, Clone)]
pub struct Query {
    pub expr: Expression,
    pub delete: Option<Expression>,
}

/// The DELETE reading of an expression: `request.object` read as `request.oldObject`, on the
/// parsed tree (a string that merely contains the words is left alone); `None` when the
/// expression does not read `request.object`.
pub(crate) fn delete_reading(expr: &Expression) -> Option<Expression> {
    expr.with_root_field_renamed("request", "object", "oldObject")
}

impl Query {
    pub fn compile(src: &str, path: &str) -> Result<Query, CompileError> {
        let s = src.trim();
        let s = s.strip_prefix("{{").and_then(|x| x.strip_suffix("}}")).map(str::trim).unwrap_or(s);
        let expr = Expression::compile(s).map_err(|e| CompileError::new(path, format!("invalid JMESPath: {e}")))?;
        let delete = delete_reading(&expr);
        Ok(Query { expr, delete })
    }

    pub fn pick(&self, delete: bool) -> &Expression {
        if delete { self.delete.as_ref().unwrap_or(&self.expr) } else { &self.expr }
    }
}

pub(crate) fn tv(v: &Value, path: &str) -> Result<TValue, CompileError> {
    TValue::compile(v).map_err(|e| CompileError::new(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{{@}}` under a key holding `/` (as label keys do: `corp.com/retention`) reads that key,
    /// not a path through `corp.com` and `retention`.
    #[test]
    fn at_reads_a_key_with_a_slash() {
        let request = json!({"object": {"metadata": {"labels": {"corp.com/retention": "days_37"}}}});
        let root = json!({"request": request}).as_object().cloned().unwrap_or_default();
        let ctx = Context::new(root, false, &verno_jmespath::NoEnv);
        let patch = json!({"metadata": {"labels": {"corp.com/retention": "{{ regex_replace_all('([0-9])([0-9])', '{{ @ }}', '${1}0') }}"}}});
        let t = TValue::compile(&patch).unwrap_or(TValue::Static(Value::Null));
        let out = t.render(&ctx, "/mutate/patchStrategicMerge").map(|v| v.into_owned());
        assert_eq!(out, Ok(json!({"metadata": {"labels": {"corp.com/retention": "days_30"}}})));
    }
}
