#!/usr/bin/env bash
# Builds rapidws's examples, the Rust baselines and load generator, and the Go
# baselines (from crates.io and the Go module proxy), then runs every scenario
# and writes BENCHMARKS.md. Arguments go to the runner; see `--help`, e.g.
#   benches/harness/run.sh --rounds 1 --duration 2 --servers rapidws-tokio,fastwebsockets
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

cargo build --release --features uring,rustls --examples --manifest-path "$repo/Cargo.toml"
cargo build --release --manifest-path "$here/Cargo.toml"
mkdir -p "$here/target/go"
(cd "$here/go" && go build -trimpath -o "$here/target/go/" ./cmd/...)
# Centrifugo itself, for the scenario that meets it (built from the Go module
# proxy, once: about 3 minutes). The version is stamped as its release builds
# do, and the runner checks it (servers.rs, CENTRIFUGO_VERSION).
centrifugo_version=v6.9.1
built=$("$here/target/go/centrifugo" version 2>/dev/null || true)
if [[ "$built" != "Centrifugo $centrifugo_version "* ]]; then
  GOBIN="$here/target/go" go install \
    -ldflags "-X github.com/centrifugal/centrifugo/v6/internal/build.Version=${centrifugo_version#v}" \
    "github.com/centrifugal/centrifugo/v6@$centrifugo_version"
fi

exec "$here/target/release/bench" --repo "$repo" "$@"
