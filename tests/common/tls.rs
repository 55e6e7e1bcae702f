//! TLS for the tests: a certificate made per test binary (rcgen), rustls
//! configurations on ring, and a bridge that carries plain TCP connections
//! over TLS to a wss server, so that every raw-socket test runs unchanged
//! against the server's TLS path.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// A self-signed certificate for `localhost` and `127.0.0.1`, its key, and
/// both written as PEM files (for the Python client and the echo example).
pub struct Identity {
    pub cert: CertificateDer<'static>,
    pub key: PrivatePkcs8KeyDer<'static>,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
}

/// This test binary's identity, made once.
pub fn identity() -> &'static Identity {
    static IDENTITY: OnceLock<Identity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let made = rcgen::generate_simple_self_signed(names).expect("certificate");
        let dir = std::env::temp_dir().join(format!("rapidws-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert_pem = dir.join("cert.pem");
        let key_pem = dir.join("key.pem");
        std::fs::write(&cert_pem, made.cert.pem()).unwrap();
        std::fs::write(&key_pem, made.signing_key.serialize_pem()).unwrap();
        Identity {
            cert: made.cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()),
            cert_pem,
            key_pem,
        }
    })
}

/// A self-signed ECDSA P-256 certificate for `localhost` and `127.0.0.1`
/// valid from a day ago for 10 days: what a browser's WebTransport takes by
/// its hash (`serverCertificateHashes`: at most 14 days). Written as PEM
/// files under `name`.
pub fn short_lived_identity(name: &str) -> Identity {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let mut params = rcgen::CertificateParams::new(names).expect("names");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(9);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    let dir = std::env::temp_dir().join(format!("rapidws-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert_pem = dir.join("cert.pem");
    let key_pem = dir.join("key.pem");
    std::fs::write(&cert_pem, cert.pem()).unwrap();
    std::fs::write(&key_pem, key.serialize_pem()).unwrap();
    Identity {
        cert: cert.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        cert_pem,
        key_pem,
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server's configuration: this binary's certificate.
pub fn server_config() -> Arc<ServerConfig> {
    let identity = identity();
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![identity.cert.clone()],
            PrivateKeyDer::Pkcs8(identity.key.clone_key()),
        )
        .expect("server config");
    // No TLS 1.3 session tickets: Python `websockets`' sync client (the
    // interop tests' client) loses its upgrade request now and then when a
    // ticket arrives while it writes it (its reader thread and its writer
    // share the SSL object), and waits for an answer that cannot come. Seen
    // against both wss servers, about once in 800 handshakes with tickets,
    // never in 2,000 without them or in 4,000 with its asyncio client.
    config.send_tls13_tickets = 0;
    Arc::new(config)
}

/// A client configuration that trusts this binary's certificate only.
pub fn client_config() -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(identity().cert.clone()).unwrap();
    trusting(roots)
}

/// A client configuration that trusts `roots` only.
pub fn trusting(roots: RootCertStore) -> Arc<ClientConfig> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Opens a TLS connection to a wss server at `addr`, as `localhost`.
pub async fn connect(
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(client_config()).connect(name, tcp).await
}

/// Listens on a free loopback port and carries each connection over TLS to
/// the wss server at `upstream`, both ways, FIN included. Returns the port's
/// address and the accept task (abort it to stop listening).
pub async fn bridge(upstream: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut plain, _)) = listener.accept().await else {
                continue;
            };
            let _ = plain.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut tls) = connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut plain, &mut tls).await;
            });
        }
    });
    (addr, task)
}

/// A QUIC endpoint for HTTP/3 (`rapidws::h3::endpoint`) on a free
/// loopback port with this binary's certificate, and its address.
#[cfg(feature = "http3")]
pub fn h3_endpoint() -> (rapidws::h3::quinn::Endpoint, SocketAddr) {
    h3_endpoint_with(&rapidws::h3::QuicConfig::default())
}

/// [`h3_endpoint`] with `quic`'s settings.
#[cfg(feature = "http3")]
pub fn h3_endpoint_with(
    quic: &rapidws::h3::QuicConfig,
) -> (rapidws::h3::quinn::Endpoint, SocketAddr) {
    let mut tls = (*server_config()).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let endpoint = rapidws::h3::endpoint("127.0.0.1:0".parse().unwrap(), tls, quic).unwrap();
    let addr = endpoint.local_addr().unwrap();
    (endpoint, addr)
}

/// A QUIC client endpoint on `local` that trusts this binary's
/// certificate and speaks `h3`.
#[cfg(feature = "http3")]
pub fn h3_client_endpoint(local: SocketAddr) -> rapidws::h3::quinn::Endpoint {
    use rapidws::h3::quinn;
    let mut roots = RootCertStore::empty();
    roots.add(identity().cert.clone()).unwrap();
    let mut tls = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client(local).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    endpoint
}
