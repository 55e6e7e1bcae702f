//! A pool of `BytesMut` buffers in size classes, shared by all connections.
//!
//! The point is memory, not allocation speed: a connection that is waiting for
//! data gives its read buffer back, so ten thousand idle connections hold no read
//! buffers at all, only the few that are busy at a given moment do. Each class is
//! a bounded lock-free queue, so returning a buffer never blocks and the pool never
//! holds more than `max_retained` buffers of a class; buffers beyond that, or far
//! larger than the largest class, are freed.

use bytes::BytesMut;
use crossbeam_queue::ArrayQueue;

/// Default size classes: (buffer size, how many free buffers the pool keeps).
pub const DEFAULT_CLASSES: &[(usize, usize)] = &[
    (4 * 1024, 1024),
    (16 * 1024, 512),
    (64 * 1024, 64),
    (256 * 1024, 16),
];

/// A shared pool of byte buffers. Cheap to share behind an `Arc`.
pub struct BufferPool {
    classes: Box<[Class]>,
}

struct Class {
    size: usize,
    free: ArrayQueue<BytesMut>,
}

impl Default for BufferPool {
    fn default() -> Self {
        BufferPool::with_classes(DEFAULT_CLASSES)
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        for class in self.classes.iter() {
            list.entry(&(class.size, class.free.len()));
        }
        list.finish()
    }
}

impl BufferPool {
    /// A pool with the given `(size, max_retained)` classes, in any order.
    ///
    /// # Panics
    /// If `classes` is empty or a size or count is zero.
    pub fn with_classes(classes: &[(usize, usize)]) -> Self {
        assert!(
            !classes.is_empty(),
            "a buffer pool needs at least one class"
        );
        let mut classes: Vec<Class> = classes
            .iter()
            .map(|&(size, retained)| {
                assert!(
                    size > 0 && retained > 0,
                    "pool class sizes and counts must be > 0"
                );
                Class {
                    size,
                    free: ArrayQueue::new(retained),
                }
            })
            .collect();
        classes.sort_by_key(|c| c.size);
        BufferPool {
            classes: classes.into_boxed_slice(),
        }
    }

    /// An empty buffer with room for at least `min_capacity` bytes: a pooled one
    /// of the smallest fitting class if there is one, else a new one.
    pub fn take(&self, min_capacity: usize) -> BytesMut {
        match self.classes.iter().find(|c| c.size >= min_capacity) {
            Some(class) => class
                .free
                .pop()
                .unwrap_or_else(|| BytesMut::with_capacity(class.size)),
            None => BytesMut::with_capacity(min_capacity),
        }
    }

    /// Returns a buffer to the pool. Its contents are discarded. Buffers smaller
    /// than the smallest class, or more than twice the largest class, are freed.
    pub fn give(&self, mut buf: BytesMut) {
        buf.clear();
        let largest = self.classes.last().map_or(0, |c| c.size);
        for class in self.classes.iter().rev() {
            // `try_reclaim` restores capacity lost to `advance` without allocating,
            // and fails for buffers that are too small.
            if buf.try_reclaim(class.size) {
                if buf.capacity() <= 2 * largest {
                    // A full class frees the buffer: that is the bound on the pool.
                    let _ = class.free.push(buf);
                }
                return;
            }
        }
    }

    /// How many free buffers the pool holds, over all classes.
    pub fn free_buffers(&self) -> usize {
        self.classes.iter().map(|c| c.free.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Buf, BufMut};

    #[test]
    fn takes_the_smallest_fitting_class_and_reuses_returned_buffers() {
        let pool = BufferPool::with_classes(&[(1024, 2), (8192, 2)]);
        let small = pool.take(100);
        assert!(small.capacity() >= 1024 && small.capacity() < 8192);
        let big = pool.take(2000);
        assert!(big.capacity() >= 8192);
        let ptr = big.as_ptr();
        pool.give(big);
        assert_eq!(pool.free_buffers(), 1);
        let again = pool.take(5000);
        assert_eq!(again.as_ptr(), ptr, "the returned buffer is reused");
        assert_eq!(pool.free_buffers(), 0);
    }

    #[test]
    fn returned_buffers_come_back_empty_with_their_capacity() {
        let pool = BufferPool::with_classes(&[(1024, 4)]);
        let mut buf = pool.take(1024);
        buf.put_slice(&[7u8; 1000]);
        buf.advance(900);
        pool.give(buf);
        let buf = pool.take(1);
        assert!(buf.is_empty());
        assert!(buf.capacity() >= 1024);
    }

    #[test]
    fn retains_at_most_the_class_count() {
        let pool = BufferPool::with_classes(&[(64, 2)]);
        for _ in 0..5 {
            pool.give(BytesMut::with_capacity(64));
        }
        assert_eq!(pool.free_buffers(), 2);
    }

    #[test]
    fn frees_oversized_and_tiny_buffers() {
        let pool = BufferPool::with_classes(&[(1024, 4)]);
        pool.give(BytesMut::with_capacity(10 * 1024));
        pool.give(BytesMut::with_capacity(10));
        assert_eq!(pool.free_buffers(), 0);
    }

    #[test]
    fn requests_beyond_the_largest_class_are_served_unpooled() {
        let pool = BufferPool::with_classes(&[(1024, 4)]);
        assert!(pool.take(1 << 20).capacity() >= 1 << 20);
    }
}
