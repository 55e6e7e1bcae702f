//! Whose turn it is to send: streams with data take turns a frame at a
//! time, the highest priority first.
//!
//! A stream is in the schedule at most once (its `scheduled` flag says so),
//! so the schedule never holds more entries than there are streams. A
//! stream removed while waiting is skipped when its turn comes.

use std::collections::VecDeque;

/// Streams waiting to send, in priority classes (highest first), each a
/// ring served in turn.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// `(priority, ring)`, sorted by priority, highest first; usually one.
    classes: Vec<(u8, VecDeque<u32>)>,
}

impl Schedule {
    /// Puts `stream` at the end of its priority's ring.
    pub(crate) fn push(&mut self, stream: u32, priority: u8) {
        let at = match self.classes.binary_search_by(|(p, _)| priority.cmp(p)) {
            Ok(at) => at,
            Err(at) => {
                self.classes.insert(at, (priority, VecDeque::new()));
                at
            }
        };
        self.classes[at].1.push_back(stream);
    }

    /// The next stream to send a frame: the first of the highest priority
    /// that has one.
    pub(crate) fn pop(&mut self) -> Option<u32> {
        self.classes
            .iter_mut()
            .find_map(|(_, ring)| ring.pop_front())
    }

    /// How many entries wait.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.classes.iter().map(|(_, ring)| ring.len()).sum()
    }

    /// Whether no stream waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.classes.iter().all(|(_, ring)| ring.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priority_first_then_in_turn() {
        let mut schedule = Schedule::default();
        schedule.push(3, 0);
        schedule.push(5, 0);
        schedule.push(7, 9);
        schedule.push(9, 4);
        assert_eq!(schedule.len(), 4);
        assert_eq!(schedule.pop(), Some(7));
        assert_eq!(schedule.pop(), Some(9));
        assert_eq!(schedule.pop(), Some(3));
        schedule.push(3, 0);
        assert_eq!(schedule.pop(), Some(5));
        assert_eq!(schedule.pop(), Some(3));
        assert_eq!(schedule.pop(), None);
    }
}
