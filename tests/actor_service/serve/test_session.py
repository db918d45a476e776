"""Unit tests of the session state machine: credits, seqs, retention, acks, resume, budget."""

from __future__ import annotations

import pytest

from actor_service._serve._session import SessionBook
from common.errors import ActorBusyError, SequenceConflictError, SessionStateError

EPOCH = 77


def _book(max_credits: int = 4) -> SessionBook[str]:
    return SessionBook(epoch=EPOCH, max_credits=max_credits)


def _open(book: SessionBook[str], credits: int = 0, **kw: int) -> object:
    args = {"resume_epoch": 0, "resume_after_seq": 0, "total_frames": -1} | kw
    return book.open(credits=credits, **args)


def _produce(book: SessionBook[str], n: int, frames: int = 10, send: bool = True) -> list[int]:
    seqs = []
    for _ in range(n):
        book.start_batch()
        batch = book.finish_batch(frames=frames, payload=f"batch-{book.next_seq}")
        if send:
            book.mark_sent(batch.seq)
        seqs.append(batch.seq)
    return seqs


def test_session_seqs_start_at_one_and_increment() -> None:
    book = _book()
    opened = _open(book, credits=3)
    assert opened.next_seq == 1
    assert _produce(book, 3) == [1, 2, 3]
    assert book.last_seq == 3


def test_session_credit_is_consumed_when_a_batch_starts() -> None:
    book = _book()
    _open(book, credits=2)
    book.start_batch()
    assert book.credits == 1
    assert not book.can_start()  # one batch in flight at a time
    book.finish_batch(frames=1, payload="a")
    book.start_batch()
    book.finish_batch(frames=1, payload="b")
    assert book.credits == 0
    assert not book.can_start()


def test_session_start_batch_raises_if_no_credit() -> None:
    book = _book()
    _open(book, credits=0)
    with pytest.raises(SessionStateError, match="credits=0"):
        book.start_batch()


def test_session_credits_are_capped_at_max_credits() -> None:
    book = _book(max_credits=3)
    opened = _open(book, credits=10)
    assert opened.credits == 3
    assert book.grant(5) == 0
    _produce(book, 1)
    assert book.grant(5) == 1
    assert book.credits == 3


def test_session_grant_raises_if_no_session() -> None:
    with pytest.raises(SessionStateError):
        _book().grant(1)


def test_session_unacknowledged_batches_block_new_starts() -> None:
    book = _book(max_credits=2)
    _open(book, credits=2)
    _produce(book, 2, send=False)
    book.grant(2)
    assert not book.can_start()
    book.mark_sent(1)
    assert not book.can_start()  # sent is not received: only an ack frees its place
    book.ack(1)
    assert book.can_start()


def test_session_ack_is_cumulative_and_releases_retention() -> None:
    book = _book()
    _open(book, credits=4)
    _produce(book, 3)
    assert book.retained_seqs == [1, 2, 3]
    assert book.ack(2) == 2
    assert book.retained_seqs == [3]
    assert book.ack(1) == 0  # an older ack changes nothing
    assert book.acked_seq == 2


def test_session_ack_raises_if_seq_was_never_produced() -> None:
    book = _book()
    _open(book, credits=1)
    _produce(book, 1)
    with pytest.raises(SequenceConflictError, match="seq 5"):
        book.ack(5)


def test_session_ack_raises_for_the_seq_right_after_the_last_and_keeps_retention() -> None:
    book = _book()
    _open(book, credits=2)
    _produce(book, 1)
    with pytest.raises(SequenceConflictError, match="ack of seq 2 "):
        book.ack(2)
    assert book.acked_seq == 0
    assert _produce(book, 1) == [2]
    assert book.retained_seqs == [1, 2]  # the next batch is not released by the refused ack


def test_session_starts_no_batch_while_max_credits_wait_for_their_ack() -> None:
    """A learner that keeps reconnecting before a batch gets through (a link slower than
    its batch_timeout) resumes with fresh credits each time: the actor stops at
    ``max_credits`` unacknowledged batches and drops none of them."""
    book = _book(max_credits=2)
    _open(book, credits=2)
    _produce(book, 2)
    book.grant(2)
    assert not book.can_start()  # sent, not acknowledged: kept, and nothing more collected
    for _ in range(5):
        book.close()
        opened = _open(book, credits=1, resume_epoch=EPOCH, resume_after_seq=0)
        assert [b.seq for b in opened.resend] == [1, 2]
        for batch in opened.resend:
            book.mark_sent(batch.seq)
        assert not book.can_start()
    assert book.ack(1) == 1
    assert book.can_start()
    assert _produce(book, 1) == [3]
    assert book.retained_seqs == [2, 3]


def test_session_second_open_raises_unless_take_over() -> None:
    book = _book()
    _open(book, credits=1)
    with pytest.raises(ActorBusyError):
        _open(book, credits=1)
    opened = _open(book, credits=1, take_over=True)
    assert opened.session_id == 2


def test_session_open_raises_if_a_batch_is_in_flight() -> None:
    book = _book()
    _open(book, credits=1)
    book.start_batch()
    with pytest.raises(SessionStateError, match="still being collected"):
        _open(book, take_over=True)


def test_session_resume_resends_unacked_batches_in_order() -> None:
    book = _book()
    _open(book, credits=4)
    _produce(book, 4)
    book.ack(1)
    book.close()
    opened = _open(book, credits=1, resume_epoch=EPOCH, resume_after_seq=2)
    assert opened.resumed
    assert [b.seq for b in opened.resend] == [3, 4]
    assert [b.payload for b in opened.resend] == ["batch-3", "batch-4"]
    assert opened.next_seq == 5
    assert book.unsent == 2


def test_session_fresh_open_drops_retention_but_keeps_seqs() -> None:
    book = _book()
    _open(book, credits=2)
    _produce(book, 2)
    book.close()
    opened = _open(book, credits=1, resume_epoch=EPOCH + 1, resume_after_seq=1)
    assert not opened.resumed
    assert opened.resend == []
    assert _produce(book, 1) == [3]
    assert (book.batches_acked, book.batches_dropped) == (0, 2)  # no learner acknowledged them


def test_session_resume_acknowledges_what_the_learner_holds() -> None:
    book = _book()
    _open(book, credits=3)
    _produce(book, 3)
    book.ack(1)
    book.close()
    _open(book, credits=1, resume_epoch=EPOCH, resume_after_seq=2)
    assert (book.batches_acked, book.batches_dropped) == (2, 0)


def test_session_resume_raises_if_after_seq_is_in_the_future() -> None:
    book = _book()
    _open(book, credits=1)
    _produce(book, 1)
    book.close()
    with pytest.raises(SequenceConflictError, match="resume_after_seq=9"):
        _open(book, resume_epoch=EPOCH, resume_after_seq=9)
    # One past the last batch too: the learner would drop the next real batch as seen.
    with pytest.raises(SequenceConflictError, match="resume_after_seq=2"):
        _open(book, resume_epoch=EPOCH, resume_after_seq=2)


def test_session_abandoned_batch_leaves_no_hole_in_seqs() -> None:
    book = _book()
    _open(book, credits=2)
    book.start_batch()
    book.abandon_batch()
    assert _produce(book, 1) == [1]


def test_session_budget_stops_new_batches() -> None:
    book = _book()
    _open(book, credits=4, total_frames=25)
    _produce(book, 3, frames=10)
    assert book.budget_reached()
    assert not book.can_start()
    assert book.credits == 1


def test_session_zero_budget_is_reached_at_once() -> None:
    book = _book()
    _open(book, credits=1, total_frames=0)
    assert book.budget_reached()


def test_session_close_makes_the_book_idle() -> None:
    book = _book()
    _open(book, credits=2)
    book.close()
    assert not book.active
    assert not book.can_start()


@pytest.mark.parametrize(("epoch", "max_credits"), [(0, 1), (1, 0)])
def test_session_raises_if_constructed_with_bad_values(epoch: int, max_credits: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        SessionBook(epoch=epoch, max_credits=max_credits)


@pytest.mark.parametrize("resume", [True, False])
def test_session_budget_counts_only_the_frames_of_the_session_now_open(resume: bool) -> None:
    book = _book()
    book.open(credits=4, resume_epoch=0, resume_after_seq=0, total_frames=20, learner_id="A")
    _produce(book, 2, frames=10)
    assert book.budget_reached()
    book.ack(2)
    book.close()
    opened = book.open(
        credits=4,
        resume_epoch=EPOCH if resume else 0,
        resume_after_seq=2 if resume else 0,
        total_frames=20,
        learner_id="A",
    )
    assert opened.resumed is resume
    assert book.session_frames == 0
    assert not book.budget_reached()
    assert _produce(book, 2, frames=10) == [3, 4]
    assert book.budget_reached()


def test_session_grant_raises_if_credits_are_negative_and_adds_none() -> None:
    book = _book()
    _open(book, credits=2)
    with pytest.raises(ValueError, match="credits must be >= 0"):
        book.grant(-1)
    assert book.credits == 2


def test_session_taken_over_leaves_none_of_its_credits_to_the_next() -> None:
    book = _book(max_credits=2)
    _open(book, credits=2)
    _produce(book, 2)
    assert book.grant(2) == 2  # held: both batches wait for their ack
    opened = _open(book, credits=0, take_over=True)
    assert opened.credits == book.credits == 0
    assert not book.can_start()
