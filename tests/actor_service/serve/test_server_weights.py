"""PushWeights on an in-process actor: applied pushes change actions; bad pushes change nothing."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import threading
import tracemalloc
from collections.abc import Iterator

import grpc
import pytest
import torch
from actor_harness import Actor, RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until

from actor_service._serve._logging import configure_logging, get_logger
from bench.hostile_push import hostile_blob
from common.config import LEARNER_ID_METADATA, TAKE_OVER_METADATA
from common.errors import RlfleetError, WeightsError, WeightsTooLargeError
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import encode_weights, iter_blob_chunks, sha256_hex
from common.weights._blobs import crc32c
from learner_client._transport import ActorChannel, push_messages

DETERMINISTIC = pb.EXPLORATION_TYPE_DETERMINISTIC


def _policy_shapes(stub: pb_grpc.ActorServiceStub, model_id: str = "policy") -> dict:
    described = stub.Describe(pb.DescribeRequest(), timeout=10)
    model = next(m for m in described.models if m.model_id == model_id)
    return {p.name: (tuple(p.shape), getattr(torch, p.dtype)) for p in model.parameters}


def _favouring(shapes: dict, action: int) -> dict[str, torch.Tensor]:
    """Weights under which the MLP's logits are its last bias: one-hot on ``action``."""
    state = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in shapes.items()}
    last_bias = [n for n in state if n.endswith("bias")][-1]
    state[last_bias][action] = 10.0
    return state


def _requests(
    blob: bytes,
    version: int,
    model_id: str = "policy",
    sha256: str | None = None,
    total_bytes: int | None = None,
) -> Iterator[pb.PushWeightsRequest]:
    yield pb.PushWeightsRequest(
        header=pb.WeightsHeader(
            model_id=model_id,
            version=version,
            total_bytes=len(blob) if total_bytes is None else total_bytes,
            sha256=sha256_hex(blob) if sha256 is None else sha256,
        )
    )
    for piece in iter_blob_chunks(blob, 1000):
        yield pb.PushWeightsRequest(chunk=bytes(piece))


def _push(actor: Actor, state: dict, version: int, **kw: object) -> pb.PushWeightsResponse:
    return actor.stub.PushWeights(_requests(encode_weights(state), version, **kw), timeout=30)


def _actions(actor: Actor, n_batches: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    session = RawCollect.open(
        actor.stub,
        open_request(frames_per_batch=20, credits=n_batches, exploration_type=DETERMINISTIC),
    )
    session.opened()
    batches = [session.batch()[1] for _ in range(n_batches)]
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy)
    action = torch.cat([b["action"] for b in batches])
    index = action.argmax(-1) if action.dim() == 3 else action
    return index, torch.cat([b["policy_version"] for b in batches])


def _assert_unchanged(actor: Actor, version: int) -> None:
    described = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert next(m.version for m in described.models if m.model_id == "policy") == version
    health = health_pb2_grpc.HealthStub(actor.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == (
        health_pb2.HealthCheckResponse.SERVING
    )


def test_push_weights_changes_actions_and_policy_version(actor: Actor) -> None:
    shapes = _policy_shapes(actor.stub)
    response = _push(actor, _favouring(shapes, 1), version=1)
    assert (response.worker_id, response.model_id, response.version) == (0, "policy", 1)
    # The process that answered: its Describe's epoch (never 0).
    assert response.epoch == actor.stub.Describe(pb.DescribeRequest(), timeout=10).epoch != 0
    actions, versions = _actions(actor)
    assert (actions == 1).all()
    assert (versions == 1).all()
    _push(actor, _favouring(shapes, 0), version=2)
    actions, versions = _actions(actor)
    assert (actions == 0).all()
    assert (versions == 2).all()
    _assert_unchanged(actor, 2)


def test_push_weights_applies_between_batches_of_a_live_session(actor: Actor) -> None:
    shapes = _policy_shapes(actor.stub)
    _push(actor, _favouring(shapes, 0), version=1)
    session = RawCollect.open(
        actor.stub, open_request(frames_per_batch=20, credits=1, exploration_type=DETERMINISTIC)
    )
    session.opened()
    first_info, _first = session.batch()
    _push(actor, _favouring(shapes, 1), version=2)
    session.credit(1)
    info, second = session.batch()
    session.cancel()
    assert (first_info.policy_version_min, first_info.policy_version_max) == (1, 1)
    assert (info.policy_version_min, info.policy_version_max) == (2, 2)
    assert (second["action"].argmax(-1) == 1).all()


def _state_requests(blob: bytes) -> Iterator[pb.StateChunk]:
    yield pb.StateChunk(header=pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob)))
    for piece in iter_blob_chunks(blob, 4096):
        yield pb.StateChunk(chunk=bytes(piece))


def test_push_weights_state_and_seeds_of_another_learner_are_refused_while_a_session_holds(
    actor: Actor,
) -> None:
    """A second learner's push, state load and reseed are refused as its ``open`` is
    (RESOURCE_EXHAUSTED naming the owner and take_over): they used to change the weights,
    state and envs the first learner's session collects with. Its own learner's push, a
    learner taking over, a call naming no learner (an older learner) and a rank's part of a
    multi-part push are taken."""
    shapes = _policy_shapes(actor.stub)
    _push(actor, _favouring(shapes, 0), version=1)
    state = b"".join(c.chunk for c in actor.stub.GetState(pb.GetStateRequest(), timeout=30))
    session = RawCollect.open(actor.stub, open_request(credits=0, learner_id="learner-A"))
    session.opened()

    def caller(learner_id: str, *more: tuple[str, str]) -> tuple[tuple[str, str | bytes], ...]:
        return ((LEARNER_ID_METADATA, learner_id.encode()), *more)

    blob = encode_weights(_favouring(shapes, 1))
    calls = {
        "push": lambda meta: actor.stub.PushWeights(_requests(blob, 2), timeout=30, metadata=meta),
        "seed": lambda meta: actor.stub.SetSeed(
            pb.SetSeedRequest(seed=3), timeout=30, metadata=meta
        ),
        "state": lambda meta: actor.stub.LoadState(
            _state_requests(state), timeout=30, metadata=meta
        ),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            call(caller("learner-B"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, name
        assert "learner-A" in refused.value.details()
        assert "take_over" in refused.value.details()
    _assert_unchanged(actor, 1)
    for version, meta in enumerate(
        [caller("learner-A"), caller("learner-B", (TAKE_OVER_METADATA, "1")), ()], start=2
    ):
        actor.stub.PushWeights(_requests(blob, version), timeout=30, metadata=meta)
        _assert_unchanged(actor, version)
    # Every rank sends its part of a version to every actor, other ranks' too: taken.
    key = next(iter(shapes))
    part = encode_weights({key: torch.zeros(shapes[key][0])}, subset=True)
    header = pb.WeightsHeader(
        version=5, total_bytes=len(part), sha256=sha256_hex(part), part=pb.PartOf(count=2)
    )
    messages = [pb.PushWeightsRequest(header=header), pb.PushWeightsRequest(chunk=part)]
    reply = actor.stub.PushWeights(iter(messages), timeout=30, metadata=caller("learner-B"))
    assert reply.outcome == pb.PUSH_OUTCOME_STAGED
    session.cancel()


def _bad_pushes(shapes: dict) -> list:
    good = _favouring(shapes, 1)
    name = next(iter(good))
    wrong_shape = dict(good) | {name: torch.zeros(3, 3)}
    nan = {k: v.clone() for k, v in good.items()}
    nan[name].view(-1)[0] = float("nan")
    extra = dict(good) | {"surprise.weight": torch.zeros(2)}
    blob = encode_weights(good)
    return [
        ("wrong_shape", encode_weights(wrong_shape), {}, grpc.StatusCode.INVALID_ARGUMENT, name),
        ("nan", encode_weights(nan), {}, grpc.StatusCode.INVALID_ARGUMENT, name),
        ("unknown_key", encode_weights(extra), {}, grpc.StatusCode.INVALID_ARGUMENT, "surprise"),
        ("unknown_model", blob, {"model_id": "critic"}, grpc.StatusCode.NOT_FOUND, "critic"),
        ("long_model_id", blob, {"model_id": "p" * 10_000}, grpc.StatusCode.INVALID_ARGUMENT, "64"),
        ("sha_mismatch", blob, {"sha256": "0" * 64}, grpc.StatusCode.DATA_LOSS, "sha256"),
        ("over_cap", blob, {"total_bytes": 10**9}, grpc.StatusCode.RESOURCE_EXHAUSTED, "cap"),
        (
            "truncated",
            blob,
            {"total_bytes": len(blob) + 5},
            grpc.StatusCode.INVALID_ARGUMENT,
            "incomplete",
        ),
        ("garbage", b"\x00" * 64, {}, grpc.StatusCode.INVALID_ARGUMENT, "weights"),
    ]


@pytest.mark.parametrize(
    "label",
    [
        "wrong_shape",
        "nan",
        "unknown_key",
        "unknown_model",
        "long_model_id",
        "sha_mismatch",
        "over_cap",
        "truncated",
        "garbage",
    ],
)
def test_push_weights_raises_if_push_is_bad(make_actor: object, label: str) -> None:
    actor = make_actor(max_weight_bytes=10**6)
    shapes = _policy_shapes(actor.stub)
    _, blob, kw, code, needle = next(c for c in _bad_pushes(shapes) if c[0] == label)
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(_requests(blob, 5, **kw), timeout=30)
    assert error.value.code() == code, label
    assert needle in error.value.details(), (label, error.value.details())
    _assert_unchanged(actor, 0)
    assert (_actions(actor)[1] == 0).all()


def test_a_push_over_the_cap_reaches_the_learner_as_weights_too_large(make_actor: object) -> None:
    # RESOURCE_EXHAUSTED came back as ActorBusyError: `except WeightsError` missed it.
    actor = make_actor(max_weight_bytes=10**6)
    blob = bytes(2 * 10**6)

    async def push_over_the_cap() -> RlfleetError:
        channel = ActorChannel(f"127.0.0.1:{actor.handle.port}")
        try:
            messages = push_messages("policy", 1, blob, "", 65536, crc32c=crc32c(blob))
            with pytest.raises(RlfleetError) as refused:
                await channel.push_weights("policy", 1, messages, 30.0)
            return refused.value
        finally:
            await channel.close()

    refused = asyncio.run(push_over_the_cap())
    assert isinstance(refused, WeightsTooLargeError), repr(refused)
    assert isinstance(refused, WeightsError)
    assert "exceeds the cap" in str(refused)
    _assert_unchanged(actor, 0)


def test_push_weights_raises_if_version_is_stale(actor: Actor) -> None:
    shapes = _policy_shapes(actor.stub)
    _push(actor, _favouring(shapes, 1), version=3)
    for version in (3, 2):
        with pytest.raises(grpc.RpcError) as error:
            _push(actor, _favouring(shapes, 0), version=version)
        assert error.value.code() == grpc.StatusCode.ABORTED
    _assert_unchanged(actor, 3)
    assert (_actions(actor)[0] == 1).all()


@pytest.mark.parametrize("version", [2**63, 2**64 - 1])
def test_push_weights_raises_if_version_does_not_fit_int64(actor: Actor, version: int) -> None:
    shapes = _policy_shapes(actor.stub)
    with pytest.raises(grpc.RpcError) as error:
        _push(actor, _favouring(shapes, 1), version=version)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(version) in error.value.details()
    _assert_unchanged(actor, 0)
    assert (_actions(actor)[1] == 0).all()  # batches still flow, at the old version
    _push(actor, _favouring(shapes, 1), version=2**63 - 1)  # the largest version still works
    actions, versions = _actions(actor)
    assert (actions == 1).all()
    assert (versions == 2**63 - 1).all()


@pytest.mark.long
def test_push_weights_refuses_a_300000_key_header_cheaply(actor: Actor) -> None:
    blob = hostile_blob(300_000)  # 17 MB of zero-size tensors
    tracemalloc.start()  # traces the actor's threads too: it runs in this process
    try:
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(_requests(blob, 1), timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The blob is buffered once and its header copied once; parsing it cost ~20x the blob.
    assert peak < 4 * len(blob), f"decoding peaked at {peak / 1e6:.0f} MB for {len(blob) / 1e6} MB"
    assert "tensors" in error.value.details()
    _assert_unchanged(actor, 0)
    _push(actor, _favouring(_policy_shapes(actor.stub), 1), version=1)  # still takes good pushes
    _assert_unchanged(actor, 1)


def test_push_weights_raises_if_header_is_missing(actor: Actor) -> None:
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(iter([pb.PushWeightsRequest(chunk=b"abc")]), timeout=10)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "header" in error.value.details()


def test_push_weights_cancelled_mid_push_changes_nothing(actor: Actor) -> None:
    shapes = _policy_shapes(actor.stub)
    blob = encode_weights(_favouring(shapes, 1))
    half_sent = threading.Event()
    release = threading.Event()

    def requests() -> Iterator[pb.PushWeightsRequest]:
        for i, request in enumerate(_requests(blob, 1)):
            if i == 2:
                half_sent.set()
                release.wait(10)
                return
            yield request

    future = actor.stub.PushWeights.future(requests(), timeout=30)
    assert half_sent.wait(10)
    future.cancel()
    release.set()
    with pytest.raises(grpc.FutureCancelledError):
        future.result()
    _assert_unchanged(actor, 0)
    response = _push(actor, _favouring(shapes, 1), version=1)  # the actor still accepts pushes
    assert response.version == 1


def test_push_weights_is_audit_logged_with_peer_sha256_and_result(actor: Actor) -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream)
    try:
        shapes = _policy_shapes(actor.stub)
        blob = encode_weights(_favouring(shapes, 1))
        actor.stub.PushWeights(_requests(blob, 1), timeout=30)
        with pytest.raises(grpc.RpcError):
            actor.stub.PushWeights(_requests(blob, 1), timeout=30)
    finally:
        get_logger().removeHandler(handler)
    pushes = [
        r["fields"]
        for r in map(json.loads, stream.getvalue().splitlines())
        if r["event"] == "weights.push"
    ]
    assert [p["result"] for p in pushes] == ["OK", "ABORTED"]
    for push in pushes:
        assert push["sha256"] == sha256_hex(blob)
        assert push["model_id"] == "policy"
        assert push["version"] == 1
        assert push["peer"].startswith("ipv4:127.0.0.1:")


def test_push_weights_raises_if_a_message_exceeds_4_mib(actor: Actor) -> None:
    blob = bytes(5 * 1024 * 1024)
    requests = iter(
        [
            pb.PushWeightsRequest(
                header=pb.WeightsHeader(version=1, total_bytes=len(blob), sha256=sha256_hex(blob))
            ),
            pb.PushWeightsRequest(chunk=blob),
        ]
    )
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(requests, timeout=30)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _assert_unchanged(actor, 0)


def test_a_refused_push_reaches_the_learner_as_its_refusal_every_time(actor: Actor) -> None:
    # Refusing from the header while the learner still streams the blob raced its writes:
    # 15% of 300 stale pushes came back INTERNAL ("Internal error from Core"), not ABORTED.
    blob = bytes(300_000)

    async def push_stale(n: int) -> list[str]:
        channel = ActorChannel(f"127.0.0.1:{actor.handle.port}")
        outcomes = []
        try:
            for _ in range(n):
                messages = push_messages("policy", 0, blob, "", 65536, crc32c=crc32c(blob))
                try:
                    await channel.push_weights("policy", 0, messages, 30.0)
                    outcomes.append("applied")
                except RlfleetError as exc:
                    outcomes.append(type(exc).__name__)
        finally:
            await channel.close()
        return outcomes

    assert set(asyncio.run(push_stale(100))) == {"StaleVersionError"}
    _assert_unchanged(actor, 0)


def test_a_refused_push_is_read_no_further_than_it_announced(actor: Actor) -> None:
    # The drain that lets the refusal through stops at the announced size, and at once
    # for a size over the cap: an endless stream is answered, not read forever.
    endless = itertools.repeat(pb.PushWeightsRequest(chunk=bytes(65536)))
    for total_bytes in (1000, 10**12):
        header = pb.WeightsHeader(model_id="policy", version=0, total_bytes=total_bytes, crc32c=0)
        requests = itertools.chain([pb.PushWeightsRequest(header=header)], endless)
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(requests, timeout=30)
        assert error.value.code() == grpc.StatusCode.ABORTED
    _assert_unchanged(actor, 0)


def test_a_split_batch_reports_the_versions_of_its_real_frames_not_its_padding(
    actor: Actor,
) -> None:
    _push(actor, _favouring(_policy_shapes(actor.stub), 0), version=3)
    session = RawCollect.open(  # episodes end inside 200 frames: the split pads trajectories
        actor.stub, open_request(frames_per_batch=200, credits=1, split_trajs=True)
    )
    session.opened()
    info, td = session.batch()
    session.cancel()
    assert td.numel() > 200  # padded, its padding at version 0
    assert (info.policy_version_min, info.policy_version_max) == (3, 3)
