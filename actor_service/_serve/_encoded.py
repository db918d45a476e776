"""A collected batch as the serialised chunk messages that carry it, built on the collection thread.

:func:`collect_encoded` collects one batch and encodes it: the batch's packet
and, for a folded batch (:mod:`common.packets.folding`), its finals packet, cut into
chunks of at most ``CHUNK_BYTES`` without copying and checksummed from the
batch's own memory; each chunk is then copied once, into its serialised
``CollectResponse`` (:func:`actor_service._serve._wire.encode_chunk`), the first one
carrying the ``BatchInfo``.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
from tensordict import TensorDictBase

from actor_service._core._protocol import CollectionCore
from actor_service._serve._wire import encode_chunk
from common.packets import checksummed_pieces, encode_packet
from common.packets.folding import FoldedBatch
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = ["EncodedBatch", "collect_encoded"]


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    """A collected batch, encoded and cut into serialised chunk messages, ready to (re)send.

    The messages are serialised on the collection thread, seq and ``BatchInfo``
    included (the seq a batch will get is known when it starts: one batch is in
    flight at a time and nothing else moves the book's next seq meanwhile), so
    the event loop only writes them; a resend writes the same bytes.

    Attributes:
        messages: One serialised ``CollectResponse(chunk=...)`` per chunk, in
            order; their data concatenate to the packet.
        seq: The seq the batch was encoded with.
        packet_bytes: Length of the data: the packet, and the finals packet when folded.
        crc32c: CRC-32C of the data.
        frames: Frames in the batch.
        model_id: The model that acted.
        policy_version_min: Lowest policy version among the frames.
        policy_version_max: Highest policy version among the frames.
    """

    messages: tuple[bytes, ...]
    seq: int
    packet_bytes: int
    crc32c: int
    frames: int
    model_id: str
    policy_version_min: int
    policy_version_max: int


def collect_encoded(
    core: CollectionCore,
    model_id: str,
    *,
    seq: int,
    epoch: int,
    worker_id: int,
    abandon: threading.Event | None = None,
) -> EncodedBatch:
    """Collect one batch and encode it as batch ``seq`` of ``epoch``; runs on the collection thread.

    Args:
        core: The collection core.
        model_id: The model that acts.
        seq: The seq the book will give this batch.
        epoch: The actor epoch.
        worker_id: The actor's worker id.
        abandon: Set to give the batch up before its next env step.
    """
    collected = core.collect_batch(abandon)
    td = collected.batch if isinstance(collected, FoldedBatch) else collected
    packets = [encode_packet(td)]
    if isinstance(collected, FoldedBatch):
        packets.append(encode_packet(collected.finals))
    low, high = _version_range(td, core, model_id)
    pieces, crc32c = checksummed_pieces(packets)
    nbytes = sum(packet.nbytes for packet in packets)
    # An LLM batch of last steps only accounts for the dialog turns it dropped too.
    frames = int(getattr(core, "last_batch_frames", 0) or td.numel())
    info = pb.BatchInfo(
        worker_id=worker_id,
        epoch=epoch,
        seq=seq,
        frames=frames,
        total_bytes=nbytes,
        crc32c=crc32c,
        model_id=model_id,
        policy_version_min=low,
        policy_version_max=high,
    )
    if len(packets) > 1:
        info.fold.finals_bytes = packets[1].nbytes
    return EncodedBatch(
        messages=_chunk_messages(pieces, seq, info),
        seq=seq,
        packet_bytes=nbytes,
        crc32c=crc32c,
        frames=frames,
        model_id=model_id,
        policy_version_min=low,
        policy_version_max=high,
    )


def _version_range(td: TensorDictBase, core: CollectionCore, model_id: str) -> tuple[int, int]:
    """Lowest and highest policy version among a batch's frames."""
    versions = [
        td.get(key)
        for key in ("policy_version", ("next", "policy_version"))
        if key in td.keys(include_nested=True)
    ]
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
