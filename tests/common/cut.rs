//! A TCP proxy a test controls: it forwards every connection to one
//! address, and can cut them all at once (a network that drops) or refuse
//! new ones for a while (a server that is away).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy's controls; dropping it stops accepting.
pub struct CutProxy {
    pub addr: SocketAddr,
    cut: watch::Sender<u64>,
    away: Arc<AtomicBool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cuts) = watch::channel(0u64);
        let away = Arc::new(AtomicBool::new(false));
        let refusing = away.clone();
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cuts = cuts.clone();
                cuts.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cuts.changed() => {}
                    }
                    // Dropped here: both sides see the connection end, with
                    // no close handshake.
                });
            }
        });
        CutProxy {
            addr,
            cut,
            away,
            accepting,
        }
    }

    /// Cuts every connection open now.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// While `away`, new connections are closed as soon as accepted.
    pub fn set_away(&self, away: bool) {
        self.away.store(away, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}
