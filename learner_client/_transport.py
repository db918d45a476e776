"""The learner's side of the ``rlfleet.v1`` wire: a channel per actor, every call, reassembly.

This is the only learner module that touches the generated stubs. It runs on
the learner's single asyncio event loop (see :mod:`learner_client._loop`):

* :class:`ActorChannel` — a ``grpc.aio`` channel to one actor with every unary
  and client/server-streaming call (Describe, SetSeed, PushWeights, GetState,
  LoadState), each under a deadline, each returning plain Python values.
* :class:`CollectStream` — one ``Collect`` session: sends ``open`` then credits,
  acks and ``close`` from a queue; reads ``opened``, then reassembles each
  batch's chunks with :class:`~common.packets.PacketAssembler` (one copy, crc32
  checked, decoded off the loop when large) and returns whole batches or the
  ``end`` marker. A protocol violation or a broken call raises; the partial
  batch is dropped with the stream.
* :func:`translate_errors` — the one place ``grpc.RpcError`` becomes an
  :mod:`common.errors` exception, prefixed with the actor's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from tensordict import TensorDictBase

from common.config import CHUNK_BYTES, CollectSettings, client_channel_options
from common.errors import DeadlineError, ProtocolError, SessionStateError, from_status
from common.packets import PacketAssembler, PacketLimits
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import BlobAssembler, iter_blob_chunks, sha256_hex
from learner_client._push_chunks import SharedChunks, encode_header

__all__ = [
    "ActorChannel",
    "ActorDescription",
    "BatchEvent",
    "CollectStream",
    "EndEvent",
    "SessionInfo",
    "translate_errors",
]

# Packets above this size are decoded on a worker thread, not on the event loop.
_DECODE_OFF_LOOP_BYTES = 1 << 20
# gRPC's own reconnect backoff grows to 120 s by default; an actor restarted on
# the same port must be found again within our (shorter, jittered) backoff.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
# Chunk messages of the weight blobs being pushed, shared by the pushes of one blob.
_SHARED_CHUNKS = SharedChunks(CHUNK_BYTES)
_END_REASONS = {v.number: v.name.removeprefix("END_REASON_") for v in
                pb.EndReason.DESCRIPTOR.values}  # fmt: skip


def _pre_serialized(message: bytes) -> bytes:
    return message


@contextlib.contextmanager
def translate_errors(peer: str) -> Iterator[None]:
    """Turn ``grpc.RpcError`` (sync or aio) into the matching rlfleet error naming ``peer``."""
    try:
        yield
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        raise from_status(code, details, peer=peer) from None


@dataclasses.dataclass(frozen=True)
class ActorDescription:
    """What Describe reports about one actor, as plain values.

    Attributes:
        address: ``host:port`` it was reached at.
        worker_id: Its id in the fleet.
        epoch: Its current epoch (new at every process start).
        env_id: The gymnasium env it runs.
        num_envs: Its env pool size.
        models: ``{model_id: policy version}``.
        max_credits: Most outstanding credits it honours.
        busy: Whether a learner session is active.
        device: The policy's torch device.
        software_version: The actor's rlfleet version.
    """

    address: str
    worker_id: int
    epoch: int
    env_id: str
    num_envs: int
    models: dict[str, int]
    max_credits: int
    busy: bool
    device: str
    software_version: str


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """The actor's ``opened`` reply."""

    worker_id: int
    epoch: int
    next_seq: int
    max_credits: int
    resumed: bool


@dataclasses.dataclass(frozen=True)
class BatchEvent:
    """A complete, checked, decoded batch."""

    worker_id: int
    epoch: int
    seq: int
    frames: int
    model_id: str
    version_min: int
    version_max: int
    batch: TensorDictBase


@dataclasses.dataclass(frozen=True)
class EndEvent:
    """The actor's ``end`` marker: the session is over, cleanly."""

    reason: str
    message: str
    last_seq: int


class ActorChannel:
    """A ``grpc.aio`` channel to one actor; create and use it on the learner's event loop.

    Args:
        address: ``host:port``.
        metadata: Call metadata (the bearer token).
        credentials: Channel credentials for TLS, or None for plaintext.
    """

    def __init__(
        self,
        address: str,
        metadata: tuple[tuple[str, str], ...] = (),
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self._metadata = metadata
        options = client_channel_options() + _RECONNECT_OPTIONS
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        self._stub = pb_grpc.ActorServiceStub(self._channel)
        # PushWeights with requests serialised beforehand (see learner_client._push_chunks).
        self._push_raw = self._channel.stream_unary(
            "/rlfleet.v1.ActorService/PushWeights",
            request_serializer=_pre_serialized,
            response_deserializer=pb.PushWeightsResponse.FromString,
            _registered_method=True,
        )

    async def close(self) -> None:
        """Close the channel, cancelling its calls."""
        await self._channel.close(grace=None)

    async def describe(self, timeout: float, *, wait_for_ready: bool = False) -> ActorDescription:
        """Ask the actor what it is.

        Args:
            timeout: Deadline in seconds.
            wait_for_ready: Wait (within the deadline) for an actor that is not up yet
                instead of failing at once.
        """
        with translate_errors(self.address):
            r = await self._stub.Describe(
                pb.DescribeRequest(),
                timeout=timeout,
                metadata=self._metadata,
                wait_for_ready=wait_for_ready,
            )
        return ActorDescription(
            address=self.address,
            worker_id=r.worker_id,
            epoch=r.epoch,
            env_id=r.env_id,
            num_envs=r.num_envs,
            models={m.model_id: m.version for m in r.models},
            max_credits=r.max_credits,
            busy=r.busy,
            device=r.device,
            software_version=r.software_version,
        )

    async def set_seed(self, seed: int, static_seed: bool, timeout: float) -> int:
        """Seed the actor; returns the seed to give the next one."""
        with translate_errors(self.address):
            r = await self._stub.SetSeed(
                pb.SetSeedRequest(seed=seed, static_seed=static_seed),
                timeout=timeout,
                metadata=self._metadata,
            )
        return r.next_seed

    async def push_weights(
        self, model_id: str, version: int, blob: bytes, sha256: str, timeout: float
    ) -> int:
        """Stream one weight push (header, then chunks); returns the version now in force.

        Raises:
            SessionStateError: The actor answered with another model or version, so
                it did not apply this push.
        """
        header = encode_header(
            pb.WeightsHeader(
                model_id=model_id, version=version, total_bytes=len(blob), sha256=sha256
            )
        )

        async def requests(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
            yield header
            for message in chunks:
                yield message

        # Held before the first await, so every push of one Fleet.push shares the chunks.
        with _SHARED_CHUNKS.hold(blob) as chunks, translate_errors(self.address):
            r = await self._push_raw(requests(chunks), timeout=timeout, metadata=self._metadata)
        if r.model_id not in ("", model_id) or r.version != version:
            raise SessionStateError(
                f"{self.address}: push of {model_id!r} version {version} answered with "
                f"{r.model_id!r} version {r.version}"
            )
        return r.version

    async def get_state(self, timeout: float) -> bytes:
        """Fetch the actor's state blob (header, then chunks; sha256 checked)."""
        assembler: BlobAssembler | None = None
        with translate_errors(self.address):
            call = self._stub.GetState(
                pb.GetStateRequest(), timeout=timeout, metadata=self._metadata
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
                    raise ProtocolError(f"{self.address}: GetState sent {kind!r} out of order")
        if assembler is None:
            raise ProtocolError(f"{self.address}: GetState sent no header")
        return bytes(assembler.finish())

    async def load_state(self, blob: bytes, timeout: float) -> int:
        """Send a state blob produced by :meth:`get_state`; returns the actor's worker_id."""

        async def requests() -> AsyncIterator[pb.StateChunk]:
            header = pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob))
            yield pb.StateChunk(header=header)
            for piece in iter_blob_chunks(blob, CHUNK_BYTES):
                yield pb.StateChunk(chunk=bytes(piece))

        with translate_errors(self.address):
            r = await self._stub.LoadState(requests(), timeout=timeout, metadata=self._metadata)
        return r.worker_id

    #: The ``allocate`` of the Collect streams' PacketAssembler, read as each batch
    #: starts: the sync rounds set it so that a round's packets share one slab
    #: (learner_client._slabs); None reassembles into fresh buffers.
    packet_allocator: Callable[[int], Any] | None = None

    def collect(
        self,
        settings: CollectSettings,
        *,
        credits: int,
        resume: tuple[int, int],
        take_over: bool,
        learner_id: str,
    ) -> CollectStream:
        """Start a ``Collect`` call; the ``open`` message is the first one sent."""
        return CollectStream(
            self,
            settings,
            credits=credits,
            resume=resume,
            take_over=take_over,
            learner_id=learner_id,
        )

    def _start_collect(self, requests: AsyncIterator[pb.CollectRequest]) -> Any:
        return self._stub.Collect(requests, metadata=self._metadata)


def _open_request(
    settings: CollectSettings,
    credits: int,
    resume: tuple[int, int],
    take_over: bool,
    learner_id: str,
) -> pb.CollectRequest:
    wire = pb.CollectSettings(
        frames_per_batch=settings.frames_per_batch,
        max_frames_per_traj=settings.max_frames_per_traj,
        init_random_frames=settings.init_random_frames,
        reset_at_each_iter=settings.reset_at_each_iter,
        reset_when_done=settings.reset_when_done,
        split_trajs=settings.split_trajs,
        exploration_type=pb.ExplorationType.Value(
            f"EXPLORATION_TYPE_{settings.exploration_type.name}"
        ),
        set_truncated=settings.set_truncated,
        total_frames=settings.total_frames,
        model_id=settings.model_id,
    )
    return pb.CollectRequest(
        open=pb.OpenSession(
            settings=wire,
            credits=credits,
            take_over=take_over,
            resume_epoch=resume[0],
            resume_after_seq=resume[1],
            learner_id=learner_id,
        )
    )


class CollectStream:
    """One ``Collect`` session seen from the learner (use on the event loop).

    Call :meth:`opened` once, then :meth:`next_event` until it returns an
    :class:`EndEvent` or raises (the stream broke). :meth:`grant`, :meth:`ack`
    and :meth:`close` may be called at any time; :meth:`cancel` tears it down.
    """

    def __init__(
        self,
        channel: ActorChannel,
        settings: CollectSettings,
        *,
        credits: int,
        resume: tuple[int, int],
        take_over: bool,
        learner_id: str,
    ) -> None:
        self.address = channel.address
        self._channel = channel
        self._outbox: asyncio.Queue[pb.CollectRequest | None] = asyncio.Queue()
        self._outbox.put_nowait(_open_request(settings, credits, resume, take_over, learner_id))
        self._closing = False
        self._call = channel._start_collect(self._requests())
        self._read: asyncio.Future | None = None
        self._limits = PacketLimits()

    async def _requests(self) -> AsyncIterator[pb.CollectRequest]:
        while True:
            message = await self._outbox.get()
            if message is None:
                return
            yield message

    def grant(self, batches: int) -> None:
        """Grant ``batches`` more credits."""
        if batches > 0 and not self._closing:
            self._outbox.put_nowait(pb.CollectRequest(credit=pb.Credit(batches=batches)))

    def ack(self, seq: int) -> None:
        """Acknowledge every batch up to ``seq``."""
        if not self._closing:
            self._outbox.put_nowait(pb.CollectRequest(ack=pb.Ack(seq=seq)))

    def close(self) -> None:
        """Send ``close`` and half-close; the actor answers with ``end``."""
        if not self._closing:
            self._closing = True
            self._outbox.put_nowait(pb.CollectRequest(close=pb.CloseSession()))
            self._outbox.put_nowait(None)

    def cancel(self) -> None:
        """Tear the call down at once (idempotent)."""
        if not self._closing:
            self._closing = True
            # Ends the request generator, so gRPC's task draining it finishes too.
            self._outbox.put_nowait(None)
        self._call.cancel()
        if self._read is not None:
            self._read.cancel()

    async def _receive(
        self, idle: float | None, stalled: Callable[[], bool] | None = None
    ) -> pb.CollectResponse | None:
        # One read stays pending across idle checks: cancelling a read breaks the call.
        if self._read is None:
            self._read = asyncio.ensure_future(self._call.read())
        while True:
            done, _ = await asyncio.wait({self._read}, timeout=idle)
            if done:
                break
            if stalled is None or stalled():
                raise DeadlineError(f"{self.address}: no message from the actor for {idle:.1f} s")
        read, self._read = self._read, None
        with translate_errors(self.address):
            message = read.result()
        return None if message is grpc.aio.EOF else message

    async def opened(self, timeout: float) -> SessionInfo:
        """Wait for the ``opened`` reply."""
        message = await self._receive(timeout)
        if message is None or message.WhichOneof("kind") != "opened":
            kind = None if message is None else message.WhichOneof("kind")
            raise ProtocolError(f"{self.address}: expected 'opened' first, got {kind!r}")
        o = message.opened
        return SessionInfo(
            worker_id=o.worker_id,
            epoch=o.epoch,
            next_seq=o.next_seq,
            max_credits=o.max_credits,
            resumed=o.resumed,
        )

    async def next_event(
        self,
        idle: float | None = None,
        *,
        waiting: Callable[[], bool] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> BatchEvent | EndEvent:
        """The next whole batch or the end marker.

        Args:
            idle: Seconds without any message after which the stream counts as
                stalled (:class:`DeadlineError`); None waits forever.
            waiting: Tells whether the learner is owed a batch (credits are
                outstanding); an idle stream that owes nothing is not stalled.
                Inside a batch, idleness always counts.
            on_start: Called with a batch's seq when its first chunk arrives.

        Raises:
            ProtocolError: Chunks out of order or inconsistent, or a malformed packet.
            DataLossError: A batch failed its crc32.
            ActorUnavailableError: The call broke (or any other translated status).
        """
        assembler: PacketAssembler | None = None
        info: Any = None
        expected = 0
        while True:
            message = await self._receive(idle, waiting if assembler is None else None)
            if message is None:
                raise ProtocolError(f"{self.address}: stream ended without an 'end' marker")
            kind = message.WhichOneof("kind")
            if kind == "end" and assembler is None:
                e = message.end
                return EndEvent(
                    reason=_END_REASONS.get(e.reason, str(e.reason)),
                    message=e.message,
                    last_seq=e.last_seq,
                )
            if kind != "chunk":
                raise ProtocolError(f"{self.address}: unexpected {kind!r} inside the stream")
            chunk = message.chunk
            if assembler is None:
                if chunk.index != 0 or not chunk.HasField("info") or chunk.count < 1:
                    raise ProtocolError(
                        f"{self.address}: batch seq {chunk.seq} starts without info"
                    )
                info, expected = chunk.info, 0
                if on_start is not None:
                    on_start(chunk.seq)
                assembler = PacketAssembler(
                    info.frame_bytes, self._limits, allocate=self._channel.packet_allocator
                )
            if chunk.seq != info.seq or chunk.index != expected or chunk.count < expected + 1:
                raise ProtocolError(
                    f"{self.address}: chunk (seq {chunk.seq}, index {chunk.index}) out of order "
                    f"in batch seq {info.seq} (expected index {expected})"
                )
            assembler.add(chunk.data)
            expected += 1
            if expected == chunk.count:
                batch = await self._finish(assembler, info.crc32, info.frame_bytes)
                return BatchEvent(
                    worker_id=info.worker_id,
                    epoch=info.epoch,
                    seq=info.seq,
                    frames=info.frames,
                    model_id=info.model_id,
                    version_min=info.policy_version_min,
                    version_max=info.policy_version_max,
                    batch=batch,
                )

    async def _finish(self, assembler: PacketAssembler, crc32: int, size: int) -> TensorDictBase:
        if size < _DECODE_OFF_LOOP_BYTES:
            return assembler.finish(expected_crc32=crc32)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, assembler.finish, crc32)
