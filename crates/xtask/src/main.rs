//! `cargo xtask RECIPE`: the one task runner, with the recipes `.ci/run` calls. Plain `std`,
//! so it builds in seconds on a fresh machine and needs nothing installed.
//!
//! - `fmt`    `cargo fmt --all --check`
//! - `clippy` `cargo clippy --workspace --all-targets --locked -- -D warnings`
//! - `test`   `cargo test --workspace --locked` (the README's test command)
//! - `ci`     all three, in that order, stopping at the first failure

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

fn main() -> ExitCode {
    let recipe = std::env::args().nth(1).unwrap_or_default();
    let chosen: Vec<&[&str]> = match recipe.as_str() {
        "ci" => RECIPES.iter().map(|(_, a)| *a).collect(),
        r => match RECIPES.iter().find(|(n, _)| *n == r) {
            Some((_, a)) => vec![*a],
            None => {
                let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
                eprintln!("usage: cargo xtask <{}|ci>", names.join("|"));
                return ExitCode::from(2);
            }
        },
    };
    for args in chosen {
        if !cargo(args) {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
