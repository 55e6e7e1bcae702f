//! JSON Web Tokens signed with a shared secret (RFC 7519, HS256 only):
//! the signature checked in constant time, the claims handed back as JSON.
//! What the claims mean (`exp`, `nbf`, the grant) is the caller's.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

/// The longest token read: a header and claims of a few hundred bytes are
/// usual, and what is refused unread costs nothing.
pub(crate) const MAX_TOKEN_LEN: usize = 8 << 10;

/// The claims of a token signed with `secret` with HS256, or why it is
/// refused (one short line: a close reason holds 123 bytes).
pub(crate) fn verify(secret: &[u8], token: &str) -> Result<Map<String, Value>, String> {
    const UNREADABLE: &str = "token not valid: not a JWT this server reads";
    if token.len() > MAX_TOKEN_LEN {
        return Err("token not valid: longer than 8 KiB".into());
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(UNREADABLE.into());
    };
    let Some(Value::Object(head)) = decode_json(header) else {
        return Err(UNREADABLE.into());
    };
    // RFC 7515, 4.1.11: a recipient must refuse `crit` extensions it does
    // not understand, and none is understood here.
    if head.contains_key("crit") {
        return Err(
            "token not valid: its header lists crit extensions this server does not know".into(),
        );
    }
    if head.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err("token not valid: HS256 only".into());
    }
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| UNREADABLE.to_owned())?;
    let signed = &token[..header.len() + 1 + claims.len()];
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(signed.as_bytes());
    if mac.verify_slice(&signature).is_err() {
        return Err("token not valid: not signed with this server's key".into());
    }
    match decode_json(claims) {
        Some(Value::Object(claims)) => Ok(claims),
        _ => Err(UNREADABLE.into()),
    }
}

/// A token signed with `secret` (HS256) carrying `claims`, for the tests.
#[cfg(test)]
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

/// One base64url (unpadded) part as JSON.
fn decode_json(part: &str) -> Option<Value> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
#[path = "jwt/tests.rs"]
mod tests;
