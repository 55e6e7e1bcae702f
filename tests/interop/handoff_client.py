"""A client that talks through a handoff (Python `websockets`, asyncio).

Opens CONNECTIONS connections to URL with permessage-deflate offered
(websockets' default offer), and on each sends numbered, compressible
messages, one at a time, checking that exactly each comes back, until
SECONDS have passed; then closes with 1000. Prints one JSON line: the
extension each connection agreed, how many echoes it got, and how it
ended (who closed, with which code). Exits non-zero if an echo differed.

    python handoff_client.py URL CONNECTIONS SECONDS
"""

import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


async def talk(url, index, until):
    report = {"echoed": 0, "closed_by": None, "code": None}
    async with connect(url, max_size=None, open_timeout=10) as ws:
        report["extensions"] = ws.response.headers.get("Sec-WebSocket-Extensions")
        try:
            while time.monotonic() < until:
                text = f"{index}:{report['echoed']}:" + "the same words again " * 20
                await ws.send(text)
                echo = await asyncio.wait_for(ws.recv(), 20)
                if echo != text:
                    raise SystemExit(f"connection {index}: echo differs")
                report["echoed"] += 1
            report["closed_by"] = "client"
            await ws.close(1000, "done")
            report["code"] = ws.protocol.close_rcvd.code if ws.protocol.close_rcvd else None
        except ConnectionClosed as closed:
            report["closed_by"] = "server"
            report["code"] = closed.rcvd.code if closed.rcvd else None
    return report


async def main():
    url, connections, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    until = time.monotonic() + seconds
    reports = await asyncio.gather(*(talk(url, i, until) for i in range(connections)))
    print(json.dumps(reports))


asyncio.run(main())
