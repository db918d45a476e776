"""Weight-push messages encoded once per push and shared by every actor they go to.

Each ``chunk`` message is wire-encoded straight from the blob (one copy, done
once per push, off the event loop) and the same ``bytes`` are handed to every
target; the gRPC call sends them unchanged (an identity serializer). The
encoding is protobuf's own for a length-delimited field: the ``chunk`` field's
tag, the varint length, the data.
"""

from __future__ import annotations

from common.config import CHUNK_BYTES
from common.protowire import varint
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import iter_blob_chunks

__all__ = ["encode_chunk", "encode_header", "push_messages"]

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


def push_messages(
    model_id: str, version: int, blob: bytes, sha256: str, chunk_bytes: int = CHUNK_BYTES
) -> tuple[bytes, ...]:
    """The serialised ``PushWeightsRequest`` messages of one push: the header, then each chunk.

    Built once per push and handed unchanged to every target.
    """
    header = pb.WeightsHeader(
        model_id=model_id, version=version, total_bytes=len(blob), sha256=sha256
    )
    chunks = (encode_chunk(piece) for piece in iter_blob_chunks(blob, chunk_bytes))
    return (encode_header(header), *chunks)
