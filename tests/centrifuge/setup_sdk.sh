#!/usr/bin/env bash
# Installs Centrifugo's JS SDK (npm `centrifuge`) and `ws` into
# tests/centrifuge/node_modules (once).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ ! -f "$here/node_modules/centrifuge/package.json" || ! -f "$here/node_modules/ws/package.json" ]]; then
    npm install --no-save --no-audit --no-fund --prefix "$here" centrifuge@5.8.0 ws@8.23.0 >&2
fi
