//! What only the io_uring backend has: a ring of provided buffers that can run
//! short, and the need for io_uring itself.
#![cfg(all(target_os = "linux", feature = "uring"))]

mod common;

use common::*;
use futures_util::SinkExt;
use rapidws::Config;
use tokio_tungstenite::tungstenite::Message as Ws;

/// Two provided buffers of 512 bytes for 24 clients sending 64 KiB messages at
/// once: receives keep running out of buffers (ENOBUFS ends them) and are
/// armed again, and every echo still arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_short_of_buffers_loses_nothing() {
    let config = Config::default().read_buffer_size(512);
    let server = start_uring(config, |server| server.threads(1).provided_buffers(2)).await;
    let mut clients = tokio::task::JoinSet::new();
    for seed in 0..24u8 {
        let url = server.url("/");
        clients.spawn(async move {
            let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            for round in 0..4u8 {
                let payload: Vec<u8> = (0..65_536u32)
                    .map(|i| (i as u8) ^ seed ^ round.rotate_left(3))
                    .collect();
                client.send(Ws::binary(payload.clone())).await.unwrap();
                assert!(
                    next(&mut client).await == Ws::binary(payload),
                    "echo corrupted"
                );
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.expect("a client failed");
    }
}

/// Where io_uring is blocked (here by a seccomp filter, as container runtimes
/// do), the echo example reports why and exits with an error, no panic.
#[cfg(target_arch = "x86_64")]
#[test]
fn without_io_uring_the_echo_example_says_so() {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    let mut command = Command::new(common::echo_example());
    command.args(["--backend", "uring", "--addr", "127.0.0.1:0"]);
    // SAFETY: the closure runs in the child between fork and exec, and only
    // makes two `prctl` calls (async-signal-safe) with memory prepared before
    // the fork.
    unsafe { command.pre_exec(deny_io_uring_setup) };
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("io_uring is not available"), "{stderr}");
    assert!(stderr.contains("use the tokio backend"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Installs a seccomp filter that makes `io_uring_setup` fail with ENOSYS.
#[cfg(target_arch = "x86_64")]
fn deny_io_uring_setup() -> std::io::Result<()> {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const LOAD_WORD: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JUMP_IF_EQUAL: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const SYS_IO_URING_SETUP: u32 = 425;
    const ALLOW: u32 = 0x7fff_0000;
    const FAIL_WITH_ENOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;
    let filter = [
        SockFilter {
            code: LOAD_WORD,
            jt: 0,
            jf: 0,
            k: 4,
        }, // arch
        SockFilter {
            code: JUMP_IF_EQUAL,
            jt: 0,
            jf: 3,
            k: AUDIT_ARCH_X86_64,
        },
        SockFilter {
            code: LOAD_WORD,
            jt: 0,
            jf: 0,
            k: 0,
        }, // syscall number
        SockFilter {
            code: JUMP_IF_EQUAL,
            jt: 0,
            jf: 1,
            k: SYS_IO_URING_SETUP,
        },
        SockFilter {
            code: RETURN,
            jt: 0,
            jf: 0,
            k: FAIL_WITH_ENOSYS,
        },
        SockFilter {
            code: RETURN,
            jt: 0,
            jf: 0,
            k: ALLOW,
        },
    ];
    let program = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    // SAFETY: prctl reads `program` and the filter it points to, both alive
    // for the call; the other calls take no pointers.
    let failed = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, 2, &raw const program, 0, 0) != 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// SO_REUSEPORT (one listener per reactor) must not let a second server
/// quietly share a port that is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_refused() {
    let server = start_uring(Config::default(), |server| server.threads(2)).await;
    let handler = TestHandler {
        recorder: Default::default(),
        runtime: tokio::runtime::Handle::current(),
    };
    let second = rapidws::uring::Server::bind(server.addr, handler, Config::default());
    assert_eq!(
        second.expect_err("bound a taken port").kind(),
        std::io::ErrorKind::AddrInUse
    );
}
