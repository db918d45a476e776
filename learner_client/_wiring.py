"""How the learner's parts are wired, drawn once: user thread → mailbox ← loop thread.

::

    user thread                                  │ loop thread (LoopThread)
    GrpcCollector ── Rounds ──take──▶ Mailbox ◀──┼──put── ActorLink ──▶ CollectStream ──▶ actor
         │                  credits, acks ───────┼──▶ OpenStreams ──▶ CollectStream
         ├── Pusher ──push──▶ Fleet ── run() ────┼──▶ ActorChannel ──▶ actor
         │     ▲ admit (an actor comes back) ────┼─── ActorLink
         └── seed, state, start, resize ─▶ Fleet │
    LearnerMetrics ◀── lag (Ledger), push times (Pusher), waits (Rounds); stats() on scrape

The :class:`~learner_client._weights.WeightBook` (versions, what each actor holds) is shared
by Fleet, Pusher and Rounds, and only the Pusher records push results in it (the fleet's
links admit a returning actor through :meth:`~learner_client._pushes.Pusher.admit`); the
:class:`~learner_client._slabs.PacketSlabs` receive each link's sync batches in place (Fleet
gives every link its slot, Rounds sets the layout). :func:`assemble` builds every part once
and hands each one exactly what it uses; nothing reaches another part through a third.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar

from common.errors import ClosedError
from common.shm import sweep_segments
from learner_client._agreement import VersionAgreement
from learner_client._collect_stream import OpenStreams
from learner_client._deltas import DeltaTracker
from learner_client._fleet import Fleet
from learner_client._ledger import Ledger
from learner_client._loop_thread import LoopThread
from learner_client._mailbox import Mailbox
from learner_client._members import Ranks
from learner_client._metrics import LearnerMetrics
from learner_client._pushes import Pusher
from learner_client._ray_runtime import shut_down_ray_when_unused
from learner_client._relay import RelayRoute
from learner_client._rounds import LLM_COUNTS, Rounds
from learner_client._settings import BatchSettings, ConnectionSettings, WeightPushSettings
from learner_client._shm import ShmRoute
from learner_client._slabs import PacketSlabs
from learner_client._stripes import StripeRoute
from learner_client._waits import Flag, interrupts_held
from learner_client._weights import WeightBook

__all__ = ["Parts", "Teardown", "assemble", "weakly"]

T = TypeVar("T")


class Parts(NamedTuple):
    """The learner's parts, as :func:`assemble` wired them."""

    loop: LoopThread
    mailbox: Mailbox
    ledger: Ledger
    book: WeightBook
    fleet: Fleet
    pusher: Pusher
    rounds: Rounds
    metrics: LearnerMetrics

    def close(self, timeout: float) -> None:
        """Wake the consumer, end every session, stop the loop thread (bounded), stop /metrics."""
        self.mailbox.close()
        self.fleet.close(timeout)
        self.loop.close(timeout)
        self.metrics.close()
        self.book.close()  # the blobs and their shared-memory mappings


def weakly(method: Callable[..., T]) -> Callable[..., T]:
    """The bound ``method``, called without keeping its object alive.

    The parts' threads run until the collector closes them; handed the collector's methods
    weakly, they do not keep a collector the user dropped alive, so its :class:`Teardown`
    runs. A call once the object is gone raises :class:`~common.errors.ClosedError`.
    """
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> T:
        bound = ref()
        if bound is None:
            raise ClosedError("the collector was dropped")
        return bound(*args, **kwargs)

    return call


class _Closing(Protocol):
    def close(self) -> None: ...


class _Watching(Protocol):
    def stop(self) -> None: ...

    def close(self, timeout: float) -> None: ...


class _Thread(Protocol):
    def is_current(self) -> bool: ...

    def close(self) -> None: ...

    def join(self, timeout: float) -> None: ...


@dataclasses.dataclass
class Teardown:
    """What a collector closes, in order: by ``shutdown()``, or when the collector is dropped.

    A process forked from the one that built it (a ``DataLoader``'s worker, a ``fork``
    pool's, a child leaving a ``with`` block by ``sys.exit``) closes nothing: the sessions,
    the loop thread and the fleet are the parent's, which goes on collecting.

    Attributes:
        parts: The wired parts.
        membership: The ``dns:`` watcher.
        background: The replay-buffer thread.
        owner: The fleet given to the collector, stopped last (also when the rest fails).
        pid: The process that built it.
    """

    parts: Parts
    membership: _Watching
    background: _Thread
    owner: _Closing
    pid: int = dataclasses.field(default_factory=os.getpid)
    #: Set once the first :meth:`once` has closed everything (another caller waits on it).
    closed: Flag = dataclasses.field(default_factory=Flag)
    _closer: threading.Thread | None = None
    _claim: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def once(self, timeout: float, shutdown_ray: bool, dropped: weakref.finalize) -> None:
        """:meth:`uninterrupted` by the first caller; a later caller returns once it is done.

        A later caller's ``shutdown_ray`` still asks Ray to stop once unused, as RayCollector's
        ``shutdown(shutdown_ray=True)`` after its own shutdown at ``total_frames`` does.

        A ``shutdown()`` from a watchdog and another from the ``with`` exit both return with
        nothing left running. A thread the close waits for returns at once: the closing
        thread itself (a callback of the close), the background thread (its replay buffer's
        ``extend`` calling ``shutdown()``), which the close joins.
        """
        with self._claim:
            closer, first = self._closer, self._closer is None
            if first:
                self._closer = threading.current_thread()
        if not first:
            if closer is not threading.current_thread() and not self.background.is_current():
                self.closed.wait()  # each of the first caller's phases is bounded
            if shutdown_ray and os.getpid() == self.pid:  # asked later (after the loop's own)
                shut_down_ray_when_unused()
            return
        try:
            self.uninterrupted(timeout, shutdown_ray, dropped)
        finally:
            self.closed.set()

    def __call__(self, timeout: float, shutdown_ray: bool = False) -> None:
        """Close everything, each phase bounded by ``timeout``.

        Then remove the segments of actors killed meanwhile (a fleet's server SIGKILLed after
        its grace period, a Ray worker gone), and with ``shutdown_ray`` (RayCollector's) ask
        Ray to shut down once no fleet of this process uses it.
        """
        if os.getpid() != self.pid:  # a forked child: all of it is the parent's
            return
        try:
            self.membership.stop()  # its thread may wait on a joiner's Describe: cut off below
            self.background.close()
            self.parts.close(timeout)
            self.membership.close(timeout)
            self.background.join(timeout)
        finally:
            try:
                self.owner.close()
            finally:
                sweep_segments()
                if shutdown_ray:
                    shut_down_ray_when_unused()

    def uninterrupted(self, timeout: float, shutdown_ray: bool, dropped: weakref.finalize) -> None:
        """Close everything (``dropped``, :meth:`when_dropped`'s, detached), Ctrl-C deferred.

        A Ctrl-C is held while the close runs (each phase bounded by ``timeout``) and raised
        afterwards (:func:`learner_client._waits.interrupts_held`): an interrupted close would
        leave the loop thread and channels open with the collector closed. No thread is
        started, so this also runs while the interpreter exits.
        """
        with interrupts_held():
            dropped.detach()
            self(timeout, shutdown_ray)

    def when_dropped(self, collector: object, timeout: float) -> weakref.finalize:
        """Run when ``collector`` is collected, or at interpreter exit, unless detached.

        As TorchRL's collectors shut down in ``__del__``: a collector dropped without
        ``shutdown()`` (a failed trial of a sweep, a helper's) no longer holds its actors'
        sessions, its thread and its fleet.
        """
        return weakref.finalize(collector, _release, self, timeout)


def _release(teardown: Teardown, timeout: float) -> None:
    """Run ``teardown``; off the main thread, on a thread of its own.

    A collection may run on any thread, one that ``teardown`` joins among them.
    """
    if threading.current_thread() is threading.main_thread():
        teardown(timeout)
    else:
        threading.Thread(target=teardown, args=(timeout,), name="rlfleet-release").start()


def _push_settings(push: object) -> WeightPushSettings:
    """The collector's ``weight_push``: the defaults for None.

    Raises:
        TypeError: Anything but a :class:`WeightPushSettings` or None.
    """
    if push is None:
        return WeightPushSettings()
    if not isinstance(push, WeightPushSettings):
        raise TypeError(f"weight_push must be a WeightPushSettings or None, got {push!r:.80}")
    return push


def assemble(
    batch: BatchSettings,
    acting_model: str,
    conn: ConnectionSettings,
    stats: Callable[..., Mapping[str, Any]],
    push: WeightPushSettings | None = None,
    *,
    pin_memory: bool = False,
    ranks: Ranks | None = None,
) -> Parts:
    """Build the loop thread, the mailbox and every collaborator (the loop thread starts).

    Args:
        batch: How batches are assembled.
        acting_model: The model whose version the policy lag is measured against.
        conn: Channels, deadlines and credits.
        stats: ``GrpcCollector.stats``, which the learner's metrics read at every scrape.
            The metrics (served by ``serve_metrics``) are fed by the ledger (policy lag),
            the pusher (push times) and the rounds (user code's wait); closed with the parts.
        push: How weight pushes travel (checksum, full-push interval of deltas).
        pin_memory: Receive packets into page-locked memory (batches go on to a CUDA device).
        ranks: Which actors this learner rank owns (None: every one).
    """
    push = _push_settings(push)  # checked before a thread starts
    metrics = LearnerMetrics(stats)
    loop = LoopThread()
    ledger = Ledger(metrics.policy_lag, LLM_COUNTS if batch.llm is not None else ())
    shm = ShmRoute(push.shared_memory, batches=conn.shared_memory_batches)
    book = WeightBook(push.checksum, segments=shm)  # blobs for local actors: in segments
    streams = OpenStreams(loop)
    mailbox = _mailbox(batch, streams, book, acting_model)
    slabs = PacketSlabs(pin_memory)  # sync rounds stack without copies; batches reuse memory
    fleet = Fleet(
        conn,
        loop=loop,
        mailbox=mailbox,
        streams=streams,
        ledger=ledger,
        book=book,
        batch_timeout=batch.batch_timeout,
        slabs=slabs,
        ranks=ranks or Ranks(),
        shm=shm,
        relay=RelayRoute(push.relay, push.relay_stall_seconds),
        stripes=StripeRoute(push.streams),
    )
    agreement = VersionAgreement(fleet.ranks, conn.call_timeout)
    pusher = Pusher(fleet, book, ledger, metrics, DeltaTracker(book, push), agreement)
    fleet.admit = pusher.admit  # a returning actor gets what it lacks through the pusher
    rounds = Rounds(
        batch,
        acting_model,
        fleet=fleet,
        mailbox=mailbox,
        ledger=ledger,
        book=book,
        slabs=slabs,
        metrics=metrics,
    )
    return Parts(loop, mailbox, ledger, book, fleet, pusher, rounds, metrics)


def _mailbox(
    batch: BatchSettings, streams: OpenStreams, book: WeightBook, acting_model: str
) -> Mailbox:
    """The mailbox, with the version floor of on-demand sync rounds.

    Such a round counts a share only if acted with the weights its actor holds now, or
    should hold once it caught up with a push it missed: the acting model's version the
    book has for it (0 if none was pushed).
    """

    def floor(worker_id: int) -> int:
        return book.should_hold(worker_id, acting_model)

    return Mailbox(
        batch.window,
        streams.grant,
        streams.ack,
        lazy=batch.on_demand,
        version_floor=floor if batch.on_demand else None,
    )
