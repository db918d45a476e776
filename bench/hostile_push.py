"""What a hostile weight push costs an actor: peak memory, refusal time, health latency.

Workload: one ``python -m actor_service`` (CartPole-v1, the ``"mlp"`` policy)
receives a weight push whose safetensors header lists ``--keys`` zero-size
tensors (300,000 by default: a ~17 MB blob). Reported: the actor's peak
resident memory (``VmHWM``) before and after the push, how long the push took
to be refused, and the slowest ``grpc.health.v1.Health/Check`` answered while
it was being decoded (a thread asks every 10 ms).

Target: refused with INVALID_ARGUMENT, peak memory growth within a few times
the blob size, health under 100 ms.

Usage: ``python -m bench.hostile_push [--keys 300000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import iter_blob_chunks, sha256_hex

__all__ = ["hostile_blob", "main"]

_READY = re.compile(r"rlfleet-actor ready worker_id=(\d+) port=(\d+)")


def hostile_blob(keys: int) -> bytes:
    """A valid safetensors file whose header lists ``keys`` zero-size float32 tensors."""
    header = {f"k{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(keys)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _requests(blob: bytes) -> Iterator[pb.PushWeightsRequest]:
    header = pb.WeightsHeader(version=1, total_bytes=len(blob), sha256=sha256_hex(blob))
    yield pb.PushWeightsRequest(header=header)
    for piece in iter_blob_chunks(blob):
        yield pb.PushWeightsRequest(chunk=bytes(piece))


def _health_watch(channel: grpc.Channel, stop: threading.Event, worst: list[float]) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    while not stop.is_set():
        start = time.perf_counter()
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        worst[0] = max(worst[0], time.perf_counter() - start)
        time.sleep(0.01)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=300_000, help="zero-size tensors in the header")
    args = parser.parse_args(argv)
    blob = hostile_blob(args.keys)
    argv_actor = [sys.executable, "-m", "actor_service", "--port", "0", "--host", "127.0.0.1"]
    actor = subprocess.Popen(argv_actor, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert actor.stdout is not None
        match = None
        while match is None:
            line = actor.stdout.readline()
            if not line:
                raise RuntimeError("the actor exited before it was ready")
            match = _READY.search(line)
        with grpc.insecure_channel(f"127.0.0.1:{match.group(2)}") as channel:
            stub = pb_grpc.ActorServiceStub(channel)
            stub.Describe(pb.DescribeRequest(), timeout=30)
            before = _peak_mb(actor.pid)
            stop, worst = threading.Event(), [0.0]
            prober = threading.Thread(target=_health_watch, args=(channel, stop, worst))
            prober.start()
            start = time.perf_counter()
            try:
                stub.PushWeights(_requests(blob), timeout=60)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            elapsed = time.perf_counter() - start
            time.sleep(0.1)
            stop.set()
            prober.join()
            after = _peak_mb(actor.pid)
    finally:
        actor.terminate()
        actor.wait(30)
    result = {
        "keys": args.keys,
        "blob_mb": round(len(blob) / 2**20, 1),
        "status": code,
        "push_s": round(elapsed, 3),
        "peak_rss_before_mb": round(before, 1),
        "peak_rss_after_mb": round(after, 1),
        "peak_growth_mb": round(after - before, 1),
        "worst_health_check_ms": round(worst[0] * 1000, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
