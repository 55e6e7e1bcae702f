//! wss on io_uring: rustls, which is sans-I/O itself, between the ring and
//! the connection's lifecycle. Received ciphertext goes into the session
//! and comes out as plaintext for the lifecycle; what the lifecycle queued
//! is encrypted into the session and its records go out in one send, like
//! plaintext on a plain connection. The kernel has no TLS ULP here (kTLS),
//! so the records are made in user space.
//!
//! Bounds: what is sealed is what the lifecycle took from its queue, which
//! `Config::max_outbound_bytes` bounds, and its records leave the session at
//! once for the send (so the session's own send limit is lifted: a send
//! takes everything); what arrives is read into the session one receive at
//! a time, and the plaintext goes to the lifecycle at once, waiting only as
//! the partial frame any connection keeps. A connection waiting for data
//! holds no plaintext buffer of ours.

use std::io::{self, BufRead, Write};
use std::sync::Arc;

use bytes::BytesMut;
pub(crate) use rustls::ServerConfig;
use rustls::ServerConnection;

use crate::pool::BufferPool;
use crate::proto::WriteQueue;

/// Plaintext read from the session per step.
const PLAIN_CHUNK: usize = 16 * 1024;

/// One connection's TLS session.
pub(crate) struct Tls {
    session: ServerConnection,
}

impl Tls {
    pub(crate) fn new(config: &Arc<ServerConfig>) -> io::Result<Box<Tls>> {
        let mut session = ServerConnection::new(config.clone()).map_err(io::Error::other)?;
        // Sealed records are taken out at once (see the module docs).
        session.set_buffer_limit(None);
        Ok(Box::new(Tls { session }))
    }

    /// Takes received ciphertext, all of it, and appends the plaintext it
    /// carried to `plain` (taken from `pool` if it has no room). An error is
    /// a TLS failure: the connection is over (an alert may be queued).
    pub(crate) fn open(
        &mut self,
        mut cipher: &[u8],
        plain: &mut BytesMut,
        pool: &BufferPool,
    ) -> io::Result<()> {
        while !cipher.is_empty() {
            let read = self.session.read_tls(&mut cipher)?;
            let state = self
                .session
                .process_new_packets()
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
            if state.plaintext_bytes_to_read() > 0 {
                self.read_plain(plain, pool)?;
            }
            if read == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Appends the plaintext the session holds to `plain` (from `pool` if
    /// it has no buffer yet), copied once, straight from rustls's buffers.
    fn read_plain(&mut self, plain: &mut BytesMut, pool: &BufferPool) -> io::Result<()> {
        let mut reader = self.session.reader();
        loop {
            let chunk = match reader.fill_buf() {
                Ok(chunk) => chunk,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) => return Err(error),
            };
            if chunk.is_empty() {
                // close_notify: nothing more comes.
                return Ok(());
            }
            if plain.capacity() == 0 {
                *plain = pool.take(chunk.len().max(PLAIN_CHUNK));
            }
            plain.extend_from_slice(chunk);
            let taken = chunk.len();
            reader.consume(taken);
        }
    }

    /// Encrypts everything in `queue` (the lifecycle's plaintext) and
    /// empties it; returns how many plaintext bytes that was.
    pub(crate) fn seal(&mut self, queue: &mut WriteQueue) -> io::Result<usize> {
        let mut sealed = 0;
        while !queue.is_empty() {
            let taken = {
                let mut slices = [io::IoSlice::new(&[]); 64];
                let count = queue.io_slices(&mut slices);
                let mut taken = 0;
                for slice in &slices[..count] {
                    self.session.writer().write_all(slice)?;
                    taken += slice.len();
                }
                taken
            };
            queue.advance(taken);
            sealed += taken;
        }
        Ok(sealed)
    }

    /// Whether the TLS handshake is still going on.
    pub(crate) fn is_handshaking(&self) -> bool {
        self.session.is_handshaking()
    }

    /// Whether records wait to be sent (handshake messages, alerts, data).
    pub(crate) fn wants_write(&self) -> bool {
        self.session.wants_write()
    }

    /// Moves the records waiting to be sent into `out`.
    pub(crate) fn take_records(&mut self, out: &mut WriteQueue) -> io::Result<()> {
        let mut records = Vec::new();
        while self.session.wants_write() {
            self.session.write_tls(&mut records)?;
        }
        out.push_raw(&records);
        Ok(())
    }

    /// Queues close_notify (sent with the next records).
    pub(crate) fn close(&mut self) {
        self.session.send_close_notify();
    }
}
