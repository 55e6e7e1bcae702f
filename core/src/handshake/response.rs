//! Writing the handshake response: `101 Switching Protocols` or an HTTP error.
//!
//! Everything is formatted straight into the connection's write queue; the
//! accept key is computed in a stack buffer. No heap allocation.

use std::fmt::Write as _;

use base64::Engine;
use sha1::{Digest, Sha1};

use crate::proto::WriteQueue;
use crate::proto::deflate::DeflateParams;

/// The `101` up to the accept key.
const RESPONSE_START: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\n\
    Upgrade: websocket\r\n\
    Connection: Upgrade\r\n\
    Sec-WebSocket-Accept: ";

/// The GUID RFC 6455 §1.3 appends to the client's key.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The `Sec-WebSocket-Accept` value for a client key: base64(SHA-1(key + GUID)).
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    let digest = sha.finalize();
    let mut out = [0u8; 28];
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(digest, &mut out)
        .expect("20 bytes encode to exactly 28 base64 characters");
    debug_assert_eq!(written, 28);
    out
}

/// Queues the `101 Switching Protocols` response, with the chosen subprotocol
/// and the agreed permessage-deflate parameters, if any.
pub fn write_accept(
    out: &mut WriteQueue,
    key: &[u8],
    protocol: Option<&str>,
    deflate: Option<&DeflateParams>,
) {
    out.push_raw(RESPONSE_START);
    out.push_raw(&accept_key(key));
    if let Some(protocol) = protocol {
        out.push_raw(b"\r\nSec-WebSocket-Protocol: ");
        out.push_raw(protocol.as_bytes());
    }
    out.push_raw(b"\r\n");
    if let Some(deflate) = deflate {
        super::negotiate::write_response_header(deflate, |piece| out.push_raw(piece));
    }
    out.push_raw(b"\r\n");
}

/// Queues `100 Continue`: the client that sent `Expect: 100-continue` may
/// send its body (the final answer follows once it is read).
pub fn write_continue(out: &mut WriteQueue) {
    out.push_raw(b"HTTP/1.1 100 Continue\r\n\r\n");
}

/// Queues an error response with a one-line plain-text body, then the server
/// closes the connection. A 426 carries `Sec-WebSocket-Version: 13` and a 405
/// carries `Allow: GET`, as RFC 6455 and RFC 9110 ask.
pub fn write_error(out: &mut WriteQueue, status: u16, reason: &str) {
    let clean = first_line(reason);
    let mut head = HeadWriter(out);
    let _ = write!(
        head,
        "HTTP/1.1 {status} {}\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\n\
         Connection: close\r\n",
        status_text(status),
        clean.len() + 1,
    );
    if let Some((name, value)) = error_header(status) {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    out.push_raw(b"\r\n");
    out.push_raw(clean.as_bytes());
    out.push_raw(b"\n");
}

/// The header field an error response with `status` must carry: a 426
/// names the version we speak (RFC 6455 §4.4), a 405 the method we allow
/// (RFC 9110 §15.5.6). Every server path adds it, raw or through hyper.
pub fn error_header(status: u16) -> Option<(&'static str, &'static str)> {
    match status {
        426 => Some(("Sec-WebSocket-Version", "13")),
        405 => Some(("Allow", "GET")),
        _ => None,
    }
}

/// The first line of `text`: what a reason or a content type may put in a
/// response, so that a handler's text cannot add header fields or break it.
pub fn first_line(text: &str) -> &str {
    text.split(['\r', '\n']).next().unwrap_or("")
}

/// Whether `name: value` may go into a plain response as a header of the
/// handler's own: a name that is an HTTP token and not one the response
/// writes itself (`Content-Type`, `Content-Length`, `Connection`,
/// `Transfer-Encoding`: a second one would change how the peer reads the
/// body), and a value with no control character but tab (CR and LF above
/// all: they would start a header of the value's choosing).
pub fn header_allowed(name: &str, value: &str) -> bool {
    let reserved = [
        "content-type",
        "content-length",
        "connection",
        "transfer-encoding",
    ]
    .iter()
    .any(|r| name.eq_ignore_ascii_case(r));
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    let clean = value.bytes().all(|b| b == b'\t' || !b.is_ascii_control());
    token && clean && !reserved
}

/// Queues a plain HTTP response (the handler's answer to a request that is
/// not an upgrade): status, `Content-Type`, the `headers` given (those
/// [`header_allowed`] refuses are left out), `Content-Length`, `Connection: close` (the server
/// closes after it) or, with `keep_alive`, `Connection: keep-alive` (it
/// reads the next request), and the body unless `head_only` (a `HEAD`
/// request).
pub fn write_http_response(
    out: &mut WriteQueue,
    status: u16,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    head_only: bool,
    keep_alive: bool,
) {
    let content_type = first_line(content_type);
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut head = HeadWriter(out);
    let _ = write!(
        head,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\n",
        status_text(status),
    );
    for (name, value) in headers.iter().filter(|(n, v)| header_allowed(n, v)) {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let _ = write!(
        head,
        "Content-Length: {}\r\nConnection: {connection}\r\n\r\n",
        body.len(),
    );
    if !head_only {
        out.push_raw(body);
    }
}

/// The reason phrase for the statuses a WebSocket server uses.
pub fn status_text(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// `fmt::Write` into the write queue, for the numbers in an HTTP head (the
/// error response here, the client's request line).
pub(super) struct HeadWriter<'q>(pub(super) &'q mut WriteQueue);

impl std::fmt::Write for HeadWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.push_raw(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    fn text(q: &WriteQueue) -> String {
        let mut slices = [IoSlice::new(&[]); 4];
        let n = q.io_slices(&mut slices);
        let bytes: Vec<u8> = slices[..n].iter().flat_map(|s| s.to_vec()).collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn accept_key_matches_the_rfc_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            &accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn writes_a_101_with_and_without_protocol() {
        let mut q = WriteQueue::new();
        write_accept(&mut q, b"dGhlIHNhbXBsZSBub25jZQ==", None, None);
        assert_eq!(
            text(&q),
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        );
        let mut q = WriteQueue::new();
        write_accept(&mut q, b"dGhlIHNhbXBsZSBub25jZQ==", Some("chat"), None);
        assert!(
            text(&q)
                .ends_with("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: chat\r\n\r\n")
        );
    }

    #[test]
    fn error_responses_carry_status_reason_and_required_headers() {
        let mut q = WriteQueue::new();
        write_error(&mut q, 426, "unsupported Sec-WebSocket-Version, use 13");
        let t = text(&q);
        assert!(t.starts_with("HTTP/1.1 426 Upgrade Required\r\n"), "{t}");
        assert!(t.contains("\r\nSec-WebSocket-Version: 13\r\n"));
        assert!(t.contains("\r\nConnection: close\r\n"));
        let body = "unsupported Sec-WebSocket-Version, use 13\n";
        assert!(t.contains(&format!("Content-Length: {}\r\n", body.len())));
        assert!(t.ends_with(&format!("\r\n\r\n{body}")));

        let mut q = WriteQueue::new();
        write_error(&mut q, 405, "use GET");
        assert!(text(&q).contains("\r\nAllow: GET\r\n"));
    }

    #[test]
    fn a_reason_cannot_inject_headers() {
        let mut q = WriteQueue::new();
        write_error(&mut q, 403, "no\r\nSet-Cookie: x=1");
        let t = text(&q);
        assert!(!t.contains("Set-Cookie"));
        assert!(t.ends_with("\r\n\r\nno\n"));
    }

    #[test]
    fn plain_responses_carry_length_and_close_and_no_body_for_head() {
        let mut q = WriteQueue::new();
        write_http_response(
            &mut q,
            200,
            "text/html\r\nSet-Cookie: x=1",
            &[],
            b"<p>hi</p>",
            false,
            false,
        );
        assert_eq!(
            text(&q),
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 9\r\n\
             Connection: close\r\n\r\n<p>hi</p>"
        );
        let mut q = WriteQueue::new();
        write_http_response(&mut q, 404, "text/plain", &[], b"missing\n", true, false);
        let t = text(&q);
        assert!(t.starts_with("HTTP/1.1 404 Not Found\r\n"), "{t}");
        assert!(
            t.ends_with("Content-Length: 8\r\nConnection: close\r\n\r\n"),
            "{t}"
        );
        let mut q = WriteQueue::new();
        write_http_response(&mut q, 200, "text/plain", &[], b"ok", false, true);
        assert!(text(&q).ends_with("Connection: keep-alive\r\n\r\nok"));
    }

    #[test]
    fn extra_headers_come_after_the_type_and_cannot_split_the_head() {
        let mut q = WriteQueue::new();
        let headers = [
            ("WWW-Authenticate", "Bearer realm=\"bus\""),
            ("Retry-After", "5\r\nSet-Cookie: x=1"),
            ("Content-Length", "0"),
            ("Bad Name", "x"),
            ("Cache-Control", "no-store"),
        ];
        write_http_response(&mut q, 401, "text/plain", &headers, b"no\n", false, false);
        assert_eq!(
            text(&q),
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\n\
             WWW-Authenticate: Bearer realm=\"bus\"\r\nCache-Control: no-store\r\n\
             Content-Length: 3\r\nConnection: close\r\n\r\nno\n"
        );
    }
}
