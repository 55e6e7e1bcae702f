//! What the drivers share: plumbing around the connection's life that more
//! than one of `tokio/`, `uring/` and `stream/` needs, and that is not the
//! connection's own business.
//!
//! | file | job |
//! |---|---|
//! | `read_buf.rs` | a connection's read buffer: pooled while a partial frame is in it, grown towards the frame's end |
//! | `slab.rs` | a server loop's connections by slot number |
//! | `local.rs` | tasks on a server loop's own thread (an io_uring reactor's): spawned there, polled between its rounds |
//! | `mailbox.rs` | jobs other threads post to a server loop (pub/sub deliveries), bounded |
//! | `timer.rs` | a connection's one tokio `Sleep`, on the lifecycle's deadline (tokio groups, the stream driver) |
//! | `listen.rs` | binding, the backlog, backing off after accept errors |
//! | `shutdown.rs` | a loop's part in a shutdown: its connections asked to close, then aborted |
//! | `turn.rs` | what a readiness driver owes (`Transport`) and the one turn both run over it |
//! | `tls.rs` | a rustls session with pooled buffers and no I/O: the wss of the stream driver and of io_uring |
//! | `tcp.rs` | the options every accepted TCP connection is served with (no Nagle delay, little left unsent in the kernel) |
//! | `entrance.rs` | the way into a socket server for connections accepted elsewhere (a router's) |
//! | `surface.rs` | the servers' shared public methods (handle, shutdown, address, handoff), written once by macros, and the handoff's settings |

#[cfg(any(feature = "tokio", all(target_os = "linux", feature = "uring")))]
pub(crate) mod entrance;
pub(crate) mod listen;
pub(crate) mod local;
pub(crate) mod mailbox;
pub(crate) mod read_buf;
pub(crate) mod shutdown;
pub(crate) mod slab;
pub(crate) mod surface;
#[cfg(any(feature = "tokio", all(target_os = "linux", feature = "uring")))]
pub(crate) mod tcp;
#[cfg(feature = "stream")]
pub(crate) mod timer;
#[cfg(feature = "rustls")]
pub(crate) mod tls;
#[cfg(feature = "stream")]
pub(crate) mod turn;
