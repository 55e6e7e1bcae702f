//! Many streams on one connection: smux (xtaci/smux's protocol, versions 1
//! and 2) over a WebSocket or any async byte stream.
//!
//! One [`Mux`] carries any number of [`Stream`]s, each a tokio
//! `AsyncRead + AsyncWrite` with its own half-close, over any async byte
//! stream or a [`WebSocket`](crate::socket::WebSocket)'s binary messages
//! ([`Mux::over_websocket`]). Either side opens streams, whichever dialled.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use rapidws::mux::{Config, Mux, Side};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let tcp = tokio::net::TcpStream::connect("127.0.0.1:9010").await?;
//! let mux = Mux::new(tcp, Side::Dialer, Config::default());
//! let mut stream = mux.open_stream().await?;
//! stream.write_all(b"hello").await?;
//! stream.shutdown().await?; // our FIN; the peer's data still arrives
//! let mut echo = Vec::new();
//! stream.read_to_end(&mut echo).await?;
//! # Ok(()) }
//! ```
//!
//! The protocol is rapidws-core's sans-I/O [`rapidws_core::mux`] (its
//! documentation says what bounds a peer); a task spawned on the runtime
//! `Mux::new` is called on drives it. `docs/streams.md` in the repository
//! has the design.
//!
//! | file | concern |
//! |---|---|
//! | `handle.rs` | [`Mux`]: open, accept, count, close |
//! | `shared.rs` | the state the handle, the streams and the driver share, and who waits on it |
//! | `stream.rs` | [`Stream`]: `AsyncRead`, `AsyncWrite`, half-close, drop |
//! | `driver.rs` | the task between the transport and the protocol |
//! | `messages.rs` | a WebSocket's binary messages as a byte stream |

mod driver;
mod handle;
#[cfg(feature = "socket")]
mod messages;
mod shared;
mod stream;

use std::fmt;
use std::io;
use std::sync::Arc;

pub use handle::Mux;
#[cfg(feature = "socket")]
pub use messages::{MAX_MESSAGE, MessageStream};
pub use rapidws_core::mux::{
    Budget, Config, DEFAULT_BUDGET, INITIAL_WINDOW, MuxError, MuxStats, OpenError, Side, Version,
    default_budget,
};
pub use stream::Stream;

/// Why a mux ended, or why it could not open a stream.
#[derive(Clone, Debug)]
pub enum Error {
    /// The peer broke the protocol (or went silent past the keepalive
    /// timeout).
    Protocol(MuxError),
    /// Reading or writing the transport failed.
    Transport(Arc<io::Error>),
    /// The transport ended (the peer closed it), or [`Mux::close`] ended
    /// the mux.
    Closed,
    /// A stream could not be opened.
    Open(OpenError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Protocol(error) => write!(f, "mux protocol error: {error}"),
            Error::Transport(error) => write!(f, "mux transport failed: {error}"),
            Error::Closed => f.write_str("the mux session is closed"),
            Error::Open(error) => write!(f, "cannot open a mux stream: {error}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(error: Error) -> io::Error {
        let kind = match &error {
            Error::Transport(inner) => inner.kind(),
            Error::Closed | Error::Open(OpenError::Ended) => io::ErrorKind::NotConnected,
            Error::Open(_) => io::ErrorKind::Other,
            Error::Protocol(_) => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, error)
    }
}
