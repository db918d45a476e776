"""A live actor fed fuzzed weight pushes, state loads and collect settings stays healthy.

Each fuzzed call must end with a documented status (never INTERNAL or UNKNOWN), change
nothing, and leave the actor answering health and taking a good push afterwards.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import grpc
import hypothesis.strategies as st
import pytest
import torch
from actor_harness import Actor, RawCollect, open_request, small_config
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until
from hypothesis import HealthCheck, given, settings

from actor_service import create_server
from actor_service._core._state import state_to_blob
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import encode_weights, iter_blob_chunks, sha256_hex

DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
FUZZ = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Actor, dict]]:
    handle = create_server(small_config(max_weight_bytes=1 << 20)).run_in_thread()
    channel = grpc.insecure_channel(f"127.0.0.1:{handle.port}")
    actor = Actor(handle, channel, pb_grpc.ActorServiceStub(channel))
    weights = {k: v.clone() for k, v in actor.worker.models.module("policy").state_dict().items()}
    yield actor, weights
    channel.close()
    handle.stop(grace=1.0)


def _mutate(blob: bytes, data: st.DataObject) -> bytes:
    out = bytearray(blob)
    header_end = min(len(out), 8 + struct.unpack_from("<Q", blob)[0])
    at = data.draw(st.integers(0, header_end - 1))  # the data bytes are not checked: leave them
    op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
    if op == "flip" and at < len(out):
        out[at] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del out[at:]
    elif op == "insert":
        out[at:at] = data.draw(st.binary(min_size=1, max_size=32))
    else:
        del out[at : at + data.draw(st.integers(1, 32))]
    return bytes(out)


def _chunks(header: object, blob: bytes, kind: type) -> Iterator:
    yield kind(header=header)
    for piece in iter_blob_chunks(blob, 1000):
        yield kind(chunk=bytes(piece))


def _documented(call) -> None:
    try:
        call()
    except grpc.RpcError as exc:
        code = exc.code(), exc.details()
    else:
        return
    assert code[0] in DOCUMENTED, code


def _healthy(actor: Actor, weights: dict) -> None:
    health = health_pb2_grpc.HealthStub(actor.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == (
        health_pb2.HealthCheckResponse.SERVING
    )
    now = actor.worker.models.module("policy").state_dict()
    assert all(torch.equal(now[k], v) for k, v in weights.items()), "a fuzzed call changed weights"
    assert not actor.handle.server.runtime.busy


@FUZZ
@given(data=st.data(), version=st.integers(0, 2**64 - 1))
def test_fuzzed_pushes_end_documented_and_change_nothing(live, data, version) -> None:
    actor, weights = live
    blob = _mutate(encode_weights(weights), data)
    header = pb.WeightsHeader(version=version, total_bytes=len(blob), sha256=sha256_hex(blob))
    _documented(
        lambda: actor.stub.PushWeights(_chunks(header, blob, pb.PushWeightsRequest), timeout=30)
    )
    _healthy(actor, weights)


@FUZZ
@given(
    data=st.data(),
    version=st.integers(0, 2**64 - 1),
    index=st.integers(0, 2**32 - 1),
    count=st.integers(0, 2**32 - 1),
)
def test_fuzzed_parts_end_documented_and_change_nothing(live, data, version, index, count) -> None:
    actor, weights = live
    half = dict(sorted(weights.items())[::2])  # every part holds the same half: none completes
    blob = encode_weights(half, subset=True)
    if data.draw(st.booleans()):
        blob = _mutate(blob, data)
    header = pb.WeightsHeader(
        version=version,
        total_bytes=len(blob),
        sha256=sha256_hex(blob),
        part=pb.PartOf(index=index, count=count),
    )
    _documented(
        lambda: actor.stub.PushWeights(_chunks(header, blob, pb.PushWeightsRequest), timeout=30)
    )
    _healthy(actor, weights)


@FUZZ
@given(data=st.data(), rollback=st.booleans())
def test_fuzzed_state_loads_end_documented_and_change_nothing(live, data, rollback) -> None:
    actor, weights = live
    state = {"models": {"policy": {"version": 0, "weights": weights}}}
    state |= {"frames": 0, "batches": 0, "traj_counter": 0}
    blob = _mutate(state_to_blob(state), data)
    header = pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob), allow_rollback=rollback)
    _documented(lambda: actor.stub.LoadState(_chunks(header, blob, pb.StateChunk), timeout=30))
    _healthy(actor, weights)


@FUZZ
@given(
    frames_per_batch=st.integers(0, 2**64 - 1),
    max_frames_per_traj=st.integers(-(2**63), 2**63 - 1),
    total_frames=st.integers(-(2**63), 2**63 - 1),
    exploration_type=st.integers(0, 2**31 - 1),
    model_id=st.text(max_size=40),
)
def test_fuzzed_collect_settings_end_documented(live, **fields) -> None:
    actor, weights = live
    session = RawCollect.open(actor.stub, open_request(credits=0, **fields))
    message = session.next()
    if isinstance(message, grpc.RpcError):
        assert message.code() in DOCUMENTED, (message.code(), message.details())
    else:
        assert message.WhichOneof("kind") == "opened"
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    _healthy(actor, weights)


def _raw(channel: grpc.Channel, method: object) -> object:
    """``method`` of ActorService on ``channel``, its requests sent as the bytes given."""
    kind = (
        ("stream" if method.client_streaming else "unary")
        + "_"
        + ("stream" if method.server_streaming else "unary")
    )
    return getattr(channel, kind)(
        f"/rlfleet.v1.ActorService/{method.name}", request_serializer=bytes
    )


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab"])  # bad tag, cut field
def test_every_method_answers_bytes_that_do_not_parse_invalid_argument(live, garbage) -> None:
    """A request that is no protobuf message (another protocol on the port, a damaged
    frame) is the peer's INVALID_ARGUMENT naming the message, from every method, as the
    first message or mid-stream; not UNKNOWN or INTERNAL (with a traceback per call).
    """
    actor, weights = live
    service = pb.DESCRIPTOR.services_by_name["ActorService"]
    for method in service.methods:
        call = _raw(actor.channel, method)
        first = iter([garbage]) if method.client_streaming else garbage
        with pytest.raises(grpc.RpcError) as raised:
            list(call(first, timeout=20)) if method.server_streaming else call(first, timeout=20)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method.name
        assert f"a {method.input_type.name} of {len(garbage)} bytes" in raised.value.details()
    opened = pb.CollectRequest(open=open_request()).SerializeToString()
    collect = _raw(actor.channel, service.methods_by_name["Collect"])
    with pytest.raises(grpc.RpcError) as raised:
        list(collect(iter([opened, garbage]), timeout=20))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _healthy(actor, weights)
