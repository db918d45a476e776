"""Weight-push chunk messages encoded once per blob and shared by every actor they go to.

A push of one blob to N actors used to build ``bytes(piece)`` and serialise a
``PushWeightsRequest`` per chunk *per actor*: two full copies of the blob for
each target, on the learner's one event-loop thread. Here each ``chunk``
message is wire-encoded straight from the blob (one copy, done once, lazily as
the fastest push asks for it) and the same ``bytes`` are handed to every
concurrent push of that blob; the gRPC call then sends them unchanged (an
identity serializer). The encoding is protobuf's own for a length-delimited
field: the ``chunk`` field's tag, the varint length, the data. Entries live
only while a push holds them, so nothing outlives the push.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from common.config import CHUNK_BYTES
from common.protowire import varint
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import iter_blob_chunks

__all__ = ["SharedChunks", "encode_chunk", "encode_header"]

# Field tag of PushWeightsRequest.chunk (a oneof member, so an empty value is
# still written: tag, then length 0).
_CHUNK_TAG = pb.PushWeightsRequest(chunk=b"").SerializeToString()[:-1]


def encode_chunk(piece: bytes | memoryview) -> bytes:
    """Return the serialised ``PushWeightsRequest(chunk=piece)`` with one copy of ``piece``."""
    view = memoryview(piece).cast("B")
    return b"".join((_CHUNK_TAG, varint(view.nbytes), view))


def encode_header(header: pb.WeightsHeader) -> bytes:
    """Return the serialised ``PushWeightsRequest(header=header)``."""
    return pb.PushWeightsRequest(header=header).SerializeToString()


class _CachedBlob:
    """The chunk messages of one blob, encoded on first demand."""

    def __init__(self, blob: bytes | memoryview, chunk_bytes: int) -> None:
        self.blob = blob
        self.holders = 0
        self._pieces = iter_blob_chunks(blob, chunk_bytes)
        self._built: list[bytes] = []

    def messages(self) -> Iterator[bytes]:
        index = 0
        while True:
            if index == len(self._built):
                piece = next(self._pieces, None)
                if piece is None:
                    return
                self._built.append(encode_chunk(piece))
            yield self._built[index]
            index += 1


class SharedChunks:
    """Chunk messages of the blobs being pushed, keyed by blob identity.

    Use it from one thread (the learner's event loop): pushes of the same blob
    object that overlap in time share one encoding.

    Args:
        chunk_bytes: The largest chunk payload.
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._chunk_bytes = chunk_bytes
        self._entries: dict[int, _CachedBlob] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def hold(self, blob: bytes | memoryview) -> Iterator[Iterator[bytes]]:
        """Hold ``blob``'s chunk messages for one push.

        Yields:
            An iterator over the serialised chunk messages, in order; it shares
            the encoded ``bytes`` with every other holder of the same blob.
        """
        entry = self._entries.get(id(blob))
        if entry is None or entry.blob is not blob:  # the entry keeps blob alive
            entry = _CachedBlob(blob, self._chunk_bytes)
            self._entries[id(blob)] = entry
        entry.holders += 1
        try:
            yield entry.messages()
        finally:
            entry.holders -= 1
            if entry.holders == 0 and self._entries.get(id(blob)) is entry:
                del self._entries[id(blob)]
