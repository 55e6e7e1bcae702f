//! [`Mux`]'s receive path: the peer's frames taken from the input, each
//! handled by its command (SYN, FIN, PSH, UPD, NOP).

use std::time::Instant;

use bytes::{Buf, BytesMut};

use super::frame::{Command, HEADER_LEN, Header, UPD_LEN};
use super::multiplexer::{Control, Mux, give_turn, sendable, tell_readable};
use super::{Event, FrameError, INITIAL_WINDOW, MuxError, Side, Version};

impl Mux {
    /// Takes every whole frame from `input` (a partial one stays) while
    /// the budget allows, at `now`. An error ends the session: every
    /// stream becomes readable (to see the end), nothing more is sent.
    pub fn handle_input(&mut self, input: &mut BytesMut, now: Instant) -> Result<(), MuxError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if self.account.is_shed() {
            return Err(self.shed());
        }
        // New bytes since the last call (not a partial frame seen again)
        // show the peer alive.
        if input.len() != self.unread {
            self.last_received = now;
        }
        let result = self.take_frames(input);
        self.unread = input.len();
        result
    }

    fn take_frames(&mut self, input: &mut BytesMut) -> Result<(), MuxError> {
        loop {
            if !self.wants_input() {
                return Ok(());
            }
            let Some(header) = Header::decode(input) else {
                return Ok(());
            };
            let version = match self.version {
                Some(version) => version,
                None => match Version::from_byte(header.version) {
                    Some(version) => {
                        self.version = Some(version);
                        version
                    }
                    None => {
                        return Err(self.fail(MuxError::Frame(FrameError::Version {
                            got: header.version,
                            want: Version::V1.byte(),
                        })));
                    }
                },
            };
            let command = match header.check(version.byte(), self.config.max_receive_frame) {
                Ok(command) => command,
                Err(error) => return Err(self.fail(error.into())),
            };
            let length = usize::from(header.length);
            if input.len() < HEADER_LEN + length {
                return Ok(());
            }
            input.advance(HEADER_LEN);
            let result = match command {
                Command::Syn => {
                    self.on_syn(header.stream);
                    Ok(())
                }
                Command::Fin => {
                    self.on_fin(header.stream);
                    Ok(())
                }
                Command::Psh => self.on_data(header.stream, &input[..length]),
                Command::Nop => Ok(()),
                Command::Upd => {
                    let consumed = u32::from_le_bytes(input[..4].try_into().expect("8 bytes"));
                    let window = u32::from_le_bytes(input[4..UPD_LEN].try_into().expect("8 bytes"));
                    self.on_update(header.stream, consumed, window)
                }
            };
            input.advance(length);
            if let Err(error) = result {
                return Err(self.fail(error));
            }
        }
    }

    fn on_syn(&mut self, id: u32) {
        if self.streams.contains_key(&id) {
            // smux ignores a SYN for a stream it has.
            return;
        }
        if id == 0 {
            // Stream 0 is NOP's: never a stream, and not answered either.
            self.stats.refused += 1;
            return;
        }
        // The peer opens streams with its own ids: odd from the dialer, even
        // from the acceptor. One of ours would collide with a stream we
        // open (xtaci/smux does not check; we refuse it).
        let ours = (id % 2 == 1) == (self.side == Side::Dialer);
        let budget_full = self.account.crowding();
        if ours
            || budget_full
            || self.ending
            || self.refusing
            || self.streams.len() >= self.config.max_streams
        {
            self.stats.refused += 1;
            if ours {
                self.stats.wrong_parity += 1;
            } else if budget_full {
                self.stats.budget_refused += 1;
                self.account.refused();
            }
            self.refusals += 1;
            self.control.push_back(Control::Refuse(id));
            return;
        }
        self.streams.insert(id, self.new_stream());
        self.stats.incoming += 1;
        self.incoming.push_back(id);
        self.events.push_back(Event::Incoming);
    }

    fn on_fin(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.fin_received {
            return;
        }
        stream.fin_received = true;
        if !stream.released {
            tell_readable(&mut self.events, id, stream);
        }
    }

    fn on_data(&mut self, id: u32, payload: &[u8]) -> Result<(), MuxError> {
        let v2 = self.version == Some(Version::V2);
        let window = self.config.stream_window.max(INITIAL_WINDOW);
        let Some(stream) = self
            .streams
            .get_mut(&id)
            .filter(|stream| !stream.released && !stream.fin_received)
        else {
            self.stats.discarded_frames += 1;
            self.stats.discarded_bytes += payload.len() as u64;
            return Ok(());
        };
        let length = payload.len() as u32;
        if v2 {
            let unacknowledged = stream
                .received
                .wrapping_add(length)
                .wrapping_sub(stream.announced);
            if unacknowledged > window {
                return Err(MuxError::Window {
                    stream: id,
                    unacknowledged,
                });
            }
            stream.received = stream.received.wrapping_add(length);
        }
        if payload.is_empty() {
            return Ok(());
        }
        stream.recv.copy(payload);
        self.buffered += payload.len();
        tell_readable(&mut self.events, id, stream);
        self.hold(payload.len())
    }

    fn on_update(&mut self, id: u32, consumed: u32, window: u32) -> Result<(), MuxError> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if (stream.written.wrapping_sub(consumed) as i32) < 0 {
            // More consumed than was ever sent (smux's ErrConsumed).
            return Err(MuxError::Update { stream: id });
        }
        if consumed != stream.peer_consumed {
            // The peer read some of what we sent: progress.
            self.progressed = true;
        }
        stream.peer_consumed = consumed;
        stream.peer_window = window;
        if sendable(stream, true, self.config.max_frame_size) {
            give_turn(&mut self.schedule, id, stream);
        }
        Ok(())
    }
}
