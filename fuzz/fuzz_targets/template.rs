//! `{{ }}` templates in messages and patches, rendered against a fuzzed resource:
//! `TEXT \0 RESOURCE-JSON`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let [text, resource] = verno_fuzz::parts::<2>(data);
    let object = verno_fuzz::yaml(&resource).filter(|v| v.is_object()).unwrap_or_else(verno_fuzz::pod);
    let policy = json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "fuzz"},
        "spec": {"validationFailureAction": "Enforce", "rules": [
            {"name": "annotate", "match": {"any": [{"resources": {"kinds": ["*"]}}]},
             "mutate": {"patchStrategicMerge": {"metadata": {"annotations": {"fuzz": text}}}}},
            {"name": "deny", "match": {"any": [{"resources": {"kinds": ["*"]}}]},
             "validate": {"message": text, "deny": {"conditions": {"any": [
                 {"key": text, "operator": "NotEquals", "value": "x"}]}}}}
        ]}
    });
    verno_fuzz::evaluate_one(&policy, &object);
});
