//! The CLI's test-file loader: a `kyverno-test.yaml`, a values file or a user-info file.
//! `YAML`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = Path::new("kyverno-test.yaml");
    let Ok(docs) = verno_cli::load::parse_docs(text, file) else { return };
    for d in &docs {
        let _ = verno_cli::test_cmd::parse_test(&d.value, file);
        let _ = verno_cli::load::parse_values(&d.value, file);
        let _ = verno_cli::load::parse_user_info(&d.value, file);
    }
});
