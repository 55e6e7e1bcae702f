//! The client side: WebSockets opened on an HTTP/3 connection with an
//! extended CONNECT (RFC 9220).

use std::io;
use std::time::Duration;

use std::sync::Arc;

use rapidws_core::h3::{Settings, put_headers, qpack};
use tokio::task::JoinHandle;

use super::connection::{Peer, Role, accept_unidirectional, open_control};
use super::data::DataStream;
use super::wire::{HeadError, Opening, read_headers};

/// How long [`Client::new`] waits for the server's SETTINGS.
const SETTINGS_WITHIN: Duration = Duration::from_secs(10);

/// The largest response head read.
const MAX_RESPONSE_HEAD: usize = 16 * 1024;

/// How long [`Client::open_websocket`] waits for the response.
const RESPONSE_WITHIN: Duration = Duration::from_secs(10);

/// An HTTP/3 connection's client side, for WebSockets: opened on a QUIC
/// connection whose ALPN is `h3` (quinn's, dialled by the caller), it
/// sends its SETTINGS, learns the server's, and opens each WebSocket on a
/// request stream of its own ([`Client::open_websocket`]).
///
/// HTTP/3's own streams (ours and the server's control streams) live as
/// long as the QUIC connection, not as this handle: WebSockets opened
/// through it go on after it is dropped. Close the connection (with
/// `H3_NO_ERROR`, 0x100) when done with it.
pub struct Client {
    conn: quinn::Connection,
    server: Settings,
    peer: Arc<Peer>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("remote", &self.conn.remote_address())
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// A response's head: its status and fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    status: u16,
    fields: Vec<(String, Vec<u8>)>,
}

impl Response {
    /// The status: 200 opened the WebSocket.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The first field named `name` (lowercase).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| &value[..])
    }

    /// Every field but `:status`, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter().map(|(n, v)| (n.as_str(), &v[..]))
    }
}

impl Client {
    /// Starts HTTP/3 on `conn`: sends our SETTINGS and waits (at most
    /// 10 s) for the server's, which must allow extended CONNECT.
    pub async fn new(conn: quinn::Connection) -> io::Result<Client> {
        let control = open_control(&conn, Settings::default())
            .await
            .map_err(io::Error::from)?;
        let (sink, settings) = tokio::sync::oneshot::channel();
        let peer = Arc::new(Peer::new(Role::Client, Some(sink)));
        let peer_streams = tokio::spawn(accept_unidirectional(conn.clone(), peer.clone()));
        // Our control stream stays open until the connection closes.
        let closed = conn.clone();
        let keeper: JoinHandle<()> = tokio::spawn(async move {
            closed.closed().await;
            drop(control);
        });
        let stop = || {
            peer_streams.abort();
            keeper.abort();
        };
        let server = match tokio::time::timeout(SETTINGS_WITHIN, settings).await {
            Ok(Ok(server)) => server,
            Ok(Err(_)) => {
                stop();
                let why = conn.close_reason().map_or_else(
                    || "the server's control stream ended before its SETTINGS".to_owned(),
                    |reason| {
                        format!("the connection closed before the server's SETTINGS: {reason}")
                    },
                );
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, why));
            }
            Err(_) => {
                stop();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no SETTINGS from the server within 10 s",
                ));
            }
        };
        if !server.enable_connect_protocol {
            stop();
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the server does not take WebSockets over HTTP/3 (its SETTINGS do not enable \
                 extended CONNECT, RFC 9220)",
            ));
        }
        Ok(Client { conn, server, peer })
    }

    /// The server's SETTINGS.
    pub fn server_settings(&self) -> &Settings {
        &self.server
    }

    /// The QUIC connection.
    pub fn quic(&self) -> &quinn::Connection {
        &self.conn
    }

    /// Opens a WebSocket to `path` at `authority` (`host:port`) with
    /// `fields` (lowercase names: `sec-websocket-protocol`,
    /// `sec-websocket-extensions`, `origin`...; `sec-websocket-version: 13`
    /// is added). The response comes with the stream: on a `200` it
    /// carries the WebSocket's bytes (the frames are the caller's: this is
    /// the transport), on another status the response's body. Interim
    /// (1xx) responses are skipped; the final one must come within 10 s.
    /// After the server's GOAWAY this refuses (`ConnectionRefused`): open a
    /// new connection.
    pub async fn open_websocket(
        &self,
        authority: &str,
        path: &str,
        fields: &[(&str, &[u8])],
    ) -> io::Result<(Response, DataStream)> {
        if self.peer.is_going_away() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the server sent GOAWAY: no new requests on this connection",
            ));
        }
        let (mut send, mut recv) = self.conn.open_bi().await?;
        let head: [(&[u8], &[u8]); 6] = [
            (b":method", b"CONNECT"),
            (b":protocol", b"websocket"),
            (b":scheme", b"https"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"sec-websocket-version", b"13"),
        ];
        let rest = fields.iter().map(|&(name, value)| (name.as_bytes(), value));
        let mut request = Vec::new();
        put_headers(head.into_iter().chain(rest), &mut request);
        send.write_all(&request).await?;
        let response = tokio::time::timeout(RESPONSE_WITHIN, final_response(&mut recv))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no response within 10 s"))??;
        Ok((
            response,
            DataStream::new(self.conn.clone(), send, recv, None),
        ))
    }
}

/// Reads response heads until a final one (interim, 1xx, ones skipped).
async fn final_response(recv: &mut quinn::RecvStream) -> io::Result<Response> {
    loop {
        // Without sessions asked for, every opening is a head.
        let Opening::Head(payload) =
            read_headers(recv, MAX_RESPONSE_HEAD, false)
                .await
                .map_err(|error| match error {
                    HeadError::Gone => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream ended before the response",
                    ),
                    HeadError::Unexpected(why) => io::Error::new(io::ErrorKind::InvalidData, why),
                    HeadError::TooLarge => {
                        io::Error::new(io::ErrorKind::InvalidData, "a response head over 16 KiB")
                    }
                })?
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a WebTransport stream where a response was due",
            ));
        };
        let section = qpack::decode(&payload, MAX_RESPONSE_HEAD)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        let response = response(&section)?;
        match response.status {
            101 => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a 101 (HTTP/3 has no Upgrade)",
                ));
            }
            100..=199 => continue,
            _ => return Ok(response),
        }
    }
}

/// A response head from its fields: `:status` first and only, three
/// digits.
fn response(section: &qpack::FieldSection) -> io::Result<Response> {
    let bad = |why: &'static str| io::Error::new(io::ErrorKind::InvalidData, why);
    let mut fields = section.iter();
    let status = match fields.next() {
        Some((b":status", value)) if value.len() == 3 => std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.parse::<u16>().ok())
            .filter(|status| (100..600).contains(status))
            .ok_or_else(|| bad("a :status that is not a status"))?,
        _ => return Err(bad("a response that does not start with :status")),
    };
    let fields = fields
        .map(|(name, value)| {
            if name.starts_with(b":") {
                return Err(bad("a pseudo-field other than :status in a response"));
            }
            let name = std::str::from_utf8(name).map_err(|_| bad("a field name not UTF-8"))?;
            Ok((name.to_owned(), value.to_vec()))
        })
        .collect::<io::Result<_>>()?;
    Ok(Response { status, fields })
}
