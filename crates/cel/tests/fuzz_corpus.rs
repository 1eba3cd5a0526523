//! The `cel` fuzz target's checked-in corpus (inputs that reached new code in the CEL parser,
//! the crate's interpreter and Verno's libraries), each evaluated by the direct evaluator and
//! by the crate (`Expr::direct_disagreement`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and reads the corpus
use verno_cel::{Expr, Vars};

/// On a thread with a large stack: debug builds' frames are several times a release build's,
/// and the crate's parser recurses per nesting level (some inputs nest deeply).
#[test]
fn the_fuzz_corpus_gets_the_crates_answers() {
    let run = std::thread::Builder::new().stack_size(256 << 20).spawn(check_corpus).unwrap();
    if let Err(panic) = run.join() {
        std::panic::resume_unwind(panic);
    }
}

fn check_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/cel");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut checked = 0;
    for path in entries {
        let data = std::fs::read(&path).unwrap();
        let mut parts = data.splitn(2, |b| *b == 0).map(String::from_utf8_lossy);
        let (expr, json) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        let Ok(e) = Expr::compile(&expr) else { continue };
        let object = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
        let mut vars = Vars::default();
        vars.set("object", &object);
        vars.set_variable("v", &object);
        if let Some(why) = e.direct_disagreement(&vars) {
            panic!("{}: {why}", path.display());
        }
        checked += 1;
    }
    assert!(checked > 100, "only {checked} corpus inputs compiled");
}
