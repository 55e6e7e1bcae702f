//! permessage-deflate's own cost per message: compressing and inflating a
//! 1 KiB JSON-like text message (about 3.4:1 at level 1), with and without
//! context takeover. Without it, each message takes a zlib stream from the
//! per-thread pool and resets it after.
//!
//! `cargo bench --bench deflate`; throughput in messages per second.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rapidws::handshake::negotiate;
use rapidws::proto::Role;
use rapidws::proto::deflate::{Compressor, DeflateConfig, Inflater};

/// A market-data-like JSON message of about `size` bytes.
fn message(size: usize) -> Vec<u8> {
    let mut out = String::from("[");
    let mut i = 0u32;
    while out.len() < size - 80 {
        out.push_str(&format!(
            "{{\"s\":\"SYM{:03}\",\"bid\":{}.{:02},\"ask\":{}.{:02},\"seq\":{}}},",
            i % 50,
            1000 + i * 7 % 300,
            i * 13 % 100,
            1001 + i * 7 % 300,
            i * 17 % 100,
            i * 7919
        ));
        i += 1;
    }
    out.push(']');
    out.into_bytes()
}

fn compressor(keep_context: bool) -> Compressor {
    let config = DeflateConfig::default().server_context_takeover(keep_context);
    let params = negotiate([&b"permessage-deflate"[..]], &config).expect("accepted");
    Compressor::new(Role::Server, &params, &config)
}

fn deflate(c: &mut Criterion) {
    let message = message(1024);
    let mut group = c.benchmark_group("deflate_1KiB_json");
    group.throughput(Throughput::Elements(1));
    for (name, keep) in [("no_context", false), ("context", true)] {
        let mut compressor = compressor(keep);
        let mut out = BytesMut::with_capacity(4096);
        group.bench_function(format!("compress/{name}"), |b| {
            b.iter(|| {
                out.clear();
                assert!(compressor.compress(black_box(&message), &mut out));
                black_box(out.len())
            })
        });
    }
    // Inflating messages compressed without context (each stands alone).
    let mut packed = BytesMut::new();
    compressor(false).compress(&message, &mut packed);
    for (name, keep) in [("no_context", false), ("context", true)] {
        let mut inflater = Inflater::new(keep);
        let mut out = BytesMut::with_capacity(4096);
        group.bench_function(format!("inflate/{name}"), |b| {
            b.iter(|| {
                out.clear();
                inflater
                    .feed(black_box(&packed), &mut out, 1 << 20)
                    .unwrap();
                inflater.finish(&mut out, 1 << 20).unwrap();
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, deflate);
criterion_main!(benches);
