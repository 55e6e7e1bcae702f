//! wss for the client: rustls (through `stream::tls`), with the caller's
//! `ClientConfig` or one made from the web PKI roots (`webpki-roots`) or
//! the platform's (`native-roots`). The server name (SNI and the
//! certificate check) is the URL's host; ALPN offers `http/1.1`, the only
//! protocol an upgrade can run over.

use std::sync::{Arc, OnceLock};

use rustls::ClientConfig;
use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::stream::tls::TlsStream;

use super::error::ConnectError;
use super::url::Host;
use crate::pool::BufferPool;

/// The config `Client::tls` keeps: the caller's, with ALPN set to
/// `http/1.1`.
pub(crate) fn with_alpn(config: &ClientConfig) -> Arc<ClientConfig> {
    let mut config = config.clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The config a client without one of its own uses: the roots the enabled
/// features give, with the process's default crypto provider. Made once.
pub(crate) fn default_config() -> Result<Arc<ClientConfig>, ConnectError> {
    // Only a config that could be made is kept: a crypto provider installed
    // after a first failed attempt is used by the next one.
    static DEFAULT: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    if let Some(config) = DEFAULT.get() {
        return Ok(config.clone());
    }
    let config = make_default().map_err(ConnectError::TlsUnavailable)?;
    Ok(DEFAULT.get_or_init(|| config).clone())
}

fn make_default() -> Result<Arc<ClientConfig>, &'static str> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .ok_or(
            "no rustls crypto provider is installed \
         (CryptoProvider::install_default, or give Client::tls a ClientConfig)",
        )?;
    #[allow(unused_mut)]
    let mut roots = rustls::RootCertStore::empty();
    #[cfg(feature = "webpki-roots")]
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    #[cfg(feature = "native-roots")]
    {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::debug!(%error, "a platform root certificate could not be loaded");
        }
        roots.add_parsable_certificates(found.certs);
    }
    if roots.is_empty() {
        return Err("no root certificates \
             (enable the webpki-roots or native-roots feature, or give Client::tls a ClientConfig)");
    }
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| "the crypto provider supports no safe TLS version")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(with_alpn(&config))
}

/// Runs the TLS handshake with `host` over `stream`; the session's buffers
/// come from `pool`.
pub(crate) async fn handshake<S>(
    config: Arc<ClientConfig>,
    host: &Host,
    stream: S,
    pool: Arc<BufferPool>,
) -> Result<TlsStream<S, UnbufferedClientConnection>, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = match host {
        Host::Name(name) => {
            ServerName::try_from(name.trim_end_matches('.').to_owned()).map_err(|_| {
                ConnectError::Tls(std::io::Error::other("the host is not a valid DNS name"))
            })?
        }
        Host::V4(ip) => ServerName::IpAddress(std::net::IpAddr::V4(*ip).into()),
        Host::V6(ip) => ServerName::IpAddress(std::net::IpAddr::V6(*ip).into()),
    };
    TlsStream::connect(config, name, stream, pool)
        .await
        .map_err(|error| {
            // rustls's own errors (a certificate, a protocol violation) are
            // TLS errors; a reset or an early end of the stream is I/O.
            let from_rustls = error
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
            if from_rustls {
                ConnectError::Tls(error)
            } else {
                ConnectError::Io(error)
            }
        })
}

#[cfg(all(test, any(feature = "webpki-roots", feature = "native-roots")))]
mod tests {
    use super::*;

    /// With roots from a feature and a provider installed, the default
    /// config is made (and kept): ALPN `http/1.1`.
    #[test]
    fn the_default_config_comes_from_the_enabled_roots() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = default_config().expect("roots and a provider");
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        assert!(
            Arc::ptr_eq(&config, &default_config().unwrap()),
            "made once"
        );
    }
}
