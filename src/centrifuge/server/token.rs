//! Connection tokens: JWTs signed with HS256 and the server's secret, as
//! Centrifugo takes them: `sub` is the user, `exp` (Unix seconds) when the
//! connection expires unless refreshed, `info` JSON every publication of
//! the client's carries; a subscription token also names its `channel`.
//! Any other algorithm (`none` above all) is refused.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What a valid token grants (the default: an anonymous connection).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Claims {
    pub(super) user: String,
    /// Unix seconds; 0: never expires.
    pub(super) expires_at: u64,
    pub(super) info: Bytes,
    /// A subscription token's channel (empty in a connection token).
    pub(super) channel: String,
}

/// Why a token is not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TokenError {
    /// Malformed, not HS256, or not signed with the secret.
    Invalid,
    /// Valid, but past its `exp`.
    Expired,
}

#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(default)]
    sub: String,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default, borrow)]
    info: Option<&'a RawValue>,
    #[serde(default)]
    channel: String,
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks `token` against `secret` at `now` (Unix seconds).
pub(super) fn verify(token: &str, secret: &[u8], now: u64) -> Result<Claims, TokenError> {
    let payload = crate::jwt::verified_claims(secret, token).map_err(|_| TokenError::Invalid)?;
    let payload: Payload<'_> = serde_json::from_slice(&payload).map_err(|_| TokenError::Invalid)?;
    let expires_at = payload.exp.unwrap_or(0);
    if expires_at != 0 && expires_at <= now {
        return Err(TokenError::Expired);
    }
    let info = payload.info.map_or_else(Bytes::new, |raw| {
        Bytes::copy_from_slice(raw.get().as_bytes())
    });
    Ok(Claims {
        user: payload.sub,
        expires_at,
        info,
        channel: payload.channel,
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use hmac::{Hmac, KeyInit, Mac};
    use sha2::Sha256;

    use super::*;

    fn sign(header: &str, payload: &str, secret: &[u8]) -> String {
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).unwrap();
        mac.update(signed.as_bytes());
        format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn tokens() {
        let hs = r#"{"alg":"HS256","typ":"JWT"}"#;
        let token = sign(hs, r#"{"sub":"alice","exp":200,"info":{"n":1}}"#, b"s");
        let claims = verify(&token, b"s", 100).unwrap();
        assert_eq!(
            (claims.user.as_str(), claims.expires_at, &claims.info[..]),
            ("alice", 200, &br#"{"n":1}"#[..])
        );
        assert_eq!(verify(&token, b"s", 200), Err(TokenError::Expired));
        assert_eq!(verify(&token, b"other", 100), Err(TokenError::Invalid));
        let forever = sign(hs, r#"{"sub":""}"#, b"s");
        assert_eq!(verify(&forever, b"s", u64::MAX).unwrap().expires_at, 0);
        // Another algorithm, a signature cut, a part too many, not base64.
        let none = sign(r#"{"alg":"none"}"#, r#"{"sub":"a"}"#, b"s");
        assert_eq!(verify(&none, b"s", 0), Err(TokenError::Invalid));
        assert_eq!(
            verify(&token[..token.len() - 2], b"s", 0),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            verify(&format!("{token}.x"), b"s", 0),
            Err(TokenError::Invalid)
        );
        assert_eq!(verify("a.b.c", b"s", 0), Err(TokenError::Invalid));
        assert_eq!(verify("", b"s", 0), Err(TokenError::Invalid));
        assert_eq!(
            verify(&"a".repeat(crate::jwt::MAX_TOKEN_LEN + 1), b"s", 0),
            Err(TokenError::Invalid)
        );
    }
}
