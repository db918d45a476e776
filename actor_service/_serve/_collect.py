"""One ``Collect`` stream: the reader, collector and writer of a learner session.

A :class:`CollectSession` runs three cooperating parts on the event loop:

* the **reader** applies the learner's ``credit``, ``ack`` and ``close``
  messages to the actor's :class:`~actor_service._serve._session.SessionBook`;
* the **collector** starts a batch only while the book allows it (a credit
  is held, few enough batches wait to be sent, the budget is not reached),
  runs ``collect_batch`` and the packet encoding on the collection
  thread, and queues the numbered result;
* the **writer** (the RPC handler itself) sends ``opened``, then re-sent and
  new batches as chunks (never interleaved), then exactly one ``end``.

When an env raises, the session ends with ERROR and its ``end`` carries an
``EnvFailure``: the env, the exception's type and, unless the actor runs with
``env_error_detail="type"``, its text (which stays in the actor's log either
way). How a session ends decides what is still sent: BUDGET_REACHED, DRAINING and
ERROR first finish the in-flight batch and send every queued one; CLOSED and
TAKEN_OVER stop after the batch being written (what was not sent stays
retained for a resume). A broken stream (the learner cancelled or vanished)
writes nothing more. In both cases the batch being collected is abandoned
before its next env step (it has no seq yet, so no learner sees a gap) and the
actor is busy until then; the next learner is accepted at once after that.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc

from actor_service._serve._convert import InvalidSettingsError, settings_from_proto
from actor_service._serve._encoded import EncodedBatch, collect_encoded
from actor_service._serve._logging import log_event
from actor_service._serve._runtime import ActorRuntime
from actor_service._serve._session import RetainedBatch
from actor_service._serve._shm import BatchSegments
from actor_service._serve._streams import kind_of
from actor_service._serve._wire import encode_control
from common.config import (
    MAX_WIRE_LEARNER_ID,
    check_learner_id,
    protocol_mismatch,
)
from common.errors import EnvError, ProtocolError, RlfleetError, SessionStateError, to_status
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = ["CollectSession", "env_failure"]

# How long a session that wrote its ``end`` waits for the learner to half-close (it does once it
# read the ``end``) before the call's status goes: a status answered while the learner writes a
# credit reaches gRPC's asyncio client as INTERNAL in place of the ``end`` (grpc/grpc#36066).
# A drain bounds it by half its budget (``CollectSession.drain``).
_LEARNER_CLOSE_S = 1.0
# End reasons after which queued batches are still sent before `end`.
_FLUSHING = frozenset({pb.END_REASON_BUDGET_REACHED, pb.END_REASON_DRAINING, pb.END_REASON_ERROR})


def _collect_numbered(
    runtime: ActorRuntime,
    model_id: str,
    seq: int,
    abandon: threading.Event,
    segments: BatchSegments | None,
) -> EncodedBatch:
    """Collect batch ``seq`` on the collection thread and record it as the last collected."""
    encoded = collect_encoded(
        runtime.core,
        model_id,
        seq=seq,
        epoch=runtime.book.epoch,
        worker_id=runtime.config.worker_id,
        abandon=abandon,
        segments=segments,
    )
    runtime.last_collected_seq = seq
    return encoded


def env_failure(exc: EnvError, *, full: bool) -> pb.EnvFailure:
    """What the end message says about an env's exception (its text only when ``full``)."""
    return pb.EnvFailure(
        env=exc.env,
        exception_type=exc.exception_type,
        exception_message=(exc.exception_message or "") if full else "",
        message_withheld=not full or exc.exception_message is None,
    )


def _as_sent(failure: pb.EnvFailure) -> EnvError:
    """The error as the learner will see it (so the end message says no more than that)."""
    text = None if failure.message_withheld else failure.exception_message
    return EnvError(failure.env, failure.exception_type, text)


@contextlib.contextmanager
def _refused_settings() -> Iterator[None]:
    """A core's ValueError or TypeError on settings as the INVALID_ARGUMENT a learner reads."""
    try:
        yield
    except RlfleetError:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidSettingsError(f"invalid collect settings: {exc}") from None


def _learner_of(request: pb.OpenSession, peer: str) -> str:
    """Who opens the session: its ``learner_id`` (checked for length), else its address.

    Raises:
        ProtocolError: A ``learner_id`` longer than :data:`MAX_WIRE_LEARNER_ID`, or a
            protocol revision this actor does not work with (0, not said, is served).
    """
    if request.protocol_version:
        mismatch = protocol_mismatch(
            f"learner {peer}", request.protocol_version, request.min_peer_protocol
        )
        if mismatch:
            raise ProtocolError(f"OpenSession: {mismatch}")
    if not request.learner_id:
        return peer
    try:
        return check_learner_id(request.learner_id, MAX_WIRE_LEARNER_ID)
    except ValueError as exc:
        raise ProtocolError(f"OpenSession: {exc}") from None


class CollectSession:
    """A learner session on one ``Collect`` call.

    Args:
        runtime: The actor's serving state.
        request: The ``open`` message.
        peer: The learner's address, for logs.

    Raises:
        ProtocolError: The learner's protocol revision, checked before any other field
            (a learner of another revision may mean something else by them), or its id.
        InvalidSettingsError: The settings do not convert.
    """

    def __init__(self, runtime: ActorRuntime, request: pb.OpenSession, peer: str) -> None:
        self.learner_id = _learner_of(request, peer)
        self._rt = runtime
        self._metrics = runtime.metrics  # counts sends and session ends; None counts nothing
        self._open = request
        self._settings = settings_from_proto(request.settings)
        # Batches through shared memory: the learner asked (it proved it shares this host)
        # and this actor allows it.
        self._segments = runtime.batch_segments() if request.shm_batches else None
        self._peer = peer
        self.active = False
        self._session_id = 0
        self._outbox: collections.deque[RetainedBatch[EncodedBatch]] = collections.deque()
        self._stop: pb.EndReason | None = None
        self._stop_message = ""
        # When a drain wants this call's status answered by (monotonic seconds); None: no hurry.
        self._close_by: float | None = None
        self._failure: BaseException | None = None
        self._env_failure: pb.EnvFailure | None = None
        self._collector_done = True
        self._collector_idle = asyncio.Event()
        self._collector_idle.set()
        self._finished = asyncio.Event()
        self._wake_writer = asyncio.Event()
        self._wake_collector = asyncio.Event()
        self._last_sent = 0
        self._sent = 0
        self._collector: asyncio.Task[None] | None = None
        # Set when the session ends without flushing: the in-flight batch is given up
        # at its next env step instead of holding the env pool for the rest of it.
        self._abandon = threading.Event()
        self._keep_batch = False  # its own learner resumes it: the batch under way is re-sent

    # ------------------------------------------------------------ control

    def take_over(self, *, by_its_learner: bool = False) -> None:
        """End this session with TAKEN_OVER after the batch being written.

        ``by_its_learner``: its own learner resumes it (its stream was half-open): the
        batch under way is finished, not given up, and re-sent to the resumed session, so
        its trajectories go on.
        """
        self._keep_batch = by_its_learner
        self._request_stop(pb.END_REASON_TAKEN_OVER, "another learner took the session over")

    def drain(self, close_by: float | None = None) -> None:
        """End this session with DRAINING once the in-flight and queued batches are sent.

        ``close_by``: the monotonic time by which the call answers its status, the learner
        closed its side or not (a drain's budget; see :data:`_LEARNER_CLOSE_S`).
        """
        self._close_by = close_by
        self._request_stop(pb.END_REASON_DRAINING, "the actor is shutting down")

    @property
    def collecting(self) -> bool:
        """Whether a batch of this session is still being collected (possibly being abandoned)."""
        return not self._collector_idle.is_set()

    async def wait_collector_idle(self) -> None:
        """Wait until no batch of this session is being collected."""
        await self._collector_idle.wait()

    async def wait_finished(self) -> None:
        """Wait until the handler of this session returned."""
        await self._finished.wait()

    # ---------------------------------------------------------------- run

    async def run(
        self, requests: AsyncIterator[pb.CollectRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """Serve the session until it ends; raises an ``RlfleetError`` for a non-OK status."""
        try:
            with _refused_settings():  # before a take-over can end the session in force
                await asyncio.to_thread(self._rt.core.check, self._settings)
            await self._rt.acquire(
                self,
                take_over=self._open.take_over,
                learner_id=self.learner_id,
                resume_epoch=self._open.resume_epoch,
                peer=self._peer,
            )
        except BaseException:
            self._finished.set()
            raise
        reader: asyncio.Task[None] | None = None
        ended = ""  # the reason written in the stream's end; "" when none could be
        try:
            opened = await self._start()
            if self._session_id:  # else taken over or drained while configuring: just end
                reader = asyncio.create_task(self._read(requests))
                self._collector_done = False
                self._collector_idle.clear()
                # Not cancelled when the stream ends: it finishes its in-flight batch first.
                self._collector = asyncio.create_task(self._collect())
            await context.write(encode_control(pb.CollectResponse(opened=opened)))
            await self._write_loop(context)
            if self._failure is not None:
                raise self._failure
            end = pb.StreamEnd(
                reason=self._stop or pb.END_REASON_CLOSED,
                message=self._stop_message,
                last_seq=self._last_sent,
                env_failure=self._env_failure,
            )
            await context.write(encode_control(pb.CollectResponse(end=end)))
            ended = pb.EndReason.Name(end.reason)
            if reader is not None:  # the status waits for the learner's last credit
                await asyncio.wait({reader}, timeout=self._close_wait())
        finally:
            self._request_stop(pb.END_REASON_CLOSED, "stream broken")
            self._count_end(ended)
            if self.collecting and not self._keep_batch:
                self._abandon.set()
            self.active = False
            if reader is not None:
                reader.cancel()
            if self._is_current():
                self._rt.book.close()
            self._finished.set()

    def _close_wait(self) -> float:
        """How long the status may still wait for the learner to close its side."""
        if self._close_by is None:
            return _LEARNER_CLOSE_S
        return min(_LEARNER_CLOSE_S, max(0.0, self._close_by - time.monotonic()))

    def _count_end(self, ended: str) -> None:
        """Log and count how the session ended (``session.ended``, the sessions counter).

        ``ended`` is the reason its end message gave; ``broken`` when none could be written
        (the learner vanished, its stream broke).

        A session refused with an error status (a protocol violation) counts as ``error``.
        """
        if not self._session_id:
            return
        broken = not ended and self._failure is None
        log_event(
            "session.ended",
            logging.INFO,
            learner=self.learner_id,
            reason="broken" if broken else ended or pb.EndReason.Name(pb.END_REASON_ERROR),
            last_seq=self._last_sent,
            batches=self._sent,
        )
        if self._metrics is not None:
            self._metrics.session_ended(None if broken else self._stop or pb.END_REASON_CLOSED)

    async def _start(self) -> pb.SessionOpened:
        book, request = self._rt.book, self._open
        with _refused_settings():
            await self._rt.run_collect(self._rt.core.place, self._settings)
            await self._rt.run_collect(self._rt.core.configure, self._settings)
        if self._stop is not None:
            return pb.SessionOpened(
                worker_id=self._rt.config.worker_id,
                epoch=book.epoch,
                next_seq=book.next_seq,
                max_credits=book.max_credits,
            )
        opened = book.open(
            credits=request.credits,
            resume_epoch=request.resume_epoch,
            resume_after_seq=request.resume_after_seq,
            total_frames=self._settings.total_frames,
            take_over=True,
            learner_id=self.learner_id,
        )
        self._session_id = opened.session_id
        if not opened.resumed:  # a new collector: as TorchRL's, its envs start from a reset
            await self._rt.run_collect(self._rt.core.start_anew)
        self._outbox.extend(opened.resend)
        log_event(
            "session.opened",
            logging.INFO,
            learner=self.learner_id,
            peer=self._peer,
            credits=opened.credits,
            resumed=opened.resumed,
            resend=len(opened.resend),
            next_seq=opened.next_seq,
            frames_per_batch=self._settings.frames_per_batch,
            model_id=self._settings.model_id,
            shm_batches=self._segments is not None,
        )
        return pb.SessionOpened(
            worker_id=self._rt.config.worker_id,
            epoch=book.epoch,
            next_seq=opened.next_seq,
            max_credits=book.max_credits,
            resumed=opened.resumed,
            acks_in_credit=True,
        )

    # ------------------------------------------------------------- parts

    async def _read(self, requests: AsyncIterator[pb.CollectRequest]) -> None:
        try:
            async for request in requests:
                kind = request.WhichOneof("kind")
                if not self._is_current() or self._stop is not None:
                    continue  # ended or taken over: the learner's late messages change nothing
                if kind == "credit":
                    if request.credit.ack_seq:  # an ack sent with the credit, first
                        self._acknowledge(request.credit.ack_seq)
                    self._rt.book.grant(request.credit.batches)
                elif kind == "ack":
                    self._acknowledge(request.ack.seq)
                elif kind == "close":
                    self._request_stop(pb.END_REASON_CLOSED, "the learner closed the session")
                    return
                else:
                    raise SessionStateError(
                        f"{kind_of(request)} after open: only credit, ack and close may follow"
                    )
                self._wake()
            self._request_stop(pb.END_REASON_CLOSED, "the learner closed the session")
        except RlfleetError as exc:
            self._failure = exc
            self._request_stop(pb.END_REASON_ERROR, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the request stream broke; the handler is cancelled too
            log_event("session.read_failed", logging.DEBUG, error=repr(exc))
            self._request_stop(pb.END_REASON_CLOSED, "stream broken")

    def _acknowledge(self, seq: int) -> None:
        """The learner holds every batch up to ``seq``: release them (and their segments).

        Only segments of batches sent to this learner are freed: those of a learner whose
        session it ended may still be unread (that learner never acks them).
        """
        book = self._rt.book
        book.ack(seq)
        if self._segments is not None:
            self._segments.acked(book.epoch, seq, first=book.owner_first_seq)

    async def _collect(self) -> None:
        book = self._rt.book
        try:
            while True:
                if book.budget_reached():
                    self._request_stop(
                        pb.END_REASON_BUDGET_REACHED,
                        f"total_frames={self._settings.total_frames} produced",
                    )
                    return
                await self._wait(
                    self._wake_collector, lambda: self._stop is not None or book.can_start()
                )
                if self._stop is not None:
                    return
                book.start_batch()
                try:
                    encoded = await self._collect_next(book.next_seq)
                except BaseException:
                    book.abandon_batch()
                    if self._abandon.is_set():
                        log_event("session.batch_abandoned", logging.INFO, learner=self.learner_id)
                        return
                    raise
                batch = book.finish_batch(frames=encoded.frames, payload=encoded)
                if batch.seq != encoded.seq:  # the messages carry the seq: they must agree
                    raise SessionStateError(
                        f"batch encoded as seq {encoded.seq} was numbered {batch.seq}"
                    )
                self._outbox.append(batch)
                self._wake()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a policy's SystemExit on the collection
            # thread is no signal (the loop handles those): the session ends, the actor lives
            code, details = to_status(exc)
            log_event(
                "session.collect_failed",
                logging.ERROR,
                learner=self.learner_id,
                code=code.name,
                details=details,
                error=repr(exc),
                exc_info=code == grpc.StatusCode.INTERNAL,
            )
            if isinstance(exc, EnvError):
                self._env_failure = env_failure(
                    exc, full=self._rt.config.env_error_detail == "full"
                )
                details = str(_as_sent(self._env_failure))
            self._request_stop(pb.END_REASON_ERROR, f"collection failed: {details}")
        finally:  # however it ended, the writer is told (it waits for a stop or a batch)
            self._request_stop(pb.END_REASON_ERROR, "collection stopped")
            self._collector_done = True
            self._collector_idle.set()
            self._wake()

    async def _collect_next(self, seq: int) -> EncodedBatch:
        """Collect batch ``seq`` on the collection thread (into a segment if the session asks)."""
        return await self._rt.run_collect(
            _collect_numbered,
            self._rt,
            self._settings.model_id,
            seq,
            self._abandon,
            self._segments,
        )

    async def _write_loop(self, context: grpc.aio.ServicerContext) -> None:
        def ready() -> bool:
            return bool(self._outbox) or (
                self._stop is not None and (self._stop_now() or self._collector_done)
            )

        while True:
            await self._wait(self._wake_writer, ready)
            if not self._outbox or self._stop_now():
                return
            await self._send(context, self._outbox.popleft())

    async def _send(
        self, context: grpc.aio.ServicerContext, batch: RetainedBatch[EncodedBatch]
    ) -> None:
        for message in batch.payload.wire(self._segments is not None):
            await context.write(message)
        self._last_sent = batch.seq
        self._sent += 1
        if self._metrics is not None:
            self._metrics.batches_sent.inc()
        if self._is_current():
            self._rt.book.mark_sent(batch.seq)
        self._wake()

    # ------------------------------------------------------------ helpers

    def _is_current(self) -> bool:
        book = self._rt.book
        return self._session_id != 0 and book.session_id == self._session_id and book.active

    def _stop_now(self) -> bool:
        return self._failure is not None or (self._stop is not None and self._stop not in _FLUSHING)

    def _request_stop(self, reason: pb.EndReason, message: str) -> None:
        if self._stop is None:
            self._stop, self._stop_message = reason, message
        if self._stop not in _FLUSHING and not self._keep_batch:  # nothing more is sent
            self._abandon.set()  # the batch under way is given up at its next step
        self._wake()

    def _wake(self) -> None:
        self._wake_writer.set()
        self._wake_collector.set()

    @staticmethod
    async def _wait(event: asyncio.Event, predicate: Callable[[], bool]) -> None:
        while True:
            event.clear()
            if predicate():
                return
            await event.wait()
