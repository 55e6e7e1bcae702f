//! What a new subscriber is sent from its topic's history, under the
//! topic's lock, before it joins: the latest publication kept
//! ([`Start::Latest`]), or every one after its position
//! ([`Start::After`]), and then, through its envelope, whether it was
//! recovered.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::envelope::{self, Publication};
use super::log::Since;
use super::registry::{Topic, TopicState};
use super::{Inner, Position, Start, Subscribe};
use crate::connection::conn::Conn;

/// What a replay did.
pub(super) struct Replay {
    pub(super) recovered: Option<bool>,
    pub(super) replayed: usize,
}

impl Inner {
    /// Sends a new subscriber what `how` asks for from `entry`'s history,
    /// under the topic's lock; then, for a resume, whether it was
    /// recovered (through its envelope).
    pub(super) fn replay(
        &self,
        conn: &Conn,
        entry: &Topic,
        state: &TopicState,
        how: &Subscribe,
    ) -> Replay {
        let envelope = how.envelope.as_ref();
        let mut replayed = 0;
        // Sends one kept publication; false if it did not fit.
        let mut send = |publication: &Arc<Publication>| {
            let fits = conn
                .send_prepared(&publication.frame(envelope), None)
                .is_ok();
            replayed += usize::from(fits);
            fits
        };
        let recovered = match how.start {
            Start::Now => None,
            Start::Latest => {
                if let Some(latest) = state.log.as_ref().and_then(|log| log.latest()) {
                    send(latest);
                }
                None
            }
            Start::After(seen) => {
                // Everything of the epoch before a renumbering is nothing
                // missed of this one.
                let seen = match state.renumbered_from {
                    Some(ended) if ended == seen => Position {
                        epoch: state.epoch,
                        offset: 0,
                    },
                    _ => seen,
                };
                let whole = if seen.epoch != state.epoch || seen.offset > state.last {
                    false
                } else if seen.offset == state.last {
                    true // missed nothing
                } else {
                    match state
                        .log
                        .as_ref()
                        .map(|log| log.since(seen.offset, state.last))
                    {
                        Some(Since::All(missed)) => {
                            let mut whole = true;
                            for publication in missed {
                                if !send(publication) {
                                    whole = false;
                                    break;
                                }
                            }
                            whole
                        }
                        Some(Since::Gap) | None => false,
                    }
                };
                let told = !(whole && how.quiet_when_whole);
                if let Some(signal) = envelope
                    .filter(|_| told)
                    .and_then(|e| e.recovery(&entry.name, whole))
                {
                    let _ = conn.send_signal(&envelope::prepare(&signal));
                }
                Some(whole)
            }
        };
        self.replayed.fetch_add(replayed as u64, Ordering::Relaxed);
        Replay {
            recovered,
            replayed,
        }
    }
}
