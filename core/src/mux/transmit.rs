//! [`Mux`]'s transmit path: control frames, window updates, then each
//! stream's data in turn, into the driver's output ([`Transmit`]).

use super::frame::{Command, Header, UPD_LEN};
use super::multiplexer::{Control, Mux, give_turn, room, sendable};
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
    /// session failed. A data frame's payload goes as slices of the blocks
    /// of its stream's send buffer where the part in a block is at least
    /// 8 KiB long (copied otherwise): an [`Output`](super::Output) keeps
    /// them so (no copy), a `BytesMut` copies them.
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
                stream.send.transmit(n, out);
                self.account.release(n);
                stream.written = stream.written.wrapping_add(n as u32);
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
