//! JSON Web Tokens signed with a shared secret (RFC 7519, HS256 only), for
//! the bus's subscribers and Centrifugo's connections: the signature
//! checked in constant time, the claims handed back. What the claims mean
//! (`exp`, `nbf`, a grant) is the caller's.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
#[cfg(feature = "bus")]
use serde_json::Map;
use serde_json::Value;
use sha2::Sha256;

/// The longest token read: a header and claims of a few hundred bytes are
/// usual, and what is refused unread costs nothing.
pub(crate) const MAX_TOKEN_LEN: usize = 8 << 10;

/// The claims part, decoded, of a token signed with `secret` with HS256;
/// or why it is refused (one short line: a close reason holds 123 bytes).
/// A header that lists `crit` extensions is refused (RFC 7515, 4.1.11: a
/// recipient must refuse the ones it does not understand, and none is
/// understood here), and so is any algorithm but HS256 (`none` above all).
pub(crate) fn verified_claims(secret: &[u8], token: &str) -> Result<Vec<u8>, &'static str> {
    const UNREADABLE: &str = "token not valid: not a JWT this server reads";
    if token.len() > MAX_TOKEN_LEN {
        return Err("token not valid: longer than 8 KiB");
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(UNREADABLE);
    };
    let Some(Value::Object(head)) = decode(header).and_then(|h| serde_json::from_slice(&h).ok())
    else {
        return Err(UNREADABLE);
    };
    if head.contains_key("crit") {
        return Err("token not valid: its header lists crit extensions this server does not know");
    }
    if head.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err("token not valid: HS256 only");
    }
    let signature = decode(signature).ok_or(UNREADABLE)?;
    let signed = &token[..header.len() + 1 + claims.len()];
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(signed.as_bytes());
    if mac.verify_slice(&signature).is_err() {
        return Err("token not valid: not signed with this server's key");
    }
    decode(claims).ok_or(UNREADABLE)
}

/// The claims of a token signed with `secret` with HS256, as a JSON
/// object; or why it is refused ([`verified_claims`]).
#[cfg(feature = "bus")]
pub(crate) fn verify(secret: &[u8], token: &str) -> Result<Map<String, Value>, String> {
    let claims = verified_claims(secret, token)?;
    match serde_json::from_slice(&claims) {
        Ok(Value::Object(claims)) => Ok(claims),
        _ => Err("token not valid: not a JWT this server reads".into()),
    }
}

/// A token signed with `secret` (HS256) carrying `claims`, for the tests.
#[cfg(all(test, feature = "bus"))]
pub(crate) fn sign(secret: &[u8], claims: &Value) -> String {
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = engine.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = engine.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(signed.as_bytes());
    let signature = engine.encode(mac.finalize().into_bytes());
    format!("{signed}.{signature}")
}

/// One base64url (unpadded) part.
fn decode(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()
}

#[cfg(all(test, feature = "bus"))]
mod tests;
