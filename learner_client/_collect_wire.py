"""How the learner reads a ``Collect`` response: a plain chunk's data as a view, no copy.

Protobuf's parser would copy a 3 MiB chunk into a new ``bytes`` before the batch assembler
copies it again. A response that is one plain chunk (only known, unrepeated fields) is
read here, its ``data`` a view of gRPC's message bytes; anything else is parsed by
protobuf as before, so every message means what protobuf says (the tests compare both
parsers on the same bytes). A message that does not parse raises ``DecodeError``, which
:func:`common.replies.parsing_channel` turns into a ``ProtocolError`` as for every call.
"""

from __future__ import annotations

import dataclasses

from common.protowire import length_delimited
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = ["Chunk", "parse_collect_response"]

# CollectResponse.chunk: field 2, length-delimited.
_COLLECT_CHUNK_TAG = 0x12
# BatchChunk fields: number -> wire type (0 varint, 2 length-delimited).
_CHUNK_FIELDS = {1: 0, 2: 0, 3: 0, 4: 2, 5: 2}
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A ``BatchChunk`` whose data views the received message (the fields of ``pb.BatchChunk``)."""

    seq: int
    index: int
    count: int
    data: memoryview
    info: pb.BatchInfo | None
    shm: pb.ShmSegment | None = None

    @classmethod
    def from_proto(cls, chunk: pb.BatchChunk) -> Chunk:
        """The same chunk from a parsed message."""
        info = chunk.info if chunk.HasField("info") else None
        shm = chunk.shm if chunk.HasField("shm") else None
        return cls(chunk.seq, chunk.index, chunk.count, memoryview(chunk.data), info, shm)


def parse_collect_response(data: bytes) -> pb.CollectResponse | Chunk:
    """The ``Collect`` response deserializer: a :class:`Chunk` for a plain chunk message.

    Args:
        data: One serialised ``CollectResponse``.

    Returns:
        A :class:`Chunk` viewing ``data``, or the message as protobuf parses it.

    Raises:
        DecodeError: ``data`` is no valid message (a string field that is not UTF-8, a
            truncated one: a broken actor, or one whose build retyped a field).
    """
    body = length_delimited(data, _COLLECT_CHUNK_TAG)
    chunk = None if body is None else _plain_chunk(body)
    return chunk if chunk is not None else pb.CollectResponse.FromString(data)


def _plain_chunk(view: memoryview) -> Chunk | None:
    """The chunk if ``view`` (a chunk's body) holds only known, unrepeated fields; else None."""
    numbers: dict[int, int] = {}
    views: dict[int, memoryview] = {}
    pos = 0
    while pos < view.nbytes:
        key, pos = _varint(view, pos)
        if key is None or _CHUNK_FIELDS.get(key >> 3) != key & 7:
            return None
        field = key >> 3
        value, pos = _varint(view, pos)
        if value is None or field in numbers or field in views:
            return None
        if key & 7 == 2:
            if pos + value > view.nbytes:
                return None
            views[field], pos = view[pos : pos + value], pos + value
        else:
            numbers[field] = value
    seq, index, count = (numbers.get(n, 0) for n in (1, 2, 3))
    if seq > _U64 or index > _U32 or count > _U32:
        return None  # protobuf's own rules apply to out-of-range varints
    raw_info = views.get(5)
    info = None if raw_info is None else pb.BatchInfo.FromString(raw_info.tobytes())
    return Chunk(seq, index, count, views.get(4, memoryview(b"")), info)


def _varint(view: memoryview, pos: int) -> tuple[int | None, int]:
    """The varint at ``pos`` and the position after it; None if truncated or over 10 bytes."""
    value = shift = 0
    for i in range(pos, min(pos + 10, view.nbytes)):
        byte = view[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    return None, pos
