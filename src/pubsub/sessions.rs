//! WebTransport sessions as a topic's subscribers (feature `http3`).
//!
//! A session subscribed to a topic is sent each publication's payload,
//! on the subscription's own unidirectional stream (in order, reliably)
//! or, when the publisher says so (`PublishOptions::datagram`), as a
//! datagram. What a session's client reads:
//!
//! - **the stream**: opened at the first publication it carries; the
//!   topic's name (a QUIC varint length, then its UTF-8 bytes), then each
//!   publication as a varint length and its payload;
//! - **a datagram**: the topic's name as above, then the payload.
//!
//! The publications are handed on under the topic's lock, so a session
//! gets them in the order of their offsets, as a WebSocket subscriber
//! does. The stream's writer is a task per subscription; what waits for
//! it is bounded ([`QUEUE_BYTES`]), and a publication past that bound is
//! dropped for that session (counted in `Stats::dropped`). The
//! subscription ends with its session, or `PubSub::unsubscribe_session`.

#[cfg(feature = "http3")]
pub(super) use live::*;

/// Without `http3`, no session ever subscribes: the registry's code is the
/// same, with nothing here.
#[cfg(not(feature = "http3"))]
#[derive(Default)]
pub(super) struct SessionSubscribers(());

#[cfg(not(feature = "http3"))]
impl SessionSubscribers {
    pub(super) fn len(&self) -> usize {
        0
    }

    pub(super) fn is_empty(&self) -> bool {
        true
    }
}

#[cfg(feature = "http3")]
mod live {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use bytes::Bytes;
    use rapidws_core::h3::varint;
    use tokio::sync::mpsc;

    use crate::h3::Link;

    /// Bytes that may wait for one subscription's stream.
    pub(crate) const QUEUE_BYTES: usize = 1024 * 1024;

    /// Tells subscriptions apart: a session unsubscribed and subscribed
    /// again has a new one, which the old one's writer must not take out.
    static TOKENS: AtomicU64 = AtomicU64::new(0);

    /// The topic's name as a stream or a datagram starts with it: a QUIC
    /// varint length, then its UTF-8 bytes.
    fn topic_name(topic: &str) -> Vec<u8> {
        let mut name = Vec::with_capacity(8 + topic.len());
        varint::encode(topic.len() as u64, &mut name);
        name.extend_from_slice(topic.as_bytes());
        name
    }

    /// One session's subscription to a topic.
    pub(crate) struct SessionSubscriber {
        link: Link,
        token: u64,
        /// To the stream's writer; its bytes waiting are `queued`.
        queue: mpsc::UnboundedSender<Bytes>,
        queued: Arc<AtomicUsize>,
    }

    /// A topic's session subscribers.
    #[derive(Default)]
    pub(crate) struct SessionSubscribers {
        list: Vec<SessionSubscriber>,
    }

    /// What became of a publication for a topic's sessions.
    #[derive(Default)]
    pub(crate) struct Handed {
        pub(crate) delivered: u64,
        pub(crate) dropped: u64,
    }

    impl SessionSubscribers {
        pub(crate) fn len(&self) -> usize {
            self.list.len()
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.list.is_empty()
        }

        pub(crate) fn contains(&self, link: &Link) -> bool {
            self.list.iter().any(|s| s.link.key() == link.key())
        }

        /// Adds `link`'s subscription; returns what its stream's writer
        /// reads.
        pub(crate) fn add(&mut self, link: &Link) -> Writer {
            let (queue, receiver) = mpsc::unbounded_channel();
            let queued = Arc::new(AtomicUsize::new(0));
            let token = TOKENS.fetch_add(1, Ordering::Relaxed);
            self.list.push(SessionSubscriber {
                link: link.clone(),
                token,
                queue,
                queued: queued.clone(),
            });
            Writer {
                link: link.clone(),
                token,
                receiver,
                queued,
            }
        }

        /// Takes `key`'s subscription out (its writer then finishes the
        /// stream), only if it is the one `token` names when given; false
        /// if it was not there.
        pub(crate) fn remove(&mut self, key: (usize, u64), token: Option<u64>) -> bool {
            let before = self.list.len();
            self.list
                .retain(|s| s.link.key() != key || token.is_some_and(|t| t != s.token));
            before != self.list.len()
        }

        /// Hands `payload` to each session: as a datagram, or to its
        /// stream's writer.
        pub(crate) fn deliver(&self, topic: &str, payload: &[u8], datagram: bool) -> Handed {
            let mut handed = Handed::default();
            if self.list.is_empty() {
                return handed;
            }
            let name = if datagram {
                topic_name(topic)
            } else {
                Vec::new()
            };
            // One copy for every stream: its length, then the payload.
            let framed = (!datagram).then(|| {
                let mut framed = Vec::with_capacity(8 + payload.len());
                varint::encode(payload.len() as u64, &mut framed);
                framed.extend_from_slice(payload);
                Bytes::from(framed)
            });
            for subscriber in &self.list {
                let sent = match &framed {
                    None => subscriber.link.send_datagram(&[&name, payload]).is_ok(),
                    Some(framed) => subscriber.push(framed.clone()),
                };
                if sent {
                    handed.delivered += 1;
                } else {
                    handed.dropped += 1;
                }
            }
            handed
        }
    }

    impl SessionSubscriber {
        /// Queues `bytes` for the stream, unless the session is over or
        /// [`QUEUE_BYTES`] wait already.
        fn push(&self, bytes: Bytes) -> bool {
            if self.link.is_closed() {
                return false;
            }
            let len = bytes.len();
            let before = self.queued.fetch_add(len, Ordering::AcqRel);
            // One always fits, so that a publication larger than the
            // bound still reaches a subscriber that keeps up.
            if before > 0 && before + len > QUEUE_BYTES {
                self.queued.fetch_sub(len, Ordering::AcqRel);
                return false;
            }
            if self.queue.send(bytes).is_err() {
                self.queued.fetch_sub(len, Ordering::AcqRel);
                return false;
            }
            true
        }
    }

    /// A subscription's stream writer: what its task runs.
    pub(crate) struct Writer {
        pub(crate) link: Link,
        /// Its subscription's.
        pub(crate) token: u64,
        receiver: mpsc::UnboundedReceiver<Bytes>,
        queued: Arc<AtomicUsize>,
    }

    impl Writer {
        /// Writes what is published to the subscription's stream (opened
        /// with the topic's name at the first) until the subscription or
        /// the session ends; then finishes the stream.
        pub(crate) async fn run(mut self, topic: &str) {
            let mut stream = None;
            loop {
                let bytes = tokio::select! {
                    bytes = self.receiver.recv() => bytes,
                    _ = self.link.closed() => None,
                };
                let Some(bytes) = bytes else {
                    break;
                };
                if stream.is_none() {
                    // Opening waits for the peer's stream credit: not past
                    // the session's end.
                    let opening = async {
                        let mut opened = self.link.open_uni().await.ok()?;
                        opened.write_all(&topic_name(topic)).await.ok()?;
                        Some(opened)
                    };
                    let opened = tokio::select! {
                        opened = opening => opened,
                        _ = self.link.closed() => None,
                    };
                    let Some(opened) = opened else {
                        break;
                    };
                    stream = Some(opened);
                }
                let Some(open) = &mut stream else {
                    break;
                };
                let written = tokio::select! {
                    written = open.write_all(&bytes) => written.is_ok(),
                    _ = self.link.closed() => false,
                };
                self.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
                if !written {
                    break;
                }
            }
            if let Some(mut stream) = stream {
                let _ = stream.finish();
            }
        }
    }
}
