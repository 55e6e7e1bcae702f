//! Frame header codec (RFC 6455 §5.2).
//!
//! Only the header lives here: payloads are never copied by this module. Decoding
//! looks at a byte slice and either returns a complete header with its length,
//! says "need more" (`Ok(None)`) without consuming anything, or rejects the frame
//! with the reason that becomes the close frame sent to the peer. Validation that
//! can be done on the first two bytes is done before the rest of the header has
//! arrived, so a bad frame fails as early as possible.

use bytes::BufMut;

use super::close::CloseCode;

/// The longest frame header: 2 bytes, an 8-byte length and a 4-byte mask key.
pub const MAX_HEADER_LEN: usize = 14;

/// The largest payload a control frame (close, ping, pong) may carry.
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// RSV1, the bit permessage-deflate (RFC 7692) uses to mark compressed messages.
pub const RSV1: u8 = 0b100;

/// A frame's opcode. Reserved opcodes never get this far: they fail decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// Continues a fragmented message.
    Continuation = 0x0,
    /// A text message (UTF-8), or its first fragment.
    Text = 0x1,
    /// A binary message, or its first fragment.
    Binary = 0x2,
    /// Begins or answers the close handshake.
    Close = 0x8,
    /// A ping: the peer answers with a pong carrying the same payload.
    Ping = 0x9,
    /// A pong: the answer to a ping, or a unsolicited heartbeat.
    Pong = 0xA,
}

impl OpCode {
    /// The opcode for a 4-bit value, or `None` for the reserved ones (3-7, 11-15).
    pub fn from_bits(bits: u8) -> Option<OpCode> {
        Some(match bits {
            0x0 => OpCode::Continuation,
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xA => OpCode::Pong,
            _ => return None,
        })
    }

    /// Control frames have the high bit of the opcode set.
    pub fn is_control(self) -> bool {
        (self as u8) & 0x8 != 0
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The last frame of its message.
    pub fin: bool,
    /// RSV1..RSV3 as the low three bits (RSV1 = `0b100`).
    pub rsv: u8,
    /// What the frame carries.
    pub opcode: OpCode,
    /// The masking key (client-to-server frames carry one).
    pub mask: Option<[u8; 4]>,
    /// The payload's length in bytes.
    pub payload_len: u64,
}

/// What the decoder insists on, which depends on our role and the extensions.
#[derive(Clone, Copy, Debug)]
pub struct DecodeRules {
    /// A server must reject unmasked frames; a client must reject masked ones.
    pub expect_masked: bool,
    /// RSV bits an extension negotiated on this connection owns (e.g. [`RSV1`]).
    pub allowed_rsv: u8,
}

impl DecodeRules {
    /// Rules for frames a server receives: masked, no extension bits.
    pub const SERVER: DecodeRules = DecodeRules {
        expect_masked: true,
        allowed_rsv: 0,
    };
    /// Rules for frames a client receives: unmasked, no extension bits.
    pub const CLIENT: DecodeRules = DecodeRules {
        expect_masked: false,
        allowed_rsv: 0,
    };
}

/// Why a frame header was rejected. Every variant fails the connection with 1002.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// An opcode RFC 6455 reserves (its value).
    ReservedOpcode(u8),
    /// RSV bits set that no negotiated extension defines.
    ReservedBits,
    /// A client frame without a mask (RFC 6455 §5.1).
    UnmaskedClientFrame,
    /// A server frame with a mask (RFC 6455 §5.1).
    MaskedServerFrame,
    /// A 64-bit length with its most significant bit set.
    LengthTopBitSet,
    /// A control frame with more than 125 bytes of payload.
    ControlTooLong,
    /// A control frame without FIN (control frames are never fragmented).
    ControlFragmented,
}

impl FrameError {
    /// The close code a peer gets for this error.
    pub fn close_code(self) -> CloseCode {
        CloseCode::PROTOCOL_ERROR
    }

    /// A short reason, sent as the close frame's reason text.
    pub fn reason(self) -> &'static str {
        match self {
            FrameError::ReservedOpcode(_) => "reserved opcode",
            FrameError::ReservedBits => "reserved bits set without a negotiated extension",
            FrameError::UnmaskedClientFrame => "client frame is not masked",
            FrameError::MaskedServerFrame => "server frame is masked",
            FrameError::LengthTopBitSet => "64-bit payload length has its top bit set",
            FrameError::ControlTooLong => "control frame payload longer than 125 bytes",
            FrameError::ControlFragmented => "control frame is fragmented",
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for FrameError {}

/// Decodes the frame header at the start of `buf`.
///
/// Returns the header and its length in bytes, `Ok(None)` if `buf` holds only part
/// of a header (nothing is consumed; call again with more bytes), or the reason
/// the frame is invalid.
pub fn decode_header(
    buf: &[u8],
    rules: DecodeRules,
) -> Result<Option<(FrameHeader, usize)>, FrameError> {
    let (b0, b1) = match buf {
        [b0, b1, ..] => (*b0, *b1),
        _ => return Ok(None),
    };
    let fin = b0 & 0x80 != 0;
    let rsv = (b0 >> 4) & 0b111;
    let opcode = OpCode::from_bits(b0 & 0x0F).ok_or(FrameError::ReservedOpcode(b0 & 0x0F))?;
    if rsv & !rules.allowed_rsv != 0 {
        return Err(FrameError::ReservedBits);
    }
    let masked = b1 & 0x80 != 0;
    if masked != rules.expect_masked {
        return Err(if rules.expect_masked {
            FrameError::UnmaskedClientFrame
        } else {
            FrameError::MaskedServerFrame
        });
    }
    let len7 = b1 & 0x7F;
    if opcode.is_control() {
        if !fin {
            return Err(FrameError::ControlFragmented);
        }
        if usize::from(len7) > MAX_CONTROL_PAYLOAD {
            return Err(FrameError::ControlTooLong);
        }
    }
    let len_bytes = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let header_len = 2 + len_bytes + if masked { 4 } else { 0 };
    if buf.len() < header_len {
        // The top bit of a 64-bit length can be judged before the rest arrives.
        if len_bytes == 8 && buf.len() > 2 && buf[2] & 0x80 != 0 {
            return Err(FrameError::LengthTopBitSet);
        }
        return Ok(None);
    }
    let payload_len = match len_bytes {
        0 => u64::from(len7),
        2 => u64::from(u16::from_be_bytes([buf[2], buf[3]])),
        _ => {
            let mut be = [0u8; 8];
            be.copy_from_slice(&buf[2..10]);
            let len = u64::from_be_bytes(be);
            if len >> 63 != 0 {
                return Err(FrameError::LengthTopBitSet);
            }
            len
        }
    };
    let mask = masked.then(|| {
        let at = 2 + len_bytes;
        [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]
    });
    let header = FrameHeader {
        fin,
        rsv,
        opcode,
        mask,
        payload_len,
    };
    Ok(Some((header, header_len)))
}

/// Writes a frame header into `dst` and returns how many bytes it used.
///
/// The shortest length encoding is always chosen, as RFC 6455 §5.2 requires.
pub fn encode_header(
    dst: &mut [u8; MAX_HEADER_LEN],
    fin: bool,
    rsv: u8,
    opcode: OpCode,
    payload_len: u64,
    mask: Option<[u8; 4]>,
) -> usize {
    debug_assert!(rsv <= 0b111);
    dst[0] = (u8::from(fin) << 7) | (rsv << 4) | opcode as u8;
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut at = if payload_len < 126 {
        dst[1] = mask_bit | payload_len as u8;
        2
    } else if payload_len <= u64::from(u16::MAX) {
        dst[1] = mask_bit | 126;
        dst[2..4].copy_from_slice(&(payload_len as u16).to_be_bytes());
        4
    } else {
        dst[1] = mask_bit | 127;
        dst[2..10].copy_from_slice(&payload_len.to_be_bytes());
        10
    };
    if let Some(key) = mask {
        dst[at..at + 4].copy_from_slice(&key);
        at += 4;
    }
    at
}

/// Appends a whole frame (header, then payload) to `out`. With a mask key the
/// payload is masked as it is copied, for the client role.
pub fn write_frame(
    out: &mut impl BufMut,
    fin: bool,
    rsv: u8,
    opcode: OpCode,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) {
    let mut header = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&mut header, fin, rsv, opcode, payload.len() as u64, mask);
    out.put_slice(&header[..n]);
    match mask {
        None => out.put_slice(payload),
        Some(key) => {
            let mut masked = payload.to_vec();
            super::mask::apply_mask(&mut masked, key, 0);
            out.put_slice(&masked);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(buf: &[u8]) -> Result<Option<(FrameHeader, usize)>, FrameError> {
        decode_header(buf, DecodeRules::SERVER)
    }

    fn masked_header(b0: u8, len: u64) -> Vec<u8> {
        let mut h = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut h,
            b0 & 0x80 != 0,
            (b0 >> 4) & 7,
            OpCode::from_bits(b0 & 0xF).unwrap(),
            len,
            Some([1, 2, 3, 4]),
        );
        h[..n].to_vec()
    }

    #[test]
    fn round_trips_every_length_encoding() {
        for &len in &[0u64, 1, 125, 126, 127, 65535, 65536, 1 << 32, (1 << 63) - 1] {
            for mask in [None, Some([9, 8, 7, 6])] {
                let mut h = [0u8; MAX_HEADER_LEN];
                let n = encode_header(&mut h, true, 0, OpCode::Binary, len, mask);
                let rules = DecodeRules {
                    expect_masked: mask.is_some(),
                    allowed_rsv: 0,
                };
                let (hdr, used) = decode_header(&h[..n], rules).unwrap().unwrap();
                assert_eq!(used, n);
                assert_eq!(hdr.payload_len, len);
                assert_eq!(hdr.mask, mask);
                assert!(hdr.fin);
                assert_eq!(hdr.opcode, OpCode::Binary);
            }
        }
    }

    #[test]
    fn shortest_length_encoding_is_used() {
        let mut h = [0u8; MAX_HEADER_LEN];
        assert_eq!(encode_header(&mut h, true, 0, OpCode::Text, 125, None), 2);
        assert_eq!(encode_header(&mut h, true, 0, OpCode::Text, 126, None), 4);
        assert_eq!(encode_header(&mut h, true, 0, OpCode::Text, 65535, None), 4);
        assert_eq!(
            encode_header(&mut h, true, 0, OpCode::Text, 65536, None),
            10
        );
        assert_eq!(
            encode_header(&mut h, true, 0, OpCode::Text, 0, Some([0; 4])),
            6
        );
    }

    #[test]
    fn partial_headers_need_more_and_consume_nothing() {
        for &len in &[5u64, 300, 70_000] {
            let full = masked_header(0x82, len);
            for cut in 0..full.len() {
                assert_eq!(decode(&full[..cut]), Ok(None), "cut at {cut} of len {len}");
            }
            assert!(decode(&full).unwrap().is_some());
        }
    }

    #[test]
    fn rejects_reserved_opcodes() {
        for op in [3u8, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
            assert_eq!(
                decode(&[0x80 | op, 0x80]),
                Err(FrameError::ReservedOpcode(op))
            );
        }
    }

    #[test]
    fn rejects_rsv_bits_unless_allowed() {
        for rsv in 1u8..8 {
            let b0 = 0x80 | (rsv << 4) | 0x2;
            assert_eq!(decode(&[b0, 0x80]), Err(FrameError::ReservedBits));
        }
        let rules = DecodeRules {
            expect_masked: true,
            allowed_rsv: RSV1,
        };
        let hdr = masked_header(0xC2, 3);
        let (h, _) = decode_header(&hdr, rules).unwrap().unwrap();
        assert_eq!(h.rsv, RSV1);
        assert_eq!(
            decode_header(&[0xA2, 0x80], rules),
            Err(FrameError::ReservedBits)
        );
    }

    #[test]
    fn rejects_unmasked_client_frames_and_masked_server_frames() {
        assert_eq!(decode(&[0x81, 0x05]), Err(FrameError::UnmaskedClientFrame));
        assert_eq!(
            decode_header(&[0x81, 0x85], DecodeRules::CLIENT),
            Err(FrameError::MaskedServerFrame)
        );
    }

    #[test]
    fn rejects_64_bit_length_with_top_bit_before_the_header_completes() {
        let mut buf = vec![0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1];
        buf.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(decode(&buf), Err(FrameError::LengthTopBitSet));
        assert_eq!(decode(&buf[..3]), Err(FrameError::LengthTopBitSet));
    }

    #[test]
    fn rejects_long_or_fragmented_control_frames() {
        assert_eq!(decode(&[0x89, 0x80 | 126]), Err(FrameError::ControlTooLong));
        assert_eq!(decode(&[0x88, 0x80 | 127]), Err(FrameError::ControlTooLong));
        assert_eq!(decode(&[0x09, 0x80]), Err(FrameError::ControlFragmented));
        assert!(decode(&masked_header(0x89, 125)).unwrap().is_some());
    }

    #[test]
    fn write_frame_masks_for_the_client_role() {
        let mut out = Vec::new();
        write_frame(
            &mut out,
            true,
            0,
            OpCode::Text,
            b"Hello",
            Some([0x37, 0xfa, 0x21, 0x3d]),
        );
        // The masked "Hello" example from RFC 6455 §5.7.
        assert_eq!(
            out,
            [
                0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58
            ]
        );
        out.clear();
        write_frame(&mut out, true, 0, OpCode::Text, b"Hello", None);
        assert_eq!(out, [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
    }
}
