//! Parsing a typical browser upgrade request and writing the 101 response
//! allocates nothing beyond the connection's own buffers: the header index lives
//! on the stack, every field borrows the read buffer, the accept key is computed
//! in a stack array, and the response is written into the connection's (pooled)
//! write buffer. Proven by counting allocations, not by timing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use rapidws_core::handshake::{
    ClientRequest, accept_key, header_buffer, negotiate, parse_request, write_accept,
};
use rapidws_core::proto::WriteQueue;
use rapidws_core::proto::deflate::DeflateConfig;

struct CountingAllocator;

thread_local! {
    /// Only allocations made on a thread that is counting are counted, so the
    /// test harness's own threads do not disturb the figure.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// thread-local counters are const-initialised `Cell`s, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
    });
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations_during(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(|n| n.get())
}

const CHROME: &[u8] = b"GET /chat?room=42 HTTP/1.1\r\n\
Host: example.com:9001\r\n\
Connection: Upgrade\r\n\
Pragma: no-cache\r\n\
Cache-Control: no-cache\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\n\
Upgrade: websocket\r\n\
Origin: https://example.com\r\n\
Sec-WebSocket-Version: 13\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Accept-Language: en-US,en;q=0.9\r\n\
Cookie: session=0123456789abcdef; theme=dark\r\n\
Sec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n\
Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
Sec-WebSocket-Protocol: chat\r\n\
\r\n";

#[test]
fn the_counter_sees_allocations() {
    let n = allocations_during(|| {
        std::hint::black_box(vec![1u8; 100]);
    });
    assert_eq!(n, 1);
}

#[test]
fn parsing_a_browser_request_and_answering_it_allocates_nothing() {
    // The connection's own state, allocated before: its read and write buffers.
    let read_buf = bytes::BytesMut::from(CHROME);
    let mut out = WriteQueue::new();
    assert!(
        out.provide_buffer(bytes::BytesMut::with_capacity(4096))
            .is_none()
    );

    let n = allocations_during(|| {
        let mut headers = header_buffer();
        let (request, head_len) = parse_request(&read_buf, &mut headers, 8192)
            .expect("valid")
            .expect("complete");
        assert_eq!(head_len, CHROME.len());
        assert_eq!(request.path(), "/chat");
        assert_eq!(request.header("origin"), Some(&b"https://example.com"[..]));
        let protocol = request.protocols().find(|p| *p == "chat");
        let deflate = negotiate(request.extension_offers(), &DeflateConfig::default());
        assert!(deflate.is_some(), "permessage-deflate agreed");
        write_accept(&mut out, request.key(), protocol, deflate.as_ref());
    });
    assert_eq!(n, 0, "allocations while parsing, negotiating and answering");
    assert!(out.len() > 100);
}

#[test]
fn a_client_writing_its_request_and_checking_the_101_allocates_nothing() {
    let mut out = WriteQueue::new();
    assert!(
        out.provide_buffer(bytes::BytesMut::with_capacity(4096))
            .is_none()
    );
    let request = ClientRequest::new("example.com", "/chat")
        .protocols(&["chat"])
        .headers(&[("Origin", "https://example.com")])
        .permessage_deflate(DeflateConfig::default());
    // The generator of keys is seeded (and allocated) once per thread.
    request.write(&mut WriteQueue::new()).unwrap();
    let mut handshake = None;
    let n = allocations_during(|| handshake = Some(request.write(&mut out).unwrap()));
    assert_eq!(n, 0, "allocations while writing the request");
    let handshake = handshake.unwrap();
    let accept = accept_key(handshake.key());
    let mut response = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
        Connection: Upgrade\r\nSec-WebSocket-Protocol: chat\r\n\
        Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
        client_no_context_takeover\r\nSec-WebSocket-Accept: "
        .to_vec();
    response.extend_from_slice(&accept);
    response.extend_from_slice(b"\r\n\r\n");
    let n = allocations_during(|| {
        let accepted = handshake.read_response(&response, 8192).unwrap().unwrap();
        assert_eq!(accepted.head_len, response.len());
        assert_eq!(accepted.protocol, Some("chat"));
        assert!(accepted.deflate.is_some());
    });
    assert_eq!(n, 0, "allocations while checking the response");
}
