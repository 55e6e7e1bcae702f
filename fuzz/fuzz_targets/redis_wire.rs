#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rapidws_fuzz::redis_wire(data));
