//! `verno jp`: the JMESPath playground with Kyverno's functions.

use anyhow::{Context as _, Result, anyhow};
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum JpCommand {
    /// Evaluate expressions against a JSON or YAML input.
    Query {
        /// Input file (default: stdin).
        #[arg(short = 'i', long = "input")]
        input: Option<PathBuf>,
        /// Read expressions from files.
        #[arg(short = 'q', long = "query")]
        query_files: Vec<PathBuf>,
        /// Compact output.
        #[arg(short = 'c', long = "compact")]
        compact: bool,
        /// Print strings without quotes.
        #[arg(short = 'u', long = "unquoted")]
        unquoted: bool,
        expressions: Vec<String>,
    },
    /// Print the syntax tree of expressions.
    Parse {
        #[arg(short = 'q', long = "query")]
        query_files: Vec<PathBuf>,
        expressions: Vec<String>,
    },
    /// List functions (all Kyverno functions, or the named ones).
    Function { names: Vec<String> },
}

pub fn run(cmd: &JpCommand) -> i32 {
    match run_inner(cmd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e:#}");
            1
        }
    }
}

fn read_queries(files: &[PathBuf], exprs: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for f in files {
        out.push(std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?);
    }
    out.extend(exprs.iter().cloned());
    if out.is_empty() {
        return Err(anyhow!("at least one expression is required"));
    }
    Ok(out)
}

fn run_inner(cmd: &JpCommand) -> Result<i32> {
    match cmd {
        JpCommand::Query { input, query_files, compact, unquoted, expressions } => {
            let text = match input {
                Some(p) => std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
                None => {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
                    s
                }
            };
            let data = verno_jmespath::yaml::parse(&text).map_err(|e| anyhow!("invalid input: {e}"))?;
            for q in read_queries(query_files, expressions)? {
                println!("# {}", q.trim());
                let e = verno_jmespath::Expression::compile(q.trim()).map_err(|e| anyhow!("{e}"))?;
                let v = e.search(&data, &crate::data::CliEnv).map_err(|e| anyhow!("{e}"))?;
                match (v.as_ref(), unquoted) {
                    (Value::String(s), true) => println!("{s}"),
                    (other, _) => println!(
                        "{}",
                        if *compact { serde_json::to_string(other)? } else { serde_json::to_string_pretty(other)? }
                    ),
                }
            }
            Ok(0)
        }
        JpCommand::Parse { query_files, expressions } => {
            for q in read_queries(query_files, expressions)? {
                println!("# {}", q.trim());
                let e = verno_jmespath::Expression::compile(q.trim()).map_err(|e| anyhow!("{e}"))?;
                println!("{}", e.ast().sexpr());
            }
            Ok(0)
        }
        JpCommand::Function { names } => {
            for f in verno_jmespath::all_functions() {
                if !f.custom && names.is_empty() {
                    continue;
                }
                if !names.is_empty() && !names.iter().any(|n| n == f.name) {
                    continue;
                }
                println!("Name: {}", f.name);
                println!("  Signature: {}", f.signature());
                if !f.note.is_empty() {
                    println!("  Note:      {}", f.note);
                }
                println!();
            }
            Ok(0)
        }
    }
}
