//! [`Mux`]'s transmit path: control frames, window updates, then each
//! stream's data in turn, into the driver's output ([`Transmit`]).

use bytes::{Buf, BytesMut};

use super::frame::{Command, Header, UPD_LEN};
use super::multiplexer::{Control, KEEP_CAPACITY, Mux, give_turn, room, sendable};
use super::output::Transmit;
use super::{Event, Version};

impl Mux {
    /// Whether [`poll_transmit`](Mux::poll_transmit) would write anything now.
    pub fn has_output(&self) -> bool {
        self.failed.is_none()
            && self.version.is_some()
            && (!self.control.is_empty() || !self.updates.is_empty() || !self.schedule.is_empty())
    }

    /// Appends frames to `out` until it holds `limit` bytes or nothing is
    /// left to send: control frames first (SYN, refusing FIN, UPD, NOP),
    /// then one data frame per stream in turn, a stream's FIN after its
    /// data. Nothing is sent before the version is known, or after the
    /// session failed. A data frame that takes all of its stream's send
    /// buffer, never partly sent, hands the buffer over: an
    /// [`Output`](super::Output) keeps it so (no copy), a `BytesMut`
    /// copies it.
    pub fn poll_transmit<T: Transmit>(&mut self, out: &mut T, limit: usize) {
        let Some(version) = self.version else {
            return;
        };
        if self.failed.is_some() {
            return;
        }
        let version = version.byte();
        while out.len() < limit {
            let Some(control) = self.control.pop_front() else {
                break;
            };
            let (command, id) = match control {
                Control::Syn(id) => (Command::Syn, id),
                Control::Refuse(id) => {
                    self.refusals -= 1;
                    (Command::Fin, id)
                }
                Control::Nop => (Command::Nop, 0),
            };
            put_header(out, version, command, 0, id);
        }
        while out.len() < limit {
            let Some(id) = self.updates.pop_front() else {
                break;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            stream.update_owed = false;
            if stream.released {
                continue;
            }
            stream.announced = stream.consumed;
            put_header(out, version, Command::Upd, UPD_LEN as u16, id);
            out.put_slice(&stream.consumed.to_le_bytes());
            out.put_slice(&self.config.stream_window.to_le_bytes());
        }
        let v2 = version == Version::V2.byte();
        let max_frame = self.config.max_frame_size;
        while out.len() < limit {
            let Some(id) = self.schedule.pop() else {
                break;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            stream.scheduled = false;
            let n = stream.send.len().min(room(stream, v2, max_frame));
            if n > 0 {
                put_header(out, version, Command::Psh, n as u16, id);
                if n == stream.send.len() && !stream.send_spent && stream.send.capacity() <= 2 * n {
                    // All of a buffer not much larger than what it holds:
                    // handed over, so what the output keeps alive is at
                    // most twice what it holds.
                    out.put_buffer(std::mem::take(&mut stream.send).freeze());
                } else {
                    // Part of one is copied: a slice would keep the whole
                    // buffer (up to the send buffer's size, which the
                    // budget no longer counts once framed) alive until
                    // written. What was taken stays allocated in front of
                    // the rest, so this buffer is never handed over.
                    out.put_slice(&stream.send[..n]);
                    stream.send.advance(n);
                    stream.send_spent = true;
                }
                self.account.release(n);
                stream.written = stream.written.wrapping_add(n as u32);
                if stream.send.is_empty() && stream.send.capacity() > KEEP_CAPACITY {
                    stream.send = BytesMut::new();
                    stream.send_spent = false;
                }
                if stream.write_blocked && stream.send.len() <= self.config.send_buffer / 2 {
                    stream.write_blocked = false;
                    self.events.push_back(Event::Writable(id));
                }
            }
            if stream.send.is_empty() && stream.fin_wanted && !stream.fin_sent {
                put_header(out, version, Command::Fin, 0, id);
                stream.fin_sent = true;
                if stream.released {
                    self.streams.remove(&id);
                    continue;
                }
            }
            if sendable(stream, v2, max_frame) {
                give_turn(&mut self.schedule, id, stream);
            }
        }
    }
}

fn put_header(out: &mut impl Transmit, version: u8, command: Command, length: u16, stream: u32) {
    out.put_slice(
        &Header {
            version,
            command: command.byte(),
            length,
            stream,
        }
        .encode(),
    );
}
