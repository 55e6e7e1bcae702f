//! Codec micro-benchmarks: frame headers, masking, UTF-8 validation, handshake.
//!
//! `cargo bench --bench codec`; throughput is reported in bytes per second
//! (GiB/s) for masking and UTF-8, time per operation for the rest.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rapidws_core::handshake::{header_buffer, parse_request, write_accept};
use rapidws_core::proto::WriteQueue;
use rapidws_core::proto::frame::{
    DecodeRules, MAX_HEADER_LEN, OpCode, decode_header, encode_header,
};
use rapidws_core::proto::{Utf8Validator, validate_utf8 as validate};
use rapidws_core::proto::{apply_mask, apply_mask_scalar};

const SIZES: &[usize] = &[16, 64, 256, 1024, 4096, 16 * 1024, 64 * 1024, 1 << 20];

fn frame_headers(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for &len in &[100u64, 1000, 100_000] {
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut header,
            true,
            0,
            OpCode::Binary,
            len,
            Some([1, 2, 3, 4]),
        );
        group.bench_with_input(
            BenchmarkId::new("decode_header", len),
            &header[..n],
            |b, h| b.iter(|| decode_header(black_box(h), DecodeRules::SERVER)),
        );
        group.bench_with_input(BenchmarkId::new("encode_header", len), &len, |b, &len| {
            let mut out = [0u8; MAX_HEADER_LEN];
            b.iter(|| encode_header(&mut out, true, 0, OpCode::Binary, black_box(len), None))
        });
    }
    group.finish();
}

fn masking(c: &mut Criterion) {
    let mut group = c.benchmark_group("mask");
    for &size in SIZES {
        let mut buf = vec![0x5Au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("simd", size), |b| {
            b.iter(|| apply_mask(black_box(&mut buf), [1, 2, 3, 4], 0))
        });
        if size <= 64 * 1024 {
            group.bench_function(BenchmarkId::new("scalar", size), |b| {
                b.iter(|| apply_mask_scalar(black_box(&mut buf), [1, 2, 3, 4], 0))
            });
        }
    }
    group.finish();
}

fn utf8(c: &mut Criterion) {
    let mut group = c.benchmark_group("utf8");
    for &size in &[1024usize, 64 * 1024, 1 << 20] {
        let ascii: Vec<u8> = b"The quick brown fox jumps over the lazy dog. "
            .iter()
            .cycle()
            .take(size)
            .copied()
            .collect();
        let mut mixed = String::with_capacity(size);
        for ch in "Hello κόσμε, 世界 🎵! ".chars().cycle() {
            if mixed.len() + ch.len_utf8() > size {
                break;
            }
            mixed.push(ch);
        }
        let mixed = mixed.as_bytes();
        group.throughput(Throughput::Bytes(ascii.len() as u64));
        group.bench_with_input(BenchmarkId::new("ascii", size), &ascii, |b, s| {
            b.iter(|| validate(black_box(s)).is_ok())
        });
        group.bench_with_input(BenchmarkId::new("ascii_std", size), &ascii, |b, s| {
            b.iter(|| std::str::from_utf8(black_box(s)).is_ok())
        });
        group.throughput(Throughput::Bytes(mixed.len() as u64));
        group.bench_with_input(BenchmarkId::new("mixed", size), &mixed, |b, s| {
            b.iter(|| validate(black_box(s)).is_ok())
        });
        group.bench_with_input(
            BenchmarkId::new("mixed_in_4k_pieces", size),
            &mixed,
            |b, s| {
                b.iter(|| {
                    let mut v = Utf8Validator::new();
                    for piece in s.chunks(4096) {
                        v.feed(black_box(piece)).unwrap();
                    }
                    v.finish().is_ok()
                })
            },
        );
    }
    group.finish();
}

const CHROME: &[u8] = b"GET /chat HTTP/1.1\r\nHost: example.com:9001\r\nConnection: Upgrade\r\n\
Pragma: no-cache\r\nCache-Control: no-cache\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) \
AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\nUpgrade: websocket\r\n\
Origin: https://example.com\r\nSec-WebSocket-Version: 13\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n\
Accept-Language: en-US,en;q=0.9\r\nSec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n\
Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n";

fn handshake(c: &mut Criterion) {
    let mut out = WriteQueue::new();
    c.bench_function("handshake/parse_and_respond", |b| {
        b.iter(|| {
            let mut headers = header_buffer();
            let (request, _) = parse_request(black_box(CHROME), &mut headers, 8192)
                .unwrap()
                .unwrap();
            write_accept(&mut out, request.key(), None, None);
            let n = out.len();
            out.advance(n);
        })
    });
    c.bench_function("handshake/parse_only", |b| {
        b.iter(|| {
            let mut headers = header_buffer();
            parse_request(black_box(CHROME), &mut headers, 8192)
                .unwrap()
                .is_some()
        })
    });
}

criterion_group!(benches, frame_headers, masking, utf8, handshake);
criterion_main!(benches);
