"""A notification-bus subscriber for the interop tests (Python `websockets`).

Connects to URL (a `/ws?topics=...` upgrade) with the permessage-deflate
offer given, prints `ready` once open, then reads COUNT messages and prints
one JSON line: what was negotiated, each message's kind, length and FNV-1a
hash, and each data frame as it came off the wire (its RSV1 bit: whether
the server sent it compressed).

    python subscriber.py URL --count N [--offer SPEC] [--cafile PEM]

SPEC is as in deflate_client.py; `--offer none` offers nothing.
"""

import argparse
import json
import ssl
import sys

from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.sync.client import connect

from recording import deflate_settings, record


def fnv1a(data):
    """FNV-1a, 32 bits: the test computes the same over what it published."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--offer", default="")
    parser.add_argument("--cafile")
    args = parser.parse_args()
    offers = [] if args.offer == "none" else [
        ClientPerMessageDeflateFactory(**deflate_settings(args.offer))
    ]
    more = {}
    if args.cafile:
        more["ssl"] = ssl.create_default_context(cafile=args.cafile)
    with connect(
        args.url, extensions=offers, compression=None, max_size=None, open_timeout=10, **more
    ) as ws:
        negotiated, recording = record(ws.protocol, server=False)
        print("ready", flush=True)
        messages = []
        for _ in range(args.count):
            message = ws.recv(timeout=20)
            text = isinstance(message, str)
            data = message.encode() if text else message
            messages.append({"text": text, "len": len(data), "hash": fnv1a(data)})
        print(
            json.dumps(
                {
                    "negotiated": negotiated,
                    "messages": messages,
                    "frames": recording.frames if recording else [],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
