"""A WebTransport client as an independent implementation speaks it:
QUIC, HTTP/3, QPACK, WebTransport's streams and HTTP datagrams are
aioquic's (its `enable_webtransport`); the capsules are written here. For
tests/h3.rs, against examples/h3_echo's /wt.

    wt_client.py HOST PORT CA_PEM SCENARIO

SCENARIO "echo": a session at /wt; 4 bidirectional streams at once (random
bytes, 0 to 300,000, sent in pieces, then FIN) each echoed whole on
itself; 2 unidirectional streams echoed on streams the server opens; 20
datagrams, those echoed checked to be ones sent; then WT_CLOSE_SESSION
(4000, "bye") and the session stream's end. Prints one JSON line.
SCENARIO "hold": opens a session, prints {"open": true}, and waits (30 s at
most) for the server to close it: prints the capsule's code and reason.
SCENARIO "subscribe": a session at /wt?topic=news; prints {"open": true},
then reads what the server publishes to it (the topic named on a stream
of the server's, each message a varint length and its payload; datagrams
with the topic named first) until it has the counts given in its stdin's
line ("STREAM DATAGRAMS"), 20 s at most; closes the session; prints the
messages' indices in order and whether each payload was whole.
SCENARIO "credit": a session at /wt; the stream credit the server gives
once the session is open (MAX_STREAMS, each way); then 100 bidirectional
and 60 unidirectional streams opened at once, each echoed. Prints the
credit and the counts echoed.
SCENARIO "codes": a session at /wt; a bidirectional stream reset with the
application's code 5 and one whose echo is stopped with code 6, and a
unidirectional stream reset with code 7: prints the codes the server sent
back on each (RESET_STREAM, STOP_SENDING), as application codes.
SCENARIO "refusals": what must be refused: another path (404), a second
session on the connection (429), :scheme http (400), a page of another
origin (403), a stream and a datagram for a session that is not there.
"""

import asyncio
import json
import os
import struct
import sys

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer, encode_uint_var
from aioquic.h3.connection import FrameType, H3Connection, H3Stream
from aioquic.h3.events import (DataReceived, DatagramReceived, HeadersReceived,
                               WebTransportStreamDataReceived)
from aioquic.quic.events import StopSendingReceived, StreamReset

from h3_client import run

CLOSE_SESSION = 0x2843


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic, enable_webtransport=True)
        self.requests = {}
        self.streams = {}  # WebTransport streams: id -> {"data", "ended", "session"}
        self.datagrams = []
        self.resets = {}
        self.stops = {}
        self.event = asyncio.Event()

    def request(self, headers):
        stream_id = self._quic.get_next_available_stream_id()
        self.requests[stream_id] = {"headers": None, "data": bytearray(), "ended": False}
        self.http.send_headers(stream_id, headers)
        self.transmit()
        return stream_id

    def quic_event_received(self, event):
        if isinstance(event, StreamReset):
            self.resets[event.stream_id] = event.error_code
        if isinstance(event, StopSendingReceived):
            self.stops[event.stream_id] = event.error_code
        for http_event in self.http.handle_event(event):
            if isinstance(http_event, WebTransportStreamDataReceived):
                state = self.streams.setdefault(
                    http_event.stream_id,
                    {"data": bytearray(), "ended": False, "session": http_event.session_id})
                state["data"] += http_event.data
                state["ended"] |= http_event.stream_ended
            elif isinstance(http_event, DatagramReceived):
                self.datagrams.append((http_event.stream_id, http_event.data))
            elif isinstance(http_event, HeadersReceived):
                state = self.requests.get(http_event.stream_id)
                if state is not None:
                    state["headers"] = dict(http_event.headers)
                    state["ended"] |= http_event.stream_ended
            elif isinstance(http_event, DataReceived):
                state = self.requests.get(http_event.stream_id)
                if state is not None:
                    state["data"] += http_event.data
                    state["ended"] |= http_event.stream_ended
        self.event.set()

    async def until(self, condition, seconds=10):
        async def loop():
            while not condition():
                self.event.clear()
                if condition():
                    return
                await self.event.wait()
        await asyncio.wait_for(loop(), seconds)


def session_headers(authority, path=b"/wt", scheme=b"https", extra=()):
    return [(b":method", b"CONNECT"), (b":protocol", b"webtransport"), (b":scheme", scheme),
            (b":path", path), (b":authority", authority),
            (b"origin", b"https://" + authority), (b"sec-webtransport-http3-draft02", b"1")] \
        + list(extra)


def open_bidi(client, session):
    """A bidirectional stream of `session`. aioquic 1.7.2 keeps no state
    for the streams it opens this way, and would read the echo as HTTP/3
    frames: the state its reading side gives a stream the peer opened is
    set here."""
    stream_id = client.http.create_webtransport_stream(session)
    stream = H3Stream(stream_id)
    stream.frame_type = FrameType.WEBTRANSPORT_STREAM
    stream.session_id = session
    client.http._stream[stream_id] = stream
    return stream_id


async def open_session(client, authority, **kwargs):
    session = client.request(session_headers(authority, **kwargs))
    state = client.requests[session]
    await client.until(lambda: state["headers"] is not None or session in client.resets)
    return session, (state["headers"] or {}).get(b":status", b"").decode()


def capsules(data):
    """(type, payload) of the whole capsules in data."""
    buf, found = Buffer(data=bytes(data)), []
    while not buf.eof():
        kind, length = buf.pull_uint_var(), buf.pull_uint_var()
        found.append((kind, buf.pull_bytes(length)))
    return found


def close_capsule(code, reason):
    payload = struct.pack("!I", code) + reason
    return encode_uint_var(CLOSE_SESSION) + encode_uint_var(len(payload)) + payload


async def echo(client, authority):
    session, status = await open_session(client, authority)
    result = {"status": status,
              "draft": (client.requests[session]["headers"] or {})
              .get(b"sec-webtransport-http3-draft", b"").decode()}
    if status != "200":
        return result
    sent = {}
    for size in [0, 1, 65_536, 300_000]:
        stream_id = open_bidi(client, session)
        payload = os.urandom(size)
        for at in range(0, size, 50_000):
            client._quic.send_stream_data(stream_id, payload[at:at + 50_000])
        client._quic.send_stream_data(stream_id, b"", end_stream=True)
        sent[stream_id] = payload
    client.transmit()
    await client.until(lambda: all(client.streams.get(s, {}).get("ended") for s in sent), 20)
    result["bidi"] = [len(client.streams[s]["data"]) for s in sent
                      if bytes(client.streams[s]["data"]) == sent[s]]
    uni = [os.urandom(100_000), os.urandom(7)]
    for payload in uni:
        stream_id = client.http.create_webtransport_stream(session, is_unidirectional=True)
        client._quic.send_stream_data(stream_id, payload, end_stream=True)
    client.transmit()

    def server_uni():
        return [s for s, state in client.streams.items()
                if s % 4 == 3 and state["ended"]]
    await client.until(lambda: len(server_uni()) == len(uni), 20)
    echoed = sorted(bytes(client.streams[s]["data"]) for s in server_uni())
    result["uni"] = sorted(len(p) for p in uni if p in echoed)
    result["sessions"] = sorted({client.streams[s]["session"] for s in client.streams})
    datagrams = [b"%d:" % i + os.urandom(500) for i in range(20)]
    for datagram in datagrams:
        client.http.send_datagram(session, datagram)
        client.transmit()
        await asyncio.sleep(0.005)
    try:
        await client.until(lambda: len(client.datagrams) >= len(datagrams), 3)
    except asyncio.TimeoutError:
        pass
    result["datagrams_sent"] = len(datagrams)
    result["datagrams_echoed"] = sum(1 for s, d in client.datagrams if s == session and d in datagrams)
    result["datagrams_other"] = sum(1 for s, d in client.datagrams if s != session or d not in datagrams)
    client.http.send_data(session, close_capsule(4000, b"bye"), end_stream=True)
    client.transmit()
    state = client.requests[session]
    await client.until(lambda: state["ended"] or session in client.resets)
    result["ended"] = state["ended"]
    result["server_capsules"] = [k for k, _ in capsules(state["data"])]
    return result


async def hold(client, authority):
    session, status = await open_session(client, authority)
    print(json.dumps({"open": status == "200"}), flush=True)
    state = client.requests[session]
    await client.until(lambda: state["ended"] or session in client.resets, 30)
    closes = [(struct.unpack("!I", p[:4])[0], p[4:].decode())
              for k, p in capsules(state["data"]) if k == CLOSE_SESSION]
    return {"close": closes, "ended": state["ended"]}


def parse_publication(data):
    """(index, whole) of a payload "INDEX:" followed by bytes INDEX % 256."""
    head, _, body = bytes(data).partition(b":")
    index = int(head)
    return index, body == bytes([index % 256]) * len(body)


async def subscribe(client, authority):
    session, status = await open_session(client, authority, path=b"/wt?topic=news")
    print(json.dumps({"open": status == "200"}), flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    want_stream, want_datagrams = (int(n) for n in line.split())

    def stream_messages():
        streams = [s for s in client.streams if s % 4 == 3]
        if not streams:
            return None, []
        buf, messages = Buffer(data=bytes(client.streams[streams[0]]["data"])), []
        topic = buf.pull_bytes(buf.pull_uint_var()).decode()
        while not buf.eof():
            at = buf.tell()
            try:
                length = buf.pull_uint_var()
                messages.append(buf.pull_bytes(length))
            except Exception:
                buf.seek(at)
                break
        return topic, messages

    def datagrams():
        found = []
        for stream_id, data in client.datagrams:
            buf = Buffer(data=data)
            topic = buf.pull_bytes(buf.pull_uint_var()).decode()
            found.append((stream_id, topic, data[buf.tell():]))
        return found
    # The stream's messages all come (15 s at most); datagrams may be
    # lost: 2 s more for the last of them.
    for condition, seconds in [(lambda: len(stream_messages()[1]) >= want_stream, 15),
                               (lambda: len(datagrams()) >= want_datagrams, 2)]:
        try:
            await client.until(condition, seconds)
        except asyncio.TimeoutError:
            pass
    topic, messages = stream_messages()
    got = datagrams()
    client.http.send_data(session, close_capsule(0, b""), end_stream=True)
    client.transmit()
    return {
        "streams": len([s for s in client.streams if s % 4 == 3]),
        "topic": topic,
        "messages": [parse_publication(m) for m in messages],
        "datagrams": sorted(parse_publication(d) for _, _, d in got),
        "datagram_topics": sorted({t for _, t, _ in got}),
        "datagram_sessions": sorted({s for s, _, _ in got}),
        "session": session,
    }


def error_to_http3(code):
    """The draft's mapping of an application's code into HTTP/3's space."""
    return 0x52E4A40FA8DB + code + code // 0x1E


def http3_to_error(code):
    """The inverse of error_to_http3, None for a code outside its range."""
    if code is None or code < 0x52E4A40FA8DB or (code - 0x21) % 0x1F == 0:
        return None
    shifted = code - 0x52E4A40FA8DB
    return shifted - shifted // 0x1F


async def credit(client, authority):
    session, status = await open_session(client, authority)
    result = {"status": status}
    if status != "200":
        return result
    quic = client._quic
    try:
        await client.until(lambda: quic._remote_max_streams_bidi >= 100, 2)
    except asyncio.TimeoutError:
        pass
    result["max_bidi"] = quic._remote_max_streams_bidi
    result["max_uni"] = quic._remote_max_streams_uni
    sent = {}
    for i in range(100):
        stream_id = open_bidi(client, session)
        payload = os.urandom(1000 + i)
        client._quic.send_stream_data(stream_id, payload, end_stream=True)
        sent[stream_id] = payload
    client.transmit()
    await client.until(lambda: all(client.streams.get(s, {}).get("ended") for s in sent), 20)
    result["bidi_echoed"] = sum(1 for s in sent if bytes(client.streams[s]["data"]) == sent[s])
    uni = [os.urandom(500 + i) for i in range(60)]
    for payload in uni:
        stream_id = client.http.create_webtransport_stream(session, is_unidirectional=True)
        client._quic.send_stream_data(stream_id, payload, end_stream=True)
    client.transmit()

    def server_uni():
        return [s for s, state in client.streams.items() if s % 4 == 3 and state["ended"]]
    await client.until(lambda: len(server_uni()) >= len(uni), 20)
    echoed = {bytes(client.streams[s]["data"]) for s in server_uni()}
    result["uni_echoed"] = sum(1 for p in uni if p in echoed)
    return result


async def codes(client, authority):
    session, status = await open_session(client, authority)
    result = {"status": status}
    if status != "200":
        return result
    quic = client._quic
    reset = open_bidi(client, session)
    quic.send_stream_data(reset, b"some bytes, then a reset")
    client.transmit()
    await client.until(lambda: len(client.streams.get(reset, {}).get("data", b"")) > 0)
    quic.reset_stream(reset, error_to_http3(5))
    stopped = open_bidi(client, session)
    quic.send_stream_data(stopped, b"some bytes, then a stop")
    client.transmit()
    await client.until(lambda: len(client.streams.get(stopped, {}).get("data", b"")) > 0)
    quic.stop_stream(stopped, error_to_http3(6))
    uni = client.http.create_webtransport_stream(session, is_unidirectional=True)
    quic.send_stream_data(uni, b"some bytes, then a reset")
    client.transmit()
    await asyncio.sleep(0.2)
    quic.reset_stream(uni, error_to_http3(7))
    client.transmit()
    try:
        await client.until(lambda: reset in client.resets and stopped in client.resets, 5)
    except asyncio.TimeoutError:
        pass
    # Anything the server says of the unidirectional stream comes by now.
    await asyncio.sleep(0.5)
    result["bidi reset"] = {"reset": http3_to_error(client.resets.get(reset)),
                            "stop": http3_to_error(client.stops.get(reset))}
    result["bidi stopped"] = {"reset": http3_to_error(client.resets.get(stopped)),
                              "stop": http3_to_error(client.stops.get(stopped))}
    result["uni reset"] = {"stop": client.stops.get(uni)}
    return result


async def refusals(client, authority):
    answers = {}
    for name, kwargs in [("other path", {"path": b"/other"}),
                         ("http", {"scheme": b"http"}),
                         ("origin elsewhere", {"extra": [(b"origin", b"https://evil.example")]})]:
        if name == "origin elsewhere":
            headers = [h for h in session_headers(authority) if h[0] != b"origin"] + kwargs["extra"]
            stream_id = client.request(headers)
            state = client.requests[stream_id]
            await client.until(lambda: state["ended"] or stream_id in client.resets)
            status = (state["headers"] or {}).get(b":status", b"").decode()
        else:
            stream_id, status = await open_session(client, authority, **kwargs)
            state = client.requests[stream_id]
            await client.until(lambda: state["ended"] or stream_id in client.resets)
        answers[name] = {"status": status, "body": state["data"].decode(errors="replace")}
    # A stream and a datagram for a session that is not there: the first
    # request's, refused above.
    stray = open_bidi(client, 0)
    client._quic.send_stream_data(stray, b"anyone?")
    client.http.send_datagram(0, b"anyone?")
    client.transmit()
    # Both come (a reset and a STOP_SENDING, maybe in two packets): wait
    # for both, and if one never does, the answer shows it missing.
    try:
        await client.until(lambda: stray in client.resets and stray in client.stops)
    except asyncio.TimeoutError:
        pass
    answers["stray stream"] = {"reset": client.resets.get(stray), "stop": client.stops.get(stray)}
    first, status = await open_session(client, authority)
    second, second_status = await open_session(client, authority)
    answers["first"] = {"status": status}
    second_state = client.requests[second]
    await client.until(lambda: second_state["ended"] or second in client.resets)
    answers["second"] = {"status": second_status,
                         "body": second_state["data"].decode(errors="replace")}
    return answers


if __name__ == "__main__":
    asyncio.run(run(Client, {"echo": echo, "hold": hold, "subscribe": subscribe,
                             "credit": credit, "codes": codes, "refusals": refusals},
                    max_datagram_frame_size=65536))
