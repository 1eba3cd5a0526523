//! The `patch` and `jmespath` fuzz targets' checked-in corpora through the properties those
//! targets assert (`fuzz/src/properties.rs`, included here so both run the same checks): the
//! webhook's diff takes a document to its patched form, and a JMESPath sub-expression's error
//! is the whole expression's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and reads the corpus
#[path = "../../../fuzz/src/properties.rs"]
mod properties;

use serde_json::Value;

/// Each corpus input's parts between NUL bytes, as text, as the fuzz targets split them.
fn corpus(target: &str, parts: usize) -> Vec<(std::path::PathBuf, Vec<String>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    entries
        .into_iter()
        .map(|path| {
            let data = std::fs::read(&path).unwrap();
            let mut split: Vec<String> =
                data.splitn(parts, |b| *b == 0).map(|p| String::from_utf8_lossy(p).into_owned()).collect();
            split.resize(parts, String::new());
            (path, split)
        })
        .collect()
}

/// On a thread with a large stack: debug builds' frames are several times a release build's
/// and the parsers recurse per nesting level (some inputs nest deeply).
fn on_big_stack(f: fn()) {
    let run = std::thread::Builder::new().stack_size(256 << 20).spawn(f).unwrap();
    if let Err(panic) = run.join() {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn the_patch_corpus_diffs_round_trip() {
    on_big_stack(|| {
        let mut checked = 0;
        for (path, p) in corpus("patch", 3) {
            let (Ok(doc), Ok(patch)) = (serde_json::from_str::<Value>(&p[1]), serde_json::from_str::<Value>(&p[2]))
            else {
                continue;
            };
            if let Ok(merged) = verno_engine::strategic_merge(&doc, &patch, &p[0]) {
                if let Err(why) = properties::patch_round_trip(&doc, &merged) {
                    panic!("{}: strategic merge: {why}", path.display());
                }
                checked += 1;
            }
            if let Ok(ops) = verno_engine::jsonpatch::parse_ops(&patch) {
                let mut patched = doc.clone();
                if verno_engine::jsonpatch::apply(&mut patched, &ops).is_ok() {
                    if let Err(why) = properties::patch_round_trip(&doc, &patched) {
                        panic!("{}: JSON patch: {why}", path.display());
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "only {checked} corpus inputs patched");
    });
}

#[test]
fn the_jmespath_corpus_fails_as_a_whole() {
    on_big_stack(|| {
        let mut failing = 0;
        for (path, p) in corpus("jmespath", 2) {
            let input = serde_json::from_str(&p[1]).unwrap_or(Value::Null);
            if let Err(why) = properties::jmespath_errors_propagate(&p[0], &input) {
                panic!("{}: {why}", path.display());
            }
            let failed = verno_jmespath::Expression::compile(&p[0]).is_ok_and(|e| {
                matches!(e.search(&input, &verno_jmespath::NoEnv), Err(e) if !matches!(e, verno_jmespath::RuntimeError::NotFound(_)))
            });
            failing += usize::from(failed);
        }
        assert!(failing > 20, "only {failing} corpus inputs fail: the property was hardly tried");
    });
}

/// The case the property is for: `parse_json` of YAML fails, and so does every form enclosing it.
#[test]
fn a_failed_parse_is_not_turned_into_the_fallback() {
    let input = serde_json::json!({"data": {"config": "debug: true"}});
    properties::jmespath_errors_propagate("parse_json(data.config).debug", &input).unwrap();
    assert!(
        verno_jmespath::Expression::compile("parse_json(data.config).debug || `false`")
            .unwrap()
            .search(&input, &verno_jmespath::NoEnv)
            .is_err()
    );
}
