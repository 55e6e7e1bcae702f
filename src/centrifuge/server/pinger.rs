//! Centrifugo's pings: every `ping` interval the server sends each
//! connected client an empty message (`{}`, or a zero-length Protobuf
//! reply), which the client answers with an empty command before the next
//! one or is closed with 3012 (no pong). A connection that has not sent
//! `connect` by its second tick is closed with 3502 (stale). One thread
//! for all of a handler's connections, gone with the handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
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
}

impl Slot {
    pub(super) fn connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    pub(super) fn pong(&self) {
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// Every open connection's slot, by connection id.
#[derive(Default)]
pub(super) struct Pinger {
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
}

impl Pinger {
    /// The pinger, and its thread ticking every `every` for as long as
    /// the pinger lives.
    pub(super) fn start(every: Duration) -> Arc<Pinger> {
        let pinger = Arc::new(Pinger::default());
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
        for slot in slots {
            if !slot.connected.load(Ordering::Relaxed) {
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
