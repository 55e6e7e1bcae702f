//! wss on io_uring: rustls, which is sans-I/O itself, between the ring and
//! the connection's lifecycle. Received ciphertext goes into the session
//! and comes out as plaintext for the lifecycle; what the lifecycle queued
//! is encrypted and its records go out in one send, like plaintext on a
//! plain connection. The kernel has no TLS ULP here (kTLS), so the records
//! are made in user space.
//!
//! The session and its buffers are `driver/tls.rs`'s `Records`, as on the
//! stream driver: records received and not yet whole, and records not yet
//! sent, are pooled buffers held only while bytes are in them, so an idle
//! connection keeps the session's own state and nothing more.
//!
//! Bounds: what is sealed is what the lifecycle took from its queue, which
//! `Config::max_outbound_bytes` bounds, and its records leave at once for
//! the send; what arrives is processed one receive at a time, and the
//! plaintext goes to the lifecycle at once, waiting only as the partial
//! frame any connection keeps.

use std::io;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
pub(crate) use rustls::ServerConfig;
use rustls::server::UnbufferedServerConnection;

use crate::driver::tls::{Records, give_back, tls_error};
use crate::pool::BufferPool;
use crate::proto::WriteQueue;

/// Plaintext encrypted in one go at most (four full records): the
/// lifecycle's slices (a frame's header, its payload) are gathered up to
/// this, so that they share records.
const SEAL_CHUNK: usize = 64 * 1024;

/// One connection's TLS session.
pub(crate) struct Tls {
    records: Records<UnbufferedServerConnection>,
}

impl Tls {
    pub(crate) fn new(config: &Arc<ServerConfig>) -> io::Result<Box<Tls>> {
        let session = UnbufferedServerConnection::new(config.clone()).map_err(tls_error)?;
        Ok(Box::new(Tls {
            records: Records::new(session),
        }))
    }

    /// Takes received ciphertext, all of it, and appends the plaintext it
    /// carried to `plain` (taken from `pool` if it has no room). An error is
    /// a TLS failure: the connection is over (an alert may be queued).
    pub(crate) fn open(
        &mut self,
        cipher: &[u8],
        plain: &mut BytesMut,
        pool: &BufferPool,
    ) -> io::Result<()> {
        self.records.received(cipher, pool);
        self.records.process(plain, None, pool).map(|_| ())
    }

    /// Encrypts everything in `queue` (the lifecycle's plaintext) and
    /// empties it; returns how many plaintext bytes that was. The records
    /// wait for `take_records`.
    pub(crate) fn seal(&mut self, queue: &mut WriteQueue, pool: &BufferPool) -> io::Result<usize> {
        let mut sealed = 0;
        let mut plain = BytesMut::new();
        while !queue.is_empty() {
            let mut staged = pool.take(queue.len().min(SEAL_CHUNK));
            let mut slices = [io::IoSlice::new(&[]); 64];
            let count = queue.io_slices(&mut slices);
            for slice in &slices[..count] {
                let room = SEAL_CHUNK - staged.len();
                if room == 0 {
                    break;
                }
                staged.put_slice(&slice[..slice.len().min(room)]);
            }
            let taken = self.records.process(&mut plain, Some(&staged), pool);
            pool.give(staged);
            let (_, taken) = taken?;
            if taken == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the TLS session takes no application data now",
                ));
            }
            queue.advance(taken);
            sealed += taken;
        }
        // Plaintext is decrypted as it arrives (`open`): none is left here.
        debug_assert!(plain.is_empty(), "plaintext found while sealing");
        give_back(&mut plain, pool);
        Ok(sealed)
    }

    /// Whether the TLS handshake is still going on.
    pub(crate) fn is_handshaking(&self) -> bool {
        self.records.is_handshaking()
    }

    /// Whether records wait to be sent (handshake messages, alerts, data).
    pub(crate) fn wants_write(&self) -> bool {
        !self.records.outgoing.is_empty()
    }

    /// Moves the records waiting to be sent into `out`.
    pub(crate) fn take_records(&mut self, out: &mut WriteQueue, pool: &BufferPool) {
        let outgoing = &mut self.records.outgoing;
        if !outgoing.is_empty() {
            out.push_raw(outgoing);
            let sent = outgoing.len();
            self.records.sent(sent, pool);
        }
    }

    /// Queues close_notify (sent with the next records).
    pub(crate) fn close(&mut self, pool: &BufferPool) {
        let mut plain = BytesMut::new();
        let _ = self.records.close(&mut plain, pool);
        give_back(&mut plain, pool);
    }
}

#[cfg(test)]
mod tests {
    //! The sans-I/O session against rustls's buffered client as the peer,
    //! bytes handed across by hand as the ring would carry them.

    use std::io::{Read, Write};

    use bytes::BytesMut;
    use rustls::ClientConnection;
    use rustls::pki_types::ServerName;

    use super::Tls;
    use crate::driver::tls::test_configs;
    use crate::pool::BufferPool;
    use crate::proto::WriteQueue;

    /// Carries the client's records to the server (in pieces of `piece`
    /// bytes, as receives may cut them) and the server's back; returns the
    /// plaintext the server got and the plaintext the client got.
    fn exchange(
        tls: &mut Tls,
        client: &mut ClientConnection,
        pool: &BufferPool,
        piece: usize,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut plain = BytesMut::new();
        let mut cipher = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut cipher).unwrap();
        }
        for chunk in cipher.chunks(piece) {
            tls.open(chunk, &mut plain, pool).unwrap();
        }
        let mut records = WriteQueue::new();
        tls.take_records(&mut records, pool);
        let mut bytes = Vec::new();
        records.move_into(&mut bytes);
        let mut bytes = &bytes[..];
        let mut echoed = Vec::new();
        while !bytes.is_empty() {
            client.read_tls(&mut bytes).unwrap();
            client.process_new_packets().unwrap();
            let mut buf = [0; 4096];
            while let Ok(n @ 1..) = client.reader().read(&mut buf) {
                echoed.extend_from_slice(&buf[..n]);
            }
        }
        (plain.to_vec(), echoed)
    }

    #[test]
    fn a_megabyte_each_way_and_nothing_kept_when_idle() {
        let (server_config, client_config) = test_configs();
        let pool = BufferPool::default();
        let mut tls = Tls::new(&server_config).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = ClientConnection::new(client_config, name).unwrap();
        while client.is_handshaking() || tls.is_handshaking() {
            exchange(&mut tls, &mut client, &pool, 1000);
        }
        // A TLS 1.3 server's tickets, if any, reach the client.
        exchange(&mut tls, &mut client, &pool, 1000);

        let sent: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let mut got = Vec::new();
        for part in sent.chunks(50_000) {
            client.writer().write_all(part).unwrap();
            got.extend(exchange(&mut tls, &mut client, &pool, 7000).0);
        }
        assert_eq!(got, sent);

        // Back, in frames' pieces as the lifecycle queues them.
        let mut queue = WriteQueue::new();
        for part in sent.chunks(30_000) {
            queue.push_raw(&part[..10]);
            queue.push_raw(&part[10..]);
        }
        assert_eq!(tls.seal(&mut queue, &pool).unwrap(), sent.len());
        assert!(queue.is_empty());
        let (_, echoed) = exchange(&mut tls, &mut client, &pool, 7000);
        assert_eq!(echoed, sent);

        // Idle: no buffer held between messages.
        let records = &tls.records;
        assert_eq!(
            (records.incoming.capacity(), records.outgoing.capacity()),
            (0, 0)
        );

        // close_notify reaches the client as a clean end.
        tls.close(&pool);
        assert!(tls.wants_write());
        exchange(&mut tls, &mut client, &pool, 7000);
        let mut rest = Vec::new();
        assert_eq!(client.reader().read_to_end(&mut rest).unwrap(), 0);
    }

    #[test]
    fn plain_http_instead_of_a_client_hello_fails_with_an_alert() {
        let (server_config, _) = test_configs();
        let pool = BufferPool::default();
        let mut tls = Tls::new(&server_config).unwrap();
        let mut plain = BytesMut::new();
        let error = tls
            .open(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &mut plain, &pool)
            .unwrap_err();
        assert!(
            error
                .get_ref()
                .unwrap()
                .downcast_ref::<rustls::Error>()
                .is_some(),
            "{error:?}"
        );
        assert!(plain.is_empty());
        let mut records = WriteQueue::new();
        tls.take_records(&mut records, &pool);
        let mut bytes = Vec::new();
        records.move_into(&mut bytes);
        assert_eq!(bytes.first(), Some(&0x15), "a TLS alert record");
    }
}
