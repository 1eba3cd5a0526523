//! `verno test`: run `kyverno-test.yaml` suites and compare with their expected results,
//! printing Kyverno's table (or JSON/YAML/JUnit/Markdown).

use crate::compare;
use crate::data::{CliData, Requests};
use crate::load::{self, Doc, LoadedPolicies, load_exceptions, load_policies, parse_user_info, parse_values};
use anyhow::{Context as _, Result, anyhow, bail};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use verno_api::{Test, TestResult, strict};
use verno_engine::{Operation, PolicyResponse, PolicySet, RequestUser};
use verno_jmespath::wildcard;

#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Directories (searched recursively) or test files.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Test file name to look for.
    #[arg(short = 'f', long = "file-name", default_value = "kyverno-test.yaml")]
    pub file_name: String,
    /// Run only matching results: `policy=<p>,rule=<r>,resource=<n>` (wildcards allowed).
    #[arg(short = 't', long = "test-case-selector")]
    pub selector: Option<String>,
    /// Output format: json, yaml, markdown or junit (default: Kyverno's table).
    #[arg(short = 'o', long = "output-format")]
    pub output: Option<String>,
    /// Add a MESSAGE column with the engine's message.
    #[arg(long)]
    pub detailed_results: bool,
    /// Show only failing rows.
    #[arg(long)]
    pub fail_only: bool,
    /// Accepted for compatibility; Verno's table has no colors.
    #[arg(long)]
    pub remove_color: bool,
    /// Fail when no test file is found.
    #[arg(long)]
    pub require_tests: bool,
}

/// One checked row: a result entry × resource.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub policy: String,
    pub rule: String,
    pub resource: String,
    pub kind: String,
    pub namespace: String,
    pub expected: String,
    pub actual: String,
    pub pass: bool,
    pub reason: String,
    #[serde(skip)]
    pub display: String,
    #[serde(skip)]
    pub table_reason: String,
    #[serde(skip)]
    pub message: String,
    /// Where the row's response came from: resource index, operation, policy index.
    #[serde(skip)]
    pub source: Option<(usize, String, usize)>,
}

/// The deepest folder below the given one that discovery descends into.
const MAX_TEST_DEPTH: usize = 64;

/// Test files named `name` at or below `dir`. The given path may be a link; below it,
/// discovery does not descend into linked folders (as Kyverno's walk does not), so a link to
/// `/` or a link loop is not walked; a linked test file is read.
fn find_tests(dir: &Path, name: &str, out: &mut Vec<PathBuf>) -> Result<()> {
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if meta.is_file() {
        out.push(dir.to_path_buf());
        return Ok(());
    }
    find_tests_below(dir, name, out, 0)
}

fn find_tests_below(dir: &Path, name: &str, out: &mut Vec<PathBuf>, depth: usize) -> Result<()> {
    if depth > MAX_TEST_DEPTH {
        return Err(anyhow!("{} is more than {MAX_TEST_DEPTH} folders deep; not searched for tests", dir.display()));
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        // The entry itself, not what a link points to.
        let Ok(own) = std::fs::symlink_metadata(&p) else { continue };
        if own.is_dir() {
            find_tests_below(&p, name, out, depth + 1)?;
        } else if p.file_name().and_then(|f| f.to_str()) == Some(name) && p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

struct Selector {
    policy: Option<String>,
    rule: Option<String>,
    resource: Option<String>,
}

impl Selector {
    fn parse(s: &str) -> Result<Selector> {
        let mut sel = Selector { policy: None, rule: None, resource: None };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow!("invalid test case selector {part:?}: expected key=value"))?;
            match k.trim() {
                "policy" => sel.policy = Some(v.trim().to_string()),
                "rule" => sel.rule = Some(v.trim().to_string()),
                "resource" => sel.resource = Some(v.trim().to_string()),
                other => bail!("invalid test case selector key {other:?}: expected policy, rule or resource"),
            }
        }
        Ok(sel)
    }
    fn keep(&self, policy: &str, rule: &str, resource: &str) -> bool {
        self.policy.as_ref().is_none_or(|p| wildcard::matches(p, policy))
            && self.rule.as_ref().is_none_or(|p| wildcard::matches(p, rule))
            && self.resource.as_ref().is_none_or(|p| wildcard::matches(p, resource))
    }
}

pub fn run(args: &TestArgs) -> i32 {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            2
        }
    }
}

fn run_inner(args: &TestArgs) -> Result<i32> {
    let selector = args.selector.as_deref().map(Selector::parse).transpose()?;
    let machine = args.output.is_some();
    let mut files = Vec::new();
    for d in &args.dirs {
        find_tests(d, &args.file_name, &mut files)?;
    }
    let roots = Roots::new(&args.dirs);
    if files.is_empty() && args.require_tests {
        bail!("no test yamls available");
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut load_errors = 0;
    let log = |s: String| {
        if machine {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    for f in &files {
        let text = match load::read_text(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("Error: {e:#}");
                load_errors += 1;
                continue;
            }
        };
        let docs = match load::parse_docs(&text, f) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("Error: {e:#}");
                load_errors += 1;
                continue;
            }
        };
        for doc in docs {
            match run_test(&doc, f, &roots, selector.as_ref(), &log) {
                Ok(mut r) => rows.append(&mut r),
                Err(e) => {
                    eprintln!("Error: {}: {e:#}", f.display());
                    load_errors += 1;
                }
            }
        }
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    match args.output.as_deref() {
        Some("json") => println!("{}", json_output(&rows)),
        Some("yaml") => print!(
            "{}",
            serde_saphyr::to_string(&serde_json::json!({"results": rows, "summary": summary(&rows)}))
                .unwrap_or_default()
        ),
        Some("junit") => print!("{}", junit(&rows)),
        Some("markdown") => print!("{}", markdown(&rows, args.detailed_results)),
        Some(other) => bail!("unknown output format {other:?}: expected json, yaml, markdown or junit"),
        None => {
            let shown: Vec<&Row> = rows.iter().filter(|r| !args.fail_only || !r.pass).collect();
            if !shown.is_empty() {
                let mut headers = vec!["ID", "POLICY", "RULE", "RESOURCE", "RESULT", "REASON"];
                if args.detailed_results {
                    headers.push("MESSAGE");
                }
                let cells: Vec<Vec<String>> = shown
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let mut c = vec![
                            (i + 1).to_string(),
                            r.policy.clone(),
                            r.rule.clone(),
                            r.display.clone(),
                            if r.pass { "Pass".into() } else { "Fail".into() },
                            r.table_reason.clone(),
                        ];
                        if args.detailed_results {
                            c.push(r.message.clone());
                        }
                        c
                    })
                    .collect();
                println!();
                print!("{}", crate::table::render(&headers, &cells));
            }
            println!();
            if args.fail_only {
                println!("Test Summary: {failed} out of {} tests failed", rows.len());
            } else {
                println!("Test Summary: {} tests passed and {failed} tests failed", rows.len() - failed);
            }
            println!();
        }
    }
    if load_errors > 0 {
        return Ok(2);
    }
    if failed > 0 {
        if !machine {
            eprintln!("Error: {failed} tests failed");
        }
        return Ok(1);
    }
    Ok(0)
}

fn summary(rows: &[Row]) -> Value {
    let fail = rows.iter().filter(|r| !r.pass).count();
    let skip = rows.iter().filter(|r| r.pass && r.actual == "skip").count();
    serde_json::json!({"pass": rows.len() - fail - skip, "fail": fail, "skip": skip})
}

fn json_output(rows: &[Row]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({"results": rows, "summary": summary(rows)})).unwrap_or_default()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn junit(rows: &[Row]) -> String {
    let failed = rows.iter().filter(|r| !r.pass).count();
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{}\" failures=\"{failed}\">\n  <testsuite name=\"verno test\" tests=\"{}\" failures=\"{failed}\">\n",
        rows.len(),
        rows.len()
    );
    for r in rows {
        let name = xml_escape(&format!("{}/{}/{}", r.policy, r.rule, r.resource));
        if r.pass {
            s.push_str(&format!("    <testcase classname=\"{}\" name=\"{name}\"></testcase>\n", xml_escape(&r.policy)));
        } else {
            s.push_str(&format!(
                "    <testcase classname=\"{}\" name=\"{name}\">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                xml_escape(&r.policy),
                xml_escape(&r.table_reason),
                xml_escape(&r.reason)
            ));
        }
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

fn markdown(rows: &[Row], detailed: bool) -> String {
    let mut s = String::from(if detailed {
        "| ID | POLICY | RULE | RESOURCE | RESULT | REASON | MESSAGE |\n|---|---|---|---|---|---|---|\n"
    } else {
        "| ID | POLICY | RULE | RESOURCE | RESULT | REASON |\n|---|---|---|---|---|---|\n"
    });
    for (i, r) in rows.iter().enumerate() {
        let res = if r.pass { "Pass" } else { "Fail" };
        if detailed {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {res} | {} | {} |\n",
                i + 1,
                r.policy,
                r.rule,
                r.display,
                r.table_reason,
                r.message.replace('|', "\\|")
            ));
        } else {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {res} | {} |\n",
                i + 1,
                r.policy,
                r.rule,
                r.display,
                r.table_reason
            ));
        }
    }
    s
}

/// Where a test file may read from: the directories given on the command line, the current
/// directory, and the git checkouts that hold them. A test file from an untrusted change must
/// not make `verno test` read `/etc/shadow` or `~/.kube/config` into its output; Kyverno's own
/// suites name `../policy.yaml` from a `.kyverno-test/` folder, which stays inside these.
pub struct Roots(Vec<PathBuf>);

impl Roots {
    pub fn new(dirs: &[PathBuf]) -> Roots {
        let mut roots = Vec::new();
        let cwd = std::env::current_dir().ok();
        for d in dirs.iter().cloned().chain(cwd) {
            let Ok(d) = d.canonicalize() else { continue };
            // The checkout that holds it, so that a test run on one folder of a repository may
            // name files elsewhere in that repository.
            if let Some(top) = d.ancestors().find(|a| a.join(".git").exists()) {
                roots.push(top.to_path_buf());
            }
            roots.push(d);
        }
        Roots(roots)
    }

    /// `p` relative to the test file's folder `base`; an error when it leads outside every
    /// root. A path that does not exist is left to the reader's "not found".
    pub fn rel(&self, base: &Path, p: &str) -> Result<PathBuf> {
        let joined = base.join(p);
        match joined.canonicalize() {
            Ok(real) if !self.0.iter().any(|r| real.starts_with(r)) => bail!(
                "{p}: the path leads outside the test's directories ({}); run verno test from a directory that holds it",
                self.0.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
            _ => Ok(joined),
        }
    }
}

/// The test's `globalContextEntries`, each with one source of data: `data`, inline `resources`,
/// or `resourceFiles` (YAML files beside the test, read here into `resources`), as Kyverno's
/// CLI checks them.
fn global_entries(entries: &[Value], roots: &Roots, base: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let name = e.get("name").and_then(Value::as_str).unwrap_or("");
        let mut e = e.clone();
        let sources =
            ["data", "resources", "resourceFiles"].iter().filter(|k| e.get(**k).is_some_and(|v| !v.is_null())).count();
        if sources > 1 {
            bail!("globalContextEntries entry {name:?}: data, resources, and resourceFiles are mutually exclusive");
        }
        if sources == 0 {
            bail!("globalContextEntries entry {name:?}: one of data, resources, or resourceFiles is required");
        }
        if let Some(files) = e.get("resourceFiles").and_then(Value::as_array).cloned() {
            let mut resources = Vec::new();
            for (j, f) in files.iter().enumerate() {
                let f = f.as_str().unwrap_or("").trim();
                let escapes = Path::new(f).components().next() == Some(std::path::Component::ParentDir);
                if f.is_empty() || Path::new(f).is_absolute() || escapes {
                    bail!(
                        "globalContextEntries entry {name:?} resourceFiles[{j}]: a file path relative to the test's directory is required, not {f:?}"
                    );
                }
                for d in load::read_docs(&roots.rel(base, f)?)? {
                    resources.push(d.value);
                }
            }
            if let Some(m) = e.as_object_mut() {
                m.remove("resourceFiles");
                m.insert("resources".into(), Value::Array(resources));
            }
        }
        out.push(e);
    }
    Ok(out)
}

/// Parses a test document strictly, as Kyverno does.
pub fn parse_test(v: &Value, file: &Path) -> Result<Test> {
    let obj = v.as_object().ok_or_else(|| anyhow!("{}: a test document must be a mapping", file.display()))?;
    if obj.keys().any(|k| k.eq_ignore_ascii_case("name")) {
        bail!(
            "{}: the test uses the deprecated schema (top-level `name`); use `apiVersion: cli.kyverno.io/v1alpha1`, `kind: Test` and `metadata.name`",
            file.display()
        );
    }
    let norm = strict::normalize(v, &verno_api::cli::TEST, "").map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let t: Test = serde_json::from_value(norm).map_err(|e| anyhow!("{}: invalid test: {e}", file.display()))?;
    if t.api_version.is_empty() || t.kind.is_empty() {
        bail!("{}: apiVersion and kind are required (apiVersion: cli.kyverno.io/v1alpha1, kind: Test)", file.display());
    }
    if let Some(op) = t.results.iter().filter_map(|r| r.operation.as_deref()).find(|op| Operation::parse(op).is_none())
    {
        bail!("{}: invalid operation {op:?}, must be one of CREATE, UPDATE, DELETE, CONNECT", file.display());
    }
    Ok(t)
}

fn resource_display(r: &Value) -> String {
    let ns = r.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
    format!(
        "{}/{}/{}/{}",
        load::api_version(r),
        load::kind(r),
        ns,
        r.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
    )
}

fn run_test(
    doc: &Doc,
    file: &Path,
    roots: &Roots,
    selector: Option<&Selector>,
    log: &dyn Fn(String),
) -> Result<Vec<Row>> {
    let test = parse_test(&doc.value, file)?;
    let base = file.parent().unwrap_or(Path::new("."));
    log(format!("Loading test {} ( {} ) ...", test.name(), file.display()));
    log("  Loading values/variables ...".into());
    let mut data = CliData::default();
    let user = load_values(&test, file, roots, base, &mut data)?;
    log("  Loading policies ...".into());
    let mut pdocs = Vec::new();
    for p in &test.policies {
        pdocs.extend(load::read_docs(&roots.rel(base, p)?)?);
    }
    let policies = load_policies(pdocs);
    policies.print_invalid();
    log("  Loading resources ...".into());
    let subjects = load_subjects(&test, roots, base, log)?;
    let mut edocs = Vec::new();
    for p in &test.exceptions {
        edocs.extend(load::read_docs(&roots.rel(base, p)?)?);
    }
    if !test.exceptions.is_empty() {
        log("  Loading exceptions ...".into());
    }
    let exceptions = load_exceptions(&edocs)?;
    load_cluster_data(&test, roots, base, &mut data)?;
    let globals: Vec<(String, Value)> = data.values.global_values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let resources = subjects.resources.len();
    log(format!(
        "  Applying {} {} to {} {} ...",
        policies.compiled.len(),
        if policies.compiled.len() == 1 { "policy" } else { "policies" },
        resources,
        if resources == 1 { "resource" } else { "resources" }
    ));
    let set = PolicySet::new(policies.compiled.clone(), exceptions);
    let runner = Requests { set: &set, data: &data, user: user.as_ref(), globals: &globals };
    log("  Checking results ...".into());
    let checking = Checking { test: &test, base, subjects: &subjects, policies: &policies, runner: &runner };
    Ok(checking.rows(selector))
}

/// The test's values (`variables` file or inline `values`) into `data`; its user info.
fn load_values(
    test: &Test,
    file: &Path,
    roots: &Roots,
    base: &Path,
    data: &mut CliData,
) -> Result<Option<(RequestUser, Value)>> {
    if let Some(v) = &test.variables {
        let p = roots.rel(base, v)?;
        let docs = load::read_docs(&p)?;
        if let Some(d) = docs.first() {
            data.values = parse_values(&d.value, &p)?;
        }
    } else if let Some(v) = &test.values {
        data.values = parse_values(v, file)?;
    }
    let mut user: Option<(RequestUser, Value)> = None;
    if let Some(u) = &test.userinfo {
        let p = roots.rel(base, u)?;
        let docs = load::read_docs(&p)?;
        if let Some(d) = docs.first() {
            user = Some(parse_user_info(&d.value, &p)?);
        }
    }
    Ok(user)
}

/// What a test's rows are about: its resources, then its JSON, Envoy and HTTP payloads. The
/// three lists are parallel.
struct Subjects {
    resources: Vec<Value>,
    /// A payload's file, by which rows name it.
    aliases: Vec<Option<String>>,
    /// The kind an Envoy or HTTP payload is evaluated as.
    payload_kinds: Vec<Option<PayloadKind>>,
}

impl Subjects {
    /// The three lists as [`check_row`] takes them.
    fn lists(&self) -> (&[Value], &[Option<String>], &[Option<PayloadKind>]) {
        (&self.resources, &self.aliases, &self.payload_kinds)
    }
}

/// Reads `resources`, `jsonPayloads`, `envoyPayloads` and `httpPayloads`.
fn load_subjects(test: &Test, roots: &Roots, base: &Path, log: &dyn Fn(String)) -> Result<Subjects> {
    let mut resources: Vec<Value> = Vec::new();
    for p in &test.resources {
        for mut d in load::read_docs(&roots.rel(base, p)?)? {
            load::as_kyverno_reads(&mut d.value);
            resources.push(d.value);
        }
    }
    // `jsonPayloads`: plain JSON documents for ValidatingPolicies in JSON mode; rows name them
    // by file.
    let mut aliases: Vec<Option<String>> = vec![None; resources.len()];
    for p in &test.json_payloads {
        for d in load::read_docs(&roots.rel(base, p)?)? {
            resources.push(d.value);
            aliases.push(Some(p.trim_start_matches("./").to_string()));
        }
    }
    // `envoyPayloads` / `httpPayloads`: Envoy's and Kyverno's HTTP `CheckRequest`s for
    // ValidatingPolicies in Envoy or HTTP mode, evaluated as that kind; rows without resources
    // check every payload of their policy's mode.
    let mut payload_kinds: Vec<Option<PayloadKind>> = vec![None; resources.len()];
    for (files, mode, what) in [
        (&test.envoy_payloads, verno_engine::ENVOY_CHECK_REQUEST, "Envoy"),
        (&test.http_payloads, verno_engine::HTTP_CHECK_REQUEST, "HTTP"),
    ] {
        if !files.is_empty() {
            log(format!("  Loading {what} payloads ..."));
        }
        for p in files {
            for d in load::read_docs(&roots.rel(base, p)?)? {
                if !d.value.is_object() {
                    bail!("{p}: an {what} payload must be a CheckRequest object");
                }
                resources.push(d.value);
                aliases.push(Some(p.trim_start_matches("./").to_string()));
                payload_kinds.push(Some(mode));
            }
        }
    }
    Ok(Subjects { resources, aliases, payload_kinds })
}

/// What policies may read besides the resource, into `data`: `clusterResources`,
/// `targetResources`, `paramResources`, clone sources, the `context` file, API call mocks and
/// global context entries.
fn load_cluster_data(test: &Test, roots: &Roots, base: &Path, data: &mut CliData) -> Result<()> {
    if !test.cluster_resources.is_empty() {
        let mut cluster = Vec::new();
        for p in &test.cluster_resources {
            for d in load::read_docs(&roots.rel(base, p)?)? {
                if load::kind(&d.value) == "ClusterResource"
                    && load::api_version(&d.value).starts_with("cli.kyverno.io/")
                {
                    // `kind: ClusterResource` wraps the objects in `spec.resources`.
                    if let Some(items) = d.value.pointer("/spec/resources").and_then(Value::as_array) {
                        cluster.extend(items.iter().cloned());
                    }
                } else {
                    cluster.push(d.value);
                }
            }
        }
        data.cluster = Some(cluster);
    }
    for p in &test.target_resources {
        for mut d in load::read_docs(&roots.rel(base, p)?)? {
            load::as_kyverno_reads(&mut d.value);
            data.targets.push(d.value);
        }
    }
    // `paramResources` (policy params) are looked up like clone sources.
    for p in &test.param_resources {
        for mut d in load::read_docs(&roots.rel(base, p)?)? {
            load::as_kyverno_reads(&mut d.value);
            data.clone_sources.push(d.value);
        }
    }
    for r in &test.results {
        if let Some(c) = &r.clone_source_resource {
            for d in load::read_docs(&roots.rel(base, c)?)? {
                data.clone_sources.push(d.value);
            }
        }
    }
    // The `context` file (`kind: Context`): more cluster objects and image metadata.
    if let Some(c) = &test.context {
        for d in load::read_docs(&roots.rel(base, c)?)? {
            if load::kind(&d.value) != "Context" {
                continue;
            }
            if let Some(items) = d.value.pointer("/spec/resources").and_then(Value::as_array) {
                data.cluster.get_or_insert_with(Vec::new).extend(items.iter().cloned());
            }
            if let Some(images) = d.value.pointer("/spec/images").and_then(Value::as_array) {
                data.images.extend(images.iter().cloned());
            }
        }
    }
    data.api_mocks = test.api_call_responses.clone();
    data.global_entries = global_entries(&test.global_context_entries, roots, base)?;
    data.build_cel_host();
    Ok(())
}

/// A loaded test, its results checked entry by entry.
struct Checking<'a> {
    test: &'a Test,
    /// The test file's folder (files named by results are relative to it).
    base: &'a Path,
    subjects: &'a Subjects,
    policies: &'a LoadedPolicies,
    runner: &'a Requests<'a>,
}

impl Checking<'_> {
    /// One row per result entry and resource it names (those `selector` keeps).
    fn rows(&self, selector: Option<&Selector>) -> Vec<Row> {
        let mut cache: HashMap<(usize, String), Vec<PolicyResponse>> = HashMap::new();
        let mut rows = Vec::new();
        for entry in &self.test.results {
            let mut names: Vec<String> = entry.resources.clone();
            for spec in &entry.resource_specs {
                let n = spec.get("name").and_then(Value::as_str).unwrap_or("");
                let ns = spec.get("namespace").and_then(Value::as_str).unwrap_or("");
                names.push(if ns.is_empty() { n.to_string() } else { format!("{ns}/{n}") });
            }
            if !entry.resource.is_empty() && names.is_empty() {
                names.push(entry.resource.clone());
            }
            // An Envoy/HTTP-mode policy's entry names no payload: it is about every payload of
            // its mode, one row (as the conformance contract counts rows) that holds when each
            // does.
            let mode = self
                .policies
                .compiled
                .iter()
                .find(|p| p.key() == entry.policy || p.name == entry.policy)
                .and_then(|p| p.authz_request());
            if let (true, Some(mode)) = (names.is_empty(), mode) {
                if selector.is_some_and(|sel| !sel.keep(&entry.policy, &entry.rule, "")) {
                    continue;
                }
                rows.push(self.payloads_row(entry, mode, &mut cache));
                continue;
            }
            if names.is_empty() {
                names.push(String::new());
            }
            for name in names {
                if let Some(sel) = selector
                    && !sel.keep(&entry.policy, &entry.rule, &name)
                {
                    continue;
                }
                rows.push(self.resource_row(entry, &name, &mut cache));
            }
        }
        rows
    }

    /// The one row of an entry about every payload of an Envoy or HTTP mode: the first
    /// payload's row that fails, else the first's.
    fn payloads_row(
        &self,
        entry: &TestResult,
        mode: PayloadKind,
        cache: &mut HashMap<(usize, String), Vec<PolicyResponse>>,
    ) -> Row {
        let s = self.subjects;
        let files: Vec<String> = s
            .aliases
            .iter()
            .zip(&s.payload_kinds)
            .filter(|(_, k)| **k == Some(mode))
            .filter_map(|(a, _)| a.clone())
            .collect();
        let each: Vec<Row> =
            files.iter().map(|f| check_row(entry, f, s.lists(), self.policies, self.runner, cache)).collect();
        let mut row = match each.iter().find(|r| !r.pass).or(each.first()) {
            Some(r) => r.clone(),
            None => check_row(entry, "", s.lists(), self.policies, self.runner, cache),
        };
        row.resource = String::new();
        row.display = files.join(", ");
        row
    }

    /// The row of an entry for one resource (`name`, empty when the entry names none), its
    /// produced resources compared with the entry's files.
    fn resource_row(
        &self,
        entry: &TestResult,
        name: &str,
        cache: &mut HashMap<(usize, String), Vec<PolicyResponse>>,
    ) -> Row {
        let s = self.subjects;
        let mut row = check_row(entry, name, s.lists(), self.policies, self.runner, cache);
        // A payload (JSON, Envoy) is shown by its file.
        if !name.is_empty() && s.aliases.iter().flatten().any(|a| *a == name) {
            row.display = name.to_string();
        }
        if row.source.is_some() || row.pass {
            // A produced resource that differs from the file makes the result `fail`, as
            // with Kyverno: a test may expect exactly that.
            if let Err(why) = compare::check_resources(entry, self.base, &row, &s.resources, self.policies, cache) {
                row.actual = "fail".into();
                row.pass = row.expected == "fail";
                row.table_reason = if row.pass { "Ok".into() } else { "Resource diff".into() };
                row.reason = if row.pass { String::new() } else { why.to_string() };
            }
        }
        row
    }
}

#[allow(clippy::too_many_arguments)]
fn check_row(
    entry: &TestResult,
    name: &str,
    (resources, aliases, payloads): (&[Value], &[Option<String>], &[Option<PayloadKind>]),
    policies: &LoadedPolicies,
    runner: &Requests,
    cache: &mut HashMap<(usize, String), Vec<PolicyResponse>>,
) -> Row {
    let expected = if entry.result.is_empty() { entry.status.clone() } else { entry.result.clone() };
    let mut row = Row {
        policy: entry.policy.clone(),
        rule: entry.rule.clone(),
        resource: name.to_string(),
        kind: entry.kind.clone(),
        namespace: String::new(),
        expected: expected.clone(),
        actual: String::new(),
        pass: false,
        reason: String::new(),
        display: name.to_string(),
        table_reason: String::new(),
        message: String::new(),
        source: None,
    };
    let fail = |mut row: Row, table: &str, reason: String| {
        row.pass = false;
        row.table_reason = table.to_string();
        row.reason = reason;
        row
    };
    if let Some(e) = policies.invalid_reason(&entry.policy) {
        return fail(row, "Invalid Policy", format!("policy {} is invalid: {e}", entry.policy));
    }
    if let Some(e) = policies.unsupported.get(&entry.policy) {
        return fail(row, "Invalid Policy", e.clone());
    }
    let Some((policy_idx, policy)) =
        policies.compiled.iter().enumerate().find(|(_, p)| p.key() == entry.policy || p.name == entry.policy)
    else {
        return fail(row, "Not found", format!("policy {} not found in the test's policies", entry.policy));
    };
    let (want_ns, want_name) = match name.split_once('/') {
        Some((ns, n)) => (Some(ns), n),
        None => (None, name),
    };
    let candidates: Vec<usize> = resources
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            aliases.get(*i).and_then(|a| a.as_deref()) == Some(name)
                || r.pointer("/metadata/name").and_then(Value::as_str) == Some(want_name)
                    && want_ns.is_none_or(|ns| {
                        // Kyverno's CLI puts resources without a namespace in `default`.
                        let rns = r.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
                        rns == ns || (rns.is_empty() && ns == "default")
                    })
        })
        .map(|(i, _)| i)
        .collect();
    let mut rule_names =
        vec![entry.rule.clone(), format!("autogen-{}", entry.rule), format!("autogen-cronjob-{}", entry.rule)];
    // A cleanup, deleting or Envoy-mode policy's one rule carries the policy's name (as
    // Kyverno's CLI names it); a row without a rule means it.
    if entry.rule.is_empty() {
        rule_names.push(policy.name.clone());
        // A CEL kind's result decided by a PolicyException is named `exception`.
        if verno_engine::report::is_cel(policy.kind) {
            rule_names.push(verno_engine::EXCEPTION_RULE.to_string());
        }
    }
    if candidates.is_empty() {
        // Mutate-existing rows name the patched target (or nothing): look through the triggers.
        for (i, r) in resources.iter().enumerate() {
            let op = entry.operation.clone().unwrap_or_else(|| runner.operation_for(Some(&policy.name), r));
            let responses = cache
                .entry((i, op.clone()))
                .or_insert_with(|| runner.run_as(r, &op, payload_kind(payloads, i).as_ref()));
            let Some(rr) = responses
                .get(policy_idx)
                .and_then(|pr| pr.rules.iter().find(|rr| rule_names.iter().any(|n| n.as_str() == rr.name.as_str())))
            else {
                continue;
            };
            let names_target = rr.patched_targets().iter().any(|t| {
                t.pointer("/metadata/name").and_then(Value::as_str) == Some(want_name)
                    && want_ns.is_none_or(|ns| {
                        t.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default") == ns
                    })
            });
            if name.is_empty() || names_target {
                let shown = rr
                    .patched_targets()
                    .iter()
                    .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(want_name));
                let rr = rr.clone();
                return judge(row, policy, &rr, &expected, (i, op, policy_idx), shown);
            }
        }
        return fail(row, "Not found", format!("resource {name} not found in the test's resources"));
    }
    let mut found: Option<(usize, verno_engine::RuleResponse)> = None;
    let mut found_op = String::new();
    for &i in &candidates {
        let Some(r) = resources.get(i) else { continue };
        let op = entry.operation.clone().unwrap_or_else(|| runner.operation_for(Some(&policy.name), r));
        let responses =
            cache.entry((i, op.clone())).or_insert_with(|| runner.run_as(r, &op, payload_kind(payloads, i).as_ref()));
        if let Some(pr) = responses.get(policy_idx)
            && let Some(rr) = pr.rules.iter().find(|rr| rule_names.iter().any(|n| n.as_str() == rr.name.as_str()))
        {
            found = Some((i, rr.clone()));
            found_op = op.clone();
            break;
        }
    }
    let first = candidates.first().and_then(|i| resources.get(*i));
    if let Some(r) = first {
        row.namespace = r.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
        row.display = resource_display(r);
    }
    match found {
        None => {
            row.actual = "skip".into();
            row.pass = true;
            row.table_reason = "Excluded".into();
            row
        }
        Some((i, rr)) => judge(row, policy, &rr, &expected, (i, found_op, policy_idx), resources.get(i)),
    }
}

/// What a payload that is not a Kubernetes object is (group, version, kind).
type PayloadKind = (&'static str, &'static str, &'static str);

/// The kind a payload is evaluated as (`None`: a Kubernetes object or a JSON payload).
fn payload_kind(payloads: &[Option<PayloadKind>], i: usize) -> Option<verno_api::admission::GroupVersionKind> {
    let (group, version, kind) = payloads.get(i).copied().flatten()?;
    Some(verno_api::admission::GroupVersionKind { group: group.into(), version: version.into(), kind: kind.into() })
}

/// Fills a row from the rule response that answers it; `shown` is the resource the row displays.
fn judge(
    mut row: Row,
    policy: &verno_engine::CompiledPolicy,
    rr: &verno_engine::RuleResponse,
    expected: &str,
    source: (usize, String, usize),
    shown: Option<&Value>,
) -> Row {
    if let Some(r) = shown {
        row.namespace = r.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
        row.display = resource_display(r);
    }
    row.source = Some(source);
    let actual = policy.report_result(rr, false).as_str();
    row.actual = actual.to_string();
    row.message = rr.message.clone();
    if actual == expected {
        row.pass = true;
        row.table_reason = "Ok".into();
    } else {
        row.table_reason = format!("Want {expected}, got {actual}");
        row.reason = format!("want {expected}, got {actual}: {}", rr.message);
    }
    row
}
