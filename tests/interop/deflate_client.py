"""permessage-deflate client for the interop tests (Python `websockets`).

Connects with the offers given on the command line, sends a fixed set of
messages, checks every echo, and prints one JSON line: what was negotiated, and
for each echo whether it arrived compressed and how many bytes it took on the
wire. Exits non-zero if an echo differs.

    python deflate_client.py URL [--offer SPEC]... [--cafile PEM]

An offer SPEC is a comma-separated list of: server_no_context_takeover,
client_no_context_takeover, server_max_window_bits=N, client_max_window_bits
or client_max_window_bits=N. `--offer none` offers nothing.
"""

import argparse
import json
import ssl
import sys

from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.sync.client import connect

from recording import Recording, deflate_settings, record


def factory(spec):
    return ClientPerMessageDeflateFactory(**deflate_settings(spec))


def messages():
    quote = "Habe nun, ach! Philosophie, Juristerei und Medizin, und leider auch Theologie! "
    return [
        quote,
        quote,  # the same again: tiny when the server keeps its context
        b"\x00\x01\x02" * 2000,
        "",
        "κόσμε " * 300,
        bytes(range(256)) * 8,  # does not compress well
        "x" * (1 << 20),
        "short",
    ]


def open_client(args, offers, **more):
    """Connects to args.url with `offers` (no other extension, no size limit);
    for wss, trusting args.cafile. `more` goes to `connect` (e.g. `sock`)."""
    if args.cafile:
        more["ssl"] = ssl.create_default_context(cafile=args.cafile)
    return connect(
        args.url,
        extensions=offers,
        compression=None,
        max_size=None,
        open_timeout=10,
        **more,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--offer", action="append", default=[])
    parser.add_argument("--cafile", help="for wss: trust this certificate (PEM)")
    args = parser.parse_args()
    offers = [] if args.offer == ["none"] else [factory(o) for o in args.offer or [""]]
    with open_client(args, offers) as ws:
        response = ws.response.headers.get("Sec-WebSocket-Extensions")
        negotiated, recording = record(ws.protocol, server=False)
        for message in messages():
            ws.send(message)
            echo = ws.recv(timeout=10)
            if echo != message:
                sys.exit(f"echo differs: sent {len(message)}, got {len(echo)}")
        print(
            json.dumps(
                {
                    "response": response,
                    "negotiated": negotiated,
                    "frames": recording.frames if recording else [],
                }
            )
        )


if __name__ == "__main__":
    main()
