//! Kyverno's `jwt.Decode(token, key)` (the authorization libraries): verifies a compact JWS
//! with a shared secret and returns `{Claims, Valid}`, `Valid` saying whether the time claims
//! (`exp`, `nbf`, `iat`) hold now.
//!
//! As in Kyverno, a string key is a symmetric key, so the token must be signed with HMAC
//! (`HS256`, `HS384`, `HS512`, taken from the token's header); a signature that does not verify
//! is an error, not an invalid token. Ours, on `ring`'s HMAC, because the JWT crates bring
//! their own crypto stacks for what is a few lines here. JWK sets (the second overload in
//! Kyverno) are not supported.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value as Json, json};

/// Upper bound on a token's length: a header value, not a document.
const MAX_TOKEN: usize = 64 * 1024;

/// Why a token did not decode or verify, in Kyverno's words where it has them.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("the token is longer than {MAX_TOKEN} bytes")]
    TooLong,
    #[error("failed to parse token: a JWS in compact form has three parts")]
    NotCompact,
    #[error("failed to decode the token's {what}: {source}")]
    Base64 { what: &'static str, source: base64::DecodeError },
    #[error("failed to parse the token's header: {0}")]
    Header(#[source] serde_json::Error),
    /// The header names no algorithm a secret key verifies (`None`: it names none).
    #[error(
        "could not verify message using any of the signatures or keys: a secret key verifies HS256, HS384 or HS512, not {}",
        .0.as_deref().unwrap_or("a token without alg")
    )]
    Algorithm(Option<String>),
    #[error("could not verify message using any of the signatures or keys")]
    Signature,
    #[error("failed to parse the token's claims: {0}")]
    Claims(#[source] serde_json::Error),
    #[error("failed to parse the token's claims: not a JSON object")]
    ClaimsNotObject,
}

fn part(s: &str, what: &'static str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).map_err(|source| JwtError::Base64 { what, source })
}

/// Decodes and verifies `token` with the secret `key`; `now` is the Unix time the time claims
/// are checked against.
pub fn decode(token: &str, key: &str, now: i64) -> Result<Json, JwtError> {
    if token.len() > MAX_TOKEN {
        return Err(JwtError::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(JwtError::NotCompact);
    };
    let header: Json = serde_json::from_slice(&part(h, "header")?).map_err(JwtError::Header)?;
    let alg = match header.get("alg").and_then(Json::as_str) {
        Some("HS256") => ring::hmac::HMAC_SHA256,
        Some("HS384") => ring::hmac::HMAC_SHA384,
        Some("HS512") => ring::hmac::HMAC_SHA512,
        other => return Err(JwtError::Algorithm(other.map(str::to_string))),
    };
    let signed = token.len() - sig.len() - 1;
    let k = ring::hmac::Key::new(alg, key.as_bytes());
    ring::hmac::verify(&k, token.as_bytes().get(..signed).unwrap_or_default(), &part(sig, "signature")?)
        .map_err(|_| JwtError::Signature)?;
    let claims: Json = serde_json::from_slice(&part(p, "payload")?).map_err(JwtError::Claims)?;
    let Json::Object(claims) = claims else {
        return Err(JwtError::ClaimsNotObject);
    };
    let time = |k: &str| claims.get(k).and_then(Json::as_f64).map(|t| t as i64);
    let valid = time("exp").is_none_or(|exp| now < exp)
        && time("nbf").is_none_or(|nbf| now >= nbf)
        && time("iat").is_none_or(|iat| iat <= now);
    let claims = if claims.is_empty() { Json::Null } else { Json::Object(claims) };
    Ok(json!({"Claims": claims, "Valid": valid}))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sign(claims: &Json, alg: &str, key: &str) -> String {
        let h = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&json!({"alg": alg, "typ": "JWT"})).unwrap());
        let p = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap());
        let a = match alg {
            "HS384" => ring::hmac::HMAC_SHA384,
            "HS512" => ring::hmac::HMAC_SHA512,
            _ => ring::hmac::HMAC_SHA256,
        };
        let s = ring::hmac::sign(&ring::hmac::Key::new(a, key.as_bytes()), format!("{h}.{p}").as_bytes());
        format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(s.as_ref()))
    }

    #[test]
    fn tokens_verify_with_their_secret_and_report_their_time_window() {
        let now = 1_800_000_000;
        for alg in ["HS256", "HS384", "HS512"] {
            let t = sign(&json!({"role": "admin", "exp": now + 60, "nbf": now - 60}), alg, "secret");
            let d = decode(&t, "secret", now).unwrap();
            assert_eq!(d["Valid"], true, "{alg}");
            assert_eq!(d["Claims"]["role"], "admin");
            assert!(decode(&t, "other", now).unwrap_err().to_string().contains("could not verify"));
        }
        let expired = sign(&json!({"exp": now - 1}), "HS256", "k");
        assert_eq!(decode(&expired, "k", now).unwrap()["Valid"], false);
        let early = sign(&json!({"nbf": now + 10}), "HS256", "k");
        assert_eq!(decode(&early, "k", now).unwrap()["Valid"], false);
        let tampered = {
            let t = sign(&json!({"role": "guest"}), "HS256", "k");
            let forged = URL_SAFE_NO_PAD.encode(br#"{"role":"admin"}"#);
            let p: Vec<&str> = t.split('.').collect();
            format!("{}.{forged}.{}", p[0], p[2])
        };
        assert!(decode(&tampered, "k", now).is_err());
        assert!(decode("not-a-token", "k", now).unwrap_err().to_string().contains("three parts"));
        let none = format!("{}.{}.", URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#), URL_SAFE_NO_PAD.encode(b"{}"));
        assert!(decode(&none, "k", now).unwrap_err().to_string().contains("not none"));
    }
}
