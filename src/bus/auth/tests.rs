use serde_json::json;

use super::*;

const SECRET: &[u8] = b"0123456789abcdef";

#[test]
fn grants_name_topics_exactly_or_by_prefix() {
    let grant = Grant {
        topics: vec!["news".into(), "scores.*".into()],
        expires: 0,
    };
    assert!(grant.allows("news"));
    assert!(!grant.allows("news2"));
    assert!(grant.allows("scores.football"));
    assert!(!grant.allows("scores"));
    let all = Grant {
        topics: vec!["*".into()],
        expires: 0,
    };
    assert!(all.allows("anything"));
    assert_eq!(Grant::from_json(&grant.to_json()), Some(grant));
}

#[test]
fn claims_are_read_exactly() {
    let tokens = Tokens::new(SECRET);
    let now = unix_now();
    let token = |claims| jwt::sign(SECRET, &claims);
    let grant = tokens
        .check(&token(json!({"exp": now + 60, "topics": ["a", "b.*"]})))
        .unwrap();
    assert!(grant.allows("b.c") && !grant.allows("c"));
    let refused = [
        (json!({"topics": ["a"]}), "no \"exp\""),
        (json!({"exp": now - 1}), "token expired"),
        (json!({"exp": -5}), "not a whole number"),
        (json!({"exp": 1.5}), "not a whole number"),
        (json!({"exp": u64::MAX}), "more than a year away"),
        (json!({"exp": now + 60, "nbf": now + 30}), "not valid yet"),
        (json!({"exp": now + 60, "nbf": "soon"}), "\"nbf\" is not"),
        (json!({"exp": now + 60, "topics": "a"}), "not a list"),
        (
            json!({"exp": now + 60, "topics": [1]}),
            "other than strings",
        ),
    ];
    for (claims, why) in refused {
        let error = tokens.check(&token(claims.clone())).unwrap_err();
        assert!(error.contains(why), "{claims}: {error}");
    }
}

#[test]
fn the_publish_token_is_compared_whole() {
    assert!(same(b"abc", b"abc"));
    assert!(!same(b"abc", b"abd"));
    assert!(!same(b"abc", b"abcd"));
    let token = PublishToken("publish-token-0123456789".into());
    assert!(
        token
            .refuse(Some(b"Bearer publish-token-0123456789"), "publishing")
            .is_none()
    );
    for presented in [
        None,
        Some(&b"Bearer publish-token-012345678"[..]),
        Some(b"publish-token-0123456789"),
    ] {
        let refused = token.refuse(presented, "publishing").unwrap();
        assert_eq!(refused.status(), 401);
    }
}
