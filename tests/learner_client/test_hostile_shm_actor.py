"""A real gRPC server as a hostile actor that claims the learner's host: its shared-memory chunks.

The server answers Describe as a real actor on this host would (this host's identity, the
probe read back), so the learner asks it for batches through shared memory, and sends each
batch as one ``BatchChunk.shm`` a test builds. A control that no actor sends (a size of
2^64-1, a size or CRC-32C other than the info's, data beside the segment, more than one
chunk, a segment the session did not ask for) is refused before the segment is read (a
ProtocolError; PacketTooLargeError for the size) and counts nothing. A
segment the learner may not trust (a name outside the pattern, a link to another file, a
file of another size, one opened to others) is never read: that actor's batches come as
bytes from then on, the refused one included, and none is lost, repeated or corrupted. A
segment grown in place and named at its new size is read whole, from a mapping of that size.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_harness import EPOCH, FRAMES, U64, HostileActor, batch, data_of_size, serve

from common.checksum import crc32c
from common.packets import encode_packet
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import SHM_ROOT, host_identity, remove_segment, write_segment
from learner_client import GrpcCollector, MissingWorkersError


def packet_of(seq: int) -> bytes:
    """Batch ``seq``'s packet: an honest one, told apart from its neighbours by its reward."""
    return encode_packet(_data_of(seq)).tobytes()


def _data_of(seq: int) -> Any:
    data = data_of_size([1, FRAMES])
    data["next", "reward"] = torch.full((1, FRAMES, 1), float(seq))
    return data


def _crc(packet: bytes) -> int:
    return crc32c(packet)


def shm_chunk(seq: int, control: pb.ShmSegment, packet: bytes) -> pb.BatchChunk:
    """Batch ``seq`` (of ``packet``) as the one chunk naming ``control``, as an actor sends it."""
    info = pb.BatchInfo(
        worker_id=0, epoch=EPOCH, seq=seq, frames=FRAMES, model_id="policy",
        total_bytes=len(packet), crc32c=_crc(packet),
    )  # fmt: skip
    return pb.BatchChunk(seq=seq, index=0, count=1, info=info, shm=control)


class SharedMemoryActor(HostileActor):
    """Claims this host; sends ``chunks(seq, packet)`` (a chunk or a list of them) while a
    session asks for segments (or ``always``), and batch ``seq`` as bytes otherwise.
    ``asked``: each session's ask."""

    def __init__(
        self,
        description: pb.DescribeResponse,
        chunks: Callable[[int, bytes], pb.BatchChunk | list[pb.BatchChunk]],
        always: bool = False,
    ) -> None:
        local = pb.DescribeResponse()
        local.CopyFrom(description)
        local.host_identity = host_identity()
        local.shm_probe_ok = True
        super().__init__(local, batch)
        self.chunks, self.always = chunks, always
        self.asked: list[bool] = []

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        self.asked.append(opening.shm_batches)
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=0, epoch=EPOCH, next_seq=1))
        seq = opening.resume_after_seq + 1
        later = (r.credit.batches if r.HasField("credit") else 0 for r in requests)
        for granted in itertools.chain([opening.credits], later):
            for _ in range(granted):
                if opening.shm_batches or self.always:
                    made = self.chunks(seq, packet_of(seq))
                    for chunk in made if isinstance(made, list) else [made]:
                        yield pb.CollectResponse(chunk=chunk)
                else:
                    yield batch(seq, _data_of(seq))
                seq += 1


def collect_two(servicer: SharedMemoryActor) -> tuple[list[float], dict[str, Any]]:
    """Two batches' mean rewards (their seqs) from ``servicer``, and the collector's stats."""
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, total_frames=2 * FRAMES, batch_timeout=10.0
        ) as collector:
            rewards = [float(b["next", "reward"].mean()) for b in collector]
            stats = collector.stats()
    finally:
        server.stop(None)
    return rewards, stats


@pytest.fixture
def plant(tmp_path: Path) -> Iterator[Callable[[bytes, str], pb.ShmSegment]]:
    """Plants ``data`` as ``how`` says; its control, claiming the data's size and CRC-32C.

    ``how``: "segment" (private), "opened to others" (0644), "another size" (16 bytes more
    than claimed), "a link" (in ``/dev/shm`` to a private file elsewhere), "outside the
    pattern" (a path to that file). Each planted name is removed after the test.
    """
    names: list[str] = []

    def planted(data: bytes, how: str = "segment") -> pb.ShmSegment:
        target = tmp_path / f"packet-{secrets.token_hex(4)}"
        target.write_bytes(data)
        target.chmod(0o600)
        name = f"rlfleet-shm-{os.getpid()}-{secrets.token_hex(16)}"
        if how == "outside the pattern":
            name = os.path.relpath(target, SHM_ROOT)
        elif how == "a link":
            os.symlink(target, os.path.join(SHM_ROOT, name))
        else:
            padded = data + bytes(16) if how == "another size" else data
            name = write_segment(padded).name
            os.chmod(os.path.join(SHM_ROOT, name), 0o644 if how == "opened to others" else 0o600)
        names.append(name)
        return pb.ShmSegment(name=name, size=len(data), crc32c=_crc(data))

    yield planted
    for name in names:
        remove_segment(name)


def test_an_honest_segment_from_the_test_server_is_read(description, plant) -> None:
    """The harness itself: a private segment holding the packet is read as the batch."""
    servicer = SharedMemoryActor(description, lambda seq, p: shm_chunk(seq, plant(p), p))
    rewards, stats = collect_two(servicer)
    assert rewards == [1.0, 2.0]
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (2, 0)
    assert servicer.asked == [True]


@pytest.mark.parametrize(
    "how", ["outside the pattern", "a link", "another size", "opened to others"]
)
def test_a_segment_the_learner_may_not_trust_is_never_read(description, plant, how) -> None:
    """Each holds the honest packet, CRC-32C and all: read, it would pass as the batch. The
    learner refuses it, re-opens taking bytes, and gets each batch once, as bytes."""
    servicer = SharedMemoryActor(description, lambda seq, p: shm_chunk(seq, plant(p, how), p))
    rewards, stats = collect_two(servicer)
    assert rewards == [1.0, 2.0]
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (0, 1)
    assert servicer.asked == [True, False]


def _sized(chunk: pb.BatchChunk, size: int) -> pb.BatchChunk:
    chunk.info.total_bytes = chunk.shm.size = size
    return chunk


def _set(chunk: pb.BatchChunk, message: Any, **fields: Any) -> pb.BatchChunk:
    for name, value in fields.items():
        setattr(message, name, value)
    return chunk


def refused(servicer: SharedMemoryActor, **settings: Any) -> str:
    """Why the first batch from ``servicer`` failed, once nothing was counted."""
    server, address = serve(servicer)
    try:
        with GrpcCollector(
            [address], frames_per_batch=FRAMES, batch_timeout=1.0, **settings
        ) as collector:
            with pytest.raises(MissingWorkersError) as raised:
                collector.next()
            stats = collector.stats()
    finally:
        server.stop(None)
    assert (stats["frames"], stats["batches"], stats["shm_batches"]) == (0, 0, 0)
    return str(raised.value)


#: case: (the lie, made of an honest chunk naming an honest segment; what the error names).
LYING = {
    "size_2^64-1": (lambda c: _sized(c, U64), "PacketTooLargeError: packet of 184467440737"),
    "size_not_the_infos": (lambda c: _set(c, c.shm, size=c.shm.size + 1), "differs from"),
    "crc_not_the_infos": (lambda c: _set(c, c.shm, crc32c=c.shm.crc32c ^ 1), "differs from"),
    "data_beside_it": (lambda c: _set(c, c, data=b"x"), "has data"),
    "two_chunks": (lambda c: _set(c, c, count=2), "must be one chunk"),
    "not_the_first_chunk": (lambda c: _set(c, c, index=1), "must be one chunk"),
    "seq_not_the_infos": (lambda c: _set(c, c, seq=c.seq + 1), "must be one chunk"),
    "other_epoch": (lambda c: _set(c, c.info, epoch=EPOCH + 1), f"epoch {EPOCH + 1}"),
}


@pytest.mark.parametrize("case", list(LYING), ids=list(LYING))
def test_a_shared_memory_chunk_that_lies_is_refused(description, plant, case) -> None:
    """The segment is honest, the control around it is not: refused, nothing counted."""
    lie, named = LYING[case]
    servicer = SharedMemoryActor(description, lambda s, p: lie(shm_chunk(s, plant(p), p)))
    assert named in refused(servicer)
    assert servicer.asked[0]


def test_a_segment_the_session_did_not_ask_for_is_a_protocol_error(description, plant) -> None:
    """A learner that asked for bytes is named a segment anyway: never read, nothing counted."""
    servicer = SharedMemoryActor(description, lambda s, p: shm_chunk(s, plant(p), p), always=True)
    why = refused(servicer, shared_memory_batches=False)
    assert "ProtocolError" in why
    assert "did not ask" in why
    assert not servicer.asked[0]


def test_a_segment_named_inside_a_batch_of_bytes_is_a_protocol_error(description, plant) -> None:
    """Chunk 0 of 2 carries bytes, chunk 1 names a segment holding the rest: never read."""

    def split(seq: int, packet: bytes) -> list[pb.BatchChunk]:
        half = len(packet) // 2
        first = shm_chunk(seq, plant(packet), packet)
        first.ClearField("shm")
        first.count, first.data = 2, packet[:half]
        return [first, pb.BatchChunk(seq=seq, index=1, count=2, shm=plant(packet[half:]))]

    why = refused(SharedMemoryActor(description, split))
    assert "ProtocolError" in why
    assert "shared-memory chunk inside batch" in why


def test_a_segment_grown_in_place_is_read_whole_at_its_new_size(description) -> None:
    """Batch 1 lies in a segment; batch 2, a larger packet, in the same file grown to hold
    it, named at its new size. The learner maps it afresh (no mapping of the old size serves
    the larger read) and gets each batch once, from the segment."""
    name = write_segment(bytes(1)).name
    path = os.path.join(SHM_ROOT, name)

    def grown(seq: int, packet: bytes) -> pb.BatchChunk:
        if seq == 2:  # a larger packet: an extra entry
            data = _data_of(seq)
            data["extra"] = torch.zeros(1, FRAMES, 64)
            packet = encode_packet(data).tobytes()
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, len(packet))
            os.pwrite(fd, packet, 0)
        finally:
            os.close(fd)
        control = pb.ShmSegment(name=name, size=len(packet), crc32c=_crc(packet))
        return shm_chunk(seq, control, packet)

    try:
        rewards, stats = collect_two(SharedMemoryActor(description, grown))
    finally:
        remove_segment(name)
    assert rewards == [1.0, 2.0]
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (2, 0)
