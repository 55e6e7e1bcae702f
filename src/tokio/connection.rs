//! One connection on tokio: the socket side of the path from bytes to callbacks.
//!
//! The task waits for readiness, not data: only when the socket is readable does
//! it take a buffer from the pool and read into it, and it gives the buffer back
//! before it sleeps again unless a partial frame is left in it. Everything the
//! callbacks and the protocol queue while handling one read goes out in one
//! `writev`. While a write is blocked the task does not read, so a peer that does
//! not read its replies stops being read from.

use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Sleep, sleep, timeout};

use crate::conn::ConnShared;
use crate::dispatch::Dispatch;
use crate::handler::Handler;
use crate::handshake::{self, Answer, HandshakeError};
use crate::pool::BufferPool;
use crate::proto::{Session, WriteQueue};
use crate::server::{LiveGuard, Registration, ServerCore};

/// How many iovecs one `writev` takes at most.
const MAX_IOVECS: usize = 64;

/// Bytes read and thrown away while waiting for a peer to end TCP, at most.
const DRAIN_LIMIT: usize = 1 << 20;

/// The most the read buffer grows ahead of the bytes that have arrived. A frame
/// header may announce up to `max_frame_size`; memory follows what the peer
/// actually sends, not what it claims.
const MAX_READ_AHEAD: usize = 256 * 1024;

/// Serves one accepted TCP connection, from the handshake to the last byte.
///
/// An idle connection is this future inside a tokio task, so its size is most
/// of what a connection costs. It is built so that only the upgraded phase
/// counts: everything is moved into the boxed handshake future at once (the
/// returned future captures only that box, not these arguments, which an
/// `async fn` would keep for its whole life), and the handshake's timer, read
/// future and response are freed when it is done.
pub(crate) fn run<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    core: Arc<ServerCore>,
    handler: Arc<H>,
    live: LiveGuard,
) -> impl Future<Output = ()> + Send + 'static {
    let handshake = Box::pin(handshake(stream, peer, core, handler, live));
    async move {
        // `let else`, not `if let`: the `Option` returned by the handshake must
        // not stay alive (and in this future's layout) beside its contents.
        let Some(mut upgraded) = handshake.await else {
            return;
        };
        upgraded.drive().await;
    }
}

/// Everything an upgraded connection holds while it lives: kept in one place
/// so the task's future stores it once (an `async fn` taking these as
/// arguments would store them twice).
struct Upgraded<H: Handler> {
    socket: Socket,
    dispatch: Dispatch<H>,
    registration: Registration,
    _live: LiveGuard,
}

impl<H: Handler> Upgraded<H> {
    fn open(
        mut socket: Socket,
        state: H::State,
        mut response: WriteQueue,
        peer: SocketAddr,
        core: &Arc<ServerCore>,
        handler: Arc<H>,
        live: LiveGuard,
    ) -> Self {
        let (conn, registration) = core.open_connection(peer);
        // The 101 goes first; whatever `on_open` sends follows it in the same write.
        std::mem::swap(&mut conn.shared().lock().queue, &mut response);
        let session = Session::new(core.config.limits, core.pool.clone());
        let mut dispatch = Dispatch::open(handler, session, conn, state);
        if !socket.read_buf.is_empty() {
            // Frames that arrived together with the request.
            dispatch.input(&mut socket.read_buf);
        }
        Upgraded {
            socket,
            dispatch,
            registration,
            _live: live,
        }
    }

    async fn drive(&mut self) {
        let Upgraded {
            socket,
            dispatch,
            registration,
            ..
        } = self;
        let close_timeout = registration.config().close_timeout;
        let conn = dispatch.conn().clone();
        socket.drive(dispatch, conn.shared(), close_timeout).await;
    }
}

/// Reads and answers the upgrade request within the handshake timeout; on
/// success opens the connection (its `101` queued first). Otherwise answers
/// with the HTTP error, if any, and closes.
async fn handshake<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    core: Arc<ServerCore>,
    handler: Arc<H>,
    live: LiveGuard,
) -> Option<Upgraded<H>> {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "could not set TCP_NODELAY");
    }
    let config = &core.config;
    let mut socket = Socket {
        stream,
        read_buf: BytesMut::new(),
        pool: core.pool.clone(),
        read_size: config.read_buffer_size,
    };
    let mut response = WriteQueue::new();
    let read_request = socket.read_upgrade(&*handler, &core, &mut response);
    match timeout(config.handshake_timeout, read_request).await {
        Ok(Ok(Some(state))) => {
            let upgraded = Upgraded::open(socket, state, response, peer, &core, handler, live);
            return Some(upgraded);
        }
        Ok(Ok(None)) => {}
        Ok(Err(_)) => {
            socket.release_buffer();
            return None;
        }
        Err(_elapsed) => {
            let e = HandshakeError::TimedOut;
            handshake::write_error(&mut response, e.status(), e.reason());
        }
    }
    socket.refuse(&mut response, config.close_timeout).await;
    None
}

/// The TCP stream and the read buffer, which is borrowed from the pool only
/// while there is something in it.
struct Socket {
    stream: TcpStream,
    read_buf: BytesMut,
    pool: Arc<BufferPool>,
    read_size: usize,
}

enum Wake {
    Readable,
    /// Something was queued by another task, or a close or abort was requested.
    Attention,
    /// Our close frame went unanswered for `close_timeout`.
    CloseTimeout,
}

impl Socket {
    /// Reads until the upgrade request is complete, then answers it. Returns the
    /// handler's state if it was accepted (the `101` is in `out` and the request
    /// is gone from the read buffer), or `None` if it was refused (the error
    /// response is in `out`).
    async fn read_upgrade<H: Handler>(
        &mut self,
        handler: &H,
        core: &ServerCore,
        out: &mut WriteQueue,
    ) -> io::Result<Option<H::State>> {
        let max_head_len = core.config.max_handshake_size;
        loop {
            let before = self.read_buf.len();
            let read = tokio::select! {
                read = self.read_some(max_head_len + 1) => read?,
                () = core.shutdown_requested() => {
                    handshake::write_error(out, 503, "server shutting down");
                    return Ok(None);
                }
            };
            if read == 0 {
                if self.read_buf.is_empty() {
                    // Connected and left (a port check): nothing to answer.
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let e = HandshakeError::Incomplete;
                handshake::write_error(out, e.status(), e.reason());
                return Ok(None);
            }
            // The head ends with a line; parsing again before a new line arrived
            // would only redo the same work (think of a client that sends one
            // byte at a time).
            let new_line = self.read_buf[before..].contains(&b'\n');
            if !new_line && self.read_buf.len() <= max_head_len {
                continue;
            }
            if core.is_shutting_down() {
                handshake::write_error(out, 503, "server shutting down");
                return Ok(None);
            }
            match handshake::answer(&self.read_buf, handler, max_head_len, out) {
                Answer::Incomplete => continue,
                Answer::Refused => return Ok(None),
                Answer::Accepted { state, head_len } => {
                    self.read_buf.advance(head_len);
                    return Ok(Some(state));
                }
            }
        }
    }

    /// The main loop of an upgraded connection.
    async fn drive<H: Handler>(
        &mut self,
        dispatch: &mut Dispatch<H>,
        shared: &ConnShared,
        close_timeout: Duration,
    ) {
        // Once a close frame is queued (ours, our reply, or a failure), every
        // remaining step, writes included, is bounded by this deadline.
        let mut close_deadline: Option<Pin<Box<Sleep>>> = None;
        loop {
            if shared.take_attention() {
                dispatch.attend();
            }
            if dispatch.is_aborted() {
                return self.release_buffer();
            }
            if !dispatch.is_open() && close_deadline.is_none() {
                close_deadline = Some(Box::pin(sleep(close_timeout)));
            }
            if let Err(error) = self.flush(shared, close_deadline.as_mut()).await {
                dispatch.abnormal(&format!("write failed: {error}"));
                return self.release_buffer();
            }
            dispatch.flushed();
            if dispatch.is_closed() {
                if dispatch.peer_closed() {
                    // Both close frames are through and ours is written: the
                    // peer may send nothing more, so the socket is closed at
                    // once (the server closes TCP first, RFC 6455 §7.1.1).
                    // Waiting for its FIN would cost a shutdown, a read and a
                    // wake-up per connection.
                    return self.release_buffer();
                }
                let deadline = close_deadline.unwrap_or_else(|| Box::pin(sleep(close_timeout)));
                // Boxed: only a closing connection needs this future's state.
                return Box::pin(self.close_tcp(Some(shared), deadline)).await;
            }
            match self.wait(shared, close_deadline.as_mut()).await {
                Wake::Attention => {}
                Wake::CloseTimeout => {
                    dispatch.abnormal("close handshake timed out");
                    return self.release_buffer();
                }
                Wake::Readable => match self.try_read(dispatch.bytes_wanted()) {
                    Ok(0) => {
                        dispatch.abnormal("connection closed without a close frame");
                        return self.release_buffer();
                    }
                    Ok(_) => dispatch.input(&mut self.read_buf),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(error) => {
                        dispatch.abnormal(&format!("read failed: {error}"));
                        return self.release_buffer();
                    }
                },
            }
        }
    }

    /// Waits until the socket is readable, another task needs this one, or the
    /// close deadline passes. Before sleeping, an empty read buffer goes back to
    /// the pool: an idle connection holds none.
    fn wait<'a>(
        &'a mut self,
        shared: &'a ConnShared,
        mut close_deadline: Option<&'a mut Pin<Box<Sleep>>>,
    ) -> impl Future<Output = Wake> + 'a {
        poll_fn(move |cx| {
            shared.register(cx.waker());
            if shared.has_pending_work() {
                return Poll::Ready(Wake::Attention);
            }
            if let Some(deadline) = close_deadline.as_deref_mut() {
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Wake::CloseTimeout);
                }
            }
            match self.stream.poll_read_ready(cx) {
                Poll::Ready(_) => Poll::Ready(Wake::Readable),
                Poll::Pending => {
                    self.release_buffer();
                    Poll::Pending
                }
            }
        })
    }

    /// Writes the connection's queue until it is empty, waiting for the socket
    /// to become writable as needed.
    async fn flush(
        &mut self,
        shared: &ConnShared,
        mut close_deadline: Option<&mut Pin<Box<Sleep>>>,
    ) -> io::Result<()> {
        loop {
            let done = {
                let mut outbox = shared.lock();
                outbox.flush_scheduled = false;
                let done = write_queue(&self.stream, &mut outbox.queue)?;
                if done {
                    if let Some(buf) = outbox.queue.take_buffer() {
                        shared.pool().give(buf);
                    }
                }
                done
            };
            if done {
                return Ok(());
            }
            poll_fn(|cx| {
                shared.register(cx.waker());
                if shared.lock().abort {
                    return Poll::Ready(Err(io::Error::other("aborted by server shutdown")));
                }
                if let Some(deadline) = close_deadline.as_deref_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                    }
                }
                self.stream.poll_write_ready(cx)
            })
            .await?;
        }
    }

    /// Reads once into the pooled buffer, sized for the frame in progress;
    /// `WouldBlock` if nothing is there.
    ///
    /// This goes through tokio's `AsyncRead` rather than `try_read_buf`: after a
    /// short read it clears the socket's readiness (the kernel queue is empty),
    /// so the next wait sleeps at once instead of paying a read that can only
    /// return EAGAIN. At one message per wake-up that was one syscall in three.
    /// A `Pending` poll registers the no-op waker, which is harmless: `wait`
    /// always registers the task's own waker before sleeping.
    fn try_read(&mut self, bytes_wanted: usize) -> io::Result<usize> {
        self.prepare_buffer(bytes_wanted);
        let mut cx = Context::from_waker(Waker::noop());
        match pin!(self.stream.read_buf(&mut self.read_buf)).poll(&mut cx) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Waits for readability and reads once (for the handshake).
    async fn read_some(&mut self, bytes_wanted: usize) -> io::Result<usize> {
        loop {
            self.stream.readable().await?;
            match self.try_read(bytes_wanted) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                result => return result,
            }
        }
    }

    /// Makes sure the read buffer exists and has room for the next read: towards
    /// the end of the frame in progress, but never more than [`MAX_READ_AHEAD`]
    /// beyond the bytes already here.
    fn prepare_buffer(&mut self, bytes_wanted: usize) {
        let len = self.read_buf.len();
        if self.read_buf.capacity() == 0 {
            self.read_buf = self
                .pool
                .take(read_ahead(len, bytes_wanted, self.read_size));
        }
        let spare = self.read_buf.capacity() - len;
        if let Some(more) = grow_by(len, spare, bytes_wanted, self.read_size) {
            self.read_buf.reserve(more);
        }
    }

    /// Gives the read buffer back to the pool if it holds no partial frame.
    fn release_buffer(&mut self) {
        if self.read_buf.is_empty() && self.read_buf.capacity() > 0 {
            self.pool.give(std::mem::take(&mut self.read_buf));
        }
    }

    /// Answers a refused handshake: writes the error response, then closes.
    async fn refuse(&mut self, response: &mut WriteQueue, close_timeout: Duration) {
        let write_all = async {
            while !write_queue(&self.stream, response)? {
                self.stream.writable().await?;
            }
            io::Result::Ok(())
        };
        if let Ok(Ok(())) = timeout(close_timeout, write_all).await {
            self.close_tcp(None, Box::pin(sleep(close_timeout))).await;
        } else {
            self.read_buf.clear();
            self.release_buffer();
        }
    }

    /// Ends TCP: the server closes first (RFC 6455 §7.1.1), by sending FIN, then
    /// reads and discards until the peer's FIN so that unread bytes do not turn
    /// our close (or error response) into a reset, up to `deadline` and
    /// [`DRAIN_LIMIT`] bytes, or until the server aborts the connection.
    async fn close_tcp(&mut self, abort: Option<&ConnShared>, mut deadline: Pin<Box<Sleep>>) {
        let _ = self.stream.shutdown().await;
        let mut discarded = 0usize;
        while discarded < DRAIN_LIMIT {
            self.read_buf.clear();
            let readable = poll_fn(|cx| {
                if let Some(shared) = abort {
                    shared.register(cx.waker());
                    if shared.lock().abort {
                        return Poll::Ready(false);
                    }
                }
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                self.stream.poll_read_ready(cx).map(|r| r.is_ok())
            });
            if !readable.await {
                break;
            }
            match self.try_read(0) {
                Ok(0) => break,
                Ok(n) => discarded += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        self.read_buf.clear();
        self.release_buffer();
    }
}

/// How much room to make for the next read: towards the end of the frame in
/// progress (`bytes_wanted`, counted from the start of the buffer), at least a
/// normal read, and never more than [`MAX_READ_AHEAD`] past what has arrived.
fn read_ahead(len: usize, bytes_wanted: usize, read_size: usize) -> usize {
    bytes_wanted
        .saturating_sub(len)
        .clamp(read_size, MAX_READ_AHEAD.max(read_size))
}

/// Whether the buffer should grow before the next read, and by how much: when
/// almost full, or when a frame in progress has less than half a read-ahead of
/// room left. Growth is geometric (`BytesMut::reserve`), so a large frame costs
/// a few copies, while a header that merely claims a large frame costs nothing.
fn grow_by(len: usize, spare: usize, bytes_wanted: usize, read_size: usize) -> Option<usize> {
    let ahead = read_ahead(len, bytes_wanted, read_size);
    let frame_needs_room = bytes_wanted > len && spare < ahead / 2;
    (spare < 1024 || frame_needs_room).then_some(ahead)
}

/// Writes as much of `queue` as the socket takes without blocking. Returns true
/// once the queue is empty.
fn write_queue(stream: &TcpStream, queue: &mut WriteQueue) -> io::Result<bool> {
    while !queue.is_empty() {
        let written = {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let n = queue.io_slices(&mut slices);
            stream.try_write_vectored(&slices[..n])
        };
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => queue.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_frame_size_does_not_reserve_memory_up_front() {
        // A header claiming 16 MiB: room for at most one read-ahead.
        assert_eq!(read_ahead(14, 16 << 20, 16 * 1024), MAX_READ_AHEAD);
        assert_eq!(
            grow_by(14, 16 * 1024 - 14, 16 << 20, 16 * 1024),
            Some(MAX_READ_AHEAD)
        );
        // Between frames: a normal read.
        assert_eq!(read_ahead(0, 0, 16 * 1024), 16 * 1024);
        assert_eq!(grow_by(0, 16 * 1024, 0, 16 * 1024), None);
        // A small frame needs no more than it lacks, but a read is the minimum.
        assert_eq!(read_ahead(100, 300, 16 * 1024), 16 * 1024);
    }

    #[test]
    fn buffers_grow_when_nearly_full_or_a_frame_needs_room() {
        assert_eq!(grow_by(15_500, 500, 0, 16 * 1024), Some(16 * 1024));
        assert_eq!(
            grow_by(1 << 20, 64 * 1024, 8 << 20, 16 * 1024),
            Some(MAX_READ_AHEAD)
        );
        assert_eq!(grow_by(1 << 20, 200 * 1024, 8 << 20, 16 * 1024), None);
    }

    /// Every idle connection is one task holding this future, so its size is
    /// a large share of the memory per connection (BENCHMARKS.md, scenario 4).
    /// The handshake phase is boxed and must not size it.
    #[tokio::test]
    async fn the_connection_future_is_sized_by_the_upgraded_phase() {
        struct Quiet;
        impl Handler for Quiet {
            type State = ();
            fn on_upgrade(
                &self,
                _: &crate::Request<'_>,
                _: &mut crate::Accept,
            ) -> Result<(), crate::Reject> {
                Ok(())
            }
            fn on_message(&self, _: &crate::Conn, _: &mut (), _: crate::Message<'_>) {}
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let core = ServerCore::new(crate::Config::default());
        let live = core.enter();
        let task = run(stream, peer, core.clone(), Arc::new(Quiet), live);
        let upgraded = size_of::<Upgraded<Quiet>>();
        assert!(
            size_of_val(&task) <= upgraded + 256,
            "connection future is {} bytes, upgraded state {upgraded}",
            size_of_val(&task)
        );
    }
}
