//! Unpredictable bytes for the client role: a fresh masking key for every
//! frame a client sends (RFC 6455 §5.3) and the `Sec-WebSocket-Key` nonce of
//! its upgrade request (§4.1).
//!
//! The RFC asks that a masking key be "derived from a strong source of
//! entropy" and that the next one not be predictable from those already
//! sent, because masking is there so that a script in a browser cannot make
//! the bytes on the wire look like something a proxy would act on: a key the
//! script could guess would let it choose those bytes again. A non-cryptographic
//! generator (xorshift, PCG, wyrand) fails that: its state can be recovered
//! from a few outputs, and every key is sent in the clear in a frame header.
//!
//! So each thread owns a ChaCha12 stream cipher used as a generator (`rand`'s
//! `StdRng`), seeded from the operating system's entropy (`getrandom`) the
//! first time that thread needs a key, and never again. ChaCha12 is a CSPRNG
//! (no known way to predict its output or recover its key from it), and it
//! produces 256 bytes per refill, so a key costs a few nanoseconds and no
//! system call; a connection that never sends as a client never touches it.
//! `rand`'s own `ThreadRng` is the same cipher but reseeds from the OS every
//! 64 KiB of output, which for 4-byte keys is a system call every 16,384
//! frames and buys nothing against the threat above.
//!
//! A process that forks keeps its parent's generator state in the child, so
//! both would send the same keys; that hides nothing from an observer
//! either, but a client that forks should not share connections across the
//! fork anyway.

use std::cell::RefCell;

use rand::rngs::{StdRng, SysRng};
use rand::{Rng, SeedableRng};

thread_local! {
    static GENERATOR: RefCell<StdRng> = RefCell::new(
        StdRng::try_from_rng(&mut SysRng)
            .expect("the operating system's entropy source (getrandom) failed"),
    );
}

/// A masking key for one client frame.
pub(crate) fn mask_key() -> [u8; 4] {
    GENERATOR.with(|generator| generator.borrow_mut().next_u32().to_ne_bytes())
}

/// Fills `dst` with unpredictable bytes (the handshake's nonce).
pub fn fill(dst: &mut [u8]) {
    GENERATOR.with(|generator| generator.borrow_mut().fill_bytes(dst));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_vary_from_frame_to_frame_and_thread_to_thread() {
        let here: Vec<[u8; 4]> = (0..64).map(|_| mask_key()).collect();
        let mut distinct = here.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // 64 draws from 2^32 collide with probability below 1e-6.
        assert_eq!(distinct.len(), here.len());
        let there = std::thread::spawn(|| (0..64).map(|_| mask_key()).collect::<Vec<_>>())
            .join()
            .unwrap();
        assert_ne!(here, there, "each thread is seeded on its own");
    }

    #[test]
    fn fill_writes_every_byte() {
        // 32 bytes all zero after filling: probability 2^-256.
        let mut nonce = [0u8; 32];
        fill(&mut nonce);
        assert_ne!(nonce, [0u8; 32]);
    }
}
