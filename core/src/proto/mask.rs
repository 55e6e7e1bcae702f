//! Payload masking (RFC 6455 §5.3), in place.
//!
//! Every byte a client sends is XORed with a 4-byte key, so unmasking touches the
//! whole payload and is the hottest loop of a server. The portable path works on
//! 32-byte blocks of `u64` words, which LLVM turns into SSE2 vector code; on
//! x86-64 CPUs with AVX2 (checked once at run time, cached by std) the same loop
//! is compiled a second time with AVX2 enabled and handles twice as much per
//! instruction. A scalar reference is kept for tests and for the short tails.

/// XORs `buf` with `key`, where `buf` starts `offset` bytes into the payload.
///
/// The offset lets a payload that arrives in pieces be unmasked piece by piece:
/// the key phase continues where the previous piece stopped.
#[inline]
pub fn apply_mask(buf: &mut [u8], key: [u8; 4], offset: usize) {
    let key = rotate_key(key, offset);
    if buf.len() < 64 {
        apply_mask_words(buf, key);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `apply_mask_avx2` only requires that the CPU supports AVX2,
            // which the run-time check on the line above has just confirmed.
            unsafe { apply_mask_avx2(buf, key) };
            return;
        }
    }
    apply_mask_words(buf, key);
}

/// The key as seen by a slice that starts `offset` bytes into the payload.
#[inline]
fn rotate_key(key: [u8; 4], offset: usize) -> [u8; 4] {
    let k = u32::from_be_bytes(key).rotate_left(8 * (offset % 4) as u32);
    k.to_be_bytes()
}

/// The byte-at-a-time definition from the RFC: the reference the fast paths are
/// tested against.
pub fn apply_mask_scalar(buf: &mut [u8], key: [u8; 4], offset: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= key[(offset + i) % 4];
    }
}

/// Portable fast path: 32-byte blocks of four `u64` XORs, then 8-byte lanes,
/// then the last few bytes one by one. Safe code only; the speed comes from the compiler's vectoriser.
#[inline(always)]
fn apply_mask_words(buf: &mut [u8], key: [u8; 4]) {
    let word = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut blocks = buf.chunks_exact_mut(32);
    for block in &mut blocks {
        for lane in block.chunks_exact_mut(8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(lane);
            lane.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
        }
    }
    // Blocks and lanes are multiples of 4 bytes, so each tail starts at key
    // phase 0.
    let mut lanes = blocks.into_remainder().chunks_exact_mut(8);
    for lane in &mut lanes {
        let mut w = [0u8; 8];
        w.copy_from_slice(lane);
        lane.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    for (i, b) in lanes.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// The portable loop compiled with AVX2 enabled.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn apply_mask_avx2(buf: &mut [u8], key: [u8; 4]) {
    apply_mask_words(buf, key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    /// A buffer aligned to 64 bytes, so a slice at `start` has a known alignment.
    #[repr(align(64))]
    struct Aligned([u8; 384]);

    fn check(fast: impl Fn(&mut [u8], [u8; 4], usize)) {
        let mut rng = rand::rng();
        // Under Miri, the lengths around each block size and two starts.
        let lens: Vec<usize> = if cfg!(miri) {
            vec![0, 1, 3, 4, 7, 31, 32, 33, 63, 64, 65, 97]
        } else {
            (0..=300).collect()
        };
        let starts = if cfg!(miri) {
            vec![0, 3]
        } else {
            (0..=7).collect()
        };
        for &len in &lens {
            for &start in &starts {
                for phase in 0..4usize {
                    let key: [u8; 4] = rng.random();
                    let mut a = Aligned([0; 384]);
                    rng.fill(&mut a.0[..]);
                    let mut expected = a.0;
                    apply_mask_scalar(&mut expected[start..start + len], key, phase);
                    fast(&mut a.0[start..start + len], key, phase);
                    assert_eq!(
                        a.0[..],
                        expected[..],
                        "len {len} start {start} phase {phase}"
                    );
                }
            }
        }
    }

    #[test]
    fn dispatching_path_matches_scalar_reference() {
        check(apply_mask);
    }

    #[test]
    fn portable_path_matches_scalar_reference() {
        check(|buf, key, offset| apply_mask_words(buf, rotate_key(key, offset)));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_path_matches_scalar_reference() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipping: this CPU has no AVX2");
            return;
        }
        check(|buf, key, offset| {
            // SAFETY: AVX2 support was checked at the top of this test.
            unsafe { apply_mask_avx2(buf, rotate_key(key, offset)) }
        });
    }

    #[test]
    fn masking_in_pieces_equals_masking_at_once() {
        let mut rng = rand::rng();
        let key: [u8; 4] = rng.random();
        let mut whole = vec![0u8; 1000];
        rng.fill(&mut whole[..]);
        let mut pieces = whole.clone();
        apply_mask(&mut whole, key, 0);
        let mut at = 0;
        for cut in [1usize, 3, 64, 65, 7, 300, 560] {
            apply_mask(&mut pieces[at..at + cut], key, at);
            at += cut;
        }
        assert_eq!(at, 1000);
        assert_eq!(whole, pieces);
    }

    #[test]
    fn masking_twice_restores_the_input() {
        let original: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let mut buf = original.clone();
        apply_mask(&mut buf, [0xde, 0xad, 0xbe, 0xef], 1);
        assert_ne!(buf, original);
        apply_mask(&mut buf, [0xde, 0xad, 0xbe, 0xef], 1);
        assert_eq!(buf, original);
    }
}
