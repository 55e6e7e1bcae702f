#!/usr/bin/env bash
# The whole test gate, as run by CI and by hand on a fresh machine:
#   formatting, clippy (warnings are errors), the import layers, every
#   combination of cargo features, unit + property + integration +
#   doc tests (the permessage-deflate interop tests set up their Python client
#   themselves; the hostile-peer tests are integration tests), the load
#   harness's own checks, the Autobahn TestSuite cases against the echo
#   examples (tokio, io_uring, wss on both, axum's /ws and /stream over
#   HTTP/1.1 and HTTP/2) and the client side (the autobahn_client example
#   against kosoku's fuzzing server), and the gateway example in front of
#   the echo example, checked strictly (all 517 cases on tokio, io_uring and
#   the client; sections 12 and 13 sampled on the others: autobahn/run.sh),
#   a smoke run of every fuzz target, and Miri over the sans-I/O unit tests.
#   On this machine (2 cores) it took 31.9 minutes with its tools installed
#   and a warm build cache (cargo test 9.8 of them, Autobahn 12.6, fuzz
#   beside Miri 5.8), about 41 from a cold cache; the aim is at most 30.
# Everything it needs beyond Rust (stable and nightly), Python 3 and Go it
# installs itself (cargo-fuzz, the Miri component, kosoku, the MSRV
# toolchains through rustup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Disk: with full debug info and incremental caches the gate's build
# outputs came to 11 GB, and CI's disk is shared (one run failed with "No
# space left on device"). Line tables are enough for a failing test's
# backtrace, and a one-shot build gains nothing from incremental caches.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

# Each step says when it started, so a slow gate shows which step grew.
step() { printf '\n== %s (at %d:%02d)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check

step "cargo clippy --workspace --all-targets --all-features -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc: no broken links, private items included"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --document-private-items

step "cargo doc: every link resolves under a user's feature sets too (axum,pubsub; tokio; client,rustls)"
for features in axum,pubsub tokio client,rustls; do
    RUSTDOCFLAGS="-D warnings" cargo doc -p rapidws --no-deps --no-default-features --features "$features"
done

step "README's benchmark figures are BENCHMARKS.md's (.ci/figures.py)"
python3 .ci/figures.py

step "README's ten-line server builds as a project of its own (.ci/readme.sh)"
bash .ci/readme.sh

step "docs.rs: every feature, doc(cfg) marks, missing docs denied (nightly, --cfg docsrs)"
RUSTDOCFLAGS="-D warnings --cfg docsrs" cargo +nightly doc --workspace --all-features --no-deps

step "layers: no import circle, no import up a layer of ARCHITECTURE.md's, in src/ and core/src/ (.ci/imports.py)"
python3 .ci/imports.py

step "the tree: no source over 900 lines outside tests, document links resolve, no tracker numbers (.ci/tree.py)"
python3 .ci/tree.py

step "cargo features: every combination builds clean, the slim builds stay slim (.ci/features.sh)"
bash .ci/features.sh

step "MSRV: each crate builds on the rust-version it declares (.ci/msrv.sh)"
bash .ci/msrv.sh

step "publish: both crates package and build from their packages (cargo publish --dry-run)"
# --allow-dirty: the gate's own steps may leave files behind; what is
# packaged is chosen by each crate's `include` list either way.
# Cargo builds rapidws against the packaged rapidws-core as if it came
# from a registry, and takes a registry crate of the same version to be
# the same: it reuses what it unpacked into its registry sources and what
# it compiled before. Nothing is published yet, so the version has not
# changed while the core has: both go first (a target dir of its own).
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rapidws-core-* target/publish
CARGO_TARGET_DIR=target/publish cargo publish --dry-run --workspace --allow-dirty
rm -rf target/publish

step "cargo test (the workspace: rapidws-core and rapidws)"
cargo test --workspace --all-features
# An example's own unit tests (the bus's query parsing and escapes) run
# only when asked for; `test = true` in Cargo.toml would instead stop
# `cargo test` from building the example's binary, which the integration
# tests start.
cargo test --all-features --example notify_bus

step "load harness: fmt, clippy, unit tests, go vet (it is not run here; see benches/harness/README.md)"
cargo fmt --manifest-path benches/harness/Cargo.toml --all -- --check
cargo clippy --manifest-path benches/harness/Cargo.toml --all-targets -- -D warnings
cargo test --manifest-path benches/harness/Cargo.toml
(cd benches/harness/go && go vet ./...)

# The three targets that run all 517 cases first, so that the short ones
# (325 cases each, see autobahn/run.sh) fill the second core at the end.
step "Autobahn TestSuite (strict), two targets at a time"
autobahn/run.sh tokio client h3 uring tls tls-uring axum-ws axum-stream axum-h2-ws axum-h2-stream gateway one-port

# Miri and the fuzz smoke run side by side: Miri interprets on one core
# while the fuzz targets take the other, one after the other, each for its
# SECONDS (FUZZ_JOBS=1), as they would alone. Miri's output is shown when
# it is done.
#
# Miri covers every module with `unsafe` or lock-free code, and the
# session; the whole sans-I/O set (add proto::write_queue and handshake::)
# takes about 11 minutes under Miri here, too long for CI: see
# docs/testing.md, "Miri".
step "Miri over the sans-I/O unit tests (a subset; the full command is in docs/testing.md), in the background"
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup component add --toolchain nightly miri rust-src
fi
mkdir -p target
cargo +nightly miri test --workspace --lib -- proto::mask proto::deflate proto::session \
    proto::frame proto::utf8 proto::close pool:: connection::keepalive:: driver::read_buf:: \
    handshake::extensions mux:: >target/miri.log 2>&1 &
miri_pid=$!

step "fuzz smoke: every target for ${FUZZ_SMOKE_SECONDS:=15}s from its seeds (fuzz/run.sh), beside Miri"
fuzz_status=0
FUZZ_JOBS=1 fuzz/run.sh "$FUZZ_SMOKE_SECONDS" || fuzz_status=$?

step "Miri: its output"
miri_status=0
wait "$miri_pid" || miri_status=$?
cat target/miri.log
if ((fuzz_status != 0 || miri_status != 0)); then
    echo "fuzz smoke: exit $fuzz_status; Miri: exit $miri_status" >&2
    exit 1
fi
