//! A connection's state as bytes, to hand it to another process (the
//! handoff: docs/handoff.md in the repository). This is the codec:
//! little-endian integers and length-prefixed
//! byte strings, written by [`SnapshotWriter`] and read back by
//! [`SnapshotReader`], which checks every length against what is left and
//! every value against what it may be, so a truncated or altered snapshot
//! is refused with a [`SnapshotError`], never a panic or an allocation the
//! bytes did not pay for.

/// Why a snapshot could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// It ended before a field did.
    Truncated,
    /// A field held a value it may not (the name says which).
    Invalid(&'static str),
    /// It was written by another version of the format.
    Version(u8),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Truncated => f.write_str("snapshot truncated"),
            SnapshotError::Invalid(field) => write!(f, "snapshot field not valid: {field}"),
            SnapshotError::Version(v) => write!(f, "snapshot of format version {v}, not ours"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Appends fields to a snapshot.
#[derive(Debug, Default)]
pub struct SnapshotWriter {
    bytes: Vec<u8>,
}

impl SnapshotWriter {
    /// An empty snapshot.
    pub fn new() -> Self {
        SnapshotWriter::default()
    }

    /// One byte.
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }

    /// A flag, as one byte (0 or 1).
    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u8(u8::from(value))
    }

    /// Four bytes, little-endian.
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Eight bytes, little-endian.
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A length or count, as eight bytes.
    pub fn usize(&mut self, value: usize) -> &mut Self {
        self.u64(value as u64)
    }

    /// A byte string: its length, then its bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.usize(value.len());
        self.bytes.extend_from_slice(value);
        self
    }

    /// What was written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads fields from a snapshot, in the order they were written.
#[derive(Debug)]
pub struct SnapshotReader<'a> {
    rest: &'a [u8],
}

impl<'a> SnapshotReader<'a> {
    /// Reads `bytes` from the start.
    pub fn new(bytes: &'a [u8]) -> Self {
        SnapshotReader { rest: bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.rest.len() < n {
            return Err(SnapshotError::Truncated);
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    /// A flag: 0 or 1, anything else refused as `field`.
    pub fn bool(&mut self, field: &'static str) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotError::Invalid(field)),
        }
    }

    /// Four bytes, little-endian.
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Eight bytes, little-endian.
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    /// A length or count that must fit this machine's `usize`.
    pub fn usize(&mut self, field: &'static str) -> Result<usize, SnapshotError> {
        usize::try_from(self.u64()?).map_err(|_| SnapshotError::Invalid(field))
    }

    /// A byte string, borrowed from the snapshot (its length is checked
    /// against what is left before anything is taken).
    pub fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let len = self.usize("length")?;
        self.take(len)
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// Ends the reading: every byte must have been read.
    pub fn finish(self) -> Result<(), SnapshotError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(SnapshotError::Invalid("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_in_order() {
        let mut writer = SnapshotWriter::new();
        writer
            .u8(7)
            .bool(true)
            .u32(0xdead_beef)
            .u64(u64::MAX - 1)
            .usize(42)
            .bytes(b"payload")
            .bytes(b"");
        let bytes = writer.finish();
        let mut reader = SnapshotReader::new(&bytes);
        assert_eq!(reader.u8(), Ok(7));
        assert_eq!(reader.bool("flag"), Ok(true));
        assert_eq!(reader.u32(), Ok(0xdead_beef));
        assert_eq!(reader.u64(), Ok(u64::MAX - 1));
        assert_eq!(reader.usize("n"), Ok(42));
        assert_eq!(reader.bytes(), Ok(&b"payload"[..]));
        assert_eq!(reader.bytes(), Ok(&b""[..]));
        assert_eq!(reader.finish(), Ok(()));
    }

    #[test]
    fn every_truncation_and_bad_value_is_refused() {
        let mut writer = SnapshotWriter::new();
        writer.u32(1).bytes(b"abc").bool(false);
        let bytes = writer.finish();
        for cut in 0..bytes.len() {
            let mut reader = SnapshotReader::new(&bytes[..cut]);
            let read = reader
                .u32()
                .and_then(|_| reader.bytes().map(drop))
                .and_then(|()| reader.bool("flag").map(drop));
            assert_eq!(read, Err(SnapshotError::Truncated), "cut at {cut}");
        }
        // A length far past the end takes nothing (and allocates nothing).
        let mut huge = SnapshotWriter::new();
        huge.usize(usize::MAX);
        let huge = huge.finish();
        assert_eq!(
            SnapshotReader::new(&huge).bytes(),
            Err(SnapshotError::Truncated)
        );
        assert_eq!(
            SnapshotReader::new(&[2]).bool("flag"),
            Err(SnapshotError::Invalid("flag"))
        );
        let reader = SnapshotReader::new(&[0]);
        assert_eq!(
            reader.finish(),
            Err(SnapshotError::Invalid("trailing bytes"))
        );
    }
}
