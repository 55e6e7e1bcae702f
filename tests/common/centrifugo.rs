//! What the tests with Centrifugo's JavaScript SDK share: the SDK itself
//! (installed by tests/centrifuge/setup_sdk.sh on first use), and a
//! publisher on the server HTTP API that keeps its connection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

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
    pub async fn publish(&mut self, channel: &str, data: &serde_json::Value) -> u64 {
        let body = serde_json::json!({"channel": channel, "data": data}).to_string();
        // One write: a body sent after its head would wait for the
        // head's acknowledgement (Nagle's algorithm), delayed by the peer.
        let request = format!(
            "POST /api/publish HTTP/1.1\r\nHost: api\r\nX-API-Key: {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.key,
            body.len()
        );
        let stream = self.stream.get_mut();
        stream.write_all(request.as_bytes()).await.unwrap();
        let (head, body) = super::read_response(&mut self.stream, false)
            .await
            .expect("an answer to the publish");
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        answer["result"]["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("no offset in {body}"))
    }
}
