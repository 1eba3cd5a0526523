//! Verno's policy engine: pure, compile once, evaluate many.
//!
//! The front door has two halves. [`compile`] turns any policy document Verno knows (a
//! [`Kind`]) into a [`CompiledPolicy`] or [`CompiledException`]: templates, JMESPath, CEL,
//! matchers, conditions and autogen rules parsed once, errors with their field path. A
//! [`PolicySet`] holds what is in force; [`PolicySet::evaluate`] (or [`PolicySet::review`] for an
//! AdmissionRequest) runs one request through the phases in Kyverno's order and returns one
//! [`Outcome`]. The CLI, the webhook and the controllers call nothing else to evaluate.
//!
//! Nothing here touches the network, the filesystem, the environment or the clock (the crate's
//! `clippy.toml` forbids them); outside data comes in through the [`Data`] port and
//! [`verno_jmespath::Env`], and time is measured by callers through an [`Observer`].
//!
//! Inside, by layer: `document` (the kind → compiler table), `policy` (a compiled policy and
//! its rules), one module per rule kind (`validate`, `mutate`, `generate`, with `pss`,
//! `pattern`, `anchor`, `smp`, `jsonpatch` under them), the CEL kinds (`vpol`, `mpol`),
//! `context_entry`, `condition`, `template`, `matching`, `autogen`; `evaluate` runs one policy's
//! rules, `set` runs a request through every policy, `verdict` words the answer.

pub mod access_checks;
mod anchor;
mod attestors;
mod autogen;
mod cel_env;
mod cel_kind;
mod cleanup;
mod clusterpolicy;
mod condition;
mod confine;
mod context;
mod context_entry;
pub mod cron;
mod decode;
mod document;
mod error;
mod evaluate;
pub mod filters;
mod forms;
mod generate;
pub mod global_context;
mod gpol;
mod image_cel;
mod images;
mod ivpol;
pub mod jsonpatch;
mod manifests;
mod matching;
mod mpol;
mod mutate;
mod outcome;
mod pattern;
mod policy;
mod ports;
mod pss;
pub mod report;
mod rule_checks;
mod set;
mod smp;
mod template;
pub mod ttl;
mod validate;
pub mod vapgen;
mod verdict;
pub mod verify_images;
mod vpol;
pub mod webhookgen;

pub use cleanup::CleanupTargets;
pub use document::{Compiled, ScopeQuestion, compile, compile_stored, generate_update_allowed, scope_questions};
pub use error::DocumentError;
pub use error::{CompileError, EvalError};
pub use evaluate::{EXCEPTION_RULE, Phase};
pub use forms::{CompiledCleanup, Decision};
pub use images::image_info;
pub use matching::{KindSelector, Matcher, RequestUser, WebhookScope, labels_of, plural, string_map};
pub use outcome::{NotApplied, PolicyResponse, RuleResponse, RuleType, Status};
pub use policy::{Action, CompiledException, CompiledPolicy, CompiledRule, RuleBody};
pub use ports::{Asker, Data, Loaded, NamespaceView, NoData, Request, Service, UserInfoRef};
pub use set::{
    Filter, Hook, Labels, LiveNamespaces, Observer, Outcome, PolicyMeta, PolicySet, Route, Scope, fail_closed,
};
/// Kubernetes' strategic merge patch of `patch` into `doc` (an object of `kind`), with the
/// built-in kinds' merge keys; errors say where and why.
pub use smp::apply as strategic_merge;
pub use verdict::{
    Applied, Notice, PolicyApplied, ResourceRef, RuleViolation, Violation, blocked_message, yaml_scalar,
};
pub use verno_api::Kind;
pub use verno_api::Operation;
pub use vpol::autogen_status as vpol_autogen_status;
pub use vpol::{ENVOY_CHECK_REQUEST, HTTP_CHECK_REQUEST};

/// `parts` joined into one string allocated once. The failure messages of the engine's hot
/// path are built with it: `format!` goes through the formatting machinery (a padding check
/// and a dynamic call per piece), several times the cost of copying the pieces.
pub(crate) fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// Appends `n` in decimal (list indexes in messages and paths), without the formatter.
pub(crate) fn push_index(s: &mut String, n: usize) {
    if n < 10 {
        s.push(char::from(b'0' + n as u8));
    } else {
        push_index(s, n / 10);
        s.push(char::from(b'0' + (n % 10) as u8));
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`), as Go's decoded maps do.
pub fn equal(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn indexes_and_pieces_are_written_as_format_writes_them() {
        for n in [0usize, 7, 9, 10, 42, 100, 1234, usize::MAX] {
            let mut s = String::from("x");
            super::push_index(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
        assert_eq!(super::cat(&["a", "", "bc", "d"]), "abcd");
        assert_eq!(super::cat(&[]), "");
    }
}
