//! [`Builder`]: what a bus is made of and who may use it.

use std::sync::Arc;

use super::{Bus, Inner, auth, wire};
use crate::connection::handler::HttpResponse;
use crate::handshake::Request;
use crate::pubsub::PubSub;

/// Sets up a [`Bus`] ([`Bus::builder`]). Without tokens, anyone who
/// reaches the server may subscribe and publish; that is for a bus behind
/// a gateway that authenticates, or on loopback.
pub struct Builder {
    pubsub: PubSub,
    #[cfg(feature = "redis")]
    bridge: Option<crate::pubsub::redis::Bridge>,
    publish_token: Option<String>,
    jwt_secret: Option<Vec<u8>>,
    open_stats: bool,
    path: String,
    fallback: Option<Box<super::Fallback>>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("path", &self.path)
            .field("open_stats", &self.open_stats)
            .finish_non_exhaustive()
    }
}

impl Builder {
    pub(super) fn new(pubsub: PubSub) -> Builder {
        Builder {
            pubsub,
            #[cfg(feature = "redis")]
            bridge: None,
            publish_token: None,
            jwt_secret: None,
            open_stats: false,
            path: "/ws".into(),
            fallback: None,
        }
    }

    /// Shares the topics with other nodes through this Redis bridge
    /// (started on the same `PubSub`): subscribers resume from Redis's
    /// history, publishes are answered once Redis numbered them, and
    /// `/topics/<t>` counts every node's subscribers.
    #[cfg(feature = "redis")]
    pub fn bridge(mut self, bridge: crate::pubsub::redis::Bridge) -> Builder {
        self.bridge = Some(bridge);
        self
    }

    /// Publishing needs `Authorization: Bearer <token>` (401 with a
    /// `WWW-Authenticate: Bearer` challenge without it); so do `/stats`,
    /// `/topics/<t>` and `/metrics`, unless [`open_stats`](Self::open_stats).
    /// Use at least 16 random characters.
    pub fn publish_token(mut self, token: impl Into<String>) -> Builder {
        self.publish_token = Some(token.into());
        self
    }

    /// Subscribing needs a JWT signed with `secret` (HS256) naming the
    /// topics (claim `topics`) and its expiry (`exp`): in the upgrade's
    /// `token` query parameter or a first text message `token:<jwt>`, and
    /// is closed with 1008 when it expires (`docs/bus.md` has the claims).
    /// Use at least 16 random bytes.
    pub fn jwt_secret(mut self, secret: impl AsRef<[u8]>) -> Builder {
        self.jwt_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// `/stats`, `/topics/<t>` and `/metrics` answer anyone even with
    /// tokens on (they show topic names' counts, positions and traffic).
    pub fn open_stats(mut self, open: bool) -> Builder {
        self.open_stats = open;
        self
    }

    /// The path WebSockets subscribe at: `/ws` by default. Under
    /// `Bus::router` this is the route's path too.
    pub fn path(mut self, path: impl Into<String>) -> Builder {
        self.path = path.into();
        self
    }

    /// What the standalone servers answer to a plain HTTP request outside
    /// the bus's paths (a page, `/metrics`): `None` is a 404 that lists the
    /// bus's paths. `/metrics` is among those the publish token guards.
    /// Under `Bus::router`, add routes to the router instead.
    pub fn fallback(
        mut self,
        answer: impl Fn(&Request<'_>) -> Option<HttpResponse> + Send + Sync + 'static,
    ) -> Builder {
        self.fallback = Some(Box::new(answer));
        self
    }

    /// The bus; its token-expiry thread starts here when there is a JWT
    /// secret (it ends with the bus).
    pub fn build(self) -> Bus {
        let closed_stats =
            !self.open_stats && (self.publish_token.is_some() || self.jwt_secret.is_some());
        Bus {
            inner: Arc::new(Inner {
                pubsub: self.pubsub,
                json: Arc::new(wire::Json),
                #[cfg(feature = "redis")]
                bridge: self.bridge,
                publish_token: self.publish_token.map(auth::PublishToken),
                tokens: self.jwt_secret.as_deref().map(auth::Tokens::new),
                closed_stats,
                path: self.path,
                fallback: self.fallback,
            }),
        }
    }
}
