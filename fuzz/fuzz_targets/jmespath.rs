//! The JMESPath parser and interpreter with Kyverno's functions: `EXPR \0 JSON`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_jmespath::{Expression, NoEnv};

fuzz_target!(|data: &[u8]| {
    let [expr, json] = verno_fuzz::parts::<2>(data);
    let Ok(e) = Expression::compile(&expr) else { return };
    let input = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
    let _ = e.search(&input, &NoEnv);
});
