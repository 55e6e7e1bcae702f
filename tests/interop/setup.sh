#!/usr/bin/env bash
# Creates tests/interop/.venv with what the interop tests drive (once): the
# Python `websockets` client and aioquic (QUIC, HTTP/3, and its QPACK,
# pylsqpack); prints the path of its python.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import websockets, aioquic, pylsqpack" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check websockets==17.4 aioquic==1.7.2 >&2
fi
echo "$venv/bin/python"
