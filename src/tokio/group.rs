//! A group of connections served by one tokio task.
//!
//! Why not one task per connection: an idle connection would then cost a tokio
//! task (640 B with our future) plus tokio's per-socket `ScheduledIo` (256 B,
//! 128-byte aligned), about 1 KiB before any WebSocket state (BENCHMARKS.md,
//! scenario 4). A group owns an epoll instance (`mio::Poll`) that tokio
//! watches as a single file descriptor; the group's sockets are registered
//! there, not with tokio. When tokio reports that epoll readable, the task asks
//! it which sockets are ready and advances those connections' state machines
//! (`connection.rs`). A connection costs its boxed state and a small waker.
//!
//! Each connection has its own waker ([`SlotWake`]): it puts the connection's
//! slot on the group's woken list and wakes the task. `Conn` sends from other
//! tasks, close requests, aborts and the connection's timers all use it.
//!
//! At shutdown the group asks its open connections to close; if the shutdown
//! times out, it aborts them (`Hub::watch` wakes it for both).

use bytes::BytesMut;
use std::io;
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use mio::{Events, Interest, Token};
use tokio::io::unix::AsyncFd;
use tokio::time::{Instant, Sleep, sleep};

use super::connection::{Connection, Progress};
use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::Env;
use crate::connection::upgrade::Upgraded;
use crate::connection::wake::{ConnWake, Job, SlotWake, WokenList};
use crate::driver::mailbox::{Posted, lock};
use crate::driver::shutdown::ShutdownSeen;
use crate::driver::slab::Slab;
#[cfg(all(target_os = "linux", feature = "handoff"))]
use crate::handoff::protocol::{Departure, batch_is_full};
#[cfg(all(target_os = "linux", feature = "handoff"))]
use crate::handoff::{Leaving, Phase};

/// Socket events taken from the group's epoll at a time.
const EVENTS_PER_POLL: usize = 256;

/// Rounds (new connections, wake-ups, socket events) one poll of the group's
/// task may run before it yields to the runtime's other tasks.
const ROUNDS_PER_POLL: usize = 8;

/// Woken connections advanced between two looks at the epoll within a
/// round ([`Group::look_between`]).
const LOOK_EVERY: usize = 1024;

/// The part of a group other tasks see: the accept loop (or a client) hands
/// connections over here, and wakers put slots on the woken list. `S` is
/// the handler's connection state.
pub(crate) struct GroupShared<S> {
    waker: AtomicWaker,
    woken: Mutex<Vec<u32>>,
    /// Jobs from other threads (pub/sub deliveries), run first each round.
    posted: Posted,
    incoming: Mutex<Vec<Incoming<S>>>,
    /// Cleared when the server stops accepting: the task ends once it is empty.
    accepting: AtomicBool,
    /// Connections handed over and not yet finished, to balance the groups.
    connections: AtomicUsize,
    /// The group's task is gone: it ended, or its runtime shut down with
    /// it. A connection handed over from then on is dropped at once (its
    /// connect fails instead of waiting forever).
    gone: AtomicBool,
    /// A handoff asks for the next batch of connections that can move
    /// (see [`GroupShared::hand_off`]).
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    departures: Mutex<Option<(u32, Phase, Leaving)>>,
}

/// A connection on its way to a group.
pub(crate) struct Incoming<S> {
    pub(crate) stream: mio::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) live: LiveGuard,
    pub(crate) start: Start<S>,
}

/// Where an incoming connection starts. Boxed: the handler's state need
/// not be `Unpin`, and most incoming connections are accepted.
pub(crate) enum Start<S> {
    /// Accepted: its request comes next, after a PROXY protocol header if
    /// `proxy_header` (false once the header was read before TLS was
    /// ruled out).
    Accepted { proxy_header: bool },
    /// Accepted elsewhere (through an [`Entrance`](super::Entrance)), with
    /// the start of its request already read.
    Routed(BytesMut),
    /// Opened elsewhere: a client's, whose `101` was read, or one upgraded
    /// through hyper.
    #[cfg_attr(not(any(feature = "client", feature = "hyper")), allow(dead_code))]
    Opened(Box<Upgraded<S>>),
    /// Handed over by the previous process (the handoff).
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    Moved(Box<crate::connection::record::Arriving>),
}

/// The handoff's connections on their way to a group.
#[cfg(all(target_os = "linux", feature = "handoff"))]
impl<S> Incoming<S> {
    /// A connection handed over (from the predecessor, or back after a
    /// failed handoff), counted live from now.
    pub(crate) fn moved(
        fd: std::os::fd::OwnedFd,
        arriving: crate::connection::record::Arriving,
        hub: &Arc<crate::connection::hub::Hub>,
    ) -> Self {
        // It may come from io_uring, whose sockets block; and from a
        // process with other settings: this one's apply.
        crate::handoff::set_nonblocking(std::os::fd::AsFd::as_fd(&fd));
        crate::driver::tcp::prepare(&fd, &hub.config, arriving.peer);
        Incoming {
            stream: mio::net::TcpStream::from(fd),
            peer: arriving.peer,
            live: hub.enter(),
            start: Start::Moved(Box::new(arriving)),
        }
    }

    /// Connections that left and were not taken (the handoff failed), on
    /// their way back: their own records read again.
    pub(crate) fn taken_back(
        departures: Vec<Departure>,
        hub: &Arc<crate::connection::hub::Hub>,
    ) -> impl Iterator<Item = Self> {
        crate::handoff::read_back(departures, hub)
            .map(|(fd, arriving)| Incoming::moved(fd, arriving, hub))
    }
}

impl<S> GroupShared<S> {
    /// Gives the group a connection upgraded through hyper and taken back
    /// as a TCP socket: opened, as a client's is, the bytes hyper read past
    /// the request its first input; set up as an accepted socket is
    /// (`driver::tcp::prepare`).
    #[cfg(feature = "hyper")]
    pub(crate) fn hand_over_upgraded(
        &self,
        socket: std::net::TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        upgraded: Upgraded<S>,
        config: &crate::connection::config::Config,
    ) {
        crate::driver::tcp::prepare(&socket, config, peer);
        self.hand_over(Incoming {
            stream: mio::net::TcpStream::from_std(socket),
            peer,
            live,
            start: Start::Opened(Box::new(upgraded)),
        });
    }

    /// Gives the group a new connection.
    pub(crate) fn hand_over(&self, incoming: Incoming<S>) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        lock(&self.incoming).push(incoming);
        if self.is_gone() {
            // Nobody will take it: dropped, its opener learns at once.
            drop(std::mem::take(&mut *lock(&self.incoming)));
        }
        self.waker.wake();
    }

    /// Whether the group's task is gone (ended, or dropped with its
    /// runtime).
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Connections the group serves or is about to.
    pub(crate) fn load(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Asks the group for the next batch of connections that can move to
    /// the next process, from slot `from` on: at the start of its next
    /// step, between two turns of each, it sends a batch through `reply`
    /// (their sockets out of its epoll) with the slot to go on from
    /// (`None`: it has looked at every slot), and goes on serving the rest.
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    pub(crate) fn hand_off(&self, from: u32, phase: Phase, reply: Leaving) {
        *self.departures.lock().unwrap_or_else(|p| p.into_inner()) = Some((from, phase, reply));
        self.waker.wake();
    }

    /// No more connections will come: the group's task ends with its last one.
    pub(crate) fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::SeqCst);
        self.waker.wake();
    }
}

impl<S: Send + 'static> WokenList for GroupShared<S> {
    fn push_woken(&self, slot: u32) {
        lock(&self.woken).push(slot);
        self.waker.wake();
    }

    fn post(&self, job: Job, bytes: usize) -> bool {
        if !self.posted.push(job, bytes) {
            return false;
        }
        self.waker.wake();
        true
    }
}

/// Wakes the group's task (for a shutdown or an abort).
impl<S: Send + 'static> Wake for GroupShared<S> {
    fn wake(self: Arc<Self>) {
        self.waker.wake();
    }
}

struct Slot<H: Handler> {
    /// Its wake state (the `Waker` of its turns) is the lifecycle's:
    /// [`Connection::slot_wake`].
    connection: Connection<H>,
}

/// The group with the fewest connections (of at least one).
pub(crate) fn least_loaded<S>(groups: &[Arc<GroupShared<S>>]) -> &Arc<GroupShared<S>> {
    groups
        .iter()
        .min_by_key(|group| group.load())
        .expect("at least one group")
}

/// Starts a group's task on the current runtime.
pub(crate) fn spawn<H: Handler>(env: Env<H>) -> io::Result<Arc<GroupShared<H::State>>> {
    let hub = &env.hub;
    let epoll = super::sys::watch_epoll(mio::Poll::new()?)?;
    let shared = Arc::new(GroupShared {
        waker: AtomicWaker::new(),
        woken: Mutex::new(Vec::new()),
        posted: Posted::default(),
        incoming: Mutex::new(Vec::new()),
        accepting: AtomicBool::new(true),
        connections: AtomicUsize::new(0),
        gone: AtomicBool::new(false),
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        departures: Mutex::new(None),
    });
    hub.watch(Waker::from(shared.clone()));
    let group = Group {
        shared: shared.clone(),
        epoll,
        events: Events::with_capacity(EVENTS_PER_POLL),
        ready: Vec::new(),
        woken: Vec::new(),
        jobs: Vec::new(),
        incoming: Vec::new(),
        slots: Slab::default(),
        live: 0,
        sweep: Sweep::new(&hub.config).map(|s| (s, Box::pin(sleep(s.period)))),
        env,
        seen: ShutdownSeen::default(),
    };
    // The group paces itself (`ROUNDS_PER_POLL`, `READS_PER_TURN`); tokio's
    // per-task budget would make its timers and epoll look pending after a
    // few hundred connections' worth of polls in one turn.
    tokio::spawn(tokio::task::unconstrained(group));
    Ok(shared)
}

struct Group<H: Handler> {
    shared: Arc<GroupShared<H::State>>,
    epoll: AsyncFd<mio::Poll>,
    events: Events,
    /// Reusable lists, so a turn allocates nothing.
    ready: Vec<mio::event::Event>,
    woken: Vec<u32>,
    jobs: Vec<Job>,
    incoming: Vec<Incoming<H::State>>,
    slots: Slab<Slot<H>>,
    live: usize,
    env: Env<H>,
    /// Keepalive pings and idle timeouts, when configured: the sweep and
    /// the timer for the next one.
    sweep: Option<(Sweep, Pin<Box<Sleep>>)>,
    seen: ShutdownSeen,
}

/// Starts a connection (`start`) and runs `first` on it (its first bytes),
/// either of which may reach the handler: the connection, or `None` if
/// either panicked (logged as `what`; a connection built is dropped, a
/// panic of its drop caught too).
fn caught<H: Handler>(
    peer: SocketAddr,
    what: &str,
    start: impl FnOnce() -> Connection<H>,
    first: impl FnOnce(&mut Connection<H>),
) -> Option<Connection<H>> {
    let started = catch_unwind(AssertUnwindSafe(start)).ok();
    let connection = started.and_then(|mut connection| {
        if catch_unwind(AssertUnwindSafe(|| first(&mut connection))).is_ok() {
            return Some(connection);
        }
        drop(catch_unwind(AssertUnwindSafe(move || drop(connection))));
        None
    });
    if connection.is_none() {
        tracing::error!(%peer, "{what} panicked; closed");
    }
    connection
}

/// A group's task ends, or is dropped with its runtime: connections handed
/// over too late are dropped rather than left waiting, and nothing keeps
/// the task or the group's shared part for wakes that can serve nobody
/// (the server's hub outlives its groups when they start per runtime).
impl<H: Handler> Drop for Group<H> {
    fn drop(&mut self) {
        self.shared.gone.store(true, Ordering::SeqCst);
        drop(std::mem::take(&mut *lock(&self.shared.incoming)));
        drop(self.shared.waker.take());
        self.env.hub.unwatch(&Waker::from(self.shared.clone()));
    }
}

impl<H: Handler> Future for Group<H> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let group = self.get_mut();
        let poll = group.step(cx);
        // What this poll counted, added once.
        group.env.hub.meters().flush();
        poll
    }
}

impl<H: Handler> Group<H> {
    /// One poll's work (see `poll`).
    fn step(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let group = self;
        group.shared.waker.register(cx.waker());
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        group.hand_off_if_asked();
        // Open connections close with 1001 (handshakes in progress answer
        // 503 when they see the flag), or drop at once after the timeout.
        let slots = &group.slots;
        let acted = group.seen.act(&group.env.hub, |act| {
            slots
                .iter()
                .filter_map(|s| s.connection.conn())
                .for_each(act)
        });
        if acted {
            group.advance_all();
        }
        group.sweep_if_due(cx);
        // One look at the epoll per poll even when tokio has not reported it
        // readable (see `run_ready`).
        let mut look_anyway = true;
        for _ in 0..ROUNDS_PER_POLL {
            // Posted jobs first: the connections they send to are then
            // woken, and write in this round with everything else.
            let busy = group.take_incoming()
                | group.shared.posted.run(&mut group.jobs)
                | group.run_woken()
                | group.run_ready(cx, std::mem::take(&mut look_anyway));
            if !busy {
                let finished = !group.shared.accepting.load(Ordering::SeqCst) && group.live == 0;
                if finished && lock(&group.shared.incoming).is_empty() {
                    // A handoff waiting on this group hears it has nothing.
                    #[cfg(all(target_os = "linux", feature = "handoff"))]
                    drop(group.shared.departures.lock().map(|mut d| d.take()));
                    return Poll::Ready(());
                }
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<H: Handler> Group<H> {
    /// Registers connections the accept loop handed over and starts them.
    fn take_incoming(&mut self) -> bool {
        std::mem::swap(&mut *lock(&self.shared.incoming), &mut self.incoming);
        if self.incoming.is_empty() {
            return false;
        }
        let mut incoming = std::mem::take(&mut self.incoming);
        for Incoming {
            mut stream,
            peer,
            live,
            start,
        } in incoming.drain(..)
        {
            let slot = self.slots.next_slot();
            let interest = Interest::READABLE | Interest::WRITABLE;
            let registry = self.epoll.get_ref().registry();
            if let Err(error) = registry.register(&mut stream, Token(slot as usize), interest) {
                tracing::warn!(%peer, %error, "could not watch a new connection; dropped");
                self.shared.connections.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let wake = ConnWake::Shared(SlotWake::waker(self.shared.clone(), slot));
            let env = &self.env;
            let connection = match start {
                Start::Accepted { proxy_header } => Some(Connection::accept(
                    stream,
                    peer,
                    live,
                    wake,
                    env,
                    proxy_header,
                )),
                // Its first bytes (and an opened one's `on_open`) may reach
                // the handler: a panic there ends this connection only.
                Start::Routed(read) => caught(
                    peer,
                    "handling a routed connection's first bytes",
                    || Connection::accept(stream, peer, live, wake, env, false),
                    |c| c.receive_read(read, env),
                ),
                Start::Opened(upgraded) => {
                    // Frames that came with the `101` (or, through hyper,
                    // with the request), read before it came here.
                    env.hub.meters().received(0, upgraded.prefix.len() as u64);
                    caught(
                        peer,
                        "opening a connection",
                        || Connection::opened(stream, peer, live, wake, *upgraded, env),
                        |c| c.receive_pending(env),
                    )
                }
                #[cfg(all(target_os = "linux", feature = "handoff"))]
                Start::Moved(arriving) => {
                    match Connection::take_over(stream, live, wake, *arriving, env) {
                        Ok(mut connection) => {
                            // What the previous process had read and not handled.
                            connection.receive_pending(env);
                            Some(connection)
                        }
                        Err((stream, goodbye)) => {
                            refuse(stream, &goodbye, registry);
                            None
                        }
                    }
                }
            };
            let Some(connection) = connection else {
                self.shared.connections.fetch_sub(1, Ordering::Relaxed);
                continue;
            };
            self.slots.insert(Slot { connection });
            self.live += 1;
            // Starts the handshake timer.
            self.advance(slot);
        }
        self.incoming = incoming;
        true
    }

    /// Runs a keepalive sweep over the open connections when its timer is
    /// up. Pings and closes go through their `Conn`s, whose wakers list them
    /// for a turn.
    fn sweep_if_due(&mut self, cx: &mut Context<'_>) {
        let Some((sweep, timer)) = &mut self.sweep else {
            return;
        };
        if timer.as_mut().poll(cx).is_pending() {
            return;
        }
        timer.as_mut().reset(Instant::now() + sweep.period);
        // Registers the task's waker for the next sweep.
        let _ = timer.as_mut().poll(cx);
        if self.env.hub.input_frozen() {
            return;
        }
        for entry in self.slots.iter_mut() {
            entry.connection.sweep(sweep);
        }
    }

    /// Gives every connection a turn.
    fn advance_all(&mut self) {
        for slot in 0..self.slots.end() {
            self.advance(slot);
        }
    }

    /// Advances the connections whose wakers were called.
    fn run_woken(&mut self) -> bool {
        std::mem::swap(&mut *lock(&self.shared.woken), &mut self.woken);
        if self.woken.is_empty() {
            return false;
        }
        let mut woken = std::mem::take(&mut self.woken);
        for (done, slot) in woken.drain(..).enumerate() {
            if let Some(wake) = self.slots.get(slot).and_then(|e| e.connection.slot_wake()) {
                // Cleared before the turn, so a wake during it lists it again.
                wake.taken();
            }
            self.advance(slot);
            if done % LOOK_EVERY == LOOK_EVERY - 1 {
                self.look_between();
            }
        }
        self.woken = woken;
        true
    }

    /// Takes what the epoll has ready now and advances it, in the middle of
    /// a long pass over woken connections: a publisher's socket is read
    /// while thousands of subscribers are written to, not only once per
    /// round. Without it a fan-out settles into short rounds in which the
    /// publisher's receive buffer (small, since it was read rarely) holds
    /// about one message per subscriber, so every delivery costs a `writev`
    /// (measured on 1,000 topics x 10: 200k deliveries/s in that state
    /// against 800k in the other).
    fn look_between(&mut self) {
        if matches!(take_events(self.epoll.get_mut(), &mut self.events), Ok(n) if n > 0) {
            self.advance_events();
        }
    }

    /// Takes the ready sockets from the group's epoll and advances them.
    ///
    /// With `look_anyway`, the epoll is asked even if tokio has not reported
    /// it readable. A busy runtime polls its I/O driver only every
    /// `event_interval` task polls (61 by default), and a group woken again
    /// and again by a producer task keeps it busy: measured in scenario 6
    /// (1 MiB pushes every 500 µs), requests then sat unread for up to 160 ms
    /// while pushes went out. A look costs one `epoll_wait` with no timeout;
    /// the group makes it once per poll of its task.
    fn run_ready(&mut self, cx: &mut Context<'_>, look_anyway: bool) -> bool {
        let guard = match self.epoll.poll_read_ready_mut(cx) {
            Poll::Pending if look_anyway => None,
            Poll::Pending => return false,
            Poll::Ready(Ok(guard)) => Some(guard),
            Poll::Ready(Err(error)) => {
                tracing::error!(%error, "waiting on a connection group's epoll failed");
                return false;
            }
        };
        let reported = guard.is_some();
        let polled = match guard {
            Some(mut guard) => {
                let polled = take_events(guard.get_inner_mut(), &mut self.events);
                if matches!(polled, Ok(n) if n < EVENTS_PER_POLL) {
                    // Everything was taken; tokio keeps the readiness if an
                    // event arrived since.
                    guard.clear_ready();
                }
                polled
            }
            None => take_events(self.epoll.get_mut(), &mut self.events),
        };
        match polled {
            // Nothing there, and tokio did not say there would be.
            Ok(0) if !reported => return false,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return true,
            Err(error) => {
                tracing::error!(%error, "polling a connection group's epoll failed");
                return false;
            }
        }
        self.advance_events();
        // Ready (or not asked), so no waker was registered: the next round
        // polls again.
        true
    }

    /// Advances the connections of the events just taken from the epoll.
    fn advance_events(&mut self) {
        self.ready.extend(self.events.iter().cloned());
        let mut ready = std::mem::take(&mut self.ready);
        for event in ready.drain(..) {
            let slot = event.token().0 as u32;
            if let Some(entry) = self.slots.get_mut(slot) {
                entry.connection.on_event(&event);
                self.advance(slot);
            }
        }
        self.ready = ready;
    }

    /// Gives one connection its turn, and drops it if it is over.
    ///
    /// Callbacks' panics are caught by `Dispatch` and fail only their
    /// connection. Anything else that panics in a turn, or in dropping a
    /// connection (the handler's `State` may have a `Drop`), is caught here and
    /// costs only that connection, not the group's others.
    fn advance(&mut self, slot: u32) {
        let Some(entry) = self.slots.get_mut(slot) else {
            return;
        };
        // A connection that is done wants no more turns: nothing is woken.
        let waker = match entry.connection.slot_wake() {
            Some(wake) => Waker::from(wake.clone()),
            None => Waker::noop().clone(),
        };
        let mut cx = Context::from_waker(&waker);
        let env = &self.env;
        let turn = catch_unwind(AssertUnwindSafe(|| entry.connection.advance(&mut cx, env)));
        let done = turn.unwrap_or_else(|_| {
            tracing::error!("a connection's turn panicked; dropping the connection");
            Progress::Done
        });
        if done == Progress::Done {
            let finished = self.slots.remove(slot);
            if catch_unwind(AssertUnwindSafe(move || drop(finished))).is_err() {
                tracing::error!("dropping a finished connection panicked");
            }
            self.live -= 1;
            self.shared.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The handoff: connections out to the next process.
#[cfg(all(target_os = "linux", feature = "handoff"))]
impl<H: Handler> Group<H> {
    /// If a handoff asked (see [`GroupShared::hand_off`]), the next batch
    /// of connections that can move leaves: their records made, their
    /// sockets out of the epoll and out of the group. Connections handed to
    /// the group and not started yet are started first, so they move too.
    fn hand_off_if_asked(&mut self) {
        let departures = &self.shared.departures;
        let Some((from, phase, reply)) =
            departures.lock().unwrap_or_else(|p| p.into_inner()).take()
        else {
            return;
        };
        match phase {
            Phase::Thaw => {
                for entry in self.slots.iter_mut() {
                    entry.connection.thaw(&self.env);
                }
                self.advance_all();
                let _ = reply.give((Vec::new(), None));
                return;
            }
            Phase::Freeze => {
                let _ = reply.give((Vec::new(), None));
                return;
            }
            Phase::Move => {}
        }
        if from == 0 {
            // Slots they take are behind no later batch's start.
            self.take_incoming();
        }
        // Deliveries posted to its connections go in their queues first:
        // they move with them.
        self.shared.posted.run(&mut self.jobs);
        let mut departures = Vec::new();
        let (mut bytes, mut stayed) = (0, 0usize);
        let mut next = None;
        for slot in from..self.slots.end() {
            if batch_is_full(&departures, bytes) {
                next = Some(slot);
                break;
            }
            let Some(entry) = self.slots.get_mut(slot) else {
                continue;
            };
            let moved = match entry.connection.hand_off(&self.env) {
                Ok(moved) => moved,
                Err(reason) => {
                    stayed += 1;
                    tracing::debug!(reason, "a connection stays for the handoff");
                    continue;
                }
            };
            let Some(finished) = self.slots.remove(slot) else {
                continue;
            };
            self.live -= 1;
            self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            let stream = finished.connection.into_stream();
            let registry = self.epoll.get_ref().registry();
            if let Some(departure) = departure(stream, moved, registry) {
                bytes += departure.record.len();
                departures.push(departure);
            }
        }
        if stayed > 0 {
            tracing::info!(
                stayed,
                "connections that cannot move stay, to be closed with 1012"
            );
        }
        if let Err((departures, _)) = reply.give((departures, next)) {
            // The handoff stopped waiting: they stay here after all.
            for incoming in Incoming::taken_back(departures, &self.env.hub) {
                self.shared.hand_over(incoming);
            }
        }
    }
}

/// A connection leaving: out of the group's epoll (its descriptor lives on
/// in the successor, and epoll would go on reporting it here), with its
/// record.
#[cfg(all(target_os = "linux", feature = "handoff"))]
fn departure(
    mut stream: mio::net::TcpStream,
    moved: crate::connection::record::Moved,
    registry: &mio::Registry,
) -> Option<Departure> {
    if let Err(error) = registry.deregister(&mut stream) {
        tracing::warn!(%error, "could not unwatch a connection leaving");
    }
    let stream = std::net::TcpStream::from(std::os::fd::OwnedFd::from(stream));
    crate::handoff::departure(stream, moved)
}

/// A connection handed over whose handler refused it: what it had queued
/// and a close frame go out if the socket takes them now, and it is closed.
#[cfg(all(target_os = "linux", feature = "handoff"))]
fn refuse(mut stream: mio::net::TcpStream, goodbye: &[u8], registry: &mio::Registry) {
    let _ = registry.deregister(&mut stream);
    let _ = std::io::Write::write(&mut stream, goodbye);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Takes what the epoll has ready now, without waiting; returns how many.
fn take_events(epoll: &mut mio::Poll, events: &mut Events) -> io::Result<usize> {
    epoll.poll(events, Some(Duration::ZERO))?;
    Ok(events.iter().count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::handler::Quiet;

    /// A slot is its connection and nothing more: the waker of its turns
    /// comes from the lifecycle's wake state, so an idle connection's
    /// allocation is the connection's size (264 bytes in a release build
    /// with the harness's features: a 272-byte chunk, where the `Arc` it
    /// kept made it 272 bytes, a 288-byte chunk).
    #[test]
    fn a_slot_is_its_connection_alone() {
        assert_eq!(size_of::<Slot<Quiet>>(), size_of::<Connection<Quiet>>());
    }
}
