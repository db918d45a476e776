"""One actor's session loop on the learner: connect, admit, stream, and reconnect with backoff.

An :class:`ActorLink` runs as one task on the learner's event loop. Each
attempt re-describes the actor (a different worker_id at the address is
refused; a new epoch means the process restarted), has it *admitted* (the pusher
pushes the weights it should hold, before any of its data is used), opens a
``Collect`` session (resuming the last epoch and seq when the actor is the same
process, so retained batches are re-sent and duplicates dropped), then hands
every complete new batch to the :class:`~learner_client._mailbox.Mailbox`.
A transport or protocol failure (any :class:`~common.errors.RlfleetError`: a
broken or stalled stream, a malformed packet, an error status) is counted,
logged and retried after a jittered exponential backoff (bounded delay,
retried until the collector closes; a session that delivered a batch, or whose open
stream broke on the transport, starts the backoff over, one that broke the protocol does
not); the other actors are not affected. Any
other exception is a bug: the link stops (``FAILED``) and the user's next
take raises it. A session taken over by another learner is not retried. A
session the actor ends because its env raised is retried after the same
growing backoff; after ``ENV_FAILURE_ATTEMPTS`` in a row without a batch, the
link stops and the user's next take raises an
:class:`~common.errors.EnvError` naming the worker, the env and the env's
exception (as TorchRL raises the env's error).

What follows each session is one :class:`AfterSession` decision: ``STOP``,
``REOPEN`` at once, ``RETRY`` after the backoff, or ``CLOSE`` when the learner
is closing the link. The link takes its channel as a :class:`~learner_client._transport.Channel`,
so its unit tests drive it over a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from common.config import CollectSettings
from common.errors import (
    ActorBusyError,
    ActorUnavailableError,
    EnvError,
    ProtocolError,
    RlfleetError,
    SessionStateError,
    one_line,
)
from learner_client._collect_stream import CollectStream, EndEvent, OpenStreams, ShmBatchError
from learner_client._description import ActorDescription
from learner_client._errors import SettingsRefusedError
from learner_client._ledger import Ledger, SeqTracker
from learner_client._mailbox import Delivery, Mailbox
from learner_client._rounds import name_time_dim, tag_worker
from learner_client._settings import ConnectionSettings
from learner_client._shm import ShmRoute
from learner_client._transport import MAX_RECONNECT_BACKOFF_S, ActorChannel, Channel

__all__ = ["ENV_FAILURE_ATTEMPTS", "ActorLink", "AfterSession", "Backoff", "Link", "LinkState"]

log = logging.getLogger("learner_client")

#: Sessions in a row an actor's env may end (each retried after a growing backoff)
#: before the collector raises the env's error instead of retrying.
ENV_FAILURE_ATTEMPTS = 3
#: A waiting take claims an actor's arriving batch (``Mailbox.arriving``: its credit leaves
#: before the batch is read and decoded) only when that actor's last batch took at least
#: this long from its first chunk to its delivery. Below it, the claim's credit, sent apart
#: from the ack it would otherwise carry, costs the learner more than the actor waits.
CLAIM_AFTER_S = 0.001
# The characters of a failure kept for the errors that name a missing actor.
_FAILURE_CHARS = 300
# What a woken reconnection's Describe allows beyond the channel's backoff, to connect.
_CONNECT_S = 1.0
#: How long a session that read its ``end`` waits for the call's status before cancelling it.
_END_STATUS_S = 2.0


class LinkState(enum.Enum):
    """Where an actor link is in its life."""

    IDLE = "idle"  # described, no session yet
    CONNECTING = "connecting"
    STREAMING = "streaming"
    DOWN = "down"  # the last connection attempt failed; retrying
    LOST = "lost"  # taken over by another learner; not retried
    FAILED = "failed"  # stopped on a bug, which the user's next take raised
    CLOSED = "closed"


class AfterSession(enum.Enum):
    """What a link does once a session ended (cleanly or not)."""

    STOP = "stop"  # taken over, the env failed too often, or a bug: never again
    REOPEN = "reopen"  # the learner closed it to change the settings: reopen at once
    RETRY = "retry"  # the actor ended it or it broke: reconnect after the backoff
    CLOSE = "close"  # the learner is closing the link


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Jittered exponential backoff between reconnection attempts.

    Attributes:
        base: Delay of the first retry, in seconds (before jitter).
        cap: Largest delay, in seconds.
    """

    base: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """Delay before retry ``attempt`` (0-based): 50-100 % of ``base * 2**attempt``, capped."""
        return random.uniform(0.5, 1.0) * min(self.cap, self.base * 2 ** min(attempt, 30))


C = TypeVar("C", bound=Channel)

#: Called before each session opens, with the link and the actor's fresh description.
Admit = Callable[["ActorLink[C]", ActorDescription], Awaitable[None]]


class ActorLink(Generic[C]):
    """The learner's connection to one actor (create, start and stop it on the event loop).

    Args:
        description: What Describe reported at construction.
        channel: The channel the description came through (any :class:`Channel`); the link
            owns it from now on.
        conn: Channel settings, deadlines and the learner id.
        batch_timeout: Seconds a stream owing a batch may stay silent before it counts as stalled.
        mailbox: Where batches go; also tells whether credits are outstanding.
        streams: Where each open stream is registered, so credits and acks reach it.
        ledger: Failure and reconnection counters.
        admit: Called before each session opens (pushes the weights the actor lacks).
        allocate: Gives the buffer each batch is received into; None allocates fresh ones.
        backoff: The delays between reconnection attempts.
        shm: Which actors share this host: sessions with those ask for batches through
            shared memory (until one such batch fails to read). None: bytes only.
    """

    def __init__(
        self,
        description: ActorDescription,
        channel: C,
        conn: ConnectionSettings,
        *,
        batch_timeout: float,
        mailbox: Mailbox,
        streams: OpenStreams,
        ledger: Ledger,
        admit: Admit[C],
        allocate: Callable[[int], Any] | None = None,
        backoff: Backoff = Backoff(),
        shm: ShmRoute | None = None,
    ) -> None:
        self.address = description.address
        self.worker_id = description.worker_id
        self.description = description
        self.state = LinkState.IDLE
        self.tracker = SeqTracker()
        self.channel = channel
        self._conn = conn
        self._batch_timeout = batch_timeout
        self._mailbox = mailbox
        self._streams = streams
        self._ledger = ledger
        self._allocate = allocate
        self._shm = shm
        self._admit = admit
        self._backoff = backoff
        self._settings: CollectSettings | None = None
        self._frames_received = 0  # new frames this collector received from the actor
        self._random_from = 0  # _frames_received when the settings' random frames were set
        self._delivered = False  # the current session brought a new batch
        self._env_failures = 0  # sessions in a row that the actor's env ended
        self._stream: CollectStream | None = None
        self._task: asyncio.Task | None = None
        self._catching_up: asyncio.Task | None = None
        self._closing = False
        self._fresh_next = False
        self._arriving_since = 0.0  # when the batch being read sent its first chunk
        self._arrival_s = 0.0  # how long the last batch took from its first chunk to delivery
        self._streamed = False
        self._failed_streaming = False  # the last attempt broke after its stream opened
        self._wake = asyncio.Event()  # cuts a reconnection's backoff short (retry_now)
        self._woken = False  # the next Describe waits out the channel's own backoff
        #: The last failure of a session or connection attempt ("" before any), for errors.
        self.last_failure = ""

    # -------------------------------------------------------------- control

    def start(self, settings: CollectSettings) -> None:
        """Start the session loop with these settings."""
        self._settings, self._random_from = settings, self._frames_received
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"rlfleet-link-{self.worker_id}"
            )

    def restart(self, settings: CollectSettings) -> None:
        """End the current session cleanly and open a fresh one with new settings.

        Their ``init_random_frames`` count from now: the frames delivered so far are the
        caller's to subtract.
        """
        self._settings, self._random_from = settings, self._frames_received
        self._fresh_next = True
        if self._stream is not None:
            self._stream.close()

    def catch_up(self) -> None:
        """Re-admit the actor while its session goes on: a push to it failed transiently.

        An outage shorter than ``batch_timeout`` leaves the stream open, so no reconnection
        re-admits the actor; this does (loop thread): it re-describes the actor (the versions
        it holds, also a push it applied after the learner gave up on it) and re-sends what
        it lacks, retried with the backoff until it holds it or its session breaks (the
        reconnection then re-admits it). A sync round on demand does not count its shares
        acted with older weights meanwhile (the mailbox's version floor).
        """
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.get_running_loop().create_task(
                self._catch_up(), name=f"rlfleet-catch-up-{self.worker_id}"
            )

    async def _catch_up(self) -> None:
        attempt = 0
        while not self._closing and self.state in (LinkState.STREAMING, LinkState.CONNECTING):
            if self.state is LinkState.STREAMING:  # else a session opens: it admits the actor
                epoch = self.tracker.epoch or self.description.epoch
                try:
                    desc = await self.channel.describe(self._conn.call_timeout)
                    if desc.worker_id != self.worker_id or desc.epoch != epoch:
                        return  # another process: its session breaks, its reconnection admits it
                    await self._admit(self, desc)
                    return
                except RlfleetError as exc:
                    log.info("worker_id %d: catching up failed (%s); again", self.worker_id, exc)
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1

    def retry_now(self) -> bool:
        """Cut a down actor's reconnection backoff short: the next attempt starts now.

        A sync round calls it before failing on an actor known to be down, which may be back
        (restarted) while its link sleeps up to ``Backoff.cap``. That attempt's Describe
        waits for the channel to connect for up to gRPC's own reconnect backoff, which would
        otherwise fail it at once with the last refusal. Returns whether an attempt follows
        or is under way (a down link is connecting only while it attempts: an earlier round
        woke it); its outcome marks the actor alive or down.
        """
        if self._closing or self.state not in (LinkState.DOWN, LinkState.CONNECTING):
            return False
        if self.state is LinkState.DOWN:
            self._woken = True
            self._wake.set()
        return True

    async def stop(self, timeout: float) -> None:
        """Close an open session cleanly (``close`` → ``end``), cancelling it after ``timeout``.

        A link without an open session (connecting, or waiting to retry a dead
        actor) is cancelled at once.
        """
        self._closing = True
        streaming = self._stream is not None and self.state is LinkState.STREAMING
        if self._stream is not None:
            self._stream.close()
        if self._task is not None:
            done: set = set()
            if streaming:
                done, _ = await asyncio.wait({self._task}, timeout=timeout)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        if self._catching_up is not None:
            self._catching_up.cancel()
            await asyncio.gather(self._catching_up, return_exceptions=True)
        self.state = LinkState.CLOSED
        await self.channel.close()

    async def move(self, channel: C, description: ActorDescription) -> None:
        """Follow the actor to another address: a host that came back under a new one.

        The old channel is closed and, if the session loop runs, it is restarted at once
        on ``channel`` as a reconnection: the worker_id keeps its mailbox slot, ledger
        and seq tracker, so the actor is re-described (a new epoch counts a restart),
        admitted with the newest weights before its frames count, and resumed or started
        afresh exactly as after a restart at the same address.

        Args:
            channel: A channel to the actor's new address (the link owns it from now on).
            description: What Describe reported through ``channel`` (same worker_id).
        """
        old, self.channel = self.channel, channel
        log.warning(
            "worker_id %d moved from %s to %s", self.worker_id, self.address, description.address
        )
        self.address, self.description = description.address, description
        task = self._task
        if task is not None and not task.done() and not self._closing:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._task = asyncio.get_running_loop().create_task(
                self._run(reconnecting=True), name=f"rlfleet-link-{self.worker_id}"
            )
        await old.close()

    # ----------------------------------------------------------- the loop

    async def _run(self, *, reconnecting: bool = False) -> None:
        attempt = 0
        while not self._closing:
            self._streamed = self._delivered = False
            self._wake.clear()  # a wake during this attempt skips the backoff after it
            try:
                after = await self._attempt(reconnecting, attempt)
            finally:
                self._stream = None
                self._mailbox.session_closed(self.worker_id)
            if after is AfterSession.STOP:
                return
            if after is AfterSession.CLOSE:
                break
            reconnecting = True
            if after is AfterSession.REOPEN:
                continue
            # Backoff grows across attempts that brought no batch (a session opened only to
            # fail, e.g. on an env that raises, counts: no tight restart loop).
            attempt = 0 if self._delivered or self._failed_streaming else attempt
            if self.state is not LinkState.DOWN:
                self._set_state(LinkState.CONNECTING)
            delay = self._backoff.delay(attempt)
            attempt += 1
            log.info(
                "reconnecting to %s (worker_id %d) in %.2f s", self.address, self.worker_id, delay
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
        self._set_state(LinkState.CLOSED)

    async def _attempt(self, reconnecting: bool, attempt: int) -> AfterSession:
        """One session, from Describe to its end, and what follows it."""
        self._failed_streaming = False
        try:
            end = await self._session(reconnecting)
            if self._closing:
                return AfterSession.CLOSE
            return self._session_ended(end)
        except SettingsRefusedError as exc:  # asking again would ask the same
            log.error(
                "actor %s (worker_id %d) is no longer used: %s", self.address, self.worker_id, exc
            )
            self._set_state(LinkState.FAILED)
            self._mailbox.fail(self.worker_id, exc)
            return AfterSession.STOP
        except RlfleetError as exc:  # a transport or protocol failure: counted and retried
            if self._closing:
                return AfterSession.CLOSE
            if isinstance(exc, ShmBatchError) and self._shm is not None:
                self._shm.batch_failed(self.worker_id)  # the re-opened session takes bytes
            # A stream that opened before it broke starts a new outage; not one the actor
            # broke by sending what it may not (no tight reconnect loop with a bad peer).
            self._failed_streaming = self._streamed and not isinstance(exc, ProtocolError)
            if not self._streamed:  # a failed connection attempt (refused open: a busy actor)
                self._set_state(LinkState.DOWN)
            self._failed(exc, 0 if self._failed_streaming else attempt)
            return AfterSession.RETRY
        except Exception as exc:  # a bug: retrying would hide it
            self._stop_on_bug(exc)
            return AfterSession.STOP

    def _session_ended(self, end: EndEvent) -> AfterSession:
        """What follows a session the actor ended with ``end`` (an ``end`` marker)."""
        if end.reason == "TAKEN_OVER":
            log.error(
                "actor %s (worker_id %d) was taken over by another learner; "
                "it will not be used again",
                self.address,
                self.worker_id,
            )
            self._set_state(LinkState.LOST)
            return AfterSession.STOP
        reopen = self._fresh_next and end.reason == "CLOSED"
        if not reopen:
            ended = f"the actor ended the session: {end.reason} {end.message}"
            self.last_failure = one_line(ended)[:_FAILURE_CHARS]
            log.warning(
                "actor %s (worker_id %d) ended the session: %s %s",
                self.address,
                self.worker_id,
                end.reason,
                end.message,
            )
            self._ledger.failure(self.worker_id)
        if self._env_failed(end):
            return AfterSession.STOP
        return AfterSession.REOPEN if reopen else AfterSession.RETRY

    def _env_failed(self, end: EndEvent) -> bool:
        """Count a session the actor's env ended; stop the link after too many in a row.

        Returns:
            True if the link stopped: the user's next take raises an ``EnvError`` naming
            the worker, the env and the env's exception.
        """
        if end.env_error is None:
            return False
        self._env_failures += 1
        if self._env_failures < ENV_FAILURE_ATTEMPTS:
            return False
        error = end.env_error
        raised = EnvError(
            error.env,
            error.exception_type,
            error.exception_message,
            worker_id=self.worker_id,
            attempts=self._env_failures,
        )
        log.error(
            "actor %s: %s; the actor is no longer used by this collector", self.address, raised
        )
        self._set_state(LinkState.FAILED)
        self._mailbox.fail(self.worker_id, raised)
        return True

    def _failed(self, exc: RlfleetError, attempt: int) -> None:
        self._ledger.failure(self.worker_id)
        self.last_failure = one_line(f"{type(exc).__name__}: {exc}")[:_FAILURE_CHARS]
        # The first failure of an outage is news; the retries that follow are not.
        log.log(
            logging.WARNING if attempt == 0 else logging.INFO,
            "actor %s (worker_id %d) failed (%s: %s); retry %d",
            self.address,
            self.worker_id,
            type(exc).__name__,
            exc,
            attempt + 1,
        )

    async def _readmit(self) -> None:
        """Re-describe the actor (same worker_id, maybe a new epoch) and let the fleet admit it."""
        self._set_state(LinkState.CONNECTING)
        woken, self._woken = self._woken, False
        timeout = self._conn.call_timeout
        if woken:
            timeout = min(timeout, MAX_RECONNECT_BACKOFF_S + _CONNECT_S)
        try:
            desc = await self.channel.describe(timeout, wait_for_ready=woken)
            if desc.worker_id != self.worker_id:
                raise ActorUnavailableError(
                    f"{self.address} now reports worker_id {desc.worker_id}, "
                    f"expected {self.worker_id}"
                )
            # The epoch of its last session, or before any opened, the one it was described with.
            known = self.tracker.epoch or self.description.epoch
            if desc.epoch != known:
                # Its old process's trajectories in progress are lost (none without a session).
                held = self.description.num_envs if self.tracker.epoch else 0
                self._ledger.restarted(self.worker_id, held)
                log.warning(
                    "actor %s (worker_id %d) restarted: epoch %d -> %d",
                    self.address,
                    self.worker_id,
                    known,
                    desc.epoch,
                )
            self.description = desc
            self._check_not_held(desc)
            await self._admit(self, desc)
        except Exception:
            self._set_state(LinkState.DOWN)
            raise

    def _check_not_held(self, desc: ActorDescription) -> None:
        """Refuse, before any push, an actor whose session another learner holds.

        The actor refuses our pushes and our ``open`` alike (busy): its admission would
        send every weight blob only for the actor to drop it, at each retry.

        Raises:
            ActorBusyError: ``desc`` names another learner's session and we take none over.
        """
        if (
            desc.learner_id
            and desc.learner_id != self._conn.learner_id
            and not self._conn.take_over
        ):
            raise ActorBusyError.held(
                self.worker_id,
                desc.learner_id,
                "resumes only its own session",
                where=self.address,
            )

    def _open(self) -> CollectStream:
        settings = self._settings
        if settings is None:
            raise SessionStateError("ActorLink.start() was not called")
        # init_random_frames counts this collector's frames (the actor counts per
        # session): a session that replaces another asks only for the random frames left.
        left = max(0, settings.init_random_frames - (self._frames_received - self._random_from))
        if left != settings.init_random_frames:
            settings = dataclasses.replace(settings, init_random_frames=left)
        resume = (0, 0) if self._fresh_next else self.tracker.resume_point()
        if resume == (0, 0) and not self._fresh_next and self._left_open():
            # A restarted learner process under the same learner_id: the actor still
            # holds the session the old process left open, and lets only its owner resume
            # it. What that session retained is re-sent, dropped here as duplicates and acked.
            resume = (self.description.epoch, 0)
        self._fresh_next = False
        # A reconnect resumes our own session (the actor matches our learner_id, even
        # if it still thinks our old stream alive); another learner's session is ended
        # only when the operator asked for take_over. A busy actor is retried.
        stream = CollectStream(
            self.channel,
            settings,
            credits=self._mailbox.session_opened(self.worker_id),
            resume=resume,
            take_over=self._conn.take_over,
            learner_id=self._conn.learner_id,
            allocate=self._allocate,
            shm_batches=self._shm_batches(),
            num_envs=self.description.num_envs,
            worker_id=self.worker_id,
        )
        self._stream = stream
        # Before any await: no credit is lost. Its session opens on the admitted process.
        self._streams.attach(self.worker_id, stream, self.description.epoch)
        return stream

    def _shm_batches(self) -> Callable[[], None] | None:
        """What the session counts shared-memory batches with, if it asks for them."""
        shm = self._shm
        return shm.batch_read if shm is not None and shm.batches_from(self.worker_id) else None

    def _left_open(self) -> bool:
        """Whether the actor reports an active session under our learner_id."""
        return bool(self.description.learner_id) and (
            self.description.learner_id == self._conn.learner_id
        )

    async def _session(self, reconnecting: bool) -> EndEvent:
        await self._readmit()
        stream = self._open()
        try:
            info = await stream.opened(self._conn.call_timeout)
            if info.epoch != self.description.epoch:
                # It restarted after its admission: this process never got its weights.
                raise ActorUnavailableError(
                    f"{self.address} (worker_id {self.worker_id}) restarted after it was "
                    f"admitted (epoch {self.description.epoch} -> {info.epoch}); admitting "
                    "it again"
                )
            self.tracker.opened(info.epoch, info.next_seq, info.resumed)
            self._set_state(LinkState.STREAMING)
            self._streamed = True
            if reconnecting:
                self._ledger.reconnected(self.worker_id)
                log.info(
                    "actor %s (worker_id %d) re-admitted (epoch %d, resumed=%s)",
                    self.address,
                    self.worker_id,
                    info.epoch,
                    info.resumed,
                )
            while True:
                event = await stream.next_event(
                    self._batch_timeout, waiting=self._owed, on_start=self._batch_started
                )
                if isinstance(event, EndEvent):
                    stream.close()  # the actor answers its status once this side is closed
                    await stream.finished(_END_STATUS_S)  # the actor counts a clean end
                    return event
                self._deliver(event)
        finally:
            self._streams.detach(self.worker_id, stream)
            stream.cancel()

    def _batch_started(self, seq: int) -> bool:
        """A batch's first chunk arrived: a waiting take may claim it (see ``Mailbox.arriving``)."""
        self.tracker.chunk_started(seq)
        self._arriving_since = time.perf_counter()
        if seq <= self.tracker.last or self._fresh_next or self._arrival_s < CLAIM_AFTER_S:
            return False
        if not self._mailbox.arriving(self.worker_id):
            return False
        self._streams.send_now()  # the claim's credit, queued for the stream's writer
        return True

    def _owed(self) -> bool:
        slot = self._mailbox.snapshot().get(self.worker_id)
        return slot is not None and slot.outstanding > 0

    def _deliver(self, event: Delivery) -> None:
        self._arrival_s = time.perf_counter() - self._arriving_since
        if event.worker_id != self.worker_id:
            raise ProtocolError(
                f"{self.address}: batch claims worker_id {event.worker_id}, "
                f"expected {self.worker_id}"
            )
        if not self.tracker.accept(event.seq):
            self._mailbox.unclaim(self.worker_id)
            # Received before (what a session left open by an earlier learner process retained,
            # see _open): acknowledged, or an actor holding max_credits of them starts no batch.
            self._streams.ack(self.worker_id, event.epoch, event.seq)
            log.debug("dropping re-sent batch seq %d of worker_id %d", event.seq, self.worker_id)
            return
        if self._fresh_next:
            # Collected under settings that were just replaced (the fleet was resized).
            self._mailbox.unclaim(self.worker_id)
            self._ledger.add_discarded(1)
            return
        batch = tag_worker(name_time_dim(event.batch), self.worker_id)
        self._frames_received += event.frames  # checked against the batch's rows (BatchBounds)
        self._delivered, self._env_failures = True, 0
        fresh = self._mailbox.put(dataclasses.replace(event, batch=batch))
        if not fresh:  # collected before a reseed, or with weights its actor replaced
            self._ledger.add_discarded(1)

    def _stop_on_bug(self, exc: Exception) -> None:
        log.error(
            "the link to %s (worker_id %d) stopped on a bug; the actor is no longer used",
            self.address,
            self.worker_id,
            exc_info=exc,
        )
        exc.add_note(
            f"raised on the learner's event loop serving actor {self.address} "
            f"(worker_id {self.worker_id}), which is no longer used"
        )
        self._set_state(LinkState.FAILED)
        self._mailbox.fail(self.worker_id, exc)

    def _set_state(self, state: LinkState) -> None:
        if state is self.state:
            return
        self.state = state
        if state in (LinkState.DOWN, LinkState.LOST):
            self._mailbox.set_alive(self.worker_id, False)
        elif state is LinkState.STREAMING:
            self._mailbox.set_alive(self.worker_id, True)


#: A fleet's links, over real gRPC channels.
Link = ActorLink[ActorChannel]
