"""What the interop scripts share: an extension wrapper that records each
received frame as it came off the wire."""

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
