//! Kyverno's JMESPath dialect, pinned on the behaviour Kyverno documents.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking and may read files and clocks

use serde_json::{Value, json};
use verno_jmespath::search;

fn data() -> Value {
    json!({"request": {"object": {"metadata": {"name": "web", "labels": {"app": "nginx", "app.kubernetes.io/name": "x"}},
      "spec": {"replicas": 3, "containers": [{"name": "a", "image": "nginx:1"}, {"name": "b", "image": "redis"}]}}}})
}

fn ok(expr: &str) -> Value {
    match search(expr, &data()) {
        Ok(v) => v,
        Err(e) => Value::String(format!("ERROR: {e}")),
    }
}

#[test]
fn missing_key_in_plain_path_is_an_error() {
    assert_eq!(ok("request.object.metadata.labels.missing"), json!("ERROR: Unknown key \"missing\" in path"));
    assert_eq!(ok("request.object.metadata.missing.deeper"), json!("ERROR: Unknown key \"missing\" in path"));
}

#[test]
fn missing_key_is_null_inside_or_functions_comparisons_and_multiselect() {
    assert_eq!(ok("request.object.metadata.labels.missing || 'none'"), json!("none"));
    assert_eq!(ok("to_string(request.object.metadata.labels.missing)"), json!("null"));
    assert_eq!(ok("request.object.metadata.labels.missing == null"), json!(true));
    assert_eq!(ok("[request.object.metadata.labels.missing]"), json!([null]));
    assert_eq!(ok("request.object.spec.[initContainers, containers][][].name"), json!(["a", "b"]));
}

#[test]
fn field_on_non_object_is_null() {
    assert_eq!(ok("request.object.metadata.name.foo"), Value::Null);
}

#[test]
fn quoted_identifiers_and_projections() {
    assert_eq!(ok("request.object.metadata.labels.\"app.kubernetes.io/name\""), json!("x"));
    assert_eq!(ok("request.object.spec.containers[*].name"), json!(["a", "b"]));
    assert_eq!(ok("request.object.spec.containers[?image=='redis'].name | [0]"), json!("b"));
    assert_eq!(ok("length(request.object.spec.containers)"), json!(2));
    assert_eq!(ok("request.object.spec.containers[-1].name"), json!("b"));
    assert_eq!(ok("request.object.spec.containers[::-1].name"), json!(["b", "a"]));
    assert_eq!(ok("keys(request.object.metadata.labels)"), json!(["app", "app.kubernetes.io/name"]));
}

#[test]
fn arithmetic_keeps_operand_kinds() {
    assert_eq!(ok("add(`1`, `2`)"), json!(3));
    assert_eq!(ok("add('1h','30s')"), json!("1h0m30s"));
    assert_eq!(ok("add('1h','30m')"), json!("ERROR: JMESPath function 'add': Types mismatch"));
    assert_eq!(ok("subtract('2Gi','1Gi')"), json!("1Gi"));
    assert_eq!(ok("multiply('1Gi', `2`)"), json!("2Gi"));
    assert_eq!(ok("divide('10Gi','1Gi')"), json!(10));
    assert_eq!(ok("modulo(`7`, `3`)"), json!(1));
    assert_eq!(ok("sum(['1Gi','1Gi'])"), json!("2Gi"));
    assert_eq!(ok("sum(`[]`)"), json!("ERROR: JMESPath function 'sum': at least one element in the array is required"));
    assert_eq!(ok("divide(`1`, `0`)"), json!("ERROR: JMESPath function 'divide': Zero divisor passed"));
    assert_eq!(ok("round(`1.256`, `2`)"), json!(1.26));
}

#[test]
fn arithmetic_operators_are_not_in_the_dialect() {
    assert!(search("1 + 2", &data()).is_err());
    assert!(search("let $x = 1 in $x", &data()).is_err());
}

#[test]
fn unknown_function_is_a_compile_error() {
    let e = search("nope(@)", &data()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("unknown function: nope()"), "{e}");
}

#[test]
fn kyverno_string_functions() {
    assert_eq!(ok("split('a,b', ',')"), json!(["a", "b"]));
    assert_eq!(ok("to_upper('ab')"), json!("AB"));
    assert_eq!(ok("regex_match('^nginx', 'nginx:1')"), json!(true));
    // Go reads a brace that starts no repetition as a literal; numbers are float64 printed at
    // float32 precision (found by the oracle).
    assert_eq!(ok("regex_match('{\"a\"', '{\"a\": [1, 2]}')"), json!(true));
    assert_eq!(ok("regex_match('^a{2}$', 'aa')"), json!(true));
    assert_eq!(ok("regex_match('[{]x{', '{x{')"), json!(true));
    assert_eq!(ok("regex_replace_all_literal('x', `123456789`, 'y')"), json!("123456790"));
    assert_eq!(ok("regex_replace_all('([a-z]+)-(\\d+)', 'web-01', '$2')"), json!("01"));
    assert_eq!(ok("pattern_match('ngi*', 'nginx')"), json!(true));
    assert_eq!(ok("truncate('abcdef', `3`)"), json!("abc"));
    assert_eq!(ok("base64_decode(base64_encode('hi'))"), json!("hi"));
    assert_eq!(ok("semver_compare('1.26.3', '>1.25.0')"), json!(true));
    // As Kyverno: the default registry is added, but not Docker's `library/`.
    assert_eq!(ok("image_normalize('nginx')"), json!("docker.io/nginx:latest"));
    assert_eq!(ok("image_normalize('library/nginx:1.2')"), json!("docker.io/library/nginx:1.2"));
    assert_eq!(ok("image_normalize('index.docker.io/a/b')"), json!("index.docker.io/a/b:latest"));
    assert_eq!(ok("image_normalize('localhost:5000/x')"), json!("localhost:5000/x:latest"));
    // A tag beside a digest is dropped, as Kyverno prints its image infos.
    let with_tag = format!("image_normalize('ghcr.io/a/b:v1@sha256:{}')", "ab".repeat(32));
    assert_eq!(ok(&with_tag), json!(format!("ghcr.io/a/b@sha256:{}", "ab".repeat(32))));
    // Kyverno's words for what the grammar refuses.
    assert_eq!(
        ok("image_normalize('Nginx')"),
        json!(
            "ERROR: JMESPath function 'image_normalize': bad image: docker.io/Nginx, defaultRegistry: docker.io, enableDefaultRegistryMutation: true: repository name must be lowercase"
        )
    );
    for (bad, why) in [
        ("''", "invalid reference format"),
        ("'>=1.20.0'", "invalid reference format"),
        ("'naïve'", "invalid reference format"),
    ] {
        let got = ok(&format!("image_normalize({bad})"));
        assert!(got.as_str().is_some_and(|s| s.ends_with(why)), "{bad}: {got}");
    }
    let digest = "sha256:".to_string() + &"ab".repeat(32);
    assert_eq!(ok(&format!("image_normalize('ghcr.io/a/b@{digest}')")), json!(format!("ghcr.io/a/b@{digest}")));
    // A reference the grammar refuses is an error, not a value.
    for bad in ["a@sha256:zz", "a@sha256:abc", "a@md5:00112233445566778899aabbccddeeff", "a:-tag", "a:t@g"] {
        let got = ok(&format!("image_normalize('{bad}')"));
        assert!(
            got.as_str().is_some_and(|s| s.starts_with("ERROR: JMESPath function 'image_normalize'")),
            "{bad}: {got}"
        );
    }
    assert_eq!(ok("items(`{\"a\":1}`, 'k', 'v')"), json!([{"k": "a", "v": 1}]));
    assert_eq!(ok("lookup(`{\"a\":1}`, 'b')"), Value::Null);
    assert_eq!(ok("sha256('a')"), json!("ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"));
    assert_eq!(ok("parse_yaml('a: 0644')"), json!({"a": 420}));
    assert_eq!(ok("time_diff('2024-01-01T00:00:00Z', '2024-01-01T01:00:30Z')"), json!("1h0m30s"));
    assert_eq!(ok("time_add('2024-01-01T00:00:00Z', '90m')"), json!("2024-01-01T01:30:00Z"));
    assert_eq!(ok("time_to_cron('2024-01-02T03:04:00Z')"), json!("4 3 2 1 2"));
    // In the time's own offset, not UTC.
    assert_eq!(ok("time_to_cron('2026-01-01T00:00:00+02:00')"), json!("0 0 1 1 4"));
    // Go truncates from its zero time (a Monday), not the Unix epoch (a Thursday): weeks start
    // on Mondays; the offset is kept, the instant is what is truncated.
    assert_eq!(ok("time_truncate('2024-01-03T12:00:00Z', '168h')"), json!("2024-01-01T00:00:00Z"));
    assert_eq!(ok("time_truncate('2024-01-03T12:00:00+02:00', '168h')"), json!("2024-01-01T02:00:00+02:00"));
    assert_eq!(ok("time_truncate('2024-01-03T12:34:56Z', '1h')"), json!("2024-01-03T12:00:00Z"));
    assert_eq!(ok("to_boolean('TruE')"), json!(true));
}

#[test]
fn argument_types_are_checked_with_kyverno_messages() {
    assert_eq!(ok("to_upper(`1`)"), json!("ERROR: JMESPath function 'to_upper': argument #1 is not of type string"));
}

struct Seeded(u64);
impl verno_jmespath::Env for Seeded {
    fn random_seed(&self) -> Option<u64> {
        Some(self.0)
    }
}

#[test]
fn random_matches_its_pattern_and_draws_from_the_environment_seed() {
    let e = verno_jmespath::Expression::compile("random('[a-z]{5}')").unwrap();
    let draw = |seed| e.search(&Value::Null, &Seeded(seed)).unwrap().into_owned();
    let v = draw(7);
    let s = v.as_str().unwrap_or_default();
    assert_eq!(s.len(), 5);
    assert!(s.chars().all(|c| c.is_ascii_lowercase()));
    assert_eq!(draw(7), v, "the same seed draws the same string");
    assert_ne!((1..20).map(|s| draw(s).to_string()).collect::<std::collections::BTreeSet<_>>().len(), 1);
    // No randomness offered: an error, not a fixed string.
    assert_eq!(
        ok("random('[a-z]{5}')"),
        json!("ERROR: JMESPath function 'random': random values are not available here")
    );
}

#[test]
fn missing_key_before_a_flatten_is_null_not_an_error() {
    // Regression: `element.resourceNames[]` on an element without the key must not error.
    assert_eq!(ok("request.object.spec.missing[]"), Value::Null);
    assert_eq!(ok("request.object.spec.missing[*].name"), Value::Null);
    assert_eq!(ok("request.object.spec.missing[] || `[]`"), json!([]));
}

#[test]
fn delete_reading_renames_the_path_on_the_tree_not_in_strings() {
    let rename = |src: &str| {
        verno_jmespath::Expression::compile(src)
            .unwrap()
            .with_root_field_renamed("request", "object", "oldObject")
            .map(|e| e.ast().sexpr())
    };
    let parsed = |src: &str| verno_jmespath::Expression::compile(src).unwrap().ast().sexpr();
    assert_eq!(rename("request.object.metadata.name"), Some(parsed("request.oldObject.metadata.name")));
    assert_eq!(
        rename("request.object.spec.containers[?name == 'request.object'].image | [0]"),
        Some(parsed("request.oldObject.spec.containers[?name == 'request.object'].image | [0]"))
    );
    assert_eq!(
        rename("length(request.object.spec.containers)"),
        Some(parsed("length(request.oldObject.spec.containers)"))
    );
    // Not a read of the root `request.object`: nothing to rename.
    assert_eq!(rename("foo.request.object"), None);
    assert_eq!(rename("'request.object'"), None);
    assert_eq!(rename("request.operation"), None);
}

/// A long chain compiled, then overflowed the stack on every evaluation (and
/// when the tree was dropped). The chain's length is its depth; it is refused at compile time.
#[test]
fn long_operator_chains_are_refused_not_a_stack_overflow() {
    let chains = [
        format!("request{}", ".a".repeat(6000)),
        vec!["a"; 6000].join(" | "),
        vec!["a"; 6000].join(" || "),
        vec!["a"; 6000].join(" && "),
        format!("a{}", "[0]".repeat(6000)),
        format!("a{}", "[]".repeat(6000)),
        format!("a{}", "[*].b".repeat(3000)),
        format!("{}a", "!".repeat(6000)),
    ];
    for src in &chains {
        let err = verno_jmespath::Expression::compile(src).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("nested too deeply"), "{}…: {err}", &src[..20]);
    }
    // Real policies stay far below the limit.
    let ok = format!("request{}", ".a".repeat(100));
    let e = verno_jmespath::Expression::compile(&ok).unwrap();
    assert!(e.search(&data(), &verno_jmespath::NoEnv).is_err(), "request.a is not in the data");
}

/// `modulo(-2^63, -1)` overflowed and aborted the process; Go's `%` gives 0.
#[test]
fn modulo_of_the_smallest_integer_by_minus_one_is_zero_not_a_panic() {
    assert_eq!(ok("modulo(`-9223372036854775808`, `-1`)"), json!(0));
    assert_eq!(ok("modulo(`7`, `-2`)"), json!(1));
}

/// `random` with a huge repetition and nested string functions ran out of
/// memory; their results are bounded.
#[test]
fn function_outputs_are_bounded() {
    let e = verno_jmespath::Expression::compile("random('[a-z]{100000000}')").unwrap();
    let err = e.search(&Value::Null, &Seeded(1)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("longer than 4096 bytes"), "{err}");
    let grow = |s: &str| format!("replace_all({s}, 'a', 'aaaaaaaaaa')");
    let nested = |levels: usize| {
        let mut src = format!("'{}'", "a".repeat(200));
        for _ in 0..levels {
            src = grow(&src);
        }
        verno_jmespath::Expression::compile(&src)
            .unwrap()
            .search(&Value::Null, &verno_jmespath::NoEnv)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // 200 × 10⁴ bytes: refused where it is made.
    assert!(nested(4).contains("strings over 1048576 bytes are refused"), "{}", nested(4));
    // One level more: the refused value never reaches the outer call.
    assert!(nested(5).contains("replace_all"), "{}", nested(5));
    // Ordinary sizes are untouched.
    assert_eq!(ok("length(replace_all('abc', 'b', 'bbbb'))"), json!(6));
}

/// A multiselect fan-out (`[@,@]` piped into itself) doubled the data per
/// pipe until memory ran out; it stops at the work budget with an error no operator hides.
#[test]
fn multiselect_fan_out_stops_at_the_work_budget() {
    let big = json!({"spec": {"containers": (0..200).map(|i| json!({"name": format!("c{i}"), "image": "x"})).collect::<Vec<_>>()}});
    for src in [vec!["[@, @]"; 40].join(" | "), format!("{} || `1`", vec!["{a: @, b: @}"; 40].join(" | "))] {
        let e = verno_jmespath::Expression::compile(&src).unwrap();
        let err = e.search(&big, &verno_jmespath::NoEnv).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("too much work"), "{}…: {err}", &src[..20]);
    }
    // Ordinary fan-out is far below the budget.
    let e = verno_jmespath::Expression::compile("[spec.containers, spec.containers][].name | length(@)").unwrap();
    assert_eq!(e.search(&big, &verno_jmespath::NoEnv).unwrap().into_owned(), json!(400));
}

struct Cancelled;
impl verno_jmespath::Env for Cancelled {
    fn cancelled(&self) -> bool {
        true
    }
}

/// The work of an evaluation whose caller gave up (its deadline passed) stops
/// at the next check instead of running to its end.
#[test]
fn a_cancelled_evaluation_stops_with_an_error() {
    let big = json!((0..100_000).collect::<Vec<_>>());
    let e = verno_jmespath::Expression::compile("[*].to_string(@) | length(@)").unwrap();
    assert_eq!(e.search(&big, &verno_jmespath::NoEnv).unwrap().into_owned(), json!(100_000));
    let err = e.search(&big, &Cancelled).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("cancelled"), "{err}");
    // A short evaluation finishes before the first check.
    let small = verno_jmespath::Expression::compile("length(@)").unwrap();
    assert_eq!(small.search(&json!([1, 2]), &Cancelled).unwrap().into_owned(), json!(2));
}

mod community {
    use serde_json::{Value, json};
    use verno_jmespath::{Dialect, Env, Expression, NoEnv};

    struct Vars;
    impl Env for Vars {
        fn variable(&self, name: &str) -> Option<Value> {
            (name == "stderr").then(|| json!("  denied the request\n"))
        }
    }

    fn eval(src: &str, data: &Value) -> Result<Value, String> {
        let e = Expression::compile_in(src, Dialect::Community).map_err(|e| e.to_string())?;
        e.search(data, &Vars).map(|v| v.into_owned()).map_err(|e| e.to_string())
    }

    #[test]
    fn variables_missing_keys_and_trim_space_only_in_the_community_dialect() {
        assert_eq!(eval("contains($stderr, 'denied')", &json!({})), Ok(json!(true)));
        assert_eq!(eval("trim_space($stderr)", &json!({})), Ok(json!("denied the request")));
        assert_eq!(eval("a.b", &json!({"x": 1})), Ok(Value::Null));
        assert!(eval("$nothing", &json!({})).unwrap_err().contains("variable not defined: $nothing"));
        assert!(eval("$", &json!({})).is_err());
        // Kyverno's dialect: `$` is not a token, trim_space is unknown, a missing key errs.
        assert!(Expression::compile("$stderr").is_err());
        assert!(Expression::compile("trim_space('a')").is_err());
        let e = Expression::compile("a.b").unwrap();
        assert!(e.search(&json!({"x": 1}), &NoEnv).is_err());
    }
}

/// An error inside `||`, a function argument, a multiselect, a comparison,
/// a projection or a pipe is the whole expression's error, as go-jmespath (Kyverno's fork)
/// has it; only a missing key reads as null there. Before, `parse_json('x').a || 'fallback'`
/// gave `"fallback"`, so a deny rule with a fallback admitted what Kyverno refuses.
#[test]
fn an_error_in_a_sub_expression_is_an_error_of_the_whole() {
    for expr in [
        "parse_json('x: y').debug || `false`",
        "[parse_json('x: y')]",
        "{a: parse_json('x: y')}",
        "to_string(parse_json('x: y'))",
        "parse_json('x: y') == `null`",
        "!parse_json('x: y')",
        "request.object.spec.containers[].parse_json(name)",
        "request.object.spec.containers[?parse_json(name)].name",
        "`\"{}\"` | parse_json('x: y')",
        "'a' && parse_json('x: y')",
        "parse_json('x: y') && 'a'",
    ] {
        let got = ok(expr);
        assert!(got.as_str().is_some_and(|s| s.starts_with("ERROR: ")), "{expr}: {got}");
    }
    // A missing key still reads as null inside them (and as go-jmespath's `&&` has it, its
    // right side's missing key is the whole's).
    assert_eq!(ok("request.object.missing || 'fallback'"), json!("fallback"));
    assert_eq!(ok("request.object.missing && 'x'"), Value::Null);
    assert_eq!(ok("'x' && request.object.missing"), json!("ERROR: Unknown key \"missing\" in path"));
    assert_eq!(ok("request.object | missing"), Value::Null);
    assert_eq!(ok("request.object.spec.containers[].missing"), json!([]));
}
