//! Reading a topic's history without subscribing: what a protocol that
//! answers a resume with the missed publications in its reply (Centrifugo's
//! subscribe), or serves history on request, reads before it subscribes.

use std::sync::Arc;

use super::log::Since;
use super::{Position, PubSub, Publication, check_topic};

/// What a topic keeps, read at one point under its lock.
#[derive(Clone, Debug)]
pub struct Kept {
    /// The topic's latest position then: a subscribe with
    /// [`Start::After`] it misses nothing published since.
    ///
    /// [`Start::After`]: super::Start::After
    pub position: Position,
    /// The publications asked for, oldest first.
    pub publications: Vec<Arc<Publication>>,
    /// Whether they are all that followed the position asked from: false
    /// when some are no longer kept, or the position is not of this epoch
    /// or ahead of the topic (then `publications` is empty).
    pub whole: bool,
}

impl PubSub {
    /// `topic`'s latest position and the publications it keeps, oldest
    /// first: those after `after`, or all it keeps with `None`. A topic
    /// with history is made if it is not there yet, so that the position
    /// answered is the one a subscribe right after joins (its epoch); `None`
    /// for a topic without history that has no subscribers here, or when
    /// the topics' budget has no room.
    pub fn kept(&self, topic: &str, after: Option<Position>) -> Option<Kept> {
        check_topic(topic).ok()?;
        let history = self.inner.config.history_of(topic);
        loop {
            let entry = if history.is_on() {
                self.inner.registry.open(topic, history)?
            } else {
                self.inner.registry.find(topic)?
            };
            let state = entry.lock();
            if state.gone {
                continue;
            }
            let position = Position {
                epoch: state.epoch,
                offset: state.last,
            };
            let Some(after) = after else {
                let publications = state
                    .log
                    .iter()
                    .flat_map(|log| log.iter().cloned())
                    .collect();
                return Some(Kept {
                    position,
                    publications,
                    whole: true,
                });
            };
            // As a replay reads it: an epoch ended by a renumbering at
            // `after` missed nothing of this one.
            let after = match state.renumbered_from {
                Some(ended) if ended == after => Position {
                    epoch: state.epoch,
                    offset: 0,
                },
                _ => after,
            };
            let none = |whole| Kept {
                position,
                publications: Vec::new(),
                whole,
            };
            if after.epoch != state.epoch || after.offset > state.last {
                return Some(none(false));
            }
            if after.offset == state.last {
                return Some(none(true));
            }
            return Some(
                match state
                    .log
                    .as_ref()
                    .map(|log| log.since(after.offset, state.last))
                {
                    Some(Since::All(missed)) => Kept {
                        position,
                        publications: missed.cloned().collect(),
                        whole: true,
                    },
                    Some(Since::Gap) | None => none(false),
                },
            );
        }
    }
}
