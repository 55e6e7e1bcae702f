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
