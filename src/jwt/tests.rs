use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use super::*;

const SECRET: &[u8] = b"0123456789abcdef0123";

/// A token made by another implementation (the `jsonwebtoken` crate).
fn theirs(header: Header, claims: &Value, secret: &[u8]) -> String {
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).unwrap()
}

#[test]
fn another_implementations_tokens_verify() {
    let claims = json!({"sub": "u1", "exp": 4_000_000_000u64, "topics": ["a"]});
    let token = theirs(Header::new(Algorithm::HS256), &claims, SECRET);
    let read = verify(SECRET, &token).unwrap();
    assert_eq!(Value::Object(read), claims);
    // And ours are theirs to read.
    let ours = sign(SECRET, &claims);
    let mut validation = jsonwebtoken::Validation::new(Algorithm::HS256);
    validation.validate_exp = false;
    validation.set_required_spec_claims::<&str>(&[]);
    let key = jsonwebtoken::DecodingKey::from_secret(SECRET);
    let data = jsonwebtoken::decode::<Value>(&ours, &key, &validation).unwrap();
    assert_eq!(data.claims, claims);
}

#[test]
fn a_token_of_another_key_or_algorithm_is_refused() {
    let claims = json!({"exp": 4_000_000_000u64});
    let other = theirs(
        Header::new(Algorithm::HS256),
        &claims,
        b"another secret, long enough",
    );
    assert_eq!(
        verify(SECRET, &other).unwrap_err(),
        "token not valid: not signed with this server's key"
    );
    let hs384 = theirs(Header::new(Algorithm::HS384), &claims, SECRET);
    assert_eq!(
        verify(SECRET, &hs384).unwrap_err(),
        "token not valid: HS256 only"
    );
    // "none", with the signature cut off.
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!(
        "{}.{}.",
        engine.encode(br#"{"alg":"none"}"#),
        engine.encode(claims.to_string())
    );
    assert_eq!(
        verify(SECRET, &none).unwrap_err(),
        "token not valid: HS256 only"
    );
    let mut crit = Header::new(Algorithm::HS256);
    crit.crit = Some(vec!["exp".into()]);
    let crit = theirs(crit, &claims, SECRET);
    assert!(verify(SECRET, &crit).unwrap_err().contains("crit"));
}

#[test]
fn a_changed_byte_anywhere_is_refused() {
    let token = sign(SECRET, &json!({"exp": 4_000_000_000u64, "topics": ["*"]}));
    for at in 0..token.len() {
        let mut bytes = token.clone().into_bytes();
        bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(bytes).unwrap();
        if changed != token {
            assert!(verify(SECRET, &changed).is_err(), "byte {at}");
        }
    }
}

#[test]
fn what_is_not_a_token_is_refused_in_a_line() {
    for bad in [
        "",
        ".",
        "..",
        "a.b.c",
        "a.b.c.d",
        &"x".repeat(MAX_TOKEN_LEN + 1),
    ] {
        let why = verify(SECRET, bad).unwrap_err();
        assert!(
            why.len() <= 123 && why.starts_with("token not valid"),
            "{why}"
        );
    }
}
