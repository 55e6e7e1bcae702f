#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rapidws_fuzz::forwarded(data));
