//! The compressor and inflater of a build without the `deflate` feature:
//! types with no values. The session and the outbox hold them as `Option`s
//! that are always `None` (and take no room), so their code keeps one shape
//! with and without compression, and every compression path is dead code the
//! compiler drops. Nothing can make one: there is no `new`.

use bytes::BytesMut;

use super::InflateFailure;

/// Compression is not compiled in (the `deflate` feature is off).
pub enum Compressor {}

impl Compressor {
    /// Never called: there is no compressor.
    pub fn wants(&self, _len: usize) -> bool {
        match *self {}
    }

    /// Never called: there is no compressor.
    pub fn compress(&mut self, _payload: &[u8], _out: &mut BytesMut) -> bool {
        match *self {}
    }

    /// Never called: there is no compressor.
    pub fn keeps_context(&self) -> bool {
        match *self {}
    }
}

/// The parameters of a compressed message: none exist without the feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeflateKey {}

impl Compressor {
    /// Never called: there is no compressor.
    pub fn alone(&self) -> Option<DeflateKey> {
        match *self {}
    }
}

impl Compressor {
    /// Never called: there is no compressor.
    pub fn snapshot(
        &self,
        _out: &mut crate::snapshot::SnapshotWriter,
    ) -> Result<(), crate::proto::Unmovable> {
        match *self {}
    }

    /// There is no compressor to restore: permessage-deflate is not built in.
    pub fn restore(
        _from: &mut crate::snapshot::SnapshotReader<'_>,
    ) -> Result<Compressor, crate::snapshot::SnapshotError> {
        Err(crate::snapshot::SnapshotError::Invalid(
            "permessage-deflate (built without it)",
        ))
    }
}

/// Never called: no key exists.
pub fn compress_alone(key: DeflateKey, _payload: &[u8], _out: &mut BytesMut) -> bool {
    match key {}
}

/// Decompression is not compiled in (the `deflate` feature is off).
pub enum Inflater {}

impl Inflater {
    /// Never called: there is no inflater.
    pub fn feed(
        &mut self,
        _input: &[u8],
        _out: &mut BytesMut,
        _limit: usize,
    ) -> Result<(), InflateFailure> {
        match *self {}
    }

    /// Never called: there is no inflater.
    pub fn finish(&mut self, _out: &mut BytesMut, _limit: usize) -> Result<(), InflateFailure> {
        match *self {}
    }

    /// Never called: there is no inflater.
    pub fn release(&mut self) {
        match *self {}
    }

    /// Never called: there is no inflater.
    pub fn keeps_context(&self) -> bool {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_an_idle_connection_carries_nothing_for_deflate() {
        assert_eq!(size_of::<Option<Inflater>>(), 0);
        assert_eq!(size_of::<Option<Compressor>>(), 0);
    }
}
