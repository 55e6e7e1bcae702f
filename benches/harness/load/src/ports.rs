//! Free loopback ports below 32768: outside the range the kernel hands out
//! to outgoing connections (32768-60999 by default), so a server here never
//! takes a port the load generator's thousands of connections need, nor
//! meets one of theirs.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};

/// The lowest port tried.
const LOW: u16 = 10_000;
/// One past the highest port tried.
const HIGH: u16 = 32_768;

/// A TCP listener on a free loopback port below 32768.
pub fn listener() -> io::Result<TcpListener> {
    first_free(|port| TcpListener::bind(("127.0.0.1", port)))
}

/// A loopback address below 32768 whose port is free for TCP and for UDP
/// right now (a server may listen on both: HTTP/3 beside HTTP/1.1).
pub fn free_addr() -> io::Result<SocketAddr> {
    first_free(|port| {
        let tcp = TcpListener::bind(("127.0.0.1", port))?;
        UdpSocket::bind(("127.0.0.1", port))?;
        tcp.local_addr()
    })
}

/// The first port from a start of this process's own (so that runners side
/// by side rarely try the same ones) for which `bind` succeeds.
fn first_free<T>(bind: impl Fn(u16) -> io::Result<T>) -> io::Result<T> {
    let span = u32::from(HIGH - LOW);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (nanos ^ std::process::id()) % span;
    let mut last = io::Error::new(io::ErrorKind::AddrInUse, "no port tried");
    for step in 0..span {
        // 7919 is prime and does not divide the span: every port once.
        let port = LOW + ((start + step * 7919) % span) as u16;
        match bind(port) {
            Ok(bound) => return Ok(bound),
            Err(e) => last = e,
        }
    }
    Err(io::Error::new(
        last.kind(),
        format!("no free loopback port in {LOW}..{HIGH}: {last}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_low_free_and_distinct_while_held() {
        let held: Vec<TcpListener> = (0..50).map(|_| listener().unwrap()).collect();
        let mut ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert!(ports.iter().all(|p| (LOW..HIGH).contains(p)), "{ports:?}");
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), held.len());
        let addr = free_addr().unwrap();
        assert!(addr.ip().is_loopback() && (LOW..HIGH).contains(&addr.port()));
        // Free for both right after: nothing of free_addr's own is kept.
        TcpListener::bind(addr).unwrap();
        UdpSocket::bind(addr).unwrap();
    }

    #[test]
    fn every_port_of_the_span_is_tried_once() {
        let tried = std::cell::RefCell::new(Vec::new());
        let err = first_free(|port| -> io::Result<()> {
            tried.borrow_mut().push(port);
            Err(io::ErrorKind::AddrInUse.into())
        })
        .unwrap_err();
        assert!(err.to_string().contains("no free loopback port"), "{err}");
        let mut tried = tried.into_inner();
        assert_eq!(tried.len(), usize::from(HIGH - LOW));
        tried.sort_unstable();
        tried.dedup();
        assert_eq!(tried.len(), usize::from(HIGH - LOW));
    }
}
