"""Push client for the interop tests (Python `websockets`): replies that jump
the queue, checked by an independent permessage-deflate decoder.

Asks the test server for 400 text pushes of 30000 bytes (`push-text`:
pseudo-random letters, which compress to about 60%, so that each is long
enough to be overtaken on its own) and sends 40 requests meanwhile (`req I
yyy...`, long enough to be worth compressing). It reads nothing (through a
small receive buffer) until the test says on stdin that the server's push
task is waiting for room, so the queue is full when the first requests
arrive and their replies overtake queued pushes; then it reads
everything. Every push must arrive in order with its exact text, which the
decoder produces only if the server compressed them in the order they reach
the wire; every reply must arrive, in order. Prints one JSON line; exits
non-zero on a wrong or missing message.

    python push_client.py URL [--offer SPEC]... [--cafile PEM]
"""

import argparse
import json
import socket
import sys
import threading
import time

from deflate_client import Recording, factory, open_client

def push_text(i, size):
    """The server's `push-text` message number i (see `push_payload`)."""
    letters = [f"push {i} "]
    length, x = len(letters[0]), i
    while length < size:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        letters.append(chr(ord("a") + (x >> 16) % 26))
        length += 1
    return "".join(letters)


class Frames(Recording):
    """Records each data frame's opcode and RSV1, in arrival order."""

    def decode(self, frame, *, max_size=None):
        if frame.opcode.value in (1, 2):
            self.frames.append(frame.rsv1)
        return self.inner.decode(frame, max_size=max_size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--offer", action="append", default=[])
    parser.add_argument("--cafile", help="for wss: trust this certificate (PEM)")
    parser.add_argument("--pushes", type=int, default=400)
    parser.add_argument("--size", type=int, default=30000)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    offers = [factory(o) for o in args.offer or [""]]
    # A small receive buffer of fixed size (no autotuning): the pushes back
    # up in the server, not in this socket.
    host, _, port = args.url.split("/")[2].rpartition(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect((host, int(port)))
    with open_client(args, offers, sock=sock) as ws:
        response = ws.response.headers.get("Sec-WebSocket-Extensions")
        frames = Frames(ws.protocol.extensions[0])
        ws.protocol.extensions = [frames]
        ws.send(f"push-text {args.pushes} {args.size}")

        def requests():
            for i in range(args.requests):
                time.sleep(0.1 if i < 10 else 0.02)
                ws.send(f"req {i} " + "y" * 100)

        # Not reading until the test sees the push task wait for room: the
        # server's buffers and queue are full, and the first requests'
        # replies have pushes to overtake (a fixed wait was not always
        # enough on a loaded machine, where the pushes come slowly).
        sys.stdin.readline()
        sender = threading.Thread(target=requests)
        sender.start()
        time.sleep(0.3)
        pushes, replies, overtook, reply_rsv1, push_rsv1 = 0, 0, 0, [], []
        while pushes < args.pushes or replies < args.requests:
            message = ws.recv(timeout=30)
            rsv1 = frames.frames[pushes + replies]
            if message.startswith("push "):
                if message != push_text(pushes, args.size):
                    sys.exit(f"push {pushes} differs: {message[:40]!r}")
                push_rsv1.append(rsv1)
                pushes += 1
                time.sleep(0.001)
            else:
                request, _, after = message.partition(" after ")
                if request != f"req {replies} " + "y" * 100:
                    sys.exit(f"reply {replies} differs: {message[:40]!r}")
                # Pushes queued before the reply that arrive after it.
                if int(after) > pushes:
                    overtook += 1
                reply_rsv1.append(rsv1)
                replies += 1
        sender.join()
        print(
            json.dumps(
                {
                    "response": response,
                    "pushes": pushes,
                    "replies": replies,
                    "overtook": overtook,
                    "pushes_compressed": all(push_rsv1),
                    "replies_compressed": reply_rsv1,
                }
            )
        )


if __name__ == "__main__":
    main()
