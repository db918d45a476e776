"""Delivery bookkeeping: at-most-once per (worker_id, epoch, seq) and the gaps counted."""

from __future__ import annotations

import pytest

from learner_client._ledger import SeqTracker, check_counts


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


def test_seq_tracker_counts_one_skipped_seq_as_one_gap():
    tracker = SeqTracker()
    tracker.opened(epoch=3, next_seq=1, resumed=False)
    assert tracker.accept(1)
    assert tracker.accept(3)
    assert tracker.gaps == 1


def test_checkpoint_counts_stop_at_the_top_of_int64():
    """A state_dict's counters become int64 counters: the largest is taken, one more refused."""
    assert check_counts(2**63 - 1, 2**63 - 1) == (2**63 - 1, 2**63 - 1)
    with pytest.raises(ValueError, match="'frames'"):
        check_counts(2**63, 0)
    with pytest.raises(ValueError, match="'batches'"):
        check_counts(0, 2**63)
