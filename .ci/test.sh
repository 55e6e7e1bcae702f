#!/usr/bin/env bash
# The whole test gate, as run by CI and by hand on a fresh machine:
#   formatting, clippy (warnings are errors), unit + integration + doc tests
#   (the permessage-deflate interop tests set up their Python client themselves),
#   the load harness's own checks, and the Autobahn TestSuite cases against the
#   echo example, checked strictly.
# Everything it needs beyond Rust and Python 3 it installs itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets --all-features -D warnings"
cargo clippy --all-targets --all-features -- -D warnings

step "cargo test"
cargo test --all-features

step "load harness: fmt, clippy, unit tests, go vet (it is not run here; see benches/harness/README.md)"
cargo fmt --manifest-path benches/harness/Cargo.toml --all -- --check
cargo clippy --manifest-path benches/harness/Cargo.toml --all-targets -- -D warnings
cargo test --manifest-path benches/harness/Cargo.toml
(cd benches/harness/go && go vet ./...)

step "Autobahn TestSuite (strict)"
autobahn/run.sh tokio uring
