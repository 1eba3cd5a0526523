//! Kyverno as the oracle: generated ClusterPolicies and resources run through Kyverno's own CLI
//! (`kubectl-kyverno apply`, built by `scripts/install-kyverno-oracle.sh`) and through
//! `verno apply`, and their policy reports compared result by result (policy, rule, resource:
//! verdict and message). A disagreement is shrunk to a minimal policy and resource and written
//! as a reproducer. Kyverno is a separate program: nothing of it is linked.

// Reports are read by key (`r["resources"][0]`), which never panics (a missing key, index or
// a non-object reads as Null); `merge` indexes only an array it checked has one element.
#![allow(clippy::indexing_slicing)]
// `jp::input` is one large `json!` literal.
#![recursion_limit = "256"]

pub mod generate;
pub mod jp;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The two programs compared.
#[derive(Debug, Clone)]
pub struct Tools {
    pub kyverno: PathBuf,
    pub verno: PathBuf,
}

/// One result of a report: (policy, rule, kind, namespace, name).
pub type Key = (String, String, String, String, String);

/// A resource: (kind, namespace, name).
pub type Resource = (String, String, String);

/// A result's verdict and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub result: String,
    pub message: String,
}

/// What one program answered: its report's results, and the resources it wrote with `-o`
/// (the resource as mutated so far, once per policy with mutate rules, as Kyverno's CLI writes
/// them; generated resources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub results: BTreeMap<Key, Outcome>,
    pub outputs: Vec<Value>,
}

/// What one program said about a set of policies and resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Results(Answer),
    /// It refused the input (exit status, its words).
    Refused(String),
}

/// The Kyverno oracle in `.tools/bin` (or `$VERNO_KYVERNO_CLI`), if built.
pub fn find_oracle(repo: &Path) -> Option<PathBuf> {
    let p = std::env::var_os("VERNO_KYVERNO_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".tools/bin/kubectl-kyverno"));
    p.is_file().then_some(p)
}

/// Runs `apply` of one program on the policy files and the resource file, as a policy report
/// in JSON, the resources it produced written to a file (`-o`).
pub fn apply(program: &Path, policies: &[PathBuf], resources: &Path) -> Result<Said> {
    let mut cmd = Command::new(program);
    cmd.arg("apply").args(policies).arg("--resource").arg(resources);
    cmd.args(["--policy-report", "--output-format", "json"]);
    // Kyverno's CLI looks for a kubeconfig and a home for its caches; neither is needed.
    let home = tempfile::tempdir()?;
    let written = home.path().join("out.yaml");
    cmd.arg("-o").arg(&written);
    cmd.env("HOME", home.path()).env("KUBECONFIG", "/dev/null").env("NO_COLOR", "1");
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let refused = || {
        format!(
            "{}: {}{}",
            out.status,
            stdout.chars().take(600).collect::<String>(),
            String::from_utf8_lossy(&out.stderr).chars().take(600).collect::<String>()
        )
    };
    let Some(results) = parse_reports(&stdout) else { return Ok(Said::Refused(refused())) };
    let text = match std::fs::read_to_string(&written) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", written.display())),
    };
    let outputs = serde_saphyr::from_multiple::<Value>(&text)
        .with_context(|| format!("{} wrote YAML that does not parse:\n{text}", program.display()))?
        .into_iter()
        .filter(|v| !v.is_null())
        .collect();
    Ok(Said::Results(Answer { results, outputs }))
}

/// The results of the JSON reports in a CLI's output (text before the first report skipped);
/// `None` when there is no report.
pub fn parse_reports(stdout: &str) -> Option<BTreeMap<Key, Outcome>> {
    // Kyverno's CLI ends its notes on what it produced without a newline, the report after.
    let stdout = stdout
        .replace("Mutation has been applied successfully.", "\n")
        .replace("Generation completed successfully.", "\n");
    let start = stdout.lines().position(|l| l.starts_with('{'))?;
    let text: Vec<&str> = stdout.lines().skip(start).collect();
    let mut results = BTreeMap::new();
    for doc in text.join("\n").split("\n---\n") {
        let v: Value = serde_json::from_str(doc.trim()).ok()?;
        for r in v["results"].as_array().into_iter().flatten() {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            let res = &r["resources"][0];
            let key = (s(&r["policy"]), s(&r["rule"]), s(&res["kind"]), s(&res["namespace"]), s(&res["name"]));
            results.insert(key, Outcome { result: s(&r["result"]), message: s(&r["message"]) });
        }
    }
    Some(results)
}

/// Differences recorded in docs/compat.md as intended: (a substring of the detail, the reason).
pub const INTENDED: &[(&str, &str)] = &[(
    "Error while getting new resource: json: cannot unmarshal",
    "a field of the wrong type for Kubernetes (a string where a boolean belongs): Kyverno's typed decoding errors, Verno evaluates the object as written; the API server refuses such an object before any webhook sees it",
)];

/// Why a disagreement is intended, if it is.
pub fn intended(d: &Disagreement) -> Option<&'static str> {
    d.intended.or_else(|| INTENDED.iter().find(|(s, _)| d.detail.contains(s)).map(|(_, why)| *why))
}

/// After a mutate rule's error Kyverno hands an empty object on as the resource (its error
/// response carries an empty patched resource): later rules and policies see nothing, its CLI
/// reports nothing more for that resource and writes `{}`, and its webhook drops every later
/// policy's patches. Verno goes on with the resource as it was before the failing rule.
pub const BLANKED: &str = "Kyverno goes on with an empty resource after a mutate rule's error (its CLI then reports nothing more for the resource and writes `{}`); Verno goes on with the resource as it was before the failing rule";

/// Why any answer about `policy` is intended, if Kyverno's own answer is not decided by the
/// input: its check that labels and annotations in a pattern are strings stops at whichever of
/// the pattern's `metadata` and `spec` Go's map iteration meets first, so a pattern whose two
/// halves disagree is refused on some runs and applied on others. Verno checks both, always.
pub fn intended_for_policy(policy: &Value) -> Option<&'static str> {
    let strings = |meta: Option<&Value>| {
        ["labels", "annotations"].iter().all(|k| match meta.and_then(|m| m.get(*k)) {
            Some(Value::Object(m)) => m.values().all(Value::is_string),
            _ => true,
        })
    };
    let undecided = |p: &Value| {
        p.get("metadata").is_some_and(Value::is_object)
            && p.get("spec").is_some()
            && strings(p.get("metadata")) != strings(p.pointer("/spec/template/metadata"))
    };
    let rules = policy.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten();
    // Kyverno checks a validate rule's patterns and a mutate rule's strategic merge patch so.
    let patterns = rules.flat_map(|r| {
        let v = &r["validate"];
        let m = &r["mutate"];
        let foreach = v["foreach"].as_array().into_iter().flatten().map(|f| &f["pattern"]);
        let mutate_foreach = m["foreach"].as_array().into_iter().flatten().map(|f| &f["patchStrategicMerge"]);
        std::iter::once(&v["pattern"])
            .chain(v["anyPattern"].as_array().into_iter().flatten())
            .chain(foreach)
            .chain(std::iter::once(&m["patchStrategicMerge"]))
            .chain(mutate_foreach)
    });
    patterns.into_iter().any(undecided).then_some(
        "Kyverno's check that pattern labels are strings depends on Go's map order when a pattern has both `metadata` and `spec` (refused on some runs, applied on others); Verno always checks both",
    )
}

/// How the two programs differ on one (policy, resource) pair.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Pass vs fail, or any other verdict apart.
    Verdict,
    /// The same verdict, other words.
    Message,
    /// A result one printed and the other did not.
    Presence,
    /// One refused the policy, the other evaluated it.
    Refusal,
    /// The resources written (mutated or generated) differ.
    Output,
}

/// One disagreement, on a pair.
#[derive(Debug, Clone)]
pub struct Disagreement {
    pub policy: String,
    pub resource: Resource,
    pub kind: Kind,
    pub detail: String,
    /// Why it is intended, when the judge knows from the whole answer (see [`judge`]).
    pub intended: Option<&'static str>,
}

/// The (policy, resource) pairs of two programs' results that differ, each with its worst kind.
pub fn compare(kyverno: &BTreeMap<Key, Outcome>, verno: &BTreeMap<Key, Outcome>) -> Vec<Disagreement> {
    let mut worst: BTreeMap<(String, Resource), (Kind, String)> = BTreeMap::new();
    let keys: BTreeSet<&Key> = kyverno.keys().chain(verno.keys()).collect();
    for key in keys {
        let (k, v) = (kyverno.get(key), verno.get(key));
        let found = match (k, v) {
            (Some(k), Some(v)) if k.result != v.result => Some((
                Kind::Verdict,
                format!("rule {}: kyverno {} {:?}, verno {} {:?}", key.1, k.result, k.message, v.result, v.message),
            )),
            (Some(k), Some(v)) if normalized(&k.message) != normalized(&v.message) => Some((
                Kind::Message,
                format!("rule {} ({}): kyverno {:?}, verno {:?}", key.1, k.result, k.message, v.message),
            )),
            (Some(k), None) => {
                Some((Kind::Presence, format!("rule {}: only kyverno: {} {:?}", key.1, k.result, k.message)))
            }
            (None, Some(v)) => {
                Some((Kind::Presence, format!("rule {}: only verno: {} {:?}", key.1, v.result, v.message)))
            }
            _ => None,
        };
        if let Some((kind, detail)) = found {
            let pair = (key.0.clone(), (key.2.clone(), key.3.clone(), key.4.clone()));
            let slot = worst.entry(pair).or_insert((kind.clone(), detail.clone()));
            if kind < slot.0 {
                *slot = (kind, detail);
            }
        }
    }
    worst
        .into_iter()
        .map(|((policy, resource), (kind, detail))| Disagreement { policy, resource, kind, detail, intended: None })
        .collect()
}

/// A message as compared: a podSecurity failure's checks, `(Forbidden reason: …)` groups, are
/// sorted, since Kyverno prints them in an order that changes from run to run (Go map
/// iteration; seen with the same input run three times).
fn normalized(message: &str) -> std::borrow::Cow<'_, str> {
    let Some(at) = message.find("\": (Forbidden reason: ") else { return message.into() };
    let (head, tail) = message.split_at(at + 3);
    let mut groups: Vec<&str> = tail.split_inclusive("])").collect();
    groups.sort_unstable();
    format!("{head}{}", groups.concat()).into()
}

/// Writes values as a YAML stream.
pub fn write_yaml(path: &Path, docs: &[Value]) -> Result<()> {
    let mut text = String::new();
    for d in docs {
        text.push_str("---\n");
        text.push_str(&serde_saphyr::to_string(d)?);
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Both programs on one policy and one resource, in `dir`: the disagreement's kind on that pair
/// (`None`: they agree).
pub fn judge_pair(tools: &Tools, dir: &Path, policy: &Value, resource: &Value) -> Result<Option<(Kind, String)>> {
    let pfile = dir.join("policy.yaml");
    let rfile = dir.join("resource.yaml");
    write_yaml(&pfile, std::slice::from_ref(policy))?;
    write_yaml(&rfile, std::slice::from_ref(resource))?;
    let k = apply(&tools.kyverno, std::slice::from_ref(&pfile), &rfile)?;
    let v = apply(&tools.verno, std::slice::from_ref(&pfile), &rfile)?;
    Ok(match judge(k, v, std::slice::from_ref(policy)) {
        Judged::Compared(found) => found
            .into_iter()
            .filter(|d| intended(d).is_none())
            .min_by(|a, b| a.kind.cmp(&b.kind))
            .map(|d| (d.kind, d.detail)),
        Judged::BothRefused => None,
        Judged::OneRefused { by, why } => Some((Kind::Refusal, format!("only {by} refused: {why}"))),
    })
}

/// What the two programs' answers to the same input come to.
pub enum Judged {
    /// Both evaluated: their disagreements.
    Compared(Vec<Disagreement>),
    /// Both refused the input (an agreement).
    BothRefused,
    /// Only `by` (`kyverno` or `verno`) refused it, in these words.
    OneRefused { by: &'static str, why: String },
}

/// Judges Kyverno's answer `k` against Verno's `v` on `policies` (in the order both read
/// them).
pub fn judge(k: Said, v: Said, policies: &[Value]) -> Judged {
    match (k, v) {
        (Said::Results(k), Said::Results(v)) => {
            let mutating = mutating(policies);
            let mut found = compare(&k.results, &v.results);
            // What Kyverno left out of a resource it blanked is intended; what both said is
            // still compared.
            let gone = blanked(&k.outputs, &v.outputs);
            for d in &mut found {
                if d.kind == Kind::Presence && d.detail.contains(": only verno: ") && gone.contains(&d.resource) {
                    d.intended = Some(BLANKED);
                }
            }
            let outputs = compare_outputs(&k.outputs, &v.outputs, &mutating);
            // A resource mutated otherwise on purpose is validated (and mutated further) on
            // other input: what follows from the first differing copy is intended with it.
            for (o, at) in &outputs {
                let (Some(why), Some(at)) = (intended_output(o, *at, policies, &mutating), at) else { continue };
                let before = mutating.get(..*at).unwrap_or_default();
                for d in &mut found {
                    if d.intended.is_none() && d.resource == o.resource && !before.contains(&d.policy) {
                        d.intended = Some(why);
                    }
                }
            }
            found.extend(outputs.into_iter().map(|(mut o, at)| {
                o.intended = o.intended.or_else(|| intended_output(&o, at, policies, &mutating));
                o
            }));
            Judged::Compared(found)
        }
        (Said::Refused(_), Said::Refused(_)) => Judged::BothRefused,
        (Said::Refused(why), Said::Results(_)) => Judged::OneRefused { by: "kyverno", why },
        (Said::Results(_), Said::Refused(why)) => Judged::OneRefused { by: "verno", why },
    }
}

/// Kyverno resolves a `+(key)` inside a strategic-merge list element once, against the first
/// element of the resource's list it meets (matching the element's conditions or not), and
/// uses that answer for every other element: a field is added to none of the elements, or set
/// over an element's own value (kyverno#6686, kyverno#6750). Verno decides element by element.
pub const ADD_ANCHOR_IN_LISTS: &str = "Kyverno resolves `+(key)` in a strategic-merge list element against the first element it meets and reuses that for all (kyverno#6686, #6750): it adds to none, or overwrites a value; Verno decides per element";

/// See [`intended_output`].
pub const WRONG_TYPE_KEPT: &str = "a field of the wrong type in the resource (a string where a boolean belongs): Kyverno's merge writes the patch's value with the field's old type (\"false\"); Verno writes the patch's value; the API server refuses such an object before any webhook sees it";

/// Why an output disagreement (first differing at copy `at`) is intended, if it is.
fn intended_output(
    o: &Disagreement,
    at: Option<usize>,
    policies: &[Value],
    mutating: &[String],
) -> Option<&'static str> {
    if o.intended.is_some() {
        return o.intended;
    }
    // Kyverno's merge keeps a scalar's YAML tag when it sets it: over a string `"true"` (a
    // field of the wrong type in the resource) `false` is written as the string `"false"`.
    if let Some((_, sides)) = o.detail.rsplit_once(": kyverno ")
        && let Some((k, v)) = sides.split_once(", verno ")
        && k == format!("\"{v}\"")
    {
        return Some(WRONG_TYPE_KEPT);
    }
    let name = mutating.get(at?)?;
    let policy = policies.iter().find(|p| p["metadata"]["name"] == name.as_str())?;
    add_anchor_in_list(policy).then_some(ADD_ANCHOR_IN_LISTS)
}

/// Whether a policy's strategic merge patches have a `+(key)` inside a list element.
pub fn add_anchor_in_list(policy: &Value) -> bool {
    fn inside_list(v: &Value, in_list: bool) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, x)| (in_list && k.starts_with("+(")) || inside_list(x, in_list)),
            Value::Array(a) => a.iter().any(|x| inside_list(x, true)),
            _ => false,
        }
    }
    let rules = policy.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten();
    rules.into_iter().any(|r| inside_list(&r["mutate"], false))
}

/// The names of the policies with a mutate rule, in order.
pub fn mutating(policies: &[Value]) -> Vec<String> {
    policies
        .iter()
        .filter(|p| {
            p.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten().any(|r| r.get("mutate").is_some())
        })
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The written resources of two programs that differ, per resource: one copy per policy with
/// mutate rules (the `i`th copy of a resource comes from `mutating[i]`), generated ones once;
/// each with the index of its first differing copy (`None`: only their numbers differ).
pub fn compare_outputs(kyverno: &[Value], verno: &[Value], mutating: &[String]) -> Vec<(Disagreement, Option<usize>)> {
    // Both write the same copies in the same order (resource by resource, a copy per policy
    // with mutate rules), so a copy Kyverno blanked is the resource of Verno's copy there.
    let same_shape = kyverno.len() == verno.len();
    let mut by: BTreeMap<Resource, (Vec<&Value>, Vec<&Value>)> = BTreeMap::new();
    for (i, v) in kyverno.iter().enumerate() {
        let at = match verno.get(i) {
            Some(w) if is_blank(v) && same_shape => resource_of(w),
            _ => resource_of(v),
        };
        by.entry(at).or_default().0.push(v);
    }
    for v in verno {
        by.entry(resource_of(v)).or_default().1.push(v);
    }
    let mut found = Vec::new();
    for (resource, (k, v)) in by {
        let first = k.iter().zip(&v).position(|(a, b)| a != b);
        let (policy, detail) = match first {
            Some(i) => (
                mutating.get(i).cloned().unwrap_or_default(),
                format!("written copy {}: {}", i + 1, first_difference(k[i], v[i], &mut String::new())),
            ),
            None if k.len() != v.len() => (
                mutating.get(k.len().min(v.len())).cloned().unwrap_or_default(),
                format!("kyverno wrote {} copies, verno {}", k.len(), v.len()),
            ),
            None => continue,
        };
        let blanked = first.and_then(|i| k.get(i)).is_some_and(|x| is_blank(x));
        let intended = blanked.then_some(BLANKED);
        found.push((Disagreement { policy, resource, kind: Kind::Output, detail, intended }, first));
    }
    found
}

/// The resources Kyverno blanked after a mutate error (see [`BLANKED`]): those of the copies
/// it wrote as `{}`, placed by Verno's copies.
fn blanked(kyverno: &[Value], verno: &[Value]) -> BTreeSet<Resource> {
    if kyverno.len() != verno.len() {
        return BTreeSet::new();
    }
    kyverno.iter().zip(verno).filter(|(k, _)| is_blank(k)).map(|(_, v)| resource_of(v)).collect()
}

/// A written resource's (kind, namespace, name).
fn resource_of(v: &Value) -> Resource {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    (s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

/// Kyverno's `{}` for a resource it blanked (see [`BLANKED`]).
fn is_blank(v: &Value) -> bool {
    v.as_object().is_some_and(serde_json::Map::is_empty)
}

/// Where two values first differ, with both sides there.
fn first_difference(a: &Value, b: &Value, at: &mut String) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) if p == q => {}
                    (Some(p), Some(q)) => {
                        at.push('/');
                        at.push_str(k);
                        return first_difference(p, q, at);
                    }
                    (p, q) => return format!("at {at}/{k}: kyverno {}, verno {}", shown(p), shown(q)),
                }
            }
            format!("at {at}: equal")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if p != q {
                    at.push_str(&format!("/{i}"));
                    return first_difference(p, q, at);
                }
            }
            format!("at {at}: equal")
        }
        _ => format!("at {at}: kyverno {}, verno {}", shown(Some(a)), shown(Some(b))),
    }
}

fn shown(v: Option<&Value>) -> String {
    match v {
        Some(v) => v.to_string().chars().take(300).collect(),
        None => "nothing".into(),
    }
}

/// Every place in `v` that can be removed: object members and array elements (paths of keys
/// and indexes), deepest first.
fn removable(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(PathStep::Key(k.clone()));
                removable(x, at, out);
                out.push(at.clone());
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(PathStep::Index(i));
                removable(x, at, out);
                out.push(at.clone());
                at.pop();
            }
        }
        _ => {}
    }
}

/// Which paths a shrink must keep.
type Keep = dyn Fn(&[PathStep]) -> bool;

#[cfg(test)]
mod tests {
    #[test]
    fn pod_security_checks_compare_in_any_order() {
        let a = "Validation rule 'r' failed. It violates PodSecurity \"restricted:latest\": (Forbidden reason: a, field error list: [x])(Forbidden reason: b, field error list: [y])";
        let b = "Validation rule 'r' failed. It violates PodSecurity \"restricted:latest\": (Forbidden reason: b, field error list: [y])(Forbidden reason: a, field error list: [x])";
        assert_eq!(super::normalized(a), super::normalized(b));
        assert_ne!(super::normalized(a), super::normalized(&a.replace("[x]", "[z]")));
    }
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn remove_at(v: &Value, path: &[PathStep]) -> Option<Value> {
    let mut out = v.clone();
    let (last, parents) = path.split_last()?;
    let mut at = &mut out;
    for step in parents {
        at = match step {
            PathStep::Key(k) => at.get_mut(k.as_str())?,
            PathStep::Index(i) => at.get_mut(*i)?,
        };
    }
    match (last, at) {
        (PathStep::Key(k), Value::Object(m)) => m.remove(k).map(|_| ()),
        (PathStep::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            Some(())
        }
        _ => None,
    }?;
    Some(out)
}

/// Shrinks a disagreeing pair: removes members of the resource, then of the policy's rules
/// (never its name, kind or rules list), one at a time, keeping each removal after which the
/// two programs still disagree in the same way. At most `budget` trials.
pub fn shrink(
    tools: &Tools,
    dir: &Path,
    policy: &Value,
    resource: &Value,
    kind: &Kind,
    budget: usize,
) -> Result<(Value, Value, String)> {
    let (mut p, mut r) = (policy.clone(), resource.clone());
    let mut detail = match judge_pair(tools, dir, &p, &r)? {
        Some((k, d)) if &k == kind => d,
        Some((k, d)) => bail!("the pair alone disagrees otherwise ({k:?}: {d})"),
        None => bail!("the pair alone agrees (the disagreement needs other policies or resources)"),
    };
    let mut trials = 0;
    let keep_resource = |path: &[PathStep]| {
        matches!(path, [PathStep::Key(k)] if k == "apiVersion" || k == "kind" || k == "metadata")
            || matches!(path, [PathStep::Key(m), PathStep::Key(k)] if m == "metadata" && (k == "name" || k == "namespace"))
            // A list element's merge key (a container without a name is not a Kubernetes object).
            || matches!(path, [.., PathStep::Index(_), PathStep::Key(k)] if k == "name")
    };
    let keep_policy = |path: &[PathStep]| {
        path.len() < 3
            || matches!(path, [PathStep::Key(s), PathStep::Key(r), PathStep::Index(_)] if s == "spec" && r == "rules")
            || matches!(path, [_, _, _, PathStep::Key(k)] if k == "name" || k == "match")
    };
    loop {
        let mut progressed = false;
        for target in [0, 1] {
            let keep: &Keep = if target == 0 { &keep_resource } else { &keep_policy };
            let subject = if target == 0 { &r } else { &p };
            let mut paths = Vec::new();
            removable(subject, &mut Vec::new(), &mut paths);
            // Whole subtrees first (shorter paths), so that a big removal is tried before its parts.
            paths.sort_by_key(Vec::len);
            for path in paths.into_iter().filter(|p| !keep(p)) {
                if trials >= budget {
                    return Ok((p, r, detail));
                }
                let current = if target == 0 { &r } else { &p };
                let Some(smaller) = remove_at(current, &path) else { continue };
                trials += 1;
                let verdict = if target == 0 {
                    judge_pair(tools, dir, &p, &smaller)?
                } else {
                    judge_pair(tools, dir, &smaller, &r)?
                };
                if let Some((k, d)) = verdict
                    && &k == kind
                {
                    if target == 0 {
                        r = smaller
                    } else {
                        p = smaller
                    }
                    detail = d;
                    progressed = true;
                    break;
                }
            }
            if progressed {
                break;
            }
        }
        if !progressed {
            return Ok((p, r, detail));
        }
    }
}
