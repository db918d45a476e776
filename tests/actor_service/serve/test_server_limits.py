"""Unauthenticated callers cannot starve probes or the learner (idle Watch streams, own process)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import grpc
import pytest
from actor_harness import Actor, RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_server_metrics import scrape

from actor_service._serve._limits import MAX_WATCH_STREAMS
from common.rlfleet.v1 import actor_service_pb2 as pb

TOKEN = "flood-test-token"
_FLOOD = pathlib.Path(__file__).parents[1] / "watch_flood.py"


@pytest.fixture
def flood(actor_with_token: Actor):
    """Start the flood process against the actor; yields a function reading its report."""
    processes: list[subprocess.Popen] = []

    def start(count: int) -> dict:
        process = subprocess.Popen(
            [sys.executable, str(_FLOOD), f"127.0.0.1:{actor_with_token.port}", str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        line = process.stdout.readline()
        assert line, f"flood process died (exit {process.poll()})"
        return json.loads(line)

    yield start
    for process in processes:
        process.stdin.close()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        process.stdout.close()


@pytest.fixture
def actor_with_token(make_actor: object) -> Actor:
    return make_actor(token=TOKEN, metrics_port=0)


def test_health_and_learner_keep_working_with_1000_idle_watch_streams_open(
    actor_with_token: Actor, flood: object
) -> None:
    actor = actor_with_token
    report = flood(MAX_WATCH_STREAMS + 40)
    # Up to the documented cap the streams are served; beyond it they are refused at once.
    assert report["open"] == MAX_WATCH_STREAMS >= 1000, report
    assert report["codes"].get("RESOURCE_EXHAUSTED") == 40, report
    refused = scrape(actor.handle.server.metrics_port)["rlfleet_actor_rpc_errors_total"]
    assert refused == {(("code", "RESOURCE_EXHAUSTED"), ("method", "Watch")): 40}
    health = health_pb2_grpc.HealthStub(actor.channel)
    latencies = []
    for _ in range(20):
        start = time.perf_counter()
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        latencies.append(time.perf_counter() - start)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert max(latencies) < 0.1, f"Health/Check took up to {max(latencies) * 1000:.0f} ms"
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    assert actor.stub.Describe(pb.DescribeRequest(), metadata=metadata, timeout=5).num_envs == 2
    session = RawCollect.open(actor.stub, open_request(credits=2), metadata=metadata)
    session.opened()
    session.batch(), session.batch()
    session.cancel()
    with pytest.raises(grpc.RpcError) as error:  # token-less callers still get nothing
        actor.stub.Describe(pb.DescribeRequest(), timeout=5)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
