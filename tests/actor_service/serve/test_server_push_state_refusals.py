"""What an actor refuses of a (possibly hostile) learner's pushes and loads.

Each refusal here is one a single check makes: the header's version range before a byte
is buffered, the size cap at its bound, chunks past the announced size, a LoadState without
its digest, a rollback by one version, a state with more tensors than the actor's models,
a blob whose chunks trickle in below the minimum progress.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import torch
from actor_harness import Actor, get_state
from helpers import poll_until

from actor_service._core._state import decode_state, state_to_blob
from actor_service._serve import _streams as streams_module
from common.config import MAX_MODEL_ID
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import BlobAssembler, encode_weights, iter_blob_chunks, sha256_hex

CAP = 10**6


def _weights(actor: Actor) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in actor.worker.models.module("policy").state_dict().items()}


def _push(actor: Actor, header: pb.WeightsHeader, blob: bytes = b"") -> pb.PushWeightsResponse:
    def requests() -> Iterator[pb.PushWeightsRequest]:
        yield pb.PushWeightsRequest(header=header)
        for piece in iter_blob_chunks(blob, 4096):
            yield pb.PushWeightsRequest(chunk=bytes(piece))

    return actor.stub.PushWeights(requests(), timeout=30)


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        call()
    return error.value


@pytest.mark.parametrize("version", [2**63, 2**64 - 1])
def test_a_push_version_past_int64_is_refused_from_its_header(actor: Actor, version) -> None:
    # Refused before any byte is read: the header announces bytes that never come.
    header = pb.WeightsHeader(model_id="policy", version=version, total_bytes=1000, sha256="0" * 64)
    error = _refused(lambda: _push(actor, header))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "weights version" in error.details(), error.details()
    assert "int64" in error.details(), error.details()


@pytest.mark.parametrize(
    "then",
    [
        pytest.param(pb.PushWeightsRequest(chunk=b"x" * 1000), id="the-announced-bytes"),
        pytest.param(pb.PushWeightsRequest(header=pb.WeightsHeader()), id="a-header"),
    ],
)
def test_a_refused_push_is_answered_once_its_bytes_came_or_a_non_chunk_came(
    actor: Actor, then: pb.PushWeightsRequest
) -> None:
    """The drain of a refused push is bounded, the caller's side still open.

    It ends after the bytes the header announced, or at a message that is no chunk: a
    caller that goes on sending cannot hold the call until it half-closes.
    """
    header = pb.WeightsHeader(model_id="policy", version=2**63, total_bytes=1000, sha256="0" * 64)
    hold = threading.Event()

    def requests() -> Iterator[pb.PushWeightsRequest]:
        yield pb.PushWeightsRequest(header=header)
        yield then
        hold.wait(20)  # the caller's side stays open
        yield pb.PushWeightsRequest(chunk=b"x")

    began = time.monotonic()
    try:
        error = _refused(lambda: actor.stub.PushWeights(requests(), timeout=8))
    finally:
        hold.set()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert time.monotonic() - began < 4


def test_a_delta_push_on_a_base_not_in_force_is_refused_from_its_header(actor: Actor) -> None:
    """A delta whose base is not in force is FAILED_PRECONDITION before any byte is read.

    The header announces bytes that never come: a refusal that waited for the blob would
    end INVALID_ARGUMENT (incomplete) instead of telling the learner to send a full push.
    """
    header = pb.WeightsHeader(
        model_id="policy", version=5, total_bytes=1000, crc32c=0, base_version=3
    )
    error = _refused(lambda: _push(actor, header))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "on top of version 3" in error.details(), error.details()
    assert actor.worker.models.policy_version("policy") == 0


def test_a_push_model_id_one_past_the_limit_is_invalid_not_unknown(actor: Actor) -> None:
    """A push naming a model_id of MAX_MODEL_ID + 1 characters is malformed: INVALID_ARGUMENT."""
    header = pb.WeightsHeader(
        model_id="p" * (MAX_MODEL_ID + 1), version=1, total_bytes=1000, sha256="0" * 64
    )
    error = _refused(lambda: _push(actor, header))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "model_id must be" in error.details(), error.details()


def test_the_size_cap_refuses_one_byte_over_it_and_not_at_it(make_actor) -> None:
    actor = make_actor(max_weight_bytes=CAP)
    over = pb.WeightsHeader(model_id="policy", version=1, total_bytes=CAP + 1, sha256="0" * 64)
    error = _refused(lambda: _push(actor, over))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    at = pb.WeightsHeader(model_id="policy", version=1, total_bytes=CAP, sha256="0" * 64)
    error = _refused(lambda: _push(actor, at))  # taken in, then found incomplete
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "incomplete" in error.details()


def test_chunks_past_the_announced_size_are_refused_as_invalid_argument(actor: Actor) -> None:
    blob = encode_weights(_weights(actor))
    short = len(blob) - 7  # the learner announces fewer bytes than it sends
    header = pb.WeightsHeader(
        model_id="policy", version=1, total_bytes=short, sha256=sha256_hex(blob[:short])
    )
    before = _weights(actor)
    error = _refused(lambda: _push(actor, header, blob))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    assert "overflows" in error.details()
    assert all(torch.equal(v, before[k]) for k, v in _weights(actor).items())
    assert actor.worker.models.policy_version("policy") == 0


def test_a_header_among_the_chunks_of_a_push_is_refused_and_changes_nothing(actor: Actor) -> None:
    blob = encode_weights({k: torch.full_like(v, 0.25) for k, v in _weights(actor).items()})
    version = actor.worker.models.policy_version("policy") + 1
    header = pb.WeightsHeader(
        model_id="policy", version=version, total_bytes=len(blob), sha256=sha256_hex(blob)
    )
    pieces = [bytes(piece) for piece in iter_blob_chunks(blob, 4096)]

    def requests() -> Iterator[pb.PushWeightsRequest]:
        yield pb.PushWeightsRequest(header=header)
        yield pb.PushWeightsRequest(chunk=pieces[0])
        yield pb.PushWeightsRequest(header=header)  # only chunks may follow the header
        for piece in pieces[1:]:
            yield pb.PushWeightsRequest(chunk=piece)

    before = _weights(actor)
    error = _refused(lambda: actor.stub.PushWeights(requests(), timeout=30))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "only `chunk` messages may follow the header" in error.details()
    assert all(torch.equal(v, before[k]) for k, v in _weights(actor).items())
    assert actor.worker.models.policy_version("policy") == version - 1


def _load(actor: Actor, blob: bytes, sha256: str, allow_rollback: bool = False):
    def requests() -> Iterator[pb.StateChunk]:
        header = pb.StateHeader(total_bytes=len(blob), sha256=sha256, allow_rollback=allow_rollback)
        yield pb.StateChunk(header=header)
        for piece in iter_blob_chunks(blob, 4096):
            yield pb.StateChunk(chunk=bytes(piece))

    return actor.stub.LoadState(requests(), timeout=30)


def test_a_load_state_without_its_sha256_is_refused_and_changes_nothing(actor: Actor) -> None:
    state = decode_state(get_state(actor))
    other = {k: torch.full_like(v, 0.5) for k, v in state["models"]["policy"]["weights"].items()}
    state["models"]["policy"] = {"version": 4, "weights": other}
    blob = state_to_blob(state)
    before = _weights(actor)
    error = _refused(lambda: _load(actor, blob, ""))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "sha256" in error.details()
    assert all(torch.equal(v, before[k]) for k, v in _weights(actor).items())
    assert actor.worker.models.policy_version("policy") == 0
    _load(actor, blob, sha256_hex(blob))  # the same state with its digest loads


def test_a_state_one_version_older_is_a_rollback(actor: Actor) -> None:
    state = decode_state(get_state(actor))
    weights = state["models"]["policy"]["weights"]
    state["models"]["policy"] = {"version": 3, "weights": weights}
    newer = state_to_blob(state)
    _load(actor, newer, sha256_hex(newer))
    other = {k: torch.full_like(v, 0.25) for k, v in weights.items()}
    state["models"]["policy"] = {"version": 2, "weights": other}
    older = state_to_blob(state)
    error = _refused(lambda: _load(actor, older, sha256_hex(older)))
    assert error.code() == grpc.StatusCode.ABORTED, error.details()
    assert actor.worker.models.policy_version("policy") == 3
    _load(actor, older, sha256_hex(older), allow_rollback=True)
    assert actor.worker.models.policy_version("policy") == 2


def test_a_state_with_more_tensors_than_the_models_hold_is_refused_from_its_header(
    actor: Actor,
) -> None:
    params = len(_weights(actor))
    extra = {f"t{i}": torch.zeros(1) for i in range(params + 1025 + 1)}
    metadata = {"rlfleet.format": "actor-state/1", "rlfleet.state": "{}"}
    blob = encode_weights(extra, metadata=metadata)
    error = _refused(lambda: _load(actor, blob, sha256_hex(blob)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())
    assert "tensors" in error.details()


def test_an_env_actor_describes_no_new_token_cap(actor: Actor) -> None:
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).max_new_tokens_cap == 0


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True])
def test_a_core_refuses_a_seed_outside_the_wire_range(actor: Actor, seed) -> None:
    with pytest.raises(ValueError, match="seed must be an int"):
        actor.worker.set_seed(seed)


#: A blob size no other blob of a test run has, so its assemblers can be counted.
ODD_SIZE = 3 * 2**20 + 17


def _assemblers_of(size: int) -> int:
    # type(), not isinstance(): the latter reads __class__, which warns on some of torch's objects
    return sum(type(o) is BlobAssembler and o.total_bytes == size for o in gc.get_objects())


@pytest.mark.parametrize("rpc", ["PushWeights", "LoadState"])
def test_the_bytes_of_a_refused_push_or_load_are_let_go_with_its_call(
    actor: Actor, rpc: str
) -> None:
    """A refused call's receive buffer is freed as its call ends, not by the next full garbage
    collection: a learner whose pushes fail their checksum, one after another, must not make
    the actor hold every one's bytes meanwhile.
    """
    blob = bytes(ODD_SIZE)
    header = pb.WeightsHeader(model_id="policy", version=1, total_bytes=ODD_SIZE, crc32c=1)
    gc.collect()
    gc.disable()  # only what the refusal itself lets go is freed
    try:
        if rpc == "PushWeights":
            error = _refused(lambda: _push(actor, header, blob))
        else:
            error = _refused(lambda: _load(actor, blob, "0" * 64))
        assert error.code() == grpc.StatusCode.DATA_LOSS, error.details()
        poll_until(
            lambda: _assemblers_of(ODD_SIZE) == 0,
            timeout=3.0,
            interval=0.1,
            message=f"{rpc}: the refused call's receive buffer is still held",
        )
    finally:
        gc.enable()


def _trickle(first: object, chunk: object, ran_out: threading.Event) -> Iterator[object]:
    """``first``, then ``chunk`` every 50 ms for 10 s (``ran_out`` set if the 10 s pass)."""
    yield first
    until = time.monotonic() + 10.0
    while time.monotonic() < until:
        time.sleep(0.05)
        yield chunk
    ran_out.set()


_TRICKLED = {
    "PushWeights": (
        pb.PushWeightsRequest(
            header=pb.WeightsHeader(model_id="policy", version=1, total_bytes=CAP, sha256="0" * 64)
        ),
        lambda piece: pb.PushWeightsRequest(chunk=piece),
    ),
    "LoadState": (
        pb.StateChunk(header=pb.StateHeader(total_bytes=CAP, sha256="0" * 64)),
        lambda piece: pb.StateChunk(chunk=piece),
    ),
}


@pytest.mark.parametrize("piece", [b"", b"x"], ids=["empty-chunks", "1-byte-chunks"])
@pytest.mark.parametrize("rpc", ["PushWeights", "LoadState"])
def test_a_blob_stream_raises_if_its_chunks_bring_too_few_bytes_in_an_idle_timeout(
    actor: Actor, monkeypatch: pytest.MonkeyPatch, rpc: str, piece: bytes
) -> None:
    """Each chunk resets the idle timeout: chunks of a byte or none, each under it, must not
    hold a call slot and a half-received blob for as long as the caller likes."""
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.5)
    first, chunk = _TRICKLED[rpc]
    ran_out = threading.Event()
    call = getattr(actor.stub, rpc)
    error = _refused(lambda: call(_trickle(first, chunk(piece), ran_out), timeout=30))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
    assert f"{rpc}: fewer than" in error.details()
    assert "in 0.5 s" in error.details()
    assert not ran_out.is_set()  # the actor ended the call, not the caller
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).worker_id == 0


def test_a_refused_push_is_answered_while_empty_chunks_trickle_in(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain of a refused push counts bytes: empty chunks would keep it reading forever."""
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.5)
    header = pb.WeightsHeader(model_id="policy", version=2**63, total_bytes=1000, sha256="0" * 64)
    ran_out = threading.Event()
    first, chunk = pb.PushWeightsRequest(header=header), pb.PushWeightsRequest(chunk=b"")
    error = _refused(lambda: actor.stub.PushWeights(_trickle(first, chunk, ran_out), timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert not ran_out.is_set()


def test_a_blob_that_keeps_its_minimum_progress_loads_across_many_idle_timeouts(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule counts bytes per idle timeout, not since the stream began."""
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.5)
    monkeypatch.setattr(streams_module, "_MIN_PROGRESS", 1024, raising=False)
    blob = get_state(actor)

    def requests() -> Iterator[pb.StateChunk]:
        yield pb.StateChunk(header=pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob)))
        for piece in iter_blob_chunks(blob, 512):
            time.sleep(0.05)  # 10 KiB/s: past 1 KiB in each 0.5 s
            yield pb.StateChunk(chunk=bytes(piece))

    assert len(blob) > 4 * 1024  # the load lasts several idle timeouts
    assert actor.stub.LoadState(requests(), timeout=30).worker_id == 0
