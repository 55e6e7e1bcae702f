"""What the interop scripts share: an extension wrapper that records each
received frame as it came off the wire, and the permessage-deflate settings
their command lines give."""

import sys

from websockets.extensions.base import Extension


class Recording(Extension):
    """Wraps the negotiated extension to see each received frame as it came:
    whether it is a data frame, its RSV1 bit, and its payload's length on
    the wire."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.frames = []

    def decode(self, frame, *, max_size=None):
        data = frame.opcode.name in ("TEXT", "BINARY", "CONT")
        self.frames.append({"data": data, "rsv1": frame.rsv1, "wire_len": len(frame.data)})
        return self.inner.decode(frame, max_size=max_size)

    def encode(self, frame):
        return self.inner.encode(frame)


def record(protocol, *, server):
    """Wraps the connection's negotiated permessage-deflate, if any, in a
    Recording. Returns what was negotiated, named from the server's and the
    client's sides (`server`: whether this end is the server), and the
    Recording (None without deflate)."""
    if not protocol.extensions:
        return {}, None
    deflate = protocol.extensions[0]
    ours, theirs = ("local", "remote") if server else ("remote", "local")
    negotiated = {
        "server_no_context_takeover": getattr(deflate, f"{ours}_no_context_takeover"),
        "client_no_context_takeover": getattr(deflate, f"{theirs}_no_context_takeover"),
        "server_max_window_bits": getattr(deflate, f"{ours}_max_window_bits"),
        "client_max_window_bits": getattr(deflate, f"{theirs}_max_window_bits"),
    }
    recording = Recording(deflate)
    protocol.extensions = [recording]
    return negotiated, recording


def deflate_settings(spec):
    """The keyword arguments a comma-separated SPEC asks of websockets'
    permessage-deflate factories: `server_no_context_takeover`,
    `client_no_context_takeover`, `server_max_window_bits=N`, and
    `client_max_window_bits` with or without `=N`."""
    kwargs = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if name in ("server_no_context_takeover", "client_no_context_takeover"):
            kwargs[name] = True
        elif name in ("server_max_window_bits", "client_max_window_bits"):
            kwargs[name] = int(value) if value else True
        else:
            sys.exit(f"unknown permessage-deflate parameter {name}")
    return kwargs
