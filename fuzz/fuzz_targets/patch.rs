//! Strategic merge patch (with the built-in kinds' merge keys) and JSON patch, then the diff
//! the webhook answers with: `KIND \0 DOCUMENT-JSON \0 PATCH-JSON`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_engine::jsonpatch;

fuzz_target!(|data: &[u8]| {
    let [kind, doc, patch] = verno_fuzz::parts::<3>(data);
    let (Ok(doc), Ok(patch)) =
        (serde_json::from_str::<serde_json::Value>(&doc), serde_json::from_str::<serde_json::Value>(&patch))
    else {
        return;
    };
    if let Ok(merged) = verno_engine::strategic_merge(&doc, &patch, &kind) {
        let _ = jsonpatch::diff(&doc, &merged);
    }
    if let Ok(ops) = jsonpatch::parse_ops(&patch) {
        let mut patched = doc.clone();
        if jsonpatch::apply(&mut patched, &ops).is_ok() {
            let _ = jsonpatch::diff(&doc, &patched);
        }
    }
});
