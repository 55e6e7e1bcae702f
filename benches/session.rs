//! In-memory echo through the whole sans-I/O session: masked client frames go in
//! as one read buffer, every message is echoed into the write queue, the queue is
//! drained. No sockets: this is the protocol's own cost per message.
//!
//! `cargo bench --bench session`; throughput in messages per second.

use std::hint::black_box;
use std::sync::Arc;

use bytes::BytesMut;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rapidws_core::pool::BufferPool;
use rapidws_core::proto::frame::{OpCode, write_frame};
use rapidws_core::proto::{Event, Limits, Message, Role, Session, WriteQueue};

/// `count` masked client frames of `size` bytes, text or binary.
fn wire(count: usize, size: usize, text: bool) -> Vec<u8> {
    let payload: Vec<u8> = b"abcdefghijklmnopqrstuvwxyz0123456789"
        .iter()
        .cycle()
        .take(size)
        .copied()
        .collect();
    let opcode = if text { OpCode::Text } else { OpCode::Binary };
    let mut out = Vec::new();
    for i in 0..count {
        write_frame(
            &mut out,
            true,
            0,
            opcode,
            &payload,
            Some((i as u32).to_be_bytes()),
        );
    }
    out
}

fn echo(c: &mut Criterion) {
    let mut group = c.benchmark_group("session_echo");
    let pool = Arc::new(BufferPool::default());
    for &(size, text) in &[
        (16usize, false),
        (1024, false),
        (1024, true),
        (16 * 1024, false),
        (64 * 1024, true),
    ] {
        let count = (256 * 1024 / size).clamp(4, 1024);
        let wire = wire(count, size, text);
        let kind = if text { "text" } else { "binary" };
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(BenchmarkId::new(kind, size), |b| {
            let mut session = Session::new(Role::Server, Limits::default(), pool.clone());
            let mut input = BytesMut::with_capacity(wire.len());
            let mut out = WriteQueue::new();
            b.iter(|| {
                // Stands in for the socket read into the pooled buffer.
                input.extend_from_slice(&wire);
                let mut echoed = 0;
                while let Some(event) = session.poll_event(&mut input, &mut out).unwrap() {
                    if let Event::Message(message) = event {
                        let opcode = match message {
                            Message::Text(_) => OpCode::Text,
                            Message::Binary(_) => OpCode::Binary,
                        };
                        out.push_frame(true, 0, opcode, message.as_bytes());
                        echoed += 1;
                    }
                }
                // Stands in for the write.
                let n = out.len();
                out.advance(n);
                black_box(echoed)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, echo);
criterion_main!(benches);
