//! What a subscriber's client is sent for a publication: the payload as
//! it was published, or the payload in an [`Envelope`] of the
//! application's making (its topic and position around it, say), framed
//! once per envelope for every subscriber that asked for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::history::Position;
use crate::proto::{MessageKind, OpCode, OwnedMessage, Prepared};

/// How a subscription's deliveries are shown to its client, chosen per
/// subscription ([`Subscribe::envelope`]). Without one a client gets each
/// payload exactly as it was published, and nothing else.
///
/// An envelope is called once per publication for all the subscribers
/// that share it (the same `Arc`), on whichever thread delivers first;
/// what it returns is framed once and kept with the publication, for
/// replay too. It must not block.
///
/// ```
/// use rapidws::pubsub::{Envelope, Publication};
/// use rapidws::OwnedMessage;
///
/// /// `<topic> <offset> <payload>`, one text message each.
/// struct Tagged;
///
/// impl Envelope for Tagged {
///     fn wrap(&self, publication: &Publication) -> OwnedMessage {
///         let payload = String::from_utf8_lossy(publication.payload());
///         let offset = publication.position().offset;
///         OwnedMessage::Text(format!("{} {offset} {payload}", publication.topic()))
///     }
///     fn recovery(&self, topic: &str, recovered: bool) -> Option<OwnedMessage> {
///         Some(OwnedMessage::Text(format!("{topic} recovered={recovered}")))
///     }
/// }
/// ```
///
/// [`Subscribe::envelope`]: super::Subscribe::envelope
pub trait Envelope: Send + Sync + 'static {
    /// The message for `publication`.
    fn wrap(&self, publication: &Publication) -> OwnedMessage;

    /// The message that tells a client whether it was kept whole on
    /// `topic`: `true` once a resumed subscription has replayed all it
    /// missed, `false` where it missed something it will not get (its
    /// position was older than the history kept, or its epoch is gone; a
    /// replay or a delivery did not fit its queue). `None` (the default)
    /// sends nothing.
    fn recovery(&self, topic: &str, recovered: bool) -> Option<OwnedMessage> {
        let _ = (topic, recovered);
        None
    }
}

/// One publication on a topic: what an [`Envelope`] wraps. Kept, with its
/// frames, in the topic's history when that is on.
#[derive(Debug)]
pub struct Publication {
    topic: Arc<str>,
    position: Position,
    /// What conflation replaces it by (`Overflow::Conflate`).
    key: Option<Box<str>>,
    /// The payload as published, framed.
    plain: Prepared,
    /// When it was published (history's age bound).
    at: Instant,
    /// The first envelope's frame, and the envelope's address.
    wrapped: OnceLock<(usize, Arc<Prepared>)>,
    /// Other envelopes' frames (a server rarely has more than one).
    more: Mutex<Vec<(usize, Arc<Prepared>)>>,
    /// Whether `more` holds any (read without its lock: counting what a
    /// publication holds, which the sweeper does for every kept one).
    any_more: AtomicBool,
    /// When its publish was called, if it is one of the publishes whose
    /// delivery is timed (feature `metrics`).
    sampled: Option<Instant>,
}

impl Publication {
    pub(crate) fn new(
        topic: Arc<str>,
        position: Position,
        key: Option<&str>,
        opcode: OpCode,
        payload: &[u8],
        at: Instant,
    ) -> Publication {
        Publication {
            topic,
            position,
            key: key.map(Box::from),
            plain: Prepared::new(opcode, payload),
            at,
            wrapped: OnceLock::new(),
            more: Mutex::new(Vec::new()),
            any_more: AtomicBool::new(false),
            sampled: None,
        }
    }

    /// Marks it as a publish whose delivery is timed, called at `since`.
    pub(crate) fn timed(mut self, since: Option<Instant>) -> Publication {
        self.sampled = since;
        self
    }

    /// When its publish was called, if its delivery is timed.
    pub(crate) fn sampled(&self) -> Option<Instant> {
        self.sampled
    }

    /// The topic it was published on.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Where it sits in its topic.
    pub fn position(&self) -> Position {
        self.position
    }

    /// Its key, if it was published with one ([`PublishOptions::key`]).
    ///
    /// [`PublishOptions::key`]: super::PublishOptions::key
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Text or binary, as it was published.
    pub fn kind(&self) -> MessageKind {
        match self.plain.opcode() {
            OpCode::Text => MessageKind::Text,
            _ => MessageKind::Binary,
        }
    }

    /// The payload as it was published (UTF-8 if [`Publication::kind`] is
    /// text).
    pub fn payload(&self) -> &[u8] {
        self.plain.payload()
    }

    /// An estimate of the heap it holds: the struct, its frames (the
    /// plain one, the compressed and wrapped ones made so far) and its
    /// key. What the byte budgets count for it.
    pub(crate) fn held_bytes(&self) -> usize {
        let wrapped = |frame: &Arc<Prepared>| FRAME_OVERHEAD + frame.held_bytes();
        let first = self.wrapped.get().map_or(0, |(_, frame)| wrapped(frame));
        let more: usize = if self.any_more.load(Ordering::Acquire) {
            self.more
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(_, frame)| wrapped(frame) + std::mem::size_of::<(usize, Arc<Prepared>)>())
                .sum()
        } else {
            0
        };
        PUBLICATION_OVERHEAD
            + self.plain.held_bytes()
            + self.key.as_deref().map_or(0, str::len)
            + first
            + more
    }

    pub(crate) fn at(&self) -> Instant {
        self.at
    }

    /// The plain frame (no envelope).
    pub(crate) fn plain(&self) -> &Prepared {
        &self.plain
    }

    /// The frame for a subscriber with `envelope`: made on the first call
    /// for that envelope, shared after.
    pub(crate) fn frame(&self, envelope: Option<&Arc<dyn Envelope>>) -> Frame<'_> {
        let Some(envelope) = envelope else {
            return Frame::Plain(&self.plain);
        };
        let id = envelope_id(envelope);
        let (first, frame) = self.wrapped.get_or_init(|| (id, wrap(&**envelope, self)));
        if *first == id {
            return Frame::Wrapped(frame.clone());
        }
        let mut more = self.more.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, frame)) = more.iter().find(|(other, _)| *other == id) {
            return Frame::Wrapped(frame.clone());
        }
        let frame = wrap(&**envelope, self);
        more.push((id, frame.clone()));
        self.any_more.store(true, Ordering::Release);
        Frame::Wrapped(frame)
    }
}

/// What a publication holds besides its frames' and key's bytes: the
/// struct in its `Arc`, and the allocation behind its plain frame.
const PUBLICATION_OVERHEAD: usize = std::mem::size_of::<Publication>() + 16 + 32;

/// What a wrapped frame holds besides its bytes: a `Prepared` in an `Arc`,
/// and the allocation behind its frame.
const FRAME_OVERHEAD: usize = std::mem::size_of::<Prepared>() + 16 + 32;

/// A publication's frame for one subscriber.
pub(crate) enum Frame<'a> {
    /// The payload as published.
    Plain(&'a Prepared),
    /// In an envelope.
    Wrapped(Arc<Prepared>),
}

impl std::ops::Deref for Frame<'_> {
    type Target = Prepared;

    fn deref(&self) -> &Prepared {
        match self {
            Frame::Plain(frame) => frame,
            Frame::Wrapped(frame) => frame,
        }
    }
}

/// An envelope's identity: the address of what its `Arc` points to.
pub(crate) fn envelope_id(envelope: &Arc<dyn Envelope>) -> usize {
    Arc::as_ptr(envelope) as *const () as usize
}

fn wrap(envelope: &dyn Envelope, publication: &Publication) -> Arc<Prepared> {
    Arc::new(prepare(&envelope.wrap(publication)))
}

/// `message` framed once.
pub(crate) fn prepare(message: &OwnedMessage) -> Prepared {
    match message {
        OwnedMessage::Text(text) => Prepared::new(OpCode::Text, text.as_bytes()),
        OwnedMessage::Binary(data) => Prepared::new(OpCode::Binary, data),
    }
}
