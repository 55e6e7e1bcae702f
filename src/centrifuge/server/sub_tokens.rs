//! Subscription tokens over a subscription's life, as Centrifugo keeps
//! them: what each one granted (when the subscription expires, the channel
//! info its client's publications carry), `sub_refresh` with a new one,
//! and the unsubscribe (2501, subscription expired) of a subscription not
//! refreshed within the grace. No timer of its own: every live client
//! answers the pinger's pings, and each frame it sends is checked against
//! its session's earliest deadline, so an expired subscription ends within
//! a ping interval past its grace.

use std::collections::HashMap;

use bytes::Bytes;

use super::session::{Checked, Close, reply, ttl_of};
use super::token::now_secs;
use super::{Centrifuge, Session};
use crate::centrifuge::messages::{Error, Push, PushBody, Reply, ReplyBody};
use crate::centrifuge::{disconnect, error, unsubscribe};
use crate::connection::conn::Conn;

/// What one channel's subscription token granted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// Unix seconds; 0: never.
    expires_at: u64,
    chan_info: Bytes,
}

/// A session's grants by channel (one at most for each of its
/// subscriptions, so bounded as they are), and the earliest expiry among
/// them: the one number a frame is checked against.
#[derive(Debug, Default)]
pub(super) struct Grants {
    by_channel: HashMap<String, Grant>,
    /// Unix seconds; 0: none expires.
    earliest: u64,
}

impl Grants {
    /// `channel`'s subscription expires at `expires_at` (0: never), its
    /// client's publications there carry `chan_info`.
    pub(super) fn set(&mut self, channel: &str, expires_at: u64, chan_info: Bytes) {
        if expires_at == 0 && chan_info.is_empty() {
            self.forget(channel);
            return;
        }
        let grant = Grant {
            expires_at,
            chan_info,
        };
        self.by_channel.insert(channel.to_owned(), grant);
        self.recompute();
    }

    /// `channel`'s subscription ended.
    pub(super) fn forget(&mut self, channel: &str) {
        if self.by_channel.remove(channel).is_some() {
            self.recompute();
        }
    }

    /// The channel info `channel`'s token gave (empty without one).
    pub(super) fn chan_info(&self, channel: &str) -> Bytes {
        self.by_channel
            .get(channel)
            .map_or_else(Bytes::new, |grant| grant.chan_info.clone())
    }

    /// Whether any subscription expires.
    fn expiring(&self) -> bool {
        self.earliest != 0
    }

    /// The channels whose subscriptions expired more than `grace` seconds
    /// before `now` (as Centrifugo counts: strictly more).
    fn expired(&self, now: u64, grace: u64) -> Vec<String> {
        let past = |expires_at: u64| expires_at != 0 && now > expires_at.saturating_add(grace);
        if !past(self.earliest) {
            return Vec::new();
        }
        self.by_channel
            .iter()
            .filter(|(_, grant)| past(grant.expires_at))
            .map(|(channel, _)| channel.clone())
            .collect()
    }

    fn recompute(&mut self) {
        self.earliest = self
            .by_channel
            .values()
            .map(|grant| grant.expires_at)
            .filter(|&at| at != 0)
            .min()
            .unwrap_or(0);
    }
}

impl Centrifuge {
    /// `sub_refresh`: a new token for a subscription, checked as
    /// Centrifugo checks it: one for another user or channel, or not
    /// signed with the secret, closes with 3500; an expired one is
    /// answered with 109; otherwise the reply says when it expires now.
    pub(super) fn sub_refresh(
        &self,
        conn: &Conn,
        session: &mut Session,
        id: u32,
        channel: String,
        token: String,
    ) -> Result<(), Close> {
        if channel.is_empty() {
            return Err(disconnect::BAD_REQUEST);
        }
        let body = if !session.channels.contains(&channel) {
            ReplyBody::Error(Error::new(error::PERMISSION_DENIED))
        } else if self.options.jwt_secret.is_none() {
            ReplyBody::Error(Error::new(error::NOT_AVAILABLE))
        } else if token.is_empty() {
            ReplyBody::Error(Error::new(error::BAD_REQUEST))
        } else {
            match self.check_token(&token) {
                Ok(claims) if claims.user == session.user && claims.channel == channel => {
                    session.grants.set(&channel, claims.expires_at, claims.info);
                    let (expires, ttl) = ttl_of(claims.expires_at);
                    ReplyBody::SubRefresh { expires, ttl }
                }
                Ok(_) => return Err(disconnect::INVALID_TOKEN),
                Err(Checked::Close(code)) => return Err(code),
                Err(Checked::Refuse(error)) => ReplyBody::Error(error),
            }
        };
        reply(conn, session.format, Reply { id, body });
        Ok(())
    }

    /// Ends the subscriptions whose tokens expired and were not refreshed
    /// within the grace, each with an unsubscribe push (2501); the
    /// connection stays.
    pub(super) fn expire_subscriptions(&self, conn: &Conn, session: &mut Session) {
        if !session.grants.expiring() {
            return;
        }
        let grace = self.options.expired_sub_grace.as_secs();
        for channel in session.grants.expired(now_secs(), grace) {
            // Its leave still carries the channel info; it forgets the
            // grant.
            if self.leave(conn, session, &channel) {
                let body = PushBody::unsubscribe(unsubscribe::EXPIRED);
                reply(conn, session.format, Reply::push(Push { channel, body }));
            } else {
                session.grants.forget(&channel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_expiry_follows_the_grants() {
        let mut grants = Grants::default();
        assert!(!grants.expiring());
        grants.set("a", 100, Bytes::new());
        grants.set("b", 50, Bytes::from_static(b"{}"));
        grants.set("c", 0, Bytes::from_static(b"{\"n\":1}"));
        assert_eq!(grants.earliest, 50);
        assert_eq!(grants.chan_info("c"), Bytes::from_static(b"{\"n\":1}"));
        assert_eq!(grants.chan_info("none"), Bytes::new());
        // Within the grace, and at its very end: kept.
        assert!(grants.expired(55, 5).is_empty());
        // Past it: "b" only; once it is forgotten, "a" is the earliest.
        assert_eq!(grants.expired(56, 5), ["b"]);
        grants.forget("b");
        assert_eq!(grants.earliest, 100);
        // A refresh moves it; one with no expiry and no info forgets it.
        grants.set("a", 200, Bytes::new());
        assert_eq!(grants.earliest, 200);
        grants.set("a", 0, Bytes::new());
        assert!(!grants.expiring());
        assert_eq!(grants.by_channel.len(), 1);
        // "c" never expires.
        assert!(grants.expired(u64::MAX, 0).is_empty());
        grants.forget("c");
        assert!(grants.by_channel.is_empty());
    }

    #[test]
    fn every_expired_one_goes_at_once() {
        let mut grants = Grants::default();
        for (n, channel) in ["x", "y", "z"].into_iter().enumerate() {
            grants.set(channel, 10 + n as u64, Bytes::new());
        }
        let mut gone = grants.expired(12, 0);
        gone.sort();
        assert_eq!(gone, ["x", "y"]);
        assert_eq!(grants.earliest, 10);
    }
}
