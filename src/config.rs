//! Server configuration: limits, timeouts and buffer sizes, with defaults that
//! suit a public server.

use std::time::Duration;

use crate::proto::Limits;
use crate::proto::deflate::DeflateConfig;

/// Settings shared by every connection of a server.
///
/// ```
/// use std::time::Duration;
/// let config = rapidws::Config::default()
///     .max_message_size(1 << 20)
///     .handshake_timeout(Duration::from_secs(5));
/// assert_eq!(config.limits().max_message_size, 1 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) limits: Limits,
    pub(crate) max_handshake_size: usize,
    pub(crate) handshake_timeout: Duration,
    pub(crate) close_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_outbound_bytes: usize,
    pub(crate) read_buffer_size: usize,
    pub(crate) deflate: Option<DeflateConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            max_handshake_size: 8 * 1024,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            max_outbound_bytes: 4 << 20,
            read_buffer_size: 16 * 1024,
            deflate: None,
        }
    }
}

impl Config {
    /// The largest frame payload accepted (default 16 MiB). A frame whose header
    /// announces more fails the connection with 1009 before its payload is read.
    pub fn max_frame_size(mut self, bytes: usize) -> Self {
        self.limits.max_frame_size = bytes;
        self
    }

    /// The largest message accepted, over all its fragments (default 16 MiB);
    /// exceeding it fails the connection with 1009.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.limits.max_message_size = bytes;
        self
    }

    /// The largest HTTP upgrade request head (default 8 KiB); larger gets 431.
    pub fn max_handshake_size(mut self, bytes: usize) -> Self {
        self.max_handshake_size = bytes;
        self
    }

    /// How long a client has to send its complete upgrade request (default 10 s);
    /// after that it gets 408 and is disconnected.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// How long the server waits for the peer's close frame after sending its
    /// own, and for the peer to end TCP after the handshake (default 5 s).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// How long a graceful shutdown waits for connections to close after they
    /// were sent 1001 (default 10 s); the rest are then dropped.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The soft bound on bytes queued for one connection (default 4 MiB). A send
    /// is refused with `SendError::QueueFull` once this many bytes wait, so the
    /// queue never exceeds the bound by more than one message. See `Conn`.
    pub fn max_outbound_bytes(mut self, bytes: usize) -> Self {
        self.max_outbound_bytes = bytes;
        self
    }

    /// The size of the pooled buffer a connection reads into (default 16 KiB,
    /// minimum 512).
    pub fn read_buffer_size(mut self, bytes: usize) -> Self {
        self.read_buffer_size = bytes.max(512);
        self
    }

    /// Offers permessage-deflate (RFC 7692) with these settings to clients
    /// that ask for it; `None` turns it off, which is the default. The message
    /// size limit applies to the inflated size. See [`DeflateConfig`] for what
    /// each setting costs.
    pub fn permessage_deflate(mut self, deflate: impl Into<Option<DeflateConfig>>) -> Self {
        self.deflate = deflate.into();
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The permessage-deflate settings, if it is on.
    pub fn deflate(&self) -> Option<&DeflateConfig> {
        self.deflate.as_ref()
    }
}
