//! A connection's timer for the drivers on tokio: one `Sleep`, boxed and
//! made only while there is a deadline (most open connections have none),
//! kept on the deadline the connection's lifecycle gives.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Instant;

use tokio::time::{Sleep, sleep_until};

#[derive(Default)]
pub(crate) struct Timer(Option<Pin<Box<Sleep>>>);

impl Timer {
    /// Sets the timer to `deadline` (none: drops it). When it fires, or if
    /// it has passed already, `cx`'s waker is woken.
    pub(crate) fn follow(&mut self, deadline: Option<Instant>, cx: &mut Context<'_>) {
        let Some(at) = deadline else {
            self.0 = None;
            return;
        };
        let at = tokio::time::Instant::from_std(at);
        let sleep = match &mut self.0 {
            Some(sleep) => {
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
                sleep
            }
            none => none.insert(Box::pin(sleep_until(at))),
        };
        if sleep.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
    }
}
