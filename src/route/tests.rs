use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};
use tokio::sync::mpsc;

use super::*;
use crate::connection::proxied::ProxyProtocol;

const PEER: &str = "127.0.0.1:40000";

/// What a route tells: its name, the first bytes it read, the peer.
type Told = mpsc::UnboundedReceiver<(&'static str, Vec<u8>, SocketAddr)>;

/// A router whose routes say their name, and what they read first, on
/// `told`.
fn routes(routes: Vec<(&'static str, Matcher)>) -> (Router<DuplexStream>, Told) {
    let (tell, told) = mpsc::unbounded_channel();
    let mut router = Router::new().sniff_timeout(Duration::from_secs(2));
    for (name, matcher) in routes {
        let tell = tell.clone();
        router = router.route_to(matcher, move |mut routed: Routed<DuplexStream>| {
            let tell = tell.clone();
            async move {
                let mut first = vec![0; 64];
                let n = routed.stream.read(&mut first).await.unwrap();
                first.truncate(n);
                let _ = tell.send((name, first, routed.peer));
            }
        });
    }
    (router, told)
}

/// Routes what `send` writes (in pieces of `piece` bytes, then waits);
/// the route that took it, if any.
async fn routed_to(
    router: &Router<DuplexStream>,
    told: &mut Told,
    send: &[u8],
    piece: usize,
) -> Option<(&'static str, Vec<u8>, SocketAddr)> {
    let (mut near, far) = duplex(1 << 16);
    let send = send.to_vec();
    // The writer ends (the peer's side closes) once all is sent: a route
    // that decided earlier may have gone already, and the pipe with it.
    let writer = tokio::spawn(async move {
        for chunk in send.chunks(piece) {
            if near.write_all(chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    router.route(far, PEER.parse().unwrap()).await;
    writer.await.unwrap();
    told.try_recv().ok()
}

#[tokio::test]
async fn the_first_route_that_takes_it_wins_and_gets_every_byte() {
    let (router, mut told) = routes(vec![
        ("h2", Matcher::http2()),
        ("http", Matcher::http1()),
        ("smux", Matcher::smux()),
        ("magic", Matcher::prefix(&b"MAGIC"[..])),
        ("rest", Matcher::any()),
    ]);
    let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    for piece in [get.len(), 1, 3] {
        let (name, first, _) = routed_to(&router, &mut told, get, piece).await.unwrap();
        assert_eq!(name, "http");
        assert!(get.starts_with(&first) && !first.is_empty(), "{piece}");
    }
    let preface = matchers::HTTP2_PREFACE;
    assert_eq!(
        routed_to(&router, &mut told, preface, 5).await.unwrap().0,
        "h2"
    );
    let syn = [2, 0, 0, 0, 1, 0, 0, 0];
    assert_eq!(
        routed_to(&router, &mut told, &syn, 1).await.unwrap().0,
        "smux"
    );
    assert_eq!(
        routed_to(&router, &mut told, b"MAGIC!", 2).await.unwrap().0,
        "magic"
    );
    // "MAG" could still be MAGIC (or an HTTP method): "MAGix" is decided
    // at its fourth byte.
    assert_eq!(
        routed_to(&router, &mut told, b"MAGix", 1).await.unwrap().0,
        "rest"
    );
    assert_eq!(router.stats().routed, 7);
}

#[tokio::test]
async fn unclaimed_silent_and_endless_connections_are_closed_and_counted() {
    let (router, mut told) = routes(vec![("http", Matcher::http1()), ("smux", Matcher::smux())]);
    assert!(
        routed_to(&router, &mut told, b"\x16\x03\x01", 3)
            .await
            .is_none()
    );
    assert_eq!(router.stats().unclaimed, 1);
    // Nothing at all within the timeout.
    let (_near, far) = duplex(64);
    router.route(far, PEER.parse().unwrap()).await;
    assert_eq!(router.stats().timed_out, 1);
    // A request line that never ends: the byte bound.
    let router = router.max_sniff_bytes(1024);
    let mut endless = b"GET /".to_vec();
    endless.resize(4096, b'a');
    assert!(
        routed_to(&router, &mut told, &endless, 4096)
            .await
            .is_none()
    );
    assert_eq!(router.stats().too_long, 1);
    // The peer leaving before a decision.
    assert!(routed_to(&router, &mut told, b"GE", 2).await.is_none());
    assert_eq!(router.stats().gone, 1);
    assert_eq!(router.stats().routed, 0);
}

#[tokio::test]
async fn tls_routes_by_alpn_and_server_name() {
    let (router, mut told) = routes(vec![
        ("h2", Matcher::tls().alpn(b"h2")),
        ("named", Matcher::tls().server_name("ONE.port.test")),
        ("tls", Matcher::tls()),
    ]);
    // Hellos as real clients sent them (rapidws-core's sniff tests').
    let openssl: &[u8] = include_bytes!("../../core/src/sniff/hello/openssl.bin");
    let python: &[u8] = include_bytes!("../../core/src/sniff/hello/python.bin");
    let (name, first, _) = routed_to(&router, &mut told, openssl, 100).await.unwrap();
    assert_eq!((name, &first[..5]), ("h2", &openssl[..5]));
    assert_eq!(
        routed_to(&router, &mut told, python, 64).await.unwrap().0,
        "named"
    );
    let (router, mut told) = routes(vec![
        ("h2", Matcher::tls().alpn(b"h2")),
        ("tls", Matcher::tls()),
    ]);
    assert_eq!(
        routed_to(&router, &mut told, python, 517).await.unwrap().0,
        "tls"
    );
}

#[tokio::test]
async fn a_proxy_header_comes_first_and_names_the_peer() {
    let (router, mut told) = routes(vec![("http", Matcher::http1())]);
    let router = router.proxy_protocol(ProxyProtocol::required());
    let mut send = b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 80\r\n".to_vec();
    send.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    let (name, first, peer) = routed_to(&router, &mut told, &send, 4).await.unwrap();
    assert_eq!(name, "http");
    assert!(first.starts_with(b"GET"), "the header is not the route's");
    assert_eq!(peer, "192.0.2.7:5000".parse().unwrap());
    // Without it, or from a source not listed: closed.
    assert!(
        routed_to(&router, &mut told, b"GET / HTTP/1.1\r\n\r\n", 64)
            .await
            .is_none()
    );
    let listed = ["10.0.0.0/8".parse().unwrap()];
    let router = router.proxy_protocol(ProxyProtocol::required().from_sources(listed));
    assert!(routed_to(&router, &mut told, &send, 64).await.is_none());
    assert_eq!(router.stats().proxy_refused, 2);
}
