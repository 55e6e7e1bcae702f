//! The bus's secrets: `--publish-token`, `--jwt-secret` and
//! `--redis-secret`. Each may come from an environment variable instead
//! (`NOTIFY_BUS_PUBLISH_TOKEN`, `NOTIFY_BUS_JWT_SECRET`,
//! `NOTIFY_BUS_REDIS_SECRET`), so that it does not show in `ps` or in a
//! shell's history. They are checked here, after parsing, rather than by
//! clap's value parsers: a refused value is then never echoed to the
//! terminal, and a secret that cannot be used at all (`--redis-secret`
//! without Redis) is named before one that is merely too short.

/// The fewest characters a secret may have: shorter ones are guessable.
pub const MIN_LEN: usize = 16;

/// One secret as given: its flag, its environment variable, its value.
pub struct Secret<'a> {
    pub flag: &'static str,
    pub env: &'static str,
    pub value: Option<&'a str>,
}

/// Why the secrets given cannot be used, naming the flag, its variable and
/// the fix; `bridged` says whether `--redis` or `--redis-cluster` was given.
pub fn check(secrets: &[Secret<'_>], bridged: bool) -> Result<(), String> {
    for secret in secrets {
        if secret.flag == "--redis-secret" && secret.value.is_some() && !bridged {
            return Err(format!(
                "{} (or {}) needs --redis or --redis-cluster: it signs what the nodes \
                 share through Redis",
                secret.flag, secret.env
            ));
        }
    }
    for secret in secrets {
        if secret
            .value
            .is_some_and(|value| value.chars().count() < MIN_LEN)
        {
            return Err(format!(
                "{} (or {}) must be at least {MIN_LEN} characters (32 random ones is \
                 plenty: `openssl rand -hex 16` makes them)",
                secret.flag, secret.env
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given<'a>(flag: &'static str, value: &'a str) -> Secret<'a> {
        Secret {
            flag,
            env: "NOTIFY_BUS_X",
            value: Some(value),
        }
    }

    #[test]
    fn a_redis_secret_without_redis_is_named_before_its_length() {
        let why = check(&[given("--redis-secret", "short")], false).unwrap_err();
        assert!(why.contains("needs --redis"), "{why}");
        let why = check(&[given("--redis-secret", "short")], true).unwrap_err();
        assert!(why.contains("at least 16 characters"), "{why}");
        assert!(check(&[given("--redis-secret", "0123456789abcdef")], true).is_ok());
    }

    #[test]
    fn short_secrets_are_refused_without_showing_them() {
        let why = check(&[given("--publish-token", "T")], false).unwrap_err();
        assert!(why.contains("--publish-token (or NOTIFY_BUS_X)"), "{why}");
        assert!(!why.contains("'T'"), "{why}");
        let none = Secret {
            flag: "--jwt-secret",
            env: "NOTIFY_BUS_JWT_SECRET",
            value: None,
        };
        assert!(check(&[none], false).is_ok());
    }
}
