//! The physical limit: echoes bytes with no WebSocket at all (no upgrade, no
//! framing). A 64 KiB buffer per connection, one read then one write.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() {
    rapidws_baselines::serve(|mut stream, _args| async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stream.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}
