#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each, FUZZ_JOBS at
# a time (default 2), starting from the committed seeds in
# fuzz/seeds/<target>/. New inputs the fuzzer finds go to
# fuzz/target/corpus/<target>/ (not committed), crashes to
# fuzz/artifacts/<target>/. Exits non-zero if any target found a crash, a
# hang or a runaway allocation.
#
#   fuzz/run.sh [SECONDS] [TARGET...]    (default: 60 seconds, every target)
#
# Needs the nightly toolchain; installs cargo-fuzz if it is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

seconds="${1:-60}"
shift || true
if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    targets=(frame_header handshake extensions session session_deflate session_handoff inflate client_handshake client_session proxy_header tls_hello forwarded proxy_reply pubsub_handoff mux_frame mux_session h3_request redis_wire)
fi

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

cargo +nightly fuzz build -O

# One target's run; its output goes to target/<target>.log.
run_one() {
    local target=$1 status=0
    local corpus="target/corpus/$target"
    mkdir -p "$corpus"
    # -max_len: the largest seed; longer inputs only slow the search.
    # -timeout: one input taking 10 s is a hang. -rss_limit_mb: bounded memory.
    cargo +nightly fuzz run -O "$target" "$corpus" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"target/$target.log" 2>&1 || status=$?
    return "$status"
}

# FUZZ_JOBS targets at once (default 2, one per core here): each still gets
# SECONDS of one core, as when they ran one after the other.
# shellcheck source=../.ci/pool.sh
source ../.ci/pool.sh
for target in "${targets[@]}"; do
    echo "fuzz: $target for ${seconds}s"
done
pool_run "${FUZZ_JOBS:-2}" run_one "${targets[@]}"

failed=0
for target in "${targets[@]}"; do
    status=0
    pool_wait "$target" || status=$?
    echo "fuzz: $target:"
    grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|stat::peak_rss_mb)' \
        "target/$target.log" || true
    if [[ "$status" -ne 0 ]]; then
        tail -40 "target/$target.log" >&2
        echo "fuzz: $target FAILED; see fuzz/target/$target.log and fuzz/artifacts/$target/" >&2
        failed=1
    fi
done
exit "$failed"
