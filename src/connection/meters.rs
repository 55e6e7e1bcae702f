//! What a server (or a client) reports through the `metrics` crate's facade
//! (feature `metrics`): the application installs a recorder (Prometheus,
//! OpenTelemetry, StatsD: its choice) and rapidws's counts reach it, under
//! Prometheus names (docs/metrics.md in the repository).
//!
//! The handles are taken once, when the hub is made, so counting is an
//! atomic add on the recorder's own counter, not a lookup; hence the rule
//! that the recorder is installed before the server is made (a server
//! made earlier reports to no one). Messages and bytes are tallied on the
//! thread (plain cells) and added to the counters once per step of the
//! server loop ([`Meters::flush`]): a fan-out's writes cost no atomic each.
//! Without the feature [`Meters`] is empty and every call is nothing.

use crate::proto::CloseCode;

#[cfg(feature = "metrics")]
use metrics::{Counter, Gauge};

/// One hub's metric handles, labelled with its driver.
#[cfg(feature = "metrics")]
pub(crate) struct Meters {
    driver: &'static str,
    connections_open: Gauge,
    connections_total: Counter,
    messages_received: Counter,
    messages_sent: Counter,
    bytes_received: Counter,
    bytes_sent: Counter,
    queue_full: Counter,
}

/// Without the feature: nothing, and every call is nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Debug)]
pub(crate) struct Meters;

#[cfg(feature = "metrics")]
impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters")
            .field("driver", &self.driver)
            .finish()
    }
}

#[cfg(feature = "metrics")]
impl Meters {
    /// The handles of a hub of `driver` (`tokio`, `uring`, `stream`,
    /// `client`), from the recorder installed now.
    pub(crate) fn new(driver: &'static str) -> Meters {
        describe();
        let counter = |name: &'static str| metrics::counter!(name, "driver" => driver);
        Meters {
            driver,
            connections_open: metrics::gauge!("rapidws_connections_open", "driver" => driver),
            connections_total: counter("rapidws_connections_total"),
            messages_received: counter("rapidws_messages_received_total"),
            messages_sent: counter("rapidws_messages_sent_total"),
            bytes_received: counter("rapidws_bytes_received_total"),
            bytes_sent: counter("rapidws_bytes_sent_total"),
            queue_full: counter("rapidws_queue_full_total"),
        }
    }

    /// A connection was upgraded.
    pub(crate) fn opened(&self) {
        self.connections_total.increment(1);
        self.connections_open.increment(1.0);
    }

    /// An upgraded connection ended (whatever the code).
    pub(crate) fn ended(&self) {
        self.connections_open.decrement(1.0);
    }

    /// A connection's close, with the code its `on_close` got (1006 for a
    /// connection that ended without a close handshake).
    pub(crate) fn closed(&self, code: CloseCode) {
        metrics::counter!(
            "rapidws_closes_total",
            "driver" => self.driver,
            "code" => code_label(code)
        )
        .increment(1);
    }

    /// An upgrade (or a plain request) was answered with an error.
    pub(crate) fn rejected(&self, reason: &'static str) {
        metrics::counter!(
            "rapidws_handshake_rejections_total",
            "driver" => self.driver,
            "reason" => reason
        )
        .increment(1);
    }

    /// Data messages handed to the handler, and bytes read (the driver
    /// counts bytes as it reads them, the dispatch messages as it hands
    /// them over: each passes zero for the other). Tallied on this thread
    /// until the server loop's [`flush`](Self::flush).
    #[inline]
    pub(crate) fn received(&self, messages: u64, bytes: u64) {
        TALLY.with(|tally| {
            tally
                .messages_received
                .set(tally.messages_received.get() + messages);
            tally.bytes_received.set(tally.bytes_received.get() + bytes);
        });
    }

    /// Data messages queued for the peer, and bytes written (handed to the
    /// kernel, or to TLS): counted where each is known, zero for the other.
    /// Tallied on this thread until the server loop's [`flush`](Self::flush).
    #[inline]
    pub(crate) fn sent(&self, messages: u64, bytes: u64) {
        TALLY.with(|tally| {
            tally
                .messages_sent
                .set(tally.messages_sent.get() + messages);
            tally.bytes_sent.set(tally.bytes_sent.get() + bytes);
        });
    }

    /// Adds what this thread tallied to the counters. A server loop calls
    /// it at the end of each step (a tokio group's poll, an io_uring
    /// reactor's turn, a stream connection's poll): one atomic add per
    /// counter per step rather than per message, and since a step runs
    /// uninterrupted on its thread, what it tallied is its hub's.
    pub(crate) fn flush(&self) {
        TALLY.with(|tally| {
            for (cell, counter) in [
                (&tally.messages_received, &self.messages_received),
                (&tally.messages_sent, &self.messages_sent),
                (&tally.bytes_received, &self.bytes_received),
                (&tally.bytes_sent, &self.bytes_sent),
            ] {
                let n = cell.replace(0);
                if n > 0 {
                    counter.increment(n);
                }
            }
        });
    }

    /// A send was refused (or a pub/sub delivery dropped, or its subscriber
    /// closed) because the connection's queue was full.
    #[cold]
    pub(crate) fn queue_full(&self) {
        self.queue_full.increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::unused_self)]
impl Meters {
    pub(crate) fn new(_driver: &'static str) -> Meters {
        Meters
    }
    #[inline(always)]
    pub(crate) fn opened(&self) {}
    #[inline(always)]
    pub(crate) fn ended(&self) {}
    #[inline(always)]
    pub(crate) fn closed(&self, _code: CloseCode) {}
    #[inline(always)]
    pub(crate) fn rejected(&self, _reason: &'static str) {}
    #[inline(always)]
    pub(crate) fn received(&self, _messages: u64, _bytes: u64) {}
    #[inline(always)]
    pub(crate) fn sent(&self, _messages: u64, _bytes: u64) {}
    #[inline(always)]
    pub(crate) fn queue_full(&self) {}
    #[inline(always)]
    pub(crate) fn flush(&self) {}
}

/// What this thread counted since its server loop last flushed.
#[cfg(feature = "metrics")]
struct Tally {
    messages_received: std::cell::Cell<u64>,
    messages_sent: std::cell::Cell<u64>,
    bytes_received: std::cell::Cell<u64>,
    bytes_sent: std::cell::Cell<u64>,
}

#[cfg(feature = "metrics")]
thread_local! {
    static TALLY: Tally = const {
        Tally {
            messages_received: std::cell::Cell::new(0),
            messages_sent: std::cell::Cell::new(0),
            bytes_received: std::cell::Cell::new(0),
            bytes_sent: std::cell::Cell::new(0),
        }
    };
}

/// The `code` label of a close: RFC 6455's codes as themselves, the
/// application's ranges as `3xxx` and `4xxx`, anything else `other`. The
/// peer picks the code: a label per code would let it make series without
/// bound.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn code_label(code: CloseCode) -> &'static str {
    const RFC: [&str; 16] = [
        "1000", "1001", "1002", "1003", "1004", "1005", "1006", "1007", "1008", "1009", "1010",
        "1011", "1012", "1013", "1014", "1015",
    ];
    match code.0 {
        1000..=1015 => RFC[usize::from(code.0 - 1000)],
        3000..=3999 => "3xxx",
        4000..=4999 => "4xxx",
        _ => "other",
    }
}

/// The metric name's label for why a request got an HTTP error.
pub(crate) fn rejection_reason(error: &crate::handshake::HandshakeError) -> &'static str {
    use crate::handshake::HandshakeError as E;
    match error {
        E::HeadTooLarge | E::TooManyHeaders => "head_too_large",
        E::Incomplete => "incomplete",
        E::TimedOut => "timeout",
        E::MethodNotAllowed => "method",
        E::UnsupportedVersion => "version",
        E::BodyTooLarge => "body_too_large",
        E::LengthRequired => "length_required",
        E::Malformed
        | E::NotHttp11
        | E::MissingHost
        | E::DuplicateHost
        | E::BareLineFeed
        | E::NotWebSocketUpgrade
        | E::MissingConnectionUpgrade
        | E::MissingKey
        | E::InvalidKey
        | E::NotExtendedConnect
        | E::BadContentLength => "bad_request",
    }
}

/// The help texts, given to the recorder (once is enough; again is harmless).
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_gauge!("rapidws_connections_open", "WebSocket connections open now");
        describe_counter!("rapidws_connections_total", "WebSocket connections upgraded");
        describe_counter!(
            "rapidws_closes_total",
            "WebSocket connections ended, by the close code on_close got (1006: no close handshake)"
        );
        describe_counter!(
            "rapidws_handshake_rejections_total",
            "Requests answered with an HTTP error instead of an upgrade, by reason"
        );
        describe_counter!("rapidws_messages_received_total", "Data messages received");
        describe_counter!("rapidws_messages_sent_total", "Data messages queued to send");
        describe_counter!(
            "rapidws_bytes_received_total",
            Unit::Bytes,
            "Bytes read from connections (request heads included; under TLS, the plaintext)"
        );
        describe_counter!(
            "rapidws_bytes_sent_total",
            Unit::Bytes,
            "Bytes written to connections (responses included; under TLS, the plaintext)"
        );
        describe_counter!(
            "rapidws_queue_full_total",
            "Sends refused, deliveries dropped or subscribers closed because a connection's queue was full"
        );
        describe_counter!(
            "rapidws_pubsub_published_total",
            "Pub/sub publishes that had at least one subscriber on this node"
        );
        describe_counter!(
            "rapidws_pubsub_delivered_total",
            "Pub/sub messages queued for a subscriber"
        );
        describe_counter!(
            "rapidws_pubsub_dropped_total",
            "Pub/sub messages a subscriber did not get, by reason"
        );
        describe_histogram!(
            "rapidws_pubsub_delivery_seconds",
            Unit::Seconds,
            "From a publish call to its frame handed to the kernel, for one subscriber per server loop of every 64th publish"
        );
    });
}
