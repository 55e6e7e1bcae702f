//! zlib-rs streams writing straight into a `BytesMut`, and a small per-thread
//! pool of streams for sides that keep no context between messages.
//!
//! The deflate code's one `unsafe` block is here (`into_spare`): zlib-rs
//! writes into the buffer's spare capacity, and the bytes it reports as
//! written become part of the buffer.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use bytes::BytesMut;
use zlib_rs::{
    Deflate, DeflateConfig, DeflateFlush, Inflate, InflateError, InflateFlush, Method, Status,
    Strategy,
};

/// The window every inflater uses. A larger window than the sender's is always
/// safe to inflate with, and zlib-rs allocates this size whatever it is told.
const INFLATE_WINDOW_BITS: u8 = 15;

/// Streams kept per thread and kind: one message is compressed or inflated at
/// a time on a thread, so a couple cover every connection it serves.
const KEEP_PER_THREAD: usize = 2;

/// What a deflate stream was made with; only an equal stream is reused, and
/// messages compressed alone with equal keys are interchangeable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateKey {
    pub(super) window_bits: u8,
    pub(super) level: u8,
    pub(super) mem_level: u8,
}

/// Inflates as much of `input` as fits in the first `room` bytes of `out`'s
/// spare capacity, appending what it inflated to `out`. Returns how many input
/// bytes it used, how many it wrote, and zlib's status.
pub(super) fn inflate_into(
    stream: &mut Inflate,
    input: &[u8],
    out: &mut BytesMut,
    room: usize,
) -> Result<(usize, usize, Status), InflateError> {
    into_spare(stream, out, room, |stream, spare| {
        stream.decompress_uninit(input, spare, InflateFlush::NoFlush)
    })
}

/// Compresses as much of `input` as the spare capacity of `out` takes, with a
/// sync flush, appending the output. Returns the input bytes used, the bytes
/// written and the spare capacity there was.
pub(super) fn deflate_into(
    stream: &mut Deflate,
    input: &[u8],
    out: &mut BytesMut,
) -> Result<(usize, usize, usize), zlib_rs::DeflateError> {
    let room = out.capacity() - out.len();
    let (used, wrote, _) = into_spare(stream, out, room, |stream, spare| {
        stream.compress_uninit(input, spare, DeflateFlush::SyncFlush)
    })?;
    Ok((used, wrote, room))
}

/// A zlib-rs stream's running counts of bytes consumed and produced.
trait Totals {
    fn totals(&self) -> (u64, u64);
}

impl Totals for Inflate {
    fn totals(&self) -> (u64, u64) {
        (self.total_in(), self.total_out())
    }
}

impl Totals for Deflate {
    fn totals(&self) -> (u64, u64) {
        (self.total_in(), self.total_out())
    }
}

/// Runs one zlib-rs call on the first `room` bytes of `out`'s spare capacity
/// and makes what it wrote part of `out`. Returns the input bytes it used,
/// the bytes it wrote, and the call's own result.
fn into_spare<S: Totals, T, E>(
    stream: &mut S,
    out: &mut BytesMut,
    room: usize,
    call: impl FnOnce(&mut S, &mut [MaybeUninit<u8>]) -> Result<T, E>,
) -> Result<(usize, usize, T), E> {
    let spare = &mut out.spare_capacity_mut()[..room];
    let (in_before, out_before) = stream.totals();
    let result = call(stream, spare)?;
    let (in_after, out_after) = stream.totals();
    let used = (in_after - in_before) as usize;
    let wrote = (out_after - out_before) as usize;
    assert!(
        wrote <= room,
        "zlib-rs reported more output than it was given"
    );
    // SAFETY: zlib-rs measures `total_out` by how far it moved its output
    // pointer, so it initialized exactly the first `wrote` bytes of the spare
    // capacity it was given, and `wrote <= room <= spare capacity`.
    unsafe { out.set_len(out.len() + wrote) };
    Ok((used, wrote, result))
}

/// Boxed streams, so they move in and out of connections without copying.
#[derive(Default)]
#[allow(
    clippy::vec_box,
    reason = "connections hold streams boxed; the pool keeps those boxes"
)]
struct Spare {
    inflaters: Vec<Box<Inflate>>,
    deflaters: Vec<(DeflateKey, Box<Deflate>)>,
}

thread_local! {
    static SPARE: RefCell<Spare> = RefCell::new(Spare::default());
}

/// A raw-deflate inflater, from this thread's pool if it has one. Streams are
/// boxed so that a connection not using one carries only a `None`.
pub(super) fn take_inflater() -> Box<Inflate> {
    let reused = SPARE
        .try_with(|spare| spare.try_borrow_mut().ok()?.inflaters.pop())
        .ok()
        .flatten();
    reused.unwrap_or_else(|| Box::new(Inflate::new(false, INFLATE_WINDOW_BITS)))
}

/// Resets an inflater and keeps it for this thread's next message, unless
/// the pool is full.
pub(super) fn give_inflater(mut stream: Box<Inflate>) {
    stream.reset(false);
    let _ = SPARE.try_with(|spare| {
        if let Ok(mut spare) = spare.try_borrow_mut() {
            if spare.inflaters.len() < KEEP_PER_THREAD {
                spare.inflaters.push(stream);
            }
        }
    });
}

/// A raw-deflate compressor made with `key`, from this thread's pool if it
/// has one.
pub(super) fn take_deflater(key: DeflateKey) -> Box<Deflate> {
    let reused = SPARE
        .try_with(|spare| {
            let mut spare = spare.try_borrow_mut().ok()?;
            let at = spare.deflaters.iter().position(|(k, _)| *k == key)?;
            Some(spare.deflaters.swap_remove(at).1)
        })
        .ok()
        .flatten();
    reused.unwrap_or_else(|| {
        Box::new(Deflate::new_with_config(DeflateConfig {
            level: i32::from(key.level),
            method: Method::Deflated,
            // Negative: a raw deflate stream, without zlib's header.
            window_bits: -i32::from(key.window_bits),
            mem_level: i32::from(key.mem_level),
            strategy: Strategy::Default,
        }))
    })
}

/// Resets a compressor and keeps it for this thread's next message, unless
/// the pool already holds enough of its kind.
pub(super) fn give_deflater(key: DeflateKey, mut stream: Box<Deflate>) {
    stream.reset();
    let _ = SPARE.try_with(|spare| {
        if let Ok(mut spare) = spare.try_borrow_mut() {
            let same = spare.deflaters.iter().filter(|(k, _)| *k == key).count();
            if same < KEEP_PER_THREAD {
                spare.deflaters.push((key, stream));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: DeflateKey = DeflateKey {
        window_bits: 15,
        level: 6,
        mem_level: 8,
    };

    #[test]
    fn output_written_into_spare_capacity_round_trips() {
        let text = b"spare capacity, spare capacity, spare capacity".repeat(50);
        let mut deflater = take_deflater(KEY);
        let mut packed = BytesMut::with_capacity(16);
        let mut input = &text[..];
        loop {
            if packed.capacity() - packed.len() < 8 {
                packed.reserve(64);
            }
            let (used, wrote, room) = deflate_into(&mut deflater, input, &mut packed).unwrap();
            input = &input[used..];
            if input.is_empty() && wrote < room {
                break;
            }
        }
        assert!(
            packed.ends_with(&[0, 0, 0xff, 0xff]),
            "a sync flush ends so"
        );
        assert!(packed.len() < text.len() / 4);

        let mut inflater = take_inflater();
        let mut plain = BytesMut::with_capacity(7);
        let mut input = &packed[..];
        while !input.is_empty() || plain.capacity() == plain.len() {
            if plain.capacity() == plain.len() {
                plain.reserve(7);
            }
            let room = (plain.capacity() - plain.len()).min(7);
            let (used, wrote, _) = inflate_into(&mut inflater, input, &mut plain, room).unwrap();
            assert!(wrote <= room);
            input = &input[used..];
        }
        assert_eq!(&plain[..], &text[..]);
        give_inflater(inflater);
        give_deflater(KEY, deflater);
    }

    #[test]
    fn the_pool_keeps_a_few_reset_streams_per_kind() {
        // Tests may share a thread (`--test-threads 1`): start empty.
        SPARE.with(|spare| *spare.borrow_mut() = Spare::default());
        let mut used = take_deflater(KEY);
        let mut out = BytesMut::with_capacity(256);
        deflate_into(&mut used, b"some input", &mut out).unwrap();
        assert!(used.total_in() > 0);
        give_deflater(KEY, used);
        let other = DeflateKey { level: 1, ..KEY };
        let streams: Vec<_> = (0..5).map(|_| take_deflater(other)).collect();
        for stream in streams {
            give_deflater(other, stream);
        }
        let reused = take_deflater(KEY);
        assert_eq!(reused.total_in(), 0, "given back reset");
        SPARE.with(|spare| {
            let spare = spare.borrow();
            let others = spare.deflaters.iter().filter(|(k, _)| *k == other).count();
            assert_eq!(others, KEEP_PER_THREAD);
            assert!(spare.deflaters.iter().all(|(k, _)| *k == other));
        });
        give_deflater(KEY, reused);
    }
}
