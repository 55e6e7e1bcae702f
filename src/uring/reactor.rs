//! One reactor thread: a ring, a listener, and the connections it accepted.
//!
//! Each loop turn submits everything queued and waits in the same system
//! call, takes every completion that came, and only then advances the
//! connections that had one (or were woken, or hit a deadline). So all the
//! frames one batch of completions produces for a connection leave in one
//! send, and a turn costs one `io_uring_enter`.
//!
//! Other threads reach a connection through its waker (`Conn` sends, close
//! requests, aborts): the slot goes on the reactor's woken list, and if the
//! reactor is waiting in the kernel, a write to its eventfd completes the read
//! it keeps armed there.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::connection::{Connection, Io, Progress};
use super::ring::{self, Completion, Op, Outgoing, Ring};
use super::tasks::{TASK, Tasks};
use super::tls::{ServerConfig, Tls};
use bytes::BytesMut;

use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::Env;
use crate::connection::wake::{ConnWake, Job, SlotWake, WokenList};
use crate::driver::listen::{MAX_BACKOFF, MIN_BACKOFF, concerns_one_connection};
use crate::driver::local;
use crate::driver::mailbox::{Posted, lock};
use crate::driver::shutdown::ShutdownSeen;
use crate::driver::slab::Slab;

#[cfg(feature = "handoff")]
#[path = "handoff.rs"]
pub(crate) mod handoff;

/// The woken-list entry that concerns the reactor itself (shutdown, stop).
const REACTOR: u32 = u32::MAX;

/// What other threads see of a reactor.
pub(crate) struct Shared {
    woken: Mutex<Vec<u32>>,
    /// Jobs from other threads (pub/sub deliveries), run first each turn.
    posted: Posted,
    /// The reactor is running, not waiting in the kernel: wakers need not
    /// write the eventfd, the reactor looks at the woken list before it waits.
    awake: AtomicBool,
    eventfd: File,
    stop: AtomicBool,
    /// Why the reactor ended early, for `serve` to return.
    pub(crate) failure: Mutex<Option<io::Error>>,
    /// What a handoff asks of the reactor, and the connections it brings.
    #[cfg(feature = "handoff")]
    handoff: handoff::Mailbox,
    /// Connections accepted elsewhere, through the server's `Entrance`.
    entering: Mutex<Vec<Entering>>,
}

/// A connection accepted elsewhere on its way to a reactor: its socket,
/// peer, place in the live count, and what was read from it.
pub(crate) type Entering = (std::net::TcpStream, SocketAddr, LiveGuard, BytesMut);

impl Shared {
    pub(crate) fn new() -> io::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            woken: Mutex::new(Vec::new()),
            posted: Posted::default(),
            awake: AtomicBool::new(true),
            eventfd: File::from(ring::eventfd()?),
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            #[cfg(feature = "handoff")]
            handoff: handoff::Mailbox::default(),
            entering: Mutex::new(Vec::new()),
        }))
    }

    /// Gives the reactor a connection accepted elsewhere; it starts at the
    /// reactor's next turn. One given to a reactor that ended is closed.
    pub(crate) fn enter(&self, entering: Entering) {
        lock(&self.entering).push(entering);
        if self.stop.load(Ordering::SeqCst) {
            drop(std::mem::take(&mut *lock(&self.entering)));
        }
        self.push_woken(REACTOR);
    }

    /// Makes the reactor end its loop and drop what it still holds.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.push_woken(REACTOR);
    }
}

impl WokenList for Shared {
    fn push_woken(&self, slot: u32) {
        lock(&self.woken).push(slot);
        if !self.awake.swap(true, Ordering::SeqCst) {
            // Eight bytes to an eventfd do not block (the counter cannot
            // overflow at one write per wait) nor fail.
            let _ = (&self.eventfd).write(&1u64.to_ne_bytes());
        }
    }

    fn post(&self, job: Job, bytes: usize) -> bool {
        if !self.posted.push(job, bytes) {
            return false;
        }
        // The reactor's own entry: it runs a turn, which runs the job.
        self.push_woken(REACTOR);
        true
    }
}

/// What connections use of the reactor, apart from the connection list.
struct Parts {
    ring: Ring,
    #[allow(
        clippy::vec_box,
        reason = "the ring takes them boxed: the kernel keeps pointers into them"
    )]
    spare: Vec<Box<Outgoing>>,
}

impl Parts {
    /// What the connection in `slot` acts through.
    fn io(&mut self, slot: u32) -> Io<'_> {
        Io {
            ring: &mut self.ring,
            slot,
            spare: &mut self.spare,
        }
    }
}

pub(crate) struct Reactor<H: Handler> {
    /// Futures spawned on this thread (async sockets, muxes over them);
    /// dropped first, so what they close reaches live connections.
    tasks: Tasks,
    // Declared before `parts`: connections (and their sockets) go first, then
    // the ring cancels what is still in flight and waits for it.
    slots: Slab<Connection<H>>,
    /// By slot: on the list of connections to advance this turn.
    marked: Vec<bool>,
    parts: Parts,
    listener: Option<TcpListener>,
    /// The multishot accept is armed.
    accepting: bool,
    /// After an accept error such as EMFILE: when to try again.
    accept_paused_until: Option<Instant>,
    backoff: Duration,
    shared: Arc<Shared>,
    env: Env<H>,
    completions: Vec<Completion>,
    /// This turn's receive completions, handled after the others.
    received: Vec<Completion>,
    dirty: Vec<u32>,
    woken: Vec<u32>,
    jobs: Vec<Job>,
    /// The connections' deadlines, soonest first: an entry is added or
    /// removed whenever a connection's deadline changes, so an open idle
    /// connection (which has none) costs nothing here.
    timers: BTreeSet<(Instant, u32)>,
    /// Keepalive pings and idle timeouts, when configured: the sweep and
    /// when the next one is due.
    sweep: Option<(Sweep, Instant)>,
    seen: ShutdownSeen,
    tls: Option<Arc<ServerConfig>>,
    /// A handoff under way: a batch being made, accepting paused.
    #[cfg(feature = "handoff")]
    handing: handoff::Handing,
}

/// The reactor's settings.
pub(crate) struct Setup {
    pub(crate) ring_entries: u32,
    pub(crate) buffers: u16,
    /// wss: every connection's TLS configuration.
    pub(crate) tls: Option<Arc<ServerConfig>>,
}

impl<H: Handler> Reactor<H> {
    /// Sets up the ring; fails if io_uring is not available.
    /// `listener`: `None` in a server that took over, until its
    /// predecessor's come (see `handoff.rs`).
    pub(crate) fn new(
        listener: Option<TcpListener>,
        shared: Arc<Shared>,
        env: Env<H>,
        setup: &Setup,
    ) -> io::Result<Self> {
        let buffer_size = env.hub.config.read_buffer_size;
        let ring = Ring::new(setup.ring_entries, setup.buffers, buffer_size)?;
        let sweep = Sweep::new(&env.hub.config).map(|s| (s, Instant::now() + s.period));
        Ok(Reactor {
            tasks: Tasks::new(shared.clone()),
            slots: Slab::default(),
            marked: Vec::new(),
            parts: Parts {
                ring,
                spare: Vec::new(),
            },
            listener,
            accepting: false,
            accept_paused_until: None,
            backoff: MIN_BACKOFF,
            shared,
            env,
            completions: Vec::new(),
            received: Vec::new(),
            dirty: Vec::new(),
            woken: Vec::new(),
            jobs: Vec::new(),
            timers: BTreeSet::new(),
            sweep,
            seen: ShutdownSeen::default(),
            tls: setup.tls.clone(),
            #[cfg(feature = "handoff")]
            handing: handoff::Handing::default(),
        })
    }

    /// Runs until stopped.
    pub(crate) fn run(mut self) {
        // Tasks spawned on this thread from now on are this reactor's.
        let _offered = local::offer();
        self.parts.ring.watch_wakes(self.shared.eventfd.as_raw_fd());
        let reactor_waker = SlotWake::waker(self.shared.clone(), REACTOR);
        self.env.hub.watch(Waker::from(reactor_waker));
        self.arm_accept();
        while !self.shared.stop.load(Ordering::SeqCst) {
            let wait = self.may_wait();
            let deadline = self.next_deadline();
            if let Err(error) = self.parts.ring.submit(wait, deadline) {
                if matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) {
                    // Short of kernel memory: try again shortly.
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                tracing::error!(%error, "io_uring submit failed; shutting the server down");
                *self
                    .shared
                    .failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(error);
                self.env.hub.begin_shutdown();
                break;
            }
            self.shared.awake.store(true, Ordering::SeqCst);
            let mut completions = std::mem::take(&mut self.completions);
            let mut received = std::mem::take(&mut self.received);
            self.parts.ring.complete(&mut completions);
            // Sends first: the bytes they free count before a receive
            // decides whether its connection pauses reading (queued and
            // in-flight bytes at `max_outbound_bytes`).
            for completion in completions.drain(..) {
                match completion {
                    Completion::Received { .. } => received.push(completion),
                    other => self.on_completion(other),
                }
            }
            for completion in received.drain(..) {
                self.on_completion(completion);
            }
            (self.completions, self.received) = (completions, received);
            // Posted jobs first: the connections they send to are woken,
            // and write in this turn with everything else.
            self.shared.posted.run(&mut self.jobs);
            self.take_woken();
            self.take_entering();
            self.expire_timers();
            self.sweep_if_due();
            self.notice_shutdown();
            self.run_dirty();
            self.run_tasks();
            #[cfg(feature = "handoff")]
            self.handoff_turn();
            self.arm_accept();
            // What this turn counted, added once.
            self.env.hub.meters().flush();
        }
        // The tasks go first, while this thread still takes what their
        // drops spawn (dropped in turn), and before the connections.
        self.tasks.drop_all();
        #[cfg(feature = "handoff")]
        self.shared.handoff.close();
        // Admitted and not started: closed, and out of the live count.
        drop(std::mem::take(&mut *lock(&self.shared.entering)));
    }

    /// Whether the next submit may wait: nothing is left to do this turn.
    /// Clears `awake` first, so a wake from now on writes the eventfd.
    fn may_wait(&self) -> bool {
        self.shared.awake.store(false, Ordering::SeqCst);
        if lock(&self.shared.woken).is_empty() && self.dirty.is_empty() && !self.tasks.is_ready() {
            return true;
        }
        self.shared.awake.store(true, Ordering::SeqCst);
        false
    }

    fn next_deadline(&self) -> Option<Instant> {
        let timer = self.timers.first().map(|&(at, _)| at);
        let sweep = self.sweep.map(|(_, at)| at);
        #[cfg(feature = "handoff")]
        let handing = self.handing.deadline();
        #[cfg(not(feature = "handoff"))]
        let handing = None;
        [timer, self.accept_paused_until, sweep, handing]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs a keepalive sweep over the open connections when one is due.
    /// Pings and closes go through their `Conn`s, which list them on the
    /// woken list for a turn.
    fn sweep_if_due(&mut self) {
        let Some((sweep, due)) = &mut self.sweep else {
            return;
        };
        let now = Instant::now();
        if *due > now {
            return;
        }
        *due = now + sweep.period;
        if self.env.hub.input_frozen() {
            return;
        }
        for connection in self.slots.iter_mut() {
            connection.sweep(sweep);
        }
    }

    fn on_completion(&mut self, completion: Completion) {
        match completion {
            Completion::Accepted { result, more } => self.on_accepted(result, more),
            Completion::Received { slot, result, more } => {
                let buffer = match &result {
                    Ok(ring::Received::Data { buffer, .. }) => Some(*buffer),
                    _ => None,
                };
                self.with_connection(slot, |connection, env, io| {
                    connection.on_received(result, more, env, io);
                });
                // Back to the kernel as soon as the bytes are handled (a
                // partial frame was copied out), even if handling panicked or
                // the connection is gone.
                if let Some(buffer) = buffer {
                    self.parts.ring.recycle(buffer);
                }
            }
            Completion::Sent {
                slot,
                result,
                outgoing,
            } => {
                let mut outgoing = Some(outgoing);
                self.with_connection(slot, |connection, env, io| {
                    if let Some(outgoing) = outgoing.take() {
                        connection.on_sent(result, outgoing, env, io);
                    }
                });
                if let Some(mut orphan) = outgoing {
                    let unsent = orphan.queue.len();
                    orphan.queue.advance(unsent);
                    self.parts.spare.push(orphan);
                }
            }
            Completion::Woken => {
                self.parts.ring.watch_wakes(self.shared.eventfd.as_raw_fd());
            }
        }
    }

    /// Runs `f` on the connection in `slot` (panics caught: they end only that
    /// connection) and puts it on this turn's list.
    fn with_connection(
        &mut self,
        slot: u32,
        f: impl FnOnce(&mut Connection<H>, &Env<H>, &mut Io<'_>),
    ) {
        let Some(connection) = self.slots.get_mut(slot) else {
            return;
        };
        let before = connection.deadline();
        let mut io = self.parts.io(slot);
        let env = &self.env;
        if catch_unwind(AssertUnwindSafe(|| f(connection, env, &mut io))).is_err() {
            tracing::error!("handling a completion panicked; ending the connection");
            if catch_unwind(AssertUnwindSafe(|| connection.end(env, &mut io))).is_err() {
                self.leak(slot);
                return;
            }
        }
        let after = connection.deadline();
        self.refile_timer(slot, before, after);
        self.mark_dirty(slot);
    }

    fn mark_dirty(&mut self, slot: u32) {
        let live = self.slots.get(slot).is_some();
        if live && !std::mem::replace(&mut self.marked[slot as usize], true) {
            self.dirty.push(slot);
        }
    }

    /// Keeps `timers` in step with a connection's deadline.
    fn refile_timer(&mut self, slot: u32, before: Option<Instant>, after: Option<Instant>) {
        if before == after {
            return;
        }
        if let Some(at) = before {
            self.timers.remove(&(at, slot));
        }
        if let Some(at) = after {
            self.timers.insert((at, slot));
        }
    }

    /// Advances every connection something happened to this turn.
    fn run_dirty(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for slot in dirty.drain(..) {
            self.marked[slot as usize] = false;
            let Some(connection) = self.slots.get_mut(slot) else {
                continue;
            };
            let before = connection.deadline();
            let mut io = self.parts.io(slot);
            let env = &self.env;
            let progress = catch_unwind(AssertUnwindSafe(|| connection.advance(env, &mut io)))
                .unwrap_or_else(|_| {
                    tracing::error!("a connection's turn panicked; ending the connection");
                    match catch_unwind(AssertUnwindSafe(|| connection.end(env, &mut io))) {
                        Ok(()) if connection.is_finished() => Progress::Done,
                        Ok(()) => Progress::Pending,
                        Err(_) => Progress::Leak,
                    }
                });
            let after = connection.deadline();
            self.refile_timer(slot, before, after);
            match progress {
                Progress::Done => self.free_slot(slot),
                Progress::Leak => self.leak(slot),
                Progress::Pending => {}
            }
        }
        self.dirty = dirty;
    }

    /// Drops a finished connection (closing its socket) and frees its slot.
    fn free_slot(&mut self, slot: u32) {
        let finished = self.slots.remove(slot);
        if let Some(connection) = &finished {
            self.refile_timer(slot, connection.deadline(), None);
        }
        if catch_unwind(AssertUnwindSafe(move || drop(finished))).is_err() {
            tracing::error!("dropping a finished connection panicked");
        }
    }

    /// A connection whose state cannot be trusted any more, with operations
    /// possibly in flight: its slot is never reused, so no late completion
    /// reaches another connection.
    fn leak(&mut self, slot: u32) {
        if let Some(connection) = self.slots.retire(slot) {
            self.refile_timer(slot, connection.deadline(), None);
            std::mem::forget(connection);
        }
        // Its completions find no connection: their buffers and queues go
        // back all the same, and these end its operations.
        self.parts.ring.cancel(Op::Recv(slot));
        self.parts.ring.cancel(Op::Send(slot));
        tracing::error!(slot, "a connection was leaked after repeated panics");
    }

    fn take_woken(&mut self) {
        std::mem::swap(&mut *lock(&self.shared.woken), &mut self.woken);
        let mut woken = std::mem::take(&mut self.woken);
        for slot in woken.drain(..) {
            if slot != REACTOR && slot & TASK != 0 {
                self.tasks.woken(slot & !TASK);
                continue;
            }
            if let Some(connection) = self.slots.get(slot) {
                if let Some(conn) = connection.conn() {
                    // Cleared before the turn, so a wake during it lists it again.
                    conn.shared().wake().taken();
                }
                self.mark_dirty(slot);
            }
        }
        self.woken = woken;
    }

    /// Polls the tasks the round's connections woke (a message for a
    /// socket, room in its queue), then gives the connections those tasks
    /// woke (a send) their turn, so a reply leaves in the round its
    /// request came in.
    fn run_tasks(&mut self) {
        if self.tasks.is_none() {
            return;
        }
        self.take_woken();
        if !self.tasks.is_ready() {
            return;
        }
        self.tasks.run();
        self.take_woken();
        self.run_dirty();
    }

    fn expire_timers(&mut self) {
        let now = Instant::now();
        while let Some(&(at, slot)) = self.timers.first() {
            if at > now {
                break;
            }
            // The connection sees its deadline passed and acts; if it sets a
            // new one, its turn files it.
            self.timers.pop_first();
            self.mark_dirty(slot);
        }
    }

    /// On shutdown: stops accepting, asks every open connection to close with
    /// 1001, and gives every connection a turn (the handshakes in progress
    /// answer 503); after the shutdown timeout, drops every open connection.
    fn notice_shutdown(&mut self) {
        let slots = &self.slots;
        let acted = self.seen.act(&self.env.hub, |act| {
            slots.iter().filter_map(Connection::conn).for_each(act)
        });
        if !acted {
            return;
        }
        if self.listener.take().is_some() {
            self.accept_paused_until = None;
            if self.accepting {
                self.parts.ring.cancel(Op::Accept);
            }
        }
        for slot in 0..self.slots.end() {
            self.mark_dirty(slot);
        }
    }

    fn arm_accept(&mut self) {
        if self.accepting || self.seen.shutdown() {
            return;
        }
        #[cfg(feature = "handoff")]
        if self.handing.paused {
            return;
        }
        let Some(listener) = &self.listener else {
            return;
        };
        if let Some(until) = self.accept_paused_until {
            if Instant::now() < until {
                return;
            }
            self.accept_paused_until = None;
        }
        self.parts.ring.accept(listener.as_raw_fd());
        self.accepting = true;
    }

    fn on_accepted(&mut self, result: io::Result<std::os::fd::OwnedFd>, more: bool) {
        if !more {
            self.accepting = false;
        }
        match result {
            Ok(fd) => {
                self.backoff = MIN_BACKOFF;
                self.start(std::net::TcpStream::from(fd));
            }
            Err(error) if error.raw_os_error() == Some(libc::ECANCELED) => {}
            Err(error) if concerns_one_connection(&error) => {
                tracing::debug!(%error, "accept failed for one connection");
            }
            Err(error) => {
                let backoff = self.backoff;
                tracing::warn!(%error, ?backoff, "accept failed; pausing before the next try");
                self.accept_paused_until = Some(Instant::now() + backoff);
                self.backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Starts the connections accepted elsewhere (through the `Entrance`):
    /// each armed to receive, then what was read from it handled as if
    /// just received (panics caught, as for a completion).
    fn take_entering(&mut self) {
        let entering = std::mem::take(&mut *lock(&self.shared.entering));
        for (stream, peer, live, read) in entering {
            let slot = self.slots.next_slot();
            if self.marked.len() <= slot as usize {
                self.marked.resize(slot as usize + 1, false);
            }
            let wake = ConnWake::Slot(SlotWake::new(self.shared.clone(), slot));
            let mut io = self.parts.io(slot);
            let connection = Connection::admit(stream, peer, live, wake, &self.env, &mut io);
            self.refile_timer(slot, None, connection.deadline());
            self.slots.insert(connection);
            // Handled, and what it asked for written, this turn.
            self.with_connection(slot, |connection, env, _| {
                connection.receive_read(read, env)
            });
        }
    }

    /// Starts serving an accepted connection.
    fn start(&mut self, stream: std::net::TcpStream) {
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(error) => {
                tracing::debug!(%error, "accepted connection already gone");
                return;
            }
        };
        crate::driver::tcp::prepare(&stream, &self.env.hub.config, peer);
        let live = self.env.hub.enter();
        let slot = self.slots.next_slot();
        if self.marked.len() <= slot as usize {
            self.marked.resize(slot as usize + 1, false);
        }
        // Sends from other threads, close requests and aborts list this
        // slot on the reactor's woken list.
        let wake = ConnWake::Slot(SlotWake::new(self.shared.clone(), slot));
        let tls = match self.tls.as_ref().map(Tls::new).transpose() {
            Ok(tls) => tls,
            Err(error) => {
                tracing::error!(%peer, %error, "cannot start a TLS session");
                return;
            }
        };
        let mut io = self.parts.io(slot);
        let connection = Connection::accept(stream, peer, tls, live, wake, &self.env, &mut io);
        self.refile_timer(slot, None, connection.deadline());
        // Accepted just before the listener closed (answered 503 now), or
        // refused already (a PROXY protocol source not listed: closed now).
        let now = self.seen.shutdown() || connection.is_refused();
        self.slots.insert(connection);
        if now {
            self.mark_dirty(slot);
        }
    }
}
