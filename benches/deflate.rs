//! permessage-deflate's own cost per message: compressing and inflating a
//! 1 KiB JSON-like text message (about 3.4:1 at level 1), with and without
//! context takeover. Without it, each message takes a zlib stream from the
//! per-thread pool and resets it after.
//!
//! Then what pub/sub's choice for subscribers that keep context rests on
//! (`rapidws::pubsub`: they get the plain frame): per subscriber, queuing
//! the one shared frame of a publish, against compressing the message for
//! each. Printed first: the bytes each way, over 1,000 different 1 KiB
//! messages in a row.
//!
//! `cargo bench --bench deflate`; throughput in messages per second.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rapidws_core::handshake::negotiate;
use rapidws_core::proto::deflate::{Compressor, DeflateConfig, Inflater};
use rapidws_core::proto::frame::OpCode;
use rapidws_core::proto::{Prepared, Role, WriteQueue};

/// A market-data-like JSON message of about `size` bytes.
fn message(size: usize) -> Vec<u8> {
    message_from(size, 0)
}

/// [`message`], its figures starting from `seed`'s.
fn message_from(size: usize, seed: u32) -> Vec<u8> {
    let mut out = String::from("[");
    let mut i = seed;
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

/// Per subscriber of a publish: the shared frame queued, or the message
/// compressed for it with the context it keeps.
fn publish(c: &mut Criterion) {
    let messages: Vec<Vec<u8>> = (0..1000).map(|i| message_from(1024, i * 31)).collect();
    let plain: usize = messages.iter().map(Vec::len).sum();
    let mut sizes = Vec::new();
    for keep in [false, true] {
        let mut compressor = compressor(keep);
        let mut total = 0;
        for m in &messages {
            let mut out = BytesMut::new();
            assert!(compressor.compress(m, &mut out));
            total += out.len();
        }
        sizes.push(total);
    }
    println!(
        "publish: 1,000 messages of 1 KiB: {plain} bytes plain, {} compressed \
         alone ({:.2}), {} compressed keeping context ({:.2})",
        sizes[0],
        sizes[0] as f64 / plain as f64,
        sizes[1],
        sizes[1] as f64 / plain as f64,
    );

    let mut group = c.benchmark_group("publish_1KiB_json_per_subscriber");
    group.throughput(Throughput::Elements(1));
    let prepared = Prepared::new(OpCode::Text, &messages[0]);
    let mut queue = WriteQueue::new();
    group.bench_function("queue_shared_frame", |b| {
        b.iter(|| {
            queue.push_prepared(OpCode::Text, black_box(prepared.frame()).clone());
            if queue.len() > 1 << 20 {
                let n = queue.len();
                queue.advance(n);
            }
        })
    });
    let mut compressor = compressor(true);
    let mut out = BytesMut::with_capacity(4096);
    let mut next = messages.iter().cycle();
    group.bench_function("compress_keeping_context", |b| {
        b.iter(|| {
            out.clear();
            assert!(compressor.compress(black_box(next.next().unwrap()), &mut out));
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, deflate, publish);
criterion_main!(benches);
