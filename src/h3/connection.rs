//! One QUIC connection on the server: HTTP/3's control streams both ways,
//! the peer's QPACK streams drained, and a task for each request stream.

use std::time::Duration;

use quinn::{Connection, Incoming, RecvStream};
use rapidws_core::h3::frame::{self, FrameHead, kind};
use rapidws_core::h3::{H3Error, Settings, code, varint};
use tokio::sync::oneshot;

use super::request::{self, varint as code_of};
use crate::connection::handler::ServerHandler;

/// Unidirectional stream types (RFC 9114 section 6.2, RFC 9204 section 4.2).
const CONTROL: u64 = 0x00;
const PUSH: u64 = 0x01;
const QPACK_ENCODER: u64 = 0x02;
const QPACK_DECODER: u64 = 0x03;

/// The largest control frame read (SETTINGS and GOAWAY are a few bytes).
const MAX_CONTROL_FRAME: u64 = 16 * 1024;

/// Serves one connection until it closes.
pub(crate) async fn serve<H: ServerHandler>(
    server: crate::stream::Server<H>,
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
    let peer_streams = tokio::spawn(accept_unidirectional(conn.clone(), None));
    let mut requests = tokio::task::JoinSet::new();
    // The first request stream not taken: what a GOAWAY names.
    let mut next_id = 0u64;
    let stopping = loop {
        tokio::select! {
            accepted = conn.accept_bi() => match accepted {
                Ok((send, recv)) => {
                    next_id = u64::from(recv.id()) + 4;
                    requests.spawn(request::serve(server.clone(), conn.clone(), send, recv));
                }
                Err(_) => break false,
            },
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            () = server.shutdown_requested() => break true,
        }
    };
    if stopping {
        // RFC 9114, 5.2: no request past those taken will be; they end (the
        // server closes their WebSockets), then the connection.
        let mut goaway = Vec::with_capacity(16);
        frame::put_head(&mut goaway, kind::GOAWAY, varint::len(next_id) as u64);
        varint::encode(next_id, &mut goaway);
        let _ = control.write_all(&goaway).await;
        while requests.join_next().await.is_some() {}
        conn.close(code_of(code::NO_ERROR), b"");
    }
    peer_streams.abort();
    drop(control);
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

/// Takes the peer's unidirectional streams: one control stream (its
/// SETTINGS go to `settings`, if given), QPACK's two (drained: with no
/// dynamic table they carry nothing we keep), and none of another type
/// (refused, as the RFC allows).
pub(crate) async fn accept_unidirectional(
    conn: Connection,
    mut settings: Option<oneshot::Sender<Settings>>,
) {
    let mut control_seen = false;
    while let Ok(mut recv) = conn.accept_uni().await {
        let Ok(kind) = read_varint(&mut recv).await else {
            continue;
        };
        match kind {
            CONTROL if control_seen => {
                return close(
                    &conn,
                    code::STREAM_CREATION_ERROR,
                    "a second control stream",
                );
            }
            CONTROL => {
                control_seen = true;
                tokio::spawn(read_control(conn.clone(), recv, settings.take()));
            }
            // A client may not push; a server may not unless asked (we
            // never send MAX_PUSH_ID).
            PUSH => return close(&conn, code::STREAM_CREATION_ERROR, "a push stream"),
            QPACK_ENCODER | QPACK_DECODER => {
                tokio::spawn(drain(recv));
            }
            _ => {
                let _ = recv.stop(code_of(code::STREAM_CREATION_ERROR));
            }
        }
    }
}

/// Reads the peer's control stream: SETTINGS first, then frames that
/// concern a server (GOAWAY, MAX_PUSH_ID, CANCEL_PUSH) or none (unknown
/// ones, skipped); its end closes the connection.
async fn read_control(
    conn: Connection,
    mut recv: RecvStream,
    mut sink: Option<oneshot::Sender<Settings>>,
) {
    let mut first = true;
    loop {
        let Ok(head) = read_head(&mut recv).await else {
            return close(
                &conn,
                code::CLOSED_CRITICAL_STREAM,
                "the control stream ended",
            );
        };
        if head.length > MAX_CONTROL_FRAME {
            return close(&conn, code::EXCESSIVE_LOAD, "a control frame over 16 KiB");
        }
        let mut payload = vec![0; head.length as usize];
        if recv.read_exact(&mut payload).await.is_err() {
            return close(
                &conn,
                code::CLOSED_CRITICAL_STREAM,
                "the control stream ended",
            );
        }
        if first && head.kind != kind::SETTINGS {
            return close(
                &conn,
                code::MISSING_SETTINGS,
                "the control stream must start with SETTINGS",
            );
        }
        if head.is_http2_only() {
            return close(
                &conn,
                code::FRAME_UNEXPECTED,
                "a frame type HTTP/3 reserves",
            );
        }
        match head.kind {
            kind::SETTINGS if first => match Settings::decode(&payload) {
                Ok(settings) => {
                    if let Some(sink) = sink.take() {
                        let _ = sink.send(settings);
                    }
                }
                Err(error) => return fail(&conn, error),
            },
            kind::SETTINGS | kind::DATA | kind::HEADERS | kind::PUSH_PROMISE => {
                return close(
                    &conn,
                    code::FRAME_UNEXPECTED,
                    "a frame not allowed on the control stream",
                );
            }
            // A client's GOAWAY concerns pushes, which we never make; a
            // server's tells a client to open no more requests, which the
            // application learns when opening one fails.
            _ => {}
        }
        first = false;
    }
}

async fn drain(mut recv: RecvStream) {
    let mut scratch = [0u8; 256];
    while let Ok(Some(_)) = recv.read(&mut scratch).await {}
}

async fn read_varint(recv: &mut RecvStream) -> Result<u64, ()> {
    let mut bytes = [0u8; 8];
    recv.read_exact(&mut bytes[..1]).await.map_err(|_| ())?;
    let len = 1usize << (bytes[0] >> 6);
    recv.read_exact(&mut bytes[1..len]).await.map_err(|_| ())?;
    varint::decode(&bytes[..len])
        .map(|(value, _)| value)
        .ok_or(())
}

async fn read_head(recv: &mut RecvStream) -> Result<FrameHead, ()> {
    let kind = read_varint(recv).await?;
    let length = read_varint(recv).await?;
    Ok(FrameHead {
        kind,
        length,
        len: 0,
    })
}

fn fail(conn: &Connection, error: H3Error) {
    tracing::debug!(%error, "HTTP/3 connection closed");
    conn.close(code_of(error.code()), error.to_string().as_bytes());
}

fn close(conn: &Connection, code: u64, why: &'static str) {
    tracing::debug!(why, "HTTP/3 connection closed");
    conn.close(code_of(code), why.as_bytes());
}

/// How long the endpoint waits, once the server's connections are closed,
/// for the QUIC connections to finish closing.
pub(crate) const CLOSE_WITHIN: Duration = Duration::from_secs(5);
