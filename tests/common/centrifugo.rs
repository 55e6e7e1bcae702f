//! What the tests with Centrifugo's JavaScript SDK share: the SDK itself
//! (installed by tests/centrifuge/setup_sdk.sh on first use), and the
//! server HTTP API: one call, or a publisher that keeps its connection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// tests/centrifuge, once its node_modules hold the SDK (npm `centrifuge`)
/// and `ws`.
pub fn sdk_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/centrifuge"));
        let setup = std::process::Command::new("bash")
            .arg(dir.join("setup_sdk.sh"))
            .output()
            .expect("bash runs");
        assert!(
            setup.status.success(),
            "setup_sdk.sh: {}",
            String::from_utf8_lossy(&setup.stderr)
        );
        dir
    })
}

/// `POST /api/publish` on one kept-alive connection, each answer read
/// before the next request.
pub struct ApiPublisher {
    stream: BufReader<TcpStream>,
    key: String,
}

impl ApiPublisher {
    pub async fn connect(server: SocketAddr, key: &str) -> ApiPublisher {
        let stream = TcpStream::connect(server).await.expect("the server's API");
        ApiPublisher {
            stream: BufReader::new(stream),
            key: key.to_owned(),
        }
    }

    /// Publishes `data` to `channel`; the offset the answer gives it.
    pub async fn publish(&mut self, channel: &str, data: &Value) -> u64 {
        let body = json!({"channel": channel, "data": data});
        let answer = call(&mut self.stream, &self.key, "publish", &body).await;
        answer["result"]["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("no offset in {answer}"))
    }
}

/// `POST /api/<method>` with `body` and `key`, on a connection of its
/// own: the JSON answer (a method's error is in it, with status 200).
pub async fn api(server: SocketAddr, key: &str, method: &str, body: &Value) -> Value {
    let stream = TcpStream::connect(server).await.expect("the server's API");
    call(&mut BufReader::new(stream), key, method, body).await
}

/// One call of the API on `stream`, its answer read whole (the
/// connection may carry the next).
async fn call(stream: &mut BufReader<TcpStream>, key: &str, method: &str, body: &Value) -> Value {
    let body = body.to_string();
    // One write: a body sent after its head would wait for the head's
    // acknowledgement (Nagle's algorithm), delayed by the peer.
    let request = format!(
        "POST /api/{method} HTTP/1.1\r\nHost: api\r\nX-API-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .unwrap();
    let (head, body) = super::read_response(stream, false)
        .await
        .unwrap_or_else(|| panic!("an answer to {method}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}
