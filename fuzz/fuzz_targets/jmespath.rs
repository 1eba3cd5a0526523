//! The JMESPath parser and interpreter with Kyverno's functions: `EXPR \0 JSON`. An error of
//! the expression must be one of every expression enclosing it, as go-jmespath's is
//! (`properties::jmespath_errors_propagate`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_jmespath::{Expression, NoEnv};

fuzz_target!(|data: &[u8]| {
    let [expr, json] = verno_fuzz::parts::<2>(data);
    let Ok(e) = Expression::compile(&expr) else { return };
    let input = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
    let _ = e.search(&input, &NoEnv);
    if let Err(why) = verno_fuzz::properties::jmespath_errors_propagate(&expr, &input) {
        panic!("{why}");
    }
});
