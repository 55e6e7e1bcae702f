//! Handing live connections to the next process (feature `handoff`,
//! Linux): the pieces built so far. See ARCHITECTURE.md, "Handing live
//! connections to the next process", for the whole plan.
//!
//! | file | job |
//! |---|---|
//! | `channel.rs` | the Unix socket between the two processes: messages with descriptors (`SCM_RIGHTS`), bounded |

// Used by the handoff's next pieces (the connections' records, the
// servers' side); tested on its own until then.
#[allow(dead_code)]
pub(crate) mod channel;
