#!/usr/bin/env bash
# Runs the Autobahn TestSuite cases against the echo example and checks the
# results strictly. Usage: autobahn/run.sh [BACKEND...]   (default: tokio uring)
#
# - creates autobahn/.venv and installs kosoku==0.1.0 into it (once);
# - builds the echo example (release) and starts it on a free loopback port;
# - runs all 517 cases in parallel (the echo server offers permessage-deflate), reports in autobahn/reports/<backend>/;
# - fails unless every case is OK or INFORMATIONAL in both `behavior` and
#   `behaviorClose`, except cases listed in autobahn/expected-failures.txt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
if [[ $# -eq 0 ]]; then backends=(tokio uring); else backends=("$@"); fi

if [[ ! -x "$venv/bin/kosoku" ]]; then
    echo "autobahn: installing kosoku into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check kosoku==0.1.0
fi

echo "autobahn: building the echo example"
(cd "$root" && cargo build --quiet --release --features uring --example echo)
echo_bin="$root/target/release/examples/echo"

server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

status=0
for backend in "${backends[@]}"; do
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    addr="127.0.0.1:$port"
    reports="$here/reports/$backend"
    rm -rf "$reports"
    mkdir -p "$reports"

    # Every message is compressed (--deflate-min-size 0): kosoku's 12.x/13.x
    # cases error out ("Strings must be encoded before hashing") on an echo
    # that comes back uncompressed, which the default 64-byte minimum does
    # for their 16-byte messages.
    RUST_LOG=warn "$echo_bin" --addr "$addr" --backend "$backend" \
        --deflate --deflate-min-size 0 >"$reports/server.log" 2>&1 &
    server_pid=$!
    # Wait until it listens (or died).
    for _ in $(seq 1 100); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "autobahn: the $backend echo server exited:" >&2
            cat "$reports/server.log" >&2
            exit 1
        fi
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),0.2)" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done

    echo "autobahn: running all cases against the $backend backend at $addr"
    "$venv/bin/kosoku" --parallelism 16 --outdir "$reports" "$addr" >"$reports/kosoku.log" 2>&1 || true
    cleanup
    server_pid=""

    python3 "$here/check.py" --backend "$backend" \
        --index "$reports/index.json" \
        --expected "$here/expected-failures.txt" || status=1
done
exit "$status"
