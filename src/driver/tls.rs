//! A rustls session whose buffers are lent from the server's pool, with no
//! I/O of its own: what both wss drivers run, the stream driver's
//! `TlsStream` (`stream/tls.rs`) over any async stream and io_uring's
//! `Tls` (`uring/tls.rs`) between the ring and the lifecycle.
//!
//! It uses rustls's unbuffered API, in which the caller lends the buffers:
//! records received and not yet processed (a partial record), records
//! waiting to be sent, and the decrypted plaintext (which the caller owns)
//! are each a buffer from the pool, taken while bytes are in it and given
//! back when it empties. An idle connection holds none of them, as a plain
//! one holds no read buffer; what is left is the session's own state (its
//! keys and handshake state). rustls's buffered API keeps its buffers'
//! capacity for the connection's life (`cargo bench --bench tls_memory`).

use std::io;
use std::mem;
use std::ops::DerefMut;

use bytes::{Buf, BytesMut};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};

use crate::pool::BufferPool;

/// A record's bytes beyond its plaintext, at most: the header (5), TLS
/// 1.2's explicit nonce (8) or TLS 1.3's content type (1), and the AEAD tag
/// (16). Only a first guess at the room to lend: rustls says what it needs
/// when it is more.
const RECORD_OVERHEAD: usize = 32;

/// Plaintext in one record at most.
pub(crate) const MAX_RECORD: usize = 16 * 1024;

/// A rustls connection of either side, as [`Records`] drives it.
pub(crate) trait TlsState:
    DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> + Unpin
{
    type Data;

    /// Processes the records in `incoming` up to the session's next state.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl TlsState for UnbufferedServerConnection {
    type Data = ServerConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }
}

impl TlsState for UnbufferedClientConnection {
    type Data = ClientConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
}

/// Where processing the records received so far left the session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// More records from the peer (the handshake waits for them).
    Records,
    /// Nothing: application data may be sent, and more records received.
    Nothing,
    /// Both sides sent `close_notify`.
    Closed,
}

/// A TLS session `C` (a server's or a client's) and the records on their
/// way in and out of it.
///
/// The call contract: records the transport received go into
/// [`Records::received`] (or straight into `incoming`); [`Records::process`]
/// decrypts what is whole into the caller's plaintext buffer, encrypts the
/// caller's data when the session may send it, and leaves what must be
/// sent in `outgoing`, which the caller sends before anything it encrypts
/// later and then gives back with [`Records::sent`].
pub(crate) struct Records<C> {
    pub(crate) session: C,
    /// Records received and not processed yet (the start of one that has
    /// not all come). Pooled; empty (no capacity) when idle.
    pub(crate) incoming: BytesMut,
    /// Records waiting to be sent. Pooled, as `incoming`.
    pub(crate) outgoing: BytesMut,
    /// The peer sent its `close_notify`: nothing more will be decrypted.
    pub(crate) peer_closed: bool,
    /// Our `close_notify` is queued (or the session could not send it).
    pub(crate) closing: bool,
    /// `close` asks `process` for our `close_notify` (set only around that
    /// one call).
    close_wanted: bool,
}

impl<C: TlsState> Records<C> {
    pub(crate) fn new(session: C) -> Self {
        Records {
            session,
            incoming: BytesMut::new(),
            outgoing: BytesMut::new(),
            peer_closed: false,
            closing: false,
            close_wanted: false,
        }
    }

    /// Appends records the transport received to `incoming` (a buffer from
    /// `pool` if it has none).
    pub(crate) fn received(&mut self, records: &[u8], pool: &BufferPool) {
        if self.incoming.capacity() == 0 {
            self.incoming = pool.take(records.len());
        }
        self.incoming.extend_from_slice(records);
    }

    /// Processes the records received so far: plaintext appended to
    /// `plain` (a buffer from `pool` if it has none), the session's own
    /// records (handshake, alerts, key updates) into `outgoing`, and `data`
    /// (if any, once application data may be sent) encrypted into
    /// `outgoing` too. Returns what the session needs next and how much of
    /// `data` it took (all of it, or none). On an error the alert saying
    /// why is in `outgoing`, for the caller to send if it can.
    pub(crate) fn process(
        &mut self,
        plain: &mut BytesMut,
        mut data: Option<&[u8]>,
        pool: &BufferPool,
    ) -> io::Result<(Need, usize)> {
        let Records {
            session,
            incoming,
            outgoing,
            peer_closed,
            close_wanted,
            ..
        } = self;
        let mut taken = 0;
        loop {
            let UnbufferedStatus { mut discard, state } = session.process(&mut incoming[..]);
            let state = match state {
                Ok(state) => state,
                Err(error) => {
                    release(incoming, discard, pool);
                    queue_alerts(session, incoming, outgoing, pool);
                    return Err(tls_error(error));
                }
            };
            let need = match state {
                ConnectionState::ReadTraffic(mut records) => {
                    while let Some(record) = records.next_record() {
                        let record = record.map_err(tls_error)?;
                        discard += record.discard;
                        if plain.capacity() == 0 {
                            *plain = pool.take(record.payload.len());
                        }
                        plain.extend_from_slice(record.payload);
                    }
                    None
                }
                ConnectionState::PeerClosed => {
                    *peer_closed = true;
                    None
                }
                ConnectionState::Closed => Some(Need::Closed),
                ConnectionState::EncodeTlsData(mut encode) => {
                    lend(outgoing, pool, 512, |room| encoded(encode.encode(room)))?;
                    None
                }
                // What was encoded is in `outgoing`, which the transport
                // gets before anything that comes after it.
                ConnectionState::TransmitTlsData(transmit) => {
                    transmit.done();
                    None
                }
                ConnectionState::BlockedHandshake => Some(Need::Records),
                ConnectionState::WriteTraffic(mut write) => {
                    if let Some(data) = data.take() {
                        let records = data.len().div_ceil(MAX_RECORD);
                        let guess = data.len() + records * RECORD_OVERHEAD;
                        lend(outgoing, pool, guess, |room| {
                            encrypt(write.encrypt(data, room))
                        })?;
                        taken = data.len();
                    }
                    if *close_wanted {
                        lend(outgoing, pool, 64, |room| {
                            encrypt(write.queue_close_notify(room))
                        })?;
                    }
                    Some(Need::Nothing)
                }
                // Early data (a server takes none unless its config asks
                // for it, and ours do not), or a state of a later rustls.
                _ => {
                    return Err(io::Error::other("an unexpected TLS session state"));
                }
            };
            release(incoming, discard, pool);
            if let Some(need) = need {
                return Ok((need, taken));
            }
        }
    }

    /// Queues our `close_notify` in `outgoing`, once. A session that cannot
    /// send it (closed already, or still in its handshake) ends without.
    pub(crate) fn close(&mut self, plain: &mut BytesMut, pool: &BufferPool) -> io::Result<()> {
        if mem::replace(&mut self.closing, true) {
            return Ok(());
        }
        self.close_wanted = true;
        let processed = self.process(plain, None, pool);
        self.close_wanted = false;
        processed.map(|_| ())
    }

    /// Drops the first `sent` bytes of `outgoing`, and gives its buffer
    /// back to the pool once it is empty.
    pub(crate) fn sent(&mut self, sent: usize, pool: &BufferPool) {
        release(&mut self.outgoing, sent, pool);
    }

    /// Whether the handshake is still going on.
    pub(crate) fn is_handshaking(&self) -> bool {
        self.session.is_handshaking()
    }
}

/// Encodes the alert a failed session queued into `outgoing`. One call:
/// the session hands out what it queued before it looks at the records
/// again, and a second look would fail on them again. The records not
/// processed are passed as they are: the session keeps positions in them.
fn queue_alerts<C: TlsState>(
    session: &mut C,
    incoming: &mut BytesMut,
    outgoing: &mut BytesMut,
    pool: &BufferPool,
) {
    let status = session.process(&mut incoming[..]);
    if let Ok(ConnectionState::EncodeTlsData(mut encode)) = status.state {
        let _ = lend(outgoing, pool, 64, |room| encoded(encode.encode(room)));
    }
}

/// Why `lend`'s filler wrote nothing.
enum Unlent {
    /// It needs this much room.
    Room(usize),
    /// It cannot write at all.
    Failed(&'static str),
}

/// Lends `out`'s spare room to `fill` (at least `room` bytes, more if
/// `fill` asks for more), keeping what it wrote.
fn lend(
    out: &mut BytesMut,
    pool: &BufferPool,
    mut room: usize,
    mut fill: impl FnMut(&mut [u8]) -> Result<usize, Unlent>,
) -> io::Result<()> {
    for _ in 0..4 {
        if out.capacity() == 0 {
            *out = pool.take(room);
        }
        let start = out.len();
        out.resize(start + room, 0);
        match fill(&mut out[start..]) {
            Ok(written) => {
                out.truncate(start + written);
                return Ok(());
            }
            Err(Unlent::Room(needed)) => {
                out.truncate(start);
                room = needed;
            }
            Err(Unlent::Failed(why)) => {
                out.truncate(start);
                return Err(io::Error::other(why));
            }
        }
    }
    Err(io::Error::other(
        "the TLS session kept asking for more room",
    ))
}

/// An encoding's result as `lend` takes it.
fn encoded(result: Result<usize, EncodeError>) -> Result<usize, Unlent> {
    match result {
        Ok(written) => Ok(written),
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            Err(Unlent::Room(required_size))
        }
        // Encoded before: nothing more to write.
        Err(_) => Ok(0),
    }
}

/// An encryption's result as `lend` takes it.
fn encrypt(result: Result<usize, EncryptError>) -> Result<usize, Unlent> {
    match result {
        Ok(written) => Ok(written),
        Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size })) => {
            Err(Unlent::Room(required_size))
        }
        // The keys may encrypt no more (rustls refreshes TLS 1.3 keys long
        // before; a TLS 1.2 session this old is closed).
        Err(_) => Err(Unlent::Failed("the TLS session's keys are exhausted")),
    }
}

/// Drops the first `count` bytes of `buf`, and gives it back to the pool
/// once it is empty.
pub(crate) fn release(buf: &mut BytesMut, count: usize, pool: &BufferPool) {
    buf.advance(count);
    if buf.is_empty() {
        give_back(buf, pool);
    }
}

/// Gives an empty buffer's capacity back to the pool.
pub(crate) fn give_back(buf: &mut BytesMut, pool: &BufferPool) {
    if buf.capacity() > 0 {
        pool.give(mem::take(buf));
    }
}

/// A rustls error as an I/O error that still carries it (callers tell the
/// two apart with `get_ref().downcast_ref::<rustls::Error>()`).
pub(crate) fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// A server's and a client's config for `localhost`, with a certificate
/// made for the test: what the TLS tests next to each driver run on.
#[cfg(test)]
pub(crate) fn test_configs() -> (
    std::sync::Arc<rustls::ServerConfig>,
    std::sync::Arc<rustls::ClientConfig>,
) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use std::sync::Arc;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key))
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}
