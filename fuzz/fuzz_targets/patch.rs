//! Strategic merge patch (with the built-in kinds' merge keys) and JSON patch, then the diff
//! the webhook answers with: `KIND \0 DOCUMENT-JSON \0 PATCH-JSON`. The diff must take the
//! document to the patched one (`properties::patch_round_trip`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use verno_engine::jsonpatch;
use verno_fuzz::properties::patch_round_trip;

fuzz_target!(|data: &[u8]| {
    let [kind, doc, patch] = verno_fuzz::parts::<3>(data);
    let (Ok(doc), Ok(patch)) =
        (serde_json::from_str::<serde_json::Value>(&doc), serde_json::from_str::<serde_json::Value>(&patch))
    else {
        return;
    };
    if let Ok(merged) = verno_engine::strategic_merge(&doc, &patch, &kind) {
        if let Err(why) = patch_round_trip(&doc, &merged) {
            panic!("strategic merge of {kind}: {why}");
        }
    }
    if let Ok(ops) = jsonpatch::parse_ops(&patch) {
        let mut patched = doc.clone();
        if jsonpatch::apply(&mut patched, &ops).is_ok() {
            if let Err(why) = patch_round_trip(&doc, &patched) {
                panic!("JSON patch: {why}");
            }
        }
    }
});
