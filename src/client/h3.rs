//! `wss://` over HTTP/3 (RFC 9220) for the client ([`Client::http3`]):
//! QUIC to the URL's host and port, the extended CONNECT through
//! [`crate::h3::Client`], the response checked by the sans-I/O
//! [`ConnectHandshake`]; the WebSocket then runs over the request stream's
//! DATA frames as it runs over TLS.
//!
//! Each connection has a QUIC endpoint (a UDP socket) of its own, on the
//! runtime that connects it: a client's connections share nothing that
//! could outlive a runtime, and each may move (QUIC's migration) on its own.
//!
//! [`Client::http3`]: super::Client::http3

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::time::{Instant, timeout_at};

use super::error::{ConnectError, MAX_REFUSAL_BODY, Refusal, Stage};
use super::upgrade::{Response, client_request, host_header};
use super::url::{Host, Url};
use super::{Asked, connect_each, resolve};
use crate::connection::config::Config;
use crate::h3::DataStream;
use crate::handshake::ConnectHandshake;

/// The port `wss://` means without one: HTTP/3 is on UDP 443 as HTTPS is
/// on TCP 443.
const PORT: u16 = 443;

/// The QUIC connection, the extended CONNECT, its `2xx`: the WebSocket's
/// stream, the response, and the server's address.
pub(super) async fn connect(
    url: &Url,
    request: &Asked,
    config: &Config,
    tls: Arc<rustls::ClientConfig>,
    connect_timeout: std::time::Duration,
) -> Result<(DataStream, Response, SocketAddr), ConnectError> {
    let deadline = Instant::now() + connect_timeout;
    let port = url.port_or(PORT);
    let addrs = timeout_at(deadline, resolve(&url.host, port))
        .await
        .map_err(|_| ConnectError::Timeout(Stage::Connect))??;
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|_| {
        ConnectError::TlsUnavailable("the TLS config has no TLS 1.3 cipher suite QUIC can use")
    })?;
    let mut quic = quinn::ClientConfig::new(Arc::new(crypto));
    // A lost packet at a stream's tail is resent after the round trip
    // plus the server's acknowledgement delay: asked to be short, as the
    // server asks of its clients (`QuicConfig::max_ack_delay`).
    let mut transport = quinn::TransportConfig::default();
    let ack =
        crate::h3::ack_frequency(crate::h3::DEFAULT_MAX_ACK_DELAY).map_err(ConnectError::Io)?;
    transport.ack_frequency_config(Some(ack));
    quic.transport_config(Arc::new(transport));
    let name = server_name(&url.host);
    let (conn, addr) = connect_each(addrs, deadline, |addr| dial(addr, &quic, &name)).await?;

    let deadline = Instant::now() + config.handshake_timeout;
    let timed_out = |_| ConnectError::Timeout(Stage::Handshake);
    let client = timeout_at(deadline, crate::h3::Client::new(conn))
        .await
        .map_err(timed_out)?
        .map_err(ConnectError::Io)?;
    let host = host_header(url);
    let protocols = request.protocols();
    let headers = request.header_pairs();
    let (handshake, fields) = client_request(&host, url, &protocols, &headers, config)
        .extended_connect()
        .map_err(ConnectError::Request)?;
    // `open_websocket` writes the version itself.
    let fields: Vec<(&str, &[u8])> = fields
        .iter()
        .filter(|(name, _)| name != "sec-websocket-version")
        .map(|(name, value)| (name.as_str(), value.as_slice()))
        .collect();
    let (response, mut stream) =
        timeout_at(deadline, client.open_websocket(&host, &url.target, &fields))
            .await
            .map_err(timed_out)?
            .map_err(ConnectError::Io)?;
    let response = checked(&handshake, &response, &mut stream, deadline).await?;
    Ok((stream, response, addr))
}

/// Connects QUIC to `addr` from an endpoint of its own.
async fn dial(
    addr: SocketAddr,
    config: &quinn::ClientConfig,
    name: &str,
) -> Result<quinn::Connection, ConnectError> {
    let local = match addr {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let endpoint = quinn::Endpoint::client(local).map_err(ConnectError::Io)?;
    let connecting = endpoint
        .connect_with(config.clone(), addr, name)
        .map_err(|error| ConnectError::Connect {
            addr,
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, error),
        })?;
    connecting.await.map_err(|error| match &error {
        // TLS's alerts (a certificate, no common protocol) travel as
        // QUIC's crypto errors, 0x100 to 0x1ff.
        quinn::ConnectionError::TransportError(transport)
            if (0x100..0x200).contains(&u64::from(transport.code)) =>
        {
            ConnectError::Tls(std::io::Error::other(error))
        }
        _ => ConnectError::Connect {
            addr,
            error: std::io::Error::other(error),
        },
    })
}

/// The response checked: a `2xx` that agrees to what was offered, or the
/// refusal with the start of its body.
async fn checked(
    handshake: &ConnectHandshake<'_>,
    response: &crate::h3::Response,
    stream: &mut DataStream,
    deadline: Instant,
) -> Result<Response, ConnectError> {
    let headers: Vec<(String, Vec<u8>)> = response
        .fields()
        .map(|(name, value)| (name.to_owned(), value.to_vec()))
        .collect();
    let status = response.status();
    if !(200..300).contains(&status) {
        let mut body = Vec::new();
        let mut limited = (&mut *stream).take(MAX_REFUSAL_BODY as u64);
        let _ = timeout_at(deadline, limited.read_to_end(&mut body)).await;
        return Err(ConnectError::Status(Box::new(Refusal {
            status,
            headers,
            body: body.into(),
        })));
    }
    let parsed: Vec<httparse::Header<'_>> = headers
        .iter()
        .map(|(name, value)| httparse::Header { name, value })
        .collect();
    let agreed = handshake
        .check(status, &parsed)
        .map_err(ConnectError::Handshake)?;
    Ok(Response::new(
        headers.clone(),
        agreed.protocol.map(str::to_owned),
        agreed.deflate,
    ))
}

/// The name TLS checks the certificate against: the host's name, or its
/// address.
fn server_name(host: &Host) -> String {
    match host {
        Host::Name(name) => name.trim_end_matches('.').to_owned(),
        Host::V4(ip) => ip.to_string(),
        Host::V6(ip) => ip.to_string(),
    }
}
