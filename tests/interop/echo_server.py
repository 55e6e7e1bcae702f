"""Echo server for the client's interop tests (Python `websockets`).

Prints its port, then serves: every message is sent back as it came. When a
connection ends it prints one JSON line: the client's offer, what was
negotiated, and for each message received whether it arrived compressed and
how many bytes it took on the wire.

    python echo_server.py [--tls CERT KEY] [--deflate SPEC] [--protocol P]

A SPEC is a comma-separated list of the server's permessage-deflate
settings: server_no_context_takeover, client_no_context_takeover,
server_max_window_bits=N, client_max_window_bits=N. `--deflate ""` accepts
offers with websockets' defaults; no `--deflate` refuses compression.
"""

import argparse
import asyncio
import json
import ssl

from websockets.asyncio.server import serve
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory

from recording import deflate_settings, record


def factory(spec):
    return ServerPerMessageDeflateFactory(**deflate_settings(spec))


async def echo(ws):
    offer = ws.request.headers.get("Sec-WebSocket-Extensions")
    negotiated, recording = record(ws.protocol, server=True)
    try:
        async for message in ws:
            await ws.send(message)
    finally:
        line = {
            "offer": offer,
            "negotiated": negotiated,
            "protocol": ws.subprotocol,
            "frames": recording.frames if recording else [],
        }
        print(json.dumps(line), flush=True)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    parser.add_argument("--deflate")
    parser.add_argument("--protocol")
    args = parser.parse_args()
    extensions = [] if args.deflate is None else [factory(args.deflate)]
    context = None
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*args.tls)
    more = {"subprotocols": [args.protocol]} if args.protocol else {}
    async with serve(
        echo,
        "127.0.0.1",
        0,
        extensions=extensions,
        compression=None,
        ssl=context,
        max_size=None,
        **more,
    ) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
