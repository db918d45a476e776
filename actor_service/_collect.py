"""One ``Collect`` stream: the reader, collector and writer of a learner session.

A :class:`CollectStream` runs three cooperating parts on the event loop:

* the **reader** applies the learner's ``credit``, ``ack`` and ``close``
  messages to the actor's :class:`~actor_service._session.SessionBook`;
* the **collector** starts a batch only while the book allows it (a credit
  is held, few enough batches wait to be sent, the budget is not reached),
  runs ``collect_batch`` and the tensor-frame encoding on the collection
  thread, and queues the numbered result;
* the **writer** (the RPC handler itself) sends ``opened``, then re-sent and
  new batches as chunks (never interleaved), then exactly one ``end``.

How a session ends decides what is still sent: BUDGET_REACHED, DRAINING and
ERROR first finish the in-flight batch and send every queued one; CLOSED and
TAKEN_OVER stop after the batch being written (what was not sent stays
retained for a resume). A broken stream (the learner cancelled or vanished)
writes nothing more; its in-flight batch is finished and retained, and the
actor accepts the next learner at once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import torch

from actor_service._convert import InvalidSettingsError
from actor_service._logging import log_event
from actor_service._session import RetainedBatch
from common.config import CollectSettings
from common.errors import RlfleetError, SessionStateError, to_status
from common.frames import EncodedFrame, encode_frame
from common.rlfleet.v1 import actor_service_pb2 as pb

if TYPE_CHECKING:
    from actor_service._runtime import ActorRuntime

__all__ = ["CollectStream", "EncodedBatch", "collect_encoded"]

# End reasons after which queued batches are still sent before `end`.
_FLUSHING = frozenset({pb.END_REASON_BUDGET_REACHED, pb.END_REASON_DRAINING, pb.END_REASON_ERROR})


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    """A collected batch, encoded and cut into chunk messages, ready to (re)send.

    The messages are built on the collection thread so that the event loop only
    stamps each with the batch's seq (and the first with its ``BatchInfo``) and
    writes it.

    Attributes:
        messages: One ``CollectResponse(chunk=...)`` per chunk, in order, with
            ``index``, ``count`` and ``data`` set; their data concatenate to the frame.
        frame_bytes: Length of the tensor frame.
        crc32: CRC-32 of the tensor frame.
        frames: Frames in the batch.
        model_id: The model that acted.
        policy_version_min: Lowest policy version among the frames.
        policy_version_max: Highest policy version among the frames.
    """

    messages: tuple[pb.CollectResponse, ...]
    frame_bytes: int
    crc32: int
    frames: int
    model_id: str
    policy_version_min: int
    policy_version_max: int


def collect_encoded(worker: Any, model_id: str) -> EncodedBatch:
    """Collect one batch and encode it; runs on the collection thread."""
    td = worker.collect_batch()
    frame = encode_frame(td)
    versions = [td.get(key) for key in ("policy_version", ("next", "policy_version"))
                if key in td.keys(include_nested=True)]
    if versions:
        flat = torch.cat([v.reshape(-1) for v in versions])
        low, high = int(flat.min()), int(flat.max())
    else:
        low = high = int(worker.models.policy_version(model_id))
    messages, crc32 = _chunk_messages(frame)
    return EncodedBatch(
        messages=messages,
        frame_bytes=frame.nbytes,
        crc32=crc32,
        frames=int(td.numel()),
        model_id=model_id,
        policy_version_min=low,
        policy_version_max=high,
    )


def _chunk_messages(frame: EncodedFrame) -> tuple[tuple[pb.CollectResponse, ...], int]:
    """The frame's chunk messages (seq and info unset) and its CRC-32, in one pass."""
    pieces, crc32 = frame.checksummed_chunks()
    count = len(pieces)
    messages: list[pb.CollectResponse] = []
    pieces.reverse()
    while pieces:  # pop as we go: each piece is freed once its message holds a copy
        # Set field by field: CollectResponse(chunk=...) would copy the data once more.
        message = pb.CollectResponse()
        message.chunk.index, message.chunk.count = len(messages), count
        message.chunk.data = pieces.pop()
        messages.append(message)
    return tuple(messages), crc32


class CollectStream:
    """A learner session on one ``Collect`` call.

    Args:
        runtime: The actor's serving state.
        request: The ``open`` message.
        settings: Its collection settings, already converted.
        peer: The learner's address, for logs.
    """

    def __init__(
        self, runtime: ActorRuntime, request: pb.OpenSession, settings: CollectSettings, peer: str
    ) -> None:
        self._rt = runtime
        self._open = request
        self._settings = settings
        self.learner_id = request.learner_id or peer
        self._peer = peer
        self.active = False
        self._session_id = 0
        self._outbox: collections.deque[RetainedBatch[EncodedBatch]] = collections.deque()
        self._stop: int | None = None
        self._stop_message = ""
        self._failure: BaseException | None = None
        self._collector_done = True
        self._collector_idle = asyncio.Event()
        self._collector_idle.set()
        self._finished = asyncio.Event()
        self._wake_writer = asyncio.Event()
        self._wake_collector = asyncio.Event()
        self._last_sent = 0
        self._sent = 0
        self._collector: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ control

    def take_over(self) -> None:
        """End this session with TAKEN_OVER after the batch being written."""
        self._request_stop(pb.END_REASON_TAKEN_OVER, "another learner took the session over")

    def drain(self) -> None:
        """End this session with DRAINING once the in-flight and queued batches are sent."""
        self._request_stop(pb.END_REASON_DRAINING, "the actor is shutting down")

    async def wait_collector_idle(self) -> None:
        """Wait until no batch of this session is being collected."""
        await self._collector_idle.wait()

    async def wait_finished(self) -> None:
        """Wait until the handler of this session returned."""
        await self._finished.wait()

    # ---------------------------------------------------------------- run

    async def run(self, requests: AsyncIterator[pb.CollectRequest],
                  context: grpc.aio.ServicerContext) -> None:
        """Serve the session until it ends; raises an ``RlfleetError`` for a non-OK status."""
        try:
            await self._rt.acquire(self, take_over=self._open.take_over,
                                   learner_id=self.learner_id)
        except BaseException:
            self._finished.set()
            raise
        reader: asyncio.Task[None] | None = None
        try:
            opened = await self._start()
            if self._session_id:  # else taken over or drained while configuring: just end
                reader = asyncio.create_task(self._read(requests))
                self._collector_done = False
                self._collector_idle.clear()
                # Not cancelled when the stream ends: it finishes its in-flight batch first.
                self._collector = asyncio.create_task(self._collect())
            await context.write(pb.CollectResponse(opened=opened))
            await self._write_loop(context)
            if self._failure is not None:
                raise self._failure
            end = pb.StreamEnd(reason=self._stop or pb.END_REASON_CLOSED,
                               message=self._stop_message, last_seq=self._last_sent)
            await context.write(pb.CollectResponse(end=end))
            log_event("session.ended", logging.INFO, learner=self.learner_id,
                      reason=pb.EndReason.Name(end.reason), last_seq=end.last_seq,
                      batches=self._sent)
        finally:
            self._request_stop(pb.END_REASON_CLOSED, "stream broken")
            self.active = False
            if reader is not None:
                reader.cancel()
            if self._is_current():
                self._rt.book.close()
            self._finished.set()

    async def _start(self) -> pb.SessionOpened:
        book, request = self._rt.book, self._open
        try:
            await self._rt.run_collect(self._rt.worker.configure, self._settings)
        except RlfleetError:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidSettingsError(f"invalid collect settings: {exc}") from None
        if self._stop is not None:
            return pb.SessionOpened(worker_id=self._rt.config.worker_id, epoch=book.epoch,
                                    next_seq=book.next_seq, max_credits=book.max_credits)
        opened = book.open(credits=request.credits, resume_epoch=request.resume_epoch,
                           resume_after_seq=request.resume_after_seq,
                           total_frames=self._settings.total_frames, take_over=True)
        self._session_id = opened.session_id
        self._outbox.extend(opened.resend)
        log_event("session.opened", logging.INFO, learner=self.learner_id, peer=self._peer,
                  credits=opened.credits, resumed=opened.resumed, resend=len(opened.resend),
                  next_seq=opened.next_seq, frames_per_batch=self._settings.frames_per_batch,
                  model_id=self._settings.model_id)
        return pb.SessionOpened(worker_id=self._rt.config.worker_id, epoch=book.epoch,
                                next_seq=opened.next_seq, max_credits=book.max_credits,
                                resumed=opened.resumed)

    # ------------------------------------------------------------- parts

    async def _read(self, requests: AsyncIterator[pb.CollectRequest]) -> None:
        try:
            async for request in requests:
                kind = request.WhichOneof("kind")
                if not self._is_current() or self._stop is not None:
                    continue  # ended or taken over: the learner's late messages change nothing
                if kind == "credit":
                    self._rt.book.grant(request.credit.batches)
                elif kind == "ack":
                    self._rt.book.ack(request.ack.seq)
                elif kind == "close":
                    self._request_stop(pb.END_REASON_CLOSED, "the learner closed the session")
                    return
                else:
                    raise SessionStateError(
                        f"{kind or 'an empty message'} after open: only credit, ack and close "
                        "may follow"
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

    async def _collect(self) -> None:
        book = self._rt.book
        try:
            while True:
                if book.budget_reached():
                    self._request_stop(pb.END_REASON_BUDGET_REACHED,
                                       f"total_frames={self._settings.total_frames} produced")
                    return
                await self._wait(self._wake_collector,
                                 lambda: self._stop is not None or book.can_start())
                if self._stop is not None:
                    return
                book.start_batch()
                try:
                    encoded = await self._rt.run_collect(
                        collect_encoded, self._rt.worker, self._settings.model_id)
                except BaseException:
                    book.abandon_batch()
                    raise
                self._outbox.append(book.finish_batch(frames=encoded.frames, payload=encoded))
                self._wake()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, details = to_status(exc)
            log_event("session.collect_failed", logging.ERROR, learner=self.learner_id,
                      code=code.name, details=details, error=repr(exc),
                      exc_info=code == grpc.StatusCode.INTERNAL)
            self._request_stop(pb.END_REASON_ERROR, f"collection failed: {details}")
        finally:
            self._collector_done = True
            self._collector_idle.set()
            self._wake()

    async def _write_loop(self, context: grpc.aio.ServicerContext) -> None:
        def ready() -> bool:
            return bool(self._outbox) or (
                self._stop is not None and (self._stop_now() or self._collector_done))

        while True:
            await self._wait(self._wake_writer, ready)
            if not self._outbox or self._stop_now():
                return
            await self._send(context, self._outbox.popleft())

    async def _send(self, context: grpc.aio.ServicerContext,
                    batch: RetainedBatch[EncodedBatch]) -> None:
        enc = batch.payload
        info = pb.BatchInfo(
            worker_id=self._rt.config.worker_id, epoch=self._rt.book.epoch, seq=batch.seq,
            frames=enc.frames, frame_bytes=enc.frame_bytes, crc32=enc.crc32,
            model_id=enc.model_id, policy_version_min=enc.policy_version_min,
            policy_version_max=enc.policy_version_max,
        )
        for message in enc.messages:
            # Stamped here, not on the collection thread: the seq is assigned when the
            # batch is finished, and a retained batch is re-sent with the same seq.
            message.chunk.seq = batch.seq
            if message.chunk.index == 0:
                message.chunk.info.CopyFrom(info)
            await context.write(message)
        self._last_sent = batch.seq
        self._sent += 1
        if self._is_current():
            self._rt.book.mark_sent(batch.seq)
        self._wake()

    # ------------------------------------------------------------ helpers

    def _is_current(self) -> bool:
        book = self._rt.book
        return self._session_id != 0 and book.session_id == self._session_id and book.active

    def _stop_now(self) -> bool:
        return self._failure is not None or (
            self._stop is not None and self._stop not in _FLUSHING)

    def _request_stop(self, reason: int, message: str) -> None:
        if self._stop is None:
            self._stop, self._stop_message = reason, message
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
