//! What a mux's handle, its streams and its driver share: the
//! protocol's state and who waits on it, under one lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::task::Waker;

use rapidws_core::mux::{Event, Mux as Protocol};

use super::Error;

/// What the handle, the streams and the driver share.
pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// A mux's state with one handle.
    pub(crate) fn new(protocol: Protocol) -> Shared {
        Shared {
            state: Mutex::new(State {
                protocol,
                readers: HashMap::new(),
                writers: HashMap::new(),
                acceptors: Vec::new(),
                watchers: Vec::new(),
                driver: None,
                ended: None,
                handles: 1,
            }),
        }
    }
}

/// The protocol and who waits on it.
pub(crate) struct State {
    pub(crate) protocol: Protocol,
    /// Tasks waiting to read a stream, and to write one.
    readers: HashMap<u32, Waker>,
    writers: HashMap<u32, Waker>,
    /// Tasks waiting in `accept_stream`.
    acceptors: Vec<Waker>,
    /// Tasks waiting in `closed`.
    watchers: Vec<Waker>,
    /// The driver, when it waits.
    driver: Option<Waker>,
    /// Why the mux ended, once it did (the driver is gone).
    pub(crate) ended: Option<Error>,
    /// `Mux` handles alive; with no handle and no stream left, the mux
    /// ends.
    pub(crate) handles: usize,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held (a bug) leaves the protocol's
        // state as it was between two calls: go on with it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Wakes whoever the protocol's events concern.
    pub(crate) fn dispatch(&mut self) {
        while let Some(event) = self.protocol.poll_event() {
            match event {
                Event::Incoming => self.acceptors.drain(..).for_each(Waker::wake),
                Event::Readable(id) => {
                    if let Some(waker) = self.readers.remove(&id) {
                        waker.wake();
                    }
                }
                Event::Writable(id) => {
                    if let Some(waker) = self.writers.remove(&id) {
                        waker.wake();
                    }
                }
            }
        }
    }

    /// Tells the driver there is something to do (output owed, input
    /// wanted again, or the end).
    pub(crate) fn wake_driver(&mut self) {
        if let Some(waker) = self.driver.take() {
            waker.wake();
        }
    }

    pub(crate) fn park_driver(&mut self, waker: &Waker) {
        match &self.driver {
            Some(parked) if parked.will_wake(waker) => {}
            _ => {
                // The budget wakes it too, should the mux be shed.
                self.protocol.set_waker(waker);
                self.driver = Some(waker.clone());
            }
        }
    }

    pub(crate) fn park_reader(&mut self, id: u32, waker: &Waker) {
        park(&mut self.readers, id, waker);
    }

    pub(crate) fn park_writer(&mut self, id: u32, waker: &Waker) {
        park(&mut self.writers, id, waker);
    }

    pub(crate) fn park_acceptor(&mut self, waker: &Waker) {
        park_in(&mut self.acceptors, waker);
    }

    pub(crate) fn park_watcher(&mut self, waker: &Waker) {
        park_in(&mut self.watchers, waker);
    }

    /// The stream's handle is gone: its wakers too.
    pub(crate) fn forget(&mut self, id: u32) {
        self.readers.remove(&id);
        self.writers.remove(&id);
    }

    /// Whether nothing can use the mux any more.
    pub(crate) fn abandoned(&self) -> bool {
        self.handles == 0 && self.protocol.streams() == 0
    }

    /// The mux ended: everyone waiting learns it.
    pub(crate) fn end(&mut self, why: Error) {
        if self.ended.is_none() {
            self.ended = Some(why);
        }
        self.readers.drain().for_each(|(_, waker)| waker.wake());
        self.writers.drain().for_each(|(_, waker)| waker.wake());
        self.acceptors.drain(..).for_each(Waker::wake);
        self.watchers.drain(..).for_each(Waker::wake);
    }
}

fn park(wakers: &mut HashMap<u32, Waker>, id: u32, waker: &Waker) {
    match wakers.get(&id) {
        Some(parked) if parked.will_wake(waker) => {}
        _ => {
            wakers.insert(id, waker.clone());
        }
    }
}

fn park_in(wakers: &mut Vec<Waker>, waker: &Waker) {
    if !wakers.iter().any(|parked| parked.will_wake(waker)) {
        wakers.push(waker.clone());
    }
}
