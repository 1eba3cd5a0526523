//! Kubernetes' CEL IP and CIDR libraries (`k8s.io/apiserver/pkg/cel/library/ip.go` and
//! `cidr.go`), which every Kyverno CEL kind has:
//!
//! - `ip(s)`, `isIP(s)`, `ip.isCanonical(s)`, and on an IP `family()`, `isUnspecified()`,
//!   `isLoopback()`, `isLinkLocalMulticast()`, `isLinkLocalUnicast()`, `isGlobalUnicast()`;
//!   `string(ip)`
//! - `cidr(s)`, `isCIDR(s)`, and on a CIDR `containsIP(ip | string)`,
//!   `containsCIDR(cidr | string)`, `ip()`, `masked()`, `prefixLength()`; `string(cidr)`
//!
//! Addresses parse as Go's `netip.ParseAddr` parses them (no leading zeros in IPv4 octets,
//! one `::`, an embedded IPv4 only in the last 32 bits), and Kubernetes refuses zones
//! (`fe80::1%eth0`) and IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`). Errors are worded as
//! Kubernetes and Go word them. An IP is held as `{"@ip": text}`, a CIDR as `{"@cidr": text}`
//! (see `tagged`), the text being Go's canonical form, so equal values are equal maps: a CIDR
//! keeps the host bits it was written with (`cidr('10.0.0.1/8') != cidr('10.0.0.0/8')`, as in
//! Kubernetes; `masked()` clears them).

use crate::tagged::{self, Args, Ret, go_quote, no_overload, ret, string_at, tagged, untag, values};
use cel::common::types::{DYN_TYPE, MAP_TYPE, STRING_TYPE};
use cel::{DeclarationError, Env, ExecutionError, Value};

const IP: &str = "@ip";
const CIDR: &str = "@cidr";

/// An IP address without a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Addr {
    V4(u32),
    V6(u128),
}

/// Why a string is not an address, as Go's `netip.ParseAddr` says it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AddrError {
    input: String,
    msg: &'static str,
    /// The rest of the input from where parsing stopped, when Go names it.
    at: Option<String>,
}

impl std::fmt::Display for AddrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParseAddr({}): {}", go_quote(self.input.as_bytes()), self.msg)?;
        match &self.at {
            Some(at) => write!(f, " (at {})", go_quote(at.as_bytes())),
            None => Ok(()),
        }
    }
}

impl Addr {
    fn bits(self) -> u8 {
        match self {
            Addr::V4(_) => 32,
            Addr::V6(_) => 128,
        }
    }

    /// `::ffff:a.b.c.d`.
    fn is_4in6(self) -> bool {
        matches!(self, Addr::V6(a) if a >> 32 == 0xffff)
    }

    /// The IPv4 address an IPv4-mapped IPv6 address carries; other addresses as they are.
    fn unmap(self) -> Addr {
        match self {
            Addr::V6(a) if self.is_4in6() => Addr::V4(a as u32),
            other => other,
        }
    }

    fn is_unspecified(self) -> bool {
        matches!(self, Addr::V4(0) | Addr::V6(0))
    }

    fn is_loopback(self) -> bool {
        match self.unmap() {
            Addr::V4(a) => a >> 24 == 127,
            Addr::V6(a) => a == 1,
        }
    }

    fn is_multicast(self) -> bool {
        match self.unmap() {
            Addr::V4(a) => (a >> 24) & 0xf0 == 0xe0,
            Addr::V6(a) => a >> 120 == 0xff,
        }
    }

    fn is_link_local_unicast(self) -> bool {
        match self.unmap() {
            Addr::V4(a) => a >> 16 == 0xa9fe,
            Addr::V6(a) => (a >> 112) & 0xffc0 == 0xfe80,
        }
    }

    fn is_link_local_multicast(self) -> bool {
        match self.unmap() {
            Addr::V4(a) => a >> 8 == 0x00e0_0000,
            Addr::V6(a) => (a >> 112) & 0xff0f == 0xff02,
        }
    }

    /// Go's `IsGlobalUnicast`: not unspecified, broadcast, loopback, multicast or link-local
    /// (private and unique-local addresses count as global).
    fn is_global_unicast(self) -> bool {
        let ip = self.unmap();
        !matches!(ip, Addr::V4(0 | u32::MAX) | Addr::V6(0))
            && !ip.is_loopback()
            && !ip.is_multicast()
            && !ip.is_link_local_unicast()
    }

    /// The address with all but its top `bits` bits cleared.
    fn masked(self, bits: u8) -> Addr {
        match self {
            Addr::V4(a) => Addr::V4(a & u32::MAX.checked_shl(32 - u32::from(bits.min(32))).unwrap_or(0)),
            Addr::V6(a) => Addr::V6(a & u128::MAX.checked_shl(128 - u32::from(bits.min(128))).unwrap_or(0)),
        }
    }
}

/// Go's canonical form: dotted IPv4; IPv6 in lowercase hex with the first longest run of two or
/// more zero groups written `::` (RFC 5952), an IPv4-mapped address as `::ffff:a.b.c.d`.
impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v4 = |f: &mut std::fmt::Formatter<'_>, a: u32| {
            let [b0, b1, b2, b3] = a.to_be_bytes();
            write!(f, "{b0}.{b1}.{b2}.{b3}")
        };
        match *self {
            Addr::V4(a) => v4(f, a),
            Addr::V6(a) if self.is_4in6() => {
                f.write_str("::ffff:")?;
                v4(f, a as u32)
            }
            Addr::V6(a) => {
                let groups: Vec<u16> = (0..8).map(|i| (a >> (112 - 16 * i)) as u16).collect();
                // The first longest run of zero groups, if two or more long.
                let (mut best_start, mut best_len) = (8, 0);
                let mut i = 0;
                while i < 8 {
                    let run = groups.iter().skip(i).take_while(|g| **g == 0).count();
                    if run >= 2 && run > best_len {
                        (best_start, best_len) = (i, run);
                    }
                    i += run.max(1);
                }
                let hex = |gs: &[u16]| gs.iter().map(|g| format!("{g:x}")).collect::<Vec<_>>().join(":");
                if best_len == 0 {
                    f.write_str(&hex(&groups))
                } else {
                    let (head, rest) = groups.split_at(best_start);
                    let tail = rest.get(best_len..).unwrap_or(&[]);
                    write!(f, "{}::{}", hex(head), hex(tail))
                }
            }
        }
    }
}

/// Go's `netip.ParseAddr`: the address, and its zone (`%…`) when it has one.
pub(crate) fn parse_addr(s: &str) -> Result<(Addr, Option<&str>), AddrError> {
    let fail = |msg| AddrError { input: s.to_string(), msg, at: None };
    for b in s.bytes() {
        match b {
            b'.' => return parse_v4(s, s).map(|a| (Addr::V4(a), None)),
            b':' => return parse_v6(s),
            // Probably an IPv6 address with a zone, but without the address.
            b'%' => return Err(fail("missing IPv6 address")),
            _ => {}
        }
    }
    Err(fail("unable to parse IP"))
}

/// The dotted IPv4 address `field` (all of `input`, or its last part for an IPv6 address with
/// an embedded IPv4 one).
fn parse_v4(input: &str, field: &str) -> Result<u32, AddrError> {
    let fail = |msg, at: Option<&str>| AddrError { input: input.to_string(), msg, at: at.map(str::to_string) };
    let bytes = field.as_bytes();
    let (mut octets, mut val, mut digits) = (Vec::with_capacity(4), 0u32, 0usize);
    for (i, &c) in bytes.iter().enumerate() {
        let rest = field.get(i..);
        match c {
            b'0'..=b'9' => {
                if digits == 1 && val == 0 {
                    return Err(fail("IPv4 field has octet with leading zero", None));
                }
                val = val * 10 + u32::from(c - b'0');
                digits += 1;
                if val > 255 {
                    return Err(fail("IPv4 field has value >255", None));
                }
            }
            b'.' => {
                // `.1.2.3`, `1.2.3.`, `1..2.3`
                if i == 0 || i + 1 == bytes.len() || i.checked_sub(1).and_then(|j| bytes.get(j)) == Some(&b'.') {
                    return Err(fail("IPv4 field must have at least one digit", rest));
                }
                if octets.len() == 3 {
                    return Err(fail("IPv4 address too long", None));
                }
                octets.push(val);
                (val, digits) = (0, 0);
            }
            _ => return Err(fail("unexpected character", rest)),
        }
    }
    if octets.len() < 3 {
        return Err(fail("IPv4 address too short", None));
    }
    octets.push(val);
    Ok(octets.iter().fold(0, |acc, o| (acc << 8) | o))
}

fn parse_v6(input: &str) -> Result<(Addr, Option<&str>), AddrError> {
    let fail = |msg, at: Option<&str>| AddrError { input: input.to_string(), msg, at: at.map(str::to_string) };
    // The zone is split off first.
    let (mut s, zone) = match input.split_once('%') {
        Some((_, "")) => return Err(fail("zone must be a non-empty string", None)),
        Some((a, z)) => (a, Some(z)),
        None => (input, None),
    };
    let mut ip = [0u8; 16];
    // Where the `::` stands, in bytes of the address.
    let mut ellipsis: Option<usize> = None;
    if let Some(rest) = s.strip_prefix("::") {
        ellipsis = Some(0);
        s = rest;
        if s.is_empty() {
            return Ok((Addr::V6(0), zone));
        }
    }
    let mut i = 0;
    while i < 16 {
        // A group of hex digits.
        let digits = s.bytes().take_while(u8::is_ascii_hexdigit).count();
        if digits > 4 {
            return Err(fail("each group must have 4 or less digits", Some(s)));
        }
        if digits == 0 {
            return Err(fail("each colon-separated field must have at least one digit", Some(s)));
        }
        let (group, rest) = s.split_at(digits);
        if rest.starts_with('.') {
            // An embedded IPv4 address: only as the last 32 bits.
            if ellipsis.is_none() && i != 12 {
                return Err(fail("embedded IPv4 address must replace the final 2 fields of the address", Some(s)));
            }
            if i + 4 > 16 {
                return Err(fail("too many hex fields to fit an embedded IPv4 at the end of the address", Some(s)));
            }
            let v4 = parse_v4(input, s)?;
            if let Some(slot) = ip.get_mut(i..i + 4) {
                slot.copy_from_slice(&v4.to_be_bytes());
            }
            s = "";
            i += 4;
            break;
        }
        let value = u16::from_str_radix(group, 16).map_err(|_| fail("IPv6 field has value >=2^16", Some(s)))?;
        if let Some(slot) = ip.get_mut(i..i + 2) {
            slot.copy_from_slice(&value.to_be_bytes());
        }
        i += 2;
        s = rest;
        if s.is_empty() {
            break;
        }
        // Otherwise a colon and more must follow.
        match s.strip_prefix(':') {
            None => return Err(fail("unexpected character, want colon", Some(s))),
            Some("") => return Err(fail("colon must be followed by more characters", Some(s))),
            Some(rest) => s = rest,
        }
        if let Some(rest) = s.strip_prefix(':') {
            if ellipsis.is_some() {
                return Err(fail("multiple :: in address", Some(s)));
            }
            ellipsis = Some(i);
            s = rest;
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return Err(fail("trailing garbage after address", Some(s)));
    }
    if i < 16 {
        let Some(e) = ellipsis else { return Err(fail("address string too short", None)) };
        // The groups after the `::` move to the end; zeros fill the gap.
        let moved: Vec<u8> = ip.get(e..i).unwrap_or(&[]).to_vec();
        ip.iter_mut().skip(e).for_each(|b| *b = 0);
        if let Some(slot) = ip.get_mut(16 - moved.len()..) {
            slot.copy_from_slice(&moved);
        }
    } else if ellipsis.is_some() {
        return Err(fail("the :: must expand to at least one field of zeros", None));
    }
    Ok((Addr::V6(u128::from_be_bytes(ip)), zone))
}

/// Kubernetes' IP parse: `netip.ParseAddr`, refusing zones and IPv4-mapped IPv6 addresses.
pub(crate) fn parse_ip(raw: &str) -> Result<Addr, String> {
    let q = go_quote(raw.as_bytes());
    let (addr, zone) =
        parse_addr(raw).map_err(|e| format!("IP Address {q} parse error during conversion from string: {e}"))?;
    if zone.is_some() {
        return Err(format!("IP address {q} with zone value is not allowed"));
    }
    if addr.is_4in6() {
        return Err(format!("IPv4-mapped IPv6 address {q} is not allowed"));
    }
    Ok(addr)
}

/// An address and a prefix length (the address keeps the bits after the prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefix {
    addr: Addr,
    bits: u8,
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

impl Prefix {
    fn masked(self) -> Prefix {
        Prefix { addr: self.addr.masked(self.bits), bits: self.bits }
    }

    /// Go's `Prefix.Contains`: an address of the same family whose top bits are the prefix's.
    fn contains(self, ip: Addr) -> bool {
        match (self.addr, ip) {
            (Addr::V4(_), Addr::V4(_)) | (Addr::V6(_), Addr::V6(_)) => ip.masked(self.bits) == self.masked().addr,
            _ => false,
        }
    }

    /// Kubernetes' `containsCIDR`: the prefixes overlap and `other` is no wider.
    fn contains_prefix(self, other: Prefix) -> bool {
        let same_family = matches!((self.addr, other.addr), (Addr::V4(_), Addr::V4(_)) | (Addr::V6(_), Addr::V6(_)));
        let shortest = self.bits.min(other.bits);
        same_family && self.addr.masked(shortest) == other.addr.masked(shortest) && self.bits <= other.bits
    }
}

/// Go's `netip.ParsePrefix`: an address without a zone, `/`, and a length in decimal without
/// sign or leading zeros, at most the address's bit length.
pub(crate) fn parse_prefix(s: &str) -> Result<Prefix, String> {
    let fail = |msg: &str| format!("netip.ParsePrefix({}): {msg}", go_quote(s.as_bytes()));
    let Some((addr, bits)) = s.rsplit_once('/') else { return Err(fail("no '/'")) };
    let (addr, zone) = parse_addr(addr).map_err(|e| fail(&e.to_string()))?;
    if matches!(addr, Addr::V6(_)) && zone.is_some() {
        return Err(fail("IPv6 zones cannot be present in a prefix"));
    }
    let bad_bits = || fail(&format!("bad bits after slash: {}", go_quote(bits.as_bytes())));
    let leading_zero = bits.len() > 1 && bits.starts_with('0');
    if bits.is_empty() || leading_zero || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_bits());
    }
    // Go's `Atoi` refuses what does not fit an int.
    let n: i64 = bits.parse().map_err(|_| bad_bits())?;
    match u8::try_from(n) {
        Ok(n) if n <= addr.bits() => Ok(Prefix { addr, bits: n }),
        _ => Err(fail("prefix length out of range")),
    }
}

/// Kubernetes' CIDR parse: `netip.ParsePrefix`, refusing IPv4-mapped IPv6 addresses.
pub(crate) fn parse_cidr(raw: &str) -> Result<Prefix, String> {
    let prefix =
        parse_prefix(raw).map_err(|e| format!("network address parse error during conversion from string: {e}"))?;
    if prefix.addr.is_4in6() {
        return Err(format!("IPv4-mapped IPv6 address {} is not allowed", go_quote(raw.as_bytes())));
    }
    Ok(prefix)
}

fn ip_value(a: Addr) -> Value {
    tagged(IP, a.to_string())
}

fn cidr_value(p: Prefix) -> Value {
    tagged(CIDR, p.to_string())
}

/// The IP an argument holds (a value made by `ip()`, so its text parses).
fn ip_of(v: &Value) -> Option<Addr> {
    untag(v, IP).and_then(|s| parse_ip(s).ok())
}

fn cidr_of(v: &Value) -> Option<Prefix> {
    untag(v, CIDR).and_then(|s| parse_cidr(s).ok())
}

fn ip<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    let addr = parse_ip(string_at(&v, 0, "ip")?).map_err(|e| ExecutionError::function_error("ip", e))?;
    ret(ip_value(addr))
}

fn is_ip<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    ret(Value::Bool(parse_ip(string_at(&v, 0, "isIP")?).is_ok()))
}

/// `ip.isCanonical(s)`: whether `s` is written as Go writes the address (an error when it is
/// not an address Kubernetes takes).
fn is_canonical<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    const F: &str = "ip.isCanonical";
    let v = values(&args)?;
    let s = string_at(&v, 0, F)?;
    let addr = parse_ip(s).map_err(|e| ExecutionError::function_error(F, e))?;
    ret(Value::Bool(addr.to_string() == s))
}

/// A method of an IP.
fn ip_method<'b, 'v>(args: &[cel::common::value::CowVal<'b, 'v>], f: &str, m: fn(Addr) -> Value) -> Ret<'b, 'v> {
    let v = values(args)?;
    match v.first().and_then(ip_of) {
        Some(a) => ret(m(a)),
        None => Err(no_overload(f, &v)),
    }
}

fn family<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "family", |a| Value::Int(if matches!(a, Addr::V4(_)) { 4 } else { 6 }))
}

fn is_unspecified<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "isUnspecified", |a| Value::Bool(a.is_unspecified()))
}

fn is_loopback<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "isLoopback", |a| Value::Bool(a.is_loopback()))
}

fn is_link_local_multicast<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "isLinkLocalMulticast", |a| Value::Bool(a.is_link_local_multicast()))
}

fn is_link_local_unicast<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "isLinkLocalUnicast", |a| Value::Bool(a.is_link_local_unicast()))
}

fn is_global_unicast<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ip_method(&args, "isGlobalUnicast", |a| Value::Bool(a.is_global_unicast()))
}

fn cidr<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    // Kubernetes words the failure with its prefix twice (`stringToCIDR` wraps `parseCIDR`).
    let prefix = parse_cidr(string_at(&v, 0, "cidr")?).map_err(|e| {
        ExecutionError::function_error(
            "cidr",
            format!("network address parse error during conversion from string: {e}"),
        )
    })?;
    ret(cidr_value(prefix))
}

fn is_cidr<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    ret(Value::Bool(parse_cidr(string_at(&v, 0, "isCIDR")?).is_ok()))
}

/// A method of a CIDR: the CIDR and the other arguments.
fn cidr_method<'b, 'v>(
    args: &[cel::common::value::CowVal<'b, 'v>],
    f: &str,
    m: fn(Prefix, &[Value]) -> Result<Value, ExecutionError>,
) -> Ret<'b, 'v> {
    let v = values(args)?;
    match v.split_first() {
        Some((c, rest)) => match cidr_of(c) {
            Some(p) => ret(m(p, rest)?),
            None => Err(no_overload(f, &v)),
        },
        None => Err(no_overload(f, &v)),
    }
}

/// `containsIP(ip | string)`.
fn contains_ip<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    cidr_method(&args, "containsIP", |p, rest| {
        let addr = match rest.first() {
            Some(Value::String(s)) => parse_ip(s).map_err(|e| ExecutionError::function_error("containsIP", e))?,
            Some(other) => ip_of(other).ok_or_else(|| no_overload("containsIP", rest))?,
            None => return Err(no_overload("containsIP", rest)),
        };
        Ok(Value::Bool(p.contains(addr)))
    })
}

/// `containsCIDR(cidr | string)`.
fn contains_cidr<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    cidr_method(&args, "containsCIDR", |p, rest| {
        let other = match rest.first() {
            Some(Value::String(s)) => parse_cidr(s).map_err(|e| {
                ExecutionError::function_error(
                    "containsCIDR",
                    format!("network address parse error during conversion from string: {e}"),
                )
            })?,
            Some(other) => cidr_of(other).ok_or_else(|| no_overload("containsCIDR", rest))?,
            None => return Err(no_overload("containsCIDR", rest)),
        };
        Ok(Value::Bool(p.contains_prefix(other)))
    })
}

fn cidr_ip<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    cidr_method(&args, "ip", |p, _| Ok(ip_value(p.addr)))
}

fn masked<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    cidr_method(&args, "masked", |p, _| Ok(cidr_value(p.masked())))
}

fn prefix_length<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    cidr_method(&args, "prefixLength", |p, _| Ok(Value::Int(i64::from(p.bits))))
}

/// `string(ip)`, `string(cidr)`: the canonical text (the standard `string` overloads take the
/// other types; a map reaches this one).
fn to_string<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = values(&args)?;
    match v.first() {
        Some(x) if untag(x, IP).is_some() || untag(x, CIDR).is_some() => {
            ret(tagged::str_value(untag(x, IP).or(untag(x, CIDR)).unwrap_or_default()))
        }
        _ => Err(no_overload("string", &v)),
    }
}

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || vec![STRING_TYPE];
    env.add_overload("ip", "string_to_ip", s(), ip)?;
    env.add_overload("isIP", "is_ip", s(), is_ip)?;
    env.add_overload("ip.isCanonical", "ip_is_canonical", s(), is_canonical)?;
    env.add_member_overload("family", "ip_family", MAP_TYPE, vec![], family)?;
    env.add_member_overload("isUnspecified", "ip_is_unspecified", MAP_TYPE, vec![], is_unspecified)?;
    env.add_member_overload("isLoopback", "ip_is_loopback", MAP_TYPE, vec![], is_loopback)?;
    env.add_member_overload(
        "isLinkLocalMulticast",
        "ip_is_link_local_multicast",
        MAP_TYPE,
        vec![],
        is_link_local_multicast,
    )?;
    env.add_member_overload("isLinkLocalUnicast", "ip_is_link_local_unicast", MAP_TYPE, vec![], is_link_local_unicast)?;
    env.add_member_overload("isGlobalUnicast", "ip_is_global_unicast", MAP_TYPE, vec![], is_global_unicast)?;
    env.add_overload("cidr", "string_to_cidr", s(), cidr)?;
    env.add_overload("isCIDR", "is_cidr", s(), is_cidr)?;
    env.add_member_overload("containsIP", "cidr_contains_ip", MAP_TYPE, vec![DYN_TYPE], contains_ip)?;
    env.add_member_overload("containsCIDR", "cidr_contains_cidr", MAP_TYPE, vec![DYN_TYPE], contains_cidr)?;
    env.add_member_overload("ip", "cidr_ip", MAP_TYPE, vec![], cidr_ip)?;
    env.add_member_overload("masked", "cidr_masked", MAP_TYPE, vec![], masked)?;
    env.add_member_overload("prefixLength", "cidr_prefix_length", MAP_TYPE, vec![], prefix_length)?;
    env.add_overload("string", "ip_or_cidr_to_string", vec![MAP_TYPE], to_string)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Addr {
        match parse_addr(s) {
            Ok((a, None)) => a,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn addresses_print_in_gos_canonical_form() {
        for (input, canonical) in [
            ("127.0.0.1", "127.0.0.1"),
            ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:0:0:1:0:0:0:1", "2001:0:0:1::1"),
            ("0:0:0:0:0:0:0:0", "::"),
            ("1:0:0:0:0:0:0:0", "1::"),
            ("1:2:3:4:5:6:7:0", "1:2:3:4:5:6:7:0"),
            ("1:0:3:4:5:6:7:8", "1:0:3:4:5:6:7:8"),
            ("::1.2.3.4", "::102:304"),
            ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
            ("64:ff9b::192.0.2.33", "64:ff9b::c000:221"),
        ] {
            assert_eq!(addr(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn malformed_addresses_fail_with_gos_words() {
        for (input, msg) in [
            ("", r#"ParseAddr(""): unable to parse IP"#),
            ("%eth0", r#"ParseAddr("%eth0"): missing IPv6 address"#),
            ("01.2.3.4", r#"ParseAddr("01.2.3.4"): IPv4 field has octet with leading zero"#),
            ("256.1.1.1", r#"ParseAddr("256.1.1.1"): IPv4 field has value >255"#),
            ("1..2.3", r#"ParseAddr("1..2.3"): IPv4 field must have at least one digit (at ".2.3")"#),
            ("1.2.3.4.5", r#"ParseAddr("1.2.3.4.5"): IPv4 address too long"#),
            ("1.2.3", r#"ParseAddr("1.2.3"): IPv4 address too short"#),
            ("1.2.3.x", r#"ParseAddr("1.2.3.x"): unexpected character (at "x")"#),
            ("fe80::1%", r#"ParseAddr("fe80::1%"): zone must be a non-empty string"#),
            ("12345::", r#"ParseAddr("12345::"): each group must have 4 or less digits (at "12345::")"#),
            ("1:::2", r#"ParseAddr("1:::2"): each colon-separated field must have at least one digit (at ":2")"#),
            ("1::2::3", r#"ParseAddr("1::2::3"): multiple :: in address (at ":3")"#),
            ("1:2", r#"ParseAddr("1:2"): address string too short"#),
            ("1:2:3:4:5:6:7:8:9", r#"ParseAddr("1:2:3:4:5:6:7:8:9"): trailing garbage after address (at "9")"#),
            ("1:2:3:4::5:6:7:8", r#"ParseAddr("1:2:3:4::5:6:7:8"): the :: must expand to at least one field of zeros"#),
            (
                "1:2:3:1.2.3.4",
                r#"ParseAddr("1:2:3:1.2.3.4"): embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")"#,
            ),
            ("1:", r#"ParseAddr("1:"): colon must be followed by more characters (at ":")"#),
            ("1:2x", r#"ParseAddr("1:2x"): unexpected character, want colon (at "x")"#),
        ] {
            assert_eq!(parse_addr(input).map_err(|e| e.to_string()), Err(msg.to_string()), "{input}");
        }
        assert_eq!(parse_addr("fe80::1%eth0"), Ok((addr("fe80::1"), Some("eth0"))));
    }

    #[test]
    fn prefixes_contain_by_their_top_bits() {
        let p = |s: &str| parse_prefix(s).unwrap();
        assert!(p("10.0.0.1/8").contains(addr("10.255.0.1")));
        assert!(!p("10.0.0.0/8").contains(addr("11.0.0.0")));
        assert!(!p("::/0").contains(addr("1.2.3.4")));
        assert!(p("0.0.0.0/0").contains(addr("1.2.3.4")));
        assert!(p("10.0.0.0/8").contains_prefix(p("10.1.0.0/16")));
        assert!(!p("10.1.0.0/16").contains_prefix(p("10.0.0.0/8")));
        assert_eq!(p("10.1.2.3/12").masked().to_string(), "10.0.0.0/12");
        assert_eq!(p("2001:db8::1/128").masked().to_string(), "2001:db8::1/128");
        assert_eq!(p("1.2.3.4/0").masked().to_string(), "0.0.0.0/0");
    }
}
