"""The CEL expressions of go_answers.tsv (see harness.go), one a line on stdout: each URL, IP,
CIDR and version below through every function of its library, cel-go's optional list helpers
and regex extension, and the standard string() conversions."""


def q(s):
    out = "'"
    for ch in s:
        if ch == "\\": out += "\\\\"
        elif ch == "'": out += "\\'"
        elif ord(ch) < 0x20 or ord(ch) == 0x7f: out += "\\x%02x" % ord(ch)
        else: out += ch
    return out + "'"

E = []
urls_ok = ['https://example.com', 'https://example.com:8080/path?q=1&q=2&x=a+b#frag', 'http://user:pass@host:80/p',
  'http://[::1]:80/x', 'http://[fe80::1%25en0]/', '/absolute/path', '*', 'mailto:someone@example.com',
  'HTTPS://EXAMPLE.com/A', 'http:/only/path', 'http:///triple', 'http://a/b?', 'https://a.com/%7e', 'https://a.com/a%2Fb',
  'https://a.com/a b', 'http://h%C3%BC.com/', 'foo://a:1:2/x', 'https://a.com/?a=1;b=2&c=3', 'https://a.com/?%zz=1&k=%41',
  'https://a.com/?=v&k&&k=2', 'http://a/b#c#d', 'http://ü.com/ü', 'https://a.com:/x', 'http://[fe80::1%25en%20x]:8/', 'http://a/%2e%2E/',
  'https://a.com/?q=%E2%82%AC&r=%ff', 'http://user@a.com', 'ftp://a.b/c;type=a', 'http://a.com?x=1', 'http://a.com/p?', 'http://:80/',
  'urn:isbn:0451450523', 'https://a.com/?a=1&a=2&a=3', 'http://a/#', 'http://a/(x)!*', "http://a/'q'"]
urls_bad = ['', 'example.com', 'relative/path', 'http://a:b:c/', 'http://a b/', 'http://[1.2.3.4]/', 'http://[::1/',
  'http://x[::1]/', 'http://a:port/', 'http://a\x01', ':foo', 'http://a%41/', 'http://a#b/c', 'https://[::1]:x/',
  'http://us er@a/', 'http://a%zz/', '/p%zz', '1http://a', 'http://[::ffff:1.2.3.4]/', 'http://[fe80::1%25%41]/', 'http://[fe80::1%en0]/',
  'http://a\x7f/', '//host/path', 'http://a/b#%zz', '?q', 'http://a:1:2/']
for u in urls_ok:
    E.append("isURL(%s)" % q(u)); E.append("url(%s)" % q(u))
    for g in ['getScheme', 'getHost', 'getHostname', 'getPort', 'getEscapedPath', 'getQuery']:
        E.append("url(%s).%s()" % (q(u), g))
for u in urls_bad:
    E.append("isURL(%s)" % q(u)); E.append("url(%s)" % q(u))
E += ["url('http://a/%7e') == url('http://a/~')", "url('http://a/b') == url('HTTP://a/b')", "url('http://a/b#x') == url('http://a/b#x')"]

ips = ['127.0.0.1', '127.1.2.3', '0.0.0.0', '255.255.255.255', '169.254.1.1', '224.0.0.1', '224.0.1.1', '10.0.0.1', '192.168.1.1',
  '8.8.8.8', '::', '::1', 'fe80::1', 'febf::1', 'fec0::1', 'ff02::1', 'ff12::1', 'ff05::1', 'fe80::1%eth0', '::ffff:1.2.3.4', '2001:db8::1', '2001:DB8::1',
  '2001:db8:0:0:0:0:0:1', '2001:db8:0:0:1:0:0:1', '::1.2.3.4', '64:ff9b::192.0.2.33', 'fc00::1', '01.2.3.4', '1.2.3', '1.2.3.4.5', '256.0.0.1',
  '', 'abc', '1::2::3', '12345::', ':::', '1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8:9', '%eth0', 'fe80::1%', ' 1.2.3.4', '1.2.3.4 ',
  '::ffff:0:0', '1.2.3.4%x', '1:2:3:4:5:6:1.2.3.4', '1:2:3:1.2.3.4', '::1:2:3:4:5:6:7', '1:2:3:4:5:6:7::', '0:0:0:0:0:0:0:1']
for s in ips:
    E.append("isIP(%s)" % q(s)); E.append("ip(%s)" % q(s)); E.append("ip.isCanonical(%s)" % q(s))
    for m in ['family', 'isUnspecified', 'isLoopback', 'isLinkLocalMulticast', 'isLinkLocalUnicast', 'isGlobalUnicast']:
        E.append("ip(%s).%s()" % (q(s), m))
    E.append("string(ip(%s))" % q(s))
E += ["ip('::1') == ip('0:0:0:0:0:0:0:1')", "ip('1.2.3.4') == ip('1.2.3.5')"]

cidrs = ['192.168.0.0/16', '192.168.0.1/16', '10.0.0.0/8', '0.0.0.0/0', '::/0', '::1/128', '2001:db8::/32', '2001:db8::1/64',
  '192.168.0.0/33', '::1/129', '1.2.3.4', '1.2.3.4/', '1.2.3.4/08', '1.2.3.4/+8', '1.2.3.4/-1', '1.2.3.4/99999999999999999999',
  '::ffff:1.2.3.4/120', 'fe80::1%eth0/64', '01.2.3.4/8', 'x/8', '1.2.3.4/32', '1.2.3.4/0', '10.0.0.0/8/8', '2001:DB8::/32', '1.2.3.4/ 8']
for c in cidrs:
    E.append("isCIDR(%s)" % q(c)); E.append("cidr(%s)" % q(c))
    for m in ['prefixLength()', 'ip()', 'masked()']:
        E.append("cidr(%s).%s" % (q(c), m))
    E.append("string(cidr(%s))" % q(c)); E.append("string(cidr(%s).masked())" % q(c)); E.append("string(cidr(%s).ip())" % q(c))
for c, x in [('10.0.0.0/8', '10.1.2.3'), ('10.0.0.0/8', '11.0.0.0'), ('10.0.0.1/8', '10.255.255.255'), ('0.0.0.0/0', '1.2.3.4'),
             ('::/0', '1.2.3.4'), ('0.0.0.0/0', '::1'), ('2001:db8::/32', '2001:db8:1::1'), ('2001:db8::/32', '2001:db9::1'), ('1.2.3.4/32', '1.2.3.4'),
             ('10.0.0.0/8', 'bad'), ('10.0.0.0/8', '::ffff:10.0.0.1'), ('10.0.0.0/8', 'fe80::1%x')]:
    E.append("cidr(%s).containsIP(%s)" % (q(c), q(x)))
    E.append("cidr(%s).containsIP(ip(%s))" % (q(c), q(x)))
for c, x in [('10.0.0.0/8', '10.1.0.0/16'), ('10.1.0.0/16', '10.0.0.0/8'), ('10.0.0.0/8', '10.0.0.0/8'), ('10.0.0.0/8', '11.0.0.0/16'),
             ('0.0.0.0/0', '::/0'), ('::/0', '2001:db8::/32'), ('10.0.0.1/8', '10.2.0.0/16'), ('10.0.0.0/8', 'bad'), ('10.0.0.0/8', '10.0.0.0/33'),
             ('2001:db8::/32', '2001:db8::/31')]:
    E.append("cidr(%s).containsCIDR(%s)" % (q(c), q(x)))
    E.append("cidr(%s).containsCIDR(cidr(%s))" % (q(c), q(x)))
E += ["cidr('10.0.0.1/8') == cidr('10.0.0.0/8')", "cidr('10.0.0.1/8').masked() == cidr('10.0.0.0/8')", "cidr('::1/128') == cidr('0::1/128')"]

svs = ['1.0.0', '0.1.0-alpha.1', '1.2.3+build', 'v1.0.0', '1.0', '01.01.01', '200K', 'Three', '', '1.2.3-01', '1.2.3-', '1.2.3+',
  '1.0.0-alpha+001', 'v1', 'v1.2', '1.2-rc', '99999999999999999999.0.0', '1.2.3.4', '1.2.3-a.b.c', 'Mi', '1.2.3-a_b', '1.2.3+a..b',
  '1..3', '1.02.3', '1.2.03', 'v01.002.0003', 'vv1', ' 1.2.3', '1.2.3-0', '1.2.3-00', '18446744073709551615.0.0', '9223372036854775808.1.2', '1.0.0-rc.1+x-y']
for s in svs:
    for n in ['', ', false', ', true']:
        E.append("isSemver(%s%s)" % (q(s), n)); E.append("semver(%s%s)" % (q(s), n))
    for m in ['major', 'minor', 'patch']:
        E.append("semver(%s, true).%s()" % (q(s), m))
order = ['1.0.0-alpha', '1.0.0-alpha.1', '1.0.0-alpha.beta', '1.0.0-beta', '1.0.0-beta.2', '1.0.0-beta.11', '1.0.0-rc.1', '1.0.0', '1.0.0+zz', '1.0.1', '1.10.0', '2.0.0']
for a in order:
    for b in order:
        E.append("semver(%s).compareTo(semver(%s))" % (q(a), q(b)))
E += ["semver('1.2.3').isGreaterThan(semver('1.2.0'))", "semver('1.2.3').isLessThan(semver('1.2.0'))", "semver('1.2.3').isLessThan(semver('1.2.3'))",
      "semver('1.0.0+a') == semver('1.0.0+b')", "semver('1.0.0') == semver('1.0.1')", "semver('v1.2', true) == semver('1.2.0')",
      "semver('1.0.0').compareTo(quantity('1'))", "quantity('1').compareTo(semver('1.0.0'))",
      "quantity('1Gi').isGreaterThan(quantity('1G'))", "quantity('1Gi').compareTo(quantity('1G'))", "quantity('1').isLessThan(quantity('1001m'))",
      "quantity('1') == quantity('1000m')"]

E += ["[1,2,3].first().value()", "[].first().hasValue()", "[1,2,3].last().value()", "[].last().hasValue()", "[[1],[2]].first().value()",
      "optional.unwrap([optional.of(1), optional.none(), optional.of(3)])", "[optional.of('a'), optional.none()].unwrapOpt()", "optional.unwrap([])",
      "[optional.none()].unwrapOpt()", "[1].first().orValue(0) + [].last().orValue(5)", "[{'a': 1}].last().value().a"]

RX = [
 ("regex.replace(%s, %s, %s)", ['hello world hello', 'hello', 'hi']),
 ("regex.replace(%s, %s, %s, 0)", ['banana', 'a', 'x']), ("regex.replace(%s, %s, %s, 1)", ['banana', 'a', 'x']),
 ("regex.replace(%s, %s, %s, 2)", ['banana', 'a', 'x']), ("regex.replace(%s, %s, %s, -12)", ['banana', 'a', 'x']),
 ("regex.replace(%s, %s, %s, 99)", ['banana', 'a', 'x']), ("regex.replace(%s, %s, %s, 3000000000)", ['banana', 'a', 'x']),
 ("regex.replace(%s, %s, %s)", ['foo bar', '(fo)o (ba)r', r'\2 \1']), ("regex.replace(%s, %s, %s)", ['test', '(.)', r'\2']),
 ("regex.replace(%s, %s, %s)", ['foo bar', '(', '$2 $1']), ("regex.replace(%s, %s, %s)", ['abc', 'b', '$0']),
 ("regex.replace(%s, %s, %s)", ['abc', '(b)', '\\\\']), ("regex.replace(%s, %s, %s)", ['abc', 'b', 'x\\']),
 ("regex.replace(%s, %s, %s)", ['abc', 'b', r'\a']), ("regex.replace(%s, %s, %s)", ['abc', '(b)?c', r'[\1]']),
 ("regex.replace(%s, %s, %s)", ['abc', 'x*', '-']), ("regex.replace(%s, %s, %s)", ['baaac', 'a*', '-']),
 ("regex.replace(%s, %s, %s)", ['abc', '', '-']), ("regex.replace(%s, %s, %s, 2)", ['aaa', 'a', 'b']),
 ("regex.replace(%s, %s, %s, 0)", ['abc', '(', 'x']), ("regex.replace(%s, %s, %s)", ['abc', 'z', r'\9']),
 ("regex.replace(%s, %s, %s)", ['abc', 'b', r'\0\0']), ("regex.replace(%s, %s, %s)", ['héllo', 'é', 'e']),
 ("regex.replace(%s, %s, %s)", ['ab', 'b', r'\1']), ("regex.replace(%s, %s, %s)", ['docker.io/nginx', r'^docker\.io/(.*)', r'my.io/\1']),
 ("regex.replace(%s, %s, %s)", ['a.b.c', r'\.', '${x}']), ("regex.replace(%s, %s, %s, 1)", ['abab', '(?P<x>a)', r'<\1>']),
 ("regex.replace(%s, %s, %s)", ['aaa', 'a', r'\\1']), ("regex.replace(%s, %s, %s)", ['a-b', '-', r'\\']),
 ("regex.extract(%s, %s).value()", ['hello world', 'hello(.*)']), ("regex.extract(%s, %s).value()", ['item-A, item-B', r'item-(\w+)']),
 ("regex.extract(%s, %s).hasValue()", ['HELLO', 'hello']), ("regex.extract(%s, %s)", ['testuser@testdomain', '(.*)@([^.]*)']),
 ("regex.extract(%s, %s).hasValue()", ['abc', 'x(y)?']), ("regex.extract(%s, %s).hasValue()", ['abc', 'a(x)?']),
 ("regex.extract(%s, %s).value()", ['abc', '(?P<n>b)']), ("regex.extract(%s, %s).value()", ['abc', 'b']),
 ("regex.extract(%s, %s)", ['abc', '(']), ("regex.extract(%s, %s).value()", ['abc', '(?:a)(b)']),
 ("regex.extract(%s, %s).hasValue()", ['abc', '']),
 ("regex.extractAll(%s, %s)", ['id:123, id:456', r'id:\d+']), ("regex.extractAll(%s, %s)", ['id:123, id:456', 'assa']),
 ("regex.extractAll(%s, %s)", ['testuser@testdomain', '(.*)@([^.]*)']), ("regex.extractAll(%s, %s)", ['a1b2c3', r'[a-z](\d)']),
 ("regex.extractAll(%s, %s)", ['ab', '(x)?b']), ("regex.extractAll(%s, %s)", ['aaa', 'a*']), ("regex.extractAll(%s, %s)", ['abc', '']),
 ("regex.extractAll(%s, %s)", ['abc', '[']), ("regex.extractAll(%s, %s)", ['k=v; k2=v2', r'(\w+)=']),
]
for tmpl, args in RX:
    E.append(tmpl % tuple(q(a) for a in args))
E += ["string(1)", "string('x')", "string(true)", "string(1.5)", "string(b'ab')", "string(2u)", "string(duration('1s'))"]
print("\n".join(E))
