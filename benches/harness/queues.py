#!/usr/bin/env python3
"""Where the bytes ahead of a reply wait: samples one TCP connection's two
socket queues while a stream run goes on.

Every millisecond it reads `/proc/net/tcp` and `tcp6` (Linux) for an
established connection to `--port` (the first found, if several) and
records the server socket's send queue (what its kernel holds unsent or
unacknowledged) and the client socket's receive queue (what the client's
kernel took and its code has not read). Both ends must be on this
machine. A reply the server sends waits behind both (and the rest of the
message being written): divided by the client's read rate, their sum is
the reply's wait.

    python3 benches/harness/queues.py --port 9005 --seconds 12

prints the samples' percentiles of each queue and of their sum, in MB.
`--out FILE` also writes every sample (`ns server_send client_receive`).
"""

import argparse
import time


def queues(port):
    """(server send queue, client receive queue) of one established
    connection to `port` (IPv4 or IPv6), or None while there is none. The
    two sockets are paired by their addresses, so other connections to the
    port do not mix in."""
    servers, clients = {}, {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "01":  # ESTABLISHED
                continue
            local, remote = fields[1], fields[2]
            tx, rx = (int(part, 16) for part in fields[4].split(":"))
            if int(local.split(":")[1], 16) == port:
                servers[(local, remote)] = tx
            elif int(remote.split(":")[1], 16) == port:
                clients[(remote, local)] = rx
    for pair, send in servers.items():
        if pair in clients:
            return send, clients[pair]
    return None


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the server's port")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long to sample")
    parser.add_argument("--out", help="write every sample here too")
    args = parser.parse_args()

    samples = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        found = queues(args.port)
        if found is not None:
            samples.append((time.time_ns(), *found))
        time.sleep(0.001)
    if args.out:
        with open(args.out, "w") as out:
            out.writelines(f"{ns} {send} {receive}\n" for ns, send, receive in samples)
    if not samples:
        print(f"no established connection to port {args.port} was seen")
        return
    print(f"{len(samples)} samples of the connection to port {args.port}, MB")
    print(f"{'':>28} {'p10':>6} {'p50':>6} {'p90':>6} {'max':>6}")
    columns = {
        "server send queue": [send for _, send, _ in samples],
        "client receive queue": [receive for _, _, receive in samples],
        "both: ahead of a reply": [send + receive for _, send, receive in samples],
    }
    for name, values in columns.items():
        cells = [percentile(values, q) / 1e6 for q in (0.1, 0.5, 0.9)] + [max(values) / 1e6]
        print(f"{name:>28} " + " ".join(f"{cell:6.2f}" for cell in cells))


if __name__ == "__main__":
    main()
