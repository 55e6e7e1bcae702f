//! What the bridges share (h2_bridge, h3_bridge: the Autobahn TestSuite
//! over HTTP/2 and HTTP/3, whose client speaks HTTP/1.1 only): the
//! client's upgrade read and checked, the answers, the bytes carried.

use rapidws::rapidws_core::handshake;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head taken (a server's default).
const MAX_HEAD: usize = 8 * 1024;

/// The request fields passed on to the server.
pub const PASSED: [&str; 4] = [
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
    "origin",
];

/// Accepts clients on `listen` and runs `carry` on each in a task of its
/// own (a failure logged), until the process ends.
pub async fn accept_each<F, Fut>(
    listen: std::net::SocketAddr,
    carry: F,
) -> Result<(), super::BoxError>
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = Result<(), super::BoxError>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    loop {
        let Ok((client, peer)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let carrying = carry(client);
        tokio::spawn(async move {
            if let Err(error) = carrying.await {
                tracing::warn!(%peer, %error, "bridge failed");
            }
        });
    }
}

/// A client's upgrade request, checked as a server checks it.
pub struct Upgrade {
    /// The path with its query.
    pub path: String,
    pub key: Vec<u8>,
    /// The `PASSED` fields the request has.
    pub fields: Vec<(&'static str, Vec<u8>)>,
}

impl Upgrade {
    /// The fields as name and value.
    pub fn fields(&self) -> Vec<(&str, &[u8])> {
        self.fields.iter().map(|(n, v)| (*n, &v[..])).collect()
    }
}

/// Reads the client's upgrade request (nothing follows it before our
/// answer); a bad one is answered as a server would, and is the error.
pub async fn read_upgrade(client: &mut TcpStream) -> Result<Upgrade, super::BoxError> {
    let mut head = Vec::new();
    loop {
        let mut fields = handshake::header_buffer();
        match handshake::parse_request(&head, &mut fields, MAX_HEAD) {
            Ok(Some((request, _))) => {
                let path = match request.query() {
                    Some(query) => format!("{}?{query}", request.path()),
                    None => request.path().to_owned(),
                };
                let fields = PASSED
                    .iter()
                    .filter_map(|&name| request.header(name).map(|v| (name, v.to_vec())))
                    .collect();
                let key = request.key().to_vec();
                return Ok(Upgrade { path, key, fields });
            }
            Ok(None) => {}
            Err(error) => {
                let answer = refusal(error.status(), error.reason());
                client.write_all(answer.as_bytes()).await?;
                return Err(error.into());
            }
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err("the client left before its request was whole".into());
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

/// The `101` for `key`, with what the server chose.
pub fn switching(key: &[u8], protocol: Option<&[u8]>, extensions: Option<&[u8]>) -> String {
    let accept: String = handshake::accept_key(key)
        .iter()
        .map(|&b| b as char)
        .collect();
    let mut answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n"
    );
    for (name, value) in [
        ("Sec-WebSocket-Protocol", protocol),
        ("Sec-WebSocket-Extensions", extensions),
    ] {
        if let Some(value) = value {
            answer.push_str(&format!("{name}: {}\r\n", String::from_utf8_lossy(value)));
        }
    }
    answer.push_str("\r\n");
    answer
}

/// An HTTP/1.1 refusal with `reason` as its body.
pub fn refusal(status: u16, reason: &str) -> String {
    format!(
        "HTTP/1.1 {status} Refused\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{reason}\n",
        reason.len() + 1
    )
}

/// Carries bytes both ways between a bridge's `client` and its `server`
/// until both ends are done, each way on its own with its end passed on:
/// a server ends its side after the close handshake while the client may
/// still be sending, and failing to deliver that must not drop what the
/// server sent before it. The result is the server-to-client way's.
pub async fn carry<C, S>(client: C, server: S) -> std::io::Result<u64>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    use tokio::io::AsyncWriteExt;
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let up = async {
        let copied = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
        copied
    };
    let down = async {
        let copied = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
        copied
    };
    let (_, down) = tokio::join!(up, down);
    down
}
