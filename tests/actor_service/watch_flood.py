"""A hostile prober, run as its own process: hold many idle ``Health/Watch`` streams open.

``python watch_flood.py HOST:PORT N`` opens ``N`` Watch streams without a token,
30 per connection (the actor allows 32 streams per connection), reads the
first status of each, prints ``{"open": k, "refused": r, "codes": {...}}`` as
one JSON line and then holds every stream open until its stdin closes.
"""

from __future__ import annotations

import collections
import json
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_PER_CONNECTION = 30


def main() -> None:
    target, count = sys.argv[1], int(sys.argv[2])
    channels = [
        grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(-(-count // _PER_CONNECTION))
    ]
    request = health_pb2.HealthCheckRequest(service="")
    calls = [
        health_pb2_grpc.HealthStub(channels[i // _PER_CONNECTION]).Watch(request)
        for i in range(count)
    ]
    codes: collections.Counter[str] = collections.Counter()
    for call in calls:
        try:
            next(call)
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
    print(json.dumps({"open": codes["OK"], "refused": count - codes["OK"], "codes": codes}))
    sys.stdout.flush()
    sys.stdin.read()
    for call in calls:
        call.cancel()
    for channel in channels:
        channel.close()


if __name__ == "__main__":
    main()
