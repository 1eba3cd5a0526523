//! Kubernetes' CEL URL, IP, CIDR and semver libraries, and cel-go's optional list helpers and
//! regex extension, as a policy calls them: each answer is Kubernetes' (apiserver v0.36.4 with
//! cel-go v0.31.0, Kyverno's versions). A missing or wrong function here fails the expression,
//! which under `failurePolicy: Fail` denies a request Kyverno admits.
//!
//! `go_answers_are_ours` replays `data/kubernetes_libraries/go_answers.tsv`, every expression
//! of `cases.py` as the Go libraries answered it (`harness.go` says how to regenerate it); the
//! other tests spell out the cases that matter most.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::disallowed_methods)] // a test fails by panicking; it reads its fixture

use serde_json::{Value, json};
use verno_cel::{Expr, Vars};

fn vars(object: Value) -> Vars {
    let mut v = Vars::default();
    v.set("object", &object);
    v
}

fn run(src: &str, v: &Vars) -> Result<Value, String> {
    Expr::compile(src).map_err(|e| e.to_string())?.eval(v).map_err(|e| e.to_string())
}

fn t(src: &str) -> Result<Value, String> {
    run(src, &Vars::default())
}

/// The error of `src`, which must fail.
fn err(src: &str) -> String {
    match t(src) {
        Ok(v) => panic!("{src} gave {v}, not an error"),
        Err(e) => e,
    }
}

/// Where Verno's error words differ from Go's (the answer, an error, is the same): Rust's regex
/// parser words its errors itself; a string `containsIP` cannot parse says why (Kubernetes:
/// `no such overload`); a semver compared with a quantity fails when it runs (Kubernetes: when
/// it compiles).
fn words_differ(src: &str) -> bool {
    [
        "'('",
        "'['",
        "containsIP('bad')",
        "containsIP('::ffff:",
        "containsIP('fe80::1%x')",
        "quantity('1'))",
        "semver('1.0.0'))",
    ]
    .iter()
    .any(|s| src.contains(s))
}

#[test]
fn go_answers_are_ours() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubernetes_libraries/go_answers.tsv");
    let text = std::fs::read_to_string(&path).unwrap();
    let v = Vars::default();
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in text.lines() {
        let mut parts = line.splitn(3, '\t');
        let (src, outcome, answer) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let ours = run(src, &v);
        checked += 1;
        match outcome {
            "OK" => {
                let want: Value = serde_json::from_str(answer).unwrap();
                if ours.as_ref() != Ok(&want) {
                    failures.push(format!("{src}\n    Go:    {want}\n    Verno: {ours:?}"));
                }
            }
            _ => {
                let go_message: String = serde_json::from_str(answer).unwrap();
                match &ours {
                    Ok(v) => failures.push(format!("{src}\n    Go:    error {go_message}\n    Verno: {v}")),
                    Err(e) if !e.contains(&go_message) && !words_differ(src) => {
                        failures.push(format!("{src}\n    Go:    error {go_message}\n    Verno: error {e}"))
                    }
                    Err(_) => {}
                }
            }
        }
    }
    assert!(checked > 1500, "only {checked} cases in {}", path.display());
    assert!(failures.is_empty(), "{} of {checked} differ from Go:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn urls_parse_as_go_parses_request_uris() {
    let u = "url('https://user:pw@example.com:8443/a%2Fb/c?x=1&x=2&y=a+b#frag')";
    assert_eq!(t(&format!("{u}.getScheme()")), Ok(json!("https")));
    assert_eq!(t(&format!("{u}.getHost()")), Ok(json!("example.com:8443")));
    assert_eq!(t(&format!("{u}.getHostname()")), Ok(json!("example.com")));
    assert_eq!(t(&format!("{u}.getPort()")), Ok(json!("8443")));
    // The path as written (it escapes a `/`); the fragment is not part of it.
    assert_eq!(t(&format!("{u}.getEscapedPath()")), Ok(json!("/a%2Fb/c")));
    assert_eq!(t(&format!("{u}.getQuery()")), Ok(json!({"x": ["1", "2"], "y": ["a b"]})));
    assert_eq!(t("url('http://[::1]:80/x').getHostname()"), Ok(json!("::1")));
    assert_eq!(t("url('http://[fe80::1%25en0]/').getHost()"), Ok(json!("[fe80::1%en0]")));
    assert_eq!(t("url('HTTPS://Example.com').getScheme()"), Ok(json!("https")));
    assert_eq!(t("url('https://example.com').getEscapedPath()"), Ok(json!("")));
    assert_eq!(t("url('https://example.com').getPort()"), Ok(json!("")));
    // An absolute path alone is a request URI; a malformed query pair is left out.
    assert_eq!(t("url('/api/v1?a=1;b=2&c=%zz&d').getQuery()"), Ok(json!({"d": [""]})));
    assert_eq!(t("url('mailto:someone@example.com').getHost()"), Ok(json!("")));
    for good in ["https://example.com", "/absolute", "*", "mailto:a@b.c", "foo://a:1:2/x", "http://a/b c"] {
        assert_eq!(t(&format!("isURL('{good}')")), Ok(json!(true)), "{good}");
    }
    for bad in [
        "",
        "example.com",
        "relative/path",
        "http://a:b:c/",
        "http://a b/",
        "http://[1.2.3.4]/",
        "http://a:port/",
        ":x",
    ] {
        assert_eq!(t(&format!("isURL('{bad}')")), Ok(json!(false)), "{bad}");
        assert!(t(&format!("url('{bad}')")).is_err(), "{bad}");
    }
    assert!(err("url('http://a:b:c/')").contains(
        r#"URL parse error during conversion from string: parse "http://a:b:c/": invalid port ":b:c" after host"#
    ));
    assert!(err("url('example.com')").contains(r#"parse "example.com": invalid URI for request"#));
    assert!(err("url('http://a%41/')").contains(r#"invalid URL escape "%41""#));
    assert!(err(r"url('http://a\x01')").contains("net/url: invalid control character in URL"));
    // Kubernetes compares URLs by their Go text.
    assert_eq!(t("url('http://a/b') == url('HTTP://a/b')"), Ok(json!(true)));
    assert_eq!(t("url('http://a/%7e') == url('http://a/~')"), Ok(json!(false)));
    // Only URLs have the getters.
    assert!(t("{'a': 1}.getHost()").is_err());
    assert!(t("ip('1.2.3.4').getHost()").is_err());
}

#[test]
fn ips_parse_as_netip_and_refuse_zones_and_mapped_addresses() {
    assert_eq!(t("ip('10.0.0.1').family()"), Ok(json!(4)));
    assert_eq!(t("ip('2001:db8::1').family()"), Ok(json!(6)));
    assert_eq!(t("string(ip('2001:DB8:0:0:0:0:0:1'))"), Ok(json!("2001:db8::1")));
    assert_eq!(t("ip.isCanonical('2001:db8::1')"), Ok(json!(true)));
    assert_eq!(t("ip.isCanonical('2001:DB8::1')"), Ok(json!(false)));
    assert_eq!(t("ip.isCanonical('2001:db8:0:0:0:0:0:1')"), Ok(json!(false)));
    assert_eq!(t("ip('::1') == ip('0:0:0:0:0:0:0:1')"), Ok(json!(true)));
    for (addr, [unspecified, loopback, ll_multicast, ll_unicast, global]) in [
        ("0.0.0.0", [true, false, false, false, false]),
        ("127.1.2.3", [false, true, false, false, false]),
        ("224.0.0.1", [false, false, true, false, false]),
        ("224.0.1.1", [false, false, false, false, false]),
        ("169.254.1.1", [false, false, false, true, false]),
        ("255.255.255.255", [false, false, false, false, false]),
        ("10.0.0.1", [false, false, false, false, true]),
        ("::", [true, false, false, false, false]),
        ("::1", [false, true, false, false, false]),
        ("ff02::1", [false, false, true, false, false]),
        ("fe80::1", [false, false, false, true, false]),
        ("fc00::1", [false, false, false, false, true]),
    ] {
        let got = t(&format!(
            "[ip('{addr}').isUnspecified(), ip('{addr}').isLoopback(), ip('{addr}').isLinkLocalMulticast(), \
             ip('{addr}').isLinkLocalUnicast(), ip('{addr}').isGlobalUnicast()]"
        ));
        assert_eq!(got, Ok(json!([unspecified, loopback, ll_multicast, ll_unicast, global])), "{addr}");
    }
    for bad in ["01.2.3.4", "1.2.3", "256.0.0.1", "1::2::3", "fe80::1%eth0", "::ffff:1.2.3.4", "", " 1.2.3.4"] {
        assert_eq!(t(&format!("isIP('{bad}')")), Ok(json!(false)), "{bad}");
    }
    assert!(err("ip('01.2.3.4')").contains(
        r#"IP Address "01.2.3.4" parse error during conversion from string: ParseAddr("01.2.3.4"): IPv4 field has octet with leading zero"#
    ));
    assert!(err("ip('fe80::1%eth0')").contains(r#"IP address "fe80::1%eth0" with zone value is not allowed"#));
    assert!(err("ip('::ffff:1.2.3.4')").contains(r#"IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed"#));
    assert!(err("ip.isCanonical('x')").contains(r#"ParseAddr("x"): unable to parse IP"#));
}

#[test]
fn cidrs_contain_addresses_and_narrower_cidrs() {
    let c = "cidr('10.0.0.0/8')";
    assert_eq!(t(&format!("{c}.containsIP('10.1.2.3')")), Ok(json!(true)));
    assert_eq!(t(&format!("{c}.containsIP(ip('11.0.0.0'))")), Ok(json!(false)));
    assert_eq!(t(&format!("{c}.containsCIDR('10.1.0.0/16')")), Ok(json!(true)));
    assert_eq!(t(&format!("{c}.containsCIDR(cidr('10.0.0.0/8'))")), Ok(json!(true)));
    assert_eq!(t("cidr('10.1.0.0/16').containsCIDR('10.0.0.0/8')"), Ok(json!(false)));
    // Families never mix.
    assert_eq!(t("cidr('::/0').containsIP('1.2.3.4')"), Ok(json!(false)));
    assert_eq!(t("cidr('0.0.0.0/0').containsCIDR('::/0')"), Ok(json!(false)));
    // A CIDR keeps the host bits it is written with; `masked()` clears them.
    assert_eq!(t("string(cidr('192.168.0.1/16'))"), Ok(json!("192.168.0.1/16")));
    assert_eq!(t("string(cidr('192.168.0.1/16').masked())"), Ok(json!("192.168.0.0/16")));
    assert_eq!(t("string(cidr('192.168.0.1/16').ip())"), Ok(json!("192.168.0.1")));
    assert_eq!(t("cidr('192.168.0.1/16').prefixLength()"), Ok(json!(16)));
    assert_eq!(t("cidr('192.168.0.1/16').containsIP('192.168.255.255')"), Ok(json!(true)));
    assert_eq!(t("cidr('10.0.0.1/8') == cidr('10.0.0.0/8')"), Ok(json!(false)));
    assert_eq!(t("cidr('10.0.0.1/8').masked() == cidr('10.0.0.0/8')"), Ok(json!(true)));
    assert_eq!(t("cidr('2001:db8::1/64').masked().ip().family()"), Ok(json!(6)));
    for bad in ["1.2.3.4", "1.2.3.4/33", "::1/129", "1.2.3.4/08", "1.2.3.4/+8", "::ffff:1.2.3.4/120", "fe80::1%eth0/64"]
    {
        assert_eq!(t(&format!("isCIDR('{bad}')")), Ok(json!(false)), "{bad}");
    }
    // Kubernetes says its context twice.
    assert!(err("cidr('1.2.3.4/33')").contains(
        r#"network address parse error during conversion from string: network address parse error during conversion from string: netip.ParsePrefix("1.2.3.4/33"): prefix length out of range"#
    ));
    assert!(err("cidr('1.2.3.4')").contains(r#"netip.ParsePrefix("1.2.3.4"): no '/'"#));
    assert!(
        err("cidr('::ffff:1.2.3.4/120')").contains(r#"IPv4-mapped IPv6 address "::ffff:1.2.3.4/120" is not allowed"#)
    );
    assert!(t(&format!("{c}.containsIP('bad')")).is_err());
    assert!(t(&format!("{c}.containsCIDR('10.0.0.0/33')")).is_err());
    assert!(t(&format!("{c}.containsIP(1)")).is_err());
}

/// IPs and CIDRs read from the request, in loops and composition variables.
#[test]
fn network_checks_on_request_data() {
    let mut v = vars(json!({"spec": {"ips": ["10.0.0.5", "192.168.1.9"], "cidrs": ["10.0.0.0/8", "fd00::/8"]}}));
    let allowed = "object.spec.ips.all(a, object.spec.cidrs.exists(c, cidr(c).containsIP(a)))";
    assert_eq!(run(allowed, &v), Ok(json!(false)));
    assert_eq!(run("object.spec.ips.filter(a, cidr('10.0.0.0/8').containsIP(a))", &v), Ok(json!(["10.0.0.5"])));
    assert_eq!(run("object.spec.cidrs.map(c, cidr(c).ip().family())", &v), Ok(json!([4, 6])));
    // A value kept as a variable is still an IP for the next expression.
    Expr::compile("ip(object.spec.ips[0])").unwrap().eval_into_variable("first", &mut v).unwrap();
    assert_eq!(run("variables.first.isGlobalUnicast() && string(variables.first) == '10.0.0.5'", &v), Ok(json!(true)));
    assert_eq!(run("variables.first == ip('10.0.0.5')", &v), Ok(json!(true)));
}

#[test]
fn semver_parses_normalizes_and_compares() {
    assert_eq!(t("semver('1.2.3').major()"), Ok(json!(1)));
    assert_eq!(t("semver('1.2.3-rc.1+build.5').minor()"), Ok(json!(2)));
    assert_eq!(t("semver('v01.02', true).patch()"), Ok(json!(0)));
    assert_eq!(t("semver('v1.2', true) == semver('1.2.0')"), Ok(json!(true)));
    // Build metadata has no precedence: Kubernetes calls these equal.
    assert_eq!(t("semver('1.0.0+a') == semver('1.0.0+b')"), Ok(json!(true)));
    assert_eq!(t("semver('1.10.0').isGreaterThan(semver('1.9.0'))"), Ok(json!(true)));
    assert_eq!(t("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))"), Ok(json!(true)));
    assert_eq!(t("semver('1.0.0-beta.11').compareTo(semver('1.0.0-beta.2'))"), Ok(json!(1)));
    assert_eq!(t("semver('1.0.0-alpha').compareTo(semver('1.0.0-alpha.1'))"), Ok(json!(-1)));
    assert_eq!(t("semver('2.0.0').compareTo(semver('2.0.0'))"), Ok(json!(0)));
    assert_eq!(t("isSemver('1.0.0') && !isSemver('v1.0.0') && isSemver('v1.0.0', true)"), Ok(json!(true)));
    assert_eq!(t("isSemver('1.0', false) || isSemver('1.2-rc', true)"), Ok(json!(false)));
    assert!(err("semver('1.0')").contains("No Major.Minor.Patch elements found"));
    assert!(err("semver('01.0.0')").contains(r#"Major number must not contain leading zeroes "01""#));
    assert!(err("semver('1.2-rc', true)").contains("short version cannot contain PreRelease/Build meta data"));
    assert!(err("semver('1.0.0-01')").contains(r#"Numeric PreRelease version must not contain leading zeroes "01""#));
    // A version compares only with a version.
    assert!(t("semver('1.0.0').compareTo(quantity('1'))").is_err());
    assert!(t("semver('1.0.0').isLessThan('2.0.0')").is_err());
}

/// `isGreaterThan`, `isLessThan` and `compareTo` are methods of both quantities and versions.
#[test]
fn quantities_keep_their_comparisons_beside_semver() {
    assert_eq!(t("quantity('1Gi').isGreaterThan(quantity('1G'))"), Ok(json!(true)));
    assert_eq!(t("quantity('1').isLessThan(quantity('1001m'))"), Ok(json!(true)));
    assert_eq!(t("quantity('1Gi').compareTo(quantity('1G'))"), Ok(json!(1)));
    assert_eq!(t("quantity('500m').compareTo(quantity('0.5'))"), Ok(json!(0)));
    assert!(t("quantity('1').compareTo(semver('1.0.0'))").is_err());
    let v = vars(json!({"limits": {"memory": "512Mi"}, "version": "v1.29.3"}));
    assert_eq!(
        run(
            "quantity(object.limits.memory).isLessThan(quantity('1Gi')) && semver(object.version, true).isLessThan(semver('1.30.0'))",
            &v
        ),
        Ok(json!(true))
    );
}

#[test]
fn optional_first_last_and_unwrap() {
    assert_eq!(t("[1, 2, 3].first().value()"), Ok(json!(1)));
    assert_eq!(t("[1, 2, 3].last().value()"), Ok(json!(3)));
    assert_eq!(t("[].first().hasValue() || [].last().hasValue()"), Ok(json!(false)));
    assert_eq!(t("[{'a': 1}].last().value().a"), Ok(json!(1)));
    // `orValue` on them is the optional's (Kyverno's compatibility `orValue` unwraps it too).
    assert_eq!(t("[1].first().orValue(0) + [].last().orValue(5)"), Ok(json!(6)));
    assert_eq!(t("optional.unwrap([optional.of(1), optional.none(), optional.of(3)])"), Ok(json!([1, 3])));
    assert_eq!(t("[optional.of('a'), optional.none()].unwrapOpt()"), Ok(json!(["a"])));
    assert_eq!(t("optional.unwrap([])"), Ok(json!([])));
    assert!(err("optional.unwrap([1])").contains("value 1 is not optional"));
    let v = vars(json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}));
    assert_eq!(run("object.spec.containers.last().value().name", &v), Ok(json!("b")));
    assert_eq!(
        run("object.spec.?initContainers.orValue([]).first().orValue({'name': 'none'}).name", &v),
        Ok(json!("none"))
    );
    assert!(run("'abc'.first()", &v).is_err());
}

#[test]
fn regex_extract_finds_the_first_group_or_match() {
    assert_eq!(t("regex.extract('hello world', 'hello(.*)').value()"), Ok(json!(" world")));
    assert_eq!(t(r"regex.extract('item-A, item-B', 'item-(\\w+)').value()"), Ok(json!("A")));
    assert_eq!(t("regex.extract('abc', 'b').value()"), Ok(json!("b")));
    assert_eq!(t("regex.extract('HELLO', 'hello').hasValue()"), Ok(json!(false)));
    // An optional group that matched nothing is none.
    assert_eq!(t("regex.extract('abc', 'a(x)?').hasValue()"), Ok(json!(false)));
    assert_eq!(t("regex.extract('image:v1.2', ':(.*)').orValue('latest')"), Ok(json!("v1.2")));
    assert_eq!(t("regex.extract('image', ':(.*)').orValue('latest')"), Ok(json!("latest")));
    assert_eq!(t(r"regex.extractAll('id:123, id:456', 'id:\\d+')"), Ok(json!(["id:123", "id:456"])));
    assert_eq!(t(r"regex.extractAll('a1b2c3', '[a-z](\\d)')"), Ok(json!(["1", "2", "3"])));
    assert_eq!(t("regex.extractAll('id:123', 'assa')"), Ok(json!([])));
    assert_eq!(t("regex.extractAll('ab', '(x)?b')"), Ok(json!([])));
    assert!(
        err("regex.extract('testuser@testdomain', '(.*)@([^.]*)')")
            .contains(r#"regular expression has more than one capturing group: "(.*)@([^.]*)""#)
    );
    assert!(t("regex.extractAll('a@b', '(.*)@(.*)')").is_err());
    assert!(t("regex.extract('abc', '(')").is_err());
}

#[test]
fn regex_replace_counts_and_group_references() {
    assert_eq!(t("regex.replace('hello world hello', 'hello', 'hi')"), Ok(json!("hi world hi")));
    assert_eq!(t("regex.replace('banana', 'a', 'x', 0)"), Ok(json!("banana")));
    assert_eq!(t("regex.replace('banana', 'a', 'x', 1)"), Ok(json!("bxnana")));
    assert_eq!(t("regex.replace('banana', 'a', 'x', 2)"), Ok(json!("bxnxna")));
    assert_eq!(t("regex.replace('banana', 'a', 'x', -12)"), Ok(json!("bxnxnx")));
    // cel-go v0.31 (Kyverno's) takes any count; v0.26 refused one over 2^31 - 1.
    assert_eq!(t("regex.replace('banana', 'a', 'x', 3000000000)"), Ok(json!("bxnxnx")));
    assert_eq!(t(r"regex.replace('foo bar', '(fo)o (ba)r', r'\2 \1')"), Ok(json!("ba fo")));
    assert_eq!(t(r"regex.replace('abc', 'b', r'\0\0')"), Ok(json!("abbc")));
    assert_eq!(t(r"regex.replace('a-b', '-', r'\\')"), Ok(json!(r"a\b")));
    // `$` is literal.
    assert_eq!(t("regex.replace('abc', 'b', '$0')"), Ok(json!("a$0c")));
    assert_eq!(t("regex.replace('a.b', '[.]', '${x}')"), Ok(json!("a${x}b")));
    // Empty matches next to a match are skipped, as Go's regexp skips them.
    assert_eq!(t("regex.replace('baaac', 'a*', '-')"), Ok(json!("-b-c-")));
    // A count of 0 does not read the pattern; a replacement is checked when a match needs it.
    assert_eq!(t("regex.replace('abc', '(', 'x', 0)"), Ok(json!("abc")));
    assert_eq!(t(r"regex.replace('abc', 'z', r'\9')"), Ok(json!("abc")));
    assert!(
        err(r"regex.replace('test', '(.)', r'\2')")
            .contains("replacement string references group 2 but regex has only 1 group(s)")
    );
    assert!(
        err(r"regex.replace('abc', 'b', r'\a')")
            .contains(r"invalid replacement string: '\a' \ must be followed by a digit or \")
    );
    assert!(
        err(r"regex.replace('abc', 'b', 'x\\')").contains(r"invalid replacement string: 'x\' \ not allowed at end")
    );
    assert!(t("regex.replace('foo bar', '(', '$2 $1')").is_err());
    let v = vars(json!({"image": "docker.io/nginx:1.25"}));
    assert_eq!(
        run(r"regex.replace(object.image, '^docker\\.io/(.*)', r'my.io/\1')", &v),
        Ok(json!("my.io/nginx:1.25"))
    );
}

/// A replacement that would grow past the result budget stops instead of allocating it.
#[test]
fn regex_replace_is_bounded() {
    // 64 KiB of matches, each replaced by 300 copies of itself: about 19 MiB.
    let v = vars(json!({"s": "a".repeat(1 << 16), "r": "\\1".repeat(300)}));
    let e = run("regex.replace(object.s, '(a)', object.r)", &v);
    assert!(e.as_ref().is_err_and(|e| e.contains("bytes")), "{e:?}");
}

/// The `string` overload for IPs and CIDRs leaves the standard conversions as they were.
#[test]
fn string_conversions_still_take_every_standard_type() {
    assert_eq!(t("string(1)"), Ok(json!("1")));
    assert_eq!(t("string(2u)"), Ok(json!("2")));
    assert_eq!(t("string('x')"), Ok(json!("x")));
    assert_eq!(t("string(true)"), Ok(json!("true")));
    assert_eq!(t("string(1.5)"), Ok(json!("1.5")));
    assert_eq!(t("string(b'ab')"), Ok(json!("ab")));
    assert_eq!(t("string(duration('1s'))"), Ok(json!("1s")));
    assert_eq!(t("string(ip('::1')) + ' ' + string(cidr('::1/128'))"), Ok(json!("::1 ::1/128")));
    assert!(t("string({'a': 1})").is_err());
    assert!(t("string(url('http://a/'))").is_err());
}

/// Webhook match conditions may call the libraries the API server has.
#[test]
fn the_api_server_evaluates_conditions_calling_them() {
    assert!(verno_cel::api_server_condition("isURL(object.spec.url) && url(object.spec.url).getScheme() == 'https'"));
    assert!(verno_cel::api_server_condition("cidr('10.0.0.0/8').containsIP(object.spec.ip)"));
    assert!(verno_cel::api_server_condition("isSemver(object.spec.version, true)"));
}
