//! A pool of `BytesMut` buffers in size classes, shared by all connections.
//!
//! The point is memory, not allocation speed: a connection that is waiting for
//! data gives its read buffer back, so ten thousand idle connections hold no read
//! buffers at all, only the few that are busy at a given moment do. The pool never
//! holds more than `max_retained` buffers of a class; buffers beyond that, or far
//! larger than the largest class, are freed. Taking and giving never block.
//!
//! Each class keeps its few most recently returned buffers in a small LIFO stack
//! (behind a `try_lock`: if another thread holds it, the buffer goes the other
//! way) in front of a bounded lock-free FIFO queue: a buffer given back a moment
//! ago is likely still in the CPU cache, while a FIFO alone hands out the one
//! that has waited longest.

use std::sync::Mutex;

use bytes::BytesMut;
use crossbeam_queue::ArrayQueue;

/// How many buffers per class the LIFO stack holds.
const HOT: usize = 8;

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
    /// The most recently returned buffers, reused first (cache-warm).
    hot: Mutex<Vec<BytesMut>>,
    hot_max: usize,
    /// The rest, if the class retains more than `HOT`.
    cold: Option<ArrayQueue<BytesMut>>,
}

impl Class {
    fn new(size: usize, retained: usize) -> Class {
        let hot_max = retained.min(HOT);
        Class {
            size,
            hot: Mutex::new(Vec::with_capacity(hot_max)),
            hot_max,
            cold: (retained > hot_max).then(|| ArrayQueue::new(retained - hot_max)),
        }
    }

    fn pop(&self) -> Option<BytesMut> {
        if let Ok(mut hot) = self.hot.try_lock() {
            if let Some(buf) = hot.pop() {
                return Some(buf);
            }
        }
        self.cold.as_ref()?.pop()
    }

    /// Keeps `buf` if there is room; otherwise it is dropped (freed).
    fn push(&self, buf: BytesMut) {
        if let Ok(mut hot) = self.hot.try_lock() {
            if hot.len() < self.hot_max {
                return hot.push(buf);
            }
        }
        if let Some(cold) = &self.cold {
            let _ = cold.push(buf);
        }
    }

    fn len(&self) -> usize {
        let hot = self.hot.lock().map_or(0, |hot| hot.len());
        hot + self.cold.as_ref().map_or(0, ArrayQueue::len)
    }
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
            list.entry(&(class.size, class.len()));
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
                Class::new(size, retained)
            })
            .collect();
        classes.sort_by_key(|c| c.size);
        BufferPool {
            classes: classes.into_boxed_slice(),
        }
    }

    /// An empty buffer with room for at least `min_capacity` bytes: a pooled one
    /// of the smallest fitting class if there is one, else of a larger class,
    /// else a new one of the smallest fitting class.
    ///
    /// Why larger classes too: a buffer often grows while in use (a write queue
    /// collecting a batch of echoes) and comes back in a larger class than it
    /// was taken from. Taking only from the smallest class would then allocate
    /// a new buffer every time, and grow it again, while the grown ones pile up
    /// (and are freed) a class higher: measured as a tenth of the io_uring
    /// server's CPU time in page faults.
    pub fn take(&self, min_capacity: usize) -> BytesMut {
        let mut fitting = self.classes.iter().filter(|c| c.size >= min_capacity);
        let Some(smallest) = fitting.next() else {
            return BytesMut::with_capacity(min_capacity);
        };
        smallest
            .pop()
            .or_else(|| fitting.find_map(Class::pop))
            .unwrap_or_else(|| BytesMut::with_capacity(smallest.size))
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
                    class.push(buf);
                }
                return;
            }
        }
    }

    /// How many free buffers the pool holds, over all classes.
    pub fn free_buffers(&self) -> usize {
        self.classes.iter().map(Class::len).sum()
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
    fn the_most_recently_returned_buffer_comes_back_first() {
        let pool = BufferPool::with_classes(&[(1024, 32)]);
        let bufs: Vec<BytesMut> = (0..20).map(|_| pool.take(1024)).collect();
        let ptrs: Vec<*const u8> = bufs.iter().map(|b| b.as_ptr()).collect();
        for buf in bufs {
            pool.give(buf);
        }
        assert_eq!(pool.free_buffers(), 20);
        // The first HOT returned are stacked; later ones went to the queue.
        assert_eq!(pool.take(1).as_ptr(), ptrs[HOT - 1]);
        assert_eq!(pool.take(1).as_ptr(), ptrs[HOT - 2]);
    }

    #[test]
    fn a_larger_free_buffer_serves_when_the_fitting_class_is_empty() {
        let pool = BufferPool::with_classes(&[(1024, 4), (8192, 4)]);
        let mut grown = pool.take(100);
        assert_eq!(grown.capacity(), 1024);
        grown.extend_from_slice(&[1; 9000]);
        let grown_at = grown.as_ptr();
        pool.give(grown);
        // The 1 KiB class is empty; the grown buffer is reused, not a new one.
        let again = pool.take(100);
        assert_eq!(again.as_ptr(), grown_at);
        assert!(again.capacity() >= 8192);
        // Nothing free anywhere: a new buffer of the smallest fitting class.
        assert_eq!(pool.take(100).capacity(), 1024);
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
