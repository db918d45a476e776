"""A collected batch as the serialised chunk messages that carry it, built on the collection thread.

:func:`collect_encoded` collects one batch and encodes it: the batch's packet
and, for a folded batch (:mod:`common.packets.folding`), its finals packet, cut into
chunks of at most ``CHUNK_BYTES`` without copying and checksummed from the
batch's own memory; each chunk is then copied once, into its serialised
``CollectResponse`` (:func:`actor_service._serve._wire.encode_chunk`), the first one
carrying the ``BatchInfo``. In a session that takes batches through shared memory the data
is copied once into a segment instead (:class:`~actor_service._serve._shm.BatchSegments`)
and the batch travels as one control message; its chunk messages are built only if it is
re-sent to a session that takes bytes.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
from tensordict import TensorDictBase

from actor_service._core._frames import SPLIT_MASK
from actor_service._core._protocol import CollectionCore
from actor_service._serve._shm import BatchSegments
from actor_service._serve._wire import encode_chunk, encode_control
from common.checksum import crc32c
from common.config import CHUNK_BYTES
from common.errors import SessionStateError
from common.packets import EncodedPacket, checksummed_pieces, cut_chunks, encode_packet
from common.packets.folding import FoldedBatch
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import Segment

__all__ = ["EncodedBatch", "collect_encoded"]


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    """A collected batch, encoded and cut into serialised chunk messages, ready to (re)send.

    The messages are serialised on the collection thread, seq and ``BatchInfo``
    included (the seq a batch will get is known when it starts: one batch is in
    flight at a time and nothing else moves the book's next seq meanwhile), so
    the event loop only writes them; a resend writes the same bytes.

    Attributes:
        info: The ``BatchInfo`` its first chunk carries: seq, frames, length
            (``total_bytes``: the packet, and the finals packet when folded), CRC-32C,
            model and policy versions.
        messages: One serialised ``CollectResponse(chunk=...)`` per chunk, in
            order; their data concatenate to the packet. Empty when the batch went
            into a segment (:meth:`wire` builds them from ``pieces`` if needed).
        pieces: The chunks' data, as views of the batch's memory (kept for a resend as
            bytes of a batch that went into a segment; empty otherwise).
        shm_message: The serialised ``CollectResponse(chunk=...)`` naming the batch's
            segment, when it went into one.
    """

    info: pb.BatchInfo
    messages: tuple[bytes, ...]
    pieces: tuple[list[memoryview], ...] = ()
    shm_message: bytes | None = None

    @property
    def seq(self) -> int:
        """The seq the batch was encoded with."""
        return int(self.info.seq)

    @property
    def frames(self) -> int:
        """Frames in the batch (an LLM batch of last steps counts the turns it dropped too)."""
        return int(self.info.frames)

    def wire(self, shm_batches: bool) -> tuple[bytes, ...]:
        """The messages that send this batch on a session with or without ``shm_batches``.

        Raises:
            SessionStateError: The batch's memory changed since it was encoded (a core
                that reused it), so it cannot be sent again as bytes.
        """
        if self.shm_message is not None and shm_batches:
            return (self.shm_message,)
        if self.messages:
            return self.messages
        crc = 0
        for view in (view for piece in self.pieces for view in piece):
            crc = crc32c(view, crc)
        if crc != self.info.crc32c:
            raise SessionStateError(
                f"batch seq {self.seq} changed in memory since it was encoded: "
                "it cannot be sent again as bytes"
            )
        return _chunk_messages(list(self.pieces), self.seq, self.info)


def collect_encoded(
    core: CollectionCore,
    model_id: str,
    *,
    seq: int,
    epoch: int,
    worker_id: int,
    abandon: threading.Event | None = None,
    segments: BatchSegments | None = None,
) -> EncodedBatch:
    """Collect one batch and encode it as batch ``seq`` of ``epoch``; runs on the collection thread.

    Args:
        core: The collection core.
        model_id: The model that acts.
        seq: The seq the book will give this batch.
        epoch: The actor epoch.
        worker_id: The actor's worker id.
        abandon: Set to give the batch up before its next env step.
        segments: Write the batch into one of these (the session takes shared-memory
            batches); None, or no segment to be had, encodes chunk messages.
    """
    collected = core.collect_batch(abandon)
    td = collected.batch if isinstance(collected, FoldedBatch) else collected
    packets = [encode_packet(td)]
    if isinstance(collected, FoldedBatch):
        packets.append(encode_packet(collected.finals))
    real = td.get(SPLIT_MASK, None)  # a split batch's real frames; the rest is padding
    low, high = _version_range(td, core, model_id, real)
    nbytes = sum(packet.nbytes for packet in packets)
    # An LLM batch of last steps only accounts for the dialog turns it dropped too.
    counted = td.numel() if real is None else int(real.sum())
    frames = int(getattr(core, "last_batch_frames", 0) or counted)
    info = pb.BatchInfo(
        worker_id=worker_id,
        epoch=epoch,
        seq=seq,
        frames=frames,
        total_bytes=nbytes,
        model_id=model_id,
        policy_version_min=low,
        policy_version_max=high,
    )
    if len(packets) > 1:
        info.fold.finals_bytes = packets[1].nbytes
    return _encoded(packets, info, segments)


def _encoded(
    packets: list[EncodedPacket],
    info: pb.BatchInfo,
    segments: BatchSegments | None,
    chunk_bytes: int = CHUNK_BYTES,
) -> EncodedBatch:
    """The batch of ``info`` (its CRC-32C still to set) whose data ``packets`` are.

    In a segment when ``segments`` has one (checksummed as it is copied there), else as
    chunk messages (checksummed first: the first message carries the CRC-32C).
    """
    if segments is not None:
        parts = [part for packet in packets for part in packet.parts()]
        segment = segments.write((info.epoch, info.seq), parts, info.total_bytes)
        if segment is not None:
            info.crc32c = segment.crc32c
            return EncodedBatch(
                info=info,
                messages=(),
                pieces=tuple(cut_chunks(parts, chunk_bytes)),
                shm_message=_shm_message(info.seq, info, segment),
            )
    pieces, info.crc32c = checksummed_pieces(packets, chunk_bytes)
    return EncodedBatch(info=info, messages=_chunk_messages(pieces, info.seq, info), pieces=())


def _shm_message(seq: int, info: pb.BatchInfo, segment: Segment) -> bytes:
    """The one chunk message of a batch that lies in ``segment``."""
    shm = pb.ShmSegment(name=segment.name, size=segment.size, crc32c=segment.crc32c)
    chunk = pb.BatchChunk(seq=seq, index=0, count=1, info=info, shm=shm)
    return encode_control(pb.CollectResponse(chunk=chunk))


def _version_range(
    td: TensorDictBase, core: CollectionCore, model_id: str, real: torch.Tensor | None
) -> tuple[int, int]:
    """Lowest and highest policy version among a batch's frames (``real`` ones, if given)."""
    versions = [
        td.get(key)
        for key in ("policy_version", ("next", "policy_version"))
        if key in td.keys(include_nested=True)
    ]
    if real is not None:  # a split batch's padding holds version 0
        versions = [v.reshape(*real.shape, -1)[real] for v in versions]
    if versions:
        flat = torch.cat([v.reshape(-1) for v in versions])
        return int(flat.min()), int(flat.max())
    version = int(core.models.policy_version(model_id))
    return version, version


def _chunk_messages(
    pieces: list[list[memoryview]], seq: int, info: pb.BatchInfo
) -> tuple[bytes, ...]:
    """The serialised chunk messages, the first carrying ``info``: each piece copied once."""
    count = len(pieces)
    return tuple(
        encode_chunk(seq=seq, index=i, count=count, data=piece, info=info if i == 0 else None)
        for i, piece in enumerate(pieces)
    )
