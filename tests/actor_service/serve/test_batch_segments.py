"""The actor's batch segments: one per unacked batch, reused after the ack, never spoiled ones.

And a batch that went into a segment is sent again as bytes from its own memory, only while
that memory still holds what was encoded.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from actor_harness import Actor, RawCollect, open_request
from helpers import poll_until
from tensordict import TensorDict

from actor_service._serve._encoded import _encoded
from actor_service._serve._shm import IDLE_BATCH_SEGMENTS, BatchSegments
from common.checksum import crc32c
from common.errors import SessionStateError
from common.packets import checksummed_pieces, encode_packet
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import SHM_ROOT, Segment, read_segment


def _write(segments: BatchSegments, seq: int, data: bytes) -> Segment:
    segment = segments.write((1, seq), [memoryview(data)], len(data))
    assert segment is not None
    assert segment.crc32c == crc32c(data)
    return segment


def _exists(segment: Segment) -> bool:
    return os.path.exists(os.path.join(SHM_ROOT, segment.name))


def test_a_segment_is_filled_again_only_after_its_batch_is_acked() -> None:
    segments = BatchSegments(held=3)
    try:
        first, second = _write(segments, 1, b"a" * 64), _write(segments, 2, b"b" * 64)
        assert first.name != second.name
        assert read_segment(first) == b"a" * 64  # unacked: untouched by batch 2
        segments.acked(1, 1)
        third = _write(segments, 3, b"c" * 64)
        assert third.name == first.name  # batch 1's segment, now batch 3's
        assert read_segment(third) == b"c" * 64
        assert _write(segments, 4, b"d" * 32).name not in {first.name, second.name}  # size
        segments.acked(2, 4)  # another epoch's ack frees nothing of this one
        assert _write(segments, 5, b"e" * 64).name not in {first.name, second.name}
    finally:
        segments.close()
    assert not _exists(first)
    assert not _exists(second)


def test_unacked_segments_are_capped_and_idle_ones_too() -> None:
    segments = BatchSegments(held=2)
    try:
        made = [_write(segments, seq, bytes([seq]) * 64) for seq in range(1, 5)]
        assert [_exists(s) for s in made] == [False, False, True, True]  # the oldest go
        more = [_write(segments, seq, bytes([seq]) * (64 + seq)) for seq in range(5, 12)]
        segments.acked(1, 11)
        assert sum(_exists(s) for s in made + more) == min(2, IDLE_BATCH_SEGMENTS)
    finally:
        segments.close()


def test_a_segment_reused_after_its_ack_is_held_for_its_new_batch_alone() -> None:
    """Batch 1's segment, acked and filled with batch 3, belongs to batch 3 only: however
    many batches follow within the cap, batch 3 stays readable until it is acked."""
    segments = BatchSegments(held=3)
    try:
        _write(segments, 1, b"a" * 64)
        _write(segments, 2, b"b" * 64)
        segments.acked(1, 2)
        third = _write(segments, 3, b"c" * 64)
        fourth, fifth = _write(segments, 4, b"d" * 64), _write(segments, 5, b"e" * 64)
        assert read_segment(third) == b"c" * 64  # unacked, within the cap of 3
        assert (read_segment(fourth), read_segment(fifth)) == (b"d" * 64, b"e" * 64)
    finally:
        segments.close()


@pytest.mark.parametrize("spoil", ["removed", "opened to others", "replaced"])
def test_a_spoiled_segment_is_never_named_again(spoil: str) -> None:
    segments = BatchSegments(held=2)
    try:
        first = _write(segments, 1, b"a" * 64)
        path = os.path.join(SHM_ROOT, first.name)
        if spoil == "removed":
            os.unlink(path)
        elif spoil == "opened to others":
            os.chmod(path, 0o644)
        else:
            os.unlink(path)
            with open(path, "wb") as file:  # another file under the same name
                file.write(b"x" * 64)
            os.chmod(path, 0o600)
        segments.acked(1, 1)
        second = _write(segments, 2, b"b" * 64)
        assert second.name != first.name
        assert read_segment(second) == b"b" * 64
    finally:
        segments.close()
        if os.path.exists(path):
            os.unlink(path)


def test_a_batch_in_a_segment_is_sent_again_as_bytes_while_its_memory_is_unchanged() -> None:
    batch = TensorDict({"observation": torch.arange(96.0).view(2, 3, 16)}, batch_size=[2, 3])
    packet = encode_packet(batch)
    pieces, crc = checksummed_pieces([packet], chunk_bytes=128)
    info = pb.BatchInfo(seq=5, epoch=1, frames=6, total_bytes=packet.nbytes)
    segments = BatchSegments(held=2)
    try:
        encoded = _encoded([packet], info, segments, chunk_bytes=128)
        assert encoded.messages == ()
        (control,) = encoded.wire(True)
        chunk = pb.CollectResponse.FromString(control).chunk
        assert (chunk.seq, chunk.count, chunk.data, chunk.info.crc32c) == (5, 1, b"", crc)
        shm = chunk.shm
        assert read_segment(Segment(shm.name, shm.size, shm.crc32c)) == bytes(packet.tobytes())
        sent = [pb.CollectResponse.FromString(m).chunk for m in encoded.wire(False)]
        assert len(sent) == len(pieces) > 1
        assert not any(c.HasField("shm") for c in sent)
        assert b"".join(c.data for c in sent) == bytes(packet.tobytes())
        batch["observation"][0, 0, 0] = -1.0  # a core that reused the batch's memory
        with pytest.raises(SessionStateError, match="changed in memory"):
            encoded.wire(False)
    finally:
        segments.close()


def test_an_actor_that_stops_removes_the_segments_of_its_batches(make_actor: object) -> None:
    actor: Actor = make_actor(shared_memory=True)
    prefix = f"rlfleet-shm-{os.getpid()}-"
    before = {name for name in os.listdir(SHM_ROOT) if name.startswith(prefix)}
    session = RawCollect.open(actor.stub, open_request(credits=2, shm_batches=True))
    session.opened()
    replies = [session.next(), session.next()]
    assert all(isinstance(reply, pb.CollectResponse) for reply in replies), replies
    made = {name for name in os.listdir(SHM_ROOT) if name.startswith(prefix)} - before
    assert made, "the batches went as bytes, not through segments"
    session.cancel()
    actor.handle.stop()
    assert not made & set(os.listdir(SHM_ROOT)), "segments outlived the actor"


def test_a_batch_finished_after_the_actor_stopped_leaves_no_segment(
    make_actor: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch still on the collection thread when the actor closes (its close gave up
    waiting for it) is not written into a segment nobody would ever remove."""
    actor: Actor = make_actor(shared_memory=True)
    prefix = f"rlfleet-shm-{os.getpid()}-"
    before = {name for name in os.listdir(SHM_ROOT) if name.startswith(prefix)}
    entered, gate, done = threading.Event(), threading.Event(), threading.Event()
    write = BatchSegments.write

    def held_write(self: BatchSegments, *args: Any) -> Segment | None:
        entered.set()
        gate.wait(30)
        try:
            return write(self, *args)
        finally:
            done.set()

    monkeypatch.setattr(BatchSegments, "write", held_write)
    session = RawCollect.open(actor.stub, open_request(credits=1, shm_batches=True))
    session.opened()
    assert entered.wait(30), "the batch never reached its segment"
    session.cancel()
    actor.handle.stop(grace=1.0)  # its close gives up on the held collection thread
    gate.set()
    assert done.wait(30)
    made = {name for name in os.listdir(SHM_ROOT) if name.startswith(prefix)} - before
    assert not made, "a segment outlived the actor"


def _shm_batches(session: RawCollect, count: int) -> dict[int, Segment]:
    """The next ``count`` batches of ``session``, each a chunk naming its segment, by seq."""
    named = {}
    for _ in range(count):
        reply = session.next()
        assert isinstance(reply, pb.CollectResponse), reply
        assert reply.HasField("chunk"), reply
        shm = reply.chunk.shm
        assert reply.chunk.HasField("shm"), "the batch went as bytes, not through a segment"
        named[reply.chunk.seq] = Segment(shm.name, shm.size, shm.crc32c)
    return named


def _resume(actor: Actor, epoch: int, after: int, credits: int) -> RawCollect:
    """A new session of learner A resuming ``epoch`` after seq ``after`` (the last one ended)."""
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    session = RawCollect.open(
        actor.stub,
        open_request(
            credits=credits,
            shm_batches=True,
            learner_id="A",
            resume_epoch=epoch,
            resume_after_seq=after,
        ),
    )
    assert session.opened().resumed
    return session


def test_every_unacked_batch_resent_over_shared_memory_still_lies_in_its_segment(
    make_actor: Callable[..., Actor],
) -> None:
    """max_credits unacked batches all keep their segments, so a learner that resumes reads
    every re-sent one; segments of batches a resume let go are the ones removed first."""
    actor = make_actor(shared_memory=True, max_credits=4)
    session = RawCollect.open(actor.stub, open_request(credits=4, shm_batches=True, learner_id="A"))
    epoch = session.opened().epoch
    for after in (0, 4):  # then: batches 1-4 let go by the resume, 5-8 unacked
        if after:
            session.cancel()
            session = _resume(actor, epoch, after, credits=4)
        sent = _shm_batches(session, 4)
        assert sorted(sent) == [after + 1, after + 2, after + 3, after + 4]
        session.cancel()
        session = _resume(actor, epoch, after, credits=0)
        resent = _shm_batches(session, 4)
        assert resent == sent
        for segment in resent.values():
            assert read_segment(segment) is not None  # still there, its CRC-32C checked
    session.close()


def test_a_learner_taking_the_session_over_never_frees_the_segments_of_the_one_it_ended(
    make_actor: Callable[..., Actor],
) -> None:
    """Learner A has not read batches 1-2 from their segments yet when B takes the session
    over: B's acks free B's own segments only, so no later batch (of A's size: B resumes
    with A's settings) is written where A was told its batches lie."""
    actor = make_actor(shared_memory=True, max_credits=2)
    a = RawCollect.open(
        actor.stub, open_request(frames_per_batch=20, credits=2, shm_batches=True, learner_id="A")
    )
    epoch = a.opened().epoch
    held_by_a = _shm_batches(a, 2)
    b = RawCollect.open(
        actor.stub,
        open_request(
            frames_per_batch=10, credits=1, shm_batches=True, learner_id="B", take_over=True
        ),
    )
    assert not b.opened().resumed
    assert a.end()[0].reason == pb.END_REASON_TAKEN_OVER  # A read nothing of its segments
    assert list(_shm_batches(b, 1)) == [3]
    b.ack(3)  # B holds batch 3; A still holds (and has not read) batches 1 and 2
    b.close()
    assert b.end()[0].reason == pb.END_REASON_CLOSED
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    b = RawCollect.open(
        actor.stub,
        open_request(
            frames_per_batch=20,
            credits=2,
            shm_batches=True,
            learner_id="B",
            resume_epoch=epoch,
            resume_after_seq=3,
        ),
    )
    assert b.opened().resumed
    assert sorted(_shm_batches(b, 2)) == [4, 5]
    for segment in held_by_a.values():
        assert read_segment(segment) is not None  # never filled with one of B's batches
    b.close()
