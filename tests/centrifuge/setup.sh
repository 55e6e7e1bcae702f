#!/usr/bin/env bash
# Creates tests/centrifuge/.venv with Python's protobuf and grpcio-tools
# (once), compiles client.proto into it, and prints the path of its python.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import grpc_tools, google.protobuf" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio-tools==1.85.1 >&2
fi
mkdir -p "$venv/gen"
if [[ ! "$venv/gen/client_pb2.py" -nt "$here/client.proto" ]]; then
    "$venv/bin/python" -m grpc_tools.protoc -I "$here" --python_out="$venv/gen" "$here/client.proto" >&2
fi
echo "$venv/bin/python"
