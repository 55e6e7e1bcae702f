#!/usr/bin/env python3
"""Writes the hand-made seeds of the client-role fuzz targets.

make_seeds.py records what Autobahn's clients send, which is server input;
a client's input (a server's 101 and unmasked frames) is written here by
hand instead:

- client_handshake: the first byte picks the request (0 no deflate, 1 the
  default offer, 2 context takeover kept, 3 windows 10 and 12), the rest is
  the response. The accept value is the RFC 6455 example's, which the
  target replaces with the one its random key calls for.
- client_session: the first byte seeds the chunk sizes (top bit: small
  chunks) and, modulo 3, picks deflate (0 off, 1 the server drops its
  context, 2 it keeps it); the rest is what a server sends.

Usage: fuzz/make_client_seeds.py   (from anywhere; files are named by their
SHA-1, as the other seeds are)
"""

import hashlib
import pathlib
import struct

SEEDS = pathlib.Path(__file__).resolve().parent / "seeds"
ACCEPT = b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def write(target, data):
    folder = SEEDS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def response(extra=b"", status=b"101 Switching Protocols", accept=ACCEPT, tail=b""):
    return (
        b"HTTP/1.1 " + status + b"\r\n"
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n" + extra + b"\r\n" + tail
    )


def extensions(value):
    return b"Sec-WebSocket-Extensions: " + value + b"\r\n"


def frame(opcode, payload, fin=True, rsv1=False, mask=None):
    """A server frame (unmasked unless `mask` is given)."""
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    mask_bit = 0x80 if mask else 0
    if n < 126:
        head = bytes([b0, mask_bit | n])
    elif n < 65536:
        head = bytes([b0, mask_bit | 126]) + struct.pack(">H", n)
    else:
        head = bytes([b0, mask_bit | 127]) + struct.pack(">Q", n)
    if mask:
        head += mask
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + payload


def handshake_seeds():
    pmd_default = extensions(
        b"permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    )
    seeds = [
        (0, response()),
        (0, response(b"Sec-WebSocket-Protocol: chat\r\n")),
        (0, response(tail=frame(0x1, b"first frame"))),
        (0, response(b"Sec-WebSocket-Protocol: chat, superchat\r\n")),
        (0, response(status=b"101 Switching Protocols", accept=b"x" * 28)),
        (0, b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"),
        (0, b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\n\r\n"),
        (0, b"HTTP/1.0 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: upgrade\r\nSec-WebSocket-Accept: " + ACCEPT + b"\r\n\r\n"),
        (0, b"HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\n"
            b"connection: keep-alive, Upgrade\r\nsec-websocket-accept:  " + ACCEPT + b" \r\n\r\n"),
        (1, response(pmd_default)),
        (1, response(pmd_default + b"Sec-WebSocket-Protocol: superchat\r\n",
                     tail=frame(0x1, b"\xf2\x48\xcd\xc9\xc9\x07\x00", rsv1=True))),
        (1, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"client_no_context_takeover; client_max_window_bits=9"))),
        (1, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"client_no_context_takeover; client_max_window_bits=8"))),
        (1, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"server_max_window_bits=\"12\""))),
        (1, response(extensions(b"permessage-deflate, x-webkit-deflate-frame"))),
        (2, response(extensions(b"permessage-deflate"))),
        (2, response(extensions(b"permessage-deflate; server_max_window_bits=15; "
                                b"client_max_window_bits=15"))),
        (3, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"client_no_context_takeover; server_max_window_bits=10; "
                                b"client_max_window_bits=12"))),
        (3, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"server_max_window_bits=9"))),
        (3, response(extensions(b"permessage-deflate; server_no_context_takeover; "
                                b"server_max_window_bits=11"))),
    ]
    for selector, data in seeds:
        write("client_handshake", bytes([selector]) + data)


def session_seeds():
    close = struct.pack(">H", 1000) + b"bye"
    plain = [
        frame(0x1, b"Hello"),
        frame(0x1, b"Hel", fin=False) + frame(0x0, b"lo"),
        frame(0x1, b"Hel", fin=False) + frame(0x9, b"ping") + frame(0x0, b"lo"),
        frame(0x9, b"Hello") + frame(0xA, b"Hello"),
        frame(0x2, bytes(range(256))),
        frame(0x2, bytes(4000)),
        frame(0x1, "Grüße, 世界".encode()) + frame(0x8, close),
        frame(0x8, b""),
        frame(0x1, b"masked", mask=b"\x01\x02\x03\x04"),
        frame(0x1, b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"),
        frame(0x1, b"\xff bad utf-8"),
    ]
    for stream in plain:
        for seed in (0x00, 0x81):
            write("client_session", bytes([seed]) + stream)
    # RFC 7692 §7.2.3: "Hello" compressed, then again with context kept, and
    # cut over two frames.
    hello = b"\xf2\x48\xcd\xc9\xc9\x07\x00"
    deflated = [
        frame(0x1, hello, rsv1=True),
        frame(0x1, hello[:3], fin=False, rsv1=True) + frame(0x0, hello[3:]),
        frame(0x1, b"\x00", rsv1=True) + frame(0x8, close),
    ]
    with_context = frame(0x1, hello, rsv1=True) + frame(0x1, b"\xf2\x00\x11\x00\x00", rsv1=True)
    for stream in deflated:
        for seed in (0x01, 0x02, 0x82):
            write("client_session", bytes([seed]) + stream)
    write("client_session", bytes([0x02]) + with_context)
    write("client_session", bytes([0x80]) + with_context)


if __name__ == "__main__":
    handshake_seeds()
    session_seeds()
