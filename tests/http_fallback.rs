//! Plain HTTP on the WebSocket port (`Handler::on_http`), on every backend:
//! a health check and a page answered beside the upgrades, `HEAD` without a
//! body, the old refusals when the handler gives no answer, 500 for a
//! panic, request bodies (whole, in pieces, bounded: 413, 411, 400; a
//! refused upload read through so that the client gets the 413);
//! connections kept alive (sequential and pipelined requests, HTTP/1.0 and
//! `Connection: close`, the idle timeout, the bound on requests, an upgrade
//! after a plain request); `Expect: 100-continue` answered before the
//! body (raw, and curl waiting for it); a bare LF, two `Host`s or an
//! HTTP/1.1 request without one refused with 400; and the echo example's
//! `--http-fallback`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::SinkExt;
use rapidws::{
    Accept, Config, Conn, Handler, HttpResponse, Message, Reject, Request, ServerHandler,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

backend_tests!(
    a_connection_carries_many_requests_while_the_client_keeps_it,
    plain_requests_are_answered_beside_upgrades,
    without_an_answer_the_refusals_stay,
    request_bodies_are_read_whole_and_bounded,
    a_refused_upload_is_read_through_so_the_client_gets_the_answer,
    requests_are_read_as_rfc_9112_asks,
);

/// Answers `/healthz` and `/panic` (by panicking); nothing else.
struct Site;

impl Handler for Site {
    type State = ();

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for Site {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        match request.path() {
            "/healthz" => Some(HttpResponse::text(200, "ok\n")),
            "/who" => {
                let agent = request.header_str("user-agent").unwrap_or("?").to_owned();
                Some(HttpResponse::text(
                    200,
                    format!("{} {agent}\n", request.method()),
                ))
            }
            "/panic" => panic!("asked to"),
            "/body" => {
                let body = request.body();
                let mut answer = format!("{} bytes: ", body.len()).into_bytes();
                answer.extend_from_slice(body);
                Some(HttpResponse::new(200, "application/octet-stream", answer))
            }
            _ => None,
        }
    }
}

/// Sends `head` (with `Connection: close` added after its request line,
/// unless it says otherwise) and reads until the server closes.
async fn http(addr: SocketAddr, head: &str) -> String {
    let head = if head.contains("Connection:") {
        head.to_owned()
    } else {
        head.replacen("\r\n", "\r\nConnection: close\r\n", 1)
    };
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("answered and closed within 10 s")
        .unwrap();
    String::from_utf8(response).unwrap()
}

async fn plain_requests_are_answered_beside_upgrades(backend: Backend) {
    let server = common::serve(backend, Site, Config::default(), Arc::default()).await;
    let health = http(server.addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(
        health,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: 3\r\nConnection: close\r\n\r\nok\n"
    );
    let who = http(
        server.addr,
        "POST /who HTTP/1.1\r\nHost: x\r\nUser-Agent: t/1\r\n\r\n",
    )
    .await;
    assert!(who.ends_with("\r\n\r\nPOST t/1\n"), "{who}");
    let head = http(server.addr, "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(head.contains("Content-Length: 3\r\n"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    let panicked = http(server.addr, "GET /panic HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(panicked.starts_with("HTTP/1.1 500 "), "{panicked}");
    // Upgrades on the same port are served as ever.
    let mut client = server.client().await;
    client
        .send(WsMessage::text("still a websocket"))
        .await
        .unwrap();
    assert_eq!(
        next(&mut client).await,
        WsMessage::text("still a websocket")
    );
}

/// One whole response (head and body) from a connection kept alive.
async fn one_response<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<String> {
    read_response(reader, false)
        .await
        .map(|(head, body)| head + &body)
}

/// Whether the server closes the connection within `within` (reads
/// nothing more and sees EOF).
async fn closes_within<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, within: Duration) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(within, reader.read_to_end(&mut rest)).await,
        Ok(Ok(0))
    )
}

async fn a_connection_carries_many_requests_while_the_client_keeps_it(backend: Backend) {
    let config = Config::default().handshake_timeout(Duration::from_millis(500));
    let server = common::serve(backend, Site, config, Arc::default()).await;
    let connect = || async {
        tokio::io::BufReader::new(tokio::net::TcpStream::connect(server.addr).await.unwrap())
    };
    // One after the other, then one that asks to close.
    let mut c = connect().await;
    for _ in 0..3 {
        c.get_mut()
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = one_response(&mut c).await.expect("answered");
        assert!(answer.contains("Connection: keep-alive\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
    }
    c.get_mut()
        .write_all(
            b"POST /body HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
        )
        .await
        .unwrap();
    let answer = one_response(&mut c).await.unwrap();
    assert!(
        answer.contains("Connection: close\r\n") && answer.ends_with("2 bytes: hi"),
        "{answer}"
    );
    assert!(closes_within(&mut c, Duration::from_secs(5)).await);

    // Pipelined: three requests in one write, bodies included.
    let mut c = connect().await;
    c.get_mut()
        .write_all(
            b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nPOST /body HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc\
              HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
    assert!(one_response(&mut c).await.unwrap().ends_with("ok\n"));
    assert!(
        one_response(&mut c)
            .await
            .unwrap()
            .ends_with("3 bytes: abc")
    );
    // HEAD: a length but no body.
    let (head, _) = read_response(&mut c, true).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    // Idle past the handshake timeout: closed.
    assert!(
        closes_within(&mut c, Duration::from_secs(5)).await,
        "closed when idle"
    );

    // HTTP/1.0 closes unless it asks not to.
    let mut c = connect().await;
    c.get_mut()
        .write_all(b"GET /healthz HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    assert!(
        one_response(&mut c)
            .await
            .unwrap()
            .contains("Connection: close")
    );
    assert!(closes_within(&mut c, Duration::from_secs(5)).await);

    // An upgrade after a plain request, on the same connection.
    let mut c = connect().await;
    c.get_mut()
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    one_response(&mut c).await.unwrap();
    c.get_mut()
        .write_all(
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let mut status = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut c, &mut status)
        .await
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 101 "), "{status}");

    // At most 1,000 requests on one connection: the last says close.
    let mut c = connect().await;
    let many = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n".repeat(1001);
    c.get_mut().write_all(many.as_bytes()).await.unwrap();
    for i in 1..=1000 {
        let answer = one_response(&mut c).await.expect("answered");
        let closing = answer.contains("Connection: close\r\n");
        assert_eq!(closing, i == 1000, "response {i}: {answer}");
    }
    assert!(closes_within(&mut c, Duration::from_secs(5)).await);
}

/// The status line and body of a response.
fn status_and_body(response: &str) -> (&str, &str) {
    let (head, body) = response.split_once("\r\n\r\n").expect("a whole response");
    (head.lines().next().unwrap(), body)
}

async fn request_bodies_are_read_whole_and_bounded(backend: Backend) {
    let config = Config::default().max_http_body_size(100_000);
    let server = common::serve(backend, Site, config, Arc::default()).await;
    let post = |length: &str, body: &str| {
        format!("POST /body HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{length}\r\n{body}")
    };
    // Whole, in one write; with no body; binary without a line break.
    let answer = http(server.addr, &post("Content-Length: 5\r\n", "hello")).await;
    assert_eq!(
        status_and_body(&answer),
        ("HTTP/1.1 200 OK", "5 bytes: hello")
    );
    let answer = http(server.addr, &post("", "")).await;
    assert_eq!(status_and_body(&answer), ("HTTP/1.1 200 OK", "0 bytes: "));

    // The head, then the body in pieces, the last one bare of any newline.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(post("Content-Length: 11\r\n", "").as_bytes())
        .await
        .unwrap();
    for piece in ["hel", "lo ", "world"] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        stream.write_all(piece.as_bytes()).await.unwrap();
    }
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert_eq!(status_and_body(&response).1, "11 bytes: hello world");

    // Larger than a read and than the head limit, at the limit exactly.
    let big = "x".repeat(100_000);
    let answer = http(server.addr, &post("Content-Length: 100000\r\n", &big)).await;
    assert_eq!(status_and_body(&answer).1, format!("100000 bytes: {big}"));

    // Refusals, each with its status and reason, without reading a body.
    let too_big = http(server.addr, &post("Content-Length: 100001\r\n", "")).await;
    assert_eq!(
        status_and_body(&too_big),
        ("HTTP/1.1 413 Content Too Large", "request body too large\n")
    );
    let chunked = http(
        server.addr,
        &post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    )
    .await;
    assert!(chunked.starts_with("HTTP/1.1 411 "), "{chunked}");
    assert!(
        chunked.ends_with("no chunked transfer coding)\n"),
        "{chunked}"
    );
    let bad = http(server.addr, &post("Content-Length: 5, 6\r\n", "hello")).await;
    assert_eq!(
        status_and_body(&bad),
        ("HTTP/1.1 400 Bad Request", "invalid Content-Length\n")
    );

    // And the server goes on serving upgrades.
    assert_healthy(server.addr).await;
}

/// Python's `urllib` (like most HTTP clients) sends its whole body before
/// it reads the answer. A 413 answered without reading 20 MB is followed by
/// a close with the rest still coming; unless the server reads it through
/// (bounded: `close_timeout`, 64 MiB), the kernel resets the connection and
/// the client sees "broken pipe" instead of the 413.
async fn a_refused_upload_is_read_through_so_the_client_gets_the_answer(backend: Backend) {
    let config = Config::default().max_http_body_size(100_000);
    let server = common::serve(backend, Site, config, Arc::default()).await;
    let url = format!("http://{}/body", server.addr);
    let script = r#"
import sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[1], data=b"x" * 20_000_000, method="POST")
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except Exception as e:
    print("failed:", e)
"#;
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", script, &url])
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.trim(),
        "413 request body too large",
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_healthy(server.addr).await;
}

async fn without_an_answer_the_refusals_stay(backend: Backend) {
    let server = common::serve(backend, Site, Config::default(), Arc::default()).await;
    let get = http(server.addr, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(get.starts_with("HTTP/1.1 400 "), "{get}");
    let post = http(server.addr, "POST /other HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    assert!(post.contains("Allow: GET\r\n"), "{post}");
}

/// `echo --http-fallback`: the demo page at `/`, `ok` at `/healthz`, 404
/// elsewhere, and the echo on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_example_answers_http_with_its_page() {
    let (_echo, addr) = start_example("echo", &["--http-fallback"]).await;
    let page = http(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(
        page.contains("Content-Type: text/html; charset=utf-8\r\n"),
        "{page}"
    );
    assert!(page.contains("<title>rapidws echo</title>"), "{page}");
    assert!(page.contains("new WebSocket(url)"), "{page}");
    let health = http(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
    let missing = http(addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    client.send(WsMessage::text("echo")).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text("echo"));
}

/// `Expect: 100-continue` gets `100 Continue` before the body is sent,
/// then the answer (a raw client that waits for it, and curl told to wait
/// 30 s for it); a head with a bare LF, with two `Host` fields, or an
/// HTTP/1.1 one without `Host` is refused with 400 and the reason, and
/// the server goes on serving.
async fn requests_are_read_as_rfc_9112_asks(backend: Backend) {
    let server = common::serve(backend, Site, Config::default(), Arc::default()).await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"POST /body HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\
              Expect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        )
        .await
        .unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut interim))
        .await
        .expect("100 Continue before the body")
        .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert_eq!(
        status_and_body(&response),
        ("HTTP/1.1 200 OK", "5 bytes: hello")
    );
    // curl, which waits for the 100 (here up to 30 s) before its body.
    let url = format!("http://{}/body", server.addr);
    let curl = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "-v",
            "--expect100-timeout",
            "30",
            "-H",
            "Expect: 100-continue",
        ])
        .args(["--data-binary", "hello", &url])
        .output();
    let curl = tokio::time::timeout(Duration::from_secs(10), curl)
        .await
        .expect("curl got its 100 and its answer in time")
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&curl.stdout),
        String::from_utf8_lossy(&curl.stderr),
    );
    assert_eq!(out, "5 bytes: hello", "{err}");
    assert!(err.contains("HTTP/1.1 100 Continue"), "{err}");

    for (head, reason) in [
        ("GET /healthz HTTP/1.1\nHost: x\n\n", "bare LF"),
        (
            "GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            "more than one Host header",
        ),
        (
            "GET /healthz HTTP/1.1\r\nX: y\r\n\r\n",
            "missing Host header",
        ),
    ] {
        let answer = http(server.addr, head).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{head:?}: {answer}");
        assert!(answer.contains(reason), "{head:?}: {answer}");
    }
    assert_healthy(server.addr).await;
}
