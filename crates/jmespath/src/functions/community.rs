//! Functions chainsaw and kyverno-json add to jmespath-community that Kyverno's dialect lacks;
//! only expressions compiled in [`crate::Dialect::Community`] see them (the test runner's
//! assertions), so a policy can never call them.

use super::{Function, S, str_arg};
use serde_json::Value;

pub(crate) static FUNCTIONS: &[Function] = &[Function {
    name: "trim_space",
    params: &[S],
    variadic: false,
    returns: "string",
    custom: true,
    note: "removes leading and trailing white space (Go's strings.TrimSpace)",
    imp: |c, a| Ok(Value::String(str_arg(c, a, 0)?.trim().to_string())),
}];
