//! One QUIC connection: HTTP/3's control streams both ways, the peer's
//! QPACK streams read and discarded, and on the server a task for each request
//! stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, Incoming, ReadError, RecvStream};
use rapidws_core::h3::frame::{self, kind};
use rapidws_core::h3::{Settings, code, varint};
use tokio::sync::oneshot;

use super::budget::StreamBudget;
use super::request::{self, Service};
use super::session::{Sessions, WebTransport};
use super::wire::{Unread, close, code_of, fail, read_frame_head, read_head_varint, skip};
use crate::connection::handler::ServerHandler;

/// Unidirectional stream types (RFC 9114 section 6.2, RFC 9204 section 4.2).
const CONTROL: u64 = 0x00;
const PUSH: u64 = 0x01;
const QPACK_ENCODER: u64 = 0x02;
const QPACK_DECODER: u64 = 0x03;
/// A WebTransport session's stream.
const UNI_SESSION: u64 = rapidws_core::h3::webtransport::UNI_STREAM_TYPE;

/// The largest control frame read whole (SETTINGS and GOAWAY are a few
/// bytes); unknown frames of any length are skipped.
const MAX_CONTROL_FRAME: u64 = 16 * 1024;

/// How long a peer's unidirectional stream may take to say its type.
const TYPE_WITHIN: Duration = Duration::from_secs(10);

/// How long the endpoint waits, once the server's connections are closed,
/// for the QUIC connections to finish closing.
pub(crate) const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Serves one connection until it closes. `webtransport`: the handler of
/// its sessions, if they are served.
pub(crate) async fn serve<H: ServerHandler, W: WebTransport>(
    server: crate::stream::Server<H>,
    webtransport: Option<(Arc<W>, StreamBudget)>,
    incoming: Incoming,
    settings: Settings,
) {
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(error) => {
            tracing::debug!(%error, "QUIC handshake failed");
            return;
        }
    };
    let Ok(mut control) = open_control(&conn, settings).await else {
        return;
    };
    let (webtransport, sessions) = match webtransport {
        Some((handler, budget)) => (
            Some(handler),
            Some(Arc::new(Sessions::new(budget.connection(&conn)))),
        ),
        None => (None, None),
    };
    let mut peer = Peer::new(Role::Server, None);
    peer.sessions.clone_from(&sessions);
    let peer_streams = tokio::spawn(accept_unidirectional(conn.clone(), Arc::new(peer)));
    let datagrams = sessions
        .clone()
        .map(|sessions| tokio::spawn(read_datagrams(conn.clone(), sessions)));
    let service = Service {
        server: server.clone(),
        webtransport: webtransport.zip(sessions),
    };
    let mut requests = tokio::task::JoinSet::new();
    // The first request stream not taken: what a GOAWAY names.
    let mut next_id = 0u64;
    let stopping = loop {
        tokio::select! {
            accepted = conn.accept_bi() => match accepted {
                Ok((send, recv)) => {
                    next_id = u64::from(recv.id()) + 4;
                    if let Some((_, sessions)) = &service.webtransport {
                        sessions.seen(u64::from(recv.id()));
                    }
                    requests.spawn(request::serve(service.clone(), conn.clone(), send, recv));
                }
                Err(_) => break false,
            },
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            () = server.shutdown_requested() => break true,
        }
    };
    if stopping {
        // RFC 9114, 5.2: the requests taken end (the server closes their
        // WebSockets); any opened after the GOAWAY are rejected; then the
        // connection closes.
        let mut goaway = Vec::with_capacity(16);
        frame::put_head(&mut goaway, kind::GOAWAY, varint::len(next_id) as u64);
        varint::encode(next_id, &mut goaway);
        let _ = control.write_all(&goaway).await;
        while !requests.is_empty() {
            tokio::select! {
                accepted = conn.accept_bi() => match accepted {
                    Ok((mut send, mut recv)) => {
                        let _ = send.reset(code_of(code::REQUEST_REJECTED));
                        let _ = recv.stop(code_of(code::REQUEST_REJECTED));
                    }
                    Err(_) => break,
                },
                _ = requests.join_next() => {}
            }
        }
        conn.close(code_of(code::NO_ERROR), b"");
    } else {
        // The connection is gone: its requests see their streams fail and
        // end (a session's handler gets its grace); not aborted.
        let ended = async { while requests.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(CLOSE_WITHIN, ended).await;
    }
    peer_streams.abort();
    if let Some(datagrams) = datagrams {
        datagrams.abort();
    }
    drop(control);
}

/// Sends each datagram the peer sends to its session.
async fn read_datagrams(conn: Connection, sessions: Arc<Sessions>) {
    while let Ok(datagram) = conn.read_datagram().await {
        sessions.datagram(datagram);
    }
}

/// Opens our control stream with our SETTINGS. It must stay open as long
/// as the connection: its end is the peer's H3_CLOSED_CRITICAL_STREAM.
pub(crate) async fn open_control(
    conn: &Connection,
    settings: Settings,
) -> Result<quinn::SendStream, quinn::WriteError> {
    let mut control = conn.open_uni().await.map_err(quinn::WriteError::from)?;
    let mut opening = Vec::with_capacity(32);
    varint::encode(CONTROL, &mut opening);
    settings.encode(&mut opening);
    control.write_all(&opening).await?;
    Ok(control)
}

/// Which side of the connection we are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Server,
    Client,
}

/// What the peer's unidirectional streams have told us, shared by their
/// tasks.
pub(crate) struct Peer {
    role: Role,
    control: AtomicBool,
    encoder: AtomicBool,
    decoder: AtomicBool,
    /// Where the peer's SETTINGS go, once.
    settings: Mutex<Option<oneshot::Sender<Settings>>>,
    /// The peer sent GOAWAY: a client opens no more requests.
    going_away: AtomicBool,
    /// The connection's WebTransport sessions, where they are served.
    pub(crate) sessions: Option<Arc<Sessions>>,
}

impl Peer {
    pub(crate) fn new(role: Role, settings: Option<oneshot::Sender<Settings>>) -> Peer {
        Peer {
            role,
            control: AtomicBool::new(false),
            encoder: AtomicBool::new(false),
            decoder: AtomicBool::new(false),
            settings: Mutex::new(settings),
            going_away: AtomicBool::new(false),
            sessions: None,
        }
    }

    /// Whether the peer sent GOAWAY.
    pub(crate) fn is_going_away(&self) -> bool {
        self.going_away.load(Ordering::Acquire)
    }
}

/// Takes the peer's unidirectional streams, each in a task of its own (one
/// that never says its type holds up no other): one control stream, QPACK's
/// two (read and discarded: with no dynamic table they carry nothing we keep; their
/// end closes the connection), none of another type (refused, as the RFC
/// allows).
pub(crate) async fn accept_unidirectional(conn: Connection, peer: Arc<Peer>) {
    let mut streams = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = conn.accept_uni() => match accepted {
                Ok(recv) => {
                    streams.spawn(unidirectional(conn.clone(), peer.clone(), recv));
                }
                Err(_) => return,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
}

async fn unidirectional(conn: Connection, peer: Arc<Peer>, mut recv: RecvStream) {
    let kind = match tokio::time::timeout(TYPE_WITHIN, read_head_varint(&mut recv)).await {
        Ok(Ok(kind)) => kind,
        // Reset before its type was read: the peer's code stands, no stop
        // of ours answers it.
        Ok(Err(Unread::Reset)) => return,
        _ => {
            let _ = recv.stop(code_of(code::STREAM_CREATION_ERROR));
            return;
        }
    };
    let once = |seen: &AtomicBool| !seen.swap(true, Ordering::AcqRel);
    match kind {
        CONTROL if once(&peer.control) => read_control(&conn, &peer, recv).await,
        CONTROL => close(
            &conn,
            code::STREAM_CREATION_ERROR,
            "a second control stream",
        ),
        // A client may not push; a server may not unless asked, and we
        // never send MAX_PUSH_ID (RFC 9114, 4.6).
        PUSH if peer.role == Role::Client => close(&conn, code::ID_ERROR, "a push not asked for"),
        PUSH => close(&conn, code::STREAM_CREATION_ERROR, "a client may not push"),
        QPACK_ENCODER | QPACK_DECODER => {
            let seen = if kind == QPACK_ENCODER {
                &peer.encoder
            } else {
                &peer.decoder
            };
            if !once(seen) {
                return close(&conn, code::STREAM_CREATION_ERROR, "a second QPACK stream");
            }
            drain(&conn, recv).await;
        }
        UNI_SESSION if peer.sessions.is_some() => {
            let id = tokio::time::timeout(TYPE_WITHIN, read_head_varint(&mut recv)).await;
            match (id, &peer.sessions) {
                (Ok(Ok(id)), Some(sessions)) => sessions.uni(id, recv),
                (Ok(Err(Unread::Reset)), _) => {}
                _ => {
                    let _ = recv.stop(code_of(code::STREAM_CREATION_ERROR));
                }
            }
        }
        _ => {
            let _ = recv.stop(code_of(code::STREAM_CREATION_ERROR));
        }
    }
}

/// Reads the peer's control stream: SETTINGS first, then GOAWAY and the
/// push frames, unknown frames skipped; its end closes the connection.
async fn read_control(conn: &Connection, peer: &Peer, mut recv: RecvStream) {
    let ended = "the control stream ended";
    let mut first = true;
    loop {
        let Ok(head) = read_frame_head(&mut recv).await else {
            return close(conn, code::CLOSED_CRITICAL_STREAM, ended);
        };
        if first && head.kind != kind::SETTINGS {
            return close(
                conn,
                code::MISSING_SETTINGS,
                "the control stream must start with SETTINGS",
            );
        }
        if head.is_http2_only() {
            return close(conn, code::FRAME_UNEXPECTED, "a frame type HTTP/3 reserves");
        }
        let known = matches!(
            head.kind,
            kind::SETTINGS | kind::GOAWAY | kind::MAX_PUSH_ID | kind::CANCEL_PUSH
        );
        if !known {
            if matches!(head.kind, kind::DATA | kind::HEADERS | kind::PUSH_PROMISE) {
                return close(
                    conn,
                    code::FRAME_UNEXPECTED,
                    "a frame not allowed on the control stream",
                );
            }
            // Unknown: skipped, whatever its length.
            if skip(&mut recv, head.length).await.is_err() {
                return close(conn, code::CLOSED_CRITICAL_STREAM, ended);
            }
            continue;
        }
        if head.length > MAX_CONTROL_FRAME {
            return close(conn, code::EXCESSIVE_LOAD, "a control frame over 16 KiB");
        }
        let mut payload = vec![0; head.length as usize];
        if recv.read_exact(&mut payload).await.is_err() {
            return close(conn, code::CLOSED_CRITICAL_STREAM, ended);
        }
        match head.kind {
            kind::SETTINGS if first => match Settings::decode(&payload) {
                Ok(settings) => {
                    let sink = peer.settings.lock().ok().and_then(|mut sink| sink.take());
                    if let Some(sink) = sink {
                        let _ = sink.send(settings);
                    }
                }
                Err(error) => return fail(conn, error),
            },
            kind::SETTINGS => {
                return close(conn, code::FRAME_UNEXPECTED, "a second SETTINGS frame");
            }
            // From a server, MAX_PUSH_ID is a client's frame.
            kind::MAX_PUSH_ID if peer.role == Role::Client => {
                return close(conn, code::FRAME_UNEXPECTED, "MAX_PUSH_ID from a server");
            }
            // A server's GOAWAY: no more requests on this connection
            // (`Client::open_websocket` refuses them). A client's concerns
            // pushes, which we never make.
            kind::GOAWAY => peer.going_away.store(true, Ordering::Release),
            _ => {}
        }
        first = false;
    }
}

/// Reads a QPACK stream to its end; its end (a FIN or a reset, not the
/// connection's) closes the connection, as RFC 9204 (4.2) asks.
async fn drain(conn: &Connection, mut recv: RecvStream) {
    let mut scratch = [0u8; 256];
    loop {
        match recv.read(&mut scratch).await {
            Ok(Some(_)) => {}
            Ok(None) | Err(ReadError::Reset(_)) => {
                return close(conn, code::CLOSED_CRITICAL_STREAM, "a QPACK stream ended");
            }
            Err(_) => return,
        }
    }
}
