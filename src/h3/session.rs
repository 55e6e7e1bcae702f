//! A WebTransport session as its handler holds it ([`WebTransportSession`]), and the
//! connection's table that sends each stream and datagram a peer opens to
//! the session it names.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::webtransport::{
    self as wt, BIDI_SIGNAL, UNI_STREAM_TYPE, put_datagram_prefix,
};
use rapidws_core::h3::{RequestHead, varint};
use tokio::sync::{mpsc, watch};

use super::budget::{ConnectionBudget, ReadToEndError, StreamBudget, Whole};
use super::wire::code_of;

/// Streams of one kind a session keeps for its handler before it takes
/// them, at least; more are reset (`WEBTRANSPORT_BUFFERED_STREAM_REJECTED`).
/// A session keeps as many as its peer may open at once
/// (`WebTransport::max_streams`) when that is more: QUIC's stream limit
/// bounds them first, and a burst within the credit is never refused.
const QUEUED_STREAMS: usize = 64;

/// Datagrams a session keeps for its handler; more are dropped, as an
/// unreliable datagram may be.
const QUEUED_DATAGRAMS: usize = 256;

/// Decides on and serves WebTransport sessions (the browser's `new
/// WebTransport(url)`): [`serve_with`](super::serve_with) gives it every
/// extended CONNECT with `:protocol` webtransport on the endpoint.
///
/// ```no_run
/// use rapidws::h3::{WebTransportSession, WebTransport};
///
/// /// Echoes every bidirectional stream.
/// struct Echo;
///
/// impl WebTransport for Echo {
///     async fn serve(&self, session: WebTransportSession) {
///         while let Some((mut send, mut recv)) = session.accept_bi().await {
///             tokio::spawn(async move {
///                 while let Ok(Some(chunk)) = recv.read_chunk(64 * 1024, true).await {
///                     if send.write_all(&chunk.bytes).await.is_err() {
///                         return;
///                     }
///                 }
///                 let _ = send.finish();
///             });
///         }
///     }
/// }
/// ```
pub trait WebTransport: Send + Sync + 'static {
    /// Whether to open the session `request` asks for: `Ok` answers 200,
    /// `Err` the [`Reject`](crate::Reject)'s status and reason. Called
    /// after the server's own checks (the origin, as for WebSockets:
    /// `Config::allow_origins`). By default every path is accepted.
    fn on_request(&self, request: &RequestHead) -> Result<(), crate::Reject> {
        let _ = request;
        Ok(())
    }

    /// What this handler's sessions may hold of their peers' streams read
    /// whole ([`WebTransportSession::read_to_end`]): for every connection of the
    /// endpoint together, and for each. Asked once, when the endpoint
    /// starts serving. By default the process's own ([`StreamBudget::default`]:
    /// 256 MiB for every endpoint in the process, 4 MiB per connection).
    fn stream_budget(&self) -> StreamBudget {
        StreamBudget::default()
    }

    /// How many streams the peer of a session may have open at once, each
    /// way (unidirectional ones beside HTTP/3's own three). The connection's
    /// limits, [`QuicConfig::max_streams`](super::QuicConfig::max_streams)
    /// until then (sized for WebSockets, one per connection from a
    /// browser), are set to this when a session is accepted: browsers open
    /// many streams at once and fail the one past the credit instead of
    /// waiting for more (Chromium's own default is 100 each way). What it
    /// costs: quinn's state for each stream allowed (about 48 bytes for a
    /// bidirectional one, 33 for a unidirectional one), and nothing more in
    /// buffers: the bytes a peer may send ahead of what was read are bounded
    /// for the whole connection by
    /// [`QuicConfig::connection_window`](super::QuicConfig::connection_window),
    /// however many streams carry them. Default 100
    /// ([`DEFAULT_SESSION_STREAMS`](super::DEFAULT_SESSION_STREAMS)).
    fn max_streams(&self) -> u32 {
        super::DEFAULT_SESSION_STREAMS
    }

    /// Serves one session. When this returns, the session is closed (code
    /// 0, unless [`WebTransportSession::close`] said otherwise). When the session ends
    /// otherwise (the peer closes it, [`WebTransportSession::close`], the server shuts
    /// down), [`WebTransportSession::closed`] resolves and the `accept_*` methods
    /// return `None`; this future then has 2 seconds to return before it
    /// is dropped (with the streams it holds: dropping a quinn
    /// `SendStream` finishes it).
    fn serve(&self, session: WebTransportSession) -> impl Future<Output = ()> + Send;
}

/// How a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closed {
    /// The application's code (`WT_CLOSE_SESSION`'s; 0 when the session's
    /// stream just ended).
    pub code: u32,
    /// The reason given, or what happened (a reset, a lost connection).
    pub reason: String,
    /// Whether the peer ended it (rather than this side).
    pub by_peer: bool,
}

/// Why a datagram was not sent.
#[derive(Debug, PartialEq, Eq)]
pub enum DatagramError {
    /// Larger than the path carries now ([`WebTransportSession::max_datagram_size`]):
    /// send it on a stream instead.
    TooLarge {
        /// The largest payload that fits.
        max: usize,
    },
    /// The peer does not take datagrams.
    Unsupported,
    /// The session or its connection is over.
    Closed,
}

impl std::fmt::Display for DatagramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatagramError::TooLarge { max } => write!(
                f,
                "a datagram over the {max} bytes the path carries: send it on a stream"
            ),
            DatagramError::Unsupported => f.write_str("the peer does not take datagrams"),
            DatagramError::Closed => f.write_str("the session is closed"),
        }
    }
}

impl std::error::Error for DatagramError {}

/// One WebTransport session: the streams and datagrams the peer sends on
/// it, and those this side sends. Its methods take `&self`, so streams
/// and datagrams can be awaited at once (as with quinn's `Connection`).
///
/// Streams are quinn's own (`SendStream`, `RecvStream`), their session
/// prefix already read or written; an application's stream error code `c`
/// goes on the wire as [`error_code`]`(c)`.
pub struct WebTransportSession {
    link: Link,
    path: String,
    bi: tokio::sync::Mutex<mpsc::Receiver<(SendStream, RecvStream)>>,
    uni: tokio::sync::Mutex<mpsc::Receiver<RecvStream>>,
    datagrams: tokio::sync::Mutex<mpsc::Receiver<Bytes>>,
    /// Where [`close`](WebTransportSession::close) asks the session's task to close.
    closing: mpsc::Sender<(u32, String)>,
    /// The connection's share of the stream budget.
    budget: Arc<ConnectionBudget>,
}

/// What may outlive a [`WebTransportSession`]'s handle and still send on the session
/// (a pub/sub subscription): its connection, its id, its end.
#[derive(Clone)]
pub(crate) struct Link {
    conn: Connection,
    id: u64,
    /// The runtime the session runs on: where its subscriptions' writers go.
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) runtime: tokio::runtime::Handle,
    /// `Some` once the session is over.
    closed: watch::Receiver<Option<Closed>>,
}

impl Link {
    /// Which session this is, among every connection's.
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) fn key(&self) -> (usize, u64) {
        (self.conn.stable_id(), self.id)
    }

    /// Whether the session is over (or its task gone).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.borrow().is_some() || self.closed.has_changed().is_err()
    }

    /// Waits for the session to end, and says how.
    pub(crate) async fn closed(&self) -> Closed {
        let mut closed = self.closed.clone();
        match closed.wait_for(Option::is_some).await {
            Ok(closed) => closed.clone().unwrap_or_else(lost),
            Err(_) => lost(),
        }
    }

    pub(crate) fn max_datagram_size(&self) -> Option<usize> {
        let max = self.conn.max_datagram_size()?;
        Some(max.saturating_sub(varint::len(self.id / 4)))
    }

    /// Sends the concatenation of `parts` as one datagram.
    pub(crate) fn send_datagram(&self, parts: &[&[u8]]) -> Result<(), DatagramError> {
        if self.is_closed() {
            return Err(DatagramError::Closed);
        }
        let max = self.max_datagram_size().ok_or(DatagramError::Unsupported)?;
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len > max {
            return Err(DatagramError::TooLarge { max });
        }
        let mut datagram = BytesMut::with_capacity(8 + len);
        put_datagram_prefix(self.id, &mut datagram);
        for part in parts {
            datagram.extend_from_slice(part);
        }
        self.conn
            .send_datagram(datagram.freeze())
            .map_err(|error| match error {
                quinn::SendDatagramError::TooLarge => DatagramError::TooLarge { max },
                quinn::SendDatagramError::UnsupportedByPeer
                | quinn::SendDatagramError::Disabled => DatagramError::Unsupported,
                quinn::SendDatagramError::ConnectionLost(_) => DatagramError::Closed,
            })
    }

    /// Opens a unidirectional stream of the session.
    pub(crate) async fn open_uni(&self) -> io::Result<SendStream> {
        let mut send = self.conn.open_uni().await.map_err(io::Error::from)?;
        self.prefix(&mut send, UNI_STREAM_TYPE).await?;
        Ok(send)
    }

    async fn prefix(&self, send: &mut SendStream, kind: u64) -> io::Result<()> {
        if self.is_closed() {
            let _ = send.reset(code_of(wt::code::SESSION_GONE));
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the WebTransport session is closed",
            ));
        }
        let mut head = Vec::with_capacity(16);
        varint::encode(kind, &mut head);
        varint::encode(self.id, &mut head);
        send.write_all(&head).await.map_err(io::Error::from)
    }
}

impl std::fmt::Debug for WebTransportSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebTransportSession")
            .field("id", &self.link.id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The HTTP/3 error code for an application's stream error `code` (to
/// reset or stop a session's stream with).
pub fn error_code(code: u32) -> quinn::VarInt {
    code_of(wt::error_to_http3(code))
}

/// The application's code in a stream's reset or stop code, if it is one.
pub fn application_code(code: quinn::VarInt) -> Option<u32> {
    wt::http3_to_error(code.into_inner())
}

impl WebTransportSession {
    /// The session's id: its CONNECT stream's.
    pub fn id(&self) -> u64 {
        self.link.id
    }

    /// The `:path` it was opened with (with its query).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The peer's address now (it may move: QUIC's migration).
    pub fn remote_address(&self) -> SocketAddr {
        self.link.conn.remote_address()
    }

    /// The next bidirectional stream the peer opens; `None` once the
    /// session is over.
    pub async fn accept_bi(&self) -> Option<(SendStream, RecvStream)> {
        self.bi.lock().await.recv().await
    }

    /// The next unidirectional stream the peer opens; `None` once the
    /// session is over.
    pub async fn accept_uni(&self) -> Option<RecvStream> {
        self.uni.lock().await.recv().await
    }

    /// Reads `recv` (a stream of this session the peer opened) to its end,
    /// at most `max` bytes, counting what it holds against the stream
    /// budget ([`WebTransport::stream_budget`]) until the [`Whole`] is
    /// dropped. A peer that opens many streams and never finishes them
    /// holds no more than the budget allows: past the connection's cap the
    /// stream is stopped with `H3_EXCESSIVE_LOAD`, past the endpoint's
    /// total the connection holding the most is closed with it (either way
    /// [`ReadToEndError::OverBudget`]). A stream longer than `max` is left
    /// as it is ([`ReadToEndError::TooLong`]: stop it or read it
    /// otherwise). Read a stream this way whenever it is kept whole before
    /// it is acted on; one handled as it comes needs no budget.
    pub async fn read_to_end(
        &self,
        recv: &mut RecvStream,
        max: usize,
    ) -> Result<Whole, ReadToEndError> {
        super::budget::read_to_end(&self.budget, &self.link.conn, recv, max).await
    }

    /// The next datagram the peer sends (its payload); `None` once the
    /// session is over. Datagrams may be lost or reordered; a handler that
    /// falls behind by more than 256 loses the newest.
    pub async fn read_datagram(&self) -> Option<Bytes> {
        self.datagrams.lock().await.recv().await
    }

    /// Opens a bidirectional stream (waiting while the peer's stream
    /// limit is reached).
    pub async fn open_bi(&self) -> io::Result<(SendStream, RecvStream)> {
        let (mut send, recv) = self.link.conn.open_bi().await.map_err(io::Error::from)?;
        self.link.prefix(&mut send, BIDI_SIGNAL).await?;
        Ok((send, recv))
    }

    /// Opens a unidirectional stream (waiting while the peer's stream
    /// limit is reached).
    pub async fn open_uni(&self) -> io::Result<SendStream> {
        self.link.open_uni().await
    }

    /// The largest datagram payload the path carries now; `None` if the
    /// peer takes no datagrams.
    pub fn max_datagram_size(&self) -> Option<usize> {
        self.link.max_datagram_size()
    }

    /// Sends `payload` as one datagram (unreliable, unordered).
    pub fn send_datagram(&self, payload: &[u8]) -> Result<(), DatagramError> {
        self.link.send_datagram(&[payload])
    }

    /// Closes the session with `code` and `reason` (at most 1024 bytes;
    /// cut beyond): the peer gets `WT_CLOSE_SESSION` and the session's
    /// stream ends. Finish the streams first to have their bytes
    /// delivered.
    pub fn close(&self, code: u32, reason: &str) {
        let _ = self.closing.try_send((code, reason.to_owned()));
    }

    /// Waits for the session to end, and says how.
    pub async fn closed(&self) -> Closed {
        self.link.closed().await
    }

    /// What a subscription holds of the session.
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }
}

fn lost() -> Closed {
    Closed {
        code: 0,
        reason: "the connection was lost".into(),
        by_peer: true,
    }
}

/// What a session's task keeps of it: where the session's end is told
/// and where its close is asked for.
pub(crate) struct Control {
    pub(crate) closed: watch::Sender<Option<Closed>>,
    pub(crate) closing: mpsc::Receiver<(u32, String)>,
}

/// Where a session's streams and datagrams go.
struct Inbox {
    bi: mpsc::Sender<(SendStream, RecvStream)>,
    uni: mpsc::Sender<RecvStream>,
    datagrams: mpsc::Sender<Bytes>,
}

/// A stream that came for a session not decided yet.
enum Early {
    Bi(SendStream, RecvStream),
    Uni(RecvStream),
}

impl Early {
    fn refuse(self, code: u64) {
        match self {
            Early::Bi(mut send, mut recv) => {
                let _ = send.reset(code_of(code));
                let _ = recv.stop(code_of(code));
            }
            Early::Uni(mut recv) => {
                let _ = recv.stop(code_of(code));
            }
        }
    }
}

/// Streams a connection holds for sessions not decided yet (the peer may
/// open a session's streams before it has the answer); more are refused
/// with `WEBTRANSPORT_BUFFERED_STREAM_REJECTED`.
const EARLY_STREAMS: usize = 16;

/// A connection's sessions, by id: what the peer's streams and datagrams
/// are sent on to.
pub(crate) struct Sessions {
    table: Mutex<Table>,
    /// The connection's share of the stream budget, for its sessions.
    budget: Arc<ConnectionBudget>,
}

#[derive(Default)]
struct Table {
    open: HashMap<u64, Inbox>,
    /// Bidirectional streams accepted and not decided yet: each may be a
    /// request that becomes a session.
    deciding: HashSet<u64>,
    /// The first bidirectional stream id the connection has not seen: a
    /// request the peer has not opened yet may still become a session.
    unseen: u64,
    /// Streams held for a session being decided, by its id.
    early: Vec<(u64, Early)>,
}

impl Table {
    /// Sends `stream` to session `id`, holds it for a session being
    /// decided, or refuses it.
    fn route(&mut self, id: u64, stream: Early) {
        if let Some(inbox) = self.open.get(&id) {
            let refused = match stream {
                Early::Bi(send, recv) => match inbox.bi.try_send((send, recv)) {
                    Ok(()) => return,
                    Err(error) => {
                        let (send, recv) = error.into_inner();
                        Early::Bi(send, recv)
                    }
                },
                Early::Uni(recv) => match inbox.uni.try_send(recv) {
                    Ok(()) => return,
                    Err(error) => Early::Uni(error.into_inner()),
                },
            };
            return refused.refuse(wt::code::BUFFERED_STREAM_REJECTED);
        }
        // A session id is a client-initiated bidirectional stream's.
        let may_come = id.is_multiple_of(4) && (self.deciding.contains(&id) || id >= self.unseen);
        if !may_come {
            return stream.refuse(wt::code::SESSION_GONE);
        }
        if self.early.len() >= EARLY_STREAMS {
            return stream.refuse(wt::code::BUFFERED_STREAM_REJECTED);
        }
        self.early.push((id, stream));
    }
}

impl Sessions {
    /// A connection's table, its sessions' streams read whole within
    /// `budget`.
    pub(crate) fn new(budget: Arc<ConnectionBudget>) -> Sessions {
        Sessions {
            table: Mutex::new(Table::default()),
            budget,
        }
    }

    /// The connection accepted bidirectional stream `id`: until it is
    /// [`decided`](Sessions::decided), it may be a session's request.
    pub(crate) fn seen(&self, id: u64) {
        let mut table = self.lock();
        table.unseen = table.unseen.max(id + 4);
        table.deciding.insert(id);
    }

    /// Request `id` is over (answered, refused, or its session ended):
    /// streams held for it are refused.
    pub(crate) fn decided(&self, id: u64) {
        let mut table = self.lock();
        table.deciding.remove(&id);
        if table.open.contains_key(&id) {
            return;
        }
        let early = std::mem::take(&mut table.early);
        let (held, kept): (Vec<_>, Vec<_>) = early.into_iter().partition(|(of, _)| *of == id);
        table.early = kept;
        drop(table);
        for (_, stream) in held {
            stream.refuse(wt::code::BUFFERED_STREAM_REJECTED);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens session `id` of `conn`, unless `max` are open already; the
    /// streams held for it are its first. Its peer may have `streams` open
    /// at once each way.
    pub(crate) fn open(
        &self,
        conn: &Connection,
        id: u64,
        path: String,
        max: usize,
        streams: u32,
    ) -> Option<(WebTransportSession, Control)> {
        let mut table = self.lock();
        if table.open.len() >= max {
            return None;
        }
        let queued = QUEUED_STREAMS.max(streams as usize);
        let (bi, bi_rx) = mpsc::channel(queued);
        let (uni, uni_rx) = mpsc::channel(queued);
        let (datagrams, datagrams_rx) = mpsc::channel(QUEUED_DATAGRAMS);
        let (closed, closed_rx) = watch::channel(None);
        let (closing_tx, closing) = mpsc::channel(1);
        table.open.insert(id, Inbox { bi, uni, datagrams });
        let early = std::mem::take(&mut table.early);
        for (of, stream) in early {
            if of == id {
                table.route(id, stream);
            } else {
                table.early.push((of, stream));
            }
        }
        let session = WebTransportSession {
            link: Link {
                conn: conn.clone(),
                id,
                // Sessions are opened by a request's task, on quinn's runtime.
                runtime: tokio::runtime::Handle::current(),
                closed: closed_rx,
            },
            path,
            bi: tokio::sync::Mutex::new(bi_rx),
            uni: tokio::sync::Mutex::new(uni_rx),
            datagrams: tokio::sync::Mutex::new(datagrams_rx),
            closing: closing_tx,
            budget: self.budget.clone(),
        };
        Some((session, Control { closed, closing }))
    }

    /// WebTransportSession `id` is over: its streams and datagrams are refused from
    /// now on, and its handler's `accept_*` end once it has taken those
    /// queued.
    pub(crate) fn remove(&self, id: u64) {
        self.lock().open.remove(&id);
    }

    /// A bidirectional stream the peer opened for session `id`.
    pub(crate) fn bi(&self, id: u64, send: SendStream, recv: RecvStream) {
        self.lock().route(id, Early::Bi(send, recv));
    }

    /// A unidirectional stream the peer opened for session `id`.
    pub(crate) fn uni(&self, id: u64, recv: RecvStream) {
        self.lock().route(id, Early::Uni(recv));
    }

    /// A datagram the peer sent: to its session, or dropped (no such
    /// session, a malformed prefix, a handler behind).
    pub(crate) fn datagram(&self, mut datagram: Bytes) {
        let Some((id, prefix)) = wt::datagram_session(&datagram) else {
            return;
        };
        let table = self.lock();
        if let Some(inbox) = table.open.get(&id) {
            let payload = datagram.split_off(prefix);
            let _ = inbox.datagrams.try_send(payload);
        }
    }
}

impl Drop for WebTransportSession {
    /// Streams queued for the handler and never taken are refused
    /// (`WT_SESSION_GONE`), not left to end as if they had been read.
    fn drop(&mut self) {
        let bi = self.bi.get_mut();
        bi.close();
        while let Ok((send, recv)) = bi.try_recv() {
            Early::Bi(send, recv).refuse(wt::code::SESSION_GONE);
        }
        let uni = self.uni.get_mut();
        uni.close();
        while let Ok(recv) = uni.try_recv() {
            Early::Uni(recv).refuse(wt::code::SESSION_GONE);
        }
    }
}
