"""Bounded per-actor buffers between the transport thread and the user, with credit flow control.

Each actor has a slot: complete batches waiting for the user, and credits
granted but not yet used. The invariant ``outstanding + buffered <= window``
(``window = min(prefetch or 1, actor max_credits)``) bounds memory: a credit
is granted only when a batch is taken, so a slow learner pauses the actors.

Credits are also withheld while paused and beyond the frame budget (but for the spare
batch an idle actor is asked for while an async take waits on slower ones for the budget's
last batches, :meth:`Mailbox._spare_credits`), and in
*lazy* mode (sync collection without prefetch, TorchRL's default, or with
automatic weight updates) each actor gets exactly one credit per requested
round, after any weight push the user or the collector made before asking, so
every frame of the round runs the newest weights.

A batch is *taken* when a take gets it, or as it starts arriving if a take is already
waiting with nothing buffered (:meth:`Mailbox.arriving`): that take *claims* it, and its
actor's next credit leaves at once, while the batch is still being read and decoded, as
TorchRL's ``MultiaSyncCollector`` tells a worker to go on as it dequeues its batch. A
claimed batch counts as taken until it lands, then is the first handed out. A batch that
lands ready meanwhile is not held back for it; then, or should the claiming take give up
(timed out, paused, failed), the claimed batch waits buffered beside the credit it freed: one
batch over the window, until it is taken (no new claim is made while it waits).

The transport thread calls :meth:`Mailbox.session_opened`, :meth:`arriving`,
:meth:`put`, :meth:`unclaim`, :meth:`session_closed`, :meth:`set_alive` and
:meth:`fail` (a bug on the loop, raised by the user's next take); the user thread calls
:meth:`take_any` / :meth:`take_round`. Credits and acks leave through the
``send_credit`` / ``send_ack`` callbacks, which must be thread-safe and must
not block.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable

from tensordict import TensorDictBase

from common.errors import ClosedError

__all__ = ["Delivery", "Mailbox", "MailboxStats", "Paused"]

# Waits re-check their condition at least this often (a missed notify costs no more).
_POLL_SECONDS = 0.5
# The least an async take waits on the actors holding the budget's last credits before an
# idle actor is asked for a spare batch (see Mailbox._spare_credits).
_SPARE_AFTER_S = 1.0


class Paused(Exception):
    """Raised by a take while the mailbox is paused: nothing is handed out until it resumes."""


class Resplit(Exception):
    """Raised by a round begun before the fleet was resplit: its caller starts it over."""


@dataclasses.dataclass
class Delivery:
    """One complete, decoded batch from one actor.

    Attributes:
        worker_id: The actor that produced it.
        epoch: The actor epoch.
        seq: Its seq in the epoch.
        batch: The decoded TensorDict, tagged with its worker_id.
        frames: Frames it holds.
        version_min: Lowest policy version among its frames.
        version_max: Highest policy version among its frames.
    """

    worker_id: int
    epoch: int
    seq: int
    batch: TensorDictBase
    frames: int
    version_min: int = 0
    version_max: int = 0
    arrival: int = 0


@dataclasses.dataclass(frozen=True)
class MailboxStats:
    """One actor's slot in the mailbox at one moment (see :meth:`Mailbox.snapshot`).

    Attributes:
        buffered: Complete batches waiting for the user.
        outstanding: Credits granted to the open session and not yet used.
        open: Whether a session is open.
        alive: Whether the actor counts as reachable.
    """

    buffered: int
    outstanding: int
    open: bool
    alive: bool


@dataclasses.dataclass
class _Slot:
    window: int
    buffered: collections.deque[Delivery] = dataclasses.field(default_factory=collections.deque)
    outstanding: int = 0
    open: bool = False
    alive: bool = True
    # A strict round already failed for this actor being down: the next waits for its return.
    reported_down: bool = False
    # A round woke this down actor's reconnection: it waits for that attempt's outcome.
    retrying: bool = False
    # (epoch, seq): batches of that epoch with a lower seq predate a reseed and are dropped.
    floor: tuple[int, int] = (0, 0)
    # The arrival number of the batch a waiting take claimed while it is read (see arriving).
    claimed: int | None = None
    # When the batch under way was asked for (None: no credit outstanding), and how long,
    # in seconds, the last batch took from its credit to its arrival.
    asked_at: float | None = None
    batch_s: float | None = None


class Mailbox:
    """Per-actor batch buffers plus the credit rules.

    Args:
        window: Most batches per actor in flight or buffered.
        send_credit: ``(worker_id, batches)``; grants credits on that actor's stream.
        send_ack: ``(worker_id, epoch, seq)``; acknowledges delivered batches.
        lazy: Grant one credit per requested round only (see the module docstring).
        version_floor: ``worker_id -> version``: a batch with frames acted by an older
            policy version than its actor holds now is dropped (sync rounds on demand:
            see :meth:`discard_older`). Read at every put, so a version the actor got
            while the round was waiting (a returning actor's catch-up) counts at once.
    """

    def __init__(
        self,
        window: int,
        send_credit: Callable[[int, int], None],
        send_ack: Callable[[int, int, int], None],
        *,
        lazy: bool = False,
        version_floor: Callable[[int], int] | None = None,
    ) -> None:
        self._window = window
        self._version_floor = version_floor
        self._send_credit = send_credit
        self._send_ack = send_ack
        self._lazy = lazy
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._slots: dict[int, _Slot] = {}
        self._arrivals = itertools.count()
        self._paused = False
        self._closed = False
        self._round_wanted = False
        self._budget: int | None = None
        self._per_worker_budget = False
        self._failures: collections.deque[BaseException] = collections.deque()
        self._waiting_takes = 0
        self._claimed_by: int | None = None  # the worker whose arriving batch is claimed
        self._splits = 0  # how often the fleet was resplit (drop_buffered)

    # ------------------------------------------------------------ membership

    def add_worker(self, worker_id: int, max_credits: int) -> None:
        """Give an actor a slot; its window is ``min(window, max_credits)``."""
        with self._cond:
            self._slots.setdefault(worker_id, _Slot(window=max(1, min(self._window, max_credits))))

    @property
    def splits(self) -> int:
        """How often the fleet was resplit (:meth:`drop_buffered`); a round reads it first."""
        return self._splits

    def drop_buffered(self, worker_ids: Iterable[int]) -> int:
        """Discard the batches buffered for these workers (the fleet was resplit); how many.

        A round waiting meanwhile was begun under the old split: it raises :class:`Resplit`.
        """
        with self._cond:
            dropped = 0
            for wid in worker_ids:
                dropped += len(self._slots[wid].buffered)
                self._slots[wid].buffered.clear()
            self._splits += 1
            self._flush()
            self._cond.notify_all()
            return dropped

    # ------------------------------------------------------- transport side

    def session_opened(self, worker_id: int) -> int:
        """A session is about to open: returns the initial credits for its ``open``."""
        with self._cond:
            slot = self._slots[worker_id]
            # Not reported_down: an open the actor refuses (busy) leaves it down as reported;
            # it is back once it streams (set_alive).
            slot.open, slot.alive, slot.outstanding = True, True, 0
            credits = self._grant_for(worker_id, slot, self._async_room())
            slot.outstanding = credits
            slot.asked_at = time.monotonic() if credits else None
            self._cond.notify_all()
            return credits

    def session_closed(self, worker_id: int) -> None:
        """The session ended or broke: its unused credits are gone."""
        with self._cond:
            slot = self._slots[worker_id]
            slot.open, slot.outstanding, slot.asked_at = False, 0, None
            self._drop_claim(slot)
            self._flush()
            self._cond.notify_all()

    def set_alive(self, worker_id: int, alive: bool) -> None:
        """Mark an actor reachable or down (down actors fail sync rounds fast)."""
        with self._cond:
            slot = self._slots[worker_id]
            slot.alive, slot.retrying = alive, False
            slot.reported_down = slot.reported_down and not alive
            self._cond.notify_all()

    def set_retrying(self, worker_ids: Iterable[int], retrying: bool) -> None:
        """Mark down actors whose reconnection a round woke (:meth:`take_round` waits for them).

        The mark lasts until the attempt's outcome (:meth:`set_alive`, :meth:`fail`).
        """
        with self._cond:
            for w in worker_ids:
                self._slots[w].retrying = retrying
            self._cond.notify_all()

    def fail(self, worker_id: int, exc: BaseException) -> None:
        """An actor's link stopped on a bug: the actor is down and the next take raises ``exc``."""
        with self._cond:
            self._slots[worker_id].alive = self._slots[worker_id].retrying = False
            self._failures.append(exc)
            self._cond.notify_all()

    def arriving(self, worker_id: int) -> bool:
        """A new batch of ``worker_id`` started arriving; a waiting take claims it if it can.

        A take (:meth:`take_any`) waiting with nothing buffered claims the batch: the
        credit it used is freed, the actor's next credit is granted now, and once
        :meth:`put` (or gone, :meth:`unclaim`) the batch is the first handed out. Lazy
        mode and sync rounds never claim: their credits follow the rounds asked for.

        Returns:
            Whether the batch was claimed (its reader lets the credit leave before decoding).
        """
        with self._cond:
            slot = self._slots[worker_id]
            if self._lazy or self._paused or not self._waiting_takes:
                return False
            if self._claimed_by is not None or not (slot.open and slot.outstanding):
                return False
            if any(s.buffered for s in self._slots.values()):
                return False
            slot.outstanding -= 1
            _landed(slot)
            slot.claimed = next(self._arrivals)
            self._claimed_by = worker_id
            self._flush()
            return True

    def unclaim(self, worker_id: int) -> None:
        """The batch ``worker_id`` started sending will not be put (a duplicate, dropped)."""
        with self._cond:
            self._drop_claim(self._slots[worker_id])

    def _drop_claim(self, slot: _Slot) -> int | None:
        """Release ``slot``'s claim; returns the claimed batch's arrival number, if any."""
        claimed, slot.claimed = slot.claimed, None
        if claimed is not None:
            self._claimed_by = None
            self._cond.notify_all()
        return claimed

    def put(self, delivery: Delivery) -> bool:
        """Buffer a complete new batch; it used one credit.

        Returns:
            False if the batch was dropped: it predates a reseed (see :meth:`discard_before`)
            or acts with older weights than its actor holds (see :meth:`discard_older`).
        """
        with self._cond:
            slot = self._slots[delivery.worker_id]
            claimed = self._drop_claim(slot)
            if claimed is None:  # a claimed batch's credit was freed when it was claimed
                slot.outstanding = max(0, slot.outstanding - 1)
                _landed(slot)
            if self._stale(delivery, slot):
                self._send_ack(delivery.worker_id, delivery.epoch, delivery.seq)
                self._flush()
                return False
            delivery.arrival = next(self._arrivals) if claimed is None else claimed
            slot.buffered.append(delivery)
            self._cond.notify_all()
            return True

    def discard_before(self, worker_id: int, epoch: int, seq: int) -> int:
        """Drop the batches an actor collected before it was reseeded.

        Batches of ``epoch`` with a seq below ``seq`` (the actor's first seq after the
        seeding) are dropped, those buffered now and those still arriving; their
        credits are granted again.

        Returns:
            How many buffered batches were dropped.
        """
        with self._cond:
            slot = self._slots[worker_id]
            slot.floor = (epoch, seq)
            return self._drop_stale(worker_id, slot)

    def discard_older(self, worker_ids: Iterable[int]) -> int:
        """Drop those actors' batches with frames acted by an older version than they hold.

        A sync round abandoned for a missing actor leaves the other actors' shares
        buffered; after a weight push they no longer act with the weights the next
        round promises. They are dropped (those still arriving at :meth:`put`, against
        ``version_floor``) and their credits are granted again.

        Returns:
            How many buffered batches were dropped.
        """
        with self._cond:
            return sum(self._drop_stale(w, self._slots[w]) for w in worker_ids)

    def _drop_stale(self, worker_id: int, slot: _Slot) -> int:
        stale = [d for d in slot.buffered if self._stale(d, slot)]
        if stale:
            slot.buffered = collections.deque(d for d in slot.buffered if not self._stale(d, slot))
            for epoch in {d.epoch for d in stale}:  # an actor that restarted: two epochs
                self._send_ack(worker_id, epoch, max(d.seq for d in stale if d.epoch == epoch))
        self._flush()
        return len(stale)

    def _stale(self, delivery: Delivery, slot: _Slot) -> bool:
        """Collected before its actor was reseeded, or with weights older than it holds."""
        if delivery.epoch == slot.floor[0] and delivery.seq < slot.floor[1]:
            return True
        floor = self._version_floor
        return floor is not None and delivery.version_min < floor(delivery.worker_id)

    # ------------------------------------------------------------- control

    def set_budget(self, batches: int | None, *, per_worker: bool) -> None:
        """Batches still wanted (None: endless), in total or per worker (sync rounds)."""
        with self._cond:
            self._budget, self._per_worker_budget = batches, per_worker
            self._flush()

    def set_paused(self, paused: bool) -> None:
        """Withhold (True) or resume (False) credits; takes raise :class:`Paused` meanwhile."""
        with self._cond:
            self._paused = paused
            self._flush()
            self._cond.notify_all()

    def want_round(self) -> None:
        """Lazy mode: release one credit to every actor that has nothing buffered or in flight."""
        with self._cond:
            self._round_wanted = True
            self._flush()

    def close(self) -> None:
        """Wake every waiter; later takes raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> list[int]:
        """Wait until no open session holds unused credits; returns the workers still busy."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                busy = [w for w, s in self._slots.items() if s.open and s.outstanding]
                remaining = deadline - time.monotonic()
                if not busy or remaining <= 0 or self._closed:
                    return busy
                self._wait(min(remaining, _POLL_SECONDS))

    def snapshot(self) -> dict[int, MailboxStats]:
        """Each actor's :class:`MailboxStats` by worker_id, for stats and tests."""
        with self._cond:
            return {
                w: MailboxStats(len(s.buffered), s.outstanding, s.open, s.alive)
                for w, s in self._slots.items()
            }

    # ---------------------------------------------------------- user side

    def take_any(self, timeout: float) -> Delivery | None:
        """The batch that arrived first across all actors, or None after ``timeout``.

        A batch buffered while a claimed one (:meth:`arriving`) is still on its way is
        handed out at once: a slow claimed batch never holds up the others. A claimed batch
        that lands after this take timed out is buffered for the next one. While it waits,
        idle actors may be asked for a spare batch past the budget (:meth:`_spare_credits`).
        """
        started = time.monotonic()
        deadline = started + timeout
        with self._cond:
            while True:
                self._check_open()
                heads = [s.buffered[0] for s in self._slots.values() if s.buffered]
                if heads:
                    first = min(heads, key=lambda d: d.arrival)
                    self._slots[first.worker_id].buffered.popleft()
                    self._delivered([first])
                    return first
                now = time.monotonic()
                if now >= deadline:
                    return None
                spare_in = self._spare_credits(now - started)
                self._waiting_takes += 1
                try:
                    self._wait(min(deadline - now, _POLL_SECONDS, spare_in))
                finally:
                    self._waiting_takes -= 1

    def take_round(
        self, worker_ids: list[int], timeout: float, *, partial: bool, split: int | None = None
    ) -> tuple[list[Delivery], list[int]]:
        """One batch from each of ``worker_ids``, waiting at most ``timeout``.

        Strict (``partial=False``): returns ``([], missing)`` as soon as a
        missing actor is down, or at the deadline; nothing is taken then. An actor
        a strict round already gave up on is waited for (until the deadline) while it
        stays down, so a caller retrying at once does not spin.
        Partial: returns what is ready once every missing actor is down or at
        the deadline, and the missing ids.
        Either way a down actor whose reconnection attempt was woken (:meth:`set_retrying`)
        counts as down only once that attempt failed.

        Raises:
            Resplit: The fleet was resplit since ``split`` (:attr:`splits` as the caller read
                ``worker_ids``): nothing is taken, the shares of the new split are the next
                round's, over the grown fleet.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_open()
                if split is not None and split != self._splits:
                    raise Resplit(f"the fleet was resplit ({self._splits - split} time(s))")
                missing = [w for w in worker_ids if not self._slots[w].buffered]
                down = [w for w in missing if not (self._slots[w].alive or self._slots[w].retrying)]
                remaining = deadline - time.monotonic()
                if not missing or remaining <= 0:
                    break
                if not partial and any(not self._slots[w].reported_down for w in down):
                    break
                if partial and len(down) == len(missing) and len(missing) < len(worker_ids):
                    break
                self._wait(min(remaining, _POLL_SECONDS))
            if missing and not partial:
                for w in missing:  # also one whose woken attempt outlived the round
                    slot = self._slots[w]
                    slot.reported_down = slot.reported_down or not slot.alive
                return [], missing
            taken = [self._slots[w].buffered.popleft() for w in worker_ids if w not in missing]
            self._round_wanted = False
            self._delivered(taken)
            return taken, missing

    def down(self, worker_ids: Iterable[int]) -> list[int]:
        """Those of ``worker_ids`` whose actors are down now."""
        with self._cond:
            return [w for w in worker_ids if not self._slots[w].alive]

    # ------------------------------------------------------------ internals

    def _wait(self, timeout: float) -> None:
        """``self._cond.wait(timeout)``, the lock held again whatever the wait raised.

        CPython's ``Condition.wait`` releases the lock a step before the ``try`` whose
        ``finally`` takes it back: a signal handler raising in that step (Ctrl-C's
        KeyboardInterrupt, the apps' SIGTERM) left it released, and the caller's ``with``
        then raised ``RuntimeError: cannot release un-acquired lock`` over the interrupt.
        """
        try:
            self._cond.wait(timeout)
        except BaseException:
            # RLock's own ownership check (what Condition uses); typeshed leaves it out.
            if not self._lock._is_owned():  # type: ignore[attr-defined]
                self._lock.acquire()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the collector is shut down")
        if self._failures:
            raise self._failures.popleft()
        if self._paused:
            raise Paused

    def _delivered(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self._send_ack(delivery.worker_id, delivery.epoch, delivery.seq)
        if self._budget is not None:
            # One batch (async) or one round (sync) fewer is wanted; the
            # collector re-sets the exact budget right after.
            used = 1 if self._per_worker_budget else len(deliveries)
            self._budget = max(0, self._budget - used)
        self._flush()

    def _async_room(self) -> int | None:
        if self._budget is None or self._per_worker_budget:
            return None
        used = sum(
            s.outstanding + len(s.buffered) + (s.claimed is not None) for s in self._slots.values()
        )
        return max(0, self._budget - used)

    def _grant_for(self, worker_id: int, slot: _Slot, room: int | None) -> int:
        if not slot.open or self._paused:
            return 0
        target = (1 if self._round_wanted else 0) if self._lazy else slot.window
        if self._budget is not None and self._per_worker_budget:
            target = min(target, self._budget)
        grant = max(0, target - slot.outstanding - len(slot.buffered))
        return grant if room is None else min(grant, room)

    def _spare_credits(self, waited: float) -> float:
        """Ask idle actors for a batch past the frame budget while an async take waits.

        The budget's last batches are credited to the actors that asked first; a slow one
        among them held the end of a finite run (every batch it owed) while faster actors
        idled. An actor with nothing outstanding, buffered or claimed gets one credit once
        the take has waited :data:`_SPARE_AFTER_S`, or twice its last batch's time if that
        is longer: whichever batch lands first is taken, the other is one past the budget,
        as TorchRL's ``MultiAsyncCollector`` keeps every worker collecting to the end. The
        window still holds (only an actor holding nothing gets one).

        Returns:
            Seconds until the next idle actor's turn (``inf``: none).
        """
        budget = self._budget
        if budget is None or budget <= 0 or self._per_worker_budget or self._lazy or self._paused:
            return math.inf
        next_in = math.inf
        for wid, slot in self._slots.items():
            idle = not (slot.outstanding or slot.buffered or slot.claimed is not None)
            if not (slot.open and idle and slot.batch_s is not None):
                continue
            due = max(_SPARE_AFTER_S, 2 * slot.batch_s) - waited
            if due > 0:
                next_in = min(next_in, due)
                continue
            slot.outstanding, slot.asked_at = 1, time.monotonic()
            self._send_credit(wid, 1)
        return next_in

    def _flush(self) -> None:
        room = self._async_room()
        for wid, slot in self._slots.items():
            grant = self._grant_for(wid, slot, room)
            if grant:
                if not slot.outstanding:
                    slot.asked_at = time.monotonic()
                slot.outstanding += grant
                if room is not None:
                    room -= grant
                self._send_credit(wid, grant)


def _landed(slot: _Slot) -> None:
    """A batch of ``slot`` arrived (its credit already returned): time it from its credit."""
    now = time.monotonic()
    if slot.asked_at is not None:
        slot.batch_s = now - slot.asked_at
    slot.asked_at = now if slot.outstanding else None
