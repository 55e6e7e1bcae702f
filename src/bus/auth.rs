//! Who may publish and subscribe: the publish token, and subscribers'
//! JWTs with the topics they grant and their expiry.
//!
//! A subscriber's token is HS256 with the bus's secret; its claims are
//! `exp` (required, whole seconds since the epoch, at most
//! [`MAX_LIFETIME`] ahead: a token that never expires is no token), an
//! optional `nbf`, and `topics`, the topics it may join (`"news"`;
//! `"news.*"` for every topic starting with `news.`; `"*"` for all).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::connection::conn::Conn;
use crate::connection::handler::HttpResponse;
use crate::jwt;
use crate::proto::{CloseCode, truncate_reason};

/// What a subscriber's token lets it do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    topics: Vec<String>,
    /// Seconds since the epoch.
    expires: u64,
}

impl Grant {
    /// The grant as JSON, for a connection handed to the next process.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::json!({ "topics": self.topics, "expires": self.expires })
    }

    /// A grant [`Grant::to_json`] made; `None` if it is not one.
    pub(crate) fn from_json(value: &Value) -> Option<Grant> {
        let topics = value["topics"]
            .as_array()?
            .iter()
            .map(|t| t.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?;
        let expires = value["expires"].as_u64()?;
        Some(Grant { topics, expires })
    }

    /// Whether the token names `topic` (exactly, by a `prefix*`, or `*`).
    pub(crate) fn allows(&self, topic: &str) -> bool {
        self.topics
            .iter()
            .any(|allowed| match allowed.strip_suffix('*') {
                Some(prefix) => topic.starts_with(prefix),
                None => allowed == topic,
            })
    }
}

/// The longest a token may still be valid for: one whose `exp` is further
/// away is refused (an `exp` of 2^64 - 1 would never close its connection).
pub const MAX_LIFETIME: Duration = Duration::from_secs(366 * 24 * 3600);

/// Checks subscribers' tokens, and closes connections whose token expired.
pub(crate) struct Tokens {
    secret: Vec<u8>,
    expiry: Arc<Expiry>,
}

impl Tokens {
    /// Checks tokens signed with `secret`; starts the thread that closes
    /// connections whose token expired (it ends with the `Tokens`).
    pub(crate) fn new(secret: &[u8]) -> Tokens {
        let expiry = Arc::new(Expiry::default());
        let watched = Arc::downgrade(&expiry);
        std::thread::Builder::new()
            .name("bus-token-expiry".into())
            .spawn(move || Expiry::run(&watched))
            .expect("a thread for token expiry");
        Tokens {
            secret: secret.to_vec(),
            expiry,
        }
    }

    /// The grant of a valid token, or why it is refused (one line that
    /// fits a close reason).
    pub(crate) fn check(&self, token: &str) -> Result<Grant, String> {
        let claims = jwt::verify(&self.secret, token)?;
        let now = unix_now();
        let expires = match claims.get("exp") {
            None | Some(Value::Null) => return Err("token not valid: no \"exp\" claim".into()),
            Some(exp) => exp
                .as_u64()
                .ok_or("token not valid: \"exp\" is not a whole number of seconds")?,
        };
        if expires <= now {
            return Err("token expired".into());
        }
        if expires - now > MAX_LIFETIME.as_secs() {
            return Err("token not valid: \"exp\" is more than a year away".into());
        }
        match claims.get("nbf") {
            None | Some(Value::Null) => {}
            Some(nbf) => match nbf.as_u64() {
                Some(nbf) if nbf <= now => {}
                Some(_) => return Err("token not valid yet (\"nbf\" is still to come)".into()),
                None => {
                    return Err("token not valid: \"nbf\" is not a whole number of seconds".into());
                }
            },
        }
        let topics = match claims.get("topics") {
            Some(Value::Array(topics)) => topics
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or("token not valid: \"topics\" holds something other than strings")?,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err("token not valid: \"topics\" is not a list of strings".into()),
        };
        Ok(Grant { topics, expires })
    }

    /// Closes `conn` with 1008 once `grant` expires (replacing any earlier
    /// grant of the connection's).
    pub(crate) fn watch(&self, conn: &Conn, grant: &Grant, earlier: Option<&Grant>) {
        let mut due = self.expiry.lock();
        if let Some(earlier) = earlier {
            due.remove(&(earlier.expires, conn.id()));
        }
        due.insert((grant.expires, conn.id()), conn.clone());
    }

    /// The connection ended: nothing to close any more.
    pub(crate) fn forget(&self, conn: &Conn, grant: &Grant) {
        self.expiry.lock().remove(&(grant.expires, conn.id()));
    }
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

    /// Every tenth of a second, closes the connections whose token expired;
    /// ends when the tokens are dropped.
    fn run(watched: &Weak<Expiry>) {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let Some(expiry) = watched.upgrade() else {
                return;
            };
            let now = unix_now();
            let expired: Vec<Conn> = {
                let mut due = expiry.lock();
                let later = due.split_off(&(now, 0));
                std::mem::replace(&mut *due, later).into_values().collect()
            };
            drop(expiry);
            for conn in expired {
                let _ = conn.close(CloseCode::POLICY_VIOLATION, "token expired");
            }
        }
    }
}

/// Seconds since the epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// The bearer token a publish needs (and, unless the counters are open,
/// `/stats` and `/topics/<t>`).
pub(crate) struct PublishToken(pub(crate) String);

impl PublishToken {
    /// `None` if `authorization` (the header's value) carries the token,
    /// else the 401 to answer (`what` needs it: "publishing", say).
    pub(crate) fn refuse(&self, authorization: Option<&[u8]>, what: &str) -> Option<HttpResponse> {
        let presented = authorization.and_then(|value| value.strip_prefix(b"Bearer "));
        let (challenge, why) = match presented {
            None => (
                "Bearer realm=\"bus\"",
                format!("{what} needs Authorization: Bearer <token> (the bus's publish token)\n"),
            ),
            Some(token) if same(token, self.0.as_bytes()) => return None,
            Some(_) => (
                "Bearer realm=\"bus\", error=\"invalid_token\"",
                "the bearer token is not the bus's publish token\n".to_owned(),
            ),
        };
        Some(HttpResponse::text(401, why).header("WWW-Authenticate", challenge))
    }
}

/// A refusal's reason cut to what a close frame holds.
pub(crate) fn close_reason(why: &str) -> &str {
    truncate_reason(why)
}

/// Compares without stopping at the first difference, so that the time
/// taken does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
#[path = "auth/tests.rs"]
mod tests;
