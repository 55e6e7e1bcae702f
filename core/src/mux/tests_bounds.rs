//! What bounds a peer across sessions and over time: the budget sessions
//! share (the one holding the most shed past it), the ids a peer may open,
//! and the keepalive's test of a peer that sends but never takes what we
//! send.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::frame::Command;
use super::tests::{config, drain_all, feed, frame, frames, read_all};
use super::*;

/// Frames sending `bytes` on `stream` in 32 KiB pieces.
fn data(version: u8, stream: u32, bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(32 * 1024);
        out.extend(frame(version, Command::Psh, stream, &vec![7; n]));
        left -= n;
    }
    out
}

/// Version 2 sessions of `budget`.
fn budgeted(budget: &Budget) -> Config {
    Config {
        budget: budget.clone(),
        ..config(Version::V2)
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_syn_with_our_own_parity_is_refused() {
    // The acceptor's ids are even: a dialer opening 2 or 4 would collide
    // with the acceptor's own streams.
    let mut acceptor = Mux::new(Side::Acceptor, config(Version::V1), Instant::now());
    let mut syns = frame(1, Command::Syn, 2, b"");
    syns.extend(frame(1, Command::Syn, 3, b""));
    syns.extend(frame(1, Command::Syn, 4, b""));
    syns.extend(frame(1, Command::Psh, 2, b"not taken"));
    feed(&mut acceptor, &syns).unwrap();
    assert_eq!((acceptor.accept(), acceptor.accept()), (Some(3), None));
    let stats = acceptor.stats();
    assert_eq!((stats.refused, stats.wrong_parity), (2, 2));
    assert_eq!((stats.discarded_frames, stats.discarded_bytes), (1, 9));
    let answers = frames(&drain_all(&mut acceptor));
    assert_eq!(
        answers,
        [(Command::Fin, 2, vec![]), (Command::Fin, 4, vec![])]
    );
    // Its own ids are its own.
    assert_eq!(acceptor.open(), Ok(2));
    // The dialer's are odd: an acceptor's even SYN is taken, an odd one
    // refused.
    let mut dialer = Mux::new(Side::Dialer, config(Version::V1), Instant::now());
    let mut syns = frame(1, Command::Syn, 2, b"");
    syns.extend(frame(1, Command::Syn, 5, b""));
    feed(&mut dialer, &syns).unwrap();
    assert_eq!((dialer.accept(), dialer.accept()), (Some(2), None));
    assert_eq!(dialer.stats().wrong_parity, 1);
    assert_eq!(frames(&drain_all(&mut dialer)), [(Command::Fin, 5, vec![])]);
}

#[test]
fn past_its_budget_the_session_holding_the_most_is_shed() {
    let budget = Budget::new(1 << 20);
    let now = Instant::now();
    let mut big = Mux::new(Side::Acceptor, budgeted(&budget), now);
    let mut small = Mux::new(Side::Acceptor, budgeted(&budget), now);
    let woken = Arc::new(Flag(AtomicBool::new(false)));
    big.set_waker(&Waker::from(woken.clone()));
    // A peer opens four streams on `big` and sends 200 KiB on each;
    // nobody reads them.
    let mut flood = Vec::new();
    for id in [3, 5, 7, 9] {
        flood.extend(frame(2, Command::Syn, id, b""));
        flood.extend(data(2, id, 200 << 10));
    }
    feed(&mut big, &flood).unwrap();
    assert_eq!(big.held(), 800 << 10);
    assert!(!budget.nearly_full());
    // Another session takes 100 KiB: past seven eighths, nearly full.
    let mut some = frame(2, Command::Syn, 3, b"");
    some.extend(data(2, 3, 100 << 10));
    feed(&mut small, &some).unwrap();
    assert!(budget.nearly_full());
    // The session holding more than its share (a third of the limit, with
    // two sessions) takes no new stream either way; the other still does.
    feed(&mut big, &frame(2, Command::Syn, 11, b"")).unwrap();
    assert_eq!(big.stats().budget_refused, 1);
    assert_eq!(big.open(), Err(OpenError::Budget));
    assert_eq!(budget.refused(), 2);
    feed(&mut small, &frame(2, Command::Syn, 5, b"")).unwrap();
    assert_eq!(small.accept(), Some(3));
    assert_eq!(small.accept(), Some(5));
    assert_eq!(small.stats().budget_refused, 0);
    // The small one takes its window's worth: past the limit. The big one
    // is shed, not the one that came last.
    feed(&mut small, &data(2, 3, 156 << 10)).unwrap();
    assert!(woken.0.load(Ordering::Relaxed), "the shed session is woken");
    assert!(!small.is_failed());
    assert!(big.poll_timeout().is_some_and(|due| due <= Instant::now()));
    let error = big.handle_timeout(Instant::now()).unwrap_err();
    assert_eq!(
        error,
        MuxError::Budget {
            held: 800 << 10,
            limit: 1 << 20
        }
    );
    assert!(error.to_string().contains("held the most"), "{error}");
    // It let go of everything; its streams fail saying why, and it sends
    // nothing more.
    assert_eq!(big.held(), 0);
    assert_eq!(budget.used(), 256 << 10);
    assert_eq!(big.read(3, &mut [0; 10]), Err(StreamError::Ended));
    assert!(!big.has_output() && !big.wants_input());
    assert_eq!(budget.shed(), 1);
    // The other one reads all it was sent, and gives it back.
    assert_eq!(read_all(&mut small, 3).0.len(), 256 << 10);
    assert_eq!((small.held(), budget.used()), (0, 0));
    // And takes streams again.
    feed(&mut small, &frame(2, Command::Syn, 7, b"")).unwrap();
    assert_eq!(small.accept(), Some(7));
}

#[test]
fn what_is_written_and_unsent_counts_and_a_writer_may_be_the_one_shed() {
    let budget = Budget::new(100 << 10);
    let mut mux = Mux::new(Side::Dialer, budgeted(&budget), Instant::now());
    let id = mux.open().unwrap();
    let mut written = 0;
    while written < 64 << 10 {
        written += mux.write(id, &[1; 4096]).unwrap();
    }
    assert_eq!(mux.held(), 64 << 10);
    // Sent: no longer held.
    let mut out = BytesMut::new();
    mux.poll_transmit(&mut out, 40 << 10);
    assert_eq!(mux.held(), (64 << 10) - (out.len() - 2 * 8 - 8));
    // The only holder, past the limit: shed.
    let mut result = Ok(0);
    for _ in 0..64 {
        result = mux.write(id, &[1; 4096]);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(StreamError::Ended));
    assert!(matches!(mux.error(), Some(MuxError::Budget { .. })));
    assert_eq!((mux.held(), budget.used()), (0, 0));
}

/// A version 2 dialer with a stream whose data fills the peer's window
/// and more waits behind it.
fn waiting_on_the_window(start: Instant) -> (Mux, u32) {
    let mut mux = Mux::new(Side::Dialer, config(Version::V2), start);
    let id = mux.open().unwrap();
    let mut sent = 0;
    while sent < INITIAL_WINDOW as usize + 1000 {
        sent += mux.write(id, &[5; 4096]).unwrap();
        drain_all(&mut mux);
    }
    assert!(mux.unsent() == 1 && !mux.has_output());
    (mux, id)
}

/// Runs `mux` from `start` for `secs` seconds in 5 s steps, the peer
/// sending `each` at every step, and the keepalive called when due; the
/// error and when it came, if the session ended.
fn every_five_seconds(
    mux: &mut Mux,
    start: Instant,
    secs: u64,
    mut each: impl FnMut(&mut Mux, u64) -> Vec<u8>,
) -> Option<(MuxError, u64)> {
    for t in (5..=secs).step_by(5) {
        let now = start + Duration::from_secs(t);
        let bytes = each(mux, t);
        let mut input = BytesMut::from(&bytes[..]);
        if let Err(error) = mux.handle_input(&mut input, now) {
            return Some((error, t));
        }
        while mux.poll_timeout().is_some_and(|due| due <= now) {
            if let Err(error) = mux.handle_timeout(now) {
                return Some((error, t));
            }
        }
        drain_all(mux);
    }
    None
}

#[test]
fn a_peer_that_sends_nops_but_never_opens_its_window_is_ended() {
    let start = Instant::now();
    let (mut mux, _) = waiting_on_the_window(start);
    // A NOP every 5 s (and data on a stream of its own: not progress
    // either), never a window update.
    let peer = frame(2, Command::Syn, 2, b"");
    feed(&mut mux, &peer).unwrap();
    let ended = every_five_seconds(&mut mux, start, 120, |_, t| {
        let mut bytes = frame(2, Command::Nop, 0, b"");
        if t % 10 == 0 {
            bytes.extend(frame(2, Command::Psh, 2, b"chatter"));
        }
        bytes
    });
    let (error, at) = ended.expect("the session ends");
    assert_eq!(error, MuxError::NoProgress);
    assert!((30..=45).contains(&at), "ended after {at} s");
    assert!(error.to_string().contains("does not read"));
}

#[test]
fn a_peer_that_reads_slowly_is_kept() {
    let start = Instant::now();
    let (mut mux, id) = waiting_on_the_window(start);
    // It reads a little every 5 s: its window updates move.
    let mut consumed = 0u32;
    let ended = every_five_seconds(&mut mux, start, 120, |mux, _| {
        consumed += 1024;
        let mut upd = consumed.to_le_bytes().to_vec();
        upd.extend(INITIAL_WINDOW.to_le_bytes());
        // What it now lets us send goes out; more is written behind it.
        let _ = mux.write(id, &[5; 1024]);
        frame(2, Command::Upd, id, &upd)
    });
    assert_eq!(ended, None);
}

#[test]
fn a_transport_that_takes_nothing_while_nops_arrive_ends_the_session() {
    // Version 1: no windows; the driver says its frames wait.
    let start = Instant::now();
    let mut mux = Mux::new(Side::Dialer, config(Version::V1), start);
    let ended = every_five_seconds(&mut mux, start, 120, |mux, _| {
        mux.handle_transport_write(false, true);
        frame(1, Command::Nop, 0, b"")
    });
    let (error, at) = ended.expect("the session ends");
    assert_eq!(error, MuxError::NoProgress);
    assert!((30..=45).contains(&at), "ended after {at} s");
    // One that takes a little each time, or that has nothing of ours to
    // take, keeps it.
    for wrote in [true, false] {
        let mut mux = Mux::new(Side::Dialer, config(Version::V1), start);
        let ended = every_five_seconds(&mut mux, start, 120, |mux, _| {
            mux.handle_transport_write(wrote, wrote);
            frame(1, Command::Nop, 0, b"")
        });
        assert_eq!(ended, None, "wrote: {wrote}");
    }
}
