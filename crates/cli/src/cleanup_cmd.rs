//! `verno cleanup --dry-run`: what cleanup and deleting policies, and the
//! `cleanup.kyverno.io/ttl` label, would delete now — against manifests (`-r`) or a cluster
//! (`--cluster`, the kubeconfig's context). Nothing is ever deleted: the cleanup controller
//! does that in a cluster. The verdicts come from the engine's front door (`Scope::cleanup`),
//! the same the controller asks.

use crate::data::{CliData, CliEnv};
use crate::load::{self, load_policies};
use anyhow::{Result, anyhow, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use verno_engine::ttl::{TTL_LABEL, expiry};
use verno_engine::{CompiledPolicy, PolicySet, Request, Scope, Status};

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Only list what would be deleted (required: this command never deletes).
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Cleanup or deleting policy files or directories.
    #[arg(short = 'p', long = "policy")]
    pub policies: Vec<PathBuf>,
    /// Resource files or directories to judge (with --cluster: the cluster's objects instead).
    #[arg(short = 'r', long = "resource")]
    pub resources: Vec<PathBuf>,
    /// Read candidates from the cluster of the current kubeconfig context (paged lists, the
    /// policy's selector pushed down).
    #[arg(long = "cluster")]
    pub cluster: bool,
    /// Also list objects whose cleanup.kyverno.io/ttl label has expired (or cannot be read).
    #[arg(long = "ttl")]
    pub ttl: bool,
}

pub fn run(args: &CleanupArgs) -> i32 {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            1
        }
    }
}

fn describe(o: &Value) -> String {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("");
    match s("/metadata/namespace") {
        "" => format!("{} {}", s("/kind"), s("/metadata/name")),
        ns => format!("{} {ns}/{}", s("/kind"), s("/metadata/name")),
    }
}

fn header(p: &CompiledPolicy, now: DateTime<Utc>) -> String {
    let key = match (&p.namespace, p.kind.is_namespaced()) {
        (Some(ns), true) => format!("{ns}/{}", p.name),
        _ => p.name.clone(),
    };
    let (schedule, next) = match p.cleanup() {
        Some(c) => (
            c.schedule.source().to_string(),
            c.schedule.next_after(now).map_or_else(|| "never".to_string(), |t| t.to_rfc3339()),
        ),
        None => (String::new(), String::new()),
    };
    format!("{} {key} (schedule {schedule:?}, next run {next})", p.kind)
}

/// The TTL verdict of one object: `Some(line)` when it is due or its label is unreadable.
fn ttl_line(o: &Value, now: DateTime<Utc>) -> Option<String> {
    let value = o.pointer("/metadata/labels").and_then(|l| l.get(TTL_LABEL)).and_then(Value::as_str)?;
    let created = o
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map_or(now, |t| t.with_timezone(&Utc));
    match expiry(value, created) {
        Ok(due) if due <= now => Some(format!("  {} ({TTL_LABEL}={value}, due {})", describe(o), due.to_rfc3339())),
        Ok(_) => None,
        Err(e) => Some(format!("  {}: never deleted: {e}", describe(o))),
    }
}

fn run_inner(args: &CleanupArgs) -> Result<i32> {
    if !args.dry_run {
        bail!("verno cleanup only previews (--dry-run); in a cluster the cleanup controller deletes");
    }
    let mut pdocs = Vec::new();
    for p in &args.policies {
        pdocs.extend(load::read_docs(p)?);
    }
    let loaded = load_policies(pdocs);
    if !loaded.invalid.is_empty() {
        loaded.print_invalid();
        bail!("invalid policies: {:?} (see the errors above)", loaded.invalid_keys());
    }
    let policies: Vec<Arc<CompiledPolicy>> = loaded.compiled.into_iter().filter(|p| p.cleanup().is_some()).collect();
    if policies.is_empty() && !args.ttl {
        bail!("no cleanup or deleting policy given (-p), and no --ttl");
    }
    let set = Arc::new(PolicySet::new(policies.clone(), Vec::new()));
    let now = Utc::now();
    if args.cluster {
        return cluster_preview(&set, &policies, args.ttl, now);
    }
    let mut resources: Vec<Value> = Vec::new();
    for p in &args.resources {
        for d in load::read_docs(p)? {
            if !load::is_kyverno_policy(&d.value) {
                resources.push(d.value);
            }
        }
    }
    let mut data = CliData { cluster: Some(resources.clone()), ..CliData::default() };
    data.build_cel_host();
    for p in &policies {
        println!("{}", header(p, now));
        let scope = || Scope::cleanup(p.kind, p.namespace.as_deref(), &p.name);
        let mut due = 0;
        for r in &resources {
            let out = set.evaluate(&Request::new(verno_engine::Operation::Create, r), scope(), &CliEnv, &data, &mut ());
            for rule in out.responses.iter().flat_map(|(_, resp)| &resp.rules) {
                match rule.status {
                    Status::Pass => {
                        due += 1;
                        println!("  would delete {}", describe(r));
                    }
                    Status::Error => println!("  cannot decide on {}: {}", describe(r), rule.message),
                    _ => {}
                }
            }
        }
        println!("  {due} of {} resource(s) would be deleted", resources.len());
    }
    if args.ttl {
        println!("{TTL_LABEL}:");
        for r in &resources {
            if let Some(line) = ttl_line(r, now) {
                println!("{line}");
            }
        }
    }
    Ok(0)
}

fn cluster_preview(
    set: &Arc<PolicySet>,
    policies: &[Arc<CompiledPolicy>],
    ttl: bool,
    now: DateTime<Utc>,
) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| anyhow!("connecting to the cluster: {e}"))?;
        for p in policies {
            println!("{}", header(p, now));
            let found = verno_controller::cleanup::preview(&client, set, p).await.map_err(|e| anyhow!("{e}"))?;
            for o in &found.due {
                println!("  would delete {}", describe(o));
            }
            for (o, e) in &found.undecided {
                println!("  cannot decide on {}: {e}", describe(o));
            }
            println!("  {} of {} listed object(s) would be deleted", found.due.len(), found.listed);
        }
        if ttl {
            println!("{TTL_LABEL}:");
            for o in verno_controller::cleanup::ttl_labelled(&client).await.map_err(|e| anyhow!("{e}"))? {
                if let Some(line) = ttl_line(&o, now) {
                    println!("{line}");
                }
            }
        }
        Ok(0)
    })
}
