//! `verno apply`: evaluate policies on manifests, print failures and Kyverno's summary line.

use crate::data::{CliData, Requests};
use crate::load::{self, LoadedPolicies, load_exceptions, load_policies, parse_user_info, parse_values};
use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};
use std::path::PathBuf;
use verno_engine::{CompiledPolicy, PolicyResponse, PolicySet, RequestUser, Status};

#[derive(Debug, Clone, clap::Args)]
pub struct ApplyArgs {
    /// Policy files or directories.
    #[arg(required = true)]
    pub policies: Vec<PathBuf>,
    /// Resource files or directories.
    #[arg(short = 'r', long = "resource", alias = "resources", required = true)]
    pub resources: Vec<PathBuf>,
    /// A Values file (`kind: Values`).
    #[arg(short = 'f', long = "values-file")]
    pub values_file: Option<PathBuf>,
    /// Variables as `key=value` (comma-separated pairs allowed); override the values file.
    #[arg(short = 's', long = "set", value_delimiter = ',')]
    pub set: Vec<String>,
    /// A UserInfo file (roles, clusterRoles, userInfo).
    #[arg(short = 'u', long = "userinfo")]
    pub userinfo: Option<PathBuf>,
    /// PolicyException files or directories.
    #[arg(short = 'e', long = "exceptions", alias = "exception")]
    pub exceptions: Vec<PathBuf>,
    /// Report failures of Audit rules as warnings.
    #[arg(long)]
    pub audit_warn: bool,
    /// Exit with this code when there are warnings (and no failures).
    #[arg(long)]
    pub warn_exit_code: Option<i32>,
    /// Print the results as reports, as Kyverno's CLI does (`openreports.io/v1alpha1`
    /// ClusterReport `merged`, one report per namespaced policy).
    #[arg(short = 'p', long = "policy-report")]
    pub policy_report: bool,
    /// `json` or `yaml`: machine-readable results. Anything else is a path: mutated and
    /// generated resources are written there (a directory when it exists or ends in `/`, one
    /// file per resource; otherwise one multi-document YAML file).
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
    /// The format of `--policy-report`'s reports, `yaml` (default) or `json` (Kyverno's
    /// `--output-format`).
    #[arg(long = "output-format", value_parser = ["json", "yaml"])]
    pub output_format: Option<String>,
    /// Print every rule result, not only failures.
    #[arg(long)]
    pub detailed_results: bool,
}

pub fn run(args: &ApplyArgs) -> i32 {
    match run_inner(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e:#}");
            2
        }
    }
}

fn parse_set(s: &str) -> Result<(String, Value)> {
    let (k, v) = s.split_once('=').ok_or_else(|| anyhow!("invalid --set {s:?}: expected key=value"))?;
    Ok((k.trim().to_string(), Value::String(v.trim().to_string())))
}

fn run_inner(args: &ApplyArgs) -> Result<i32> {
    let Inputs { policies, resources, set, data, user, globals } = load_inputs(args)?;
    let runner = Requests { set: &set, data: &data, user: user.as_ref(), globals: &globals };
    let out_path = args.output.as_deref().filter(|o| *o != "json" && *o != "yaml").map(PathBuf::from);
    let format = args.output.as_deref().filter(|o| *o == "json" || *o == "yaml");
    let out = Printing { args, machine: format.is_some() || args.policy_report, to_file: out_path.is_some() };
    if !out.machine {
        print_header(&policies, &set, resources.len());
    }
    // As Kyverno's CLI: a policy that does not pass validation is skipped (listed with its
    // reason, each counted as an error), and the others are applied.
    print_skipped(&policies, format.is_some());
    let mut tally = Tally { error: policies.invalid.len(), ..Tally::default() };
    let now = chrono::Utc::now().timestamp();
    let total = resources.len();
    // The ClusterPolicies and Policies with a mutate rule (see the loop below), once.
    let hands_on: Vec<bool> = policies
        .compiled
        .iter()
        .map(|p| {
            matches!(p.kind, verno_api::Kind::ClusterPolicy | verno_api::Kind::Policy)
                && p.rules.iter().any(|rule| rule.rule_type() == verno_engine::RuleType::Mutation)
        })
        .collect();
    for (n, r) in resources.iter().enumerate() {
        if total >= 200 && n % 100 == 0 {
            eprintln!("Processed {n}/{total} resources");
        }
        let op = runner.operation_for(None, r);
        let responses = runner.run(r, &op);
        let ns = r.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let key =
            format!("{ns}/{}/{}", load::kind(r), r.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""));
        // As Kyverno's CLI, every ClusterPolicy or Policy with a mutate rule hands on the
        // resource as mutated so far, matched or not: `-o` gets one copy per such policy.
        let mut mutated_so_far = r;
        for (i, ((p, resp), &hands_on)) in policies.compiled.iter().zip(&responses).zip(&hands_on).enumerate() {
            if hands_on && let Some(patched) = &resp.patched {
                mutated_so_far = patched;
            }
            if args.policy_report {
                tally.report_results.extend(
                    verno_engine::report::results_with(p, resp, args.audit_warn)
                        .into_iter()
                        .map(|mut x| {
                            subject_result(&mut x, r, now);
                            x
                        })
                        .map(|x| (i, x)),
                );
            }
            tally.policy(&out, p, resp, &key, hands_on.then_some(mutated_so_far));
        }
    }
    print_results(args, format, &policies.compiled, &mut tally)?;
    if let Some(path) = &out_path {
        write_outputs(path, &tally.produced)?;
    }
    Ok(exit_code(args, out.machine, &tally))
}

/// What `verno apply` reads before evaluating anything.
struct Inputs {
    policies: LoadedPolicies,
    /// The resources to evaluate (Kyverno policies among them left out).
    resources: Vec<Value>,
    /// The policies with the exceptions.
    set: PolicySet,
    data: CliData,
    user: Option<(RequestUser, Value)>,
    /// The values file's global values, then `--set`.
    globals: Vec<(String, Value)>,
}

/// Reads the policies, resources, exceptions, values file and user info of `args`.
fn load_inputs(args: &ApplyArgs) -> Result<Inputs> {
    let mut pdocs = Vec::new();
    for p in &args.policies {
        pdocs.extend(load::read_docs(p)?);
    }
    let policies = load_policies(pdocs);
    for (n, why) in &policies.unsupported {
        eprintln!("Warning: skipping policy {n}: {why}");
    }
    let mut resources: Vec<Value> = Vec::new();
    for p in &args.resources {
        for mut d in load::read_docs(p)? {
            if !load::is_kyverno_policy(&d.value) {
                load::as_kyverno_reads(&mut d.value);
                resources.push(d.value);
            }
        }
    }
    let mut edocs = Vec::new();
    for p in &args.exceptions {
        edocs.extend(load::read_docs(p)?);
    }
    let exceptions = load_exceptions(&edocs)?;
    let mut data = CliData::default();
    if let Some(vf) = &args.values_file
        && let Some(d) = load::read_docs(vf)?.first()
    {
        data.values = parse_values(&d.value, vf)?;
    }
    let user = match &args.userinfo {
        Some(u) => load::read_docs(u)?.first().map(|d| parse_user_info(&d.value, u)).transpose()?,
        None => None,
    };
    let mut globals: Vec<(String, Value)> =
        data.values.global_values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for s in &args.set {
        globals.push(parse_set(s)?);
    }
    let set = PolicySet::new(policies.compiled.clone(), exceptions);
    Ok(Inputs { policies, resources, set, data, user, globals })
}

/// Kyverno's list of the policies it skipped, on stdout (stderr when stdout carries Verno's
/// own JSON or YAML results).
fn print_skipped(policies: &LoadedPolicies, stdout_is_data: bool) {
    if policies.invalid.is_empty() {
        return;
    }
    const DIVIDER: &str = "----------------------------------------------------------------------";
    let mut text = format!("{DIVIDER}\nPolicies Skipped:\n");
    for (n, i) in policies.invalid.iter().enumerate() {
        text.push_str(&format!("{}. {}: {}\n", n + 1, i.name, i.reason));
    }
    text.push_str(DIVIDER);
    if stdout_is_data { eprintln!("{text}") } else { println!("{text}") }
}

/// Kyverno's `Applying N policy rule(s) to M resource(s)...` line: every rule, autogen's
/// included, as Kyverno counts them (a skipped policy's rules counted as written: its autogen
/// rules are not known).
fn print_header(policies: &LoadedPolicies, set: &PolicySet, resources: usize) {
    let exceptions = set.exceptions();
    let rule_count: usize = policies.compiled.iter().map(|p| p.rules.len()).sum::<usize>()
        + policies.invalid.iter().map(|i| i.rules).sum::<usize>();
    if exceptions.is_empty() {
        println!("\nApplying {rule_count} policy rule(s) to {resources} resource(s)...");
    } else {
        println!(
            "\nApplying {rule_count} policy rule(s) to {resources} resource(s) with {} exception(s)...",
            exceptions.len()
        );
    }
}

/// What is printed while evaluating: nothing per resource for machine-readable output
/// (`-o json|yaml`, `--policy-report`); no produced resources when they go to a file.
struct Printing<'a> {
    args: &'a ApplyArgs,
    machine: bool,
    to_file: bool,
}

/// The run's counts by reported status, its results and the resources it produced.
#[derive(Default)]
struct Tally {
    pass: usize,
    fail: usize,
    warn: usize,
    error: usize,
    skip: usize,
    /// `-o json|yaml`: one entry per rule result.
    results: Vec<Value>,
    /// `--policy-report`: per policy, its results as the reports controller writes them.
    report_results: Vec<(usize, Value)>,
    /// Mutated and generated resources, with the policy that produced them.
    produced: Vec<(String, Value)>,
    mutated_any: bool,
    generated_any: bool,
}

impl Tally {
    /// One policy's response to one resource (`key`: `namespace/kind/name`): its rule results
    /// counted, its produced resources kept, its failures printed.
    /// `handed_on`: the resource as mutated so far, for a policy with mutate rules.
    fn policy(
        &mut self,
        out: &Printing,
        p: &CompiledPolicy,
        resp: &PolicyResponse,
        key: &str,
        handed_on: Option<&Value>,
    ) {
        let audit_warn = out.args.audit_warn;
        let mut failures = Vec::new();
        let mut as_warning = false;
        for rr in &resp.rules {
            let status = p.report_result(rr, audit_warn);
            if rr.status == Status::Fail && status == Status::Warn {
                as_warning = true;
            }
            match status {
                Status::Pass => self.pass += 1,
                Status::Fail => self.fail += 1,
                Status::Warn => self.warn += 1,
                Status::Error => self.error += 1,
                Status::Skip => self.skip += 1,
            }
            if matches!(rr.status, Status::Fail | Status::Error) {
                failures.push(rr);
            }
            self.results.push(json!({
                "policy": resp.policy, "rule": rr.name, "resource": key, "result": status.as_str(), "message": rr.message,
                "scored": p.scored,
            }));
        }
        for o in self.outputs(resp, handed_on) {
            if !out.machine && !out.to_file {
                println!("\npolicy {} applied to {key}:", resp.policy);
                print!("{}", serde_saphyr::to_string(&o).unwrap_or_default());
                println!("---");
            }
            self.produced.push((resp.policy.clone(), o));
        }
        if out.machine {
            return;
        }
        if !failures.is_empty() {
            println!(
                "\npolicy {} -> resource {key} {}",
                resp.policy,
                if as_warning { "failed as audit warning:" } else { "failed:" }
            );
            for (i, f) in failures.iter().enumerate() {
                println!("{} - {} {}", i + 1, f.name, f.message);
            }
        }
        if out.args.detailed_results {
            for rr in &resp.rules {
                println!("  {} / {} / {key}: {} {}", resp.policy, rr.name, rr.status.as_str(), rr.message);
            }
        }
    }

    /// The resources a response produced: the resource as mutated so far (for a policy with
    /// mutate rules, whether they changed it or not, as Kyverno's CLI writes it) and patched
    /// targets, then the generated ones.
    fn outputs(&mut self, resp: &PolicyResponse, handed_on: Option<&Value>) -> Vec<Value> {
        let mut outputs: Vec<Value> = Vec::new();
        if let Some(v) = handed_on {
            self.mutated_any = true;
            outputs.push(v.clone());
            for rr in &resp.rules {
                outputs.extend(rr.patched_targets().iter().cloned());
            }
        } else if let Some(v) = &resp.patched
            && resp.rules.iter().any(|rr| {
                rr.status == Status::Pass
                    && matches!(rr.rule_type, verno_engine::RuleType::Mutation | verno_engine::RuleType::ImageVerify)
            })
        {
            // A CEL mutating policy that changed the resource, or verifyImages rules that
            // pinned a digest (or recorded their outcome in the annotations): printed as a
            // mutation.
            self.mutated_any = true;
            outputs.push(v.clone());
            for rr in &resp.rules {
                outputs.extend(rr.patched_targets().iter().cloned());
            }
        }
        for rr in &resp.rules {
            if !rr.generated().is_empty() {
                self.generated_any = true;
                outputs.extend(rr.generated().iter().cloned());
            }
        }
        outputs
    }
}

/// The end of the run: the reports (`--policy-report`), the results document (`-o json|yaml`),
/// or the summary line.
fn print_results(
    args: &ApplyArgs,
    format: Option<&str>,
    policies: &[std::sync::Arc<CompiledPolicy>],
    tally: &mut Tally,
) -> Result<()> {
    let Tally { pass, fail, warn, error, skip, .. } = *tally;
    let summary = json!({"pass": pass, "fail": fail, "warn": warn, "error": error, "skip": skip});
    if args.policy_report {
        let text = |v: &Value| {
            if args.output.as_deref() == Some("json") || args.output_format.as_deref() == Some("json") {
                serde_json::to_string_pretty(v).unwrap_or_default()
            } else {
                serde_saphyr::to_string(v).unwrap_or_default()
            }
        };
        for (n, report) in cli_reports(policies, std::mem::take(&mut tally.report_results)).iter().enumerate() {
            if n > 0 || report.get("kind").and_then(Value::as_str) != Some("ClusterReport") {
                println!("---");
            }
            println!("{}", text(report));
        }
    } else if let Some(fmt) = format {
        let doc = json!({"results": tally.results, "summary": summary});
        match fmt {
            "json" => println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default()),
            "yaml" => print!("{}", serde_saphyr::to_string(&doc).unwrap_or_default()),
            other => bail!("unknown output format {other:?}: expected json or yaml"),
        }
    } else {
        if tally.mutated_any {
            println!("\n\nMutation:\nMutation has been applied successfully.");
        }
        if tally.generated_any {
            println!("\n\nGenerate:\nGeneration completed successfully.");
        }
        println!("\npass: {pass}, fail: {fail}, warn: {warn}, error: {error}, skip: {skip} ");
    }
    Ok(())
}

/// 1 on failures or errors, `--warn-exit-code` on warnings alone, else 0.
fn exit_code(args: &ApplyArgs, machine: bool, tally: &Tally) -> i32 {
    if tally.fail > 0 || tally.error > 0 {
        if !machine && tally.fail > 0 {
            eprintln!("Error: exit as there are policy violations");
        }
        return 1;
    }
    if tally.warn > 0
        && let Some(c) = args.warn_exit_code
    {
        return c;
    }
    0
}

/// A report result as `kyverno apply --policy-report` prints it: the controller's result
/// stamped `now`, with the resource it is about in `resources`.
fn subject_result(x: &mut Value, resource: &Value, now: i64) {
    let Some(m) = x.as_object_mut() else { return };
    m.insert("timestamp".into(), json!({"seconds": now, "nanos": 0}));
    let mut subject = serde_json::Map::new();
    for (field, at) in [
        ("kind", "/kind"),
        ("namespace", "/metadata/namespace"),
        ("name", "/metadata/name"),
        ("uid", "/metadata/uid"),
        ("apiVersion", "/apiVersion"),
        ("resourceVersion", "/metadata/resourceVersion"),
    ] {
        if let Some(v) = resource.pointer(at).and_then(Value::as_str).filter(|v| !v.is_empty()) {
            subject.insert(field.into(), json!(v));
        }
    }
    m.insert("resources".into(), json!([subject]));
}

/// The reports `kyverno apply --policy-report` prints (Kyverno 1.19's CLI): the results of the
/// cluster-wide policies merged into one `openreports.io/v1alpha1` ClusterReport `merged`, then
/// one report per namespaced policy (which Kyverno's CLI labels `kind: PolicyReport`), each with
/// its summary.
fn cli_reports(policies: &[std::sync::Arc<verno_engine::CompiledPolicy>], results: Vec<(usize, Value)>) -> Vec<Value> {
    let report = |kind: &str, metadata: Value, results: Vec<Value>| {
        let summary = verno_engine::report::summary(&results);
        json!({"apiVersion": "openreports.io/v1alpha1", "kind": kind, "metadata": metadata, "results": results, "summary": summary})
    };
    let mut out = Vec::new();
    let (cluster, namespaced): (Vec<_>, Vec<_>) =
        results.into_iter().partition(|(i, _)| policies.get(*i).is_none_or(|p| !p.kind.is_namespaced()));
    if !cluster.is_empty() {
        out.push(report("ClusterReport", json!({"name": "merged"}), cluster.into_iter().map(|(_, x)| x).collect()));
    }
    let mut per_policy: Vec<(usize, Vec<Value>)> = Vec::new();
    for (i, x) in namespaced {
        match per_policy.iter_mut().find(|(j, _)| *j == i) {
            Some((_, v)) => v.push(x),
            None => per_policy.push((i, vec![x])),
        }
    }
    for (i, xs) in per_policy {
        let Some(p) = policies.get(i) else { continue };
        let metadata = json!({"name": p.name, "namespace": p.namespace.clone().unwrap_or_default()});
        out.push(report("PolicyReport", metadata, xs));
    }
    out
}

/// `s` as part of a file name: characters other than letters, digits, `.`, `_` and `-`
/// become `_`, and a part made only of dots (`..`) is spelled with `_` too.
fn file_part(s: &str) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    if !out.is_empty() && out.chars().all(|c| c == '.') {
        out = out.replace('.', "_");
    }
    out
}

/// Writes mutated and generated resources: one file per resource into a directory, or all of
/// them into one multi-document YAML file.
fn write_outputs(path: &std::path::Path, produced: &[(String, Value)]) -> Result<()> {
    use anyhow::Context as _;
    let is_dir = path.is_dir() || path.to_string_lossy().ends_with('/');
    if is_dir {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        for (_, o) in produced {
            // Names come from the resources (a request could name anything): each part is
            // made a plain file-name part, and the file must land in the folder itself.
            let kind = file_part(&load::kind(o).to_lowercase());
            let name = file_part(o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("unnamed"));
            let ns = file_part(o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""));
            let file = if ns.is_empty() { format!("{kind}-{name}.yaml") } else { format!("{ns}-{kind}-{name}.yaml") };
            let p = path.join(&file);
            if p.parent() != Some(path) || p.file_name().and_then(|f| f.to_str()) != Some(file.as_str()) {
                return Err(anyhow::anyhow!("refusing to write {file:?} outside {}", path.display()));
            }
            std::fs::write(&p, serde_saphyr::to_string(o).unwrap_or_default())
                .with_context(|| format!("writing {}", p.display()))?;
        }
    } else {
        let docs: Vec<String> = produced.iter().map(|(_, o)| serde_saphyr::to_string(o).unwrap_or_default()).collect();
        std::fs::write(path, docs.join("---\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
