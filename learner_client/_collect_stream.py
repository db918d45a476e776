"""One ``Collect`` session seen from the learner, and where credits and acks reach it.

:class:`CollectStream` sends ``open`` then credits, acks and ``close`` from a
queue; it reads ``opened``, then reassembles each batch's chunks with
:class:`~common.packets.assembly.BatchAssembler` (chunk data read as views of the
received messages and copied once, into the buffer ``allocate`` gives; crc32c
checked; decoded, and a folded batch rebuilt, off the loop when large) and
returns whole batches or the ``end`` marker; each batch's info and decoded size are
checked against what the session allows (:class:`~learner_client._batch_bounds.BatchBounds`).
A session opened with ``shm_batches`` (the actor proved it shares this host) may get a
batch as one chunk naming a shared-memory segment: it is read straight into the buffer
``allocate`` gives, checked like any other (``common.shm``: name, owner, mode, size; then
the CRC-32C over the copy), and a batch that cannot be read or fails its check raises
:class:`ShmBatchError`, after which the link re-opens the session taking bytes (the batch
comes again). A protocol violation or a broken call raises; the partial batch is dropped
with the stream. :class:`OpenStreams` is the direct route of the mailbox's credits and
acks to the open stream of each actor. Everything here runs on the learner's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from common.config import MIN_PEER_PROTOCOL, PROTOCOL_VERSION, CollectSettings
from common.errors import (
    DataLossError,
    DeadlineError,
    EnvError,
    ProtocolError,
    WeightsError,
    one_line,
)
from common.llm import LLMSettings
from common.packets import PacketLimits
from common.packets.assembly import BatchAssembler
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import Segment, SegmentMaps, ShmError
from learner_client._batch_bounds import BatchBounds
from learner_client._collect_wire import Chunk
from learner_client._errors import SettingsRefusedError
from learner_client._loop_thread import LoopThread
from learner_client._mailbox import Delivery
from learner_client._transport import Channel, translate_errors

__all__ = ["CollectStream", "EndEvent", "OpenStreams", "SessionInfo", "ShmBatchError"]

M = TypeVar("M", bound=Message)

# Packets above this size are decoded on a worker thread, not on the event loop.
_DECODE_OFF_LOOP_BYTES = 1 << 20
# Mappings of an actor's batch segments kept: as many as it keeps idle for reuse.
_KEPT_SEGMENTS = 4
_END_REASONS = {
    v.number: v.name.removeprefix("END_REASON_") for v in pb.EndReason.DESCRIPTOR.values
}


class ShmBatchError(DataLossError):
    """A batch could not be read from its shared-memory segment; the session goes on as bytes."""


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """The actor's ``opened`` reply: the epoch, the next seq, whether it resumed."""

    epoch: int
    next_seq: int
    resumed: bool


@dataclasses.dataclass(frozen=True)
class EndEvent:
    """The actor's ``end`` marker: the session is over, cleanly.

    Attributes:
        reason: The end reason's name (``"ERROR"``, ``"CLOSED"``, ...).
        message: The actor's message (one line, at most 1,000 characters).
        env_error: What the actor's env raised, when that ended the session.
    """

    reason: str
    message: str
    env_error: EnvError | None = None


def _env_error(end: pb.StreamEnd) -> EnvError | None:
    """The env's exception an ``end`` reports (its text None when the actor withheld it).

    Its text keeps its lines (a traceback's), cut to ``MAX_ENV_MESSAGE`` by :class:`EnvError`.
    """
    if not end.HasField("env_failure"):
        return None
    failure = end.env_failure
    text = None if failure.message_withheld else failure.exception_message
    return EnvError(one_line(failure.env), one_line(failure.exception_type), text)


class Settings(Protocol):
    """A settings dataclass (what :func:`dataclasses.fields` reads), sent field by field."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


def _to_proto(message: type[M], settings: Settings, **converted: object) -> M:
    """The wire message of a settings dataclass, whose fields it shares by name."""
    values = {field.name: getattr(settings, field.name) for field in dataclasses.fields(settings)}
    return message(**values | converted)


def llm_settings_to_proto(llm: LLMSettings) -> pb.LLMSettings:
    """The ``LLMSettings`` message of an LLM session (every generation field set)."""
    generation = _to_proto(pb.GenerationSettings, llm.generation)
    return _to_proto(pb.LLMSettings, llm, generation=generation)


def _open_request(
    settings: CollectSettings,
    credits: int,
    resume: tuple[int, int],
    take_over: bool,
    learner_id: str,
    shm_batches: bool,
) -> pb.CollectRequest:
    llm = None if settings.llm is None else llm_settings_to_proto(settings.llm)
    exploration = f"EXPLORATION_TYPE_{settings.exploration_type.name}"
    compiled = settings.compile_policy
    wire = _to_proto(
        pb.CollectSettings,
        settings,
        exploration_type=exploration,
        llm=llm,
        compile_policy=None if compiled is None else _to_proto(pb.CompileSettings, compiled),
    )
    return pb.CollectRequest(
        open=pb.OpenSession(
            settings=wire,
            credits=credits,
            take_over=take_over,
            resume_epoch=resume[0],
            resume_after_seq=resume[1],
            learner_id=learner_id,
            shm_batches=shm_batches,
            protocol_version=PROTOCOL_VERSION,
            min_peer_protocol=MIN_PEER_PROTOCOL,
        )
    )


def _claims_nothing(seq: int) -> bool:
    """``next_event``'s default ``on_start``: no take claims a batch as it arrives."""
    return False


class CollectStream:
    """One ``Collect`` session seen from the learner (use on the event loop).

    Call :meth:`opened` once, then :meth:`next_event` until it returns an
    :class:`EndEvent` or raises (the stream broke). :meth:`grant`, :meth:`ack`
    and :meth:`close` may be called at any time; :meth:`cancel` tears it down.

    Args:
        channel: The actor's channel.
        settings: The session's settings, sent in ``open``.
        credits: Credits granted in ``open``.
        resume: ``(epoch, seq)`` to resume after; ``(0, 0)`` for a fresh session.
        take_over: Replace a session of ours the actor still holds.
        learner_id: Our name in the actor's logs.
        allocate: Gives the buffer each batch is received into; None allocates fresh ones.
        shm_batches: Ask for batches through shared memory (the actor shares this host);
            called for each batch read from a segment. None: batches come as bytes.
        num_envs: The actor's env pool (chat slots) as Describe reported it: the shape of
            its batches of steps.
        worker_id: The actor's worker_id as Describe reported it: its batches' ids name it.
    """

    def __init__(
        self,
        channel: Channel,
        settings: CollectSettings,
        *,
        credits: int,
        resume: tuple[int, int],
        take_over: bool,
        learner_id: str,
        allocate: Callable[[int], Any] | None = None,
        shm_batches: Callable[[], None] | None = None,
        num_envs: int,
        worker_id: int,
    ) -> None:
        self.address = channel.address
        self._allocate = allocate
        self._shm_batches = shm_batches
        # The actor fills the same few segments again (once their batches are acked):
        # their mappings are kept, and a batch is copied from one with no page fault.
        self._segments = SegmentMaps(keep=_KEPT_SEGMENTS) if shm_batches is not None else None
        self._outbox: asyncio.Queue[pb.CollectRequest | None] = asyncio.Queue()
        shm = shm_batches is not None
        opening = _open_request(settings, credits, resume, take_over, learner_id, shm)
        self._outbox.put_nowait(opening)
        self._bounds = BatchBounds(self.address, settings, credits, num_envs, worker_id)
        self._closing = False
        self._acks_in_credit = False  # the actor's SessionOpened says whether it reads them
        self._call = channel.start_collect(self._requests())
        self._read: asyncio.Future | None = None
        self._limits = PacketLimits()
        # When credits last went out: an actor owes nothing before it gets them, so its
        # silence counts from here (or from its last message, whichever is later).
        self._credited_at = time.monotonic()

    async def _requests(self) -> AsyncIterator[pb.CollectRequest]:
        while True:
            message = await self._outbox.get()
            if message is None:
                return
            yield message

    def grant(self, batches: int, ack_seq: int = 0) -> None:
        """Grant ``batches`` more credits; an ``ack_seq`` (not 0) acknowledges up to it too."""
        if batches > 0 and not self._closing:
            self._credited_at = time.monotonic()
            self._bounds.granted(batches)
            credit = pb.Credit(batches=batches, ack_seq=ack_seq)
            self._outbox.put_nowait(pb.CollectRequest(credit=credit))

    def ack(self, seq: int) -> None:
        """Acknowledge every batch up to ``seq``."""
        if not self._closing:
            self._outbox.put_nowait(pb.CollectRequest(ack=pb.Ack(seq=seq)))

    def ack_and_grant(self, seq: int, batches: int) -> None:
        """Acknowledge every batch up to ``seq`` (0: none), then grant ``batches`` credits.

        One ``credit`` message carries both when the actor reads its ``ack_seq``
        (``SessionOpened.acks_in_credit``); else an ``ack`` goes first, then a ``credit``.
        """
        if seq and batches > 0 and self._acks_in_credit:
            self.grant(batches, ack_seq=seq)
            return
        if seq:
            self.ack(seq)
        self.grant(batches)

    def close(self) -> None:
        """Send ``close`` and half-close; the actor answers with ``end``."""
        if not self._closing:
            self._closing = True
            self._outbox.put_nowait(pb.CollectRequest(close=pb.CloseSession()))
            self._outbox.put_nowait(None)

    async def finished(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the call's status once the ``end`` marker was read.

        The actor counts a session whose call was cancelled before its handler returned as
        broken (the learner vanished), even when its ``end`` had reached the learner.
        """
        status = asyncio.ensure_future(self._call.code())
        done, _ = await asyncio.wait({status}, timeout=timeout)
        if not done:
            status.cancel()
        else:
            status.exception()  # retrieved: what it is does not matter, only that it came

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
    ) -> pb.CollectResponse | Chunk | None:
        # One read stays pending across idle checks: cancelling a read breaks the call.
        # Silence counts from the later of this read and the last credit granted: a learner
        # that trained for longer than ``idle`` before asking owes the actor its full ``idle``.
        if self._read is None:
            self._read = asyncio.ensure_future(self._call.read())
        quiet_from = time.monotonic()
        while True:
            start = max(quiet_from, self._credited_at)
            timeout = None if idle is None else max(0.0, start + idle - time.monotonic())
            done, _ = await asyncio.wait({self._read}, timeout=timeout)
            if done:
                break
            if self._credited_at > start:
                continue  # credits went out while waiting: the actor's time starts there
            if stalled is None or stalled():
                raise DeadlineError(f"{self.address}: no message from the actor for {idle:.1f} s")
            quiet_from = time.monotonic()  # nothing owed: the silence so far does not count
        read, self._read = self._read, None
        with translate_errors(self.address):
            message = read.result()
        return None if message is grpc.aio.EOF else message  # type: ignore[attr-defined]

    async def opened(self, timeout: float) -> SessionInfo:
        """Wait for the ``opened`` reply.

        Raises:
            SettingsRefusedError: The actor answered INVALID_ARGUMENT: the settings.
        """
        try:
            message = await self._receive(timeout)
        except (ProtocolError, WeightsError) as exc:  # here only a status: INVALID_ARGUMENT
            if isinstance(exc.__cause__, DecodeError):  # a reply that does not parse
                raise
            raise SettingsRefusedError(str(exc)) from None
        if not isinstance(message, pb.CollectResponse) or message.WhichOneof("kind") != "opened":
            kind = None if message is None else "chunk"
            if isinstance(message, pb.CollectResponse):
                kind = message.WhichOneof("kind")
            raise ProtocolError(f"{self.address}: expected 'opened' first, got {kind!r}")
        opened = message.opened
        self._bounds.opened(opened.epoch, opened.next_seq)
        self._acks_in_credit = opened.acks_in_credit
        return SessionInfo(opened.epoch, opened.next_seq, opened.resumed)

    async def next_event(
        self,
        idle: float | None = None,
        *,
        waiting: Callable[[], bool] | None = None,
        on_start: Callable[[int], bool | None] | None = None,
    ) -> Delivery | EndEvent:
        """The next whole batch or the end marker.

        Args:
            idle: Seconds without any message after which the stream counts as
                stalled (:class:`DeadlineError`); None waits forever.
            waiting: Tells whether the learner is owed a batch (credits outstanding): an
                idle stream that owes nothing is not stalled; inside a batch, idleness counts.
            on_start: Called with a batch's seq when its first chunk arrives; a true
                result (a waiting take claimed the batch) lets its credit leave first.

        Raises:
            ProtocolError: Chunks out of order or inconsistent, or a malformed packet.
            DataLossError: A batch failed its crc32c.
            ShmBatchError: A batch could not be read from its shared-memory segment.
            ActorUnavailableError: The call broke (or any other translated status).
        """
        assembler: BatchAssembler | None = None
        info: Any = None
        expected = count = 0  # the next chunk's index; the first chunk's count
        started = on_start or _claims_nothing
        while True:
            message = await self._receive(idle, waiting if assembler is None else None)
            if message is None:
                raise ProtocolError(f"{self.address}: stream ended without an 'end' marker")
            kind = "chunk" if isinstance(message, Chunk) else message.WhichOneof("kind")
            if kind == "end" and assembler is None:
                end = message.end  # type: ignore[union-attr]  # a Chunk is never "end"
                reason = _END_REASONS.get(end.reason, str(end.reason))
                return EndEvent(reason, one_line(end.message), _env_error(end))
            if kind != "chunk":
                what = repr(kind) if kind else "a message of a kind this build does not know"
                raise ProtocolError(f"{self.address}: unexpected {what} inside the stream")
            chunk = message if isinstance(message, Chunk) else Chunk.from_proto(message.chunk)
            if assembler is None and chunk.shm is not None:
                return await self._shared_batch(chunk, chunk.shm, started)
            if chunk.shm is not None:
                raise ProtocolError(
                    f"{self.address}: a shared-memory chunk inside batch {info.seq}"
                )
            if assembler is None:
                info, assembler, expected = chunk.info, self._start_batch(chunk), 0
                count, claimed = chunk.count, bool(started(info.seq))  # checked, not chunk's
            if chunk.seq != info.seq or chunk.index != expected or chunk.count != count:
                raise ProtocolError(
                    f"{self.address}: chunk (seq {chunk.seq}, index {chunk.index}, count "
                    f"{chunk.count}) out of order in batch seq {info.seq} (expected index "
                    f"{expected} of {count})"
                )
            assembler.add(chunk.data)
            expected += 1
            if expected == chunk.count:
                finish = functools.partial(assembler.finish, info.crc32c)
                return await self._finish(finish, info, claimed=claimed)

    def _start_batch(self, chunk: Chunk) -> BatchAssembler:
        """The assembler of the batch ``chunk`` (its first) starts, sized by its info."""
        if chunk.index != 0 or chunk.info is None or chunk.count < 1:
            raise ProtocolError(f"{self.address}: batch seq {chunk.seq} starts without info")
        self._bounds.check_info(chunk.info)
        return BatchAssembler(
            chunk.info.total_bytes,
            finals_bytes=chunk.info.fold.finals_bytes,
            limits=self._limits,
            allocate=self._allocate,
        )

    async def _shared_batch(
        self, chunk: Chunk, shm: pb.ShmSegment, started: Callable[[int], bool | None]
    ) -> Delivery:
        """A batch that lies in a shared-memory segment: read into place, checked, decoded."""
        segments = self._segments
        if self._shm_batches is None or segments is None:
            raise ProtocolError(
                f"{self.address}: batch seq {chunk.seq} names a shared-memory segment, "
                "but this session did not ask for any"
            )
        info = chunk.info
        if info is None or (chunk.index, chunk.count, chunk.seq) != (0, 1, info.seq):
            raise ProtocolError(
                f"{self.address}: shared-memory batch seq {chunk.seq} must be one chunk "
                "(index 0, count 1) with its info"
            )
        if chunk.data.nbytes:
            raise ProtocolError(f"{self.address}: shared-memory batch seq {chunk.seq} has data")
        if shm.size != info.total_bytes or shm.crc32c != info.crc32c:
            raise ProtocolError(
                f"{self.address}: shared-memory batch seq {chunk.seq}: the segment's size or "
                "crc32c differs from the batch's info"
            )
        assembler = self._start_batch(chunk)  # sizes checked against the packet limits
        claimed = bool(started(chunk.seq))  # a take claimed it: its credit goes first
        control = Segment(name=shm.name, size=int(shm.size), crc32c=int(shm.crc32c))

        def read_and_decode() -> Any:
            with segments.reader(control) as read_at:
                assembler.add_rest(read_at)
            return assembler.finish(expected_crc32c=info.crc32c)

        try:
            delivery = await self._finish(read_and_decode, info, claimed=claimed)
        except (ShmError, DataLossError) as exc:
            raise ShmBatchError(
                f"{self.address}: batch seq {chunk.seq} could not be read from shared "
                f"memory ({exc}); the session re-opens taking bytes"
            ) from exc
        self._shm_batches()
        return delivery

    async def _finish(
        self, decode: Callable[[], Any], info: pb.BatchInfo, *, claimed: bool = False
    ) -> Delivery:
        """The delivery of a batch ``decode`` finishes (off the loop when it is large).

        A ``claimed`` batch first lets the loop run once, so that the credit its claim
        queued is handed to gRPC before the decode holds the loop.
        """
        if claimed:
            await asyncio.sleep(0)
        if info.total_bytes < _DECODE_OFF_LOOP_BYTES:
            batch = decode()
        else:
            batch = await asyncio.get_running_loop().run_in_executor(None, decode)
        frames = self._bounds.check_batch(info, batch)
        return Delivery(
            info.worker_id,
            info.epoch,
            info.seq,
            batch,
            frames,
            version_min=info.policy_version_min,
            version_max=info.policy_version_max,
        )


class OpenStreams:
    """The open :class:`CollectStream` of each actor: where the mailbox's credits and acks go.

    :meth:`grant` and :meth:`ack` may be called from any thread; they run on the
    loop, on the stream open at that moment. With none open they are dropped:
    the next ``open`` carries fresh credits and resumes after the last seq seen. An ack
    goes only to a stream of the actor process (epoch) whose batch it acknowledges: one
    of a batch an actor sent before it restarted would acknowledge its successor's
    batches of those seqs, which the learner may not hold yet.
    Sends queued before the loop gets to them go in one wake-up of the loop, an
    actor's in one message where it can: acks are cumulative and credits add up,
    so its highest ack and the sum of its credits go as one ``credit`` (an async
    collector's ack of a batch and credit for the next: one message, not two; a
    sync round's ack leaves when the round is taken, its credit when the next
    round is asked for, so they travel apart unless both are queued by then).

    Args:
        loop: The learner's event loop.
    """

    def __init__(self, loop: LoopThread) -> None:
        self._loop = loop
        # worker_id -> (its open stream, the epoch of the process it was opened on).
        self._streams: dict[int, tuple[CollectStream, int]] = {}
        # worker_id -> (credits to grant, {epoch: highest seq to ack}), until the loop sends them.
        self._pending: dict[int, tuple[int, dict[int, int]]] = {}
        self._pending_lock = threading.Lock()

    def attach(self, worker_id: int, stream: CollectStream, epoch: int) -> None:
        """Route ``worker_id``'s credits, and acks of ``epoch``, to ``stream`` (on the loop)."""
        self._streams[worker_id] = (stream, epoch)

    def detach(self, worker_id: int, stream: CollectStream) -> None:
        """Stop routing to ``stream`` (on the loop; a newer stream stays attached)."""
        attached = self._streams.get(worker_id)
        if attached is not None and attached[0] is stream:
            del self._streams[worker_id]

    def grant(self, worker_id: int, batches: int) -> None:
        """Grant ``batches`` credits on ``worker_id``'s open stream."""
        self._queue(worker_id, batches)

    def ack(self, worker_id: int, epoch: int, seq: int) -> None:
        """Acknowledge batches up to ``seq`` of ``epoch`` on ``worker_id``'s open stream."""
        self._queue(worker_id, 0, (epoch, seq))

    def _queue(self, worker_id: int, batches: int, ack: tuple[int, int] | None = None) -> None:
        with self._pending_lock:
            first = not self._pending
            credits, acks = self._pending.get(worker_id, (0, {}))
            if ack is not None:
                acks[ack[0]] = max(acks.get(ack[0], 0), ack[1])
            self._pending[worker_id] = (credits + batches, acks)
        if first:  # later sends join this wake-up until the loop takes the queue
            self._loop.call_soon(self._send_pending)

    def send_now(self) -> None:
        """Send what is queued now, without waiting for the queued wake-up (on the loop)."""
        self._send_pending()

    def _send_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for worker_id, (batches, acks) in pending.items():
            attached = self._streams.get(worker_id)
            if attached is not None:
                stream, epoch = attached
                stream.ack_and_grant(acks.get(epoch, 0), batches)
