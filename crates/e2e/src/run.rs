//! Running one chainsaw Test: steps, step templates, bindings, timeouts, the operations,
//! catch/finally, and cleanup, with the semantics of chainsaw v0.2.15 (see "Chainsaw in
//! brief" in the corpus README).

use crate::assert;
use crate::cluster::{ApiError, Cluster, Res};
use crate::expr::{self, Bindings};
use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub apply: Duration,
    pub assert: Duration,
    pub error: Duration,
    pub delete: Duration,
    pub cleanup: Duration,
    pub exec: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let s = Duration::from_secs;
        Timeouts { apply: s(5), assert: s(30), error: s(30), delete: s(15), cleanup: s(30), exec: s(5) }
    }
}

impl Timeouts {
    /// `t` with the durations `v` (a `timeouts` object) sets.
    pub fn over(mut self, v: Option<&Value>) -> Result<Timeouts> {
        let Some(Value::Object(m)) = v else { return Ok(self) };
        for (k, d) in m {
            let d = duration(d).with_context(|| format!("timeouts.{k}"))?;
            match k.as_str() {
                "apply" => self.apply = d,
                "assert" => self.assert = d,
                "error" => self.error = d,
                "delete" => self.delete = d,
                "cleanup" => self.cleanup = d,
                "exec" => self.exec = d,
                other => bail!("timeouts: unknown field {other:?}"),
            }
        }
        Ok(self)
    }
}

pub fn duration(v: &Value) -> Result<Duration> {
    let s = v.as_str().ok_or_else(|| anyhow!("{v} is not a duration"))?;
    let ns = verno_jmespath::duration::parse(s).ok_or_else(|| anyhow!("{s:?} is not a duration"))?;
    u64::try_from(ns).map(Duration::from_nanos).map_err(|_| anyhow!("{s:?} is negative"))
}

/// What the area's `.chainsaw.yaml` (v1alpha2 Configuration) sets.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub timeouts: Timeouts,
    pub delay_before_cleanup: Option<Duration>,
    pub force_grace: Option<Duration>,
    pub templating: bool,
    pub catch: Vec<Value>,
}

impl Config {
    pub fn load(doc: Option<&Value>) -> Result<Config> {
        let mut c = Config { templating: true, ..Config::default() };
        let Some(doc) = doc else { return Ok(c) };
        let spec = &doc["spec"];
        c.timeouts = Timeouts::default().over(spec.get("timeouts"))?;
        if let Some(d) = spec.pointer("/cleanup/delayBeforeCleanup") {
            c.delay_before_cleanup = Some(duration(d)?);
        }
        if let Some(d) = spec.pointer("/execution/forceTerminationGracePeriod") {
            c.force_grace = Some(duration(d)?);
        }
        if let Some(b) = spec.pointer("/templating/enabled").and_then(Value::as_bool) {
            c.templating = b;
        }
        if let Some(Value::Array(a)) = spec.pointer("/error/catch") {
            c.catch = a.clone();
        }
        Ok(c)
    }
}

#[derive(Debug, Clone)]
pub struct StepReport {
    pub name: String,
    pub status: &'static str,
    pub reason: String,
}

pub struct Outcome {
    pub status: &'static str,
    pub steps: Vec<StepReport>,
    pub reason: String,
}

/// An object an apply/create made, deleted at cleanup.
struct Created {
    res: Res,
    ns: Option<String>,
    name: String,
}

pub struct Runner<'a> {
    pub cluster: &'a Cluster,
    pub base: PathBuf,
    pub namespace: String,
    pub config: Config,
    pub test: Value,
    /// `PATH` for scripts and commands (the project's pinned kubectl first).
    pub path_env: String,
    /// `--settle`: an assert or error operation still failing after the cluster has taken no
    /// write (Leases and Events aside) for this long fails then instead of at its timeout.
    pub settle: Option<Duration>,
    /// The Test's bindings (built-ins, then `spec.bindings`).
    bindings: Bindings,
    timeouts: Timeouts,
    templating: bool,
    failed: bool,
    reasons: Vec<String>,
    cleanups: Vec<(Vec<Created>, Vec<Value>, Bindings, Timeouts)>,
}

/// A failure: `hard` errors are never retried (assertion type errors, bad files). Its text is
/// what the report shows.
#[derive(Debug)]
struct Fail(String);

/// An error's text with its context, as the report shows it (`context: cause`).
impl From<anyhow::Error> for Fail {
    fn from(e: anyhow::Error) -> Fail {
        Fail(format!("{e:#}"))
    }
}

type OpResult = Result<Vec<(String, Value)>, Fail>;

fn fail<T>(s: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(s.into()))
}

impl<'a> Runner<'a> {
    pub fn new(cluster: &'a Cluster, base: PathBuf, namespace: String, config: Config, test: Value) -> Runner<'a> {
        let timeouts = config.timeouts;
        let templating = config.templating;
        Runner {
            cluster,
            base,
            namespace,
            config,
            test,
            path_env: std::env::var("PATH").unwrap_or_default(),
            settle: None,
            bindings: Bindings::default(),
            timeouts,
            templating,
            failed: false,
            reasons: Vec::new(),
            cleanups: Vec::new(),
        }
    }

    pub async fn run(mut self, step_names: &[String]) -> Outcome {
        let spec = self.test["spec"].clone();
        let mut b = Bindings::default();
        b.set("namespace", json!(self.namespace));
        b.set("test", json!({"metadata": {"name": self.test["metadata"]["name"]}}));
        b.set("values", Value::Null);
        match self.timeouts.over(spec.get("timeouts")) {
            Ok(t) => self.timeouts = t,
            Err(e) => return self.broken(step_names, format!("{e:#}")),
        }
        if let Some(t) = spec.get("template").and_then(Value::as_bool) {
            self.templating = t;
        }
        b.set("timeouts", timeouts_value(&self.timeouts));
        match add_bindings(&b, spec.get("bindings")) {
            Ok(b) => self.bindings = b,
            Err(e) => return self.broken(step_names, format!("{e:#}")),
        }
        if let Some(d) = spec.get("delayBeforeCleanup").filter(|v| !v.is_null()) {
            match duration(d) {
                Ok(d) => self.config.delay_before_cleanup = Some(d),
                Err(e) => return self.broken(step_names, format!("{e:#}")),
            }
        }
        let steps = spec["steps"].as_array().cloned().unwrap_or_default();
        let mut reports = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let name = step_names.get(i).cloned().unwrap_or_else(|| step_name(step, i));
            if self.failed {
                reports.push(StepReport { name, status: "skipped", reason: String::new() });
                continue;
            }
            let (status, reason) = match self.step(step).await {
                Ok(()) if !self.failed => ("pass", String::new()),
                Ok(()) => ("fail", self.reasons.last().cloned().unwrap_or_default()),
                Err(e) => {
                    let e = format!("{e:#}");
                    self.failed = true;
                    self.reasons.push(format!("step {name:?}: {e}"));
                    ("fail", e)
                }
            };
            reports.push(StepReport { name, status, reason });
        }
        // Cleanup, last step first; its failures fail the test.
        let cleanup_errors = self.cleanup().await;
        let passed_steps = !self.failed;
        if !cleanup_errors.is_empty() {
            self.failed = true;
            self.reasons.push(format!("cleanup: {}", cleanup_errors.join("; ")));
        }
        Outcome {
            status: if self.failed { "fail" } else { "pass" },
            steps: reports,
            reason: if self.failed {
                if passed_steps { self.reasons.join("; ") } else { self.reasons.first().cloned().unwrap_or_default() }
            } else {
                String::new()
            },
        }
    }

    /// The outcome of a Test that cannot run: `e` is the reason the report shows.
    fn broken(self, step_names: &[String], e: String) -> Outcome {
        Outcome {
            status: "fail",
            steps: step_names
                .iter()
                .map(|n| StepReport { name: n.clone(), status: "skipped", reason: String::new() })
                .collect(),
            reason: e,
        }
    }

    /// One step: its template merged in, bindings, try, catch (when failed), finally.
    async fn step(&mut self, step: &Value) -> Result<()> {
        let mut step = step.clone();
        let mut bindings = self.bindings.clone();
        bindings = add_bindings(&bindings, step.get("bindings"))?;
        if let Some(u) = step.get("use").cloned() {
            let t = u["template"].as_str().context("use: no template")?;
            let path = join(&self.base, t);
            let text = std::fs::read_to_string(&path).with_context(|| format!("step template {}", path.display()))?;
            let docs =
                verno_jmespath::yaml::parse_all(&text).map_err(|e| anyhow!("step template {}: {e}", path.display()))?;
            let [tpl] = docs.as_slice() else {
                bail!("step template {}: expected one document", path.display());
            };
            bindings = add_bindings(&bindings, tpl.pointer("/spec/bindings"))?;
            bindings = add_bindings(&bindings, u.pointer("/with/bindings"))?;
            for list in ["try", "catch", "finally", "cleanup"] {
                if let Some(Value::Array(extra)) = tpl.pointer(&format!("/spec/{list}")) {
                    let mine = step.as_object_mut().context("step is not an object")?;
                    let entry = mine.entry(list).or_insert_with(|| json!([]));
                    if let Value::Array(a) = entry {
                        a.extend(extra.iter().cloned());
                    }
                }
            }
        }
        let timeouts = self.timeouts.over(step.get("timeouts"))?;
        let templating = step.get("template").and_then(Value::as_bool).unwrap_or(self.templating);
        let mut created = Vec::new();
        let mut failure: Option<String> = None;
        for op in step["try"].as_array().cloned().unwrap_or_default() {
            let continue_on_error = op.get("continueOnError").and_then(Value::as_bool).unwrap_or(false);
            match self.operation(&op, &mut bindings, timeouts, templating, &mut created, false).await {
                Ok(()) => {}
                Err(Fail(e)) => {
                    self.failed = true;
                    self.reasons.push(e.clone());
                    if !continue_on_error {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let mut catch: Vec<Value> = self.config.catch.clone();
        if let Some(Value::Array(a)) = self.test.pointer("/spec/catch") {
            catch.extend(a.iter().cloned());
        }
        if let Some(Value::Array(a)) = step.get("catch") {
            catch.extend(a.iter().cloned());
        }
        if self.failed {
            for op in &catch {
                if let Err(Fail(e)) = self.operation(op, &mut bindings, timeouts, templating, &mut created, true).await
                {
                    self.reasons.push(format!("catch: {e}"));
                }
            }
        }
        for op in step["finally"].as_array().cloned().unwrap_or_default() {
            if let Err(Fail(e)) = self.operation(&op, &mut bindings, timeouts, templating, &mut created, true).await {
                self.failed = true;
                self.reasons.push(format!("finally: {e}"));
                failure.get_or_insert(format!("finally: {e}"));
            }
        }
        let cleanup_ops = step["cleanup"].as_array().cloned().unwrap_or_default();
        self.cleanups.push((created, cleanup_ops, bindings, timeouts));
        match failure {
            Some(e) => Err(anyhow::Error::msg(e)),
            None => Ok(()),
        }
    }

    async fn cleanup(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let cleanups = std::mem::take(&mut self.cleanups);
        for (created, ops, mut bindings, timeouts) in cleanups.into_iter().rev() {
            if created.is_empty() && ops.is_empty() {
                continue;
            }
            if !created.is_empty() {
                if let Some(d) = self.config.delay_before_cleanup {
                    tokio::time::sleep(d).await;
                }
                for c in created.iter().rev() {
                    if let Err(e) = self.delete_and_wait(&c.res, c.ns.as_deref(), &c.name, timeouts.cleanup).await {
                        errors.push(format!("{e:#}"));
                    }
                }
            }
            let mut none = Vec::new();
            for op in &ops {
                if let Err(Fail(e)) =
                    self.operation(op, &mut bindings, timeouts, self.templating, &mut none, true).await
                {
                    errors.push(e);
                }
            }
        }
        errors
    }

    async fn delete_and_wait(&self, res: &Res, ns: Option<&str>, name: &str, timeout: Duration) -> Result<()> {
        self.cluster.delete(res, ns, name).await.with_context(|| format!("deleting {} {name}", res.plural))?;
        self.wait_gone(res, ns, name, timeout).await
    }

    /// One operation (`catch_only`: catch/finally/cleanup, which accept only some types).
    async fn operation(
        &mut self,
        op: &Value,
        bindings: &mut Bindings,
        timeouts: Timeouts,
        templating: bool,
        created: &mut Vec<Created>,
        catch_only: bool,
    ) -> Result<(), Fail> {
        let Value::Object(m) = op else { return fail("an operation is not an object") };
        let kinds = [
            "apply", "assert", "command", "create", "delete", "describe", "error", "events", "get", "patch", "podLogs",
            "proxy", "script", "sleep", "update", "wait",
        ];
        let Some((kind, body)) = m.iter().find(|(k, _)| kinds.contains(&k.as_str())) else {
            return fail(format!("unknown operation: {}", Value::Object(m.clone())));
        };
        if catch_only
            && !["delete", "command", "script", "sleep", "wait", "describe", "events", "get", "podLogs", "proxy"]
                .contains(&kind.as_str())
        {
            return fail(format!("{kind} is not allowed in catch, finally or cleanup"));
        }
        let op_timeouts = match body.get("timeout") {
            Some(t) => {
                let d = duration(t)?;
                let mut x = timeouts;
                match kind.as_str() {
                    "apply" | "create" | "update" | "patch" => x.apply = d,
                    "assert" => x.assert = d,
                    "error" => x.error = d,
                    "delete" => x.delete = d,
                    _ => x.exec = d,
                }
                x
            }
            None => timeouts,
        };
        let templating = body.get("template").and_then(Value::as_bool).unwrap_or(templating);
        let local = add_bindings(bindings, body.get("bindings"))?;
        let outputs = match kind.as_str() {
            "apply" | "create" | "update" | "patch" => {
                self.write(kind, body, &local, op_timeouts.apply, templating, created).await?
            }
            "assert" => self.assert_op(body, &local, op_timeouts.assert, templating, false).await?,
            "error" => self.assert_op(body, &local, op_timeouts.error, templating, true).await?,
            "delete" => self.delete_op(body, &local, op_timeouts.delete, templating).await?,
            "script" | "command" => self.exec_op(kind, body, &local, op_timeouts.exec).await?,
            "sleep" => {
                let d = duration(body.get("duration").unwrap_or(&Value::Null)).context("sleep")?;
                tokio::time::sleep(d).await;
                Vec::new()
            }
            other => return fail(format!("unsupported operation: {other}")),
        };
        for (k, v) in outputs {
            bindings.set(&k, v);
        }
        Ok(())
    }

    /// The documents of an operation: `resource` inline, or every document of `file` (a
    /// path relative to the test, possibly a glob); Lists are flattened.
    fn documents(&self, body: &Value, bindings: &Bindings) -> Result<Vec<Value>, Fail> {
        if let Some(r) = body.get("resource") {
            return Ok(flatten(vec![r.clone()]));
        }
        let Some(f) = body.get("file") else { return fail("the operation names neither resource nor file") };
        let f = expr::value_of(f, bindings).context("file")?;
        let f = f.as_str().ok_or_else(|| Fail(format!("file: {f} is not a string")))?.to_string();
        if f.starts_with("http://") || f.starts_with("https://") {
            return fail(format!("unsupported: file {f} is a URL (no network here)"));
        }
        let path = join(&self.base, &f);
        let mut paths: Vec<PathBuf> = match glob::glob(&path.to_string_lossy()) {
            Ok(g) => g.filter_map(Result::ok).collect(),
            Err(_) => vec![path.clone()],
        };
        paths.sort();
        if paths.is_empty() {
            return fail(format!("file {f}: no such file"));
        }
        let mut docs = Vec::new();
        for p in paths {
            let text = std::fs::read_to_string(&p).map_err(|e| Fail(format!("file {}: {e}", p.display())))?;
            let parsed =
                verno_jmespath::yaml::parse_all(&text).map_err(|e| Fail(format!("file {}: {e}", p.display())))?;
            docs.extend(parsed.into_iter().filter(|d| !d.is_null()));
        }
        Ok(flatten(docs))
    }

    /// Resolves the kind and puts namespaced objects without a namespace in the test's.
    async fn place(&self, doc: &mut Value) -> Result<(Res, Option<String>, String), Fail> {
        let av = doc["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let res = self.cluster.resolve(&av, &kind).await?;
        let ns = if res.namespaced {
            let ns = doc.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_string);
            let ns = ns.unwrap_or_else(|| self.namespace.clone());
            if let Some(Value::Object(meta)) = doc.get_mut("metadata") {
                meta.insert("namespace".into(), json!(ns));
            }
            Some(ns)
        } else {
            None
        };
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        Ok((res, ns, name))
    }

    fn force_grace(&self, doc: &mut Value) {
        let Some(d) = self.config.force_grace else { return };
        let secs = json!(d.as_secs());
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let spec = match kind.as_str() {
            "Pod" => doc.pointer_mut("/spec"),
            "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => doc.pointer_mut("/spec/template/spec"),
            "CronJob" => doc.pointer_mut("/spec/jobTemplate/spec/template/spec"),
            _ => None,
        };
        if let Some(Value::Object(s)) = spec {
            s.insert("terminationGracePeriodSeconds".into(), secs);
        }
    }

    /// apply / create / update / patch, with `expect` and retries until the timeout.
    async fn write(
        &mut self,
        kind: &str,
        body: &Value,
        bindings: &Bindings,
        timeout: Duration,
        templating: bool,
        created: &mut Vec<Created>,
    ) -> OpResult {
        let docs = self.documents(body, bindings)?;
        let expect = body.get("expect").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut outputs = Vec::new();
        for doc in docs {
            let mut doc = if templating { expr::template(&doc, bindings)? } else { doc };
            if matches!(kind, "apply" | "create") {
                self.force_grace(&mut doc);
            }
            let (res, ns, name) = self.place(&mut doc).await?;
            let start = Instant::now();
            loop {
                let (result, made) = self.write_once(kind, &res, ns.as_deref(), &name, &doc).await;
                if made {
                    created.push(Created { res: res.clone(), ns: ns.clone(), name: result_name(&result, &name) });
                }
                let error = result.as_ref().err().map(|e| e.message.clone());
                let verdict = match expectations(&expect, &doc, bindings, error.as_deref())? {
                    Some(Ok(())) => Ok(()),
                    Some(Err(m)) => Err((m, false)),
                    None => match &result {
                        Ok(_) => Ok(()),
                        Err(e) => Err((e.message.clone(), kind != "apply" && !retryable(e))),
                    },
                };
                match verdict {
                    Ok(()) => {
                        if let Ok(v) = &result {
                            outputs.extend(self.outputs(body, bindings, v)?);
                        }
                        break;
                    }
                    Err((m, stop)) => {
                        if stop || start.elapsed() >= timeout {
                            return fail(format!("{kind} {} {}: {m}", doc["kind"].as_str().unwrap_or(""), name));
                        }
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
        }
        Ok(outputs)
    }

    /// One attempt; `true` when it created the object.
    async fn write_once(
        &self,
        kind: &str,
        res: &Res,
        ns: Option<&str>,
        name: &str,
        doc: &Value,
    ) -> (Result<Value, ApiError>, bool) {
        let live = if name.is_empty() { Ok(None) } else { self.cluster.get(res, ns, name).await };
        let live = match live {
            Ok(l) => l,
            Err(e) => return (Err(e), false),
        };
        match (kind, live) {
            ("apply" | "create", None) => {
                let r = self.cluster.create(res, ns, doc).await;
                let ok = r.is_ok();
                (r, ok)
            }
            ("create", Some(_)) => (
                Err(ApiError {
                    code: 409,
                    reason: "AlreadyExists".into(),
                    message: format!("{} \"{name}\" already exists", res.plural),
                }),
                false,
            ),
            ("apply" | "patch", Some(live)) => {
                let mut patch = doc.clone();
                if let (Some(rv), Some(Value::Object(meta))) =
                    (live.pointer("/metadata/resourceVersion").cloned(), patch.get_mut("metadata"))
                {
                    meta.insert("resourceVersion".into(), rv);
                }
                (self.cluster.merge_patch(res, ns, name, &patch).await, false)
            }
            ("update", Some(live)) => {
                let mut obj = doc.clone();
                if let (Some(rv), Some(Value::Object(meta))) =
                    (live.pointer("/metadata/resourceVersion").cloned(), obj.get_mut("metadata"))
                {
                    meta.insert("resourceVersion".into(), rv);
                }
                (self.cluster.replace(res, ns, name, &obj).await, false)
            }
            (_, None) => (
                Err(ApiError {
                    code: 404,
                    reason: "NotFound".into(),
                    message: format!("{} \"{name}\" not found", res.plural),
                }),
                false,
            ),
            (other, _) => {
                (Err(ApiError { code: 0, reason: String::new(), message: format!("unknown write {other}") }), false)
            }
        }
    }

    fn outputs(&self, body: &Value, bindings: &Bindings, value: &Value) -> Result<Vec<(String, Value)>, Fail> {
        let mut out = Vec::new();
        for o in body.get("outputs").and_then(Value::as_array).into_iter().flatten() {
            let name = o["name"].as_str().ok_or_else(|| Fail("outputs: an entry without name".into()))?;
            let v = match o.get("value") {
                Some(Value::String(s)) => {
                    let p = expr::parse(s);
                    match &p.compiler {
                        Some(c) => expr::eval(c, &p.statement, value, bindings)?,
                        None => json!(p.statement),
                    }
                }
                Some(v) => v.clone(),
                None => Value::Null,
            };
            out.push((name.to_string(), v));
        }
        Ok(out)
    }

    /// assert (`negate` false) or error (`negate` true), polled until the timeout.
    async fn assert_op(
        &mut self,
        body: &Value,
        bindings: &Bindings,
        timeout: Duration,
        templating: bool,
        negate: bool,
    ) -> OpResult {
        let docs = self.documents(body, bindings)?;
        for doc in docs {
            let doc = if templating { expr::template_lookup(&doc, bindings)? } else { doc };
            let start = Instant::now();
            let (mut seen, mut quiet_since) = (self.cluster.activity(), Instant::now());
            // Scheduled work writes nothing until its time: no giving up on a quiet spell then.
            let settle = if self.cluster.scheduled_work() { None } else { self.settle };
            let what = format!(
                "{} {} {}",
                if negate { "error" } else { "assert" },
                doc["kind"].as_str().unwrap_or(""),
                doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
            );
            loop {
                let (found, last) = self.candidates_matching(&doc, bindings).await?;
                let done = if negate { !found } else { found };
                if done {
                    break;
                }
                let now = self.cluster.activity();
                if now != seen {
                    (seen, quiet_since) = (now, Instant::now());
                }
                let settled = settle.is_some_and(|s| quiet_since.elapsed() >= s);
                if start.elapsed() >= timeout || settled {
                    let why = if negate { "a matching resource still exists".to_string() } else { last };
                    let when = if settled && start.elapsed() < timeout {
                        format!(
                            " (given up after {:?} without a write to the cluster: --settle)",
                            quiet_since.elapsed()
                        )
                    } else {
                        String::new()
                    };
                    return fail(format!("{what}: {why}{when}"));
                }
                tokio::time::sleep(POLL).await;
            }
        }
        Ok(Vec::new())
    }

    /// Whether some live candidate satisfies `doc`; the second value says why none did.
    async fn candidates_matching(&self, doc: &Value, bindings: &Bindings) -> Result<(bool, String), Fail> {
        let (Some(av), Some(kind)) = (doc["apiVersion"].as_str(), doc["kind"].as_str()) else {
            let m = assert::check(doc, &Value::Null, bindings)?;
            return Ok((m.is_empty(), m.join("; ")));
        };
        let res = match self.cluster.resolve(av, kind).await {
            Ok(r) => r,
            Err(e) => return Ok((false, format!("{e:#}"))),
        };
        let ns_given = doc.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_string);
        let ns = if res.namespaced { Some(ns_given.unwrap_or_else(|| self.namespace.clone())) } else { None };
        let candidates = match doc.pointer("/metadata/name").and_then(Value::as_str) {
            Some(name) => match self.cluster.get(&res, ns.as_deref(), name).await {
                Ok(Some(v)) => vec![v],
                Ok(None) => return Ok((false, format!("{} {name} not found", res.plural))),
                Err(e) => return Ok((false, e.message)),
            },
            None => match self.cluster.list(&res, ns.as_deref(), label_selector(doc).as_deref()).await {
                Ok(l) => l,
                Err(e) => return Ok((false, e.message)),
            },
        };
        if candidates.is_empty() {
            return Ok((false, format!("no {} found", res.plural)));
        }
        let mut why = Vec::new();
        for c in &candidates {
            let m = assert::check(doc, c, bindings)?;
            if m.is_empty() {
                return Ok((true, String::new()));
            }
            why.push(m.join("; "));
        }
        Ok((false, why.join(" | ")))
    }

    async fn delete_op(&mut self, body: &Value, bindings: &Bindings, timeout: Duration, templating: bool) -> OpResult {
        let docs = match body.get("ref") {
            Some(r) => vec![
                json!({"apiVersion": r["apiVersion"], "kind": r["kind"], "metadata": {"name": r.get("name"), "namespace": r.get("namespace"), "labels": r.get("labels")}}),
            ],
            None => self.documents(body, bindings)?,
        };
        let expect = body.get("expect").and_then(Value::as_array).cloned().unwrap_or_default();
        for doc in docs {
            let mut doc = if templating { expr::template(&doc, bindings)? } else { doc };
            strip_nulls(&mut doc);
            let av = doc["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let res = self.cluster.resolve(&av, &kind).await?;
            let ns = if res.namespaced {
                Some(
                    doc.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| self.namespace.clone()),
                )
            } else {
                None
            };
            let names: Vec<String> = match doc.pointer("/metadata/name").and_then(Value::as_str) {
                Some(n) => vec![n.to_string()],
                None => {
                    let l = self
                        .cluster
                        .list(&res, ns.as_deref(), label_selector(&doc).as_deref())
                        .await
                        .map_err(|e| Fail(e.message))?;
                    l.iter()
                        .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
                        .collect()
                }
            };
            for name in names {
                let r = self.cluster.delete(&res, ns.as_deref(), &name).await;
                let error = r.as_ref().err().map(|e| e.message.clone());
                match expectations(&expect, &doc, bindings, error.as_deref())? {
                    Some(Ok(())) => continue,
                    Some(Err(m)) => return fail(format!("delete {kind} {name}: {m}")),
                    None => {}
                }
                if let Err(e) = r {
                    return fail(format!("delete {kind} {name}: {e}"));
                }
                self.wait_gone(&res, ns.as_deref(), &name, timeout).await?;
            }
        }
        Ok(Vec::new())
    }

    /// Polls until the object is gone, within `timeout` (delete operations and cleanup).
    async fn wait_gone(&self, res: &Res, ns: Option<&str>, name: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            match self.cluster.get(res, ns, name).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) if start.elapsed() < timeout => tokio::time::sleep(POLL).await,
                Ok(Some(_)) => bail!("{} {name} was not deleted within {timeout:?}", res.plural),
                Err(e) => {
                    return Err(e).with_context(|| format!("waiting for the deletion of {} {name}", res.plural));
                }
            }
        }
    }

    /// script (`sh -c`) and command, with `check` on `$stdout`, `$stderr`, `$error`.
    async fn exec_op(&mut self, kind: &str, body: &Value, bindings: &Bindings, timeout: Duration) -> OpResult {
        let mut cmd = if kind == "script" {
            let content = body["content"].as_str().ok_or_else(|| Fail("script: no content".into()))?;
            let mut c = tokio::process::Command::new("sh");
            c.arg("-c").arg(content);
            c
        } else {
            let entry = body["entrypoint"].as_str().ok_or_else(|| Fail("command: no entrypoint".into()))?;
            let mut c = tokio::process::Command::new(entry);
            for a in body["args"].as_array().into_iter().flatten() {
                c.arg(expand_env(a.as_str().unwrap_or_default(), &self.namespace));
            }
            c
        };
        let workdir = match body.get("workDir").and_then(Value::as_str) {
            Some(w) => join(&self.base, w),
            None => self.base.clone(),
        };
        cmd.current_dir(workdir)
            .env("NAMESPACE", &self.namespace)
            .env("KUBECONFIG", &self.cluster.kubeconfig)
            .env("PATH", &self.path_env)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for e in body["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap_or_default();
            let v = expr::value_of(e.get("value").unwrap_or(&Value::Null), bindings)?;
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            cmd.env(name, v);
        }
        let child = cmd.spawn().map_err(|e| Fail(format!("{kind}: cannot start: {e}")))?;
        let pid = child.id();
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return fail(format!("{kind}: {e}")),
            Err(_) => {
                if let Some(pid) = pid {
                    let _ = std::process::Command::new("kill").args(["-9", &format!("-{pid}")]).status();
                }
                return fail(format!("{kind}: did not finish within {timeout:?}"));
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let error = if out.status.success() {
            Value::Null
        } else {
            json!(match out.status.code() {
                Some(c) => format!("exit status {c}"),
                None => "signal: killed".to_string(),
            })
        };
        match body.get("check").filter(|c| !c.is_null()) {
            Some(check) => {
                let b = bindings.with("stdout", json!(stdout)).with("stderr", json!(stderr)).with("error", error);
                let m = assert::check(check, &Value::Null, &b)?;
                if !m.is_empty() {
                    return fail(format!(
                        "{kind} check failed: {}\nstdout: {}\nstderr: {}",
                        m.join("; "),
                        tail(&stdout),
                        tail(&stderr)
                    ));
                }
            }
            None => {
                if !error.is_null() {
                    return fail(format!(
                        "{kind}: {}\nstdout: {}\nstderr: {}",
                        error.as_str().unwrap_or(""),
                        tail(&stdout),
                        tail(&stderr)
                    ));
                }
            }
        }
        let b = bindings.with("stdout", json!(stdout)).with("stderr", json!(stderr));
        let mut outputs = Vec::new();
        for o in body.get("outputs").and_then(Value::as_array).into_iter().flatten() {
            let name = o["name"].as_str().ok_or_else(|| Fail("outputs: an entry without name".into()))?;
            let v = expr::value_of(o.get("value").unwrap_or(&Value::Null), &b)?;
            outputs.push((name.to_string(), v));
        }
        Ok(outputs)
    }
}

fn tail(s: &str) -> String {
    let t = s.trim();
    if t.len() > 600 { format!("…{}", &t[t.ceil_char_boundary(t.len() - 600)..]) } else { t.to_string() }
}

/// `$NAMESPACE` and `${NAMESPACE}`-style expansion of command arguments from the environment
/// chainsaw gives commands.
fn expand_env(s: &str, namespace: &str) -> String {
    let mut out = s.replace("${NAMESPACE}", namespace).replace("$NAMESPACE", namespace);
    for (k, v) in std::env::vars() {
        out = out.replace(&format!("${{{k}}}", k = k), &v);
    }
    out
}

/// `expect`: `None` when no entry's `match` holds on the sent document (the API error then
/// decides); else the selected `check` trees' verdict, with `$error` (`Err`: the mismatches as
/// the report words them).
fn expectations(
    expect: &[Value],
    doc: &Value,
    bindings: &Bindings,
    error: Option<&str>,
) -> Result<Option<Result<(), String>>, Fail> {
    let b = bindings.with("error", error.map_or(Value::Null, |e| json!(e)));
    let mut selected = false;
    let mut problems = Vec::new();
    for e in expect {
        if let Some(m) = e.get("match").filter(|m| !m.is_null())
            && !assert::check(m, doc, &b)?.is_empty()
        {
            continue;
        }
        selected = true;
        if let Some(c) = e.get("check") {
            let m = assert::check(c, doc, &b)?;
            if !m.is_empty() {
                problems.push(format!("{} ($error: {})", m.join("; "), error.unwrap_or("null")));
            }
        }
    }
    if !selected {
        return Ok(None);
    }
    Ok(Some(if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }))
}

/// `metadata.labels` of a lookup document as a label selector (`k=v,…`).
fn label_selector(doc: &Value) -> Option<String> {
    doc.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(","))
}

fn retryable(e: &ApiError) -> bool {
    matches!(e.code, 409 | 429 | 503 | 504) && e.reason != "AlreadyExists"
}

fn result_name(r: &Result<Value, ApiError>, fallback: &str) -> String {
    r.as_ref().ok().and_then(|v| v.pointer("/metadata/name").and_then(Value::as_str)).unwrap_or(fallback).to_string()
}

fn strip_nulls(v: &mut Value) {
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.retain(|_, x| !x.is_null());
    }
}

/// Chainsaw's loader: every document whose `items` is a list is a list (apimachinery's
/// `IsList`, whatever its kind — or none), replaced by its items.
fn flatten(docs: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for d in docs {
        if d["items"].is_array() {
            out.extend(d["items"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(d);
        }
    }
    out
}

/// Go's `filepath.Join(base, rel)`: a leading `/` in `rel` is not absolute; `..` is resolved
/// lexically.
pub fn join(base: &Path, rel: &str) -> PathBuf {
    let mut parts: Vec<String> = base.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.len() > 1 {
                    parts.pop();
                }
            }
            s => parts.push(s.to_string()),
        }
    }
    let mut p = PathBuf::new();
    for s in parts {
        p.push(s);
    }
    p
}

fn step_name(step: &Value, i: usize) -> String {
    step.get("name").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| format!("step #{}", i + 1))
}

fn timeouts_value(t: &Timeouts) -> Value {
    let f = |d: Duration| json!(format!("{}s", d.as_secs_f64()));
    json!({"apply": f(t.apply), "assert": f(t.assert), "error": f(t.error), "delete": f(t.delete), "cleanup": f(t.cleanup), "exec": f(t.exec)})
}

/// `bindings` entries (name, value) added in order; each value is templated with the
/// bindings before it.
fn add_bindings(base: &Bindings, list: Option<&Value>) -> Result<Bindings> {
    let mut b = base.clone();
    for e in list.and_then(Value::as_array).into_iter().flatten() {
        let name = e["name"].as_str().context("a binding has no name")?;
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            bail!("binding name {name:?} is not a word");
        }
        let v =
            expr::template(e.get("value").unwrap_or(&Value::Null), &b).with_context(|| format!("binding {name}"))?;
        b.set(name, v);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_is_gos_filepath_join() {
        assert_eq!(join(Path::new("/a/b/c"), "../../x.yaml"), PathBuf::from("/a/x.yaml"));
        assert_eq!(join(Path::new("/a/b"), "/../x.yaml"), PathBuf::from("/a/x.yaml"));
        assert_eq!(join(Path::new("/a/b"), "./y/z.yaml"), PathBuf::from("/a/b/y/z.yaml"));
    }

    #[test]
    fn expectations_select_by_match_and_decide_by_check() {
        let b = Bindings::default();
        let doc = json!({"metadata": {"name": "bad"}});
        let expect = vec![json!({"match": {"metadata": {"name": "bad"}}, "check": {"($error != null)": true}})];
        assert_eq!(expectations(&expect, &doc, &b, Some("denied")).unwrap(), Some(Ok(())));
        assert!(matches!(expectations(&expect, &doc, &b, None).unwrap(), Some(Err(_))));
        let other = json!({"metadata": {"name": "good"}});
        assert_eq!(expectations(&expect, &other, &b, None).unwrap(), None);
    }
}
