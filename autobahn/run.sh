#!/usr/bin/env bash
# Runs the Autobahn TestSuite cases against the echo examples (and our
# client against Autobahn's fuzzing server) and checks the results strictly.
# Usage: autobahn/run.sh [TARGET...]
# (default: tokio uring tls tls-uring axum-ws axum-stream axum-h2-ws axum-h2-stream h3 client gateway
# one-port one-port-tls)
#
# Targets run AUTOBAHN_JOBS at a time (default 2): each has its own server,
# bridge and ports. Each target's output is printed, whole, when it
# finishes.
#
# Sections 12 and 13 (permessage-deflate: 216 cases of 1,000 messages each)
# are 85% of a target's time, nearly all of it kosoku's own CPU, and they
# test the core's codec and the outbox that compresses as it queues, which
# are the same code on every driver. So the targets in AUTOBAHN_FULL
# (default: tokio, client and h3: the server role, the client role, and
# HTTP/3, whose issue asks for every case in the gate) run all 517 cases,
# and the others (io_uring, wss on both backends, the axum endpoints over
# HTTP/1.1 and HTTP/2, the gateway: their transport is what differs, and
# every section but 12 and 13 runs there whole, the large messages of
# section 9 among them) run sections 1 to 10 whole and cases 2 and 5 (64
# B and 4 KiB messages) of every 12.x and 13.x parameter set: 325 cases. (kosoku's patterns match by prefix: `12.*.1`
# would take 12.1.10 to 12.1.18 too.) AUTOBAHN_FULL=all runs every case
# everywhere.
#
# - `tokio`, `uring`: the echo example on that backend;
# - `tls` is wss: the echo example on the tokio backend with a certificate
#   made here (openssl), behind a TLS bridge (socat, installed with apt-get
#   if it is missing) that kosoku, which speaks no TLS, connects to in plain
#   TCP; `tls-uring` the same on the io_uring backend (rustls inside the
#   reactor);
# - `axum-ws`, `axum-stream`: the axum_echo example's `/ws` (a Handler) and
#   `/stream` (the async socket);
# - `axum-h2-ws`, `axum-h2-stream`: the same over HTTP/2 (RFC 8441), through
#   the h2_bridge example, which turns each of kosoku's HTTP/1.1 upgrades into
#   an extended CONNECT on an h2 connection and carries the frames as they
#   are;
# - `h3`: the h3_echo example's `/ws` over HTTP/3 (RFC 9220, QUIC on
#   loopback UDP, a certificate made here), through the h3_bridge example,
#   which opens each of kosoku's WebSockets on the server with an extended
#   CONNECT (rapidws::h3::Client) and carries the frames as they are;
# - `client`: the client side. kosoku runs as the fuzzing server
#   (`-m fuzzingserver`) and the autobahn_client example (`--deflate`: the
#   cases of sections 12 and 13 need it) drives every case through it;
# - `gateway`: the gateway example in front of the echo example (tokio),
#   permessage-deflate on both of its sides;
# - `one-port`, `one-port-tls`: the one_port example's `/ws`, reached
#   through its router (plain, and over TLS behind socat like `tls`).
#   It offers no permessage-deflate, so sections 1 to 10 run (301 cases):
#   what differs there is the routing, not the codec.
#
# - creates autobahn/.venv and installs kosoku==0.1.0 into it (once);
# - builds the echo example (profile `autobahn`: release without LTO) and starts it on a free loopback port;
# - runs the cases (all 517, or the sample above) 16 at a time (the echo server offers permessage-deflate), reports in autobahn/reports/<backend>/;
#   the target's own log in autobahn/reports/<backend>.log;
# - fails unless every case is OK or INFORMATIONAL in both `behavior` and
#   `behaviorClose`, except cases listed in autobahn/expected-failures.txt;
#   a case that kosoku's own kill timer (half a second) ended, its
#   behaviour right, which a loaded machine's stall (or the TLS bridge's)
#   can cause, runs once more alone and is scored by that run (check.py
#   says which, and why).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
if [[ $# -eq 0 ]]; then backends=(tokio uring tls tls-uring axum-ws axum-stream axum-h2-ws axum-h2-stream h3 client gateway one-port one-port-tls); else backends=("$@"); fi

if [[ ! -x "$venv/bin/kosoku" ]]; then
    echo "autobahn: installing kosoku into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check kosoku==0.1.0
fi

echo "autobahn: building the echo examples (profile autobahn: release without LTO)"
(cd "$root" && cargo build --quiet --profile autobahn --features uring,rustls \
    --example echo --example axum_echo --example autobahn_client --example gateway \
    --example h2_bridge --example h3_echo --example h3_bridge --example one_port)
h2_bridge_bin="$root/target/autobahn/examples/h2_bridge"
echo_bin="$root/target/autobahn/examples/echo"
axum_bin="$root/target/autobahn/examples/axum_echo"
client_bin="$root/target/autobahn/examples/autobahn_client"
gateway_bin="$root/target/autobahn/examples/gateway"
h3_bin="$root/target/autobahn/examples/h3_echo"
h3_bridge_bin="$root/target/autobahn/examples/h3_bridge"
one_port_bin="$root/target/autobahn/examples/one_port"

if [[ " ${backends[*]} " == *" tls"* || " ${backends[*]} " == *" one-port-tls "* ]]; then
    command -v socat >/dev/null || { apt-get update -qq && apt-get install -y -qq socat; } >&2
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until something listens on $1 (or the process $2 died).
wait_listening() {
    for _ in $(seq 1 100); do
        if ! kill -0 "$2" 2>/dev/null; then
            return 1
        fi
        if python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

server_pid=""
bridge_pid=""
# The gateway is the "bridge" of its target: stopped first, like the others.
cleanup() {
    for pid in "$bridge_pid" "$server_pid"; do
        if [[ -n "$pid" ]]; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    bridge_pid=""
    server_pid=""
}

# Checks that the bridge started in the background just before (its pid
# in $!) listens on $plain_port; kosoku connects there instead.
bridge_started() { # NAME LOG
    bridge_pid=$!
    if ! wait_listening "$plain_port" "$bridge_pid"; then
        echo "autobahn: the $1 did not start:" >&2
        cat "$2" >&2
        exit 1
    fi
    addr="127.0.0.1:$plain_port"
}

# The cases a target runs: all of them, or the sample described above.
full_targets=" ${AUTOBAHN_FULL:-tokio client h3} "
sample=(-i '1.*' -i '2.*' -i '3.*' -i '4.*' -i '5.*' -i '6.*' -i '7.*' -i '9.*' -i '10.*'
    -i '12.*.2' -i '12.*.5' -i '13.*.2' -i '13.*.5')
sample_cases=325
no_deflate=(-i '1.*' -i '2.*' -i '3.*' -i '4.*' -i '5.*' -i '6.*' -i '7.*' -i '9.*' -i '10.*')
no_deflate_cases=301
all_cases=517

# One target, start to end: its server (and bridge), kosoku, the check.
# Runs in a subshell of its own, so its processes and trap are its own.
run_one() {
    local backend=$1 status=0
    local selection=() cases=$all_cases
    if [[ "$full_targets" != " all " && "$full_targets" != *" $backend "* ]]; then
        selection=("${sample[@]}")
        cases=$sample_cases
    fi
    if [[ "$backend" == one-port* ]]; then
        selection=("${no_deflate[@]}")
        cases=$no_deflate_cases
    fi
    port="$(free_port)"
    addr="127.0.0.1:$port"
    reports="$here/reports/$backend"
    rm -rf "$reports"
    mkdir -p "$reports"

    if [[ "$backend" == client ]]; then
        "$venv/bin/kosoku" -m fuzzingserver --outdir "$reports" "$addr" \
            >"$reports/kosoku.log" 2>&1 &
        server_pid=$!
        if ! wait_listening "$port" "$server_pid"; then
            echo "autobahn: kosoku's fuzzing server did not start:" >&2
            cat "$reports/kosoku.log" >&2
            return 1
        fi
        echo "autobahn: running all cases with the autobahn_client example against ws://$addr"
        RUST_LOG=warn "$client_bin" --url "ws://$addr" --agent rapidws --deflate --parallel 8 \
            >"$reports/client.log" 2>&1 || status=1
        # kosoku writes its reports and exits once the client asked for them.
        for _ in $(seq 1 300); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        cleanup
        python3 "$here/check.py" --backend "$backend" --cases "$all_cases" \
            --index "$reports/index.json" \
            --expected "$here/expected-failures.txt" || status=1
        return "$status"
    fi

    # Every message is compressed (--deflate-min-size 0): kosoku's 12.x/13.x
    # cases error out ("Strings must be encoded before hashing") on an echo
    # that comes back uncompressed, which the default 64-byte minimum does
    # for their 16-byte messages.
    serve=(--addr "$addr" --deflate --deflate-min-size 0)
    server_bin="$echo_bin"
    path=""
    if [[ "$backend" == tls* || "$backend" == h3 || "$backend" == one-port* ]]; then
        # Not a CA (openssl's default for -x509 is): rustls, the h3 bridge's
        # TLS, refuses a CA certificate as a server's own.
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
            -addext "basicConstraints=critical,CA:FALSE" \
            -keyout "$reports/key.pem" -out "$reports/cert.pem" 2>/dev/null
    fi
    if [[ "$backend" == axum-* ]]; then
        server_bin="$axum_bin"
        path="/${backend##*-}"
    elif [[ "$backend" == one-port* ]]; then
        server_bin="$one_port_bin"
        path="/ws"
        serve=(--addr "$addr" --tls-cert "$reports/cert.pem" --tls-key "$reports/key.pem" --files "$reports")
    elif [[ "$backend" == h3 ]]; then
        server_bin="$h3_bin"
        path="/ws"
        serve+=(--tls-cert "$reports/cert.pem" --tls-key "$reports/key.pem")
    elif [[ "$backend" == tls* ]]; then
        tls_backend=tokio
        [[ "$backend" == tls-uring ]] && tls_backend=uring
        serve+=(--backend "$tls_backend" --tls-cert "$reports/cert.pem" --tls-key "$reports/key.pem")
    elif [[ "$backend" == gateway ]]; then
        serve+=(--backend tokio)
    else
        serve+=(--backend "$backend")
    fi
    RUST_LOG=warn "$server_bin" "${serve[@]}" >"$reports/server.log" 2>&1 &
    server_pid=$!
    if ! wait_listening "$port" "$server_pid"; then
        echo "autobahn: the $backend echo server did not start:" >&2
        cat "$reports/server.log" >&2
        return 1
    fi
    if [[ "$backend" == tls* || "$backend" == one-port-tls ]]; then
        # kosoku connects here in plain TCP; socat verifies the server's
        # certificate and carries each connection over TLS.
        plain_port="$(free_port)"
        socat "TCP-LISTEN:$plain_port,bind=127.0.0.1,reuseaddr,fork,nodelay" \
            "OPENSSL:127.0.0.1:$port,cafile=$reports/cert.pem,commonname=localhost,nodelay" \
            2>"$reports/socat.log" &
        bridge_started "TLS bridge" "$reports/socat.log"
    fi

    if [[ "$backend" == gateway ]]; then
        plain_port="$(free_port)"
        RUST_LOG=warn "$gateway_bin" --addr "127.0.0.1:$plain_port" --upstream "ws://$addr/" \
            --deflate --deflate-min-size 0 --upstream-deflate >"$reports/gateway.log" 2>&1 &
        bridge_started gateway "$reports/gateway.log"
    fi

    if [[ "$backend" == axum-h2-* ]]; then
        plain_port="$(free_port)"
        RUST_LOG=warn "$h2_bridge_bin" --listen "127.0.0.1:$plain_port" --server "$addr" \
            2>"$reports/bridge.log" &
        bridge_started "h2 bridge" "$reports/bridge.log"
    fi

    if [[ "$backend" == h3 ]]; then
        # kosoku connects here over TCP; the bridge opens each WebSocket on
        # h3_echo over HTTP/3 (the TCP port it listens on is the UDP one's).
        plain_port="$(free_port)"
        RUST_LOG=warn "$h3_bridge_bin" --listen "127.0.0.1:$plain_port" --server "$addr" \
            --ca "$reports/cert.pem" 2>"$reports/bridge.log" &
        bridge_started "h3 bridge" "$reports/bridge.log"
    fi

    echo "autobahn: running $cases cases against $backend at ws://$addr$path"
    "$venv/bin/kosoku" --parallelism 16 "${selection[@]}" --outdir "$reports" "ws://$addr$path" \
        >"$reports/kosoku.log" 2>&1 || true
    # Cases kosoku's own stall failed after a clean close (check.py says
    # which) run once more, alone, against the same server.
    local again=() rerun=()
    mapfile -t again < <(python3 "$here/check.py" --backend "$backend" --stalled \
        --index "$reports/index.json" --expected "$here/expected-failures.txt" 2>/dev/null)
    if [[ ${#again[@]} -gt 0 ]]; then
        echo "autobahn: running ${again[*]} again: kosoku's kill timer ended them after a clean close"
        local picks=()
        for case_id in "${again[@]}"; do picks+=(-i "$case_id"); done
        "$venv/bin/kosoku" --parallelism 1 "${picks[@]}" --outdir "$reports/rerun" "ws://$addr$path" \
            >"$reports/kosoku-rerun.log" 2>&1 || true
        rerun=(--rerun "$reports/rerun/index.json")
    fi
    cleanup

    python3 "$here/check.py" --backend "$backend" --cases "$cases" \
        --index "$reports/index.json" "${rerun[@]}" \
        --expected "$here/expected-failures.txt" || status=1
    return "$status"
}

# One target in the background: its output in reports/<target>.log.
start_one() {
    echo "autobahn: starting $1"
    (
        trap cleanup EXIT
        run_one "$1"
    ) >"$here/reports/$1.log" 2>&1
}

# shellcheck source=../.ci/pool.sh
source "$root/.ci/pool.sh"
mkdir -p "$here/reports"
pool_run "${AUTOBAHN_JOBS:-2}" start_one "${backends[@]}"

status=0
for backend in "${backends[@]}"; do
    result=0
    pool_wait "$backend" || result=$?
    echo
    echo "== autobahn: $backend ($( ((result == 0)) && echo passed || echo FAILED))"
    cat "$here/reports/$backend.log"
    ((result == 0)) || status=1
done
exit "$status"
