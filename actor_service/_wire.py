"""Serialised ``Collect`` responses, built off the event loop and sent unchanged.

Serialising a ``CollectResponse`` chunk copies its 3 MiB of data; done by
gRPC's response serializer, that copy ran on the actor's one event-loop
thread. Here each chunk is wire-encoded on the collection thread, once, and
the ``Collect`` method is registered with an identity response serializer, so
the loop only hands the ``bytes`` to gRPC. The encoding is protobuf's own: a
message is the concatenation of its fields in field-number order, a message
field is its tag, the varint length of its body and the body. The service
descriptor is unchanged, so reflection and clients see the same method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from common.protowire import varint
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

__all__ = ["add_actor_service", "encode_chunk", "encode_control"]

# Tag of CollectResponse.chunk (field 2, length-delimited) and of BatchChunk.data
# (field 4, length-delimited).
_RESPONSE_CHUNK_TAG = b"\x12"
_DATA_TAG = b"\x22"


def encode_chunk(
    *,
    seq: int,
    index: int,
    count: int,
    data: bytes | memoryview | Sequence[memoryview],
    info: pb.BatchInfo | None,
) -> bytes:
    """Return the serialised ``CollectResponse(chunk=BatchChunk(...))`` with one copy of ``data``.

    The bytes equal what ``SerializeToString`` gives for the same message.

    Args:
        seq: The batch's seq.
        index: The chunk's index in the batch.
        count: The batch's number of chunks.
        data: The chunk's slice of the packet, or the consecutive views that make it up.
        info: The batch's ``BatchInfo`` (the first chunk only), or None.
    """
    views = [data] if isinstance(data, bytes | memoryview) else list(data)
    views = [memoryview(view).cast("B") for view in views]
    nbytes = sum(view.nbytes for view in views)
    # Small fields go through protobuf itself; only the data field is framed by hand.
    head = pb.BatchChunk(seq=seq, index=index, count=count).SerializeToString()
    data_field = (_DATA_TAG, varint(nbytes)) if nbytes else ()
    tail = pb.BatchChunk(info=info).SerializeToString() if info is not None else b""
    body_len = len(head) + sum(map(len, data_field)) + nbytes + len(tail)
    return b"".join((_RESPONSE_CHUNK_TAG, varint(body_len), head, *data_field, *views, tail))


def encode_control(message: pb.CollectResponse) -> bytes:
    """Return a control response (``opened``, ``end``) serialised for the identity serializer."""
    return message.SerializeToString()


def _identity(payload: bytes) -> bytes:
    return payload


class _HandlerRecorder:
    """Stands in for a server to capture the generated method handlers of a service."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: the registered handlers below carry the same methods."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Record the service's method handlers."""
        self.handlers.update(handlers)


def add_actor_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Register ``ActorService`` on ``server`` with ``Collect`` sending pre-serialised bytes.

    Every other method keeps its generated handler; ``Collect`` keeps its path
    and request deserializer, and its response serializer is the identity, so
    its handler must write ``bytes`` (see :func:`encode_chunk`, :func:`encode_control`).

    Args:
        servicer: The ``ActorService`` implementation.
        server: The server to register on.

    Raises:
        RuntimeError: The generated code did not register a ``Collect`` handler.
    """
    recorder = _HandlerRecorder()
    pb_grpc.add_ActorServiceServicer_to_server(servicer, recorder)
    handlers = dict(recorder.handlers)
    if "Collect" not in handlers:
        raise RuntimeError(f"generated ActorService handlers lack Collect: {sorted(handlers)}")
    handlers["Collect"] = grpc.stream_stream_rpc_method_handler(
        servicer.Collect,
        request_deserializer=pb.CollectRequest.FromString,
        response_serializer=_identity,
    )
    service = pb.DESCRIPTOR.services_by_name["ActorService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]
