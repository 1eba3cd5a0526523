//! Attestor entries as the registry port checks them: a `keys` entry holding several PEM keys
//! is one entry per key.

use verno_api::images::{Attestor, AttestorSet};

/// An entry whose `keys.publicKeys` holds several PEM keys becomes one entry per key (the
/// set's count then applies across them), as Kyverno's `ExpandStaticKeys`.
pub(crate) fn expand_keys(set: &AttestorSet) -> Vec<Attestor> {
    let mut out = Vec::with_capacity(set.entries.len());
    for e in &set.entries {
        let Some(k) = &e.keys else {
            out.push(e.clone());
            continue;
        };
        let keys = split_pems(&k.public_keys);
        if keys.len() <= 1 {
            out.push(e.clone());
            continue;
        }
        for key in keys {
            let mut one = e.clone();
            if let Some(kk) = one.keys.as_mut() {
                kk.public_keys = key;
            }
            out.push(one);
        }
    }
    out
}

fn split_pems(s: &str) -> Vec<String> {
    const END: &str = "-----END PUBLIC KEY-----";
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find(END) {
        let (head, tail) = rest.split_at(i + END.len());
        let key = head.trim();
        if !key.is_empty() {
            out.push(key.to_string());
        }
        rest = tail;
    }
    if out.is_empty() {
        out.push(s.to_string());
    }
    out
}
