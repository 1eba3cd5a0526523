//! CEL compile and evaluation with Kubernetes' and Kyverno's libraries:
//! `EXPRESSION \0 OBJECT-JSON` (the object is `object`, and `variables.v`). The direct
//! evaluator's answers must be the crate interpreter's (`Expr::direct_disagreement`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_cel::{Expr, Vars};

fuzz_target!(|data: &[u8]| {
    let [expr, json] = verno_fuzz::parts::<2>(data);
    let Ok(e) = Expr::compile(&expr) else { return };
    let object = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
    let mut vars = Vars::default();
    vars.set("object", &object);
    vars.set_variable("v", &object);
    if let Some(why) = e.direct_disagreement(&vars) {
        panic!("{why}");
    }
    let _ = e.eval(&vars);
    let _ = e.eval_into_variable("w", &mut vars);
});
