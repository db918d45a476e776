"""Batch assembly (tagging, stacking), delivery bookkeeping and credit rules, without a server."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from common.errors import SessionStateError
from learner_client._ledger import SeqTracker
from learner_client._mailbox import Delivery, Mailbox, Paused
from learner_client._rounds import WORKER_ID_KEY, combine, name_time_dim, tag_worker


def batch(envs: int, steps: int, fill: float = 0.0) -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.full((envs, steps, 4), fill),
            ("collector", "traj_ids"): torch.zeros(envs, steps, dtype=torch.int64),
        },
        batch_size=[envs, steps],
    )
    return name_time_dim(td)


def test_tag_worker_adds_an_int64_id_shaped_like_traj_ids():
    td = tag_worker(batch(2, 3), 7)
    ids = td[WORKER_ID_KEY]
    assert ids.dtype == torch.int64
    assert ids.shape == td["collector", "traj_ids"].shape
    assert bool((ids == 7).all())
    assert td.names == [None, "time"]


def test_combine_stacks_in_order_with_named_time():
    out = combine(
        [tag_worker(batch(2, 4, i), i) for i in range(3)], cat_results="stack", split_trajs=False
    )
    assert out.batch_size == torch.Size([3, 2, 4])
    assert out.names == [None, None, "time"]
    assert out[WORKER_ID_KEY][:, 0, 0].tolist() == [0, 1, 2]


def test_combine_concatenates_on_dim_zero_with_cat_results_0():
    out = combine([batch(2, 4), batch(2, 4)], cat_results=0, split_trajs=False)
    assert out.batch_size == torch.Size([4, 4])
    assert out.names == [None, "time"]


def test_combine_lazy_stacks_actors_of_different_shapes():
    out = combine([batch(2, 4), batch(4, 2)], cat_results="stack", split_trajs=False)
    assert isinstance(out, LazyStackedTensorDict)
    assert out[0].batch_size == torch.Size([2, 4])
    assert out[1].batch_size == torch.Size([4, 2])


def test_combine_pads_split_trajectories_to_the_longest():
    out = combine([batch(3, 5, 1.0), batch(2, 7, 2.0)], cat_results="stack", split_trajs=True)
    assert out.batch_size == torch.Size([5, 7])
    assert bool((out["observation"][:3, 5:] == 0).all())


def test_combine_raises_if_given_nothing():
    with pytest.raises(ValueError, match="zero"):
        combine([], cat_results="stack", split_trajs=False)


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


class Wire:
    """Records what the mailbox sends."""

    def __init__(self) -> None:
        self.credits: list[tuple[int, int]] = []
        self.acks: list[tuple[int, int]] = []

    def granted(self, worker_id: int) -> int:
        return sum(n for w, n in self.credits if w == worker_id)


def delivery(worker_id: int, seq: int) -> Delivery:
    return Delivery(worker_id=worker_id, epoch=1, seq=seq, batch=batch(1, 1), frames=1)


def make_mailbox(window: int = 2, **kw) -> tuple[Mailbox, Wire]:
    wire = Wire()
    box = Mailbox(
        window,
        lambda w, n: wire.credits.append((w, n)),
        lambda w, s: wire.acks.append((w, s)),
        **kw,
    )
    return box, wire


def test_mailbox_grants_a_credit_only_when_a_batch_is_taken():
    box, wire = make_mailbox(window=2)
    box.add_worker(0, max_credits=8)
    assert box.session_opened(0) == 2
    box.put(delivery(0, 1))
    box.put(delivery(0, 2))
    assert wire.credits == []  # two buffered: the window is full
    assert box.take_any(1.0).seq == 1
    assert wire.acks == [(0, 1)]
    assert wire.credits == [(0, 1)]


def test_mailbox_window_is_capped_by_the_actor_max_credits():
    box, _ = make_mailbox(window=5)
    box.add_worker(0, max_credits=3)
    assert box.session_opened(0) == 3


def test_mailbox_take_any_serves_the_first_arrival():
    box, _ = make_mailbox()
    for wid in (0, 1):
        box.add_worker(wid, 4)
        box.session_opened(wid)
    box.put(delivery(1, 1))
    box.put(delivery(0, 1))
    assert [box.take_any(1.0).worker_id for _ in range(2)] == [1, 0]
    assert box.take_any(0.05) is None


def test_mailbox_budget_limits_credits_across_actors():
    box, _ = make_mailbox(window=2)
    box.set_budget(3, per_worker=False)
    for wid in (0, 1):
        box.add_worker(wid, 4)
    assert box.session_opened(0) + box.session_opened(1) == 3


def test_mailbox_take_round_strict_fails_fast_on_a_down_actor_and_takes_nothing():
    box, _ = make_mailbox()
    for wid in (0, 1):
        box.add_worker(wid, 4)
        box.session_opened(wid)
    box.put(delivery(0, 1))
    box.set_alive(1, False)
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=False)
    assert (taken, missing) == ([], [1])
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=True)
    assert [d.worker_id for d in taken] == [0]
    assert missing == [1]


def test_mailbox_lazy_mode_grants_one_credit_per_requested_round():
    box, wire = make_mailbox(window=2, lazy=True)
    box.add_worker(0, 4)
    assert box.session_opened(0) == 0
    box.want_round()
    assert wire.credits == [(0, 1)]
    box.want_round()
    assert wire.credits == [(0, 1)]  # still owed from this round
    box.put(delivery(0, 1))
    box.take_round([0], 1.0, partial=False)
    assert wire.credits == [(0, 1)]  # nothing until the next round is requested


def test_mailbox_pause_withholds_credits_and_batches():
    box, wire = make_mailbox(window=1)
    box.add_worker(0, 4)
    box.session_opened(0)
    box.put(delivery(0, 1))
    box.set_paused(True)
    with pytest.raises(Paused):
        box.take_any(1.0)
    box.set_paused(False)
    assert box.take_any(1.0).seq == 1
    assert wire.credits == [(0, 1)]


def test_mailbox_close_wakes_a_waiting_taker():
    box, _ = make_mailbox()
    box.add_worker(0, 4)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            box.take_any(30.0)
        except SessionStateError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    box.close()
    thread.join(5.0)
    assert not thread.is_alive()
    assert len(errors) == 1
