"""PushWeights as deltas and with CRC-32C, and the generation pause a push costs.

Every weight comparison reads the actor's own state through GetState.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import safetensors.torch
import torch
from actor_harness import Actor, RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actor_service._config import ModelSpec
from actor_service._serve import _push
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import remove_segment, write_segment
from common.weights import BlobAssembler, crc32c, encode_weights, iter_blob_chunks, sha256_hex
from common.weights._delta import encode_delta
from common.weights._safetensors import write_blob

MB = 1 << 20


def _requests(
    blob: bytes,
    version: int,
    *,
    base_version: int | None = None,
    crc: int | str | None = "auto",
    sha256: str = "",
    chunk: int = 64 * 1024,
    delay: float = 0.0,
) -> Iterator[pb.PushWeightsRequest]:
    header = pb.WeightsHeader(
        model_id="policy",
        version=version,
        total_bytes=len(blob),
        sha256=sha256,
        crc32c=crc32c(blob) if crc == "auto" else crc,
        base_version=base_version,
    )
    yield pb.PushWeightsRequest(header=header)
    for piece in iter_blob_chunks(blob, chunk):
        if delay:
            time.sleep(delay)
        yield pb.PushWeightsRequest(chunk=bytes(piece))


def _actor_weights(actor: Actor) -> dict[str, torch.Tensor]:
    stream = actor.stub.GetState(pb.GetStateRequest(), timeout=30)
    header = next(stream).header
    assembler = BlobAssembler(header.total_bytes, sha256=header.sha256)
    for message in stream:
        assembler.add(message.chunk)
    state = safetensors.torch.load(bytes(assembler.finish()))
    prefix = "models/policy/weights/"
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _version(actor: Actor) -> int:
    described = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    return next(m.version for m in described.models if m.model_id == "policy")


def _serving(actor: Actor) -> bool:
    health = health_pb2_grpc.HealthStub(actor.channel)
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    return status == health_pb2.HealthCheckResponse.SERVING


def _bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].view(torch.uint8).equal(b[k].view(torch.uint8)) for k in a
    )


def _step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """An optimizer-like step: a few elements of every tensor change."""
    gen = torch.Generator().manual_seed(seed)
    new = {k: v.clone() for k, v in state.items()}
    for tensor in new.values():
        flat = tensor.view(-1)
        index = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)
        flat[index] += torch.randn(index.numel(), generator=gen)
    return new


def test_delta_pushes_leave_the_actor_bit_identical_to_a_full_push(actor: Actor) -> None:
    state = _actor_weights(actor)
    assert actor.stub.PushWeights(_requests(encode_weights(state), 1), timeout=30).version == 1
    for version in range(2, 6):
        new = _step(state, version)
        bias = next(k for k in new if k.endswith("bias"))
        if version in (2, 3):  # 0.0, then -0.0: equal values, other bits, a change to carry
            new[bias][0] = 0.0 if version == 2 else -0.0
        blob = encode_delta(state, new)
        assert len(blob) < len(encode_weights(new)) / 10
        reply = actor.stub.PushWeights(
            _requests(blob, version, base_version=version - 1), timeout=30
        )
        assert reply.version == version
        assert reply.pause_seconds > 0
        state = new
        assert _bits_equal(_actor_weights(actor), state)
    assert _version(actor) == 5


def test_delta_push_raises_if_its_base_is_not_the_version_in_force(actor: Actor) -> None:
    state = _actor_weights(actor)
    actor.stub.PushWeights(_requests(encode_weights(state), 4), timeout=30)
    blob = encode_delta(state, _step(state, 1))
    for base in (3, 0, 2**63 - 1):
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(_requests(blob, 9, base_version=base), timeout=30)
        assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"on top of version {base}" in error.value.details()
        assert "version 4 is in force" in error.value.details()
    cases = [
        (dict(base_version=2**64 - 1), grpc.StatusCode.INVALID_ARGUMENT, "base_version"),
        (dict(base_version=4, crc=crc32c(blob) ^ 1), grpc.StatusCode.DATA_LOSS, "crc32c"),
    ]
    for kw, code, needle in cases:
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(_requests(blob, 9, **kw), timeout=30)
        assert error.value.code() == code
        assert needle in error.value.details()
    with pytest.raises(grpc.RpcError) as error:  # newer, right base, but stale version
        actor.stub.PushWeights(_requests(blob, 4, base_version=4), timeout=30)
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert _version(actor) == 4
    assert _bits_equal(_actor_weights(actor), state)
    assert _serving(actor)


def test_delta_push_raises_if_an_entry_is_out_of_bounds(actor: Actor) -> None:
    state = _actor_weights(actor)
    actor.stub.PushWeights(_requests(encode_weights(state), 1), timeout=30)
    key = next(iter(state))
    numel = state[key].numel()
    hostile = [
        {f"indices:{key}": torch.tensor([numel]), f"values:{key}": torch.ones(1)},
        {f"indices:{key}": torch.tensor([0]), f"values:{key}": torch.ones(1, dtype=torch.float64)},
        {"indices:no.such.key": torch.tensor([0]), "values:no.such.key": torch.ones(1)},
    ]
    for parts in hostile:
        blob = write_blob(parts, {"rlfleet.delta": "1"})
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(_requests(blob, 2, base_version=1), timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    full_as_delta = encode_weights(_step(state, 3))  # a full blob announced as a delta
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(_requests(full_as_delta, 2, base_version=1), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _version(actor) == 1
    assert _bits_equal(_actor_weights(actor), state)
    assert _serving(actor)


def test_push_weights_checks_whichever_checksums_it_carries(actor: Actor) -> None:
    state = _actor_weights(actor)
    blob = encode_weights(state)
    actor.stub.PushWeights(_requests(blob, 1, crc=None, sha256=sha256_hex(blob)), timeout=30)
    actor.stub.PushWeights(_requests(blob, 2, sha256=sha256_hex(blob)), timeout=30)
    for kw, code in [
        (dict(crc=None), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(crc=0), grpc.StatusCode.DATA_LOSS),
        (dict(sha256="0" * 64), grpc.StatusCode.DATA_LOSS),
    ]:
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.PushWeights(_requests(blob, 3, **kw), timeout=30)
        assert error.value.code() == code, kw
    assert _version(actor) == 2
    assert _serving(actor)


def test_slow_push_pauses_collection_only_for_the_swap(make_actor: object) -> None:
    """Batches keep coming while a push trickles in; the swap alone holds the model lock."""
    spec = ModelSpec(kwargs={"hidden": [512, 512]})
    actor = make_actor(models=(spec,))
    state = _step(_actor_weights(actor), 1)
    blob = encode_weights(state)  # ~1 MB in 16 chunks, one every 0.1 s
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=20, credits=4))
    session.opened()
    reply: list[pb.PushWeightsResponse] = []
    pusher = threading.Thread(
        target=lambda: reply.append(
            actor.stub.PushWeights(_requests(blob, 1, delay=0.1), timeout=60)
        )
    )
    started = time.perf_counter()
    pusher.start()
    during = 0
    while pusher.is_alive():
        info, _ = session.batch()
        session.ack(info.seq)
        session.credit(1)
        during += info.policy_version_max == 0
    transfer = time.perf_counter() - started
    info, _ = session.batch()
    while info.policy_version_max == 0:
        session.ack(info.seq)
        session.credit(1)
        info, _ = session.batch()
    session.cancel()
    assert transfer > 1.0
    assert during >= 5
    assert 0 < reply[0].pause_seconds < transfer / 10
    assert _bits_equal(_actor_weights(actor), state)


def test_a_cancelled_delta_from_a_segment_writes_nothing_into_the_next_push(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta read from a segment and cancelled mid-read lends its receive buffer again only
    once its read stops: the next push, assembled in that buffer, applies its own bytes."""
    state = _actor_weights(actor)
    assert actor.stub.PushWeights(_requests(encode_weights(state), 1), timeout=30).version == 1
    reading, read, written = threading.Event(), threading.Event(), threading.Event()
    applying, apply = threading.Event(), threading.Event()
    read_segment, apply_weights = _push.read_push_segment, _push.WeightPushes._apply_weights

    def held_read(header: pb.WeightsHeader, enabled: bool, assembler: BlobAssembler) -> None:
        reading.set()
        read.wait(30)
        try:
            read_segment(header, enabled, assembler)
        finally:
            written.set()

    def held_apply(
        self: _push.WeightPushes, blob: bytes | memoryview, push: _push.PushCall
    ) -> object:
        applying.set()
        apply.wait(30)
        return apply_weights(self, blob, push)

    monkeypatch.setattr(_push, "read_push_segment", held_read)
    monkeypatch.setattr(_push.WeightPushes, "_apply_weights", held_apply)
    delta = encode_delta(state, _step(state, 2))
    segment = write_segment(delta)
    try:
        header = next(_requests(delta, 2, base_version=1))
        header.header.shm.CopyFrom(
            pb.ShmSegment(name=segment.name, size=segment.size, crc32c=segment.crc32c)
        )
        cancelled = actor.stub.PushWeights.future(iter([header]), timeout=30)
        assert reading.wait(10)
        cancelled.cancel()  # the read goes on in its thread
        time.sleep(0.5)  # the cancellation reaches the actor's handler
        new = _step(state, 3)
        pushed = actor.stub.PushWeights.future(_requests(encode_weights(new), 2), timeout=30)
        assert applying.wait(10)
        read.set()  # the read writes where it was lent its buffer
        assert written.wait(10)
        apply.set()
        assert pushed.result(30).version == 2
        assert _bits_equal(_actor_weights(actor), new)
    finally:
        read.set()
        apply.set()
        remove_segment(segment.name)
