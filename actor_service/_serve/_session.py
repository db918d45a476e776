"""The actor's collection-session bookkeeping: credits, seq numbers, retention, acks, resume.

One :class:`SessionBook` lives as long as the actor (one actor epoch). It owns
the rules the ``Collect`` stream follows, with no gRPC and no threads, so they
can be tested on their own:

* **Credits.** A learner grants credits; one is consumed when collection of a
  batch *starts*. Unconsumed credits are capped at ``max_credits``; grants
  above the cap are ignored (the accepted amount is returned). A batch is also
  not started while ``max_credits`` finished batches wait for their ack, so a
  learner that grants credits but never reads cannot make the actor buffer
  without bound, and a learner that reconnects again and again (each open
  grants credits anew) cannot make it drop a batch it has not acknowledged.
* **Seq numbers.** Every finished batch gets the next seq of the epoch: 1, 2,
  3 …; a seq is never reused, across sessions too. A batch that fails while it
  is collected gets no seq, so seqs have no holes.
* **Retention.** Finished batches stay retained until acknowledged, so a
  learner that reconnects can resume; none is dropped before its ack (at most
  ``max_credits`` exist, by the credit rule). Retention survives the end of a
  session, not the actor.
* **Acks** are cumulative: ``ack(n)`` releases every batch with ``seq <= n``.
* **Resume.** ``open`` with ``resume_epoch == epoch`` *by the learner that
  owned the last session* (same ``learner_id``) acknowledges everything up to
  ``resume_after_seq`` and re-queues the retained rest, in seq order, ahead of
  new batches. Any other ``open`` starts fresh and drops retention: a learner
  never receives the batches of another learner's session.
* **Budget.** A session with ``total_frames >= 0`` starts no batch once that
  many frames were produced in it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Generic, TypeVar

from common.errors import ActorBusyError, SequenceConflictError, SessionStateError

__all__ = ["OpenedSession", "RetainedBatch", "SessionBook"]

P = TypeVar("P")


@dataclasses.dataclass
class RetainedBatch(Generic[P]):
    """One finished batch, kept until acknowledged.

    Attributes:
        seq: Its seq number in the actor epoch.
        frames: Frames it holds.
        payload: Whatever the transport needs to send it again (the encoded frame).
        sent: Whether it was fully written to a stream since it was last queued.
    """

    seq: int
    frames: int
    payload: P
    sent: bool = False


@dataclasses.dataclass(frozen=True)
class OpenedSession(Generic[P]):
    """The outcome of :meth:`SessionBook.open`.

    Attributes:
        session_id: Identifies the session in later calls; calls with an older id are stale.
        next_seq: Seq of the next new batch.
        credits: Credits held after the initial grant (capped).
        resumed: Whether retained batches are re-sent first.
        resend: The retained batches to re-send, in seq order.
    """

    session_id: int
    next_seq: int
    credits: int
    resumed: bool
    resend: list[RetainedBatch[P]]


class SessionBook(Generic[P]):
    """Credit, seq, retention and ack state of one actor epoch.

    Usage sketch (the servicer drives it from one event-loop thread)::

        book = SessionBook(epoch=epoch, max_credits=4)
        opened = book.open(credits=2, resume_epoch=0, resume_after_seq=0, total_frames=-1)
        while book.can_start():
            book.start_batch()
            batch = book.finish_batch(frames=200, payload=encoded)   # seq 1, 2, ...
            ...send batch..., book.mark_sent(batch.seq)
        book.ack(2)
        book.close()

    Args:
        epoch: The actor epoch (non-zero).
        max_credits: Cap on unconsumed credits, unsent batches and retained batches (>= 1).
    """

    def __init__(self, *, epoch: int, max_credits: int) -> None:
        if not isinstance(epoch, int) or epoch <= 0:
            raise ValueError(f"epoch must be a positive int, got {epoch!r}")
        if not isinstance(max_credits, int) or max_credits < 1:
            raise ValueError(f"max_credits must be an int >= 1, got {max_credits!r}")
        self.epoch = epoch
        self.max_credits = max_credits
        self._next_seq = 1
        self._acked_seq = 0
        self._retained: collections.OrderedDict[int, RetainedBatch[P]] = collections.OrderedDict()
        self._session_id = 0
        self._active = False
        self._credits = 0
        self._in_flight = False
        self._total_frames = -1
        self._session_frames = 0
        self._owner: str | None = None
        self._owner_first_seq = 1
        self.credits_granted = 0  # totals over the epoch, for the metrics
        self.batches_acked = 0
        self.batches_dropped = 0  # retained for a learner that never resumed

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> bool:
        """Whether a session is open."""
        return self._active

    @property
    def session_id(self) -> int:
        """Id of the current (or last) session."""
        return self._session_id

    @property
    def credits(self) -> int:
        """Unconsumed credits of the current session."""
        return self._credits

    @property
    def next_seq(self) -> int:
        """Seq the next finished batch gets."""
        return self._next_seq

    @property
    def last_seq(self) -> int:
        """Seq of the last finished batch (0 if none)."""
        return self._next_seq - 1

    @property
    def acked_seq(self) -> int:
        """Highest seq acknowledged so far."""
        return self._acked_seq

    @property
    def owner_first_seq(self) -> int:
        """The first seq the owner of the last session may hold (it opened afresh there).

        Lower seqs went to another learner, or were dropped: this owner's acks say
        nothing of them.
        """
        return self._owner_first_seq

    @property
    def in_flight(self) -> bool:
        """Whether a batch is being collected."""
        return self._in_flight

    @property
    def session_frames(self) -> int:
        """Frames produced (new batches) in the current session."""
        return self._session_frames

    @property
    def retained_seqs(self) -> list[int]:
        """Seqs of the retained batches, in order."""
        return list(self._retained)

    @property
    def unsent(self) -> int:
        """Retained batches queued and not yet fully sent."""
        return sum(1 for b in self._retained.values() if not b.sent)

    def budget_reached(self) -> bool:
        """Whether the session's ``total_frames`` were produced."""
        return 0 <= self._total_frames <= self._session_frames

    def can_start(self) -> bool:
        """Whether a new batch may be started now."""
        return (
            self._active
            and not self._in_flight
            and self._credits > 0
            and not self.budget_reached()
            and len(self._retained) < self.max_credits
        )

    # ------------------------------------------------------------ transitions

    def open(
        self,
        *,
        credits: int,
        resume_epoch: int,
        resume_after_seq: int,
        total_frames: int,
        take_over: bool = False,
        learner_id: str = "",
    ) -> OpenedSession[P]:
        """Open a session.

        Args:
            credits: Initial credits (capped at ``max_credits``).
            resume_epoch: The epoch the learner resumes; equal to ``epoch`` to resume.
            resume_after_seq: When resuming, the last seq the learner holds.
            total_frames: Frame budget of the session; ``< 0`` means endless.
            take_over: Replace an active session instead of refusing.
            learner_id: Who opens; only the owner of the last session may resume it.

        Returns:
            The session id, next seq, credits and batches to re-send.

        Raises:
            ActorBusyError: A session is active and ``take_over`` is false.
            SessionStateError: A batch of the previous session is still being collected.
            SequenceConflictError: ``resume_after_seq`` is beyond the last seq of this epoch.
        """
        if self._active and not take_over:
            raise ActorBusyError(f"a session is active on epoch {self.epoch}")
        if self._in_flight:
            raise SessionStateError("the previous session's batch is still being collected")
        resumed = resume_epoch == self.epoch and learner_id == self._owner
        if resumed and resume_after_seq > self.last_seq:
            raise SequenceConflictError(
                f"resume_after_seq={resume_after_seq} is beyond the last seq {self.last_seq} "
                f"of epoch {self.epoch}"
            )
        if resumed:
            self._release_through(resume_after_seq)
        else:  # no learner will ask for them: dropped, not acknowledged
            self.batches_dropped += self._release_through(self.last_seq, acked=False)
            self._owner_first_seq = self._next_seq
        for batch in self._retained.values():
            batch.sent = False
        self._owner = learner_id
        self._session_id += 1
        self._active = True
        self._credits = 0
        self._total_frames = total_frames
        self._session_frames = 0
        self.grant(credits)
        return OpenedSession(
            session_id=self._session_id,
            next_seq=self._next_seq,
            credits=self._credits,
            resumed=resumed,
            resend=list(self._retained.values()),
        )

    def grant(self, batches: int) -> int:
        """Add credits, capped so at most ``max_credits`` are unconsumed.

        Args:
            batches: Credits granted (>= 0).

        Returns:
            The credits actually added.
        """
        if batches < 0:
            raise ValueError(f"credits must be >= 0, got {batches}")
        if not self._active:
            raise SessionStateError("credit outside an open session")
        added = min(batches, self.max_credits - self._credits)
        self._credits += added
        self.credits_granted += added
        return added

    def start_batch(self) -> None:
        """Consume a credit for a batch whose collection starts now.

        Raises:
            SessionStateError: :meth:`can_start` is false.
        """
        if not self.can_start():
            raise SessionStateError(
                f"cannot start a batch (active={self._active}, credits={self._credits}, "
                f"in_flight={self._in_flight}, unsent={self.unsent})"
            )
        self._credits -= 1
        self._in_flight = True

    def abandon_batch(self) -> None:
        """Forget the batch being collected (it failed); its seq is not used."""
        self._in_flight = False

    def finish_batch(self, *, frames: int, payload: P) -> RetainedBatch[P]:
        """Number and retain the batch whose collection just finished.

        Args:
            frames: Frames in the batch.
            payload: What is needed to send it (again).

        Returns:
            The retained batch, with its seq, not yet sent.
        """
        if not self._in_flight:
            raise SessionStateError("finish_batch without start_batch")
        self._in_flight = False
        batch = RetainedBatch(seq=self._next_seq, frames=frames, payload=payload)
        self._next_seq += 1
        self._session_frames += frames
        self._retained[batch.seq] = batch
        return batch

    def mark_sent(self, seq: int) -> None:
        """Record that the batch ``seq`` was fully written to the stream."""
        batch = self._retained.get(seq)
        if batch is not None:
            batch.sent = True

    def ack(self, seq: int) -> int:
        """Acknowledge every batch with ``seq`` or lower (cumulative).

        Args:
            seq: The highest seq the learner holds.

        Returns:
            How many retained batches were released.

        Raises:
            SequenceConflictError: ``seq`` names a batch that was never produced.
        """
        if seq > self.last_seq:
            raise SequenceConflictError(
                f"ack of seq {seq} but the last batch of epoch {self.epoch} is seq {self.last_seq}"
            )
        return self._release_through(seq)

    def close(self) -> None:
        """End the current session; retained batches stay for a resume."""
        self._active = False
        self._credits = 0
        for batch in self._retained.values():
            batch.sent = True

    # --------------------------------------------------------------- helpers

    def _release_through(self, seq: int, *, acked: bool = True) -> int:
        self._acked_seq = max(self._acked_seq, seq)
        released = [s for s in self._retained if s <= self._acked_seq]
        for s in released:
            del self._retained[s]
        if acked:
            self.batches_acked += len(released)
        return len(released)
