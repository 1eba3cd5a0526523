//! Kyverno's small CEL libraries (hash, math, json, yaml, x509, time, transform, gzip, random)
//! as a policy calls them, each in both of Kyverno's spellings where it has two.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking; it reads its fixture

use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use verno_cel::{Expr, Host, Vars};

/// A host whose only gift is randomness: a different seed at each call.
struct Seeds(AtomicU64);

impl Host for Seeds {
    fn random_seed(&self) -> Option<u64> {
        Some(self.0.fetch_add(1, Ordering::Relaxed))
    }
}

fn vars(object: Value) -> Vars {
    let mut v = Vars::default();
    v.set("object", &object);
    v
}

fn run(src: &str, v: &Vars) -> Result<Value, String> {
    Expr::compile(src).map_err(|e| e.to_string())?.eval(v).map_err(|e| e.to_string())
}

#[test]
fn hashes_are_hex_digests_under_both_names() {
    let v = vars(json!({"name": "verno"}));
    let want = json!("f770995a79fa84d042749a8e17ea82eec819b16d931c2a7b1979a4d96574587c");
    assert_eq!(run("sha256(object.name)", &v), Ok(want.clone()));
    assert_eq!(run("hash.sha256(object.name)", &v), Ok(want));
    assert_eq!(run("sha256('')", &v), Ok(json!("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")));
    assert_eq!(run("hash.sha1('abc')", &v), Ok(json!("a9993e364706816aba3e25717850c26c9cd0d89d")));
    assert_eq!(run("md5('abc')", &v), Ok(json!("900150983cd24fb0d6963f7d28e17f72")));
    assert_eq!(run("hash.md5('abc') == md5('abc')", &v), Ok(json!(true)));
}

#[test]
fn math_round_takes_a_precision_beside_the_standard_one_argument_form() {
    let v = vars(json!({"ratio": 2.3456}));
    assert_eq!(run("math.round(object.ratio, 2)", &v), Ok(json!(2.35)));
    assert_eq!(run("math.round(-2.5, 0)", &v), Ok(json!(-3.0)));
    assert_eq!(run("math.round(1234.5, -2)", &v), Ok(json!(1200.0)));
    assert_eq!(run("math.round(2.5)", &v), Ok(json!(3.0)));
}

#[test]
fn json_and_yaml_text_become_values_and_back() {
    let v =
        vars(json!({"raw": "{\"a\": [1, 2], \"b\": {\"c\": \"<x>\"}}", "doc": "name: app\nports:\n  - 80\n  - 443\n"}));
    assert_eq!(run("json.unmarshal(object.raw).a[1]", &v), Ok(json!(2)));
    assert_eq!(run("json.unmarshal(object.raw).b.c", &v), Ok(json!("<x>")));
    // Go's json.Marshal: keys sorted, HTML characters escaped, integral doubles without a fraction.
    assert_eq!(
        run("json.marshal({'z': 1, 'a': [true, null, 1.0, 0.5], 'h': '<a&b>'})", &v),
        Ok(json!(r#"{"a":[true,null,1,0.5],"h":"\u003ca\u0026b\u003e","z":1}"#))
    );
    assert_eq!(run("json.unmarshal(json.marshal(object)).doc", &v), Ok(json!(v_doc())));
    let bad = run("json.unmarshal('{')", &v).unwrap_err();
    assert!(bad.contains("json.unmarshal"), "{bad}");
    assert_eq!(run("yaml.parse(object.doc).ports", &v), Ok(json!([80, 443])));
    assert_eq!(run("yaml.parse(object.doc).name", &v), Ok(json!("app")));
    assert!(run("yaml.parse('a: [')", &v).unwrap_err().contains("yaml.parse"));
}

fn v_doc() -> &'static str {
    "name: app\nports:\n  - 80\n  - 443\n"
}

#[test]
fn x509_decode_reads_a_certificate_with_gos_field_names() {
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/validate/x509-decode/resources.yaml"
    ))
    .unwrap();
    let docs = verno_jmespath::yaml::parse_all(&file).unwrap();
    let cert = docs[0]["data"]["cert"].as_str().unwrap();
    let v = vars(json!({"cert": cert}));
    assert_eq!(run("x509.decode(object.cert).Subject.CommonName", &v), Ok(json!("verno.example")));
    assert_eq!(run("x509.decode(object.cert).DNSNames", &v), Ok(json!(["verno.example", "www.verno.example"])));
    assert_eq!(run("x509.decode(object.cert).NotAfter", &v), Ok(json!("2046-11-22T01:17:07Z")));
    assert_eq!(run("x509.decode(object.cert).IsCA", &v), Ok(json!(true)));
    let bad = run("x509.decode('not a certificate')", &v).unwrap_err();
    assert!(bad.contains("failed to decode PEM block"), "{bad}");
}

#[test]
fn time_to_cron_and_truncate() {
    let v = vars(json!({}));
    // 2026-12-06 was a Sunday.
    assert_eq!(run("time.toCron(timestamp('2026-12-06T09:05:00Z'))", &v), Ok(json!("5 9 6 12 0")));
    assert_eq!(
        run("time.truncate(timestamp('2026-12-07T16:47:31Z'), duration('1h'))", &v),
        Ok(json!("2026-12-07T16:00:00+00:00"))
    );
    // Multiples of the duration count from Go's zero time (year 1), not from 1970: a week's
    // boundaries fall on Mondays.
    assert_eq!(
        run("time.truncate(timestamp('2026-12-10T12:00:00Z'), duration('168h'))", &v),
        Ok(json!("2026-12-07T00:00:00+00:00"))
    );
    assert_eq!(
        run("time.truncate(timestamp('2026-12-07T16:47:31Z'), duration('0s'))", &v),
        Ok(json!("2026-12-07T16:47:31+00:00"))
    );
}

#[test]
fn list_obj_to_map_pairs_two_lists_in_kyvernos_words() {
    let v = vars(json!({
        "keys": [{"name": "a"}, {"name": "b"}],
        "values": [{"image": "nginx"}, {"image": "redis"}],
    }));
    let want = Ok(json!({"a": "nginx", "b": "redis"}));
    assert_eq!(run("listObjToMap(object.keys, object.values, 'name', 'image')", &v), want);
    assert_eq!(run("transform.listObjToMap(object.keys, object.values, 'name', 'image')", &v), want);
    let unequal = run("listObjToMap(object.keys, [object.values[0]], 'name', 'image')", &v).unwrap_err();
    assert!(unequal.contains("listObjToMap must take lists of equal length. list1: 2, list2: 1"), "{unequal}");
    let not_string = run("listObjToMap(object.values, object.values, 'missing', 'image')", &v).unwrap_err();
    assert!(not_string.contains("cannot be handled as a string"), "{not_string}");
}

#[test]
fn gzip_round_trips_and_refuses_what_is_not_gzip() {
    let v = vars(json!({"text": "hello, verno"}));
    assert_eq!(run("gzip.decompress(gzip.compress(object.text))", &v), Ok(json!("hello, verno")));
    assert!(run("gzip.decompress(b'plain')", &v).unwrap_err().contains("gzip.decompress"));
}

#[test]
fn random_strings_need_a_host_and_match_their_pattern() {
    let mut v = vars(json!({}));
    let none = run("random()", &v).unwrap_err();
    assert!(none.contains("random values are not available here"), "{none}");
    v.set_host(Arc::new(Seeds(AtomicU64::new(7))));
    let s = run("random()", &v).unwrap();
    let s = s.as_str().unwrap();
    assert!(s.len() == 8 && s.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()), "{s}");
    let p = run("random('[A-F]{3}-[0-9]{2}')", &v).unwrap();
    let p = p.as_str().unwrap();
    assert!(regex_like(p), "{p}");
    assert_eq!(run("random.random('x{2}')", &v), Ok(json!("xx")));
    assert_eq!(run("random() != random()", &v), Ok(json!(true)));
}

fn regex_like(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 6
        && b[..3].iter().all(|c| (b'A'..=b'F').contains(c))
        && b[3] == b'-'
        && b[4..].iter().all(u8::is_ascii_digit)
}

/// A host that records each `http` call and answers with what it was asked.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl Host for Recorder {
    fn http(&self, c: &verno_cel::HttpCall<'_>) -> Result<Value, verno_cel::HostError> {
        let line = format!("{} {} {:?} {:?} {:?}", c.method, c.url, c.body, c.headers, c.ca_bundle);
        self.0.lock().unwrap().push(line);
        Ok(json!({"statusCode": 200}))
    }
}

#[test]
fn http_calls_carry_headers_bodies_and_the_clients_ca_bundle() {
    let host = Arc::new(Recorder::default());
    let mut v = vars(json!({}));
    v.set_host(host.clone());
    for src in [
        "http.Get('https://a.example/x').statusCode",
        "http.get('https://a.example/x', {'Authorization': 'Bearer t'}).statusCode",
        "http.Post('https://a.example/p', {'k': 1}).statusCode",
        "http.Post('https://a.example/p', {'k': 1}, {'X-A': 'b'}).statusCode",
        "http.Client('PEM').Get('https://a.example/c').statusCode",
        "http.Client('PEM').Post('https://a.example/c', [1]).statusCode",
    ] {
        assert_eq!(run(src, &v), Ok(json!(200)), "{src}");
    }
    let bad = run("http.Get('https://a.example/x', {'n': 1})", &v).unwrap_err();
    assert!(bad.contains("header \"n\" must be a string"), "{bad}");
    assert_eq!(
        *host.0.lock().unwrap(),
        vec![
            "GET https://a.example/x None [] None",
            "GET https://a.example/x None [(\"Authorization\", \"Bearer t\")] None",
            "POST https://a.example/p Some(Object {\"k\": Number(1)}) [] None",
            "POST https://a.example/p Some(Object {\"k\": Number(1)}) [(\"X-A\", \"b\")] None",
            "GET https://a.example/c None [] Some(\"PEM\")",
            "POST https://a.example/c Some(Array [Number(1)]) [] Some(\"PEM\")",
        ]
    );
}
