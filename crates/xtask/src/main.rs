//! `cargo xtask RECIPE`: the one task runner, with the recipes `.ci/run` calls. Plain `std`,
//! so it builds in seconds on a fresh machine and needs nothing installed.
//!
//! - `fmt`    `cargo fmt --all --check`
//! - `clippy` `cargo clippy --workspace --all-targets --locked -- -D warnings`
//! - `test`   `cargo test --workspace --locked` (the README's test command)
//! - `fuzz`   `scripts/fuzz.sh 15`: every fuzz target for 15 s (nightly; skipped without it)
//! - `ci`     all four, in that order, stopping at the first failure

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

fn main() -> ExitCode {
    let recipe = std::env::args().nth(1).unwrap_or_default();
    if recipe == "fuzz" {
        return if fuzz() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let chosen: Vec<&[&str]> = match recipe.as_str() {
        "ci" => RECIPES.iter().map(|(_, a)| *a).collect(),
        r => match RECIPES.iter().find(|(n, _)| *n == r) {
            Some((_, a)) => vec![*a],
            None => {
                let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
                eprintln!("usage: cargo xtask <{}|fuzz|ci>", names.join("|"));
                return ExitCode::from(2);
            }
        },
    };
    for args in chosen {
        if !cargo(args) {
            return ExitCode::FAILURE;
        }
    }
    if recipe == "ci" && !fuzz() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
