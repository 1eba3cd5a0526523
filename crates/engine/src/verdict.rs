//! What an admission outcome tells people, in Kyverno's words: the denial message (yaml.v3
//! quoting included) and the PolicyViolation events' notes.

use crate::outcome::Status;
use crate::policy::CompiledPolicy;
use std::collections::BTreeMap;

/// The object a request is about, as an event's `related` / `regarding` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The object's uid; validating webhooks see it on CREATE too, since the API server
    /// assigns it (and a generated name) before validating admission.
    pub uid: String,
}

impl ResourceRef {
    /// `Kind namespace/name` (`Kind name` when cluster-scoped), as Kyverno's event notes name
    /// a resource.
    pub fn described(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }

    /// The object of an admission request (the old one on DELETE).
    pub fn of_request(req: &verno_api::AdmissionRequest) -> ResourceRef {
        ResourceRef {
            api_version: req.api_version(),
            kind: req.kind_name().to_string(),
            namespace: req.namespace_name().to_string(),
            name: req.object_name().to_string(),
            uid: req.object_uid().to_string(),
        }
    }
}

/// A validation rule that failed or errored, by policy index (see [`crate::Outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleViolation {
    pub policy: usize,
    pub rule: String,
    pub status: Status,
    pub message: String,
    /// The request was refused because of this rule.
    pub blocked: bool,
}

/// What a request leaves for the event writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A failed or errored rule: PolicyViolation events.
    Violation(Violation),
    /// A policy that failed no rule: PolicyApplied, or PolicySkipped for exceptions.
    Applied(Applied),
}

/// A policy that ran on a request and failed no rule, by policy index (see [`crate::Outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyApplied {
    pub policy: usize,
    /// Rules that PolicyExceptions made skip, with the exceptions (`namespace/name`); empty
    /// when every rule that ran passed.
    pub exempted: Vec<(String, Vec<String>)>,
}

/// A policy that ran on a request and failed no rule, as events need it: Kyverno's
/// `PolicyApplied` success event (only written when its ConfigMap says
/// `generateSuccessEvents`), or its `PolicySkipped` events when PolicyExceptions made rules
/// skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub policy_kind: verno_api::Kind,
    pub policy_name: String,
    /// Set for a namespaced policy.
    pub policy_namespace: Option<String>,
    /// A mutating policy (a MutatingPolicy, or a ClusterPolicy/Policy with mutate rules and no
    /// validate or verifyImages rule): Kyverno says "is successfully mutated" and
    /// `Resource Mutated` instead of "pass" and `Resource Passed`.
    pub mutated: bool,
    /// Rules that PolicyExceptions made skip, with the exceptions' `namespace/name`.
    pub exempted: Vec<(String, Vec<String>)>,
    pub resource: ResourceRef,
}

impl Applied {
    pub(crate) fn new(p: &CompiledPolicy, a: &PolicyApplied, resource: ResourceRef) -> Applied {
        let mutated = match p.kind {
            verno_api::Kind::MutatingPolicy | verno_api::Kind::NamespacedMutatingPolicy => true,
            verno_api::Kind::ClusterPolicy | verno_api::Kind::Policy => {
                let has = |t: crate::RuleType| p.rules.iter().any(|r| r.rule_type() == t);
                !has(crate::RuleType::Validation)
                    && !has(crate::RuleType::ImageVerify)
                    && has(crate::RuleType::Mutation)
            }
            _ => false,
        };
        Applied {
            policy_kind: p.kind,
            policy_name: p.name.clone(),
            policy_namespace: if p.kind.is_namespaced() { p.namespace.clone() } else { None },
            mutated,
            exempted: a.exempted.clone(),
            resource,
        }
    }

    /// The event action: `Resource Mutated` or `Resource Passed`.
    pub fn action(&self) -> &'static str {
        if self.mutated { "Resource Mutated" } else { "Resource Passed" }
    }

    /// The PolicyApplied note: `Pod ns/name: pass` or `Pod ns/name is successfully mutated`.
    pub fn applied_note(&self) -> String {
        let res = self.resource.described();
        if self.mutated { format!("{res} is successfully mutated") } else { format!("{res}: pass") }
    }

    /// `Kind/namespace/name` (`Kind/name` when cluster-scoped), as Kyverno keys resources in
    /// PolicySkipped notes.
    fn resource_key(&self) -> String {
        let r = &self.resource;
        if r.namespace.is_empty() {
            format!("{}/{}", r.kind, r.name)
        } else {
            format!("{}/{}/{}", r.kind, r.namespace, r.name)
        }
    }

    /// The PolicySkipped note on each exception: `resource Pod/ns/name was skipped from policy
    /// rule policy/rule` (`ns/policy/rule` for a namespaced policy).
    pub fn exception_note(&self, rule: &str) -> String {
        let policy = match &self.policy_namespace {
            Some(ns) => format!("{ns}/{}", self.policy_name),
            None => self.policy_name.clone(),
        };
        format!("resource {} was skipped from policy rule {policy}/{rule}", self.resource_key())
    }

    /// The PolicySkipped note on the policy: `resource Pod/ns/name was skipped from rule r due
    /// to policy exceptions ns/a, ns/b`.
    pub fn policy_skip_note(&self, rule: &str, exceptions: &[String]) -> String {
        format!(
            "resource {} was skipped from rule {rule} due to policy exceptions {}",
            self.resource_key(),
            exceptions.join(", ")
        )
    }
}

/// A rule that failed or errored during validation: what Kyverno turns into `PolicyViolation`
/// events (on the policy, and on the resource when the request went through). The engine
/// reports them; the in-cluster controller writes the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub policy_kind: verno_api::Kind,
    pub policy_name: String,
    /// Set for a namespaced policy.
    pub policy_namespace: Option<String>,
    pub rule: String,
    pub status: Status,
    pub message: String,
    /// The request was refused because of this rule.
    pub blocked: bool,
    pub resource: ResourceRef,
}

impl Violation {
    pub(crate) fn new(p: &CompiledPolicy, v: &RuleViolation, resource: ResourceRef) -> Violation {
        Violation {
            policy_kind: p.kind,
            policy_name: p.name.clone(),
            policy_namespace: if p.kind.is_namespaced() { p.namespace.clone() } else { None },
            rule: v.rule.clone(),
            status: v.status,
            message: v.message.clone(),
            blocked: v.blocked,
            resource,
        }
    }

    /// The note of the event on the policy: `Pod ns/name: [rule] fail (blocked); message`.
    pub fn policy_note(&self) -> String {
        let mut out = self.resource.described();
        out.push_str(&format!(": [{}] {}", self.rule, self.status.as_str()));
        if self.blocked {
            out.push_str(" (blocked)");
        }
        if !self.message.is_empty() {
            out.push_str("; ");
            out.push_str(&self.message);
        }
        out
    }

    /// The note of the event on the resource: `policy name/rule fail: message`.
    pub fn resource_note(&self) -> String {
        format!("policy {}/{} {}: {}", self.policy_name, self.rule, self.status.as_str(), self.message)
    }
}

/// Formats a string as a yaml.v3 scalar (the denial message is yaml.v3 output in Kyverno).
pub fn yaml_scalar(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_yaml_scalar(&mut out, text);
    out
}

/// [`yaml_scalar`], appended to `out`. Denial messages are written for every refused request
/// and run from a 20-byte rule name to kilobytes of message, so the bytes that decide the style
/// are found block by block (below); only a byte that occurs is looked at again, with `memchr`'s
/// searches. (A separate vectorized search for each, as before, cost ~700 instructions a
/// scalar, most of it the searches' setup.)
fn push_yaml_scalar(out: &mut String, text: &str) {
    let bytes = text.as_bytes();
    // Bit 0: a C0 control or DEL; 1: `:`; 2: `#`; 3: the lead byte `C2` of U+0080..U+00BF (the
    // C1 controls are `C2 80`..`C2 9F`); 4: `'`. A block of 32 bytes is first asked whether it
    // holds any of them at all (a branch-free fold, which becomes a few vector compares); most
    // hold none, and only the others are read byte by byte.
    fn flag(b: u8) -> u8 {
        u8::from(b < 0x20 || b == 0x7F)
            | (u8::from(b == b':') << 1)
            | (u8::from(b == b'#') << 2)
            | (u8::from(b == 0xC2) << 3)
            | (u8::from(b == b'\'') << 4)
    }
    fn any_flagged(block: &[u8; 32]) -> bool {
        block.iter().fold(false, |any, &b| any | (flag(b) != 0))
    }
    let mut blocks = bytes.chunks_exact(32);
    let mut seen = 0u8;
    for block in blocks.by_ref() {
        if <&[u8; 32]>::try_from(block).is_ok_and(any_flagged) {
            seen |= block.iter().fold(0, |seen, &b| seen | flag(b));
        }
    }
    seen |= blocks.remainder().iter().fold(0, |seen, &b| seen | flag(b));
    let control = seen & 1 != 0
        || (seen & 8 != 0 && memchr::memchr_iter(0xC2, bytes).any(|i| matches!(bytes.get(i + 1), Some(0x80..=0x9F))));
    // The words YAML reads as booleans or null are at most five letters long; a number
    // (`f64`'s syntax, with `inf` and `nan`) starts with a digit, a sign, a dot, `i` or `n`.
    let looks_typed = (text.len() <= 5
        && ["true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"]
            .iter()
            .any(|w| text.eq_ignore_ascii_case(w)))
        || (bytes.first().is_some_and(|b| b.is_ascii_digit() || b"+-.iInN".contains(b)) && text.parse::<f64>().is_ok());
    if control || looks_typed || text.is_empty() {
        out.push_str(&serde_json::to_string(text).unwrap_or_default());
        return;
    }
    let special_start = bytes.first().is_some_and(|b| b"-?:,[]{}#&*!|>'\"%@`".contains(b));
    let plain_ok = !special_start
        && !text.ends_with([' ', ':'])
        && !text.starts_with(' ')
        && (seen & 2 == 0 || memchr::memchr_iter(b':', bytes).all(|i| bytes.get(i + 1) != Some(&b' ')))
        && (seen & 4 == 0
            || memchr::memchr_iter(b'#', bytes).all(|i| i.checked_sub(1).and_then(|j| bytes.get(j)) != Some(&b' ')));
    if plain_ok {
        out.push_str(text);
    } else if seen & 16 == 0 {
        out.reserve(text.len() + 2);
        out.push('\'');
        out.push_str(text);
        out.push('\'');
    } else {
        out.push('\'');
        for (i, part) in text.split('\'').enumerate() {
            if i > 0 {
                out.push_str("''");
            }
            out.push_str(part);
        }
        out.push('\'');
    }
}

/// Kyverno's denial message: the blocked resource, then policy → rule → message as YAML.
pub fn blocked_message(
    kind: &str,
    namespace: &str,
    name: &str,
    failures: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    // Sized for the text without quoting (a quoted scalar adds a few bytes), so the message is
    // written without growing it several times.
    let body: usize = failures
        .iter()
        .map(|(p, rules)| p.len() + 2 + rules.iter().map(|(r, m)| r.len() + m.len() + 8).sum::<usize>())
        .sum();
    let mut out = String::with_capacity(80 + kind.len() + namespace.len() + name.len() + body);
    for part in ["\n\nresource ", kind, "/", namespace, "/", name, " was blocked due to the following policies \n\n"] {
        out.push_str(part);
    }
    for (policy, rules) in failures {
        push_yaml_scalar(&mut out, policy);
        out.push_str(":\n");
        for (rule, msg) in rules {
            out.push_str("  ");
            push_yaml_scalar(&mut out, rule);
            out.push_str(": ");
            push_yaml_scalar(&mut out, msg);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_scalars_are_quoted_as_yaml_v3_does() {
        assert_eq!(yaml_scalar("require-labels"), "require-labels");
        assert_eq!(yaml_scalar("validation error: x"), "'validation error: x'");
        assert_eq!(yaml_scalar("label 'app': required"), "'label ''app'': required'");
        assert_eq!(yaml_scalar("true"), "\"true\"");
        assert_eq!(yaml_scalar("a\nb"), "\"a\\nb\"");
        assert_eq!(yaml_scalar("-leading"), "'-leading'");
        assert_eq!(yaml_scalar("a # b"), "'a # b'");
        assert_eq!(yaml_scalar("a#b"), "a#b");
        assert_eq!(yaml_scalar("a:b"), "a:b");
        assert_eq!(yaml_scalar("ends:"), "'ends:'");
        assert_eq!(yaml_scalar("1.5e3"), "\"1.5e3\"");
        assert_eq!(yaml_scalar("inf"), "\"inf\"");
        assert_eq!(yaml_scalar("NaN"), "\"NaN\"");
        // A C1 control makes the scalar double-quoted (JSON leaves it unescaped).
        assert_eq!(yaml_scalar("x\u{85}y"), "\"x\u{85}y\"");
        // DEL and a tab are controls too; U+00A0 (`C2 A0`) is not a C1 control.
        assert_eq!(yaml_scalar("x\u{7f}y"), "\"x\u{7f}y\"");
        assert_eq!(yaml_scalar("a\tb"), "\"a\\tb\"");
        assert_eq!(yaml_scalar("a\u{a0}b"), "a\u{a0}b");
        assert_eq!(yaml_scalar("é: ü"), "'é: ü'");
        assert_eq!(yaml_scalar("it's"), "it's");
        assert_eq!(yaml_scalar("it's: 'x'"), "'it''s: ''x'''");
    }

    /// The searches decide the style as the plain rules say, on strings built from the bytes that
    /// matter in every order (a reference written straight from the rules, one search each).
    #[test]
    fn the_style_searches_decide_as_the_rules_say() {
        fn reference(text: &str) -> String {
            let control = text.chars().any(|c| c.is_control());
            let typed = ["true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"]
                .iter()
                .any(|w| text.eq_ignore_ascii_case(w))
                || (text.starts_with(|c: char| c.is_ascii_digit() || "+-.iInN".contains(c))
                    && text.parse::<f64>().is_ok());
            if control || typed || text.is_empty() {
                return serde_json::to_string(text).unwrap_or_default();
            }
            let special = text.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@`".contains(c));
            if special
                || text.contains(": ")
                || text.contains(" #")
                || text.ends_with([' ', ':'])
                || text.starts_with(' ')
            {
                format!("'{}'", text.replace('\'', "''"))
            } else {
                text.to_string()
            }
        }
        let pieces = ["a", ":", " ", "#", "'", "\u{85}", "\u{a0}", "\n", "\u{7f}", "x: y", "1", ""];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let text = format!("{a}{b}{c}");
                    assert_eq!(yaml_scalar(&text), reference(&text), "{text:?}");
                    // The same bytes inside and across the 32-byte blocks of a longer text.
                    for pad in [29, 31, 32, 33, 62] {
                        let long = format!("{}{text}{}", "p".repeat(pad), "s".repeat(40));
                        assert_eq!(yaml_scalar(&long), reference(&long), "{long:?}");
                        let tail = format!("{}{text}", "p".repeat(pad + 32));
                        assert_eq!(yaml_scalar(&tail), reference(&tail), "{tail:?}");
                    }
                }
            }
        }
    }
}
