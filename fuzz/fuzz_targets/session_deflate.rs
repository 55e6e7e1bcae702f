#![no_main]

use rapidws_fuzz::Compression;

// The first byte's low bit picks whether the client keeps its window.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let compression = match data.first() {
        Some(b) if b & 1 != 0 => Compression::Context,
        _ => Compression::NoContext,
    };
    rapidws_fuzz::session(data, compression)
});
