//! Listening and accepting, as the socket servers (tokio, io_uring) do it:
//! binding the first address that works, the kernel's backlog, and backing
//! off after accept errors that concern the process rather than one peer.

use std::time::Duration;

/// Binds the first of `addrs` that `bind` accepts; the last error if none
/// does.
pub(crate) fn bind_first<T>(
    addrs: impl IntoIterator<Item = std::net::SocketAddr>,
    mut bind: impl FnMut(std::net::SocketAddr) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let mut last_error = None;
    for addr in addrs {
        match bind(addr) {
            Ok(bound) => return Ok(bound),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "address resolved to nothing",
        )
    }))
}

/// Pending connections the kernel queues for `accept`.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// Back-off after an accept error such as EMFILE: doubles up to the maximum.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(5);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Accept errors about one incoming connection, which are no reason to pause.
pub(crate) fn concerns_one_connection(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionRefused
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    )
}
