//! The tokio backend's `unsafe`, all of it: reading into a buffer's spare
//! capacity, and handing tokio descriptors to watch.
//!
//! Since tokio 1.54, `AsyncFd` registration is `unsafe`: tokio cannot check
//! that the object keeps the same descriptor open while it watches it. Both
//! objects watched here own their descriptor for their whole life.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use bytes::BytesMut;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Lets tokio watch a listening socket (readable: a connection is waiting).
pub(crate) fn watch_listener(
    listener: mio::net::TcpListener,
) -> io::Result<AsyncFd<mio::net::TcpListener>> {
    // SAFETY: the mio listener owns its descriptor and keeps it open, the same
    // one, until the `AsyncFd` (which owns the listener) drops it.
    let registered = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) };
    registered.map_err(io::Error::from)
}

/// Lets tokio watch a group's epoll instance (readable: an event is waiting).
pub(crate) fn watch_epoll(poll: mio::Poll) -> io::Result<AsyncFd<mio::Poll>> {
    // SAFETY: `mio::Poll` owns its epoll descriptor and keeps it open, the same
    // one, until the `AsyncFd` (which owns the `Poll`) drops it.
    let registered = unsafe { AsyncFd::register_with_interest(poll, Interest::READABLE) };
    registered.map_err(io::Error::from)
}

/// `recv(2)` into the spare capacity of `buf`, which grows by the bytes read.
///
/// Reading into memory that is not yet initialised saves clearing a 16 KiB
/// buffer before every read (tokio's own `read_buf` does the same).
pub(crate) fn recv_into_spare(fd: BorrowedFd<'_>, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is valid for writes of `spare.len()` bytes for the whole
    // call, and `recv` writes at most that many (it never reads them).
    let received = unsafe { libc::recv(fd.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), 0) };
    let Ok(received) = usize::try_from(received) else {
        return Err(io::Error::last_os_error());
    };
    let len = buf.len() + received;
    // SAFETY: the kernel initialised the first `received` bytes of the spare
    // capacity, which directly follow the buffer's length.
    unsafe { buf.set_len(len) };
    Ok(received)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn recv_appends_after_existing_bytes_and_stops_at_capacity() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut buf = BytesMut::with_capacity(8);
        buf.extend_from_slice(b"ab");
        let room = buf.capacity() - buf.len();
        let sent: Vec<u8> = (0..100u8).collect();
        peer.write_all(&sent).unwrap();
        let n = recv_into_spare(ours.as_fd(), &mut buf).unwrap();
        assert_eq!(n, room, "fills the spare capacity, no more");
        assert_eq!(&buf[..2], b"ab");
        assert_eq!(&buf[2..], &sent[..room]);
        // The rest is still in the socket.
        let mut rest = BytesMut::with_capacity(200);
        let n = recv_into_spare(ours.as_fd(), &mut rest).unwrap();
        assert_eq!(&rest[..], &sent[room..]);
        assert_eq!(n, sent.len() - room);
        // Nothing left: WouldBlock, and the buffer is unchanged.
        let err = recv_into_spare(ours.as_fd(), &mut rest).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(rest.len(), sent.len() - room);
        // The peer gone: end of stream.
        drop(peer);
        assert_eq!(recv_into_spare(ours.as_fd(), &mut rest).unwrap(), 0);
    }

    /// Nested epoll: tokio sees the group's epoll readable once a socket
    /// registered in it has data, and the group finds that socket's event.
    #[tokio::test]
    async fn tokio_wakes_on_an_event_in_a_watched_epoll() {
        let mut epoll = watch_epoll(mio::Poll::new().unwrap()).unwrap();
        let (mut ours, mut peer) = mio::net::UnixStream::pair().unwrap();
        let token = mio::Token(7);
        epoll
            .get_ref()
            .registry()
            .register(&mut ours, token, mio::Interest::READABLE)
            .unwrap();
        peer.write_all(b"x").unwrap();
        let wait = tokio::time::timeout(std::time::Duration::from_secs(5), epoll.readable_mut());
        let mut guard = wait.await.expect("readable within 5 s").unwrap();
        let mut events = mio::Events::with_capacity(4);
        let poll = guard.get_inner_mut();
        poll.poll(&mut events, Some(std::time::Duration::ZERO))
            .unwrap();
        let event = events.iter().next().expect("one event");
        assert_eq!(event.token(), token);
        assert!(event.is_readable());
    }

    #[tokio::test]
    async fn a_watched_listener_reports_a_waiting_connection() {
        let addr = "127.0.0.1:0".parse().unwrap();
        let listener = watch_listener(mio::net::TcpListener::bind(addr).unwrap()).unwrap();
        let addr = listener.get_ref().local_addr().unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let wait = tokio::time::timeout(std::time::Duration::from_secs(5), listener.readable());
        let guard = wait.await.expect("readable within 5 s").unwrap();
        let (_, peer) = guard.get_inner().accept().unwrap();
        assert_eq!(peer.ip(), addr.ip());
    }
}
