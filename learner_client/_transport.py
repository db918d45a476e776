"""The learner's side of the ``rlfleet.v1`` wire: a channel per actor, its calls, its bytes.

With :mod:`learner_client._collect_stream` (the ``Collect`` session), this is where the
learner touches the generated stubs; it runs on the learner's single asyncio event loop
(:mod:`learner_client._loop_thread`). Each call to an actor has a deadline and returns
plain Python values, and ``grpc.RpcError`` becomes an :mod:`common.errors` exception, naming
the actor's address, in one place. The bytes are handled here too, both ways: a weight
push is wire-encoded once (each ``chunk`` straight from the blob) and sent unchanged to
every target; ``Collect`` responses are read by :mod:`learner_client._collect_wire` (a
plain chunk's data as a view of gRPC's message bytes). Every call's replies are read
through :func:`common.replies.parsing_channel`: one that does not parse is a
``ProtocolError`` naming the actor and the call. Link logic sees a channel only
through :class:`Channel`, so tests drive a link over a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Protocol, overload

import grpc

from common.config import CHUNK_BYTES, client_channel_options, is_loopback
from common.errors import (
    ActorUnavailableError,
    DeadlineError,
    ProtocolError,
    RelayFailedError,
    SessionStateError,
    fd_limit_hint,
    from_status,
    is_transient,
    one_line,
    tls_mismatch_hint,
)
from common.protowire import varint
from common.replies import parsing_channel
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.shm import Segment
from common.weights import (
    BlobAssembler,
    Part,
    PushOutcome,
    iter_blob_chunks,
    sha256_hex,
)
from learner_client._collect_wire import parse_collect_response
from learner_client._description import ActorDescription
from learner_client._shm import ShmRefusedError

__all__ = [
    "ActorChannel",
    "Channel",
    "CollectCall",
    "PushMessages",
    "PushReply",
    "MAX_RECONNECT_BACKOFF_S",
    "connect_failure",
    "encode_chunk",
    "encode_header",
    "push_messages",
    "shm_control",
    "shm_messages",
    "translate_errors",
]

# gRPC's own reconnect backoff grows to 120 s by default; an actor restarted on
# the same port must be found again within our (shorter, jittered) backoff.
#: The longest a channel waits between its own connection attempts, in seconds: a call made
#: with ``wait_for_ready`` for this long (plus a connect) reaches an actor that is back.
MAX_RECONNECT_BACKOFF_S = 2.0
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", int(MAX_RECONNECT_BACKOFF_S * 1000)),
]


# Field tag of PushWeightsRequest.chunk (a oneof member, so an empty value is
# still written: tag, then length 0).
_CHUNK_TAG = pb.PushWeightsRequest(chunk=b"").SerializeToString()[:-1]
_OUTCOMES = {
    pb.PUSH_OUTCOME_APPLIED: PushOutcome.APPLIED,
    pb.PUSH_OUTCOME_STAGED: PushOutcome.STAGED,
    pb.PUSH_OUTCOME_COMPLETED: PushOutcome.COMPLETED,
}


def encode_chunk(piece: bytes | memoryview) -> bytes:
    """Return the serialised ``PushWeightsRequest(chunk=piece)`` with one copy of ``piece``."""
    view = memoryview(piece).cast("B")
    return b"".join((_CHUNK_TAG, varint(view.nbytes), view))


def shm_control(segment: Segment) -> pb.ShmSegment:
    """The control of a segment as it travels (name, size, CRC-32C)."""
    return pb.ShmSegment(name=segment.name, size=segment.size, crc32c=segment.crc32c)


def shm_messages(messages: PushMessages, segment: Segment) -> list[bytes]:
    """The one message of a push whose blob lies in ``segment``: its header naming it."""
    header = pb.PushWeightsRequest.FromString(messages[0]).header
    header.shm.CopyFrom(shm_control(segment))
    return [encode_header(header)]


def encode_header(header: pb.WeightsHeader) -> bytes:
    """Return the serialised ``PushWeightsRequest(header=header)``."""
    return pb.PushWeightsRequest(header=header).SerializeToString()


class PushMessages(Sequence[bytes]):
    """The serialised ``PushWeightsRequest`` messages of one push: the header, then each chunk.

    Shared unchanged by every target of the push. Each chunk message is wire-encoded
    (one copy of its slice of the blob) the first time any target's stream asks for
    it, so encoding overlaps with sending instead of preceding it.
    """

    def __init__(
        self, header: bytes, blob: bytes | memoryview, chunk_bytes: int, prefix: bytes = b""
    ) -> None:
        self._header = header
        # ``prefix``: bytes of the pushed blob before ``blob`` (a part's own safetensors
        # header before its run of a split blob's data), sent as a chunk of their own.
        self._pieces = ([memoryview(prefix)] if prefix else []) + list(
            iter_blob_chunks(blob, chunk_bytes)
        )
        self._built: list[bytes | None] = [None] * len(self._pieces)

    def __len__(self) -> int:
        return 1 + len(self._pieces)

    def with_header(self, header: bytes) -> PushMessages:
        """The same chunks (built once for both) after another header."""
        other = PushMessages.__new__(PushMessages)
        other._header, other._pieces, other._built = header, self._pieces, self._built
        return other

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"push message {index} of {len(self)}")
        if index == 0:
            return self._header
        built = self._built[index - 1]
        if built is None:
            built = self._built[index - 1] = encode_chunk(self._pieces[index - 1])
        return built


def push_messages(
    model_id: str,
    version: int,
    blob: bytes | memoryview,
    sha256: str,
    chunk_bytes: int = CHUNK_BYTES,
    *,
    crc32c: int | None = None,
    base_version: int | None = None,
    part: Part | None = None,
) -> PushMessages:
    """The messages of one push (:class:`PushMessages`), built once per push for every target.

    ``sha256`` may be "" when ``crc32c`` is given; ``base_version`` marks a sparse delta,
    ``part`` one part of a multi-part push.
    """
    header = pb.WeightsHeader(
        model_id=model_id,
        version=version,
        total_bytes=len(blob),
        sha256=sha256,
        crc32c=crc32c,
        base_version=base_version,
        part=None if part is None else pb.PartOf(index=part.index, count=part.count),
    )
    return PushMessages(encode_header(header), blob, chunk_bytes)


def _push_method(channel: Any) -> Any:
    """``channel``'s PushWeights call, requests serialised beforehand (:func:`push_messages`)."""
    return channel.stream_unary(
        "/rlfleet.v1.ActorService/PushWeights",
        request_serializer=_pre_serialized,
        response_deserializer=pb.PushWeightsResponse.FromString,
        _registered_method=True,
    )


def _outcome_name(value: int) -> str:
    """The name of a ``PushOutcome`` value, or the number an actor sent that is none."""
    try:
        return str(pb.PushOutcome.Name(value))
    except ValueError:
        return str(value)


def _pre_serialized(message: bytes) -> bytes:
    return message


# What grpcio's aio client reports, as INTERNAL, in place of the status an actor sent when
# one of the client's writes was in flight as the actor ended the call: the failed write
# overwrites the status that had arrived (grpc/grpc#36066, grpcio 1.85 still).
_CORE_INTERNAL = "Internal error from Core"


class FirstStatus:
    """The status a ``grpc.aio`` call first reported: the actor's, where grpcio overwrote it.

    An actor that refuses a ``Collect`` session (its settings, the token, a busy actor) ends
    the call at once, while the learner may be writing a credit; grpcio then reports
    INTERNAL "Internal error from Core" and the refusal would pass for a transient failure
    (retried, or a strict round failing on a "down" actor). A call's done callbacks run once,
    when its first status is set: the one the actor sent.
    """

    def __init__(self, call: Any) -> None:
        self._status: tuple[grpc.StatusCode, str] | None = None
        call.add_done_callback(self._record)

    def _record(self, call: Any) -> None:
        code, details = _result_at_once(call.code()), _result_at_once(call.details())
        if isinstance(code, grpc.StatusCode) and isinstance(details, str):
            self._status = (code, details)

    def corrected(self, exc: grpc.RpcError) -> grpc.RpcError:
        """``exc``, or where grpcio replaced the actor's status, an error with the actor's."""
        if self._status is None or not isinstance(exc, grpc.aio.AioRpcError):
            return exc
        if exc.code() != grpc.StatusCode.INTERNAL or exc.details() != _CORE_INTERNAL:
            return exc
        code, details = self._status
        if code == grpc.StatusCode.OK:  # an error all the same: what was unread is lost
            return exc
        # The actor's trailing metadata went with its status; the learner reads none.
        no_metadata = grpc.aio.Metadata()
        return grpc.aio.AioRpcError(
            code, exc.initial_metadata(), no_metadata, details, exc.debug_error_string()
        )


def _result_at_once(coroutine: Any) -> Any:
    """The result of a coroutine that returns without waiting (a finished call's status)."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    coroutine.close()
    return None


class _KeptStatusCall:
    """A ``Collect`` call whose read errors carry the actor's status (:class:`FirstStatus`)."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._first = FirstStatus(call)

    async def read(self) -> Any:
        try:
            return await self._call.read()
        except grpc.RpcError as exc:
            raise self._first.corrected(exc) from None

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    async def code(self) -> grpc.StatusCode:
        code: grpc.StatusCode = await self._call.code()
        return code


@contextlib.contextmanager
def translate_errors(
    peer: str, first: FirstStatus | None = None, timeout: float | None = None
) -> Iterator[None]:
    """Turn ``grpc.RpcError`` (sync or aio) into the matching rlfleet error naming ``peer``.

    ``first``: the call's first status, read where grpcio overwrote it; ``timeout``: the
    call's deadline, named once it ran out (gRPC's words may be "Stream removed"; an
    actor's own DEADLINE_EXCEEDED, sooner, says why itself).
    """
    started = time.monotonic()
    try:
        yield
    except grpc.RpcError as exc:
        if first is not None:
            exc = first.corrected(exc)
        code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        ran_out = timeout is not None and time.monotonic() - started >= timeout - 0.05
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and ran_out:
            details = f"{details} (no answer within the call's deadline of {timeout:g} s)"
        raise from_status(code, details, peer=peer) from None


@dataclasses.dataclass(frozen=True)
class PushReply:
    """What an actor answered to a weight push.

    Attributes:
        version: The version now in force.
        pause_seconds: How long the swap paused the actor's generation (collection).
        outcome: Applied (a whole push); staged or completed (a part).
        parts_staged: A part: the parts of its version the actor held once it was staged.
        epoch: The epoch of the actor process that answered (0: an actor that predates it).
    """

    version: int
    pause_seconds: float
    outcome: PushOutcome = PushOutcome.APPLIED
    parts_staged: int = 0
    epoch: int = 0


def _push_reply(r: pb.PushWeightsResponse, outcome: PushOutcome, took: float) -> PushReply:
    """The reply to a push the actor took, as checked; a pause out of range reads as none.

    The swap paused the actor within the call, which took ``took`` seconds: a longer pause
    (1e300 s, inf), a negative one or NaN is none an actor reports.
    """
    pause = float(r.pause_seconds)
    return PushReply(
        r.version,
        pause if 0.0 <= pause <= took else 0.0,
        outcome,
        int(r.parts_staged),
        int(r.epoch),
    )


class CollectCall(Protocol):
    """What the learner uses of a running ``Collect`` call (``grpc.aio``'s stream-stream call)."""

    async def read(self) -> Any:
        """The next response (a ``CollectResponse`` or a :class:`Chunk`), or ``grpc.aio.EOF``."""
        ...

    def cancel(self) -> bool:
        """Tear the call down."""
        ...

    async def code(self) -> grpc.StatusCode:
        """The call's status code, once it finished."""
        ...


class Channel(Protocol):
    """What an :class:`~learner_client._link.ActorLink` needs of its channel to an actor.

    :class:`ActorChannel` is the real one; the link's unit tests use a fake.
    """

    @property
    def address(self) -> str:
        """``host:port`` of the actor."""
        ...

    async def describe(self, timeout: float, *, wait_for_ready: bool = False) -> ActorDescription:
        """Ask the actor what it is (see :meth:`ActorChannel.describe`)."""
        ...

    def start_collect(self, requests: AsyncIterator[pb.CollectRequest]) -> CollectCall:
        """Start a ``Collect`` call sending ``requests``."""
        ...

    async def close(self) -> None:
        """Close the channel, cancelling its calls."""
        ...


# Seconds a fast-failing call may take to say why an actor was unreachable.
_REASON_TIMEOUT = 1.0
# What a learner changes when its channel and the actor disagree on TLS (tls_mismatch_hint).
_ADD_TLS = "pass channel_credentials=grpc.ssl_channel_credentials(root_certificates=...)"
_DROP_TLS = "connect without channel_credentials"
_ADD_CLIENT_CERT = (
    "give ssl_channel_credentials your certificate (private_key=..., certificate_chain=...)"
)


async def connect_failure(
    failed: Sequence[tuple[ActorChannel, BaseException]], timeout: float
) -> BaseException:
    """The error for actors whose Describe failed while connecting within ``timeout``.

    An error that is not a connection's (a bad token) as it is; else one
    ``ActorUnavailableError`` naming each actor with its channel's own reason.
    """
    refused = [e for _, e in failed if not is_transient(e)]
    if refused:
        return refused[0]
    reasons = await asyncio.gather(*(channel.why_unreachable() for channel, _ in failed))
    by_reason: dict[str, list[str]] = {}
    for (channel, error), why in zip(failed, reasons, strict=True):
        reason = (why or str(error)).replace(channel.address, "<address>")
        by_reason.setdefault(reason, []).append(channel.address)
    what = f"{len(failed)} actor(s) unreachable within connect_timeout={timeout} s"
    return ActorUnavailableError(f"{what}: {_grouped(by_reason)}")


def _grouped(by_reason: dict[str, list[str]], most: int = 8) -> str:
    """Addresses grouped by one reason, ``most`` named per group and ``most`` groups.

    Hundreds of dead addresses give a message a user reads, not one of 50 kB.
    """
    parts = []
    for reason, addresses in list(by_reason.items())[:most]:
        named = ", ".join(addresses[:most])
        more = f" and {len(addresses) - most} more" if len(addresses) > most else ""
        parts.append(f"{named}{more} ({reason:.400})")
    hidden = len(by_reason) - most
    return "; ".join(parts) + (f"; and {hidden} other reason(s)" if hidden > 0 else "")


#: Addresses already warned about a token sent in the clear (once each per process).
_CLEAR_TOKEN_WARNED: set[str] = set()


def _warn_token_in_clear(address: str) -> None:
    """Warn, once per address, that a token goes in the clear to an actor off loopback."""
    host = address.rpartition(":")[0]
    if is_loopback(host) or address in _CLEAR_TOKEN_WARNED:
        return
    _CLEAR_TOKEN_WARNED.add(address)
    logging.getLogger("learner_client").warning(
        "the token goes in the clear to %s (a plaintext channel off loopback: anyone on the "
        "path can read and reuse it); give the collector channel_credentials and serve the "
        "actor with TLS (docs/security.md)",
        address,
    )


class ActorChannel:
    """A ``grpc.aio`` channel to one actor; create and use it on the learner's event loop.

    Its errors name the actor as :attr:`name` does: by address, and by worker_id too once
    a Describe through it told it.

    Args:
        address: ``host:port``.
        metadata: Call metadata (the learner's id, the bearer token: ``ConnectionSettings``).
        credentials: Channel credentials for TLS, or None for plaintext.
    """

    def __init__(
        self,
        address: str,
        metadata: tuple[tuple[str, str | bytes], ...] = (),
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self.worker_id: int | None = None  # the last Describe's
        self._metadata = metadata
        self._credentials = credentials
        if credentials is None and any(key == "authorization" for key, _ in metadata):
            _warn_token_in_clear(address)
        self._channel = self._open(own_connection=False)
        # Every method's replies that do not parse raise ProtocolError (common.replies).
        replies = parsing_channel(self._channel, lambda: self.name)
        self._stub = pb_grpc.ActorServiceStub(replies)
        # PushWeights with requests serialised beforehand (see push_messages), per
        # connection: the first is the channel's; the others, each a TCP connection of its
        # own, carry the parts of a push striped over parallel streams (opened on first use).
        self._pushes = [_push_method(replies)]
        self._striping: list[grpc.aio.Channel] = []
        # Collect with chunk data read as views of the received messages (parse_collect_response).
        self._collect = replies.stream_stream(
            "/rlfleet.v1.ActorService/Collect",
            request_serializer=pb.CollectRequest.SerializeToString,
            response_deserializer=parse_collect_response,
            _registered_method=True,
        )

    def _open(self, *, own_connection: bool) -> grpc.aio.Channel:
        """A channel to the actor; ``own_connection``: not sharing another channel's TCP one."""
        options = client_channel_options() + _RECONNECT_OPTIONS
        if own_connection:  # channels to one target share a connection unless told not to
            options.append(("grpc.use_local_subchannel_pool", 1))
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.address, options=options)
        return grpc.aio.secure_channel(self.address, self._credentials, options=options)

    def _push_on(self, connection: int) -> Any:
        """The PushWeights call on connection ``connection`` (0: the channel's own)."""
        while len(self._pushes) <= connection:
            channel = self._open(own_connection=True)
            self._striping.append(channel)
            self._pushes.append(_push_method(parsing_channel(channel, lambda: self.name)))
        return self._pushes[connection]

    @property
    def name(self) -> str:
        """The actor as errors name it: its address, and its worker_id once it is known."""
        if self.worker_id is None:
            return self.address
        return f"{self.address} (worker_id {self.worker_id})"

    async def close(self) -> None:
        """Close the channel (and the connections of striped pushes), cancelling their calls."""
        for channel in [self._channel, *self._striping]:
            await channel.close(grace=None)

    async def describe(
        self, timeout: float, *, wait_for_ready: bool = False, probe: Segment | None = None
    ) -> ActorDescription:
        """Ask the actor what it is.

        Args:
            timeout: Deadline in seconds.
            wait_for_ready: Wait (within the deadline) for an actor that is not up yet
                instead of failing at once.
            probe: A probe segment the actor reads back if it shares this host.
        """
        request = pb.DescribeRequest()
        if probe is not None:
            request.shm_probe.CopyFrom(shm_control(probe))
        with translate_errors(self.name, timeout=timeout):
            try:
                r = await self._stub.Describe(
                    request,
                    timeout=timeout,
                    metadata=self._metadata,
                    wait_for_ready=wait_for_ready,
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                raise ProtocolError(
                    f"{self.name}: not an rlfleet actor: it does not serve "
                    f"rlfleet.v1.ActorService/Describe ({exc.details()}); check the address"
                ) from None
        description = ActorDescription.from_response(self.address, r)  # its revision first
        self.worker_id = description.worker_id
        return description

    async def why_unreachable(self) -> str:
        """Why this channel did not connect: a waiting call's error says only DEADLINE_EXCEEDED.

        One call that fails fast reports the channel's last connection error (refused, no
        such host, not HTTP/2, a failed TLS handshake); "" when it says nothing more. A
        channel that is connected needs no call (it would wait out its deadline, past the
        user's ``connect_timeout``): the actor took the connection and did not answer.
        """
        if self._channel.get_state() == grpc.ChannelConnectivity.READY:
            return "connected, but the actor did not answer: a stopped, hung or overloaded process"
        try:
            await self.describe(_REASON_TIMEOUT)
        except DeadlineError:
            return ""
        except Exception as exc:  # the reason, whatever it is
            # gRPC words some failures with a line of its own memory after the reason
            # ("socket: Too many open files\n\x00..."): the first line is the reason.
            reason = str(exc).removeprefix(f"{self.name}: ").split("\n", 1)[0]
            tls = self._credentials is not None
            hint = tls_mismatch_hint(
                reason,
                tls=tls,
                add_tls=_ADD_TLS,
                drop_tls=_DROP_TLS,
                add_client_cert=_ADD_CLIENT_CERT,
            )
            return reason + hint + fd_limit_hint(reason)
        return ""

    async def set_seed(self, seed: int, static_seed: bool, timeout: float) -> tuple[int, int]:
        """Seed the actor.

        Returns:
            ``(next_seed, first_seq)``: the seed to give the next actor, and the seq of
            the first batch the actor collects with the new seed (0 from an actor that
            does not say).
        """
        with translate_errors(self.name, timeout=timeout):
            r = await self._stub.SetSeed(
                pb.SetSeedRequest(seed=seed, static_seed=static_seed),
                timeout=timeout,
                metadata=self._metadata,
            )
        return r.next_seed, r.first_seq

    async def push_weights(
        self,
        model_id: str,
        version: int,
        messages: Sequence[bytes],
        timeout: float,
        *,
        part: bool = False,
        connection: int = 0,
    ) -> PushReply:
        """Stream one weight push; returns the version now in force and the actor's pause.

        Args:
            model_id: The model it updates.
            version: The version it installs.
            messages: The serialised requests (:func:`push_messages`).
            timeout: Deadline in seconds.
            part: The push is a part of a multi-part push (its header says so).
            connection: Which connection to the actor carries it (0: the channel's own;
                another opens a TCP connection of its own on first use).

        Raises:
            SessionStateError: The actor answered with another model, version or
                outcome than this push can have, so it did not apply (or stage) it.
        """

        async def requests() -> AsyncIterator[bytes]:
            for message in messages:
                yield message

        started = time.monotonic()
        # A further connection may still be reconnecting while the channel's own is up
        # (an actor restarted): its call waits for it, within the deadline.
        call = self._push_on(connection)(
            requests(), timeout=timeout, metadata=self._metadata, wait_for_ready=connection > 0
        )
        with translate_errors(self.name, FirstStatus(call), timeout):
            r = await call
        took = time.monotonic() - started
        if r.shm_refused:
            raise ShmRefusedError(f"{self.name}: {one_line(r.shm_refused)}")
        if r.relay_failed:
            raise RelayFailedError(f"{self.name}: {one_line(r.relay_failed)}")
        outcome = _OUTCOMES.get(r.outcome)
        if part:  # staged: an older version stays in force; completed: this one is
            fits = (outcome is PushOutcome.STAGED and r.version < version) or (
                outcome is PushOutcome.COMPLETED and r.version == version
            )
        else:  # actors that predate outcomes leave it unset
            fits = outcome in (None, PushOutcome.APPLIED) and r.version == version
        if r.model_id not in ("", model_id) or not fits:
            raise SessionStateError(
                f"{self.name}: push of {model_id!r} version {version} answered with "
                f"{r.model_id!r} version {r.version} (outcome {_outcome_name(r.outcome)})"
            )
        return _push_reply(r, outcome or PushOutcome.APPLIED, took)

    async def push_parts(
        self, model_id: str, version: int, parts: Sequence[Sequence[bytes]], timeout: float
    ) -> PushReply:
        """Stream the parts of one version, each on a connection of its own, all at once.

        The actor applies the version whole when the last part arrives; its replies are
        read as its one verdict on the version (``learner_client._stripes``). The first part
        to fail cancels the others: the version cannot complete.

        Raises:
            RlfleetError: The first part's failure; the version did not apply.
            SessionStateError: Every part was taken, yet none completed the version.
        """
        calls = [
            asyncio.ensure_future(
                self.push_weights(model_id, version, messages, timeout, part=True, connection=i)
            )
            for i, messages in enumerate(parts)
        ]
        try:
            done = [await call for call in asyncio.as_completed(calls)]
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        completing = [r for r in done if r.outcome is PushOutcome.COMPLETED]
        if len(completing) != 1:
            raise SessionStateError(
                f"{self.name}: the {len(parts)} parts of {model_id!r} version {version} "
                f"were taken, but {len(completing)} of them completed it"
            )
        first = completing[0]
        return PushReply(version, first.pause_seconds, epoch=first.epoch)

    async def forward_weights(self, request: pb.ForwardRequest, timeout: float) -> int:
        """Have the actor forward the blob it holds to another actor; the bytes taken there."""
        with translate_errors(self.name, timeout=timeout):
            r = await self._stub.ForwardWeights(request, timeout=timeout, metadata=self._metadata)
        return int(r.bytes_received)

    async def get_state(self, timeout: float) -> bytes:
        """Fetch the actor's state blob (header, then chunks; sha256 checked)."""
        assembler: BlobAssembler | None = None
        peer = self.name
        with translate_errors(peer, timeout=timeout):
            call = self._stub.GetState(  # an actor coming back is waited for, within timeout
                pb.GetStateRequest(), timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
            async for message in call:
                kind = message.WhichOneof("kind")
                if kind == "header" and assembler is None:
                    assembler = BlobAssembler(
                        message.header.total_bytes, sha256=message.header.sha256
                    )
                elif kind == "chunk" and assembler is not None:
                    assembler.add(message.chunk)
                else:
                    raise ProtocolError(f"{peer}: GetState sent {kind!r} out of order")
        if assembler is None:
            raise ProtocolError(f"{peer}: GetState sent no header")
        return bytes(assembler.finish())

    async def load_state(self, blob: bytes, timeout: float, *, allow_rollback: bool) -> int:
        """Send a state blob produced by :meth:`get_state`; returns the actor's worker_id.

        ``allow_rollback`` lets the actor's policy versions go back to the state's.
        """

        async def requests() -> AsyncIterator[pb.StateChunk]:
            header = pb.StateHeader(
                total_bytes=len(blob), sha256=sha256_hex(blob), allow_rollback=allow_rollback
            )
            yield pb.StateChunk(header=header)
            for piece in iter_blob_chunks(blob, CHUNK_BYTES):
                yield pb.StateChunk(chunk=bytes(piece))

        call = self._stub.LoadState(
            requests(), timeout=timeout, metadata=self._metadata, wait_for_ready=True
        )
        with translate_errors(self.name, FirstStatus(call), timeout):
            r = await call
        return r.worker_id

    def start_collect(self, requests: AsyncIterator[pb.CollectRequest]) -> CollectCall:
        """Start a ``Collect`` call sending ``requests`` (see :class:`CollectStream`)."""
        return _KeptStatusCall(self._collect(requests, metadata=self._metadata))
