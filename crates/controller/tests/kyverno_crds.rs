//! Verno's CRDs against Kyverno 1.19's (`../shared/ecosystem/kyverno-crds/`, beside this
//! checkout; the test says so and passes when they are not there): for every kind Kyverno
//! defines, Verno installs a CRD with the same names, short names, categories and scope, serves
//! every version Kyverno serves, stores the same version, and shows the same printer columns,
//! so that `verno manifests --crds` can be applied over a Kyverno install and `kubectl get`
//! reads the same.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and reads files

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

fn kyverno_crds() -> Option<Vec<Value>> {
    let dir = verno_testkit::corpus("ecosystem/kyverno-crds", "Verno's CRDs against Kyverno's")?;
    let mut out = Vec::new();
    let mut dirs = vec![dir];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                for doc in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
                    if doc["kind"] == "CustomResourceDefinition" {
                        out.push(doc);
                    }
                }
            }
        }
    }
    Some(out)
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

/// A version's printer columns as `kubectl get` uses them.
fn columns(version: &Value) -> Vec<Value> {
    version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!([c["name"], c["type"], c["jsonPath"], c["priority"].as_i64().unwrap_or(0)]))
        .collect()
}

fn versions(crd: &Value) -> BTreeMap<String, Value> {
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v.clone()))
        .collect()
}

fn storage(crd: &Value) -> String {
    versions(crd).into_iter().find(|(_, v)| v["storage"] == true).map(|(n, _)| n).unwrap_or_default()
}

#[test]
fn verno_installs_every_kyverno_crd_with_its_names_versions_and_columns() {
    let Some(theirs) = kyverno_crds() else { return };
    assert!(theirs.len() >= 20, "only {} Kyverno CRDs read", theirs.len());
    let ours: BTreeMap<String, Value> = verno_controller::crds::all()
        .into_iter()
        .map(|c| (c["metadata"]["name"].as_str().unwrap().to_string(), c))
        .collect();
    let mut problems = Vec::new();
    for k in &theirs {
        let name = k["metadata"]["name"].as_str().unwrap();
        let Some(v) = ours.get(name) else {
            problems.push(format!("{name}: Verno has no such CRD"));
            continue;
        };
        let (kn, vn) = (&k["spec"]["names"], &v["spec"]["names"]);
        for field in ["kind", "plural", "singular", "listKind"] {
            let want = kn[field].as_str().map(str::to_string).unwrap_or_else(|| match field {
                "listKind" => format!("{}List", kn["kind"].as_str().unwrap()),
                "singular" => kn["kind"].as_str().unwrap().to_lowercase(),
                _ => String::new(),
            });
            if vn[field].as_str() != Some(want.as_str()) {
                problems.push(format!("{name}: names.{field} is {} where Kyverno has {want}", vn[field]));
            }
        }
        for field in ["shortNames", "categories"] {
            if strings(&kn[field]) != strings(&vn[field]) {
                problems.push(format!("{name}: names.{field} {} where Kyverno has {}", vn[field], kn[field]));
            }
        }
        if k["spec"]["scope"] != v["spec"]["scope"] {
            problems.push(format!("{name}: scope {} where Kyverno has {}", v["spec"]["scope"], k["spec"]["scope"]));
        }
        if storage(k) != storage(v) {
            problems.push(format!("{name}: stores {} where Kyverno stores {}", storage(v), storage(k)));
        }
        let ours_v = versions(v);
        for (ver, kv) in versions(k) {
            if kv["served"] != true {
                continue;
            }
            match ours_v.get(&ver) {
                Some(vv) if vv["served"] == true => {
                    if columns(&kv) != columns(vv) {
                        problems.push(format!(
                            "{name} {ver}: printer columns {:?} where Kyverno has {:?}",
                            columns(vv),
                            columns(&kv)
                        ));
                    }
                }
                _ => problems.push(format!("{name}: {ver} is not served")),
            }
        }
    }
    assert!(problems.is_empty(), "{} differences:\n{}", problems.len(), problems.join("\n"));
}

/// Every `default` in a schema: (path, value), lists as `[]`.
fn defaults(schema: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    if let Some(d) = schema.get("default") {
        out.push((path.to_string(), d.clone()));
    }
    for (k, sub) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
        defaults(sub, &format!("{path}.{k}"), out);
    }
    if let Some(items) = schema.get("items") {
        defaults(items, &format!("{path}[]"), out);
    }
}

fn storage_defaults(crd: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Some((_, v)) = versions(crd).into_iter().find(|(_, v)| v["storage"] == true) {
        defaults(&v["schema"]["openAPIV3Schema"], "", &mut out);
    }
    out
}

/// A stored policy reads as Kyverno's: the defaults Verno's CRDs declare are Kyverno's, at
/// the same paths with the same values (the API server fills them in: `spec.admission`,
/// `rules[].skipBackgroundRequests`, `evaluation.admission.enabled`, …), and none is invented.
#[test]
fn the_defaults_verno_declares_are_kyvernos() {
    let Some(theirs) = kyverno_crds() else { return };
    let theirs: BTreeMap<String, Vec<(String, Value)>> =
        theirs.iter().map(|c| (c["metadata"]["name"].as_str().unwrap().to_string(), storage_defaults(c))).collect();
    let mut declared = 0;
    let mut problems = Vec::new();
    for c in verno_controller::crds::all() {
        let name = c["metadata"]["name"].as_str().unwrap().to_string();
        for (path, value) in storage_defaults(&c) {
            declared += 1;
            if !theirs.get(&name).is_some_and(|t| t.contains(&(path.clone(), value.clone()))) {
                problems.push(format!("{name}: default {value} at {path} is not Kyverno's"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(declared >= 30, "only {declared} defaults declared");
}
