//! Who may publish and subscribe: `--publish-token` and `--jwt-secret`.
//!
//! - With `--publish-token T`, `POST /publish...` needs `Authorization:
//!   Bearer T`; without it, or with another token, the answer is 401 with a
//!   `WWW-Authenticate: Bearer` challenge and a reason.
//! - With `--jwt-secret S`, a subscriber presents a JWT signed with S
//!   (HS256), in the `token` query parameter of the upgrade or as a text
//!   message `token:<jwt>` (the first, or any later one to refresh it). Its
//!   claims: `exp` (required, seconds since the epoch) and `topics`, the
//!   topics it may join (`"news"`; `"news.*"` for every topic starting
//!   with `news.`; `"*"` for all). A topic outside them is refused with
//!   `error: not allowed`; a token that is not valid (signed with another
//!   key, malformed, another algorithm) or has expired is refused at the
//!   upgrade with 401 and the reason, or, sent as a message, closes the
//!   connection with 1008 and the reason; and when the token's `exp`
//!   passes, the connection is closed with 1008, `token expired` (unless a
//!   fresh token came first). `exp` is a whole number of seconds at most
//!   `MAX_LIFETIME` ahead (a token that never expires is no token); a token
//!   with an `nbf` still to come is refused ("not valid yet"), and so is
//!   one whose header lists `crit` extensions (none is understood here, and
//!   RFC 7515 says such a token must be refused).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rapidws::rapidws_core::proto::truncate_reason;
use rapidws::{CloseCode, Conn, HttpResponse, Request};

/// What a subscriber's token lets it do.
#[derive(Clone, Debug)]
pub struct Grant {
    topics: Vec<String>,
    /// Seconds since the epoch.
    expires: u64,
}

impl Grant {
    /// The grant as JSON, for a connection handed to the next process.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "topics": self.topics, "expires": self.expires })
    }

    /// A grant [`Grant::to_json`] made; `None` if it is not one.
    pub fn from_json(value: &serde_json::Value) -> Option<Grant> {
        let topics = value["topics"]
            .as_array()?
            .iter()
            .map(|t| t.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?;
        let expires = value["expires"].as_u64()?;
        Some(Grant { topics, expires })
    }

    /// Whether the token names `topic` (exactly, by a `prefix*`, or `*`).
    pub fn allows(&self, topic: &str) -> bool {
        self.topics
            .iter()
            .any(|allowed| match allowed.strip_suffix('*') {
                Some(prefix) => topic.starts_with(prefix),
                None => allowed == topic,
            })
    }
}

/// `--jwt-secret`: checks subscribers' tokens and closes connections whose
/// token expires.
pub struct Tokens {
    key: DecodingKey,
    validation: Validation,
    expiry: Arc<Expiry>,
}

impl Tokens {
    /// Checks tokens signed with `secret`; starts the thread that closes
    /// connections whose token expired.
    pub fn new(secret: &str) -> Tokens {
        let mut validation = Validation::new(Algorithm::HS256);
        // `exp` and `nbf` are read here (`Tokens::check`), exactly: the
        // library's reading calls a huge or negative `exp` missing.
        validation.leeway = 0;
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.set_required_spec_claims::<&str>(&[]);
        let expiry = Arc::new(Expiry::default());
        let closer = expiry.clone();
        std::thread::Builder::new()
            .name("token-expiry".into())
            .spawn(move || closer.run())
            .expect("a thread for token expiry");
        Tokens {
            key: DecodingKey::from_secret(secret.as_bytes()),
            validation,
            expiry,
        }
    }

    /// The grant of a valid token, or why it is refused (one line).
    pub fn check(&self, token: &str) -> Result<Grant, String> {
        if has_crit(token) {
            return Err(
                "token not valid: its header lists crit extensions this server does not know"
                    .into(),
            );
        }
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &self.key, &self.validation)
            .map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => "token expired".to_owned(),
                ErrorKind::InvalidSignature => {
                    "token not valid: not signed with this server's key".to_owned()
                }
                ErrorKind::InvalidAlgorithm => "token not valid: HS256 only".to_owned(),
                ErrorKind::MissingRequiredClaim(claim) => {
                    format!("token not valid: no \"{claim}\" claim")
                }
                // The library's own words can be long (a close reason
                // holds 123 bytes) and name what the sender chose: a
                // short, fixed reason, the details in the log.
                _ => {
                    tracing::debug!(%error, "token refused");
                    "token not valid: not a JWT this server reads".to_owned()
                }
            })
            .map_err(|why| truncate_reason(&why).to_owned())?;
        let claims = data.claims;
        let now = unix_now();
        let expires = match &claims["exp"] {
            serde_json::Value::Null => return Err("token not valid: no \"exp\" claim".into()),
            exp => exp
                .as_u64()
                .ok_or("token not valid: \"exp\" is not a whole number of seconds")?,
        };
        if expires <= now {
            return Err("token expired".into());
        }
        if expires - now > MAX_LIFETIME.as_secs() {
            return Err("token not valid: \"exp\" is more than a year away".into());
        }
        match &claims["nbf"] {
            serde_json::Value::Null => {}
            nbf => match nbf.as_u64() {
                Some(nbf) if nbf <= now => {}
                Some(_) => return Err("token not valid yet (\"nbf\" is still to come)".into()),
                None => {
                    return Err("token not valid: \"nbf\" is not a whole number of seconds".into());
                }
            },
        }
        let topics = match &claims["topics"] {
            serde_json::Value::Array(topics) => topics
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or("token not valid: \"topics\" holds something other than strings")?,
            serde_json::Value::Null => Vec::new(),
            _ => return Err("token not valid: \"topics\" is not a list of strings".into()),
        };
        Ok(Grant { topics, expires })
    }

    /// Closes `conn` with 1008 once `grant` expires (replacing any earlier
    /// grant of the connection's).
    pub fn watch(&self, conn: &Conn, grant: &Grant, earlier: Option<&Grant>) {
        let mut due = self.expiry.lock();
        if let Some(earlier) = earlier {
            due.remove(&(earlier.expires, conn.id()));
        }
        due.insert((grant.expires, conn.id()), conn.clone());
    }

    /// The connection ended: nothing to close any more.
    pub fn forget(&self, conn: &Conn, grant: &Grant) {
        self.expiry.lock().remove(&(grant.expires, conn.id()));
    }
}

/// The longest a token may still be valid for: one whose `exp` is further
/// away is refused (an `exp` of 2^64 - 1 would never close its connection).
pub const MAX_LIFETIME: Duration = Duration::from_secs(366 * 24 * 3600);

/// Whether a token's header names `crit` extensions (RFC 7515, 4.1.11: a
/// recipient that does not understand them must refuse the token; this
/// server understands none). A header that does not read is left to the
/// JWT library to refuse.
fn has_crit(token: &str) -> bool {
    jsonwebtoken::decode_header(token).is_ok_and(|header| header.crit.is_some())
}

/// Connections by when their token expires.
#[derive(Default)]
struct Expiry {
    due: Mutex<BTreeMap<(u64, u64), Conn>>,
}

impl Expiry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u64), Conn>> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every tenth of a second, closes the connections whose token expired.
    fn run(&self) {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = unix_now();
            let expired: Vec<Conn> = {
                let mut due = self.lock();
                let later = due.split_off(&(now, 0));
                std::mem::replace(&mut *due, later).into_values().collect()
            };
            for conn in expired {
                let _ = conn.close(CloseCode::POLICY_VIOLATION, "token expired");
            }
        }
    }
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// `--publish-token`: the bearer token a publish needs (and, unless
/// `--open-stats`, the bus's counters and topics' positions).
pub struct PublishToken(pub String);

impl PublishToken {
    /// `None` if `request` carries the token, else the 401 to answer
    /// (`what` needs it: "publishing", say).
    pub fn refuse(&self, request: &Request<'_>, what: &str) -> Option<HttpResponse> {
        let presented = request
            .header("authorization")
            .and_then(|value| value.strip_prefix(b"Bearer "));
        let (challenge, why) = match presented {
            None => (
                "Bearer realm=\"notify_bus\"",
                format!("{what} needs Authorization: Bearer <token> (the bus's --publish-token)\n"),
            ),
            Some(token) if same(token, self.0.as_bytes()) => return None,
            Some(_) => (
                "Bearer realm=\"notify_bus\", error=\"invalid_token\"",
                "the bearer token is not the bus's --publish-token\n".to_owned(),
            ),
        };
        Some(HttpResponse::text(401, why).header("WWW-Authenticate", challenge))
    }
}

/// Compares without stopping at the first difference, so that the time
/// taken does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
