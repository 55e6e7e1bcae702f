//! Centrifugo's pings: every `ping` interval the server sends each
//! connected client an empty message (`{}`, or a zero-length Protobuf
//! reply), which the client answers with an empty command before the next
//! one or is closed with 3012 (no pong). A connection that has not sent
//! `connect` by its second tick is closed with 3502 (stale), one whose
//! token expired and was not refreshed with 3005 (expired). One thread
//! for all of a handler's connections, gone with the handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::centrifuge::{Format, disconnect};
use crate::connection::conn::Conn;
use crate::proto::{CloseCode, Message};

/// One connection's ping state.
pub(super) struct Slot {
    conn: Conn,
    format: Format,
    connected: AtomicBool,
    /// A ping went out and its pong has not come back.
    waiting: AtomicBool,
    /// Ticks seen before `connect`.
    unconnected_ticks: AtomicU8,
    /// When its token expires (Unix seconds; 0: never).
    expires_at: AtomicU64,
}

impl Slot {
    /// Connected (or refreshed) until `expires_at` (Unix seconds; 0:
    /// for good).
    pub(super) fn connected(&self, expires_at: u64) {
        self.expires_at.store(expires_at, Ordering::Relaxed);
        self.connected.store(true, Ordering::Relaxed);
    }

    pub(super) fn pong(&self) {
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// Every open connection's slot, by connection id.
pub(super) struct Pinger {
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// How long past its token's expiry a connection may stay, unrefreshed
    /// (the SDK refreshes when its ttl is up, not before).
    grace: Duration,
}

impl Pinger {
    /// The pinger, and its thread ticking every `every` for as long as
    /// the pinger lives.
    pub(super) fn start(every: Duration, grace: Duration) -> Arc<Pinger> {
        let pinger = Arc::new(Pinger {
            slots: Mutex::default(),
            grace,
        });
        let weak: Weak<Pinger> = Arc::downgrade(&pinger);
        let spawned = std::thread::Builder::new()
            .name("centrifuge-ping".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    match weak.upgrade() {
                        Some(pinger) => pinger.tick(),
                        None => return,
                    }
                }
            });
        if let Err(error) = spawned {
            tracing::error!("centrifuge: no ping thread: {error}");
        }
        pinger
    }

    pub(super) fn add(&self, conn: &Conn, format: Format) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            conn: conn.clone(),
            format,
            connected: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            unconnected_ticks: AtomicU8::new(0),
            expires_at: AtomicU64::new(0),
        });
        self.lock().insert(conn.id(), slot.clone());
        slot
    }

    pub(super) fn remove(&self, conn: &Conn) {
        self.lock().remove(&conn.id());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tick(&self) {
        let slots: Vec<Arc<Slot>> = self.lock().values().cloned().collect();
        let now = super::token::now_secs();
        for slot in slots {
            let expires_at = slot.expires_at.load(Ordering::Relaxed);
            if expires_at != 0 && now >= expires_at.saturating_add(self.grace.as_secs()) {
                let _ = slot
                    .conn
                    .close(CloseCode(disconnect::EXPIRED), "connection expired");
            } else if !slot.connected.load(Ordering::Relaxed) {
                if slot.unconnected_ticks.fetch_add(1, Ordering::Relaxed) >= 1 {
                    let _ = slot.conn.close(CloseCode(disconnect::STALE), "stale");
                }
            } else if slot.waiting.swap(true, Ordering::Relaxed) {
                let _ = slot.conn.close(CloseCode(disconnect::NO_PONG), "no pong");
            } else {
                let _ = match slot.format {
                    Format::Json => slot.conn.send(Message::Text("{}")),
                    Format::Protobuf => slot.conn.send(Message::Binary(&[0])),
                };
            }
        }
    }
}
