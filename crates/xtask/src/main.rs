//! `cargo xtask RECIPE`: the one task runner, with the recipes `.ci/run` calls. Plain `std`,
//! so it builds in seconds on a fresh machine and needs nothing installed.
//!
//! - `fmt`    `cargo fmt --all --check`
//! - `clippy` `cargo clippy --workspace --all-targets --locked -- -D warnings`
//! - `test`   `cargo test --workspace --locked` (the README's test command)
//! - `fuzz`   `scripts/fuzz.sh 15`: every fuzz target for 15 s (nightly; skipped without it)
//! - `circles CRATE_DIR` the import circles between a crate's modules (strongly connected
//!   components of `crate::` references outside `#[cfg(test)]` modules), largest first
//! - `ci`     all four, in that order, stopping at the first failure; between the tests and
//!   the fuzz run it deletes the test build (`target/debug/{deps,build,incremental}`), which the
//!   fuzz build (its own target folder, `fuzz/target`) does not use: the two together need about
//!   6 GB, and a CI run failed with "No space left on device" building the fuzz targets

mod circles;

use std::process::{Command, ExitCode};

const RECIPES: &[(&str, &[&str])] = &[
    ("fmt", &["fmt", "--all", "--check"]),
    ("clippy", &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]),
    ("test", &["test", "--workspace", "--locked"]),
];

fn cargo(args: &[&str]) -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    match Command::new(&cargo).args(args).status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {cargo}: {e}");
            false
        }
    }
}

fn fuzz() -> bool {
    eprintln!("xtask: scripts/fuzz.sh 15");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fuzz.sh");
    match Command::new("bash").args([script, "15"]).status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run scripts/fuzz.sh: {e}");
            false
        }
    }
}

/// Deletes the test build's bulk (not the running `xtask` binary, a separate hard link) and
/// says how much disk is left, so that the fuzz build has the room the tests used.
fn free_test_build() {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        std::path::PathBuf::from,
    );
    for dir in ["deps", "build", "incremental"] {
        let path = target.join("debug").join(dir);
        if let Err(e) = std::fs::remove_dir_all(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("xtask: cannot delete {}: {e}", path.display());
        }
    }
    eprintln!("xtask: deleted the test build in {}/debug", target.display());
    let _ = Command::new("df").args(["-h", "."]).status();
}

fn main() -> ExitCode {
    let recipe = std::env::args().nth(1).unwrap_or_default();
    if recipe == "circles" {
        let dir = std::env::args().nth(2).unwrap_or_else(|| "crates/engine".into());
        return match circles::report(std::path::Path::new(&dir)) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask circles: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if recipe == "fuzz" {
        return if fuzz() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let chosen: Vec<&[&str]> = match recipe.as_str() {
        "ci" => RECIPES.iter().map(|(_, a)| *a).collect(),
        r => match RECIPES.iter().find(|(n, _)| *n == r) {
            Some((_, a)) => vec![*a],
            None => {
                let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
                eprintln!("usage: cargo xtask <{}|fuzz|circles CRATE_DIR|ci>", names.join("|"));
                return ExitCode::from(2);
            }
        },
    };
    for args in chosen {
        if !cargo(args) {
            return ExitCode::FAILURE;
        }
    }
    if recipe == "ci" {
        free_test_build();
        if !fuzz() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
