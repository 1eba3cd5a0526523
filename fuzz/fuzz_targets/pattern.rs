//! Validate patterns with every anchor, and the same text as a mutate overlay:
//! `PATTERN-YAML \0 RESOURCE-JSON`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let [pattern, resource] = verno_fuzz::parts::<2>(data);
    let Some(pattern) = verno_fuzz::yaml(&pattern) else { return };
    let object = verno_fuzz::yaml(&resource).filter(|v| v.is_object()).unwrap_or_else(verno_fuzz::pod);
    let any = json!([{"resources": {"kinds": ["*"]}}]);
    let policy = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "fuzz"},
        "spec": {"validationFailureAction": "Audit", "rules": [
            {"name": "overlay", "match": {"any": any}, "mutate": {"patchStrategicMerge": pattern}},
            {"name": "pattern", "match": {"any": any}, "validate": {"pattern": pattern}},
            {"name": "any", "match": {"any": any}, "validate": {"anyPattern": [pattern, {"kind": "?*"}]}}
        ]}
    });
    verno_fuzz::evaluate_one(&policy, &object);
});
