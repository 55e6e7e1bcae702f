"""A client that says its last word and leaves (Python `websockets`): for
the interop tests. Connects RUNS times (default 20); each time sends one
text message and, at once, its close (1000), while reading what comes
back. Prints one JSON line: how many runs got their echo before the
server's close, and the close codes the server answered with.

    python last_word.py URL [--runs N] [--cafile PEM]
"""

import argparse
import asyncio
import json
import ssl

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


async def one(url, context, word):
    async with connect(url, ssl=context, compression=None) as ws:
        await ws.send(word)
        closing = asyncio.create_task(ws.close())
        got = None
        try:
            got = await asyncio.wait_for(ws.recv(), 10)
        except ConnectionClosed:
            pass
        await closing
        code = ws.close_code
        return got == word, code


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cafile")
    parser.add_argument("--offer", action="append", default=[])
    args = parser.parse_args()
    context = None
    if args.url.startswith("wss:"):
        context = ssl.create_default_context(cafile=args.cafile)
    answered, codes = 0, []
    for run in range(args.runs):
        echoed, code = await one(args.url, context, f"last word {run}")
        answered += echoed
        codes.append(code)
    print(json.dumps({"runs": args.runs, "answered": answered, "codes": codes}))


asyncio.run(main())
