#![no_main]

use rapidws_fuzz::Compression;

libfuzzer_sys::fuzz_target!(|data: &[u8]| rapidws_fuzz::session(data, Compression::Off));
