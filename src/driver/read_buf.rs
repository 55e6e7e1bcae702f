//! A connection's own read buffer, as every driver uses it: borrowed from the
//! pool only while it holds a partial frame (or, on tokio, while reading), and
//! grown towards the end of the frame in progress as its bytes arrive.

use bytes::BytesMut;

use crate::pool::BufferPool;

/// The most the read buffer grows ahead of the bytes that have arrived. A frame
/// header may announce up to `max_frame_size`; memory follows what the peer
/// actually sends, not what it claims.
pub(crate) const MAX_READ_AHEAD: usize = 256 * 1024;

/// Makes sure `buf` exists and has room for the next read: towards the end of
/// the frame in progress (`bytes_wanted`, counted from the start of the
/// buffer), but never more than [`MAX_READ_AHEAD`] beyond the bytes already
/// here.
pub(crate) fn prepare(
    buf: &mut BytesMut,
    bytes_wanted: usize,
    pool: &BufferPool,
    read_size: usize,
) {
    let len = buf.len();
    if buf.capacity() == 0 {
        *buf = pool.take(read_ahead(len, bytes_wanted, read_size));
    }
    let spare = buf.capacity() - len;
    if let Some(more) = grow_by(len, spare, bytes_wanted, read_size) {
        buf.reserve(more);
    }
}

/// Gives `buf` back to the pool if it holds no partial frame.
pub(crate) fn release(buf: &mut BytesMut, pool: &BufferPool) {
    if buf.is_empty() && buf.capacity() > 0 {
        pool.give(std::mem::take(buf));
    }
}

/// How much room to make for the next read: towards the end of the frame in
/// progress, at least a normal read, and never more than [`MAX_READ_AHEAD`]
/// past what has arrived.
fn read_ahead(len: usize, bytes_wanted: usize, read_size: usize) -> usize {
    bytes_wanted
        .saturating_sub(len)
        .clamp(read_size, MAX_READ_AHEAD.max(read_size))
}

/// Whether the buffer should grow before the next read, and by how much: when
/// almost full, or when a frame in progress has less than half a read-ahead of
/// room left. Growth is geometric (`BytesMut::reserve`), so a large frame costs
/// a few copies, while a header that merely claims a large frame costs nothing.
fn grow_by(len: usize, spare: usize, bytes_wanted: usize, read_size: usize) -> Option<usize> {
    let ahead = read_ahead(len, bytes_wanted, read_size);
    let frame_needs_room = bytes_wanted > len && spare < ahead / 2;
    (spare < 1024 || frame_needs_room).then_some(ahead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_frame_size_does_not_reserve_memory_up_front() {
        // A header claiming 16 MiB: room for at most one read-ahead.
        assert_eq!(read_ahead(14, 16 << 20, 16 * 1024), MAX_READ_AHEAD);
        assert_eq!(
            grow_by(14, 16 * 1024 - 14, 16 << 20, 16 * 1024),
            Some(MAX_READ_AHEAD)
        );
        // Between frames: a normal read.
        assert_eq!(read_ahead(0, 0, 16 * 1024), 16 * 1024);
        assert_eq!(grow_by(0, 16 * 1024, 0, 16 * 1024), None);
        // A small frame needs no more than it lacks, but a read is the minimum.
        assert_eq!(read_ahead(100, 300, 16 * 1024), 16 * 1024);
    }

    #[test]
    fn buffers_grow_when_nearly_full_or_a_frame_needs_room() {
        assert_eq!(grow_by(15_500, 500, 0, 16 * 1024), Some(16 * 1024));
        assert_eq!(
            grow_by(1 << 20, 64 * 1024, 8 << 20, 16 * 1024),
            Some(MAX_READ_AHEAD)
        );
        assert_eq!(grow_by(1 << 20, 200 * 1024, 8 << 20, 16 * 1024), None);
    }

    #[test]
    fn an_empty_buffer_goes_back_to_the_pool_and_a_partial_frame_stays() {
        let pool = BufferPool::default();
        let mut buf = BytesMut::new();
        prepare(&mut buf, 0, &pool, 16 * 1024);
        assert!(buf.capacity() >= 16 * 1024);
        buf.extend_from_slice(b"partial");
        release(&mut buf, &pool);
        assert_eq!(&buf[..], b"partial");
        buf.clear();
        release(&mut buf, &pool);
        assert_eq!(buf.capacity(), 0);
    }
}
