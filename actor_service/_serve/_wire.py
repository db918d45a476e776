"""Serialised ``Collect`` responses, built off the event loop and sent unchanged.

Serialising a ``CollectResponse`` chunk copies its 3 MiB of data; done by
gRPC's response serializer, that copy ran on the actor's one event-loop
thread. Here each chunk is wire-encoded on the collection thread, once, and
the ``Collect`` method is registered with an identity response serializer, so
the loop only hands the ``bytes`` to gRPC. The encoding is protobuf's own: a
message is the concatenation of its fields in field-number order, a message
field is its tag, the varint length of its body and the body. The service
descriptor is unchanged, so reflection and clients see the same method.

``PushWeights`` requests go the other way: :func:`decode_push_request` gives a
``chunk`` message's payload as a view of the bytes gRPC received, without the
copy protobuf's parser makes; every other message is parsed by protobuf.
``RelayWeights`` chunks likewise (:func:`decode_relay_request`), and keep the bytes as
received, so a relay forwards them to the next actor unchanged; a relay whose bytes came
from the learner frames them once (:func:`encode_relay_chunk`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from common.errors import ProtocolError
from common.protowire import length_delimited, varint
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

__all__ = [
    "ActorServiceImpl",
    "RawChunk",
    "RawRelayChunk",
    "add_actor_service",
    "decode_push_request",
    "decode_relay_request",
    "encode_relay_chunk",
    "encode_chunk",
    "encode_control",
]

# Tag of CollectResponse.chunk (field 2, length-delimited) and of BatchChunk.data
# (field 4, length-delimited).
_RESPONSE_CHUNK_TAG = b"\x12"
_DATA_TAG = b"\x22"
# Tag of PushWeightsRequest.chunk (field 2, length-delimited).
_PUSH_CHUNK_TAG = 0x12
# Tags of RelayRequest.chunk (field 2, length-delimited), RelayChunk.data (field 1,
# length-delimited) and RelayChunk.crc32c (field 2, varint).
_RELAY_CHUNK_TAG = 0x12
_RELAY_DATA_TAG = 0x0A
_RELAY_CRC_TAG = 0x10

_M = TypeVar("_M", bound=Message)


class RawChunk:
    """A ``PushWeightsRequest(chunk=...)`` whose ``chunk`` views the received bytes."""

    __slots__ = ("chunk",)

    def __init__(self, chunk: memoryview) -> None:
        self.chunk = chunk

    def WhichOneof(self, group: str) -> str:  # protobuf's name
        """``"chunk"``, as protobuf answers for the ``kind`` oneof."""
        return "chunk"


def decode_push_request(data: bytes) -> pb.PushWeightsRequest | RawChunk:
    """Parse one ``PushWeightsRequest``: chunks without a copy, anything else by protobuf.

    Raises:
        ProtocolError: ``data`` is no ``PushWeightsRequest`` (INVALID_ARGUMENT).
    """
    payload = length_delimited(data, _PUSH_CHUNK_TAG)
    if payload is not None:
        return RawChunk(payload)
    return _parse_request(pb.PushWeightsRequest, data)


class RawRelayChunk:
    """A ``RelayRequest(chunk=RelayChunk(...))``: ``data`` views the received bytes, ``raw``."""

    __slots__ = ("crc32c", "data", "raw")

    def __init__(self, data: memoryview, crc: int, raw: bytes) -> None:
        self.data, self.crc32c, self.raw = data, crc, raw

    @property
    def chunk(self) -> RawRelayChunk:
        """Itself: ``request.chunk.data`` reads as on a parsed message."""
        return self

    def WhichOneof(self, group: str) -> str:  # protobuf's name
        """``"chunk"``, as protobuf answers for the ``kind`` oneof."""
        return "chunk"


def decode_relay_request(data: bytes) -> pb.RelayRequest | RawRelayChunk:
    """Parse one ``RelayRequest``: chunks without a copy, anything else by protobuf.

    Raises:
        ProtocolError: ``data`` is no ``RelayRequest`` (INVALID_ARGUMENT).
    """
    body = length_delimited(data, _RELAY_CHUNK_TAG)
    if body is not None and len(body) > 1 and body[0] == _RELAY_DATA_TAG:
        size, pos = _varint_at(body, 1)
        if size is not None and pos + size <= len(body):
            rest = body[pos + size :]
            crc, end = (0, 0) if not len(rest) else _varint_at(rest, 1)
            if not len(rest) or (
                rest[0] == _RELAY_CRC_TAG and crc is not None and end == len(rest)
            ):
                return RawRelayChunk(body[pos : pos + size], crc or 0, data)
    return _parse_request(pb.RelayRequest, data)


class Undecodable:
    """A one-message call's request whose bytes do not parse (the handler raises ``error``).

    gRPC parses such a request before the handler runs and answers a parser's exception
    UNKNOWN; handed over as this, it is the peer's INVALID_ARGUMENT like any bad field.
    """

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


def _parsed_or_undecodable(kind: type[_M]) -> Callable[[bytes], _M | Undecodable]:
    def parse(data: bytes) -> _M | Undecodable:
        try:
            return _parse_request(kind, data)
        except ProtocolError as exc:
            return Undecodable(exc)

    return parse


def _parse_request(kind: type[_M], data: bytes) -> _M:
    """Parse one client message of ``kind``: a peer's bytes that are none are its error.

    Raises:
        ProtocolError: ``data`` is not a ``kind`` (INVALID_ARGUMENT, not a bug's INTERNAL).
    """
    try:
        return kind.FromString(data)
    except DecodeError:
        raise ProtocolError(f"a {kind.__name__} of {len(data)} bytes does not parse") from None


def encode_relay_chunk(data: bytes | memoryview, crc: int) -> bytes:
    """Return the serialised ``RelayRequest(chunk=RelayChunk(data, crc32c))``, one copy of ``data``.

    The bytes equal what ``SerializeToString`` gives for the same message.
    """
    view = memoryview(data).cast("B")
    tail = bytes((_RELAY_CRC_TAG,)) + varint(crc) if crc else b""
    head = bytes((_RELAY_DATA_TAG,)) + varint(view.nbytes) if view.nbytes else b""
    body_len = len(head) + view.nbytes + len(tail)
    return b"".join((bytes((_RELAY_CHUNK_TAG,)), varint(body_len), head, view, tail))


def _varint_at(view: memoryview, pos: int) -> tuple[int | None, int]:
    """The varint at ``pos`` and the position after it; None for a truncated or overlong one."""
    value, shift = 0, 0
    while pos < len(view) and shift < 64:
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


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


class ActorServiceImpl(Protocol):
    """An ``ActorService`` servicer, as :func:`add_actor_service` registers it.

    Every generated method is registered as generated; these two get our own
    serializers, so their signatures are what this module relies on.
    """

    async def Collect(
        self,
        request_iterator: AsyncIterator[pb.CollectRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """A collection session, written as the bytes of :func:`encode_chunk` and the like."""
        ...

    async def PushWeights(
        self,
        request_iterator: AsyncIterator[pb.PushWeightsRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.PushWeightsResponse:
        """A weight push, its chunks read through :func:`decode_push_request`."""
        ...

    async def RelayWeights(
        self,
        request_iterator: AsyncIterator[pb.RelayRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.RelayResponse:
        """A relayed push's bytes, its chunks read through :func:`decode_relay_request`."""
        ...


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


def add_actor_service(servicer: ActorServiceImpl, server: grpc.aio.Server) -> None:
    """Register ``ActorService`` with ``Collect`` sending bytes and ``PushWeights`` viewing them.

    Every other method keeps its generated handler; ``Collect`` keeps its path
    and request deserializer, and its response serializer is the identity, so
    its handler must write ``bytes`` (see :func:`encode_chunk`, :func:`encode_control`);
    ``PushWeights`` reads its chunks through :func:`decode_push_request`.

    Args:
        servicer: The ``ActorService`` implementation.
        server: The server to register on.

    Raises:
        RuntimeError: The generated code did not register a ``Collect`` handler.
    """
    recorder = _HandlerRecorder()
    pb_grpc.add_ActorServiceServicer_to_server(servicer, recorder)
    handlers = {name: _peer_checked(h) for name, h in recorder.handlers.items()}
    if not {"Collect", "PushWeights", "RelayWeights"} <= handlers.keys():
        raise RuntimeError(f"generated ActorService handlers lack a method: {sorted(handlers)}")
    handlers["Collect"] = grpc.stream_stream_rpc_method_handler(
        servicer.Collect,
        request_deserializer=functools.partial(_parse_request, pb.CollectRequest),
        response_serializer=_identity,
    )
    handlers["PushWeights"] = grpc.stream_unary_rpc_method_handler(
        servicer.PushWeights,
        request_deserializer=decode_push_request,
        response_serializer=pb.PushWeightsResponse.SerializeToString,
    )
    handlers["RelayWeights"] = grpc.stream_unary_rpc_method_handler(
        servicer.RelayWeights,
        request_deserializer=decode_relay_request,
        response_serializer=pb.RelayResponse.SerializeToString,
    )
    service = pb.DESCRIPTOR.services_by_name["ActorService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]


def _peer_checked(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with requests that do not parse made the peer's error (INVALID_ARGUMENT).

    A stream's bad message raises :class:`ProtocolError` where the handler reads it; a
    one-message call's request arrives as :class:`Undecodable` (see ``_servicer._mapped``).
    """
    kind = getattr(handler.request_deserializer, "__self__", None)  # ``Request.FromString``
    if not (isinstance(kind, type) and issubclass(kind, Message)):
        raise RuntimeError(f"a generated handler reads no protobuf message: {handler}")
    parse = (
        functools.partial(_parse_request, kind)
        if handler.request_streaming
        else _parsed_or_undecodable(kind)
    )
    return handler._replace(request_deserializer=parse)  # type: ignore[attr-defined]
