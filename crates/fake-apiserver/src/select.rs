//! Query strings and label / field selectors.

use anyhow::{Result, bail};
use serde_json::Value;
use std::collections::HashMap;

pub fn query(req: &axum::extract::Request) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in req.uri().query().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => match bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(x) => {
                    out.push(x);
                    i += 3;
                    continue;
                }
                None => out.push(b),
            },
            b'+' => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A label selector requirement.
pub enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

pub fn parse_selector(s: &str) -> Result<Vec<Req>> {
    // Split on commas outside parentheses.
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    let set = |v: &str| {
        v.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|x| x.trim().to_string())
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for p in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        out.push(if let Some((k, v)) = p.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set(v))
        } else if let Some((k, v)) = p.split_once(" in ") {
            Req::In(k.trim().into(), set(v))
        } else if let Some(k) = p.strip_prefix('!') {
            Req::NotExists(k.trim().into())
        } else if p.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
            Req::Exists(p.into())
        } else {
            bail!("unable to parse requirement: {p:?}");
        });
    }
    Ok(out)
}

pub struct Filter {
    labels: Vec<Req>,
    /// (JSON pointer of the field, value, equal).
    fields: Vec<(String, String, bool)>,
}

impl Filter {
    pub fn parse(q: &HashMap<String, String>) -> Result<Filter> {
        let labels = q.get("labelSelector").map(|s| parse_selector(s)).transpose()?.unwrap_or_default();
        let mut fields = Vec::new();
        for p in q.get("fieldSelector").map(String::as_str).unwrap_or("").split(',').filter(|p| !p.is_empty()) {
            let (k, v, eq) = match p.split_once("!=") {
                Some((k, v)) => (k, v, false),
                None => match p.split_once("==").or_else(|| p.split_once('=')) {
                    Some((k, v)) => (k, v, true),
                    None => bail!("invalid field selector {p:?}"),
                },
            };
            if !matches!(k, "metadata.name" | "metadata.namespace") {
                bail!("field label not supported: {k}");
            }
            fields.push((format!("/{}", k.replace('.', "/")), v.to_string(), eq));
        }
        Ok(Filter { labels, fields })
    }

    pub fn matches(&self, o: &Value) -> bool {
        let label = |k: &str| o.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v.as_str()),
            Req::Ne(k, v) => label(k) != Some(v.as_str()),
            Req::In(k, vs) => label(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => label(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|(k, v, eq)| {
                let actual = o.pointer(k).and_then(Value::as_str).unwrap_or("");
                (actual == v) == *eq
            })
    }
}
