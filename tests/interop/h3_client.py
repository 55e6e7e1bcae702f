"""A WebSocket over HTTP/3 (RFC 9220) as an independent client speaks it:
QUIC, HTTP/3 and QPACK are aioquic's; the WebSocket frames are written
here, masked, as RFC 6455 asks of a client. For tests/h3.rs.

    h3_client.py HOST PORT CA_PEM SCENARIO

SCENARIO "echo": an extended CONNECT to /ws, then messages of sizes 0 to
1 MiB, text and binary, each echoed back whole; then a close 1000, its
echo, and the stream's end. Prints one JSON line with what it saw.
SCENARIO "deflate": the same, offering permessage-deflate with no context
takeover either way: every message is sent compressed, every echo must
come compressed (RSV1) and inflate to what was sent.
SCENARIO "hold": opens the WebSocket, prints {"open": true}, and waits
(30 s at most) for the server's close: prints its codes and the stream's end.
SCENARIO "refusals": requests that must be refused, each on a stream of
its own: prints their statuses, reasons and fields.
SCENARIO "last": 20 WebSockets, one after another, each sending one text
message and its close 1000 in a single write, then reading to the stream's
end: prints how many answered the message before their close, and the
close codes that came back.
"""

import asyncio
import json
import os
import ssl
import struct
import sys
import zlib

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic)
        self.streams = {}

    def open(self, headers, end_stream=False):
        stream_id = self._quic.get_next_available_stream_id()
        state = {"headers": None, "data": bytearray(), "ended": False, "reset": None,
                 "event": asyncio.Event()}
        self.streams[stream_id] = state
        self.http.send_headers(stream_id, headers, end_stream=end_stream)
        self.transmit()
        return stream_id, state

    def send(self, stream_id, data, end_stream=False):
        self.http.send_data(stream_id, data, end_stream)
        self.transmit()

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            state = self.streams[event.stream_id]
            state["reset"] = event.error_code
            state["event"].set()
        for http_event in self.http.handle_event(event):
            state = self.streams.get(getattr(http_event, "stream_id", None))
            if state is None:
                continue
            if isinstance(http_event, HeadersReceived):
                state["headers"] = http_event.headers
            elif isinstance(http_event, DataReceived):
                state["data"] += http_event.data
            if getattr(http_event, "stream_ended", False):
                state["ended"] = True
            state["event"].set()


async def wait(state, until, seconds=10):
    async def loop():
        while not until():
            state["event"].clear()
            if until():
                return
            await state["event"].wait()
    await asyncio.wait_for(loop(), seconds)


def frame(opcode, payload, rsv1=False):
    mask = os.urandom(4)
    head = bytes([0x80 | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else \
        (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
    return head + mask + masked


def deflate(payload):
    compressor = zlib.compressobj(wbits=-15)
    data = compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


def inflate(payload):
    return zlib.decompressobj(wbits=-15).decompress(payload + b"\x00\x00\xff\xff")


def parse(buffer):
    """Whole unmasked frames at the start of buffer: [(opcode, payload)]
    (a compressed one inflated; its opcode + 0x40), rest."""
    frames = []
    while len(buffer) >= 2:
        opcode, n = buffer[0] & 0x0F, buffer[1] & 0x7F
        if buffer[0] & 0x40:
            opcode |= 0x40
        at = 2
        if buffer[1] & 0x80:
            raise ValueError("a server frame must not be masked")
        if n == 126:
            if len(buffer) < 4:
                break
            n, at = struct.unpack("!H", buffer[2:4])[0], 4
        elif n == 127:
            if len(buffer) < 10:
                break
            n, at = struct.unpack("!Q", buffer[2:10])[0], 10
        if len(buffer) < at + n:
            break
        payload = bytes(buffer[at:at + n])
        frames.append((opcode, inflate(payload) if opcode & 0x40 else payload))
        buffer = buffer[at + n:]
    return frames, buffer


def connect_headers(authority, path=b"/ws", version=b"13", protocol=b"websocket", extra=()):
    return [(b":method", b"CONNECT"), (b":protocol", protocol), (b":scheme", b"https"),
            (b":path", path), (b":authority", authority),
            (b"sec-websocket-version", version)] + list(extra)


OFFER = b"permessage-deflate; client_no_context_takeover; server_no_context_takeover"


async def echo(client, authority, compress=False):
    extra = [(b"sec-websocket-extensions", OFFER)] if compress else []
    stream_id, state = client.open(connect_headers(authority, extra=extra))
    await wait(state, lambda: state["headers"] is not None or state["reset"] is not None)
    fields = dict(state["headers"] or [])
    status = fields.get(b":status", b"").decode()
    result = {"status": status, "echoed": 0, "bytes": 0,
              "extensions": fields.get(b"sec-websocket-extensions", b"").decode()}
    if status != "200":
        return result
    buffer = bytearray()
    sizes = [0, 1, 125, 126, 65535, 65536, 200_000, 1 << 20]
    for i, size in enumerate(sizes):
        text = i % 2 == 0
        payload = (b"x" * size) if text else os.urandom(size)
        opcode = 0x1 if text else 0x2
        if compress:
            client.send(stream_id, frame(opcode, deflate(payload), rsv1=True))
        else:
            client.send(stream_id, frame(opcode, payload))
        def whole():
            nonlocal buffer
            buffer += state["data"]
            state["data"].clear()
            frames, _ = parse(bytes(buffer))
            return bool(frames) or state["ended"]
        await wait(state, whole)
        frames, rest = parse(bytes(buffer))
        buffer = bytearray(rest)
        (opcode, got), = frames
        want = (0x1 if text else 0x2) | (0x40 if compress and size > 0 else 0)
        if opcode & 0x0F != want & 0x0F or got != payload or (compress and size >= 1024 and opcode != want):
            result["mismatch"] = {"size": size, "opcode": opcode, "got": len(got)}
            return result
        result["echoed"] += 1
        result["bytes"] += size
    client.send(stream_id, frame(0x8, struct.pack("!H", 1000) + b"bye"))
    def closed():
        nonlocal buffer
        buffer += state["data"]
        state["data"].clear()
        return state["ended"] or state["reset"] is not None
    await wait(state, closed)
    frames, _ = parse(bytes(buffer))
    result["close"] = [struct.unpack("!H", p[:2])[0] for o, p in frames if o == 0x8]
    result["ended"] = state["ended"]
    return result


async def frames_until_close(state, seconds=10):
    """The frames a stream brings up to a close frame (or its end or reset)."""
    buffer = bytearray()
    def closed():
        nonlocal buffer
        buffer += state["data"]
        state["data"].clear()
        frames, _ = parse(bytes(buffer))
        return any(o == 0x8 for o, _ in frames) or state["ended"] or state["reset"] is not None
    await wait(state, closed, seconds)
    return parse(bytes(buffer))[0]


async def hold(client, authority):
    stream_id, state = client.open(connect_headers(authority))
    await wait(state, lambda: state["headers"] is not None or state["reset"] is not None)
    print(json.dumps({"open": dict(state["headers"] or []).get(b":status") == b"200"}), flush=True)
    frames = await frames_until_close(state, 30)
    codes = [struct.unpack("!H", p[:2])[0] for o, p in frames if o == 0x8]
    # Answer the close, as a client does.
    client.send(stream_id, frame(0x8, struct.pack("!H", codes[0]) if codes else b""), end_stream=True)
    await wait(state, lambda: state["ended"] or state["reset"] is not None)
    return {"close": codes, "ended": state["ended"]}


async def refusals(client, authority):
    cases = {
        "version 8": connect_headers(authority, version=b"8"),
        "webtransport": connect_headers(authority, protocol=b"webtransport"),
        "other path": connect_headers(authority, path=b"/other"),
        "get": [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/ws"),
                (b":authority", authority)],
        "uppercase": connect_headers(authority, extra=[(b"X-Upper", b"1")]),
        "origin elsewhere": connect_headers(authority, extra=[(b"origin", b"https://evil.example")]),
    }
    answers = {}
    for name, headers in cases.items():
        stream_id, state = client.open(headers, end_stream=name == "get")
        await wait(state, lambda: state["ended"] or state["reset"] is not None)
        fields = {k.decode(): v.decode() for k, v in (state["headers"] or [])}
        answers[name] = {"status": fields.pop(":status", None), "fields": fields,
                         "body": state["data"].decode(errors="replace"), "reset": state["reset"]}
    return answers


async def last(client, authority, runs=20):
    answered, closes, frames_seen = 0, [], []
    for run in range(runs):
        stream_id, state = client.open(connect_headers(authority))
        await wait(state, lambda: state["headers"] is not None or state["reset"] is not None)
        if dict(state["headers"] or []).get(b":status") != b"200":
            return {"status": dict(state["headers"] or []).get(b":status", b"").decode()}
        word = f"last word {run}".encode()
        client.send(stream_id, frame(0x1, word) + frame(0x8, struct.pack("!H", 1000)))
        frames = await frames_until_close(state)
        frames_seen.append([o for o, _ in frames])
        if frames and frames[0] == (0x1, word):
            answered += 1
        closes += [struct.unpack("!H", p[:2])[0] for o, p in frames if o == 0x8]
        # Our side's end (raw QUIC: aioquic's HTTP/3 layer takes no more
        # once the peer ended its side).
        if state["reset"] is None and not state["ended"]:
            try:
                client._quic.send_stream_data(stream_id, b"", end_stream=True)
                client.transmit()
            except RuntimeError:
                pass  # the server stopped our side meanwhile
    return {"runs": runs, "answered": answered, "closes": closes, "frames": frames_seen}


async def run(protocol, scenarios, **configuration):
    """Connects to argv's HOST and PORT over QUIC (HTTP/3's ALPN, CA_PEM
    trusted, `configuration` added) with `protocol`, runs the SCENARIO
    named, and prints its JSON."""
    host, port, ca, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                                      server_name="localhost", **configuration)
    configuration.load_verify_locations(ca)
    async with connect(host, port, configuration=configuration, create_protocol=protocol) as client:
        result = await scenarios[scenario](client, f"localhost:{port}".encode())
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(run(Client, {
        "echo": echo,
        "deflate": lambda client, authority: echo(client, authority, compress=True),
        "hold": hold,
        "refusals": refusals,
        "last": last,
    }))
