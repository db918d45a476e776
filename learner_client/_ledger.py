"""Delivery bookkeeping: at-most-once per (worker_id, epoch, seq), gaps, and the counters.

A :class:`SeqTracker` per worker decides whether a complete batch is new
(delivered) or a re-send (dropped as a duplicate), and counts gaps: seqs that
were skipped within an epoch (a peer that does not follow the protocol) and batches known to be
lost with an actor process (a batch whose first chunk arrived but that never
completed before the actor came back under a new epoch). Gaps are reported,
never hidden. :class:`Ledger` aggregates the cheap counters ``stats()`` shows.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from common.config import MAX_CREDITS
from common.errors import ProtocolError

if TYPE_CHECKING:
    from prometheus_client import Histogram

__all__ = ["Counts", "Ledger", "SeqTracker", "check_count", "check_counts", "restored_counts"]


class SeqTracker:
    """At-most-once delivery and gap counting for one worker.

    Attributes:
        epoch: The actor epoch the tracker follows (0 before the first session).
        last: Highest seq received complete in ``epoch``.
        gaps: Batches known to be lost.
        duplicates: Re-sent batches dropped.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.last = 0
        self._started = 0
        self.gaps = 0
        self.duplicates = 0

    def opened(self, epoch: int, next_seq: int, resumed: bool) -> None:
        """Follow a session that just opened.

        A new epoch means a new actor process: the batch that was arriving when
        the old one died is lost (a gap); seqs before ``next_seq`` belong to
        other sessions and are not ours to count.

        Raises:
            ProtocolError: A resumed session's ``next_seq`` beyond the batches its actor may
                hold unacknowledged after the last one received: no actor sends it, and its
                first batch would count a wild gap. Or a fresh session of the epoch followed
                at a ``next_seq`` at or below the last seq received: an epoch never reuses a
                seq, and its batches would be delivered a second time.
        """
        if epoch == self.epoch and resumed:
            if next_seq > self.last + 1 + MAX_CREDITS:
                raise ProtocolError(
                    f"'opened' resumes after seq {self.last} at next_seq {next_seq}; an actor "
                    f"holds at most {MAX_CREDITS} batches unacknowledged"
                )
            return
        if epoch == self.epoch and next_seq <= self.last:
            raise ProtocolError(
                f"'opened' starts epoch {epoch} afresh at next_seq {next_seq}, but seq "
                f"{self.last} of it was received; an epoch never reuses a seq"
            )
        if self.epoch:
            self.gaps += max(0, self._started - self.last)
        self.epoch = epoch
        self.last = max(0, next_seq - 1)
        self._started = self.last

    def check_reseeded(self, first_seq: int, address: str) -> None:
        """Check the ``first_seq`` a seeding of the actor at ``address`` gives.

        Raises:
            ProtocolError: Beyond the batches the actor may hold unacknowledged after the
                last one received in the epoch followed: no actor says it, and every later
                batch of the epoch would be dropped as collected before the seeding.
        """
        if self.epoch and first_seq > self.last + 1 + MAX_CREDITS:
            raise ProtocolError(
                f"{address}: SetSeed gives first_seq {first_seq} after seq {self.last}; an "
                f"actor holds at most {MAX_CREDITS} batches unacknowledged"
            )

    def resume_point(self) -> tuple[int, int]:
        """``(resume_epoch, resume_after_seq)`` for the next ``open``; ``(0, 0)`` when fresh."""
        return (self.epoch, self.last) if self.epoch else (0, 0)

    def chunk_started(self, seq: int) -> None:
        """A batch's first chunk arrived."""
        self._started = max(self._started, seq)

    def accept(self, seq: int) -> bool:
        """Whether a complete batch is new; counts duplicates and skipped seqs."""
        if seq <= self.last:
            self.duplicates += 1
            return False
        if seq > self.last + 1:
            self.gaps += seq - self.last - 1
        self.last = seq
        self._started = max(self._started, seq)
        return True


@dataclasses.dataclass(frozen=True)
class Counts:
    """The delivery counters at one instant (read as one: ``stats()`` while a batch lands)."""

    frames: int
    batches: int
    worker_frames: dict[int, int]
    worker_batches: dict[int, int]
    extra: dict[str, int] = dataclasses.field(default_factory=dict)


class Ledger:
    """Thread-safe counters behind ``GrpcCollector.stats()`` and the learner's metrics.

    Args:
        lag_histogram: Observes the policy lag of every delivered batch.
        extra: Names of further counts of the delivered batches (an LLM collection's
            ``yielded_turns`` and ``tokens``): counted, read, withdrawn and restored with
            the frames and batches, under the same lock.
    """

    def __init__(self, lag_histogram: Histogram, extra: Sequence[str] = ()) -> None:
        self._lock = threading.Lock()
        self._lag_histogram = lag_histogram
        self.frames = 0
        self.batches = 0
        self.extra = dict.fromkeys(extra, 0)
        self.worker_frames: dict[int, int] = {}
        self.worker_batches: dict[int, int] = {}
        self.reconnects: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.restarts: dict[int, int] = {}
        self.lost_in_progress = 0
        self.discarded = 0
        self.auto_pushes = 0
        self._push = {
            "push_bytes": 0,
            "push_pause_max": 0.0,
            "last_push_bytes": 0,
            "last_push_pause": 0.0,
            "delta_pushes": 0,
            "delta_fallbacks": 0,
        }
        self.policy_lag = 0
        self.policy_lag_max = 0

    def delivered(
        self, frames_by_worker: dict[int, int], lag: int, extra: Mapping[str, int] | None = None
    ) -> None:
        """Count one yielded batch, the frames each worker contributed and its ``extra`` counts."""
        with self._lock:
            self.batches += 1
            self._add_extra(extra, 1)
            for wid, frames in frames_by_worker.items():
                self.frames += frames
                self.worker_frames[wid] = self.worker_frames.get(wid, 0) + frames
                self.worker_batches[wid] = self.worker_batches.get(wid, 0) + 1
            self.policy_lag = lag
            self.policy_lag_max = max(self.policy_lag_max, lag)
        self._lag_histogram.observe(lag)

    def failure(self, worker_id: int) -> None:
        """Count a broken stream or failed connection attempt."""
        with self._lock:
            self.failures[worker_id] = self.failures.get(worker_id, 0) + 1

    def reconnected(self, worker_id: int) -> None:
        """Count a session re-opened after a failure."""
        with self._lock:
            self.reconnects[worker_id] = self.reconnects.get(worker_id, 0) + 1

    def restarted(self, worker_id: int, in_progress: int) -> None:
        """Count an actor found restarted, and what it held in progress (``num_envs``).

        Every env pool slot (an LLM actor's chat slot) held one trajectory or dialog in
        progress; those, and the batches the old process never sent, are lost.
        """
        with self._lock:
            self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
            self.lost_in_progress += in_progress

    def withdrawn(
        self, frames_by_worker: dict[int, int], extra: Mapping[str, int] | None = None
    ) -> None:
        """Undo :meth:`delivered` of a batch dropped before it reached the user (discarded).

        A sync round kept by an interrupt and stale by the time it is taken again: the
        budget counts it no more, so ``total_frames`` still reach the user.
        """
        with self._lock:
            self.batches -= 1
            self._add_extra(extra, -1)
            for wid, frames in frames_by_worker.items():
                self.frames -= frames
                self.worker_frames[wid] -= frames
                self.worker_batches[wid] -= 1
                self.discarded += 1

    def _add_extra(self, extra: Mapping[str, int] | None, sign: int) -> None:
        for name, count in (extra or {}).items():
            self.extra[name] += sign * count

    def add_discarded(self, count: int) -> None:
        """Count complete batches dropped on purpose (e.g. the fleet was resized)."""
        with self._lock:
            self.discarded += count

    def add_auto_push(self) -> None:
        """Count one automatic weight push."""
        with self._lock:
            self.auto_pushes += 1

    def pushed(self, nbytes: int, pause_seconds: float) -> None:
        """Count one push an actor applied: its bytes and the generation pause it reported."""
        with self._lock:
            self._push["push_bytes"] += nbytes
            self._push["push_pause_max"] = max(self._push["push_pause_max"], pause_seconds)

    def push_call(
        self, nbytes: int, pause_seconds: float, deltas: int, fallbacks: int, continues: bool
    ) -> None:
        """Record one push call: bytes to all targets, longest pause, deltas, fallbacks to full.

        ``continues`` adds to the last call's bytes and pause (a fallback within one call).
        """
        with self._lock:
            if continues:
                nbytes += int(self._push["last_push_bytes"])
                pause_seconds = max(pause_seconds, self._push["last_push_pause"])
            self._push["last_push_bytes"] = nbytes
            self._push["last_push_pause"] = pause_seconds
            self._push["delta_pushes"] += deltas
            self._push["delta_fallbacks"] += fallbacks

    def counts(self) -> Counts:
        """Frames, batches and the extra counts, in all and per worker, under one lock."""
        with self._lock:
            return Counts(
                self.frames,
                self.batches,
                dict(self.worker_frames),
                dict(self.worker_batches),
                dict(self.extra),
            )

    def push_stats(self) -> dict[str, int | float]:
        """The push counters ``stats()`` shows (see :mod:`learner_client._stats`)."""
        with self._lock:
            return dict(self._push)

    def restore(self, counts: Counts) -> None:
        """Set every counter :meth:`counts` reads (from a state_dict) in one step.

        An extra count ``counts`` lacks starts from 0 again.
        """
        with self._lock:
            self.frames, self.batches = counts.frames, counts.batches
            self.worker_frames = dict(counts.worker_frames)
            self.worker_batches = dict(counts.worker_batches)
            self.extra = {name: counts.extra.get(name, 0) for name in self.extra}


def restored_counts(state_dict: Mapping[str, object], extra: Iterable[str]) -> Counts:
    """The :class:`Counts` a state_dict holds (``frames``, ``batches``, per worker, ``extra``).

    The per-worker counts and the extra counts a checkpoint lacks (one of an older
    version, a ``GrpcCollector``'s for an LLM collector) start from 0 again.

    Raises:
        ValueError: Naming the count that is not an int in [0, 2**63) by worker_id.
    """
    frames, batches = check_counts(state_dict["frames"], state_dict["batches"])
    return Counts(
        frames,
        batches,
        _worker_counts("worker_frames", state_dict.get("worker_frames", {})),
        _worker_counts("worker_batches", state_dict.get("worker_batches", {})),
        {name: check_count(name, state_dict.get(name, 0)) for name in extra},
    )


def _worker_counts(name: str, counts: object) -> dict[int, int]:
    if not isinstance(counts, Mapping) or not all(
        isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in counts
    ):
        raise ValueError(f"state_dict[{name!r}] must map worker_ids to counts, got {counts!r:.60}")
    return {w: check_count(f"{name}[{w}]", count) for w, count in counts.items()}


def check_counts(frames: object, batches: object) -> tuple[int, int]:
    """A state_dict's ``frames`` and ``batches``: ints in [0, 2**63 - 1].

    Raises:
        ValueError: Naming the count.
    """
    return check_count("frames", frames), check_count("batches", batches)


def check_count(name: str, count: object) -> int:
    """A state_dict's count ``name``: an int in [0, 2**63 - 1].

    Raises:
        ValueError: Naming the count.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**63:
        raise ValueError(f"state_dict[{name!r}] must be an int in [0, 2**63), got {count!r:.40}")
    return count
