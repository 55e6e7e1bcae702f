//! Subscriptions: connections and WebTransport sessions joining and
//! leaving topics (a subscriber joins under its topic's lock, after its
//! replay), and who is subscribed to what. A connection's subscriptions
//! end with it ([`Membership`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::registry::{Route, Subscriber, Topic, TopicState};
use super::{Inner, Position, PubSub, PubSubError, Subscribe, Subscribed, busy, check_topic};
use crate::connection::conn::Conn;
use crate::connection::membership::Membership;
use crate::connection::wake::ConnWake;

impl PubSub {
    /// Subscribes `conn` to `topic` from now on, from a callback or any
    /// thread. Returns false if it was subscribed already.
    pub fn subscribe(&self, conn: &Conn, topic: &str) -> Result<bool, PubSubError> {
        Ok(self.subscribe_with(conn, topic, &Subscribe::new())?.added)
    }

    /// Subscribes `conn` to `topic`, starting where `how` says and showing
    /// deliveries in its envelope: see [`Start`] and [`Subscribed`]. What
    /// is replayed is queued for `conn` before this returns, and before any
    /// later publication.
    ///
    /// [`Start`]: super::Start
    pub fn subscribe_with(
        &self,
        conn: &Conn,
        topic: &str,
        how: &Subscribe,
    ) -> Result<Subscribed, PubSubError> {
        check_topic(topic)?;
        let busy = busy::Busy::enter();
        let joined = self.with_topic(topic, |entry, state| {
            let route = Route::of(conn);
            let position = Position {
                epoch: state.epoch,
                offset: state.last,
            };
            if state.contains(&route, conn.key()) {
                let subscribed = Subscribed {
                    added: false,
                    recovered: None,
                    replayed: 0,
                    position,
                };
                return Err(subscribed);
            }
            let replay = self.inner.replay(conn, entry, state, how);
            let was_empty = state.unoccupied();
            let from = state.last + 1;
            state.add(Subscriber {
                conn: conn.clone(),
                from,
                envelope: how.envelope.clone(),
                gap: replay.recovered == Some(false),
                pending: None,
            });
            if was_empty {
                self.inner.registry.occupy(&entry.name);
            }
            let subscribed = Subscribed {
                added: true,
                recovered: replay.recovered,
                replayed: replay.replayed,
                position,
            };
            Ok((entry.name.clone(), subscribed))
        })?;
        let (name, subscribed) = match joined {
            Ok(joined) => joined,
            Err(already) => return Ok(already),
        };
        drop(busy);
        // Recorded on the connection after the registry: if the connection
        // has started closing, it ends (or has ended) without this topic
        // in its list, so the registry entry is taken back here.
        match conn.join(&self.membership(), &name) {
            Ok(_) => Ok(subscribed),
            Err(_) => {
                self.inner
                    .registry
                    .remove(topic, conn.key(), &Route::of(conn));
                Err(PubSubError::Closed)
            }
        }
    }

    /// Runs `f` with `topic` locked: made if it is not there, looked up
    /// again if it was forgotten between the lookup and the lock.
    /// [`PubSubError::TooManyTopics`] if it is not there and the topics'
    /// budget has no room for it.
    fn with_topic<T>(
        &self,
        topic: &str,
        f: impl FnOnce(&Topic, &mut TopicState) -> T,
    ) -> Result<T, PubSubError> {
        loop {
            let entry = self
                .inner
                .registry
                .open(topic, self.inner.config.history_of(topic))
                .ok_or(PubSubError::TooManyTopics)?;
            let mut state = entry.lock();
            if !state.gone {
                return Ok(f(&entry, &mut state));
            }
        }
    }

    /// Unsubscribes `conn` from `topic`; false if it was not subscribed.
    pub fn unsubscribe(&self, conn: &Conn, topic: &str) -> bool {
        if !conn.part(&self.membership(), topic) {
            return false;
        }
        let removed = self
            .inner
            .registry
            .remove(topic, conn.key(), &Route::of(conn));
        self.inner.ended(removed);
        true
    }

    /// Subscribes a WebTransport session to `topic` from now on: each
    /// publication's payload goes to it on a stream of its own, or as a
    /// datagram when the publisher says so ([`PublishOptions::datagram`]);
    /// the wire format and the bounds are in the module docs of
    /// `pubsub::sessions` (and `docs/http3.md`, "Pub/sub to WebTransport
    /// sessions"). Returns false if it was subscribed already. The
    /// subscription ends with the session.
    ///
    /// [`PublishOptions::datagram`]: super::PublishOptions::datagram
    #[cfg(feature = "http3")]
    pub fn subscribe_session(
        &self,
        session: &crate::h3::WebTransportSession,
        topic: &str,
    ) -> Result<bool, PubSubError> {
        check_topic(topic)?;
        let link = session.link();
        if link.is_closed() {
            return Err(PubSubError::Closed);
        }
        let busy = busy::Busy::enter();
        let added = self.with_topic(topic, |entry, state| {
            if state.sessions.contains(link) {
                return None;
            }
            let was_empty = state.unoccupied();
            let writer = state.sessions.add(link);
            if was_empty {
                self.inner.registry.occupy(&entry.name);
            }
            Some((writer, entry.name.clone()))
        })?;
        let Some((writer, name)) = added else {
            return Ok(false);
        };
        drop(busy);
        // However the writer ends (its session's end, an unsubscribe, its
        // runtime shutting down before it ran), its subscription goes.
        let leave = Leave {
            pubsub: self.clone(),
            key: link.key(),
            token: writer.token,
            topic: name,
        };
        link.runtime.spawn(async move {
            writer.run(&leave.topic).await;
            drop(leave);
        });
        Ok(true)
    }

    /// Ends a session's subscription to `topic` (its stream is finished);
    /// false if it was not subscribed.
    #[cfg(feature = "http3")]
    pub fn unsubscribe_session(
        &self,
        session: &crate::h3::WebTransportSession,
        topic: &str,
    ) -> bool {
        self.inner
            .registry
            .remove_session(topic, session.link().key(), None)
    }

    /// The topics `conn` is subscribed to here, in no particular order.
    pub fn topics(&self, conn: &Conn) -> Vec<Arc<str>> {
        conn.joined(&self.membership())
    }

    /// How many connections are subscribed to `topic` now.
    pub fn subscribers(&self, topic: &str) -> usize {
        self.inner.registry.count(topic)
    }

    /// How many topics have at least one subscriber.
    pub fn topic_count(&self) -> usize {
        self.inner.registry.topics()
    }

    /// `topic`'s latest position here (offset 0 if nothing was published in
    /// its epoch yet); `None` if the topic has neither subscribers nor
    /// history here.
    pub fn position(&self, topic: &str) -> Option<Position> {
        let entry = self.inner.registry.find(topic)?;
        let state = entry.lock();
        (!state.gone).then_some(Position {
            epoch: state.epoch,
            offset: state.last,
        })
    }

    fn membership(&self) -> Arc<dyn Membership> {
        self.inner.clone()
    }
}

/// A session's subscription, taken out of its topic when this goes.
#[cfg(feature = "http3")]
struct Leave {
    pubsub: PubSub,
    key: (usize, u64),
    token: u64,
    topic: Arc<str>,
}

#[cfg(feature = "http3")]
impl Drop for Leave {
    fn drop(&mut self) {
        let registry = &self.pubsub.inner.registry;
        registry.remove_session(&self.topic, self.key, Some(self.token));
    }
}

impl Membership for Inner {
    fn leave(&self, key: usize, wake: &ConnWake, names: Vec<Arc<str>>) {
        let route = Route::of_wake(wake);
        for name in names {
            self.ended(self.registry.remove(&name, key, &route));
        }
    }
}

impl Inner {
    /// A subscription ended: what waited for it will not be sent.
    fn ended(&self, subscriber: Option<Subscriber>) {
        let waiting = subscriber.and_then(|s| s.pending).map_or(0, |p| p.len());
        if waiting > 0 {
            self.gone.fetch_add(waiting as u64, Ordering::Relaxed);
            self.meters.gone(waiting as u64);
        }
    }
}
