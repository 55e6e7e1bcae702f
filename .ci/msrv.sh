#!/usr/bin/env bash
# The minimum supported Rust versions, as each crate's `rust-version` in its
# Cargo.toml declares them: rapidws-core on its own, and rapidws with every
# feature (its dependencies set the floor: redis 1.8 needs 1.88). The
# toolchains come from rustup, minimal profile; the checks build into a
# target directory of their own so the main one is left alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

declared() {
    sed -n 's/^rust-version = "\(.*\)"/\1/p' "$1" | head -1
}

check() {
    local manifest=$1 package=$2
    local version
    version=$(declared "$manifest")
    if [ -z "$version" ]; then
        echo "msrv: $manifest declares no rust-version" >&2
        exit 1
    fi
    rustup toolchain install "$version" --profile minimal >/dev/null
    echo "msrv: $package on Rust $version"
    CARGO_TARGET_DIR=target/msrv cargo "+$version" check -p "$package" --all-features --lib
}

check core/Cargo.toml rapidws-core
check Cargo.toml rapidws
