//! Verno's command line: `test`, `apply` and `jp`, compatible with the Kyverno CLI; `serve`,
//! `manifests`, `break-glass` and `doctor` for the admission controller.
//! File loading and output live here; evaluation is the engine's.

pub mod apply_cmd;
pub mod cleanup_cmd;
pub mod cluster_cmd;
pub mod compare;
pub mod data;
pub mod in_cluster;
pub mod jp_cmd;
pub mod load;
pub mod serve_cmd;
pub mod table;
pub mod test_cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "verno", version, about = "A Kyverno-compatible Kubernetes policy engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run kyverno-test.yaml suites.
    Test(test_cmd::TestArgs),
    /// Apply policies to resources.
    Apply(apply_cmd::ApplyArgs),
    /// Run the admission webhook server (HTTPS) on policies from files, or in a cluster
    /// with --kube.
    Serve(serve_cmd::ServeArgs),
    /// Print the plain-YAML install (webhook configurations first).
    Manifests(cluster_cmd::ManifestsArgs),
    /// Set every Verno webhook to failurePolicy Ignore (or --restore): the way out of a
    /// cluster that refuses writes because Verno is unreachable.
    BreakGlass(cluster_cmd::BreakGlassArgs),
    /// Show Verno's webhook entries, ready endpoints and leader.
    Doctor(cluster_cmd::DoctorArgs),
    /// Preview what cleanup and deleting policies and the cleanup.kyverno.io/ttl label would
    /// delete now (--dry-run), against manifests or a cluster.
    Cleanup(cleanup_cmd::CleanupArgs),
    /// JMESPath playground with Kyverno's functions.
    Jp {
        #[command(subcommand)]
        cmd: jp_cmd::JpCommand,
    },
}

/// Parses arguments and runs; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_on_closed_stdout();
    }
    match &cli.command {
        Command::Test(a) => test_cmd::run(a),
        Command::Apply(a) => apply_cmd::run(a),
        Command::Cleanup(a) => cleanup_cmd::run(a),
        Command::Serve(a) => serve_cmd::run(a),
        Command::Manifests(a) => cluster_cmd::manifests(a),
        Command::BreakGlass(a) => cluster_cmd::break_glass(a),
        Command::Doctor(a) => cluster_cmd::doctor(a),
        Command::Jp { cmd } => jp_cmd::run(cmd),
    }
}

/// `verno apply … | head`: when the reader of stdout goes away, `println!` panics ("failed
/// printing to stdout: Broken pipe"). A command-line tool stops quietly instead, with the
/// status a shell gives a process killed by SIGPIPE (128 + 13). (Restoring SIGPIPE's default
/// action would need unsafe code; the panic is caught by its message instead.)
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}
