#!/usr/bin/env bash
# Request latency while the server pushes, on a lossy path: the Stream
# Benchmark's client (`rapidws-load stream`) against the `stream` example,
# over wss (TCP) and over HTTP/3 (RFC 9220, QUIC) in turn, same server
# process, same path. Needs root: the path is two network namespaces joined
# by a veth pair, each side dropping --loss percent of the TCP and UDP
# packets it sends (nftables `numgen random`; this kernel has no netem).
#
#   benches/harness/lossy.sh                       # loss 0, 1, 3 %; 3 rounds
#   benches/harness/lossy.sh --loss 0,3 --rounds 5 --push-size 1048576
#   (also --requests N, --interval-us U: the client's, 1000 and 10000)
#
# Prints one JSON line per run and then a table of medians; the lines are
# also kept in benches/harness/results/lossy.jsonl, the server's log in
# results/lossy-server.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

losses=0,1,3
rounds=3
push_size=10240
requests=1000
interval_us=10000
while [ $# -gt 0 ]; do
    case "$1" in
        --loss) losses=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --push-size) push_size=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --interval-us) interval_us=$2; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "lossy.sh makes network namespaces: run it as root" >&2
    exit 2
fi
for tool in ip:iproute2 nft:nftables openssl:openssl taskset:util-linux python3:python3; do
    command -v "${tool%%:*}" >/dev/null || {
        apt-get update -qq && apt-get install -y -qq "${tool##*:}" >/dev/null
    }
done

server_bin=$repo/target/release/examples/stream
load_bin=$here/target/release/rapidws-load
# Up to date with the tree (quick when nothing changed).
cargo build --release --example stream --manifest-path "$repo/Cargo.toml"
cargo build --release -p rapidws-load --manifest-path "$here/Cargo.toml"

work=$(mktemp -d)
id=$$
server_ns=rwl${id}s
client_ns=rwl${id}c
subnet=10.78.$((id % 250))
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then
        { kill "$server_pid" && wait "$server_pid"; } 2>/dev/null || true
    fi
    ip netns del "$server_ns" 2>/dev/null || true
    ip netns del "$client_ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A certificate for `localhost` (the name the load generator checks), not a CA.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -addext basicConstraints=critical,CA:FALSE \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

ip netns add "$server_ns"
ip netns add "$client_ns"
ip link add "$server_ns" netns "$server_ns" type veth peer name "$client_ns" netns "$client_ns"
for pair in "$server_ns:1" "$client_ns:2"; do
    ns=${pair%%:*}
    ip -n "$ns" addr add "$subnet.${pair##*:}/24" dev "$ns"
    ip -n "$ns" link set "$ns" up
    ip -n "$ns" link set lo up
done

# Each side drops `$1` percent of the TCP and UDP packets it sends.
set_loss() {
    for ns in "$server_ns" "$client_ns"; do
        ip netns exec "$ns" nft flush ruleset
        [ "$1" = 0 ] && continue
        ip netns exec "$ns" nft -f - <<EOF
table inet lossy {
    chain out {
        type filter hook output priority 0; policy accept;
        meta l4proto { tcp, udp } numgen random mod 100 < $1 counter drop
    }
}
EOF
    done
}

addr=$subnet.1:9005
mkdir -p "$here/results"
server_log=$here/results/lossy-server.log
RUST_LOG=info ip netns exec "$server_ns" taskset -c 0 "$server_bin" --addr "$addr" --h3 \
    --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
    --push-size "$push_size" --push-every-us 500 2>"$server_log" &
server_pid=$!
for _ in $(seq 1 100); do
    grep -q "listening" "$server_log" && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "the stream server exited at start; its log: $server_log" >&2
        exit 1
    fi
    sleep 0.1
done
grep -q "listening" "$server_log" || { echo "the stream server did not listen within 10 s" >&2; exit 1; }

# Written whole at the end: a failed sweep leaves the last one's lines.
out=$here/results/lossy.jsonl
runs=$work/runs.jsonl
: >"$runs"
IFS=, read -r -a loss_list <<<"$losses"
for loss in "${loss_list[@]}"; do
    set_loss "$loss"
    for round in $(seq 1 "$rounds"); do
        # Alternate which transport goes first.
        if [ $((round % 2)) = 1 ]; then order="wss h3"; else order="h3 wss"; fi
        for transport in $order; do
            extra=()
            [ "$transport" = h3 ] && extra=(--h3 rfc9220)
            # A run that fails is reported and the sweep goes on.
            if ! line=$(ip netns exec "$client_ns" taskset -c 1 "$load_bin" stream \
                --addr "$addr" --tls-ca "$work/cert.pem" "${extra[@]}" \
                --conns 1 --sources 0 --requests "$requests" --interval-us "$interval_us" --size 36 \
                --warmup 1 | tail -1) || [ -z "$line" ]; then
                echo "loss $loss% $transport round $round: the client failed" >&2
                continue
            fi
            line=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(loss_pct=int(sys.argv[2]), transport=sys.argv[3], round=int(sys.argv[4]), push_size=int(sys.argv[5])); print(json.dumps(d))' \
                "$line" "$loss" "$transport" "$round" "$push_size")
            echo "$line" | tee -a "$runs"
        done
    done
done
cp "$runs" "$out"

python3 - "$out" <<'EOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
print()
print("| loss | transport | runs | p50 ms | p99 ms (range) | max ms | missing | pushes/s |")
print("|---|---|---|---|---|---|---|---|")
for loss in sorted({r["loss_pct"] for r in runs}):
    for transport in ("wss", "h3"):
        mine = [r for r in runs if r["loss_pct"] == loss and r["transport"] == transport]
        if not mine:
            continue
        med = lambda key, scale=1e-3: statistics.median(r[key] * scale for r in mine)
        spread = lambda key: "%.2f-%.2f" % (min(r[key] for r in mine) / 1e3, max(r[key] for r in mine) / 1e3)
        print(f"| {loss}% | {transport} | {len(mine)} | {med('p50_us'):.2f} | "
              f"{med('p99_us'):.2f} ({spread('p99_us')}) | {med('max_us'):.1f} | "
              f"{sum(r['missing'] for r in mine)} | {med('pushes_per_sec', 1):.0f} |")
EOF
