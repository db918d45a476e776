"""Unauthenticated callers cannot starve probes or the learner (idle Watch streams, own process)."""

from __future__ import annotations

import asyncio
import json
import pathlib
import queue
import subprocess
import sys
import time

import grpc
import pytest
from actor_harness import Actor, RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import poll_until
from test_server_metrics import scrape

from actor_service._serve import _limits as limits_module
from actor_service._serve._limits import MAX_REFLECTION_STREAMS, MAX_WATCH_STREAMS
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


def test_a_watch_stream_over_the_cap_is_refused_and_one_that_ends_frees_its_place(
    make_actor: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = (
        ("/grpc.health.v1.Health/Watch", "health watch", 2),
        ("/grpc.reflection.", "reflection", MAX_REFLECTION_STREAMS),
    )
    monkeypatch.setattr(limits_module, "_GROUPS", groups)
    actor = make_actor()
    health = health_pb2_grpc.HealthStub(actor.channel)
    request = health_pb2.HealthCheckRequest()
    watches = [health.Watch(request) for _ in range(2)]
    for watch in watches:
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    refused = health.Watch(request)
    with pytest.raises(grpc.RpcError) as error:
        next(refused)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 health watch streams are open" in error.value.details()
    watches[0].cancel()

    def admitted() -> bool:
        watch = health.Watch(request)
        try:
            return next(watch).status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False
        finally:
            watch.cancel()

    poll_until(admitted, timeout=5, message="the ended stream's place is free")
    watches[1].cancel()


def test_a_reflection_stream_that_ends_frees_its_place(
    make_actor: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = (
        ("/grpc.health.v1.Health/Watch", "health watch", MAX_WATCH_STREAMS),
        ("/grpc.reflection.", "reflection", 1),
    )
    monkeypatch.setattr(limits_module, "_GROUPS", groups)
    actor = make_actor()
    reflection = reflection_pb2_grpc.ServerReflectionStub(actor.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    requests: queue.Queue = queue.Queue()
    held = reflection.ServerReflectionInfo(iter(requests.get, None))
    requests.put(request)
    assert next(held).list_services_response.service
    with pytest.raises(grpc.RpcError) as error:
        list(reflection.ServerReflectionInfo(iter([request]), timeout=5))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    requests.put(None)  # the held stream ends
    assert list(held) == []

    def admitted() -> bool:
        try:
            return len(list(reflection.ServerReflectionInfo(iter([request]), timeout=5))) == 1
        except grpc.RpcError:
            return False

    poll_until(admitted, timeout=5, message="the ended stream's place is free")


def test_one_connection_gets_32_streams_at_a_time_and_a_33rd_waits_for_a_place(
    actor: Actor,
) -> None:
    """HTTP/2's per-connection stream cap: one peer's connection cannot hold every place."""

    async def watch_33() -> tuple[int, bool, bool]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{actor.handle.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            calls = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(33)]
            firsts = [asyncio.ensure_future(call.read()) for call in calls]
            for _ in range(100):  # until 32 are served (10 s at most), then half a second more
                done, waiting = await asyncio.wait(firsts, timeout=0.1)
                if len(done) >= 32:
                    break
            done, waiting = await asyncio.wait(firsts, timeout=0.5)
            served_late = False
            if len(waiting) == 1:
                calls[firsts.index(next(iter(done)))].cancel()  # one place freed
                served_late = bool(await asyncio.wait_for(next(iter(waiting)), timeout=5))
            for call in calls:
                call.cancel()
            return len(done), len(waiting) == 1, served_late

    served, one_waited, served_late = asyncio.run(watch_33())
    assert (served, one_waited, served_late) == (32, True, True)
