//! The client's upgrade over a connected stream: the request written by
//! `handshake::ClientRequest`, the response read until its head is complete
//! and checked by `handshake::ClientHandshake`. Plumbing only: every rule is
//! in the sans-I/O handshake.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, timeout_at};

use super::Asked;
use super::error::{ConnectError, MAX_REFUSAL_BODY, Refusal, Stage};
use super::url::Url;
use crate::connection::config::Config;
use crate::handshake::{ClientHandshakeError, ClientRequest, header_buffer, parse_response};
use crate::proto::WriteQueue;
use crate::proto::deflate::DeflateParams;

/// The server's `101` (over HTTP/3, its `200`), as the client keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    headers: Vec<(String, Vec<u8>)>,
    protocol: Option<String>,
    deflate: Option<DeflateParams>,
}

impl Response {
    pub(crate) fn new(
        headers: Vec<(String, Vec<u8>)>,
        protocol: Option<String>,
        deflate: Option<DeflateParams>,
    ) -> Response {
        Response {
            headers,
            protocol,
            deflate,
        }
    }

    /// The subprotocol the server chose (one of those offered), if any.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// The permessage-deflate parameters agreed, if it was offered
    /// (`Config::permessage_deflate`) and the server accepted.
    pub fn deflate(&self) -> Option<&DeflateParams> {
        self.deflate.as_ref()
    }

    /// The first value of header `name` (matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Every header field of the `101`, in order.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
    }
}

/// The `Host` header's value for `url`.
pub(crate) fn host_header(url: &Url) -> String {
    url.authority(if url.scheme == "wss" { 443 } else { 80 })
}

/// The sans-I/O request for `url` with the caller's additions.
pub(crate) fn client_request<'a>(
    host: &'a str,
    url: &'a Url,
    protocols: &'a [&'a str],
    headers: &'a [(&'a str, &'a str)],
    config: &Config,
) -> ClientRequest<'a> {
    let request = ClientRequest::new(host, &url.target)
        .protocols(protocols)
        .headers(headers);
    match config.deflate() {
        Some(deflate) => request.permessage_deflate(*deflate),
        None => request,
    }
}

/// An upgrade that went through: the server answered `101 Switching Protocols`.
pub(crate) struct Switched {
    pub(crate) response: Response,
    /// Bytes that came after the `101`: the server's first frames.
    pub(crate) prefix: BytesMut,
}

/// Writes the upgrade request for `url` over `stream` and reads the answer,
/// all before `deadline`.
pub(crate) async fn upgrade<S>(
    stream: &mut S,
    url: &Url,
    request: &Asked,
    config: &Config,
    deadline: Instant,
) -> Result<Switched, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = host_header(url);
    let protocols = request.protocols();
    let headers = request.header_pairs();
    let client_request = client_request(&host, url, &protocols, &headers, config);
    let mut queue = WriteQueue::new();
    let handshake = client_request
        .write(&mut queue)
        .map_err(ConnectError::Request)?;
    let mut bytes = Vec::new();
    queue.move_into(&mut bytes);

    let timed_out = |_| ConnectError::Timeout(Stage::Handshake);
    timeout_at(deadline, async {
        stream.write_all(&bytes).await?;
        stream.flush().await
    })
    .await
    .map_err(timed_out)?
    .map_err(ConnectError::Io)?;

    let max_head = config.max_handshake_size;
    let mut buf = BytesMut::with_capacity(1024);
    let mut ended = false;
    loop {
        let mut fields = header_buffer();
        let parsed =
            parse_response(&buf, &mut fields, max_head).map_err(ConnectError::Handshake)?;
        let Some((response, head_len)) = parsed else {
            if ended {
                return Err(ConnectError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection during the handshake",
                )));
            }
            let n = timeout_at(deadline, read_some(stream, &mut buf, max_head))
                .await
                .map_err(timed_out)?
                .map_err(ConnectError::Io)?;
            ended = n == 0;
            continue;
        };
        if is_interim(response.status()) {
            // An informational response (`100 Continue`, `103 Early
            // Hints`): HTTP/1.1 clients skip it and read on (RFC 9110,
            // 15.2). Each is bounded like any head, and all by `deadline`.
            let _ = buf.split_to(head_len);
            continue;
        }
        let headers: Vec<(String, Vec<u8>)> = response
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect();
        if response.status() != 101 {
            let status = response.status();
            let body = read_body(stream, buf.split_off(head_len), &headers, deadline).await;
            return Err(ConnectError::Status(Box::new(Refusal {
                status,
                headers,
                body,
            })));
        }
        let accepted = handshake.check(&response).map_err(|e| match e {
            ClientHandshakeError::NotSwitching { .. } => unreachable!("checked above"),
            e => ConnectError::Handshake(e),
        })?;
        let response = Response {
            headers,
            protocol: accepted.protocol.map(str::to_owned),
            deflate: accepted.deflate,
        };
        // Only what came after the head, in a buffer of its size: the
        // read buffer's capacity is not kept for the connection's life.
        let prefix = BytesMut::from(&buf[head_len..]);
        return Ok(Switched { response, prefix });
    }
}

/// A `1xx` other than `101`: a response before the real one.
fn is_interim(status: u16) -> bool {
    (100..200).contains(&status) && status != 101
}

/// Reads once into `buf`, at most up to `max` bytes in all (plus one, so
/// that a head over the limit shows).
async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    max: usize,
) -> std::io::Result<usize> {
    let room = (max + 1).saturating_sub(buf.len()).clamp(1, 4096);
    buf.reserve(room);
    let mut limited = (&mut *stream).take(room as u64);
    limited.read_buf(buf).await
}

/// The body of a refusal: up to its `Content-Length` (or what already came,
/// without one), at most `MAX_REFUSAL_BODY` bytes, as far as it arrives
/// before `deadline`.
async fn read_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut body: BytesMut,
    headers: &[(String, Vec<u8>)],
    deadline: Instant,
) -> Bytes {
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
    let want = length.unwrap_or(body.len()).min(MAX_REFUSAL_BODY);
    while body.len() < want {
        let more = timeout_at(deadline, read_some(stream, &mut body, want - 1)).await;
        if !matches!(more, Ok(Ok(n)) if n > 0) {
            break;
        }
    }
    body.truncate(want);
    body.freeze()
}
