"""A real gRPC server speaking rlfleet.v1 as a hostile actor: every number it sends is checked.

The server (``hostile_harness.py``) answers Describe with a real actor's description (one
field changed where a test says so) and a ``Collect`` with ``opened`` and then the batches a
test builds, byte for byte as an actor frames them. The collector must refuse what no actor
sends (a frame count of 2^64-1, a seq far beyond the credits granted, a batch size with no
data behind it, another epoch, an inverted version range), count none of it, name it in the
error the user sees, and retry that actor with a growing backoff, not in a tight loop.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch
from helpers import poll_until
from hostile_harness import (
    EPOCH,
    FRAMES,
    U32,
    U64,
    HostileActor,
    batch,
    data_of_size,
    serve,
)
from learner_fleet import cartpole_policy
from tensordict import LazyStackedTensorDict, TensorDict

from common.config import MAX_CREDITS, PROTOCOL_VERSION
from common.errors import EnvError, ProtocolError
from common.packets import MAGIC, encode_packet, packet_crc32c
from common.packets._decode import PREAMBLE
from common.protowire import varint
from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client import GrpcCollector, MissingWorkersError


def test_an_honest_batch_from_the_test_server_is_yielded(description) -> None:
    """The harness itself: the same server's honest batches reach the user."""
    servicer = HostileActor(description, lambda seq: batch(seq))
    server, address = serve(servicer)
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, total_frames=2 * FRAMES) as c:
            batches = list(c)
            frames = c.stats()["frames"]
    finally:
        server.stop(None)
    assert [b.numel() for b in batches] == [FRAMES, FRAMES]
    assert frames == 2 * FRAMES


def _with(key: str | tuple[str, ...], value: torch.Tensor) -> TensorDict:
    """An honest batch with ``key`` set to ``value``."""
    td = data_of_size([1, FRAMES])
    td.set(key, value)
    return td


HOSTILE = {
    "frames_2^64-1": (lambda seq: batch(seq, frames=U64), "18446744073709551615 frames"),
    "frames_beyond_rows": (lambda seq: batch(seq, frames=FRAMES + 1), "9 frames for 8 rows"),
    "seq_far_ahead": (lambda seq: batch(seq + 2**40), "a seq outside"),
    "seq_2^64-1": (lambda seq: batch(U64), "a seq outside"),
    "other_epoch": (lambda seq: batch(seq, epoch=EPOCH + 1), f"epoch {EPOCH + 1}"),
    "other_worker_id": (lambda seq: batch(seq, worker_id=7), "claims worker_id 7, expected 0"),
    "versions_inverted": (
        lambda seq: batch(seq, policy_version_min=5, policy_version_max=4),
        "policy versions 5..4",
    ),
    "version_2^64-1": (lambda seq: batch(seq, policy_version_max=U64), "policy versions 0.."),
    # Float ids and versions: NaN names no worker and no version (they used to stop the
    # actor's link as a learner bug, raising NotImplementedError or ValueError to the user).
    "traj_ids_float": (
        lambda seq: batch(seq, _with(("collector", "traj_ids"), torch.zeros(1, FRAMES))),
        "('collector', 'traj_ids') of dtype torch.float32",
    ),
    "version_nan": (
        lambda seq: batch(seq, _with("policy_version", torch.full((1, FRAMES), torch.nan))),
        "'policy_version' of dtype torch.float32",
    ),
    "next_version_inf": (
        lambda seq: batch(
            seq, _with(("next", "policy_version"), torch.full((1, FRAMES), torch.inf))
        ),
        "('next', 'policy_version') of dtype torch.float32",
    ),
    "other_model": (lambda seq: batch(seq, model_id="critic"), "model_id 'critic'"),
    "wrong_shape": (lambda seq: batch(seq, data_of_size([2, 4]), frames=8), "batch size [2, 4]"),
    # 2 x 2^26 rows in a packet of a few hundred bytes: refused before the learner's worker
    # tag (8 bytes a row) would allocate 1 GiB for it, as steps and as split trajectories.
    "rows_without_data": (
        lambda seq: batch(seq, data_of_size([2, 2**26], empty=True), frames=0),
        "batch size [2, 6710",
    ),
    "split_rows_without_data": (
        lambda seq: batch(seq, data_of_size([2, 2**26], empty=True), frames=0),
        "a byte per row",
    ),
}


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
def test_a_batch_claiming_what_no_actor_sends_is_refused_and_counts_nothing(
    description, hostile: str
) -> None:
    batches, named = HOSTILE[hostile]
    servicer = HostileActor(description, batches)
    server, address = serve(servicer)
    timeout = 1.0
    split = {"split_trajs": True} if hostile.startswith("split") else {}
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=100 * FRAMES, batch_timeout=timeout,
            **split,
        ) as collector:  # fmt: skip
            started = time.monotonic()
            with pytest.raises(MissingWorkersError) as raised:
                collector.next()
            waited = time.monotonic() - started
            stats = collector.stats()
    finally:
        server.stop(None)
    assert "ProtocolError" in str(raised.value)
    assert named in str(raised.value)
    assert (stats["frames"], stats["batches"]) == (0, 0)
    # The backoff (0.1 s, doubling per bad session, jittered 50-100 %) allows at most 5
    # sessions in 1 s (6 with one begun as the collector shuts down); a backoff reset after
    # each 'opened' made about 11.
    assert waited < 2 * timeout
    assert 2 <= servicer.sessions <= 6, servicer.sessions


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("num_envs", 0, "num_envs 0, outside 1..4096"),
        ("num_envs", 2**32 - 1, "num_envs 4294967295"),
        ("epoch", 0, "epoch 0"),
        ("worker_id", 2**32 - 1, "worker_id 4294967295, outside 0..65535"),
        ("max_credits", 10**9, "max_credits 1000000000, outside 0..1024"),
        ("version", U64, "the version of model 'policy' 18446744073709551615"),
        ("model_id", "m" * 65, "model_id must be 1 to 64 letters"),
        # An actor of a build before protocol revisions, or one needing a newer learner.
        ("protocol_version", 0, "speaks no protocol revision"),
        ("min_peer_protocol", U32, f"works with {U32} and newer.; this build speaks protocol"),
        # Read by no learner, but rlfleet status shows them: NaN and inf broke its table.
        ("uptime_seconds", float("nan"), r"uptime_seconds nan, outside 0..1e\+10"),
        ("uptime_seconds", 1e300, r"uptime_seconds 1e\+300"),
        ("pushes_in_flight", {"seconds": float("inf")}, "a push in flight's seconds inf"),
        ("pushes_in_flight", {"total_bytes": 5, "received_bytes": 6}, "6 bytes received, more"),
    ],
)
def test_a_description_outside_an_actors_ranges_is_refused_at_construction(
    description, field: str, value: object, named: str
) -> None:
    hostile = pb.DescribeResponse()
    hostile.CopyFrom(description)
    if field in ("version", "model_id"):
        setattr(hostile.models[0], field, value)
    elif field == "pushes_in_flight":
        hostile.pushes_in_flight.add(model_id="policy", version=1, source="learner", **value)
    else:
        setattr(hostile, field, value)
    server, address = serve(HostileActor(hostile, lambda seq: batch(seq)))
    try:
        with pytest.raises(ProtocolError, match=named):
            GrpcCollector([address], frames_per_batch=FRAMES, connect_timeout=5.0)
    finally:
        server.stop(None)


def test_a_description_of_another_revision_is_refused_for_its_revision_first(
    description,
) -> None:
    """A newer actor may widen a range this build checks (max_credits): the learner names
    the revisions and the fix, not a max_credits "outside 0..1024" as if the actor lied."""
    newer = PROTOCOL_VERSION + 1
    hostile = pb.DescribeResponse()
    hostile.CopyFrom(description)
    hostile.protocol_version, hostile.min_peer_protocol = newer, newer
    hostile.max_credits = MAX_CREDITS + 1
    server, address = serve(HostileActor(hostile, lambda seq: batch(seq)))
    try:
        with pytest.raises(ProtocolError) as raised:
            GrpcCollector([address], frames_per_batch=FRAMES, connect_timeout=5.0)
    finally:
        server.stop(None)
    assert f"speaks protocol {newer} (works with {newer} and newer)" in str(raised.value)
    assert "run the same rlfleet release" in str(raised.value)


def _as_collect_response(field: int, body: bytes) -> pb.PushWeightsRequest | pb.Relay:
    """A message that serialises to ``CollectResponse`` field ``field`` (1 or 2) holding
    ``body`` as is: the generated server serialises any message, and these two have a bytes
    field of that number."""
    return pb.Relay(push_id=body) if field == 1 else pb.PushWeightsRequest(chunk=body)


def _retyped_model_id(seq: int) -> pb.PushWeightsRequest | pb.Relay:
    """Batch ``seq`` as an actor whose build made ``BatchInfo.model_id`` bytes frames it: the
    model id is not UTF-8, so the message does not parse as this build's."""
    honest = batch(seq).chunk
    info = honest.info
    info.ClearField("model_id")
    raw_info = info.SerializeToString() + b"\x3a\x02\xff\xfe"  # field 7, 2 bytes
    honest.ClearField("info")
    body = honest.SerializeToString() + b"\x2a" + varint(len(raw_info)) + raw_info
    return _as_collect_response(2, body)


class UndecodableOpened(HostileActor):
    """Answers every ``open`` with an ``opened`` whose bytes do not parse (a cut varint)."""

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        next(requests)
        with self._lock:
            self.sessions += 1
        yield _as_collect_response(1, b"\x08")


def test_a_collect_response_that_does_not_parse_is_named_so_and_retried(
    description, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC's client hands a message its deserializer cannot parse over as None (logging the
    parser's traceback): read as a stream that ended without its ``end``. The user is told
    the actor's message did not parse, and the actor is retried (not given up as a refusal
    of the settings) without a traceback in the log."""
    _refused_as_protocol_error(
        HostileActor(description, _retyped_model_id), "does not parse (Error parsing message"
    )
    opened = UndecodableOpened(description, batch)
    _refused_as_protocol_error(opened, "its Collect reply of 3 bytes does not parse")
    assert opened.sessions >= 2  # retried
    assert "Exception deserializing message" not in caplog.text


def test_an_end_carrying_megabytes_of_text_reaches_the_user_cut(description) -> None:
    """An ``end`` whose env failure fills 3 MB: the EnvError the user gets stays readable."""
    failure = pb.EnvFailure(env="e" * 1_000_000, exception_type="T" * 1_000_000,
                            exception_message="line\n" * 200_000)  # fmt: skip
    end = pb.StreamEnd(reason=pb.END_REASON_ERROR, message="m " * 500_000, env_failure=failure)
    server, address = serve(HostileActor(description, lambda seq: pb.CollectResponse(end=end)))
    try:
        collector = GrpcCollector([address], frames_per_batch=FRAMES, batch_timeout=20.0)
        with collector, pytest.raises(EnvError) as raised:
            collector.next()
    finally:
        server.stop(None)
    assert len(str(raised.value)) < 8000
    assert "line\nline\n" in str(raised.value)  # a traceback keeps its lines
    assert raised.value.exception_type == "T" * 997 + "..."


class SlowToReturn(HostileActor):
    """Answers the learner's ``close`` with ``end``, then takes a while to return its status."""

    def __init__(self, description: pb.DescribeResponse) -> None:
        super().__init__(description, batch)
        self.returned_while_active: list[bool] = []

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
        seqs = itertools.count(1)
        for _ in range(opening.credits):
            yield batch(next(seqs))
        for request in requests:
            for _ in range(request.credit.batches if request.HasField("credit") else 0):
                yield batch(next(seqs))
            if request.HasField("close"):
                yield pb.CollectResponse(end=pb.StreamEnd(reason=pb.END_REASON_CLOSED))
                time.sleep(0.5)  # an actor's handler tidying up after its last write
                self.returned_while_active.append(context.is_active())
                return


def test_a_learner_that_read_its_end_lets_the_actors_call_finish(description) -> None:
    """Cancelled after its ``end`` was read, an actor would count the session as broken."""
    servicer = SlowToReturn(description)
    server, address = serve(servicer)
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, total_frames=2 * FRAMES) as c:
            assert len(list(c)) == 2
    finally:
        server.stop(None)
    assert servicer.returned_while_active == [True]


def _extra_entry(seq: int) -> pb.CollectResponse:
    td = data_of_size([1, FRAMES])
    td["z"] = torch.ones(1, FRAMES, 3)  # an entry the other actor's batches lack
    td["next", "observation"] = torch.zeros(1, FRAMES, 5)  # and another shape
    return batch(seq, td, worker_id=1)


@pytest.mark.parametrize("cat_results", ["stack", 0])
def test_a_sync_round_whose_actors_send_other_entries_is_a_lazy_stack_or_a_clear_error(
    description, cat_results: str | int, caplog: pytest.LogCaptureFixture
) -> None:
    """Two actors whose batches hold other entries (other envs, or a peer sending what the
    fleet does not): stacked lazily with one warning naming them, as TorchRL's
    MultiSyncCollector's maybe_dense_stack; cat_results=0 raises a ValueError naming them
    (it used to be tensordict's RuntimeError about exclusive keys)."""
    other = pb.DescribeResponse()
    other.CopyFrom(description)
    other.worker_id = 1
    servers = [serve(HostileActor(description, lambda seq: batch(seq))),
               serve(HostileActor(other, _extra_entry))]  # fmt: skip
    try:
        with GrpcCollector(
            [address for _, address in servers], sync=True, frames_per_batch=2 * FRAMES,
            total_frames=6 * FRAMES, cat_results=cat_results, batch_timeout=20.0,
        ) as collector:  # fmt: skip
            if cat_results == 0:
                with pytest.raises(ValueError, match=r"only in it \['z'\]") as raised:
                    collector.next()
                assert "('next', 'observation')" in str(raised.value)
                return
            batches = list(collector)
    finally:
        for server, _ in servers:
            server.stop(None)
    assert len(batches) == 3
    assert all(isinstance(b, LazyStackedTensorDict) for b in batches)
    assert batches[1][1]["z"].shape == (1, FRAMES, 3)
    assert batches[1][0]["next", "observation"].shape == (1, FRAMES, 4)
    assert "z" not in batches[1].keys()  # noqa: SIM118 (a lazy stack shows the shared entries)
    warned = [r for r in caplog.records if "lazy stack" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "worker_ids [0, 1]" in warned[0].getMessage()


def _half_then_end(seq: int) -> list[pb.CollectResponse]:
    whole = batch(seq).chunk
    half = len(whole.data) // 2
    first = pb.BatchChunk(seq=seq, index=0, count=2, data=whole.data[:half], info=whole.info)
    end = pb.StreamEnd(reason=pb.END_REASON_CLOSED, message="done")
    return [pb.CollectResponse(chunk=first), pb.CollectResponse(end=end)]


class EndingMidBatch(HostileActor):
    """Sends the first of a batch's two chunks, then ``end`` as if the session were over."""

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        next(requests)
        with self._lock:
            self.sessions += 1
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
        yield from _half_then_end(1)


def test_an_end_inside_a_batch_is_a_protocol_error_not_a_clean_end(description) -> None:
    """An ``end`` between a batch's chunks: no actor sends it (it finishes or breaks the
    batch first), so the session is a ProtocolError, retried with backoff, counting nothing."""
    _refused_as_protocol_error(EndingMidBatch(description, batch), "unexpected 'end' inside")


def _refused_as_protocol_error(
    servicer: HostileActor, needle: str, error: str = "ProtocolError"
) -> None:
    """The first batch from ``servicer`` fails: a ProtocolError (``error``) saying ``needle``,
    nothing counted."""
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=100 * FRAMES, batch_timeout=1.0
        ) as collector:
            with pytest.raises(MissingWorkersError) as raised:
                collector.next()
            stats = collector.stats()
    finally:
        server.stop(None)
    assert error in str(raised.value)
    assert needle in str(raised.value)
    assert (stats["frames"], stats["batches"]) == (0, 0)


def _strings_without_rows(seq: int) -> pb.CollectResponse:
    """An honest batch whose header also names a string stack of 8 x 2^30 empty rows: no
    string and no byte, one entry of JSON."""
    packet = encode_packet(data_of_size([1, FRAMES])).tobytes()
    length = PREAMBLE.unpack(packet[: PREAMBLE.size])[1]
    header = json.loads(packet[PREAMBLE.size : PREAMBLE.size + length])
    empty = {"key": ["s"], "dtype": "str", "shape": [1, FRAMES, 2**30, 0], "offset": 0, "nbytes": 0}
    header["entries"].insert(0, empty)
    text = json.dumps(header).encode()
    text += b" " * (-(PREAMBLE.size + len(text)) % 16)
    data = PREAMBLE.pack(MAGIC, len(text)) + text + packet[PREAMBLE.size + length :]
    fields = {"worker_id": 0, "epoch": EPOCH, "seq": seq, "frames": FRAMES, "model_id": "policy"}
    info = pb.BatchInfo(total_bytes=len(data), crc32c=packet_crc32c(data), **fields)
    return pb.CollectResponse(chunk=pb.BatchChunk(seq=seq, count=1, data=data, info=info))


def test_a_string_stack_of_empty_rows_is_refused_without_building_them(description) -> None:
    """A packet of a few hundred bytes naming 2^33 empty string rows: refused as over
    max_strings before one row is built (it used to build them on the learner's loop)."""
    servicer = HostileActor(description, _strings_without_rows)
    _refused_as_protocol_error(servicer, "shape [1, 8, 1073741824, 0]", "PacketTooLargeError")


class ChunkingActor(HostileActor):
    """Sends each batch as ``len(indices)`` chunks of its packet, in order, each chunk under
    its index and count from ``indices`` and ``counts`` (an honest actor: 0.., n each), and
    under its batch's seq plus ``shifts`` (an honest actor: 0 each); the chunk at
    ``segment_at`` also names a shared-memory segment (an honest actor: none)."""

    def __init__(
        self, description: pb.DescribeResponse, indices: tuple[int, ...], counts: tuple[int, ...]
    ) -> None:
        super().__init__(description, batch)
        self.indices, self.counts = indices, counts
        self.shifts = (0,) * len(indices)
        self.segment_at: int | None = None

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        with self._lock:
            self.sessions += 1
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
        seq = 1
        later = (r.credit.batches if r.HasField("credit") else 0 for r in requests)
        for granted in itertools.chain([opening.credits], later):
            for _ in range(granted):
                whole = batch(seq).chunk
                data = whole.data
                step = -(-len(data) // len(self.indices))
                framing = zip(self.indices, self.counts, self.shifts, strict=True)
                for n, (index, said, shift) in enumerate(framing):
                    piece = data[n * step : (n + 1) * step]
                    chunk = pb.BatchChunk(seq=seq + shift, index=index, count=said, data=piece)
                    if n == 0:
                        chunk.info.CopyFrom(whole.info)
                    if n == self.segment_at:
                        name, crc = "rlfleet-shm-1-" + "0" * 32, whole.info.crc32c
                        chunk.shm.CopyFrom(pb.ShmSegment(name=name, size=len(data), crc32c=crc))
                    yield pb.CollectResponse(chunk=chunk)
                seq += 1


@pytest.mark.parametrize(
    ("indices", "counts", "refused"),
    [
        ((0, 1, 2), (3, 3, 3), False),
        ((0, 0, 2), (3, 3, 3), True),
        ((0, 2, 1), (3, 3, 3), True),
        ((0, 1, 2), (3, 1, 3), True),
        ((0, 1, 2), (2, 3, 3), True),  # the bytes whole: only the count changed
    ],
    ids=["in-order", "index-repeated", "indices-swapped", "count-below-index", "count-changed"],
)
def test_chunks_whose_framing_lies_are_refused_even_when_the_data_is_whole(
    description, indices: tuple[int, ...], counts: tuple[int, ...], refused: bool
) -> None:
    """The bytes arrive whole and in order (their CRC-32C holds), but the chunks' indices or
    counts lie: no actor frames a batch so, and the learner must refuse it (ProtocolError)."""
    servicer = ChunkingActor(description, indices, counts)
    if refused:
        _refused_as_protocol_error(servicer, "out of order")
        return
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=2 * FRAMES, batch_timeout=2.0
        ) as collector:
            assert [b.numel() for b in collector] == [FRAMES, FRAMES]
    finally:
        server.stop(None)


def test_a_chunk_under_another_batchs_seq_is_refused_even_when_the_data_is_whole(
    description,
) -> None:
    """The middle chunk of batch 1 says seq 2 (its index, count and bytes honest): chunks of
    two batches never interleave, so the learner must refuse it, not join it to batch 1."""
    servicer = ChunkingActor(description, (0, 1, 2), (3, 3, 3))
    servicer.shifts = (0, 1, 0)
    _refused_as_protocol_error(servicer, "out of order")


def test_a_chunk_inside_a_batch_naming_a_segment_is_refused_even_when_the_data_is_whole(
    description,
) -> None:
    """The middle chunk of batch 1 also names a shared-memory segment (its seq, index, count
    and bytes honest): a segment's batch is one chunk of its own, so the learner must refuse
    it, not ignore the segment."""
    servicer = ChunkingActor(description, (0, 1, 2), (3, 3, 3))
    servicer.segment_at = 1
    _refused_as_protocol_error(servicer, "a shared-memory chunk inside batch 1")


class LyingFirstChunkActor(HostileActor):
    """Its first session's first chunk says seq 2^40 under an info of seq 1 (refused); then it
    comes back as a new process (the next epoch) and sends honest batches."""

    def Describe(self, request: pb.DescribeRequest, context: Any) -> pb.DescribeResponse:
        reply = pb.DescribeResponse()
        reply.CopyFrom(self.description)
        with self._lock:
            reply.epoch = EPOCH if self.sessions == 0 else EPOCH + 1  # the new process
        return reply

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        with self._lock:
            self.sessions += 1
            epoch = EPOCH if self.sessions == 1 else EPOCH + 1
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=epoch, next_seq=1))
        if epoch == EPOCH:
            lying = batch(1)
            lying.chunk.seq = 2**40
            yield lying
            return
        later = (r.credit.batches if r.HasField("credit") else 0 for r in requests)
        seq = 1
        for granted in itertools.chain([opening.credits], later):
            for _ in range(granted):
                yield batch(seq, epoch=EPOCH + 1)
                seq += 1


def test_a_first_chunk_under_a_wild_seq_counts_no_wild_gap(description) -> None:
    """A refused first chunk's seq (2^40, its info saying 1) is never followed: when the actor
    comes back as a new process, the batch lost with the old one counts one gap, not 2^40."""
    servicer = LyingFirstChunkActor(description, batch)
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=100 * FRAMES, batch_timeout=30.0
        ) as collector:
            assert collector.next().numel() == FRAMES
            stats = collector.stats()
    finally:
        server.stop(None)
    assert servicer.sessions >= 2
    assert stats["gaps"] <= 1, stats["gaps"]


class AnsweringPushes(HostileActor):
    """Takes every push and answers it as applied, ``fields`` replacing what an actor says."""

    def __init__(self, description: pb.DescribeResponse, **fields: Any) -> None:
        super().__init__(description, batch)
        self.fields = fields
        self.pushes = 0

    def PushWeights(self, requests: Iterator[pb.PushWeightsRequest], context: Any) -> Any:
        header = next(requests).header
        for _ in requests:
            pass
        with self._lock:
            self.pushes += 1
        reply = pb.PushWeightsResponse(
            worker_id=0, model_id=header.model_id, version=header.version,
            outcome=pb.PUSH_OUTCOME_APPLIED, epoch=EPOCH,
        )  # fmt: skip
        for field, value in self.fields.items():
            setattr(reply, field, value)
        return reply


def test_pushes_answered_by_another_epoch_than_described_are_not_resent_forever(
    description, caplog: pytest.LogCaptureFixture
) -> None:
    """Each reply says another process applied the push, each Describe says the first one
    still runs and holds nothing: the learner re-describes it and re-sends the push once (a
    restart in between is honest), then refuses the lie. It used to re-send the weights with
    the link's backoff for as long as the session lasted (12 pushes in 20 s)."""
    servicer = AnsweringPushes(description, epoch=EPOCH + 1)
    server, address = serve(servicer)
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, batch_timeout=5.0) as collector:
            collector.next()
            assert collector.update_policy_weights_(cartpole_policy(action=0)) == {0: 1}
            poll_until(
                lambda: any("answered twice by epoch 42" in r.getMessage() for r in caplog.records),
                5,
                message="the lie was never refused",
            )
            sent = servicer.pushes
            time.sleep(1.0)  # the backoff re-sent it within 0.1-0.4 s
            collector.next()  # its session goes on
    finally:
        server.stop(None)
    assert sent == servicer.pushes == 3  # the push, its re-send, the one refused


@pytest.mark.parametrize("pause", [1e300, float("nan")])
def test_a_push_pause_longer_than_the_push_reads_as_none(description, pause: float) -> None:
    """The swap pauses an actor within the push call: a reply claiming a longer pause (1e300
    s) would stay in ``push_pause_max`` for good."""
    server, address = serve(AnsweringPushes(description, pause_seconds=pause))
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, batch_timeout=5.0) as collector:
            assert collector.update_policy_weights_(cartpole_policy(action=0)) == {0: 1}
            stats = collector.stats()
    finally:
        server.stop(None)
    assert stats["push_pause_max"] == stats["last_push_pause"] == 0.0


class ResumingFarAhead(HostileActor):
    """Its first session sends batches 1 and 2 and breaks once ``cut`` is set; every later
    session resumes it (same epoch) at next_seq 2^40 and sends batches from there on."""

    def __init__(self, description: pb.DescribeResponse) -> None:
        super().__init__(description, batch)
        self.cut = threading.Event()

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        with self._lock:
            self.sessions += 1
            first = self.sessions == 1
        if first:  # batches 1 and 2 on their credits, as an actor sends them
            yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
            later = (r.credit.batches if r.HasField("credit") else 0 for r in requests)
            granted = itertools.accumulate(itertools.chain([opening.credits], later))
            yield batch(1)
            next(total for total in granted if total >= 2)
            yield batch(2)
            self.cut.wait(30)
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost")
        opened = pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=2**40, resumed=True)
        yield pb.CollectResponse(opened=opened)
        for seq in range(2**40, 2**40 + opening.credits):
            yield batch(seq)


def test_a_session_resumed_far_beyond_the_last_batch_is_refused_and_counts_no_gap(
    description,
) -> None:
    """A resumed session re-sends the batches its actor holds unacknowledged (at most 1024),
    then goes on: one resumed after seq 2 at next_seq 2^40 is refused. Its batches used to be
    delivered, counting 2^40 - 3 gaps."""
    servicer = ResumingFarAhead(description)
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=100 * FRAMES, batch_timeout=1.0
        ) as collector:
            collector.next()
            collector.next()
            servicer.cut.set()
            with pytest.raises(MissingWorkersError) as raised:
                collector.next()
            stats = collector.stats()
    finally:
        servicer.cut.set()
        server.stop(None)
    assert "resumes after seq 2 at next_seq 1099511627776" in str(raised.value)
    assert (stats["frames"], stats["gaps"]) == (2 * FRAMES, 0)


class ReusingItsSeqs(HostileActor):
    """Its first session sends batch 1 and breaks once ``cut`` is set; every later session
    starts the same epoch afresh at next_seq 1 and sends batch 1 (the same frames) again."""

    def __init__(self, description: pb.DescribeResponse) -> None:
        super().__init__(description, batch)
        self.cut = threading.Event()

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        next(requests)
        with self._lock:
            self.sessions += 1
            first = self.sessions == 1
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
        yield batch(1, _with("observation", torch.ones(1, FRAMES, 4)))
        if first:
            self.cut.wait(30)
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost")
        self.cut.wait(30)


def test_a_fresh_session_reusing_seqs_of_its_epoch_is_refused_and_delivers_nothing_twice(
    description,
) -> None:
    """An epoch never reuses a seq: a session of the epoch followed that starts afresh at
    next_seq 1 after batch 1 was received is refused. Batch 1 (the same epoch and seq) used
    to be delivered a second time."""
    servicer = ReusingItsSeqs(description)
    server, address = serve(servicer)
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, batch_timeout=1.0) as collector:
            first = collector.next()
            assert bool((first["observation"] == 1).all())
            servicer.cut.set()
            with pytest.raises(MissingWorkersError) as raised:
                collector.next()
            stats = collector.stats()
    finally:
        servicer.cut.set()
        server.stop(None)
    assert f"starts epoch {EPOCH} afresh at next_seq 1, but seq 1 of it was received" in str(
        raised.value
    )
    assert (stats["frames"], stats["batches"], stats["duplicates"]) == (FRAMES, 1, 0)


class SeededFarAhead(HostileActor):
    """Answers SetSeed with a ``first_seq`` no actor gives: 2^64-1."""

    def SetSeed(self, request: pb.SetSeedRequest, context: Any) -> pb.SetSeedResponse:
        return pb.SetSeedResponse(next_seed=request.seed + 1, first_seq=U64)


def test_a_seeding_whose_first_seq_is_beyond_the_batches_collected_is_refused(
    description,
) -> None:
    """An actor seeded after a few batches gives a first_seq at most its credits beyond the
    last batch received: one of 2^64-1 is a ProtocolError naming it. It used to drop every
    later batch of the actor as collected before the seeding, shown as "streaming"."""
    server, address = serve(SeededFarAhead(description, batch))
    try:
        with GrpcCollector([address], frames_per_batch=FRAMES, batch_timeout=3.0) as collector:
            collector.next()
            named = rf"^{address} \(worker_id {description.worker_id}\): SetSeed gives"
            with pytest.raises(ProtocolError, match=f"{named} first_seq {U64}"):
                collector.set_seed(1)
            assert collector.next().numel() == FRAMES
            assert collector.stats()["discarded"] == 0
    finally:
        server.stop(None)
