#!/usr/bin/env bash
# Every combination of the crate's cargo features builds without warnings
# (the library; tests and examples are built with all features by the gate),
# and the two slim builds the README promises pull in no dependency of the
# backend or codec they leave out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

features=(tokio uring deflate rustls)
for mask in $(seq 0 $(( (1 << ${#features[@]}) - 1 ))); do
    chosen=()
    for i in "${!features[@]}"; do
        if (( mask & (1 << i) )); then chosen+=("${features[$i]}"); fi
    done
    list=$(IFS=,; echo "${chosen[*]:-}")
    echo "features: [${list}]"
    cargo clippy --quiet --lib --no-default-features --features "$list" -- -D warnings
done

# `stream` (the stream driver alone), `socket`, `hyper`, `axum` and `http2`
# are the stream driver plus a module or two each, `client` the tokio
# groups plus its module (the async socket only with `socket`): checked
# alone, not in every combination; `client` with TLS, with the socket, and
# with each kind of default roots too. `pubsub` is a module on any driver:
# alone, on each driver, and without deflate; `redis` (its bridge) alone
# and with io_uring. `bus` alone, on each driver, on axum, with Redis and
# with the client (its subscriber); `centrifuge` alone, on each driver and
# with Redis. `metrics` (a facade: handles and counts) on each driver.
# `mux` (on the stream driver's tokio) alone and with the socket. `http3`
# (quinn, on the stream driver) alone.
for extra in stream stream,rustls socket hyper axum http2 client client,socket client,rustls \
    client,webpki-roots client,native-roots pubsub pubsub,tokio pubsub,stream pubsub,uring \
    pubsub,tokio,deflate pubsub,uring,deflate redis redis,uring metrics,tokio metrics,uring \
    metrics,pubsub,stream bus bus,tokio bus,uring bus,axum bus,redis bus,client centrifuge centrifuge,tokio centrifuge,uring centrifuge,redis handoff handoff,uring handoff,tokio handoff,tokio,deflate mux mux,socket http3 route; do
    echo "features: [$extra]"
    cargo clippy --quiet --lib --no-default-features --features "$extra" -- -D warnings
done

# The sans-I/O core builds alone, with and without permessage-deflate.
for list in "" deflate; do
    echo "rapidws-core features: [${list}]"
    cargo clippy --quiet -p rapidws-core --lib --no-default-features --features "$list" -- -D warnings
done

# `cargo tree -e normal`: the library's own dependencies, not dev-dependencies.
# (A second argument names another package of the workspace.)
deps_of() {
    cargo tree -e normal --prefix none -p "${2:-rapidws}" --no-default-features --features "$1" \
        ${DEPTH:+--depth "$DEPTH"} |
        awk '{print $1}' | sort -u
}
forbid() {
    local build=$1; shift
    local deps; deps=$(deps_of "$build" "${PACKAGE:-}")
    for crate in "$@"; do
        if grep -qx "$crate" <<<"$deps"; then
            echo "error: --no-default-features --features $build depends on $crate" >&2
            exit 1
        fi
    done
    echo "${PACKAGE:-rapidws} --features $build: none of $*"
}
forbid uring tokio mio zlib-rs rustls
forbid uring,pubsub tokio mio zlib-rs rustls
# Metrics are the facade alone: no exporter, no runtime.
forbid uring,metrics tokio mio zlib-rs rustls metrics-exporter-prometheus metrics-util
# wss on io_uring: rustls, and still no tokio.
forbid uring,rustls tokio tokio-util mio tokio-rustls
forbid tokio io-uring zlib-rs rustls
# The stream driver, and hyper's and axum's upgrades on it: no groups. tokio
# itself uses mio, and h2 atomic-waker, so it is rapidws's own dependencies
# (`DEPTH=1`) that must not name them: the groups' epoll is not compiled.
# No build has tokio-rustls: the stream driver's TLS is rapidws's own.
DEPTH=1 forbid stream mio atomic-waker io-uring zlib-rs rustls
DEPTH=1 forbid axum,http2 mio atomic-waker io-uring
DEPTH=1 forbid http3 mio atomic-waker io-uring hyper
forbid tokio,rustls,client,webpki-roots,axum,http2 tokio-rustls
# The core: no runtime, no sockets, no TLS, whatever its features.
PACKAGE=rapidws-core forbid deflate tokio mio io-uring socket2 rustls hyper
