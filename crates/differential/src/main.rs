//! `differential [--cases N] [--jp M] [--seed S] [--kyverno PATH] [--verno PATH] [--out DIR] [--shrink K]`
//!
//! With `--jp M`, also M generated JMESPath expressions through both programs' `jp query`
//! (crates/differential/src/jp.rs), each a case of its own.
//! Generates ClusterPolicies and resources from the seed, runs every policy on every resource
//! of a batch through Kyverno's CLI and through Verno's, compares the policy reports, prints
//! each disagreeing (policy, resource) pair, shrinks the first K distinct ones into reproducers
//! under DIR (default `target/differential`), and ends with
//! `differential: cases=N agree=A disagree=D intended=I` (a case is one policy on one resource).
//! Exit status 1 when anything disagrees (intended differences aside).

// Generated values are read by key (`p["metadata"]["name"]`), which never panics (a missing
// key or a non-object reads as Null); nothing is written through `[]`.
#![allow(clippy::indexing_slicing)]

use anyhow::{Context as _, Result, bail};
use std::collections::BTreeSet;
use std::path::PathBuf;
use verno_differential::{Judged, Kind, Tools, apply, generate::Gen, judge, shrink, write_yaml};

/// Policies and resources per batch: each batch is one run of each program, every policy on
/// every resource.
const POLICIES: usize = 20;
const RESOURCES: usize = 25;

struct Args {
    cases: usize,
    seed: u64,
    kyverno: PathBuf,
    verno: PathBuf,
    out: PathBuf,
    shrink: usize,
    jp: usize,
}

fn args() -> Result<Args> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut a = Args {
        cases: 1000,
        seed: 1,
        kyverno: verno_differential::find_oracle(&repo).unwrap_or_else(|| repo.join(".tools/bin/kubectl-kyverno")),
        verno: repo.join("target/release/verno"),
        out: repo.join("target/differential"),
        shrink: 10,
        jp: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cases" => a.cases = value()?.parse().context("--cases")?,
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            "--kyverno" => a.kyverno = value()?.into(),
            "--verno" => a.verno = value()?.into(),
            "--out" => a.out = value()?.into(),
            "--shrink" => a.shrink = value()?.parse().context("--shrink")?,
            "--jp" => a.jp = value()?.parse().context("--jp")?,
            other => {
                bail!("unknown argument {other:?} (see the comment at the top of crates/differential/src/main.rs)")
            }
        }
    }
    for (what, p) in [("Kyverno's CLI (scripts/install-kyverno-oracle.sh)", &a.kyverno), ("verno", &a.verno)] {
        if !p.is_file() {
            bail!("{what} not found at {}", p.display());
        }
    }
    Ok(a)
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("differential: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run() -> Result<i32> {
    let a = args()?;
    let tools = Tools { kyverno: a.kyverno.clone(), verno: a.verno.clone() };
    std::fs::create_dir_all(&a.out)?;
    let mut g = Gen::new(a.seed);
    let (mut cases, mut agree, mut disagree, mut intended) = (0usize, 0usize, 0usize, 0usize);
    let mut shrunk = 0usize;
    let mut seen: BTreeSet<(Kind, String)> = BTreeSet::new();
    let mut intended_seen: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut by_kind: std::collections::BTreeMap<Kind, usize> = Default::default();
    let mut batch = 0usize;
    while cases < a.cases {
        batch += 1;
        let left = a.cases - cases;
        let np = POLICIES.min(left.div_ceil(RESOURCES)).max(1);
        let policies: Vec<serde_json::Value> = (0..np).map(|i| g.policy(&format!("b{batch}-p{i}"))).collect();
        let resources: Vec<serde_json::Value> = (0..RESOURCES).map(|i| g.resource(&format!("r-{i}"))).collect();
        // Kept beside the reproducers: the batch as both programs read it.
        let dir = a.out.join(format!("batch-{batch}"));
        std::fs::create_dir_all(&dir)?;
        let mut files = Vec::new();
        for p in &policies {
            let f = dir.join(format!("{}.yaml", p["metadata"]["name"].as_str().unwrap_or("p")));
            write_yaml(&f, std::slice::from_ref(p))?;
            files.push(f);
        }
        let rfile = dir.join("resources.yaml");
        write_yaml(&rfile, &resources)?;
        // One run each for the batch; a batch one program refuses is judged a policy at a time.
        let pairs = np * RESOURCES;
        let mut found = Vec::new();
        match judge(apply(&tools.kyverno, &files, &rfile)?, apply(&tools.verno, &files, &rfile)?, &policies) {
            Judged::Compared(d) => found.extend(d),
            _ => {
                for (p, f) in policies.iter().zip(&files) {
                    let (k, v) = (
                        apply(&tools.kyverno, std::slice::from_ref(f), &rfile)?,
                        apply(&tools.verno, std::slice::from_ref(f), &rfile)?,
                    );
                    match judge(k, v, std::slice::from_ref(p)) {
                        Judged::Compared(d) => found.extend(d),
                        Judged::BothRefused => {}
                        // Every pair of the policy counts as disagreeing.
                        Judged::OneRefused { by, why } => {
                            let name = p["metadata"]["name"].as_str().unwrap_or("");
                            for r in &resources {
                                let id = |k: &str| r["metadata"][k].as_str().unwrap_or("").to_string();
                                found.push(verno_differential::Disagreement {
                                    policy: name.to_string(),
                                    resource: (
                                        r["kind"].as_str().unwrap_or("").to_string(),
                                        id("namespace"),
                                        id("name"),
                                    ),
                                    kind: Kind::Refusal,
                                    detail: format!("only {by} refused the policy: {why}"),
                                    intended: None,
                                });
                            }
                        }
                    }
                }
            }
        }
        cases += pairs;
        let mut bad = 0;
        // A pair counts once: disagreeing if any of its differences is not intended.
        let mut pairs_seen: BTreeSet<(String, verno_differential::Resource)> = BTreeSet::new();
        let mut judged: Vec<(&verno_differential::Disagreement, Option<&'static str>)> = found
            .iter()
            .map(|d| {
                let policy = policies.iter().find(|p| p["metadata"]["name"] == d.policy.as_str());
                let why = verno_differential::intended(d)
                    .or_else(|| policy.and_then(verno_differential::intended_for_policy));
                (d, why)
            })
            .collect();
        judged.sort_by_key(|(_, why)| why.is_some());
        for (d, why) in judged {
            if !pairs_seen.insert((d.policy.clone(), d.resource.clone())) {
                continue;
            }
            if let Some(why) = why {
                intended += 1;
                let seen = intended_seen.entry(why).or_default();
                *seen += 1;
                if *seen == 1 {
                    println!("intended {:?} {}: {} ({why})", d.kind, d.policy, d.detail);
                }
                continue;
            }
            bad += 1;
            *by_kind.entry(d.kind.clone()).or_default() += 1;
            println!(
                "disagree {:?} {} on {}/{}/{}: {}",
                d.kind, d.policy, d.resource.0, d.resource.1, d.resource.2, d.detail
            );
            // A signature without names, to shrink each kind of disagreement once.
            let sig = d.detail.replace(&d.resource.2, "R").chars().take(160).collect::<String>();
            if shrunk < a.shrink && seen.insert((d.kind.clone(), sig)) {
                let policy = policies.iter().find(|p| p["metadata"]["name"] == d.policy.as_str());
                let resource = resources.iter().find(|r| {
                    r["kind"] == d.resource.0.as_str()
                        && r["metadata"]["name"] == d.resource.2.as_str()
                        && r["metadata"]["namespace"] == d.resource.1.as_str()
                });
                if let (Some(p), Some(r)) = (policy, resource) {
                    shrunk += 1;
                    let case_dir = a.out.join(format!("{:03}-{:?}", shrunk, d.kind).to_lowercase());
                    std::fs::create_dir_all(&case_dir)?;
                    match shrink(&tools, &case_dir, p, r, &d.kind, 300) {
                        Ok((p, r, detail)) => {
                            write_yaml(&case_dir.join("policy.yaml"), &[p])?;
                            write_yaml(&case_dir.join("resource.yaml"), &[r])?;
                            std::fs::write(case_dir.join("disagreement.txt"), format!("{detail}\n"))?;
                            println!("  shrunk into {}", case_dir.display());
                        }
                        Err(e) => {
                            write_yaml(&case_dir.join("policy.yaml"), std::slice::from_ref(p))?;
                            write_yaml(&case_dir.join("resource.yaml"), std::slice::from_ref(r))?;
                            std::fs::write(
                                case_dir.join("disagreement.txt"),
                                format!("{}\nnot shrunk: {e:#}\n", d.detail),
                            )?;
                            println!("  not shrunk ({e:#}); written to {}", case_dir.display());
                        }
                    }
                }
            }
        }
        disagree += bad;
        agree += pairs.saturating_sub(pairs_seen.len());
        eprintln!("batch {batch}: {pairs} cases, {bad} disagree");
    }
    if a.jp > 0 {
        let (n, bad, jp_intended) = jp_cases(&tools, &a)?;
        cases += n;
        agree += n - bad - jp_intended;
        disagree += bad;
        intended += jp_intended;
        println!("jp: cases={n} agree={} disagree={bad} intended={jp_intended}", n - bad - jp_intended);
    }
    for (why, n) in &intended_seen {
        let short: String = why.chars().take(90).collect();
        println!("intended {n}: {short}…");
    }
    if !by_kind.is_empty() {
        println!("disagreements by kind: {by_kind:?}");
    }
    println!("differential: cases={cases} agree={agree} disagree={disagree} intended={intended}");
    Ok(i32::from(disagree > 0))
}

/// The JMESPath differential: `a.jp` expressions on one input, in batches of 200 per run.
/// Kyverno's `jp query` shares state between the expressions of one run (a function that
/// reorders a list can reorder the input for the next), so a disagreement in a batch is
/// judged again with the expression alone.
fn jp_cases(tools: &Tools, a: &Args) -> Result<(usize, usize, usize)> {
    use verno_differential::jp;
    let dir = a.out.join("jp");
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("input.json");
    std::fs::write(&input, serde_json::to_string_pretty(&jp::input())?)?;
    let mut g = jp::JpGen::new(a.seed);
    let exprs: Vec<String> = (0..a.jp).map(|_| g.expression()).collect();
    let (mut bad, mut intended) = (0, 0);
    let mut failing = Vec::new();
    let mut reasons: BTreeSet<&str> = BTreeSet::new();
    for chunk in exprs.chunks(200) {
        let k = jp::query(&tools.kyverno, &input, chunk)?;
        let v = jp::query(&tools.verno, &input, chunk)?;
        for ((e, k), v) in chunk.iter().zip(&k).zip(&v) {
            if jp::same(k, v) {
                continue;
            }
            let one = std::slice::from_ref(e);
            let (k, v) = (jp::query(&tools.kyverno, &input, one)?, jp::query(&tools.verno, &input, one)?);
            let (Some(k), Some(v)) = (k.first(), v.first()) else { continue };
            if jp::same(k, v) {
                continue;
            }
            if let Some(why) = jp::intended(e, k, v) {
                intended += 1;
                if reasons.insert(why) {
                    println!("intended jp {e}: kyverno {k:?}, verno {v:?} ({why})");
                }
                continue;
            }
            bad += 1;
            println!("disagree jp {e}: kyverno {k:?}, verno {v:?}");
            failing.push(e.clone());
        }
    }
    std::fs::write(dir.join("disagreeing.txt"), failing.join("\n"))?;
    Ok((exprs.len(), bad, intended))
}
