"""The actor's batch segments: one per unacked batch, reused after the ack, never spoiled ones.

And a batch that went into a segment is sent again as bytes from its own memory, only while
that memory still holds what was encoded.
"""

from __future__ import annotations

import os

import pytest
import torch
from actor_harness import Actor, RawCollect, open_request
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
