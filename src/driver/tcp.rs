//! The options every accepted TCP connection is served with.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use socket2::SockRef;

use crate::connection::config::Config;

/// Sets `stream` up for serving: no Nagle delay (a message goes out when it
/// is written), and at most [`Config::max_unsent_bytes`] of its output left
/// unsent in the kernel (Linux), which a reply cannot overtake. A refused
/// option costs only itself: it
/// is logged at debug level and the connection is served.
pub(crate) fn prepare(stream: &impl AsFd, config: &Config, peer: SocketAddr) {
    let socket = SockRef::from(stream);
    if let Err(error) = socket.set_tcp_nodelay(true) {
        tracing::debug!(%peer, %error, "could not set TCP_NODELAY");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(Err(error)) = config
        .max_unsent_bytes
        .map(|bytes| socket.set_tcp_notsent_lowat(bytes))
    {
        tracing::debug!(%peer, %error, "could not set TCP_NOTSENT_LOWAT");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = config;
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    fn accepted() -> (TcpStream, TcpStream, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        (client, stream, peer)
    }

    /// By default only Nagle's delay goes: the kernel keeps its own bound
    /// on what it holds unsent.
    #[test]
    fn by_default_no_delay_and_the_kernel_s_bound() {
        let (_client, stream, peer) = accepted();
        let socket = SockRef::from(&stream);
        assert!(!socket.tcp_nodelay().unwrap());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let before = socket.tcp_notsent_lowat().unwrap();
        prepare(&stream, &Config::default(), peer);
        assert!(socket.tcp_nodelay().unwrap());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert_eq!(socket.tcp_notsent_lowat().unwrap(), before);
    }

    /// A bound is set as given, as the kernel reads it back; `Some(0)` is
    /// no bound.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_bound_is_set_as_given() {
        let (_client, stream, peer) = accepted();
        let socket = SockRef::from(&stream);
        let before = socket.tcp_notsent_lowat().unwrap();
        prepare(&stream, &Config::default().max_unsent_bytes(0), peer);
        assert_eq!(socket.tcp_notsent_lowat().unwrap(), before);
        prepare(
            &stream,
            &Config::default().max_unsent_bytes(512 * 1024),
            peer,
        );
        assert_eq!(socket.tcp_notsent_lowat().unwrap(), 512 * 1024);
    }
}
