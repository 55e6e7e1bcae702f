"""QPACK as aioquic speaks it (pylsqpack, on ls-qpack), for tests/h3_qpack.rs.

One JSON object a line on stdin, one answer a line on stdout:
  {"encode": [[name_hex, value_hex], ...]} -> {"block": hex}
  {"decode": hex}                          -> {"fields": [[name_hex, value_hex], ...]}
                                           or {"error": "..."}
Both sides as rapidws sets them: no dynamic table, no blocked streams.
"""

import json
import sys

import pylsqpack

encoder = pylsqpack.Encoder()
# The peer's settings (ours): table capacity 0, blocked streams 0.
encoder.apply_settings(0, 0)
decoder = pylsqpack.Decoder(0, 0)
stream_id = 0

for line in sys.stdin:
    request = json.loads(line)
    stream_id += 4
    if "encode" in request:
        fields = [(bytes.fromhex(n), bytes.fromhex(v)) for n, v in request["encode"]]
        _, block = encoder.encode(stream_id, fields)
        answer = {"block": block.hex()}
    else:
        try:
            _, fields = decoder.feed_header(stream_id, bytes.fromhex(request["decode"]))
            answer = {"fields": [[n.hex(), v.hex()] for n, v in fields]}
        except Exception as error:  # the test prints what failed
            answer = {"error": f"{type(error).__name__}: {error}"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
