//! Comparing produced resources with a test's files: `patchedResources`,
//! `generatedResource(s)` (and generate rules cloning a `cloneSourceResource`).
//!
//! As Kyverno's CLI does, both sides are tidied before comparing (null values, empty maps and
//! empty lists are dropped) and the labels Kyverno puts on generated objects are ignored.
//! A missing namespace and `default` compare equal (the CLI places namespaced test resources in
//! `default`).

use crate::load::{self, LoadedPolicies};
use crate::test_cmd::Row;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;
use verno_api::TestResult;
use verno_engine::PolicyResponse;

/// Why a row's produced resources do not match its files: the reason the result table shows.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    /// A file that could not be read (the error with its context).
    #[error("{0:#}")]
    Read(anyhow::Error),
    #[error("no response recorded for this row")]
    NoResponse,
    #[error("resource missing")]
    ResourceMissing,
    /// `kind name differs from file: the first difference`.
    #[error("{kind} {name} differs from {file}: {diff}")]
    Differs { kind: String, name: String, file: String, diff: String },
    #[error("no patched target {kind}/{name} (from {file})")]
    NoPatchedTarget { kind: String, name: String, file: String },
    #[error("{file} holds no {kind} named {name}")]
    NotInFile { kind: String, name: String, file: String },
    #[error("no generated {kind} named {name} (expected by {file})")]
    NoGenerated { kind: String, name: String, file: String },
}

fn tidy(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Object(m) => {
            let out: Map<String, Value> = m.iter().filter_map(|(k, x)| tidy(x).map(|t| (k.clone(), t))).collect();
            if out.is_empty() { None } else { Some(Value::Object(out)) }
        }
        Value::Array(a) => {
            let out: Vec<Value> = a.iter().map(|x| tidy(x).unwrap_or(Value::Null)).collect();
            if out.is_empty() { None } else { Some(Value::Array(out)) }
        }
        other => Some(other.clone()),
    }
}

/// The comparable form of a resource.
pub fn normalize(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        if meta.get("namespace").and_then(Value::as_str) == Some("default") {
            meta.remove("namespace");
        }
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.retain(|k, v| {
                !(k.starts_with("generate.kyverno.io/") || (k == "app.kubernetes.io/managed-by" && v == "kyverno"))
            });
        }
    }
    tidy(&v).unwrap_or(Value::Object(Map::new()))
}

fn ident(v: &Value) -> (String, String) {
    (load::kind(v).to_string(), v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string())
}

/// Same kind and name, and the same namespace when both say one (`default` when unset).
fn same(a: &Value, b: &Value) -> bool {
    let ns = |v: &Value| v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
    let (x, y) = (ns(a), ns(b));
    ident(a) == ident(b) && (x.is_empty() || y.is_empty() || x == y)
}

/// The first path where two JSON values differ.
fn first_diff(a: &Value, b: &Value, path: &str) -> Option<String> {
    if verno_engine::equal(a, b) {
        return None;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => {
                        if let Some(d) = first_diff(va, vb, &format!("{path}/{k}")) {
                            return Some(d);
                        }
                    }
                    None => return Some(format!("{path}/{k} is produced but not expected")),
                }
            }
            y.keys().find(|k| !x.contains_key(*k)).map(|k| format!("{path}/{k} is expected but missing"))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_diff(p, q, &format!("{path}/{i}")))
        }
        (Value::Array(x), Value::Array(y)) => Some(format!("{path} has {} elements, expected {}", x.len(), y.len())),
        _ => Some(format!("{path} is {a}, expected {b}")),
    }
}

fn compare_one(actual: &Value, expected: &Value, file: &str) -> Result<(), Mismatch> {
    let (a, e) = (normalize(actual), normalize(expected));
    match first_diff(&a, &e, "") {
        None => Ok(()),
        Some(diff) => {
            Err(Mismatch::Differs { kind: ident(actual).0, name: ident(actual).1, file: file.to_string(), diff })
        }
    }
}

fn read(base: &Path, file: &str) -> Result<Vec<Value>, Mismatch> {
    load::read_docs(&base.join(file)).map(|d| d.into_iter().map(|x| x.value).collect()).map_err(Mismatch::Read)
}

/// Checks a passing row's produced resources against the files its result names.
pub fn check_resources(
    entry: &TestResult,
    base: &Path,
    row: &Row,
    resources: &[Value],
    policies: &LoadedPolicies,
    cache: &HashMap<(usize, String), Vec<PolicyResponse>>,
) -> Result<(), Mismatch> {
    let generated_files: Vec<&String> =
        entry.generated_resource.iter().chain(entry.generated_resources.iter()).collect();
    if entry.patched_resources.is_none() && generated_files.is_empty() {
        return Ok(());
    }
    let Some((i, op, pidx)) = &row.source else {
        // No rule applied: the resource must be unchanged.
        if let Some(f) = &entry.patched_resources {
            let name = row.resource.rsplit('/').next().unwrap_or("");
            if let Some(r) = resources.iter().find(|r| ident(r).1 == name) {
                let expected = read(base, f)?;
                if let Some(e) = expected.iter().find(|e| ident(e) == ident(r)).or(expected.first()) {
                    return compare_one(r, e, f);
                }
            }
        }
        return Ok(());
    };
    let _ = policies;
    let pr = cache.get(&(*i, op.clone())).and_then(|v| v.get(*pidx)).ok_or(Mismatch::NoResponse)?;
    let rule_names = [entry.rule.clone(), format!("autogen-{}", entry.rule), format!("autogen-cronjob-{}", entry.rule)];
    let rr = pr.rules.iter().find(|r| rule_names.iter().any(|n| n.as_str() == r.name.as_str()));
    if let Some(f) = &entry.patched_resources {
        let expected = read(base, f)?;
        match rr.filter(|r| !r.patched_targets().is_empty()) {
            Some(r) => {
                // The file may also hold the (unchanged) trigger.
                let trigger = pr.patched.as_ref().or_else(|| resources.get(*i));
                for e in &expected {
                    let a = r.patched_targets().iter().chain(trigger).find(|t| same(t, e)).ok_or_else(|| {
                        Mismatch::NoPatchedTarget { kind: ident(e).0, name: ident(e).1, file: f.clone() }
                    })?;
                    compare_one(a, e, f)?;
                }
            }
            None => {
                let actual = pr.patched.as_ref().or_else(|| resources.get(*i)).ok_or(Mismatch::ResourceMissing)?;
                // Kyverno's CLI compares a CEL mutating policy's output with the file's object of
                // the same name and skips the comparison when the file has none; for ClusterPolicy
                // rows a file with a single object is that object.
                let cel = entry.is_mutating_policy || entry.is_mutating_admission_policy;
                let e = expected.iter().find(|e| same(e, actual)).or(if expected.len() == 1 && !cel {
                    expected.first()
                } else {
                    None
                });
                match e {
                    Some(e) => compare_one(actual, e, f)?,
                    None if cel => {}
                    None => {
                        return Err(Mismatch::NotInFile {
                            kind: ident(actual).0,
                            name: ident(actual).1,
                            file: f.clone(),
                        });
                    }
                }
            }
        }
    }
    for f in generated_files {
        let generated: &[Value] = rr.map(|r| r.generated()).unwrap_or_default();
        for e in read(base, f)? {
            let a = generated.iter().find(|g| same(g, &e)).ok_or_else(|| Mismatch::NoGenerated {
                kind: ident(&e).0,
                name: ident(&e).1,
                file: f.clone(),
            })?;
            compare_one(a, &e, f)?;
        }
    }
    Ok(())
}
