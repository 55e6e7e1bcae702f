#!/usr/bin/env bash
# The whole test gate, as run by CI and by hand on a fresh machine:
#   formatting, clippy (warnings are errors), unit + integration + doc tests,
#   and the Autobahn TestSuite cases against the echo example, checked strictly.
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

step "Autobahn TestSuite (strict)"
autobahn/run.sh tokio
