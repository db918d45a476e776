"""Relayed pushes on the actor: bytes taken from the named relay, forwarded to the next actor.

A relayed push (``WeightsHeader.relay``) reaches each actor of a chain the learner chose
as its own ``PushWeights`` call, header only but for the first actor, whose call carries
the chunks. Each actor forwards every chunk as it arrives to the next actor of the chain
(:class:`Forwarder`, a ``RelayWeights`` call presenting the ticket the learner gave it),
and takes its own bytes either from the learner's call or from the relay the learner
named (:class:`RelayInbox`: the ``RelayWeights`` call must name a push opened here and
present that push's ticket, once). Every actor checks the whole blob against the digests
in its own header, as a direct push; bytes that stop for ``stall_seconds``, end early or
fail a chunk's CRC (or carry none) raise :class:`RelayFailedError`, which the push answers with
``relay_failed`` (nothing applied) so the learner sends it the bytes itself. A forward that
fails or stalls is ended and never holds up this actor's own push.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator

import grpc

from actor_service._config import ActorConfig
from actor_service._serve._logging import log_event
from actor_service._serve._streams import next_message
from actor_service._serve._wire import RawRelayChunk, encode_relay_chunk
from common.checksum import crc32c
from common.config import (
    RELAY_PUSH_ID_BYTES,
    RELAY_TICKET_BYTES,
    client_channel_options,
    is_relay_address,
)
from common.errors import (
    ActorBusyError,
    PermissionDeniedError,
    ProtocolError,
    RelayFailedError,
    SessionStateError,
    UnknownModelError,
)
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = [
    "Forwarder",
    "Piece",
    "RelayInbox",
    "check_relay",
    "relay_credentials",
    "relayed_chunks",
]

_STALL_SECONDS = (0.1, 600.0)
#: How long a relay's call waits for the learner to open its push here.
OPEN_WAIT_SECONDS = 5.0
#: Relay calls waiting for their push at once; more are refused RESOURCE_EXHAUSTED.
MAX_WAITING = 16
#: Chunks a relayed push buffers between its relay and its own reading.
_QUEUE_CHUNKS = 8


def check_relay(relay: pb.Relay, config: ActorConfig) -> None:
    """Check a header's relay fields before anything is opened or dialled.

    Raises:
        ProtocolError: A field is out of range (its name and the range in the message).
        SessionStateError: A forward asked of an actor serving TLS without ``relay_ca``:
            its forward would travel in the clear (FAILED_PRECONDITION).
    """
    if len(relay.push_id) != RELAY_PUSH_ID_BYTES:
        raise ProtocolError(f"relay.push_id must be {RELAY_PUSH_ID_BYTES} bytes")
    low, high = RELAY_TICKET_BYTES
    for name in ("source_ticket", "forward_ticket"):
        ticket = getattr(relay, name)
        if ticket and not low <= len(ticket) <= high:
            raise ProtocolError(f"relay.{name} must be {low} to {high} bytes")
    if bool(relay.forward_to) != bool(relay.forward_ticket):
        raise ProtocolError("relay.forward_to and relay.forward_ticket go together")
    address = relay.forward_to
    if address and not is_relay_address(address):
        raise ProtocolError(f"relay.forward_to must be host:port, got {address[:64]!r}")
    if address and config.tls_cert and not config.relay_ca:
        raise SessionStateError(
            "this actor serves TLS but was started without --relay-ca: it forwards no "
            "relayed push (its bytes would travel in the clear)"
        )
    if not _STALL_SECONDS[0] <= relay.stall_seconds <= _STALL_SECONDS[1]:
        raise ProtocolError(f"relay.stall_seconds must be in {list(_STALL_SECONDS)}")


#: A chunk of a blob, and the serialised ``RelayRequest`` that carried it (None: not one).
Piece = tuple[memoryview | bytes, bytes | None]


class _Inbound:
    """One push waiting for its relayed bytes: the ticket to check, the chunks received."""

    def __init__(self, ticket: bytes) -> None:
        self.ticket = ticket
        self.taken = False
        self.chunks: asyncio.Queue[Piece | None] = asyncio.Queue(_QUEUE_CHUNKS)
        self.done = asyncio.Event()  # the push read its bytes, or gave them up


class RelayInbox:
    """The pushes of this actor that wait for bytes from a relay, by push id."""

    def __init__(self) -> None:
        self._open: dict[bytes, _Inbound] = {}
        self._opened = asyncio.Condition()
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def opened(self, relay: pb.Relay) -> AsyncIterator[_Inbound]:
        """Open a push for its relay's call while the block runs; closed at its end."""
        if relay.push_id in self._open:
            raise SessionStateError("relay.push_id is already open on this actor")
        inbound = self._open[relay.push_id] = _Inbound(relay.source_ticket)
        async with self._opened:
            self._opened.notify_all()
        try:
            yield inbound
        finally:
            inbound.done.set()
            del self._open[relay.push_id]

    async def take(self, request: pb.RelayOpen) -> _Inbound:
        """The open push a relay's call names, once its ticket is checked.

        Raises:
            UnknownModelError: No such push was opened here within :data:`OPEN_WAIT_SECONDS`,
                or it closed before this call found it (NOT_FOUND).
            ActorBusyError: :data:`MAX_WAITING` relay calls wait already (RESOURCE_EXHAUSTED).
            PermissionDeniedError: The ticket is not the one the learner named
                (PERMISSION_DENIED), or the push took its relay's call already.
        """
        if self._waiting >= MAX_WAITING:
            raise ActorBusyError(f"{self._waiting} relay calls wait for their push already")
        self._waiting += 1
        try:
            async with self._opened:
                await asyncio.wait_for(
                    self._opened.wait_for(lambda: request.push_id in self._open),
                    OPEN_WAIT_SECONDS,
                )
        except TimeoutError:
            raise UnknownModelError("no relayed push of this id is open on this actor") from None
        finally:
            self._waiting -= 1
        # The wait ends a few loop turns after the push opened: it may have closed since.
        inbound = self._open.get(request.push_id)
        if inbound is None:
            raise UnknownModelError("the relayed push of this id closed before its relay came")
        if inbound.taken or not hmac.compare_digest(inbound.ticket, request.ticket):
            raise PermissionDeniedError("relay ticket refused for this push")
        inbound.taken = True
        return inbound

    async def fill(self, inbound: _Inbound, requests: AsyncIterator[pb.RelayRequest]) -> int:
        """Pass a relay's chunks (each CRC-checked) to the push; the bytes taken.

        A chunk that fails its CRC ends the relay's bytes: the push gives them up.
        """
        taken = 0
        try:
            while (request := await next_message(requests, "RelayWeights")) is not None:
                if inbound.done.is_set():
                    break
                chunk = request.chunk if request.WhichOneof("kind") == "chunk" else None
                if chunk is None or not chunk.data or crc32c(chunk.data) != chunk.crc32c:
                    raise ProtocolError("relay chunk is empty, fails its CRC-32C or is no chunk")
                raw = request.raw if isinstance(request, RawRelayChunk) else None
                put = asyncio.ensure_future(inbound.chunks.put((chunk.data, raw)))
                done = asyncio.ensure_future(inbound.done.wait())
                await asyncio.wait([put, done], return_when=asyncio.FIRST_COMPLETED)
                done.cancel()
                if not put.done():
                    put.cancel()
                    break
                taken += len(chunk.data)
        finally:
            if not inbound.done.is_set():
                with contextlib.suppress(asyncio.QueueFull):
                    inbound.chunks.put_nowait(None)  # the relay's bytes ended here
        return taken


async def relayed_chunks(inbound: _Inbound, total_bytes: int, stall: float) -> AsyncIterator[Piece]:
    """The pieces of a push's blob as its relay passes them, until ``total_bytes``.

    Raises:
        RelayFailedError: Nothing new for ``stall`` seconds, or the relay's bytes ended early.
    """
    received = 0
    while received < total_bytes:
        try:
            chunk = await asyncio.wait_for(inbound.chunks.get(), stall)
        except TimeoutError:
            raise RelayFailedError(f"no relayed bytes for {stall:g} s at {received}") from None
        if chunk is None:
            raise RelayFailedError(f"the relay's bytes ended at {received} of {total_bytes}")
        received += memoryview(chunk[0]).nbytes
        yield chunk


def relay_credentials(config: ActorConfig) -> grpc.ChannelCredentials | None:
    """How this actor calls the next one of a chain: TLS with ``relay_ca``, else plaintext.

    With TLS the actor verifies the next actor's certificate against ``relay_ca`` and
    presents its own (``tls_cert``, ``tls_key``), which an mTLS fleet's actors require.
    """
    if not config.relay_ca:
        return None

    def read(path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(config.relay_ca),
        private_key=read(config.tls_key),
        certificate_chain=read(config.tls_cert),
    )


class Forwarder:
    """The forward of one push's chunks to the next actor of its chain.

    A forward that fails, or whose next actor does not take a chunk within the stall
    time, is ended: that actor answers the learner ``relay_failed`` and gets the bytes
    directly; this actor's own push goes on.

    Args:
        relay: The header's relay fields (``forward_to``, ``forward_ticket``, ``stall_seconds``).
        token: The fleet's bearer token, presented to the next actor; "" for none.
        credentials: TLS to the next actor (:func:`relay_credentials`); None: plaintext.
    """

    def __init__(
        self, relay: pb.Relay, token: str, credentials: grpc.ChannelCredentials | None = None
    ) -> None:
        self._address = relay.forward_to
        self._stall = relay.stall_seconds
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(_QUEUE_CHUNKS)
        self._taken = 0  # messages the next actor's call took from the queue
        options = client_channel_options()
        target = f"dns:///{self._address}"  # host:port by name; never another resolver
        self._channel = (
            grpc.aio.insecure_channel(target, options=options)
            if credentials is None
            else grpc.aio.secure_channel(target, credentials, options=options)
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        relay_raw = self._channel.stream_unary(  # requests serialised beforehand
            "/rlfleet.v1.ActorService/RelayWeights",
            request_serializer=_identity,
            response_deserializer=pb.RelayResponse.FromString,
            _registered_method=True,  # type: ignore[call-arg]  # grpc's stubs lack it
        )
        self._call = relay_raw(self._requests(relay), metadata=metadata)
        # Set once the next actor's call is over: a chunk it can no longer take is not
        # waited for the stall time (it refused the call, or died).
        self._ended = asyncio.Event()
        self._call.add_done_callback(lambda _: self._ended.set())
        self.failed: str | None = None

    async def _requests(self, relay: pb.Relay) -> AsyncIterator[bytes]:
        opening = pb.RelayOpen(push_id=relay.push_id, ticket=relay.forward_ticket)
        yield pb.RelayRequest(open=opening).SerializeToString()
        while True:
            message = await self._queue.get()
            self._taken += 1  # the next actor's call took one more: what close() waits on
            if message is None:
                return
            yield message

    async def send(self, chunk: bytes | memoryview, raw: bytes | None = None) -> None:
        """Queue one chunk for the next actor; ends the forward if it does not move.

        ``raw``, the serialised ``RelayRequest`` the chunk came in, is forwarded unchanged;
        without it the chunk is framed once, with its CRC-32C.
        """
        if self.failed is not None:
            return
        await self._put(raw if raw is not None else encode_relay_chunk(chunk, crc32c(chunk)))

    async def close(self) -> None:
        """End the forward (all sent, or given up) and close its channel."""
        if self.failed is None:
            await self._put(None)
        if self.failed is None:
            await self._land()
        await self._channel.close(None)

    async def _land(self) -> None:
        """Wait for the next actor's answer while its call takes the queued chunks.

        A slow link drains the queue slowly but steadily: the forward is given up only when
        no chunk is taken and no answer comes for twice the stall time.
        """
        taken = -1
        while not self._ended.is_set() and self._taken != taken:
            taken = self._taken
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), 2 * self._stall)
        if not self._ended.is_set():
            idle = 2 * self._stall
            self._fail(f"{self._address} took no chunk and gave no answer for {idle:g} s")
            return
        try:
            await self._call
        except grpc.RpcError as exc:
            self._fail(f"{self._address}: {_describe(exc)}")

    async def _put(self, message: bytes | None) -> None:
        """Queue a message; end the forward if the next actor's call ended or it stalls."""
        put = asyncio.ensure_future(self._queue.put(message))
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait(
                {put, ended}, timeout=self._stall, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
            put.cancel()  # a no-op once queued
        if put.done() and not put.cancelled():
            return
        if self._ended.is_set():
            code, details = await self._call.code(), await self._call.details()
            self._fail(f"{self._address} ended the forward: {code.name}: {details}")
        else:
            self._fail(f"{self._address} took no chunk for {self._stall:g} s")

    def abandon(self) -> None:
        """Give the forward up (this actor's bytes failed): the next actor is told at once."""
        self._fail("the relay's own bytes failed")

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self._call.cancel()
            log_event("weights.relay_forward_failed", logging.WARNING, to=self._address, why=why)


def _identity(message: bytes) -> bytes:
    return message


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__
