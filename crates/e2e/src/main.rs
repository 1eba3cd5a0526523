//! `verno-chainsaw CASE_DIR`: runs one of Kyverno's chainsaw tests against Verno, on a fresh
//! fake API server with `verno serve --kube` installed, and prints the result as the corpus's
//! runner contract asks (`../shared/chainsaw/README.md`): one JSON object on stdout, one entry
//! per step, exit 0 for pass, 1 for fail or unsupported, 2 when the runner itself broke.
//!
//!   verno-chainsaw [--keep] [--verno PATH] [--settle SECONDS] [--real] CASE_DIR
//!
//! `--real` runs the case with the real chainsaw (`chainsaw test`, v0.2.12 from
//! `scripts/install-control-plane.sh`) against a real control plane (etcd, kube-apiserver,
//! kube-controller-manager, kwok; `scripts/cluster.sh`) with Verno installed by its manifests
//! and running outside the cluster with its ServiceAccount's token (see `verno_e2e::real`);
//! chainsaw's JSON report becomes the contract's steps.
//!
//! `--keep` leaves the environment up after the test (the fake API server keeps serving; its
//! kubeconfig and Verno's log are printed on stderr) until Ctrl-C.
//!
//! `--settle S` makes a failing run fail sooner: an assert or error operation that still does
//! not hold after the cluster has taken no write (Leases and Events aside) for S seconds fails
//! then, rather than polling to its timeout (Kyverno's suite sets 90 s). It can only turn a
//! pass into a fail (a test waiting on something that writes later, such as a schedule), never
//! the reverse: an assertion passes only on what the cluster holds. It does not apply while
//! the cluster holds scheduled work (cleanup or deleting policies, `cleanup.kyverno.io/ttl`
//! labels), which writes nothing until its time. Off by default.

// The runner reads chainsaw documents as `serde_json::Value`s by key (`v["spec"]`), which
// never panics (a missing key or a non-object reads as Null); it never writes through `[]`.
#![allow(clippy::indexing_slicing)]

mod assert;
mod cluster;
mod expr;
mod run;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

struct Args {
    case: PathBuf,
    keep: bool,
    real: bool,
    verno: Option<PathBuf>,
    settle: Option<std::time::Duration>,
}

/// The arguments; `None`: help was asked for.
fn parse_args() -> Result<Option<Args>> {
    let mut case = None;
    let mut keep = false;
    let mut real = false;
    let mut verno = None;
    let mut settle = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keep" => keep = true,
            "--real" => real = true,
            "--verno" => verno = Some(PathBuf::from(it.next().context("--verno needs a path")?)),
            "--settle" => {
                let s = it.next().context("--settle needs seconds")?;
                let secs: u64 = s.parse().map_err(|_| anyhow!("--settle {s:?}: not a number of seconds"))?;
                settle = Some(std::time::Duration::from_secs(secs));
            }
            "-h" | "--help" => return Ok(None),
            s if s.starts_with('-') => bail!("unknown flag {s}"),
            s => case = Some(PathBuf::from(s)),
        }
    }
    Ok(Some(Args { case: case.context("a case directory is required")?, keep, real, verno, settle }))
}

/// The directory of this executable and its ancestors, for finding `verno` and `.tools/bin`.
fn exe_ancestors() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else { return Vec::new() };
    exe.ancestors().skip(1).map(Path::to_path_buf).collect()
}

fn find_verno(given: Option<PathBuf>) -> PathBuf {
    if let Some(v) = given.or_else(|| std::env::var_os("VERNO_BIN").map(PathBuf::from)) {
        return v;
    }
    exe_ancestors()
        .into_iter()
        .take(1)
        .map(|d| d.join("verno"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("verno"))
}

/// `PATH` with the project's pinned tools (`.tools/bin`, where scripts/install-kubectl.sh puts
/// kubectl) first, when they are found above this executable.
fn tools_path() -> String {
    let mut path = std::env::var("PATH").unwrap_or_default();
    if let Some(bin) = exe_ancestors().into_iter().map(|d| d.join(".tools/bin")).find(|p| p.join("kubectl").is_file()) {
        path = format!("{}:{path}", bin.display());
    }
    path
}

fn read_yaml(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    verno_jmespath::yaml::parse_all(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// The nearest `.chainsaw.yaml` above the case (chainsaw runs with the area's configuration).
fn find_config(case: &Path) -> Option<PathBuf> {
    case.ancestors().skip(1).map(|d| d.join(".chainsaw.yaml")).find(|p| p.is_file())
}

const ADJECTIVES: &[&str] = &[
    "brave", "calm", "eager", "fair", "gentle", "happy", "jolly", "kind", "lucky", "merry", "noble", "proud", "quick",
    "sunny", "tidy", "witty",
];
const ANIMALS: &[&str] = &[
    "badger", "crane", "dingo", "eagle", "ferret", "gecko", "heron", "ibis", "jackal", "koala", "lemur", "marten",
    "newt", "otter", "panda", "quail",
];

fn namespace_name() -> String {
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0)
            ^ std::process::id();
    let a = ADJECTIVES.get(seed as usize % ADJECTIVES.len()).unwrap_or(&"brave");
    let b = ANIMALS.get((seed as usize / 16) % ANIMALS.len()).unwrap_or(&"otter");
    format!("chainsaw-{a}-{b}")
}

/// What a Kyverno value set means for Verno: extra `verno serve` arguments, and the RBAC values
/// of the install (`RBAC_VALUES`, as the value set's `kyverno.yaml` in Kyverno's CI gives them;
/// a later set's list replaces an earlier one's, as Helm merges lists).
struct ConfigEffects {
    args: Vec<String>,
    rbac: Vec<(String, Value)>,
}

/// The chart values Kyverno's CI sets that Verno's chart takes under the same names: the extra
/// permissions of the admission, background and cleanup controllers (each its own service
/// account in Verno too).
const RBAC_VALUES: [&str; 4] = [
    "admissionController.rbac.clusterRole.extraResources",
    "reportsController.rbac.clusterRole.extraResources",
    "backgroundController.rbac.clusterRole.extraResources",
    "cleanupController.rbac.clusterRole.extraResources",
];

/// Kyverno CI's value set `name`: `ci/scripts/config/NAME/kyverno.yaml` in the nearest
/// directory above the case that has one (the suite's layout), read once per case.
fn value_set(case: &Path, name: &str) -> Result<Value> {
    let Some(file) =
        case.ancestors().map(|d| d.join("ci/scripts/config").join(name).join("kyverno.yaml")).find(|p| p.is_file())
    else {
        bail!("Kyverno's CI values ci/scripts/config/{name}/kyverno.yaml are not above the case");
    };
    Ok(read_yaml(&file)?.into_iter().next().unwrap_or(Value::Null))
}

/// The RBAC values of a Kyverno CI value set (see [`value_set`]).
fn value_set_rbac(doc: &Value) -> Vec<(String, Value)> {
    RBAC_VALUES
        .iter()
        .filter_map(|k| {
            let pointer = format!("/{}", k.replace('.', "/"));
            doc.pointer(&pointer).map(|v| (k.to_string(), v.clone()))
        })
        .collect()
}

/// The API server's `--runtime-config` for a case whose Kyverno CI cluster serves
/// MutatingAdmissionPolicy at v1alpha1 only (`scripts/config/kind/vap-v1alpha1.yaml`, Kubernetes
/// 1.33): v1alpha1 served on this control plane too, beside v1beta1 (1.35's API server does not
/// become ready without v1beta1: its MutatingAdmissionPolicy plugin watches that version), so the
/// case's v1alpha1 objects are read and written as there. Cases of a 1.36 cluster
/// (MutatingAdmissionPolicy v1) cannot be matched by this control plane (1.35).
fn runtime_config(case_json: Option<&Value>) -> Option<String> {
    let kind_configs = case_json?.pointer("/ci/kind_config")?.as_array()?;
    kind_configs
        .iter()
        .any(|k| k.as_str().is_some_and(|k| k.ends_with("vap-v1alpha1.yaml")))
        .then(|| "admissionregistration.k8s.io/v1alpha1=true,admissionregistration.k8s.io/v1beta1=true".to_string())
}

/// A CI value set's `features.policyExceptions` (`enabled`, `namespace`), when it sets them.
fn value_set_exceptions(doc: &Value) -> Option<(bool, String)> {
    doc.pointer("/features/policyExceptions").map(|p| {
        (
            p.get("enabled").and_then(Value::as_bool).unwrap_or(false),
            p.get("namespace").and_then(Value::as_str).unwrap_or("").to_string(),
        )
    })
}

/// The Helm value sets Verno can be configured from; `Err`: the test needs one it cannot (why,
/// as the report's reason).
fn check_configs(case: &Path, case_json: Option<&Value>) -> Result<ConfigEffects> {
    let none = ConfigEffects { args: Vec::new(), rbac: Vec::new() };
    let Some(configs) = case_json.and_then(|c| c.get("kyverno_configs")).and_then(Value::as_array) else {
        return Ok(none);
    };
    let mut args = Vec::new();
    let mut rbac: Vec<(String, Value)> = Vec::new();
    let mut exceptions: Option<(bool, String)> = None;
    if configs.is_empty() {
        bail!("the test runs the kyverno CLI without an installation (the cli job)");
    }
    for c in configs {
        let name = c.as_str().unwrap_or_default();
        match name {
            // standard: exceptions enabled in every namespace (read from the values below), no
            // omitted events, the VAP reports flag (Verno's defaults); default: Kyverno's chart
            // as it comes (exceptions off); ttl: the cleanup controller may watch Pods.
            "standard" | "default" | "ttl" => {}
            // openreports: the standard values with `--openreportsEnabled`.
            "openreports" => args.push("--openreports".to_string()),
            // `--generateMutatingAdmissionPolicy`: Kyverno generates a MutatingAdmissionPolicy
            // for every MutatingPolicy that asks for one whatever the flag says; Verno always
            // does (its role may write them), so the values need nothing more.
            "generate-mutating-admission-policy" => {}
            // Background scans report labelled MutatingAdmissionPolicies
            // (`--mutatingAdmissionPolicyReports`).
            "mutating-admission-policy-reports" => {
                args.extend(["--mutating-admission-policy-reports".to_string(), "true".to_string()])
            }
            // Every policy fail-open (`--forceFailurePolicyIgnore`).
            "force-failure-policy-ignore" => {
                args.extend(["--force-failure-policy-ignore".to_string(), "true".to_string()])
            }
            other => bail!("Kyverno configuration {other:?} has no Verno equivalent yet"),
        }
        let values = value_set(case, name)?;
        for (k, v) in value_set_rbac(&values) {
            rbac.retain(|(old, _)| *old != k);
            rbac.push((k, v));
        }
        // `features.policyExceptions` (Kyverno's default: off), the last value set's word.
        if let Some((enabled, namespace)) = value_set_exceptions(&values) {
            exceptions = Some((enabled, namespace));
        }
    }
    if let Some((enabled, namespace)) = exceptions {
        args.extend(["--enable-policy-exception".to_string(), enabled.to_string()]);
        args.extend(["--exception-namespace".to_string(), namespace]);
    }
    Ok(ConfigEffects { args, rbac })
}

fn emit(v: &Value) {
    println!("{}", serde_json::to_string(v).unwrap_or_else(|_| "{}".into()));
}

fn step_names(test: &Value, case_json: Option<&Value>) -> Vec<String> {
    if let Some(names) = case_json.and_then(|c| c.get("step_names")).and_then(Value::as_array) {
        return names.iter().map(|n| n.as_str().unwrap_or_default().to_string()).collect();
    }
    test.pointer("/spec/steps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, s)| {
            s.get("name").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| format!("step #{}", i + 1))
        })
        .collect()
}

fn report(status: &str, steps: Vec<Value>, reason: &str) -> std::process::ExitCode {
    emit(&json!({"status": status, "steps": steps, "reason": reason}));
    std::process::ExitCode::from(match status {
        "pass" => 0,
        "fail" | "unsupported" => 1,
        _ => 2,
    })
}

fn skipped(names: &[String]) -> Vec<Value> {
    names.iter().map(|n| json!({"name": n, "status": "skipped", "reason": ""})).collect()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let usage = "usage: verno-chainsaw [--keep] [--verno PATH] [--settle SECONDS] [--real] CASE_DIR";
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            eprintln!("{usage}");
            return std::process::ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("Error: {e:#}");
            eprintln!("{usage}");
            return std::process::ExitCode::from(2);
        }
    };
    let case_json: Option<Value> = std::env::var("CHAINSAW_CASE_JSON").ok().and_then(|s| serde_json::from_str(&s).ok());
    let case = std::fs::canonicalize(&args.case).unwrap_or(args.case.clone());
    let docs = match read_yaml(&case.join("chainsaw-test.yaml")) {
        Ok(d) => d,
        Err(e) => return report("error", Vec::new(), &format!("{e:#}")),
    };
    let Some(test) = docs.into_iter().find(|d| d["kind"] == "Test") else {
        return report("error", Vec::new(), "chainsaw-test.yaml holds no Test");
    };
    let names = step_names(&test, case_json.as_ref());
    let effects = match check_configs(&case, case_json.as_ref()) {
        Ok(a) => a,
        Err(why) => return report("unsupported", skipped(&names), &format!("{why:#}")),
    };
    let config = match find_config(&case).map(|p| read_yaml(&p)) {
        None => run::Config::load(None),
        Some(Ok(d)) => run::Config::load(d.first()),
        Some(Err(e)) => return report("error", skipped(&names), &format!("{e:#}")),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => return report("error", skipped(&names), &format!(".chainsaw.yaml: {e:#}")),
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return report("error", skipped(&names), &format!("temporary directory: {e}")),
    };
    let verno = find_verno(args.verno);
    if args.real {
        return real_run(&case, case_json.as_ref(), &names, &effects, &verno, dir, args.keep).await;
    }
    let mut cluster = match cluster::Cluster::start(cluster::Options {
        verno: &verno,
        dir: dir.path(),
        extra_args: &effects.args,
        rbac: &effects.rbac,
    })
    .await
    {
        Ok(c) => c,
        Err(e) => return report("error", skipped(&names), &format!("starting the cluster: {e:#}")),
    };
    // The test namespace: `spec.namespace`, or a fresh chainsaw-<adjective>-<animal>.
    let fixed = test.pointer("/spec/namespace").and_then(Value::as_str).map(str::to_string);
    let namespace = fixed.unwrap_or_else(namespace_name);
    let ns_res = cluster::Res { api_version: "v1".into(), plural: "namespaces".into(), namespaced: false };
    let created_ns = match cluster.get(&ns_res, None, &namespace).await {
        Ok(Some(_)) => false,
        _ => match cluster
            .create(&ns_res, None, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}))
            .await
        {
            Ok(_) => true,
            Err(e) => return report("error", skipped(&names), &format!("creating namespace {namespace}: {e}")),
        },
    };
    let mut runner = run::Runner::new(&cluster, case.clone(), namespace.clone(), config, test);
    runner.path_env = tools_path();
    runner.settle = args.settle;
    let outcome = runner.run(&names).await;
    if created_ns {
        let _ = cluster.delete(&ns_res, None, &namespace).await;
    }
    if args.keep {
        eprintln!(
            "--keep: KUBECONFIG={} (Verno's log: {}); Ctrl-C ends it",
            cluster.kubeconfig.display(),
            cluster.verno_log.display()
        );
        let kept = dir.keep();
        eprintln!("files kept in {}", kept.display());
        let _ = tokio::signal::ctrl_c().await;
    } else if outcome.status != "pass"
        && let Ok(log) = std::fs::read_to_string(&cluster.verno_log)
    {
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(30);
        eprintln!("Verno's log (last 30 lines):\n{}", lines.get(start..).unwrap_or_default().join("\n"));
    }
    cluster.stop().await;
    let steps = outcome.steps.iter().map(|s| json!({"name": s.name, "status": s.status, "reason": s.reason})).collect();
    report(outcome.status, steps, &outcome.reason)
}

/// The repository above this executable (`target/<profile>/verno-chainsaw`): its scripts and
/// `.tools/bin`.
fn repo_root() -> Option<PathBuf> {
    exe_ancestors().into_iter().find(|d| d.join("scripts/cluster.sh").is_file())
}

/// One case with the real chainsaw against a real control plane (see the module's comment).
async fn real_run(
    case: &Path,
    case_json: Option<&Value>,
    names: &[String],
    effects: &ConfigEffects,
    verno: &Path,
    dir: tempfile::TempDir,
    keep: bool,
) -> std::process::ExitCode {
    let Some(repo) = repo_root() else {
        return report("error", skipped(names), "--real: the repository (scripts/cluster.sh) is not above this runner");
    };
    let chainsaw = repo.join(".tools/bin/chainsaw");
    if let Err(e) = verno_e2e::real::install_tools(&repo) {
        return report("error", skipped(names), &format!("installing the control plane: {e:#}"));
    }
    if !chainsaw.is_file() {
        let out = std::process::Command::new("bash")
            .arg(repo.join("scripts/install-control-plane.sh"))
            .arg("chainsaw")
            .current_dir(&repo)
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            return report("error", skipped(names), "installing chainsaw failed");
        }
    }
    // Verno configured as Kyverno's CI configures Kyverno (see `cluster::install_values`).
    let mut values =
        json!({"config": {"name": "kyverno"}, "features": {"omitEvents": {"eventTypes": []}}, "kyvernoNames": true});
    let accounts = verno_e2e::KYVERNO_ACCOUNTS.iter().map(|(k, n)| (k.to_string(), json!(n)));
    for (k, v) in accounts.chain(effects.rbac.iter().cloned()) {
        let mut at = &mut values;
        for part in k.split('.') {
            at = &mut at[part];
        }
        *at = v;
    }
    // JSON is YAML: the values file `verno manifests -f` reads.
    let values = serde_json::to_string_pretty(&values).unwrap_or_default();
    let values_file = dir.path().join("values.yaml");
    if let Err(e) = std::fs::write(&values_file, values) {
        return report("error", skipped(names), &format!("writing values: {e}"));
    }
    let mut extra = vec!["--config-map".to_string(), "kyverno".to_string(), "--omit-events".to_string(), String::new()];
    extra.extend(verno_e2e::kyverno_account_args());
    extra.extend(effects.args.iter().cloned());
    let runtime_config = runtime_config(case_json);
    let cluster = match verno_e2e::real::RealCluster::start(verno_e2e::real::RealOptions {
        account: verno_e2e::KYVERNO_ACCOUNTS[0].1,
        repo: &repo,
        verno,
        dir: dir.path(),
        namespace: "kyverno",
        values_files: std::slice::from_ref(&values_file),
        extra_args: &extra,
        runtime_config: runtime_config.as_deref(),
        reach: verno_e2e::real::Reach::ServiceIfPossible,
    })
    .await
    {
        Ok(c) => c,
        Err(e) => return report("error", skipped(names), &format!("starting the real cluster: {e:#}")),
    };
    let report_dir = dir.path().join("report");
    if let Err(e) = std::fs::create_dir_all(&report_dir) {
        return report("error", skipped(names), &format!("creating {}: {e}", report_dir.display()));
    }
    let mut cmd = tokio::process::Command::new(&chainsaw);
    cmd.arg("test")
        .arg("--test-dir")
        .arg(case)
        .args(["--report-format", "JSON", "--report-name", "chainsaw-report", "--no-color", "--parallel", "1"])
        .arg("--report-path")
        .arg(&report_dir);
    // The area's configuration, as Kyverno's CI passes it — less what chainsaw v0.2.12 does
    // not know yet (`namespace.fastDelete`, v0.2.13: delete the test namespace without
    // waiting; v0.2.12 waits, which only takes longer).
    if let Some(cfg) = find_config(case) {
        let text = std::fs::read_to_string(&cfg).unwrap_or_default();
        let kept: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("fastDelete:")).collect();
        let adapted = dir.path().join("chainsaw.yaml");
        if let Err(e) = std::fs::write(&adapted, kept.join("\n")) {
            return report("error", skipped(names), &format!("writing the configuration: {e}"));
        }
        cmd.arg("--config").arg(adapted);
    }
    let path = format!("{}:{}", repo.join(".tools/bin").display(), std::env::var("PATH").unwrap_or_default());
    cmd.env("PATH", path).env("KUBECONFIG", &cluster.kubeconfig).stdin(std::process::Stdio::null());
    let out = match cmd.output().await {
        Ok(o) => o,
        Err(e) => return report("error", skipped(names), &format!("running chainsaw: {e}")),
    };
    // chainsaw's own output goes to our stderr (the contract's stdout is the JSON only).
    eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let parsed: Option<Value> = std::fs::read_to_string(report_dir.join("chainsaw-report.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let (status, steps, reason) = real_outcome(names, parsed.as_ref(), out.status.success());
    if keep {
        eprintln!("--keep: KUBECONFIG={} (Verno's log: {})", cluster.kubeconfig.display(), cluster.verno_log.display());
        let _ = tokio::signal::ctrl_c().await;
    } else if status != "pass" {
        eprintln!("Verno's log (last 30 lines):\n{}", cluster.verno_log_tail(30));
    }
    drop(cluster);
    // A kept control plane (VERNO_KEEP_CLUSTER) lives in this folder: keep it too, or its
    // processes outlive a folder `cluster.sh down` can no longer find.
    if std::env::var_os("VERNO_KEEP_CLUSTER").is_some() {
        let _ = dir.keep();
    }
    report(status, steps, &reason)
}

/// chainsaw's report as the contract's steps: a step passes when none of its operations
/// failed; the steps chainsaw did not reach are skipped. The test passes when chainsaw
/// exited 0 (cleanup included) and every step passed.
fn real_outcome(names: &[String], report: Option<&Value>, exited_ok: bool) -> (&'static str, Vec<Value>, String) {
    let steps_run: Vec<&Value> = report
        .and_then(|r| r.pointer("/tests/0/steps"))
        .and_then(Value::as_array)
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    let mut steps = Vec::new();
    let mut reason = String::new();
    let mut failed = false;
    for (i, name) in names.iter().enumerate() {
        let Some(s) = steps_run.get(i).filter(|_| !failed) else {
            steps.push(json!({"name": name, "status": "skipped", "reason": ""}));
            continue;
        };
        let errors: Vec<String> = s
            .get("operations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| {
                o.pointer("/failure/error")
                    .and_then(Value::as_str)
                    .map(|e| format!("{}: {e}", o["type"].as_str().unwrap_or("operation")))
            })
            .collect();
        if errors.is_empty() {
            steps.push(json!({"name": name, "status": "pass", "reason": ""}));
        } else {
            failed = true;
            let why = errors.join("; ");
            if reason.is_empty() {
                reason = format!("step {name:?}: {why}");
            }
            steps.push(json!({"name": name, "status": "fail", "reason": why}));
        }
    }
    if report.is_none() {
        return ("error", steps, "chainsaw wrote no report".into());
    }
    if !failed && !exited_ok {
        failed = true;
        reason = "chainsaw failed after the steps (cleanup or a later operation)".into();
    }
    (if failed { "fail" } else { "pass" }, steps, reason)
}
