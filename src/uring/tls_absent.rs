//! Without the `rustls` feature: a `Tls` and a `ServerConfig` that have no
//! values, so a connection's `Option<Box<Tls>>` is always `None` and the
//! connection code keeps one shape (as `proto/deflate/absent.rs` does for
//! permessage-deflate).

use std::io;
use std::sync::Arc;

use bytes::BytesMut;

use crate::pool::BufferPool;
use crate::proto::WriteQueue;

pub(crate) enum ServerConfig {}

pub(crate) enum Tls {}

impl Tls {
    pub(crate) fn new(config: &Arc<ServerConfig>) -> io::Result<Box<Tls>> {
        match **config {}
    }

    pub(crate) fn open(&mut self, _: &[u8], _: &mut BytesMut, _: &BufferPool) -> io::Result<()> {
        match *self {}
    }

    pub(crate) fn seal(&mut self, _: &mut WriteQueue, _: &BufferPool) -> io::Result<usize> {
        match *self {}
    }

    pub(crate) fn is_handshaking(&self) -> bool {
        match *self {}
    }

    pub(crate) fn wants_write(&self) -> bool {
        match *self {}
    }

    pub(crate) fn take_records(&mut self, _: &mut WriteQueue, _: &BufferPool) {
        match *self {}
    }

    pub(crate) fn close(&mut self, _: &BufferPool) {
        match *self {}
    }
}
