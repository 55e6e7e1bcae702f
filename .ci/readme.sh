#!/usr/bin/env bash
# README's "Echo server in ten lines", built as a user's own project would
# build it: a new cargo project whose dependencies are the README's
# `[dependencies]` block (rapidws by this checkout's path instead of the
# README's `../rapidws`) and
# whose `src/main.rs` is the README's Rust block, nothing added.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
project=$(mktemp -d)
trap 'rm -rf "$project"' EXIT

# The first ```toml and the first ```rust block after the section's title.
python3 - "$repo/README.md" "$project" "$repo" <<'PY'
import re, sys, pathlib
readme, project, repo = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
text = open(readme).read()
section = text[text.index("## Echo server in ten lines"):]
toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
rust = re.search(r"```rust[^\n]*\n(.*?)```", section, re.S).group(1)
lines = []
for line in toml.splitlines():
    if line.startswith("rapidws ="):
        line = f'rapidws = {{ path = "{repo}" }}'
    lines.append(line)
(project / "src").mkdir(parents=True)
(project / "Cargo.toml").write_text(
    '[package]\nname = "readme-echo"\nversion = "0.0.0"\nedition = "2024"\n\n'
    + "\n".join(lines) + "\n\n[workspace]\n"
)
(project / "src" / "main.rs").write_text(rust)
PY
cat "$project/Cargo.toml"
# Its own lock file (fresh versions, as a new user gets) and target dir.
CARGO_TARGET_DIR="$repo/target/readme" cargo build --manifest-path "$project/Cargo.toml"
echo "readme: the ten-line server builds on its own"
