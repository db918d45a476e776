"""Delivery bookkeeping: at-most-once per (worker_id, epoch, seq) and the gaps counted."""

from __future__ import annotations

import pytest

from common.errors import ProtocolError
from learner_client._ledger import Ledger, SeqTracker, check_counts


def test_seq_tracker_delivers_at_most_once_and_counts_skipped_seqs():
    tracker = SeqTracker()
    tracker.opened(epoch=11, next_seq=1, resumed=False)
    assert [tracker.accept(s) for s in (1, 2, 2, 1, 5)] == [True, True, False, False, True]
    assert (tracker.duplicates, tracker.gaps) == (2, 2)
    assert tracker.resume_point() == (11, 5)


def test_seq_tracker_counts_a_partial_batch_lost_with_the_old_process():
    tracker = SeqTracker()
    tracker.opened(epoch=11, next_seq=4, resumed=False)  # seqs 1..3 were another learner's
    assert tracker.accept(4)
    assert tracker.gaps == 0
    tracker.chunk_started(5)  # the stream broke inside batch 5
    tracker.opened(epoch=11, next_seq=6, resumed=True)  # same process: 5 is re-sent
    assert tracker.gaps == 0
    assert tracker.accept(5)
    tracker.chunk_started(6)
    tracker.opened(epoch=99, next_seq=1, resumed=False)  # new process: 6 is gone
    assert tracker.gaps == 1
    assert tracker.resume_point() == (99, 0)
    assert tracker.accept(1)


def test_seq_tracker_a_resent_batch_does_not_hide_the_batch_in_progress():
    """A duplicate's first chunk (a seq already delivered) after batch 3's first chunk: 3
    is still the batch in progress, lost when the actor comes back as a new process."""
    tracker = SeqTracker()
    tracker.opened(epoch=11, next_seq=1, resumed=False)
    assert [tracker.accept(1), tracker.accept(2)] == [True, True]
    tracker.chunk_started(3)
    tracker.chunk_started(1)  # a re-send of 1, dropped as a duplicate once whole
    assert not tracker.accept(1)
    tracker.opened(epoch=12, next_seq=1, resumed=False)
    assert (tracker.gaps, tracker.duplicates) == (1, 1)


def test_seq_tracker_counts_one_skipped_seq_as_one_gap():
    tracker = SeqTracker()
    tracker.opened(epoch=3, next_seq=1, resumed=False)
    assert tracker.accept(1)
    assert tracker.accept(3)
    assert tracker.gaps == 1


def test_seq_tracker_reopened_on_its_epoch_by_another_learner_counts_no_gap():
    """Seqs 4..9 of the same actor process went to another learner's session: not gaps."""
    tracker = SeqTracker()
    tracker.opened(epoch=1, next_seq=1, resumed=False)
    assert all(tracker.accept(s) for s in (1, 2, 3))
    tracker.opened(epoch=1, next_seq=10, resumed=False)
    assert tracker.resume_point() == (1, 9)
    assert tracker.accept(10)
    assert tracker.gaps == 0


def test_seq_tracker_raises_if_a_fresh_session_of_its_epoch_reuses_a_received_seq():
    """An epoch never reuses a seq: following it back to next_seq 2 after seq 3 would
    deliver batches 2 and 3 a second time. The tracker is left as it was."""
    tracker = SeqTracker()
    tracker.opened(epoch=1, next_seq=1, resumed=False)
    assert all(tracker.accept(s) for s in (1, 2, 3))
    with pytest.raises(ProtocolError, match="afresh at next_seq 2, but seq 3 of it was received"):
        tracker.opened(epoch=1, next_seq=2, resumed=False)
    assert tracker.resume_point() == (1, 3)
    assert not tracker.accept(3)
    tracker.opened(epoch=1, next_seq=4, resumed=False)  # the next seq: nothing reused
    assert tracker.accept(4)
    assert tracker.gaps == 0


class _Lags:
    """The lag histogram the ledger observes into."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, value: float) -> None:
        self.seen.append(value)


def test_the_ledger_counts_lags_withdrawn_shares_and_restarts():
    lags = _Lags()
    ledger = Ledger(lags)  # type: ignore[arg-type]
    ledger.delivered({0: 4, 1: 4}, lag=3)
    ledger.delivered({0: 4}, lag=1)
    assert (ledger.policy_lag, ledger.policy_lag_max, lags.seen) == (1, 3, [3, 1])
    ledger.withdrawn({0: 4, 1: 4})  # the first batch, dropped before the user took it
    assert (ledger.frames, ledger.batches, ledger.discarded) == (4, 1, 2)
    assert ledger.worker_frames == {0: 4, 1: 0}
    ledger.restarted(1, in_progress=4)
    ledger.restarted(1, in_progress=2)
    assert (ledger.restarts, ledger.lost_in_progress) == ({1: 2}, 6)


def test_a_push_call_that_continues_adds_to_the_last_ones_bytes_and_pause():
    ledger = Ledger(_Lags())  # type: ignore[arg-type]
    ledger.push_call(100, 0.5, deltas=0, fallbacks=1, continues=False)
    ledger.push_call(50, 0.1, deltas=0, fallbacks=0, continues=True)  # the fallback's full push
    stats = ledger.push_stats()
    assert (stats["last_push_bytes"], stats["last_push_pause"]) == (150, 0.5)
    ledger.push_call(30, 0.2, deltas=1, fallbacks=0, continues=False)  # a new call starts over
    stats = ledger.push_stats()
    assert (stats["last_push_bytes"], stats["last_push_pause"]) == (30, 0.2)
    assert (stats["delta_pushes"], stats["delta_fallbacks"]) == (1, 1)


def test_checkpoint_counts_stop_at_the_top_of_int64():
    """A state_dict's counters become int64 counters: the largest is taken, one more refused."""
    assert check_counts(2**63 - 1, 2**63 - 1) == (2**63 - 1, 2**63 - 1)
    with pytest.raises(ValueError, match="'frames'"):
        check_counts(2**63, 0)
    with pytest.raises(ValueError, match="'batches'"):
        check_counts(0, 2**63)


@pytest.mark.parametrize(("frames", "batches"), [(True, 0), (0, False)])
def test_checkpoint_counts_refuse_a_bool(frames, batches):
    """A bool is an int to Python, never a count: refused as the collector's counts are."""
    with pytest.raises(ValueError, match="must be an int"):
        check_counts(frames, batches)
