//! What one idle wss connection's TLS session holds: a rustls
//! `ServerConnection` after its handshake and a message each way, with
//! nothing left to read or write, measured by counting the heap bytes that
//! stay allocated (and its own size, which its owner holds inline).
//!
//!     cargo bench --bench tls_memory
//!
//! Each wss server here keeps one such session per connection (the stream
//! driver's `TlsStream`, the io_uring driver's `Tls`), so this is the part
//! of an idle wss connection's cost (BENCHMARKS.md, scenario 4) that rustls
//! holds, whether or not bytes are in its buffers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

/// Heap bytes allocated and not yet freed, by every thread (this program
/// has one).
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is an atomic, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn configs(tickets: usize) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key))
        .unwrap();
    server.send_tls13_tickets = tickets;
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// Moves every record one side has to send to the other, and processes it.
fn pass(
    from: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
    to: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
) {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let mut reader = &wire[..];
    while !reader.is_empty() {
        to.read_tls(&mut reader).unwrap();
        to.process_new_packets().unwrap();
    }
}

/// The heap bytes that `run` leaves allocated in what it returns: counted
/// while that is alive, everything else `run` made having been dropped.
fn heap_kept<T>(run: impl FnOnce() -> T) -> isize {
    let before = LIVE.load(Ordering::Relaxed);
    let kept = run();
    let held = LIVE.load(Ordering::Relaxed) - before;
    drop(kept);
    held
}

/// An idle server session after a handshake and `message` bytes each way:
/// the heap bytes it holds.
fn idle_session(
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
    message: usize,
) -> isize {
    let name = ServerName::try_from("localhost").unwrap();
    // The client is made (and dropped) within the count: what stays is
    // the server's alone.
    heap_kept(|| {
        let mut client = ClientConnection::new(client_config.clone(), name).unwrap();
        let mut server = ServerConnection::new(server_config.clone()).unwrap();
        while client.is_handshaking() || server.is_handshaking() {
            pass(&mut client, &mut server);
            pass(&mut server, &mut client);
        }
        let payload = vec![7u8; message];
        client.writer().write_all(&payload).unwrap();
        pass(&mut client, &mut server);
        let mut got = vec![0u8; message];
        server.reader().read_exact(&mut got).unwrap();
        server.writer().write_all(&got).unwrap();
        pass(&mut server, &mut client);
        drop((got, payload, client));
        server
    })
}

/// The same with rustls's unbuffered API on the server's side, as
/// rapidws's `stream/tls.rs` drives it: the buffers are the caller's, so
/// what is counted is the session's own state alone (the caller's buffers
/// are dropped before counting, as rapidws gives them back to its pool).
fn idle_unbuffered_session(
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
    message: usize,
) -> isize {
    let name = ServerName::try_from("localhost").unwrap();
    // As in `idle_session`, the client is made and dropped within the count.
    heap_kept(|| {
        let mut client = ClientConnection::new(client_config.clone(), name).unwrap();
        let mut server = UnbufferedServerConnection::new(server_config.clone()).unwrap();
        let mut incoming: Vec<u8> = Vec::new();
        let mut outgoing: Vec<u8> = Vec::new();
        let mut received: Vec<u8> = Vec::new();
        let payload = vec![7u8; message];
        let mut echoed = false;
        for _ in 0..64 {
            // The client's records to the server.
            while client.wants_write() {
                client.write_tls(&mut incoming).unwrap();
            }
            // The server processes what it has, until it waits.
            loop {
                let status = server.process_tls_records(&mut incoming);
                let discard = status.discard;
                let mut done = false;
                match status.state.unwrap() {
                    ConnectionState::ReadTraffic(mut records) => {
                        while let Some(record) = records.next_record() {
                            received.extend_from_slice(record.unwrap().payload);
                        }
                    }
                    ConnectionState::EncodeTlsData(mut encode) => {
                        let mut room = vec![0u8; 1 << 15];
                        let n = match encode.encode(&mut room) {
                            Ok(n) => n,
                            Err(EncodeError::InsufficientSize(_)) => panic!("more room"),
                            Err(_) => 0,
                        };
                        outgoing.extend_from_slice(&room[..n]);
                    }
                    ConnectionState::TransmitTlsData(transmit) => transmit.done(),
                    ConnectionState::WriteTraffic(mut write) => {
                        if received.len() >= message && !echoed {
                            let mut room = vec![0u8; message + 1024];
                            let n = match write.encrypt(&received[..message], &mut room) {
                                Ok(n) => n,
                                Err(EncryptError::InsufficientSize(_)) => panic!("more room"),
                                Err(error) => panic!("{error}"),
                            };
                            outgoing.extend_from_slice(&room[..n]);
                            echoed = true;
                        }
                        done = true;
                    }
                    _ => done = true,
                }
                incoming.drain(..discard);
                if done {
                    break;
                }
            }
            // The server's records to the client.
            let mut reader = &outgoing[..];
            while !reader.is_empty() {
                client.read_tls(&mut reader).unwrap();
                client.process_new_packets().unwrap();
            }
            outgoing.clear();
            if !client.is_handshaking() && !server.is_handshaking() && received.is_empty() {
                client.writer().write_all(&payload).unwrap();
            }
            if echoed {
                let mut got = vec![0u8; message];
                client.reader().read_exact(&mut got).unwrap();
                break;
            }
        }
        assert!(echoed, "the message went both ways");
        drop((incoming, outgoing, received, payload, client));
        server
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs benches with no
    // argument and expects them to end quickly.
    println!(
        "size_of::<rustls::ServerConnection>() = {} bytes (inline, in its owner)",
        size_of::<ServerConnection>()
    );
    println!(
        "size_of::<rustls::server::UnbufferedServerConnection>() = {} bytes (inline)",
        size_of::<UnbufferedServerConnection>()
    );
    type Measure = fn(&Arc<ServerConfig>, &Arc<ClientConfig>, usize) -> isize;
    let apis: [(&str, Measure); 2] = [
        ("buffered", idle_session),
        ("unbuffered", idle_unbuffered_session),
    ];
    for (api, measure) in apis {
        for tickets in [0, 2] {
            let (server_config, client_config) = configs(tickets);
            for message in [100, 16_000] {
                let samples: Vec<isize> = (0..5)
                    .map(|_| measure(&server_config, &client_config, message))
                    .collect();
                let mut sorted = samples.clone();
                sorted.sort_unstable();
                println!(
                    "{api:>10}: TLS 1.3 tickets {tickets}, {message:>6}-byte message each way: heap held by the idle session, median {} bytes (of {:?})",
                    sorted[sorted.len() / 2],
                    samples
                );
            }
        }
    }
}
