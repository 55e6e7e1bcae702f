#!/usr/bin/env python3
"""Regenerates the committed seed corpora in fuzz/seeds/<target>/.

Seeds come from two places:
- the wire: the Autobahn TestSuite cases (kosoku, from autobahn/.venv, which
  autobahn/run.sh creates) are run against the echo example through a
  recording proxy, and what each client sent is cut into the inputs each
  target takes (request heads, extension header values, frame streams with
  and without permessage-deflate, compressed payloads, frame headers);
- a few hand-written inputs from the unit tests (RFC 6455 and RFC 7692
  examples) that hold whatever the wire lacks.

Usage: fuzz/make_seeds.py   (from anywhere; takes a minute or two)
"""

import hashlib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
SEEDS = HERE / "seeds"
KOSOKU = ROOT / "autobahn" / ".venv" / "bin" / "kosoku"
ECHO = ROOT / "target" / "release" / "examples" / "echo"

# Seeds are cut short: the fuzzer mutates their start far more than their end,
# and the repository should stay small.
MAX_SEED = 4096
MAX_PER_TARGET = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"nothing listens on {port}")


class Recorder:
    """A TCP proxy that keeps what each client sent, and whether the server's
    101 agreed to permessage-deflate."""

    def __init__(self, listen_port, server_port):
        self.server_port = server_port
        self.sessions = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", listen_port))
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()

    def serve(self, client):
        server = socket.create_connection(("127.0.0.1", self.server_port))
        record = {"sent": bytearray(), "answer": bytearray()}
        with self.lock:
            self.sessions.append(record)

        def pump(src, dst, into):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if len(into) < 1 << 20:
                        into.extend(data)
                    dst.sendall(data)
            except OSError:
                pass
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        back = threading.Thread(target=pump, args=(server, client, record["answer"]), daemon=True)
        back.start()
        pump(client, server, record["sent"])
        back.join(5)


def frames(stream):
    """(header bytes, fin, rsv1, opcode, unmasked payload) for each whole
    masked frame at the start of `stream`."""
    at = 0
    while at + 2 <= len(stream):
        b0, b1 = stream[at], stream[at + 1]
        length = b1 & 0x7F
        pos = at + 2
        if length == 126:
            length = int.from_bytes(stream[pos:pos + 2], "big")
            pos += 2
        elif length == 127:
            length = int.from_bytes(stream[pos:pos + 8], "big")
            pos += 8
        mask = stream[pos:pos + 4] if b1 & 0x80 else b"\0\0\0\0"
        pos += 4 if b1 & 0x80 else 0
        if pos + length > len(stream):
            return
        payload = bytes(c ^ mask[i % 4] for i, c in enumerate(stream[pos:pos + length]))
        yield stream[at:pos], bool(b0 & 0x80), bool(b0 & 0x40), b0 & 0x0F, payload
        at = pos + length


def compressed_messages(stream):
    """The compressed payload of each RSV1 message (its frames joined)."""
    message = None
    for _, fin, rsv1, opcode, payload in frames(stream):
        if opcode in (1, 2):
            message = bytearray(payload) if rsv1 else None
        elif opcode == 0 and message is not None:
            message.extend(payload)
        else:
            continue
        if fin and message is not None:
            yield bytes(message)
            message = None


def record_autobahn():
    if not KOSOKU.exists():
        sys.exit("run autobahn/run.sh once first: it installs kosoku into autobahn/.venv")
    subprocess.run(
        ["cargo", "build", "--quiet", "--release", "--example", "echo"], cwd=ROOT, check=True
    )
    echo_port, proxy_port = free_port(), free_port()
    echo = subprocess.Popen(
        [ECHO, "--addr", f"127.0.0.1:{echo_port}", "--deflate", "--deflate-min-size", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(echo_port)
        recorder = Recorder(proxy_port, echo_port)
        out = ROOT / "target" / "seed-recording"
        subprocess.run(
            [KOSOKU, "--parallelism", "8", "--outdir", out, f"127.0.0.1:{proxy_port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)
        with recorder.lock:
            return [(bytes(r["sent"]), bytes(r["answer"])) for r in recorder.sessions]
    finally:
        echo.kill()
        echo.wait()


def masked(opcode, payload, fin=True, rsv1=False, key=b"\x37\xfa\x21\x3d"):
    header = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        header += bytes([0x80 | n])
    elif n < 65536:
        header += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return header + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


# RFC 7692 §7.2.3.1: "Hello" compressed, without its 00 00 ff ff tail.
HELLO_DEFLATED = bytes.fromhex("f248cdc9c90700")

HANDWRITTEN = {
    "frame_header": [
        bytes.fromhex("818537fa213d"),  # RFC 6455 §5.7 masked "Hello"
        bytes.fromhex("0103"),
        bytes.fromhex("89807a5f0110"),
        bytes.fromhex("82fe0100a1b2c3d4"),
        bytes.fromhex("82ff0000000000010000a1b2c3d4"),
        bytes.fromhex("82ff8000000000000000"),  # 64-bit length, top bit set
        bytes.fromhex("c1850000000000"),  # RSV1
    ],
    "handshake": [
        b"GET /chat?room=1 HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\n\r\n",
    ],
    "extensions": [
        b"permessage-deflate; client_max_window_bits",
        b"permessage-deflate; server_max_window_bits=10; client_no_context_takeover, permessage-deflate",
        b'permessage-deflate; server_max_window_bits="8", x-webkit-deflate-frame',
        b"permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        b'foo; bar="b\\az"\npermessage-deflate',
        b"permessage-deflate;;",
    ],
    "session": [
        b"\x00" + masked(1, b"Hello"),
        b"\x80" + masked(1, b"Hel", fin=False) + masked(9, b"ping") + masked(0, b"lo"),
        b"\x05" + masked(1, "κόσμε".encode()) + masked(8, b"\x03\xe8bye"),
        b"\x07" + masked(2, bytes(5000)),
        b"\x11" + masked(1, b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"),
    ],
    "session_deflate": [
        b"\x00" + masked(1, HELLO_DEFLATED, rsv1=True),
        b"\x01" + masked(1, HELLO_DEFLATED, rsv1=True) * 2,
        b"\x82" + masked(1, HELLO_DEFLATED[:3], fin=False, rsv1=True) + masked(0, HELLO_DEFLATED[3:]),
        b"\x00" + masked(2, bytes.fromhex("f2480d0200"), rsv1=True),
        b"\x02" + masked(9, b"", rsv1=True),
    ],
    "inflate": [
        b"\x00" + HELLO_DEFLATED,
        b"\x01" + bytes.fromhex("f248cdc9c90700") + bytes.fromhex("f200110000"),
        b"\x02" + bytes.fromhex("0000ffff"),
        b"\x00" + bytes.fromhex("f3480d0200"),  # BFINAL set
    ],
}


def main():
    seeds = {target: list(inputs) for target, inputs in HANDWRITTEN.items()}
    for sent, answer in record_autobahn():
        end = sent.find(b"\r\n\r\n")
        if end < 0:
            continue
        head, stream = sent[: end + 4], sent[end + 4 :]
        seeds["handshake"].append(head)
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"sec-websocket-extensions":
                seeds["extensions"].append(value.strip())
        deflate = b"permessage-deflate" in answer.split(b"\r\n\r\n")[0]
        # An even first byte: chunks of up to 512 bytes, and (for
        # session_deflate) the client drops its context, as the echo
        # server asks.
        seeds["session_deflate" if deflate else "session"].append(b"\x00" + stream)
        for header, *_ in frames(stream):
            seeds["frame_header"].append(header)
        for message in compressed_messages(stream):
            seeds["inflate"].append(b"\x00" + message)

    # The handoff's seeds are the session's streams, cut at a third and at
    # two thirds (the first byte picks the cut).
    seeds["session_handoff"] = [
        bytes([cut]) + data[1:] for data in seeds["session"] for cut in (0x55, 0xAA)
    ]

    seeds["pubsub_handoff"] = pubsub_handoff_seeds()
    seeds["mux_frame"], seeds["mux_session"] = mux_seeds()
    seeds["h3_request"] = h3_seeds()

    for target, inputs in seeds.items():
        directory = SEEDS / target
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
        unique = {}
        for data in inputs:
            data = data[:MAX_SEED]
            unique.setdefault(hashlib.sha1(data).hexdigest(), data)
        # Hand-written seeds first, then the wire's, up to the cap.
        for name, data in list(unique.items())[:MAX_PER_TARGET]:
            (directory / name).write_bytes(data)
        print(f"{target}: {min(len(unique), MAX_PER_TARGET)} seeds")


def pubsub_handoff_seeds():
    """A bus's topics as `PubSub::hand_off` writes them (src/pubsub/handoff.rs):
    little-endian integers, byte strings with an eight-byte length."""
    u8 = lambda v: bytes([v])
    u32 = lambda v: v.to_bytes(4, "little")
    u64 = lambda v: v.to_bytes(8, "little")
    string = lambda b: u64(len(b)) + b

    def topic(name, epoch, last, numbering, kept):
        out = string(name) + u64(epoch) + u64(last) + u8(numbering) + u32(len(kept))
        for offset, key, text, payload, age in kept:
            out += u64(offset) + u8(key is not None)
            if key is not None:
                out += string(key)
            out += u8(text) + string(payload) + u64(age)
        return string(out)

    def topics(*each):
        return u8(1) + u32(len(each)) + b"".join(each)

    news = topic(b"news", 0xABC, 3, 0, [(n, None, True, b"headline %d" % n, 5) for n in (1, 2, 3)])
    prices = topic(b"prices/eur", 7, 9, 1, [(9, b"eur", False, bytes(range(32)), 0)])
    empty = topic(b"quiet", 1, 0, 0, [])
    return [topics(), topics(news), topics(news, prices, empty)]


def mux_seeds():
    """smux frames as xtaci/smux sends them (core/src/mux/frame.rs): a
    header of version, command, u16 length and u32 stream id (little-endian),
    then the payload. The session's seeds start with its configuration
    byte (fuzz/src/lib.rs, mux_session)."""

    def frame(version, command, stream, payload=b""):
        return bytes([version, command]) + len(payload).to_bytes(2, "little") + \
            stream.to_bytes(4, "little") + payload

    def upd(consumed, window):
        return consumed.to_bytes(4, "little") + window.to_bytes(4, "little")

    def conversation(v):
        out = frame(v, 0, 3) + frame(v, 2, 3, b"hello") + frame(v, 0, 5)
        out += frame(v, 2, 5, bytes(range(256)) * 3) + frame(v, 3, 0) + frame(v, 1, 3)
        if v == 2:
            out += frame(v, 4, 2, upd(5, 262144))
        return out + frame(v, 2, 7, b"unknown") + frame(v, 1, 5)

    frames = [frame(1, 0, 3), frame(2, 2, 3, b"x"), frame(2, 4, 3, upd(1, 65536)), frame(1, 3, 0),
              frame(1, 1, 2), frame(2, 2, 1, b"") + b"\xff", frame(9, 7, 0xFFFFFFFF)]
    flood = b"".join(frame(1, 0, 1 + 2 * i) for i in range(20))
    sessions = [
        b"\x00" + conversation(1),
        b"\x03" + conversation(2),
        b"\x06" + conversation(1),
        b"\x07" + conversation(2),
        b"\x02" + flood + frame(1, 2, 39, b"past the limit"),
        b"\x03" + frame(2, 0, 3) + frame(2, 2, 3, bytes(2000)) * 3,
        b"\x00" + frame(2, 0, 3),
    ]
    return frames, sessions


def h3_seeds():
    """HTTP/3 frames as a browser or aioquic sends them on a request stream
    and a control stream (core/src/h3): QPACK with the static table and
    literals, a first byte picking the size limit (fuzz/src/lib.rs,
    h3_request)."""

    def integer(n, flags, value):
        limit = (1 << n) - 1
        if value < limit:
            return bytes([flags | value])
        out, value = bytearray([flags | limit]), value - limit
        while value >= 0x80:
            out.append(0x80 | (value & 0x7F))
            value >>= 7
        return bytes(out + bytes([value]))

    def varint(v):
        for length, tag in ((1, 0), (2, 0x40), (4, 0x80), (8, 0xC0)):
            if v < 1 << (8 * length - 2):
                return (v | tag << (8 * length - 8)).to_bytes(length, "big")

    def frame(kind, payload):
        return varint(kind) + varint(len(payload)) + payload

    def indexed(index):
        return integer(6, 0xC0, index)

    def named(index, value):
        return integer(4, 0x50, index) + integer(7, 0, len(value)) + value

    def literal(name, value):
        return integer(3, 0x20, len(name)) + name + integer(7, 0, len(value)) + value

    # Static entries: 15 :method CONNECT, 23 :scheme https, 1 :path /, 0 :authority.
    connect = b"\x00\x00" + indexed(15) + literal(b":protocol", b"websocket") + indexed(23) + \
        named(1, b"/ws") + named(0, b"localhost:9443") + literal(b"sec-websocket-version", b"13")
    huffman = b"\x00\x00" + indexed(17) + indexed(23) + bytes([0x51, 0x86]) + \
        bytes.fromhex("61d2b4a5e2f5")  # :path in Huffman code
    settings = varint(0x08) + varint(1) + varint(0x33) + varint(1) + varint(0x06) + varint(16384)
    bad = [b"\x01\x00", b"\x00\x00\x80", b"\x00\x00\x10", b"\x00\x00\xff\x24"]
    # A WebTransport session as Chromium opens it, its close capsule in
    # DATA (and a drain, and a cut one), and a datagram (frame type 0x30).
    session = b"\x00\x00" + indexed(15) + literal(b":protocol", b"webtransport") + indexed(23) + \
        named(1, b"/wt") + named(0, b"localhost:9443") + \
        literal(b"sec-webtransport-http3-draft02", b"1")
    close = varint(0x2843) + varint(7) + (4000).to_bytes(4, "big") + b"bye"
    drain = varint(0x78AE) + varint(0)
    return [
        b"\x10" + frame(1, session) + frame(0, drain + close),
        b"\x10" + frame(0, close[:6]) + frame(0x30, varint(1) + b"datagram"),
        b"\x10" + frame(4, settings),
        b"\x10" + frame(1, connect) + frame(0, b"\x81\x85hello"),
        b"\x01" + frame(1, connect),
        b"\x10" + frame(1, huffman),
        b"\x10" + frame(0x21, b"grease") + frame(4, varint(2) + varint(0)),
    ] + [b"\x10" + frame(1, block) for block in bad]


if __name__ == "__main__":
    main()
