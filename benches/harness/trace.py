#!/usr/bin/env python3
"""Summarises a `rapidws-load stream --trace FILE` trace.

Prints the round-trip percentiles, the stalls (runs of replies slower than
--slow-ms), and for the worst stall the client's read throughput in 20 ms
buckets around it. Replies that arrive together after a stall while reads
kept their pace mean the server stopped reading (or answering); a read
throughput that drops with them means the client, or the path, slowed.

    python3 benches/harness/trace.py /tmp/stream.trace --slow-ms 10
"""

import argparse
import collections

BUCKET = 0.02


def load(path):
    replies, reads = [], []
    with open(path) as lines:
        for line in lines:
            kind, at, value = line.split()
            (replies if kind == "reply" else reads).append((float(at), int(value)))
    return sorted(replies), sorted(reads)


def percentile(sorted_values, fraction):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def stalls(replies, slow_us):
    """Runs of consecutive slow replies: (first send time, count, worst µs)."""
    runs, current = [], None
    for sent, rtt in replies:
        if rtt > slow_us:
            if current is None:
                current = [sent, 0, 0]
            current[1] += 1
            current[2] = max(current[2], rtt)
        elif current is not None:
            runs.append(tuple(current))
            current = None
    if current is not None:
        runs.append(tuple(current))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--slow-ms", type=float, default=10.0)
    args = parser.parse_args()
    replies, reads = load(args.trace)
    if not replies:
        print("no replies in the trace")
        return
    rtts = sorted(rtt for _, rtt in replies)
    print(
        f"replies {len(rtts)}: p50 {percentile(rtts, 0.5) / 1000:.2f} ms, "
        f"p99 {percentile(rtts, 0.99) / 1000:.2f} ms, max {rtts[-1] / 1000:.1f} ms"
    )
    per_bucket = collections.Counter()
    for at, size in reads:
        per_bucket[int(at / BUCKET)] += size
    rates = sorted(per_bucket[b] / BUCKET / 1e6 for b in range(int(replies[-1][0] / BUCKET)))
    if rates:
        print(
            f"read MB/s per {BUCKET * 1000:.0f} ms: min {rates[0]:.0f}, "
            f"p10 {percentile(rates, 0.1):.0f}, p50 {percentile(rates, 0.5):.0f}"
        )
    runs = stalls(replies, args.slow_ms * 1000)
    print(f"stalls (replies over {args.slow_ms:g} ms in a row): {len(runs)}")
    for sent, count, worst in sorted(runs, key=lambda run: -run[2])[:5]:
        print(f"  at {sent:.3f} s: {count} replies, worst {worst / 1000:.1f} ms")
    if runs:
        sent, _, worst = max(runs, key=lambda run: run[2])
        first = int(sent / BUCKET) - 5
        around = [per_bucket[b] / BUCKET / 1e6 for b in range(first, first + 10 + int(worst / 1e6 / BUCKET))]
        print(f"  read MB/s around the worst, from {first * BUCKET:.2f} s:", [round(r) for r in around])


if __name__ == "__main__":
    main()
