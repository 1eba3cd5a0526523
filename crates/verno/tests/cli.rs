//! End-to-end tests of the `verno` binary on the project's own fixtures (`testdata/`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn verno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_verno")).args(args).output().unwrap_or_else(|e| Output {
        status: std::process::ExitStatus::default(),
        stdout: Vec::new(),
        stderr: e.to_string().into_bytes(),
    })
}

fn write(dir: &Path, name: &str, text: &str) {
    let _ = std::fs::write(dir.join(name), text);
}

#[test]
fn test_command_passes_the_projects_own_suites() {
    let out = verno(&["test", testdata().to_str().unwrap_or(".")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Test Summary: 77 tests passed and 0 tests failed"), "{stdout}");
    assert!(stdout.contains("│ ID │ POLICY"), "{stdout}");
}

#[test]
fn json_output_follows_the_conformance_contract() {
    let dir = testdata().join("validate/require-labels");
    let out = verno(&["test", dir.to_str().unwrap_or("."), "-o", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let rows = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[1]["resource"], "shop/unlabelled");
    assert_eq!(rows[1]["expected"], "fail");
    assert_eq!(rows[1]["actual"], "fail");
    assert_eq!(rows[1]["namespace"], "shop");
    assert_eq!(rows[3]["actual"], "fail", "autogen rule applies to the Deployment");
    assert_eq!(v["summary"], serde_json::json!({"pass": 3, "fail": 0, "skip": 1}));
}

#[test]
fn a_wrong_expectation_fails_with_exit_1_and_says_why() {
    let tmp = tempfile::tempdir().unwrap_or_else(|_| tempfile::TempDir::new_in(".").unwrap_or_else(|e| panic!("{e}")));
    let src = testdata().join("validate/require-labels");
    for f in ["policy.yaml", "resources.yaml"] {
        let _ = std::fs::copy(src.join(f), tmp.path().join(f));
    }
    write(
        tmp.path(),
        "kyverno-test.yaml",
        "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {name: t}\npolicies: [policy.yaml]\nresources: [resources.yaml]\nresults:\n- {policy: team-label, rule: check-team, kind: Pod, resources: [labelled], result: fail}\n",
    );
    let out = verno(&["test", tmp.path().to_str().unwrap_or("."), "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(v["results"][0]["pass"], false);
    assert_eq!(v["results"][0]["actual"], "pass");
    assert!(v["results"][0]["reason"].as_str().unwrap_or("").contains("want fail, got pass"));
}

#[test]
fn unknown_test_fields_are_rejected_with_their_path() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(
        tmp.path(),
        "kyverno-test.yaml",
        "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {name: t}\npolicies: []\nresults:\n- {policy: p, rule: r, resources: [x], result: pass, reslt: fail}\n",
    );
    let out = verno(&["test", tmp.path().to_str().unwrap_or(".")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field \"reslt\" at results[0]"), "{err}");
}

/// A test file could make `verno test` read any file on the machine (a
/// test file in an untrusted change naming `~/.kube/config`). Paths stay inside the directories
/// given, the current directory and their git checkouts; `../` inside those still works.
#[test]
fn a_test_file_cannot_read_outside_its_directories() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let suite = tmp.path().join("suite");
    let tests = suite.join(".kyverno-test");
    let outside = tmp.path().join("outside");
    for d in [&tests, &outside] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
    }
    let src = testdata().join("validate/require-labels");
    let _ = std::fs::copy(src.join("policy.yaml"), suite.join("policy.yaml"));
    let _ = std::fs::copy(src.join("resources.yaml"), outside.join("secret.yaml"));
    let _ = std::fs::copy(src.join("resources.yaml"), suite.join("resources.yaml"));
    let test = |resources: &str| {
        format!(
            "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {{name: t}}\npolicies: [../policy.yaml]\nresources: [{resources}]\nresults:\n- {{policy: team-label, rule: check-team, kind: Pod, resources: [labelled], result: pass}}\n"
        )
    };
    write(&tests, "kyverno-test.yaml", &test("../resources.yaml"));
    let out = verno(&["test", suite.to_str().unwrap_or(".")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    write(&tests, "kyverno-test.yaml", &test("../../outside/secret.yaml"));
    let out = verno(&["test", suite.to_str().unwrap_or(".")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("../../outside/secret.yaml: the path leads outside the test's directories"), "{err}");
    assert!(!err.contains("labelled"), "nothing of the file is shown: {err}");
}

#[test]
fn field_names_match_regardless_of_case_and_old_schema_is_rejected() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(
        tmp.path(),
        "kyverno-test.yaml",
        "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {name: t}\nPolicies: []\nResults: []\n",
    );
    assert_eq!(verno(&["test", tmp.path().to_str().unwrap_or(".")]).status.code(), Some(0));
    write(tmp.path(), "kyverno-test.yaml", "name: old\npolicies: []\nresults: []\n");
    let out = verno(&["test", tmp.path().to_str().unwrap_or(".")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("deprecated schema"));
}

#[test]
fn apply_prints_failures_and_kyverno_summary() {
    let dir = testdata().join("validate/require-labels");
    let out = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or(""),
        "--resource",
        dir.join("resources.yaml").to_str().unwrap_or(""),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    // Kyverno counts the autogen rules (its CLI prints 3 here).
    assert!(stdout.contains("Applying 3 policy rule(s) to 4 resource(s)..."), "{stdout}");
    assert!(stdout.contains("policy team-label -> resource shop/Pod/unlabelled failed:"), "{stdout}");
    assert!(stdout.contains("1 - check-team validation error: Every pod needs a team label. rule check-team failed at path /metadata/labels/"), "{stdout}");
    assert!(stdout.contains("1 - autogen-check-team validation error: Every pod needs a team label. rule autogen-check-team failed at path /spec/template/metadata/labels/team/"), "{stdout}");
    assert!(stdout.contains("pass: 1, fail: 2, warn: 0, error: 0, skip: 0 "), "{stdout}");
}

#[test]
fn apply_audit_warn_turns_audit_failures_into_warnings() {
    let dir = testdata().join("validate/foreach-images");
    let p = dir.join("policy.yaml");
    let r = dir.join("resources.yaml");
    let out = verno(&[
        "apply",
        p.to_str().unwrap_or(""),
        "-r",
        r.to_str().unwrap_or(""),
        "--audit-warn",
        "--warn-exit-code",
        "3",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pass: 1, fail: 0, warn: 2, error: 0, skip: 0 "), "{stdout}");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_broken_policy_is_an_error_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(
        tmp.path(),
        "p.yaml",
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {name: bad}\nspec:\n  rules:\n  - name: r\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    validate:\n      deny:\n        conditions:\n          any:\n          - key: \"{{ nope(request.object) }}\"\n            operator: Equals\n            value: x\n",
    );
    write(tmp.path(), "r.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n");
    let out = verno(&[
        "apply",
        tmp.path().join("p.yaml").to_str().unwrap_or(""),
        "-r",
        tmp.path().join("r.yaml").to_str().unwrap_or(""),
    ]);
    // Skipped as Kyverno skips a policy its validation refuses, and counted as an error
    // (Kyverno finds this one only when evaluating: an error result, the same count).
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("spec.rules[0].validate.deny.conditions.any[0].key"), "{err}");
    assert!(err.contains("unknown function: nope()"), "{err}");
    assert!(err.contains("pass: 0, fail: 0, warn: 0, error: 1, skip: 0"), "{err}");
}

#[test]
fn jp_query_and_function_listing() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(tmp.path(), "in.yaml", "a: {b: [1, 2]}\n");
    let out = verno(&["jp", "query", "-i", tmp.path().join("in.yaml").to_str().unwrap_or(""), "sum(a.b)"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "# sum(a.b)\n3\n");
    let out = verno(&["jp", "function"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert_eq!(s.matches("Name: ").count(), 51, "{s}");
    assert!(s.contains("Name: semver_compare"));
}

/// Copies a fixture directory so a test can break one of its files.
fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let _ = std::fs::copy(e.path(), to.join(e.file_name()));
    }
}

#[test]
fn a_patched_resource_that_differs_fails_the_row_and_says_where() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&testdata().join("mutate/inject-sidecar"), tmp.path());
    let text = std::fs::read_to_string(tmp.path().join("patched-web.yaml")).unwrap_or_default();
    write(tmp.path(), "patched-web.yaml", &text.replace("logging: enabled", "logging: disabled"));
    let out = verno(&["test", tmp.path().to_str().unwrap_or("."), "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let row = &v["results"][0];
    assert_eq!(row["actual"], "fail");
    assert_eq!(row["pass"], false);
    let reason = row["reason"].as_str().unwrap_or("");
    assert!(reason.contains("/metadata/labels/logging"), "{reason}");
}

#[test]
fn apply_prints_the_mutated_resource_and_writes_it_to_a_directory() {
    let dir = testdata().join("mutate/inject-sidecar");
    let out = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or("."),
        "-r",
        dir.join("resources.yaml").to_str().unwrap_or("."),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("policy inject-logging applied to shop/Pod/web:"), "{stdout}");
    assert!(stdout.contains("log-shipper"), "{stdout}");
    assert!(stdout.contains("Mutation has been applied successfully."), "{stdout}");
    assert!(stdout.contains("pass: 2, fail: 0, warn: 0, error: 0, skip: 1"), "{stdout}");
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let target = format!("{}/", tmp.path().join("out").display());
    let out = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or("."),
        "-r",
        dir.join("resources.yaml").to_str().unwrap_or("."),
        "-o",
        &target,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let written = std::fs::read_to_string(tmp.path().join("out/shop-pod-web.yaml")).unwrap_or_default();
    assert!(written.contains("fluent/fluent-bit:3.0"), "{written}");
}

#[test]
fn a_broken_json6902_patch_is_a_load_error_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(
        tmp.path(),
        "policy.yaml",
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata:\n  name: bad\nspec:\n  rules:\n  - name: r\n    match:\n      any:\n      - resources:\n          kinds: [Pod]\n    mutate:\n      patchesJson6902: |-\n        - op: add\n          path: metadata/labels/x\n          value: y\n",
    );
    write(tmp.path(), "pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: []\n");
    let out = verno(&[
        "apply",
        tmp.path().join("policy.yaml").to_str().unwrap_or("."),
        "-r",
        tmp.path().join("pod.yaml").to_str().unwrap_or("."),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    // Kyverno's words (its CLI prints the same line).
    assert!(
        stdout.contains("1. bad: path must begin with a forward slash: spec.rules[0]: metadata/labels/x\n"),
        "{stdout}"
    );
}

/// A YAML error echoed the lines around it, so a test file naming any file
/// (`/etc/shadow`, a token) printed its contents; the error now says only where.
#[test]
fn yaml_errors_name_the_place_not_the_contents() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "secret.txt", "root:s3cr3t-hash:19000:0:99999:7:::\nuser: [unclosed\n");
    write(
        dir.path(),
        "kyverno-test.yaml",
        "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata:\n  name: t\npolicies: [secret.txt]\nresources: [secret.txt]\nresults: []\n",
    );
    let out = verno(&["test", dir.path().to_str().unwrap()]);
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("secret.txt: invalid YAML: unclosed bracket '[' at line 2, column 7"), "{all}");
    assert!(!all.contains("s3cr3t"), "{all}");
}

/// Found by the Kyverno oracle (issue 50): a policy Kyverno's policy validation refuses is
/// skipped, listed with Kyverno's reason and counted as an error; the others are applied.
#[test]
fn apply_skips_a_policy_that_fails_validation_as_kyverno_does() {
    let dir = testdata().join("validate/require-labels");
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "bad.yaml",
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {name: bad-operation}\nspec:\n  rules:\n  - name: r\n    match: {any: [{resources: {kinds: [ConfigMap]}}]}\n    validate:\n      deny:\n        conditions:\n          any:\n          - {key: '{{ request.operation }}', operator: Equals, value: '*'}\n",
    );
    let out = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or(""),
        tmp.path().join("bad.yaml").to_str().unwrap_or(""),
        "--resource",
        dir.join("resources.yaml").to_str().unwrap_or(""),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("Policies Skipped:\n1. bad-operation: path: spec.rules[0].validate.deny.conditions.any[0].value: *: unknown value '*' found under the 'value' field. Only the following values are allowed: [CREATE, UPDATE, DELETE, CONNECT]\n"),
        "{stdout}"
    );
    assert!(stdout.contains("policy team-label -> resource shop/Pod/unlabelled failed:"), "{stdout}");
    assert!(stdout.contains("pass: 1, fail: 2, warn: 0, error: 1, skip: 0 "), "{stdout}");
}

#[test]
fn apply_policy_report_prints_the_controllers_results_in_kyvernos_cli_reports() {
    let dir = testdata().join("validate/require-labels");
    let out = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or(""),
        "--resource",
        dir.join("resources.yaml").to_str().unwrap_or(""),
        "--policy-report",
        "--output",
        "json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["apiVersion"], "openreports.io/v1alpha1", "{stdout}");
    assert_eq!(report["kind"], "ClusterReport");
    assert_eq!(report["metadata"]["name"], "merged");
    assert_eq!(report["summary"], serde_json::json!({"pass": 1, "fail": 2, "warn": 0, "error": 0, "skip": 0}));
    let failed = report["results"].as_array().unwrap().iter().find(|r| r["result"] == "fail").unwrap();
    // The same fields as the controller's reports, plus the resource the result is about.
    assert_eq!(failed["source"], "kyverno");
    assert_eq!(failed["policy"], "team-label");
    assert_eq!(failed["scored"], true);
    assert!(failed["timestamp"]["seconds"].is_i64());
    assert!(failed["resources"][0]["kind"].is_string(), "{failed}");
    // Kyverno's spelling of the format, `--output-format json`, prints the same report.
    let kyverno_spelling = verno(&[
        "apply",
        dir.join("policy.yaml").to_str().unwrap_or(""),
        "--resource",
        dir.join("resources.yaml").to_str().unwrap_or(""),
        "-p",
        "--output-format",
        "json",
    ]);
    let again: serde_json::Value = serde_json::from_slice(&kyverno_spelling.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&kyverno_spelling.stdout)));
    assert_eq!(again["summary"], report["summary"]);
    assert_eq!(again["results"].as_array().map(Vec::len), report["results"].as_array().map(Vec::len));
}

#[test]
fn cleanup_dry_run_lists_what_a_deleting_policy_and_the_ttl_label_would_delete() {
    let dir = testdata().join("cleanup/expired-jobs");
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "ttl.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: old, namespace: ci, creationTimestamp: '2020-01-01T00:00:00Z', labels: {cleanup.kyverno.io/ttl: 2d}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: later, namespace: ci, labels: {cleanup.kyverno.io/ttl: '2999-01-01'}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: odd, namespace: ci, labels: {cleanup.kyverno.io/ttl: someday}}\n",
    );
    let policy = dir.join("policy.yaml");
    let resources = dir.join("resources.yaml");
    let ttl = tmp.path().join("ttl.yaml");
    let out = verno(&[
        "cleanup",
        "--dry-run",
        "-p",
        policy.to_str().unwrap(),
        "-r",
        resources.to_str().unwrap(),
        "-r",
        ttl.to_str().unwrap(),
        "--ttl",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("DeletingPolicy expired-jobs (schedule \"0 */6 * * *\", next run "), "{stdout}");
    assert!(stdout.contains("  would delete Job ci/done\n"), "{stdout}");
    for kept in ["running", "pinned", "permanent"] {
        assert!(!stdout.contains(&format!("Job ci/{kept}")), "{stdout}");
    }
    assert!(stdout.contains("  1 of 7 resource(s) would be deleted"), "{stdout}");
    assert!(
        stdout.contains("  ConfigMap ci/old (cleanup.kyverno.io/ttl=2d, due 2020-01-03T00:00:00+00:00)"),
        "{stdout}"
    );
    assert!(!stdout.contains("ConfigMap ci/later"), "{stdout}");
    assert!(
        stdout.contains("  ConfigMap ci/odd: never deleted: the value of cleanup.kyverno.io/ttl, \"someday\""),
        "{stdout}"
    );
    // Without --dry-run nothing runs.
    let out = verno(&["cleanup", "-p", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only previews (--dry-run)"));
}

/// Resource names and namespaces cannot make `apply -o DIR/` write outside
/// DIR (`namespace: ../evil`, `name: x/../../pwned`).
#[test]
fn apply_output_stays_in_its_directory_whatever_the_names() {
    let dir = testdata().join("mutate/inject-sidecar");
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let resources = tmp.path().join("hostile.yaml");
    std::fs::write(
        &resources,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x/../../pwned\n  namespace: ../evil\n  annotations: {logging.example.com/inject: 'true'}\nspec:\n  containers:\n  - name: c\n    image: nginx\n",
    )
    .unwrap();
    let out_dir = tmp.path().join("a/b/out");
    let target = format!("{}/", out_dir.display());
    let out =
        verno(&["apply", dir.join("policy.yaml").to_str().unwrap(), "-r", resources.to_str().unwrap(), "-o", &target]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let written: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    // Nothing anywhere else under the temporary folder but the input and the output folder.
    let mut found = Vec::new();
    let mut stack = vec![tmp.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push(p.strip_prefix(tmp.path()).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    assert_eq!(found, ["a/b/out/".to_string() + &written[0], "hostile.yaml".to_string()]);
}

/// `verno test DIR` does not descend into linked folders below DIR (a link
/// to `/` walked the filesystem), and says nothing of them; a linked test file is still read.
#[cfg(unix)]
#[test]
fn test_discovery_does_not_follow_folder_links() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let suite = tmp.path().join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    let src = testdata().join("validate/require-labels");
    for f in ["policy.yaml", "resources.yaml", "kyverno-test.yaml"] {
        std::fs::copy(src.join(f), suite.join(f)).unwrap();
    }
    // A loop, and a link to the root of the filesystem.
    std::os::unix::fs::symlink(tmp.path(), suite.join("loop")).unwrap();
    std::os::unix::fs::symlink("/", suite.join("root")).unwrap();
    let out = verno(&["test", tmp.path().to_str().unwrap(), "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(v["results"].as_array().map(Vec::len), Some(4), "one suite, found once");
}

/// Found by the differential run (issue 50): `verno apply … | head` panicked with "failed
/// printing to stdout: Broken pipe" and a backtrace; it now stops quietly with SIGPIPE's status.
#[test]
fn apply_stops_quietly_when_its_reader_goes_away() {
    let dir = testdata().join("validate/require-labels");
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pods: String = (0..1000)
        .map(|i| format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{i}, namespace: shop}}\nspec: {{containers: [{{name: c, image: nginx}}]}}\n"))
        .collect();
    write(tmp.path(), "pods.yaml", &pods);
    let mut child = Command::new(env!("CARGO_BIN_EXE_verno"))
        .args(["apply", dir.join("policy.yaml").to_str().unwrap_or(""), "-r"])
        .arg(tmp.path().join("pods.yaml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // The reader goes away before the output is written (more than a pipe's buffer).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}

/// Found by the Kyverno oracle (issue 50), the messages checked against Kyverno's CLI: a rule
/// message whose variable cannot be substituted is dropped from a deny rule's failure (only the
/// conditions' own messages are left) and replaced by Kyverno's words for an anyPattern's.
#[test]
fn an_unsubstitutable_message_is_worded_as_kyverno() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(
        tmp.path(),
        "policy.yaml",
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {name: c}\nspec:\n  rules:\n  - name: d\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    validate:\n      message: 'bad {{ request.object.metadata.labels.x }}'\n      deny: {conditions: {any: [{key: a, operator: Equals, value: a, message: cm}]}}\n  - name: p\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    validate:\n      message: 'bad {{ request.object.metadata.labels.x }}'\n      anyPattern: [{metadata: {labels: {app: zzz}}}, {spec: {nope: x}}]\n  - name: s\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    validate:\n      message: not allowed\n      anyPattern: [{spec: {containers: [{(name): x, image: y}]}}, {metadata: {labels: {app: zzz}}}]\n",
    );
    write(
        tmp.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a, labels: {env: web}}\nspec: {containers: [{name: c, image: nginx}]}\n",
    );
    let out = verno(&[
        "apply",
        tmp.path().join("policy.yaml").to_str().unwrap_or(""),
        "-r",
        tmp.path().join("pod.yaml").to_str().unwrap_or(""),
        "-p",
        "--output-format",
        "json",
    ]);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let message = |rule: &str| {
        report["results"].as_array().into_iter().flatten().find(|r| r["rule"] == rule).map(|r| r["message"].clone())
    };
    assert_eq!(message("d"), Some(serde_json::json!("cm")), "{report}");
    // A skipped alternative is left out of a failing anyPattern's message.
    assert_eq!(
        message("s"),
        Some(serde_json::json!("validation error: not allowed. rule s[1] failed at path /metadata/labels/app/")),
        "{report}"
    );
    assert_eq!(
        message("p"),
        Some(serde_json::json!(
            "validation error: variables substitution error in rule p execution error: rule p[0] failed at path /metadata/labels/app/ rule p[1] failed at path /spec/nope/"
        )),
        "{report}"
    );
}

/// `apply -o FILE` writes what Kyverno's CLI writes: for every resource, once per policy with
/// mutate rules, the resource as mutated so far — changed or not, matched or not — so a
/// pipeline that applies the file gets every resource.
#[test]
fn apply_output_file_holds_every_resource_once_per_mutating_policy() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let rule = |name: &str, label: &str| {
        format!(
            "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {{name: {name}}}\nspec:\n  rules:\n  - name: r\n    match: {{any: [{{resources: {{kinds: [Pod]}}}}]}}\n    mutate:\n      patchStrategicMerge:\n        metadata:\n          labels:\n            {label}\n"
        )
    };
    write(tmp.path(), "a.yaml", &rule("add-team", "+(team): core"));
    write(tmp.path(), "b.yaml", &rule("add-tier", "tier: web"));
    write(
        tmp.path(),
        "validate.yaml",
        "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {name: v}\nspec:\n  rules:\n  - name: r\n    match: {any: [{resources: {kinds: [Pod]}}]}\n    validate: {message: m, pattern: {metadata: {name: '?*'}}}\n",
    );
    write(
        tmp.path(),
        "r.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: one, namespace: default, labels: {team: x}}\nspec: {containers: [{name: c, image: nginx}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: two, namespace: default}\n",
    );
    let p = |f: &str| tmp.path().join(f).to_string_lossy().into_owned();
    let out =
        verno(&["apply", &p("a.yaml"), &p("validate.yaml"), &p("b.yaml"), "-r", &p("r.yaml"), "-o", &p("out.yaml")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(tmp.path().join("out.yaml")).unwrap_or_default();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_default();
    let seen: Vec<(String, Value)> = docs
        .iter()
        .map(|d| (d["metadata"]["name"].as_str().unwrap_or("").to_string(), d["metadata"]["labels"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            // The Pod after each mutating policy: its own team kept, then tier added.
            ("one".to_string(), serde_json::json!({"team": "x"})),
            ("one".to_string(), serde_json::json!({"team": "x", "tier": "web"})),
            // The ConfigMap, matched by neither, written as it was.
            ("two".to_string(), Value::Null),
            ("two".to_string(), Value::Null),
        ],
        "{text}"
    );
}
