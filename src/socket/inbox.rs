//! The messages a connection's driver has delivered and its [`WebSocket`]
//! has not taken yet: the one place where the callback side (the handler
//! adapter, on the driver's task) meets the async side (the socket's task).
//!
//! Bounded in bytes: once it holds `limit`, the push pauses the connection's
//! reading (`Conn::pause_reading`); the take that brings it below half
//! resumes it. Both happen under the inbox's lock, so a pause can never land
//! after the resume meant to end it. Each message is charged its payload
//! plus [`OVERHEAD`], so a flood of empty messages is bounded too.
//!
//! [`WebSocket`]: super::WebSocket

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::proto::{CloseCode, OwnedMessage};

/// What a queued message costs besides its payload: its slot in the queue
/// and the allocation behind it, rounded up.
pub(crate) const OVERHEAD: usize = 64;

/// How the connection ended, once it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ending {
    pub(crate) code: CloseCode,
    pub(crate) reason: String,
}

#[derive(Default)]
struct State {
    messages: VecDeque<OwnedMessage>,
    /// What `messages` is charged (payloads plus overhead).
    bytes: usize,
    /// Set by `on_close`; reported after the last message.
    ending: Option<Ending>,
    /// The reading side's task, while it waits.
    reader: Option<Waker>,
    /// No socket will read any more (it was dropped): messages are dropped.
    abandoned: bool,
}

/// See the module docs.
pub(crate) struct Inbox {
    limit: usize,
    state: Mutex<State>,
}

/// What [`Inbox::poll_take`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    Message(OwnedMessage),
    /// Over, with how it ended.
    Ended(Ending),
}

/// The switch on the connection's reading (`Conn` in the crate; a
/// recorder in the tests).
pub(crate) trait Reading {
    fn pause(&self);
    fn resume(&self);
}

impl Reading for crate::Conn {
    fn pause(&self) {
        self.pause_reading();
    }

    fn resume(&self) {
        self.resume_reading();
    }
}

impl Inbox {
    pub(crate) fn new(limit: usize) -> Self {
        Inbox {
            limit: limit.max(2),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change is a single push or pop: a panic cannot leave it torn.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a delivered message and wakes the reader; pauses `reading` once
    /// the inbox holds its limit.
    pub(crate) fn push(&self, message: OwnedMessage, reading: &impl Reading) {
        let mut state = self.lock();
        if state.abandoned {
            return;
        }
        state.bytes += charge(&message);
        state.messages.push_back(message);
        if state.bytes >= self.limit {
            reading.pause();
        }
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// The connection is over: the reader gets what is left, then this.
    pub(crate) fn end(&self, code: CloseCode, reason: &str) {
        let mut state = self.lock();
        state.ending = Some(Ending {
            code,
            reason: reason.to_owned(),
        });
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// The next message, or the ending once every message was taken; else
    /// registers `cx`'s waker. Resumes `reading` when the take brings the
    /// inbox below half its limit (a no-op unless a push paused it).
    /// Cancel-safe: a message is only removed by a call that returns it.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>, reading: &impl Reading) -> Poll<Taken> {
        let mut state = self.lock();
        if let Some(message) = state.messages.pop_front() {
            let before = state.bytes;
            state.bytes -= charge(&message);
            let half = self.limit / 2;
            if before >= half && state.bytes < half {
                reading.resume();
            }
            return Poll::Ready(Taken::Message(message));
        }
        if let Some(ending) = &state.ending {
            return Poll::Ready(Taken::Ended(ending.clone()));
        }
        match &mut state.reader {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Whether a socket still reads (it was not dropped).
    pub(crate) fn is_read(&self) -> bool {
        !self.lock().abandoned
    }

    /// How the connection ended, if it has and everything was taken.
    pub(crate) fn ending(&self) -> Option<Ending> {
        let state = self.lock();
        if state.messages.is_empty() {
            state.ending.clone()
        } else {
            None
        }
    }

    /// No socket reads any more: what is queued goes, later messages are
    /// dropped on arrival, and `reading` goes on if a push paused it (the
    /// close handshake needs the peer's close frame read).
    pub(crate) fn abandon(&self, reading: &impl Reading) {
        let mut state = self.lock();
        state.abandoned = true;
        state.messages = VecDeque::new();
        state.bytes = 0;
        state.reader = None;
        reading.resume();
    }
}

fn charge(message: &OwnedMessage) -> usize {
    message.as_message().len() + OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Records the switch's position and how often it was thrown.
    #[derive(Default)]
    struct Switch {
        paused: Cell<bool>,
        pauses: Cell<u32>,
        resumes: Cell<u32>,
    }
    impl Reading for Switch {
        fn pause(&self) {
            self.paused.set(true);
            self.pauses.set(self.pauses.get() + 1);
        }
        fn resume(&self) {
            self.paused.set(false);
            self.resumes.set(self.resumes.get() + 1);
        }
    }

    fn binary(len: usize) -> OwnedMessage {
        OwnedMessage::Binary(vec![1; len].into())
    }

    fn take(inbox: &Inbox, switch: &Switch) -> Poll<Taken> {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        inbox.poll_take(&mut Context::from_waker(&waker), switch)
    }

    #[test]
    fn messages_come_out_in_order_then_the_ending() {
        let (inbox, switch) = (Inbox::new(1 << 20), Switch::default());
        inbox.push(OwnedMessage::Text("one".into()), &switch);
        inbox.push(binary(3), &switch);
        inbox.end(CloseCode::NORMAL, "bye");
        assert_eq!(inbox.ending(), None, "messages are still queued");
        let text = OwnedMessage::Text("one".into());
        assert_eq!(take(&inbox, &switch), Poll::Ready(Taken::Message(text)));
        assert_eq!(
            take(&inbox, &switch),
            Poll::Ready(Taken::Message(binary(3)))
        );
        let ending = Ending {
            code: CloseCode::NORMAL,
            reason: "bye".into(),
        };
        assert_eq!(
            take(&inbox, &switch),
            Poll::Ready(Taken::Ended(ending.clone()))
        );
        // The ending stays: every later take reports it.
        assert_eq!(
            take(&inbox, &switch),
            Poll::Ready(Taken::Ended(ending.clone()))
        );
        assert_eq!(inbox.ending(), Some(ending));
        assert_eq!(switch.pauses.get(), 0);
    }

    #[test]
    fn a_waiting_reader_is_woken_by_a_message_and_by_the_end() {
        let (inbox, switch) = (Inbox::new(1 << 20), Switch::default());
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(inbox.poll_take(&mut cx, &switch).is_pending());
        // Polled again with the same waker: still one registration.
        assert!(inbox.poll_take(&mut cx, &switch).is_pending());
        inbox.push(binary(1), &switch);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(inbox.poll_take(&mut cx, &switch).is_ready());
        assert!(inbox.poll_take(&mut cx, &switch).is_pending());
        inbox.end(CloseCode::ABNORMAL, "");
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn pauses_at_the_limit_and_resumes_below_half() {
        // Each 36-byte message is charged 100 bytes.
        let (inbox, switch) = (Inbox::new(1000), Switch::default());
        for n in 1..=12 {
            inbox.push(binary(36), &switch);
            // Paused from the tenth message on (1,000 bytes charged).
            assert_eq!(switch.paused.get(), n >= 10, "after {n} pushes");
        }
        for taken in 1..=12 {
            assert!(matches!(
                take(&inbox, &switch),
                Poll::Ready(Taken::Message(_))
            ));
            // 1,200 charged: below 500 after the eighth take (400 left).
            assert_eq!(switch.paused.get(), taken < 8, "after {taken} takes");
        }
        assert_eq!(switch.resumes.get(), 1);
    }

    #[test]
    fn empty_messages_are_charged_too() {
        let (inbox, switch) = (Inbox::new(64 * 100), Switch::default());
        for _ in 0..99 {
            inbox.push(binary(0), &switch);
        }
        assert!(!switch.paused.get());
        inbox.push(binary(0), &switch);
        assert!(switch.paused.get(), "the hundredth empty message fills it");
    }

    #[test]
    fn an_abandoned_inbox_drops_what_comes() {
        let (inbox, switch) = (Inbox::new(100), Switch::default());
        inbox.push(binary(100), &switch);
        assert!(switch.paused.get());
        inbox.abandon(&switch);
        assert!(!switch.paused.get(), "reading goes on");
        inbox.push(binary(1000), &switch);
        assert!(!switch.paused.get(), "never full once abandoned");
        inbox.end(CloseCode::NORMAL, "");
        assert!(matches!(
            take(&inbox, &switch),
            Poll::Ready(Taken::Ended(_))
        ));
    }
}
