"""An independent peer of rapidws's Centrifugo codec: Python's protobuf
compiled from client.proto (see setup.sh).

  peer.py commands  prints, one a line, `name hex` of command frames it
                    encodes (varint-delimited Commands in one frame)
  peer.py replies   reads hex frames of replies from stdin, one a line, and
                    prints each frame's replies as a JSON list of objects
                    (protobuf's JSON mapping, proto field names)
"""

import binascii
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv", "gen"))

import client_pb2 as pb  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from google.protobuf.internal import decoder, encoder  # noqa: E402


def frame(*commands):
    out = b""
    for command in commands:
        body = command.SerializeToString()
        out += encoder._VarintBytes(len(body)) + body
    return out


def cases():
    connect = pb.Command(id=1)
    connect.connect.token = "tok.en"
    connect.connect.data = b'{"hello":"world"}'
    connect.connect.name = "python"
    connect.connect.version = "1.0"
    connect.connect.flag = 5  # unknown to rapidws: read past
    connect.connect.headers["x-a"] = "b"
    sub = connect.connect.subs["news"]
    sub.recover = True
    sub.epoch = "abcd"
    sub.offset = 17
    subscribe = pb.Command(id=2)
    subscribe.subscribe.channel = "chat:1"
    subscribe.subscribe.recover = True
    subscribe.subscribe.epoch = "xyz"
    subscribe.subscribe.offset = 2**40 + 3
    subscribe.subscribe.positioned = True
    subscribe.subscribe.recoverable = True
    subscribe.subscribe.join_leave = True
    subscribe.subscribe.delta = "fossil"  # unknown to rapidws
    subscribe.subscribe.flag = -1
    yield "connect_subscribe", frame(connect, subscribe)
    publish = pb.Command(id=3)
    publish.publish.channel = "chat:1"
    publish.publish.data = bytes(range(256))
    yield "publish", frame(publish)
    history = pb.Command(id=4)
    history.history.channel = "h"
    history.history.limit = -1
    history.history.since.offset = 9
    history.history.since.epoch = "e"
    history.history.reverse = True
    yield "history", frame(history)
    pong = pb.Command()
    ping = pb.Command(id=5)
    ping.ping.SetInParent()
    rpc = pb.Command(id=6)
    rpc.rpc.method = "sum"
    rpc.rpc.data = b"[1,2]"
    yield "pong_ping_rpc", frame(pong, ping, rpc)
    misc = []
    for i, field in enumerate(["unsubscribe", "presence", "presence_stats"]):
        c = pb.Command(id=10 + i)
        getattr(c, field).channel = "room"
        misc.append(c)
    send = pb.Command()
    send.send.data = b"x"
    refresh = pb.Command(id=13)
    refresh.refresh.token = "t2"
    sub_refresh = pb.Command(id=14)
    sub_refresh.sub_refresh.channel = "room"
    sub_refresh.sub_refresh.token = "t3"
    yield "misc", frame(*misc, send, refresh, sub_refresh)


def replies():
    for line in sys.stdin:
        data = binascii.unhexlify(line.strip())
        pos, out = 0, []
        while pos < len(data):
            size, pos = decoder._DecodeVarint(data, pos)
            reply = pb.Reply()
            reply.ParseFromString(data[pos:pos + size])
            pos += size
            out.append(json_format.MessageToDict(reply, preserving_proto_field_name=True))
        print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "commands":
        for name, data in cases():
            print(name, data.hex())
    else:
        replies()
