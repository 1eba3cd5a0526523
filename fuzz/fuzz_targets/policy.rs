//! Policy compilation from YAML for every kind Verno knows, then one evaluation of whatever
//! compiled on a Pod: `YAML` (several documents; each is compiled with the others as bindings).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use verno_engine::{Compiled, PolicySet, Request, Scope};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(docs) = verno_jmespath::yaml::parse_all(text) else { return };
    let (mut policies, mut exceptions) = (Vec::new(), Vec::new());
    for d in &docs {
        match verno_engine::compile(d, &docs) {
            Ok(Compiled::Policy(p)) => policies.push(Arc::new(p)),
            Ok(Compiled::Exception(e)) => exceptions.push(e),
            Err(e) => {
                let _ = e.with_path();
            }
        }
    }
    let set = PolicySet::new(policies, exceptions);
    let pod = verno_fuzz::pod();
    let _ =
        set.evaluate(&Request::new(verno_engine::Operation::Create, &pod), Scope::ALL, &verno_jmespath::NoEnv, &verno_engine::NoData, &mut ());
});
