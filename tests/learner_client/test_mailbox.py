"""The mailbox: per-actor buffers, the credit rule and the takes, without a server."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import pytest
import torch
from helpers import interrupt_in_condition_wait, poll_until
from tensordict import TensorDict

from common.errors import SessionStateError
from learner_client._mailbox import Delivery, Mailbox, MailboxStats, Paused
from learner_client._rounds import name_time_dim


def batch(envs: int, steps: int, fill: float = 0.0) -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.full((envs, steps, 4), fill),
            ("collector", "traj_ids"): torch.zeros(envs, steps, dtype=torch.int64),
        },
        batch_size=[envs, steps],
    )
    return name_time_dim(td)


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
        lambda w, e, s: wire.acks.append((w, s)),
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


def _worker_1_down() -> Mailbox:
    """Two open sessions, worker 0's batch buffered, worker 1 down."""
    box, _ = make_mailbox()
    for wid in (0, 1):
        box.add_worker(wid, 4)
        box.session_opened(wid)
    box.put(delivery(0, 1))
    box.set_alive(1, False)
    return box


def test_mailbox_take_round_strict_fails_fast_on_a_down_actor_and_takes_nothing():
    box = _worker_1_down()
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=False)
    assert (taken, missing) == ([], [1])
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=True)
    assert [d.worker_id for d in taken] == [0]
    assert missing == [1]


def test_mailbox_round_waits_on_a_down_actor_whose_reconnection_was_woken():
    """A down actor marked retrying counts as down only once its attempt failed (strict and
    partial); one whose attempt succeeds delivers into the round."""
    box = _worker_1_down()
    box.set_retrying([1], True)
    threading.Timer(0.2, lambda: (box.set_alive(1, True), box.put(delivery(1, 1)))).start()
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=False)
    assert ([d.worker_id for d in taken], missing) == ([0, 1], [])
    for partial in (False, True):
        box.put(delivery(0, 2 + partial))
        box.set_alive(1, False)
        box.set_retrying([1], True)
        threading.Timer(0.2, lambda: box.set_alive(1, False)).start()  # the attempt failed
        started = time.monotonic()
        taken, missing = box.take_round([0, 1], timeout=30.0, partial=partial)
        assert 0.15 < time.monotonic() - started < 5
        assert missing == [1]
        assert [d.worker_id for d in taken] == ([0] if partial else [])
    # A woken attempt that outlives a strict round: that round reported the actor down, so
    # the next one waits for its return though the attempt failed since (no instant failure).
    box.set_alive(1, True)  # back, then down again: not reported yet
    box.set_alive(1, False)
    box.set_retrying([1], True)
    assert box.take_round([0, 1], timeout=0.2, partial=False) == ([], [1])
    box.set_alive(1, False)
    started = time.monotonic()
    assert box.take_round([0, 1], timeout=0.5, partial=False) == ([], [1])
    assert time.monotonic() - started >= 0.45


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


def test_mailbox_version_floor_is_read_when_each_batch_arrives():
    """A floor raised while a round waits (a returning actor's catch-up) drops what it re-sends."""
    held = {0: 0}
    box, wire = make_mailbox(window=2, lazy=True, version_floor=lambda w: held[w])
    box.add_worker(0, 4)
    box.session_opened(0)
    box.want_round()
    held[0] = 3  # the actor applied version 3 after the round was asked for
    old = dataclasses.replace(delivery(0, 1), version_min=2, version_max=2)
    assert box.put(old) is False
    assert wire.acks == [(0, 1)]  # acknowledged: the actor does not keep re-sending it
    assert wire.credits == [(0, 1), (0, 1)]  # its credit is granted again
    assert box.put(dataclasses.replace(delivery(0, 2), version_min=3, version_max=3))
    taken, missing = box.take_round([0], 1.0, partial=False)
    assert [d.seq for d in taken] == [2]
    assert missing == []


def test_mailbox_discard_older_drops_buffered_shares_below_the_floor():
    held = {0: 0, 1: 0}
    box, wire = make_mailbox(window=2, version_floor=lambda w: held[w])
    for wid in (0, 1):
        box.add_worker(wid, 4)
        box.session_opened(wid)
    box.put(delivery(0, 1))
    box.put(delivery(1, 1))
    held[1] = 1  # only worker 1 applied the push
    assert box.discard_older([0, 1]) == 1
    assert wire.acks == [(1, 1)]
    assert box.take_any(1.0).worker_id == 0


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


class WaitingTake:
    """A ``take_any`` running in a thread, as the user's ``next`` waits for a batch."""

    def __init__(self, box: Mailbox, timeout: float = 10.0) -> None:
        self.result: list[Delivery | None] = []
        self._thread = threading.Thread(target=lambda: self.result.append(box.take_any(timeout)))
        self._thread.start()

    def claim(self, box: Mailbox, worker_id: int) -> None:
        """``worker_id``'s batch starts arriving, retried until the take waits and claims it."""
        deadline = time.monotonic() + 5.0
        while not box.arriving(worker_id):
            assert time.monotonic() < deadline, "the waiting take never claimed the batch"
            time.sleep(0.005)

    def join(self) -> Delivery | None:
        self._thread.join(10.0)
        assert not self._thread.is_alive()
        return self.result[0]


def opened(box: Mailbox, *worker_ids: int) -> None:
    for wid in worker_ids:
        box.add_worker(wid, 4)
        box.session_opened(wid)


def test_mailbox_a_waiting_take_claims_an_arriving_batch_and_frees_its_credit_at_once():
    """TorchRL's MultiaSyncCollector tells a worker to go on as it dequeues its batch."""
    box, wire = make_mailbox(window=1)
    opened(box, 0)
    take = WaitingTake(box)
    take.claim(box, 0)
    assert wire.credits == [(0, 1)]  # before the batch is read, decoded and put
    assert wire.acks == []
    box.put(delivery(0, 1))
    assert take.join().seq == 1
    assert wire.acks == [(0, 1)]
    assert wire.credits == [(0, 1)]  # the take grants nothing more: the window holds
    assert box.snapshot()[0].outstanding == 1


def test_mailbox_claims_nothing_without_a_waiting_take_nor_in_lazy_mode():
    box, wire = make_mailbox(window=1)
    opened(box, 0)
    assert not box.arriving(0)
    assert wire.credits == []
    lazy, lazy_wire = make_mailbox(window=1, lazy=True)
    lazy.add_worker(0, 4)
    lazy.session_opened(0)
    lazy.want_round()
    take = WaitingTake(lazy, timeout=0.3)
    time.sleep(0.1)
    assert not lazy.arriving(0)  # sync rounds: credits follow the rounds asked for
    assert take.join() is None
    assert lazy_wire.credits == [(0, 1)]


def test_mailbox_a_claimed_batch_holds_no_ready_batch_back_and_is_first_once_it_lands():
    """An actor stalled in the middle of a claimed batch never holds up the others."""
    box, wire = make_mailbox(window=1)
    opened(box, 0, 1)
    take = WaitingTake(box)
    take.claim(box, 0)
    assert not box.arriving(1)  # one claim at a time
    box.put(delivery(1, 1))  # ready while the claimed batch is still on its way
    assert take.join().worker_id == 1
    box.put(delivery(1, 2))  # actor 1's next batch, on the credit its take granted
    box.put(delivery(0, 1))  # the claimed batch lands: arrived first, handed out first
    assert [box.take_any(1.0).worker_id for _ in range(2)] == [0, 1]
    assert wire.granted(0) == 1  # the claim's: still unused, so its take grants none


def test_mailbox_a_claimed_batch_landing_after_its_take_timed_out_waits_for_the_next():
    box, wire = make_mailbox(window=1)
    opened(box, 0)
    take = WaitingTake(box, timeout=0.3)
    take.claim(box, 0)
    assert take.join() is None  # the take keeps its deadline
    box.put(delivery(0, 1))
    assert box.snapshot()[0] == MailboxStats(buffered=1, outstanding=1, open=True, alive=True)
    assert not box.arriving(0)  # nothing is claimed while a batch waits buffered
    assert box.take_any(1.0).seq == 1
    assert wire.granted(0) == 1  # the claim's credit, still unused: the take grants none


@pytest.mark.parametrize("release", ["unclaim", "session_closed"])
def test_mailbox_a_claim_released_lets_the_take_time_out_and_grants_nothing_more(release):
    box, wire = make_mailbox(window=1)
    opened(box, 0)
    take = WaitingTake(box, timeout=0.3)
    take.claim(box, 0)
    getattr(box, release)(0)
    assert take.join() is None
    assert wire.credits == [(0, 1)]
    assert box.snapshot()[0].buffered == 0


def test_mailbox_a_claimed_batch_counts_against_the_frame_budget():
    box, wire = make_mailbox(window=1)
    box.set_budget(1, per_worker=False)  # the batch on its way is the last one wanted
    opened(box, 0)
    take = WaitingTake(box)
    take.claim(box, 0)
    assert wire.credits == []  # no credit for a batch past the budget
    box.put(delivery(0, 1))
    assert take.join().seq == 1
    assert wire.credits == []


def test_mailbox_strict_round_retried_while_an_actor_stays_down_waits_for_it():
    """A caller that retries at once after a round failed on a down actor does not spin."""
    box = _worker_1_down()
    assert box.take_round([0, 1], timeout=30.0, partial=False) == ([], [1])
    started = time.monotonic()
    assert box.take_round([0, 1], timeout=0.5, partial=False) == ([], [1])
    assert time.monotonic() - started >= 0.45  # waited for it rather than failing at once
    threading.Timer(0.2, lambda: (box.set_alive(1, True), box.put(delivery(1, 1)))).start()
    taken, missing = box.take_round([0, 1], timeout=30.0, partial=False)
    assert ([d.worker_id for d in taken], missing) == ([0, 1], [])
    box.set_alive(1, False)  # down again after it came back: reported at once again
    started = time.monotonic()
    assert box.take_round([0, 1], timeout=30.0, partial=False) == ([], [0, 1])
    assert time.monotonic() - started < 5
    assert box.down([0, 1]) == [1]


def test_mailbox_discard_before_drops_the_old_seeds_batches_buffered_and_late():
    """After ``set_seed``, no batch collected before the reseed reaches the user."""
    box, _ = make_mailbox(window=2)
    box.add_worker(0, 4)
    box.session_opened(0)
    assert box.put(delivery(0, 1))  # collected before the reseed, buffered
    assert box.discard_before(0, 1, 3) == 1  # the reseeded batches start at seq 3
    assert box.put(delivery(0, 2)) is False  # still on its way: below the floor
    assert box.put(delivery(0, 3))
    assert box.take_any(1.0).seq == 3


def test_mailbox_grants_nothing_to_a_session_opened_while_paused():
    """A paused collector lets no actor collect: a session (re)opened meanwhile gets no
    credit, and a batch taken meanwhile frees none, until the collector resumes."""
    box, wire = make_mailbox(window=2)
    box.add_worker(0, 4)
    box.set_paused(True)
    assert box.session_opened(0) == 0
    assert wire.credits == []
    box.set_paused(False)
    assert wire.credits == [(0, 2)]


def test_mailbox_drops_a_batch_with_any_frames_acted_below_the_version_floor():
    """A batch whose frames span the push (version_min below the floor, version_max at it)
    still holds frames acted with the replaced weights: dropped and acknowledged."""
    held = {0: 3}
    box, wire = make_mailbox(window=2, version_floor=lambda w: held[w])
    box.add_worker(0, 4)
    box.session_opened(0)
    mixed = dataclasses.replace(delivery(0, 1), version_min=2, version_max=3)
    assert box.put(mixed) is False
    assert wire.acks == [(0, 1)]
    assert box.snapshot()[0].buffered == 0


def test_mailbox_partial_round_with_every_actor_down_waits_for_one_to_come_back():
    """A partial round returns early only with something to hand out: with every actor
    down it waits (until the deadline) and takes the batch of one that comes back."""
    box, _ = make_mailbox()
    for wid in (0, 1):
        box.add_worker(wid, 4)
        box.session_opened(wid)
        box.set_alive(wid, False)

    def comes_back() -> None:
        time.sleep(0.3)
        box.session_opened(0)
        box.set_alive(0, True)
        box.put(delivery(0, 1))

    thread = threading.Thread(target=comes_back)
    thread.start()
    taken, missing = box.take_round([0, 1], timeout=10.0, partial=True)
    thread.join(5.0)
    assert [d.worker_id for d in taken] == [0]
    assert missing == [1]


def test_mailbox_a_claim_cut_off_by_its_session_breaking_costs_the_next_session_no_credit():
    """A claimed batch whose session broke before it landed never lands: the next session's
    first batch uses a credit of its own, and taking it grants the next one."""
    box, wire = make_mailbox(window=1)
    opened(box, 0)
    take = WaitingTake(box)
    take.claim(box, 0)
    box.session_closed(0)  # the stream broke while the claimed batch was read
    assert box.session_opened(0) == 1  # the reconnection's open carries the window
    box.put(delivery(0, 1))  # re-sent on the new session
    assert take.join().seq == 1
    assert wire.credits == [(0, 1), (0, 1)]  # the claim's (lost with the stream), then the take's
    assert box.snapshot()[0].outstanding == 1


def test_mailbox_an_actor_whose_link_failed_is_down_after_the_failure_was_raised():
    """A link stopped on a bug never comes back: once its failure reached the user, strict
    rounds fail fast on its actor instead of waiting for it until their deadline."""
    box, _ = make_mailbox()
    opened(box, 0, 1)
    box.fail(1, RuntimeError("a bug on the loop"))
    with pytest.raises(RuntimeError, match="a bug"):
        box.take_any(1.0)
    assert box.down([0, 1]) == [1]
    box.put(delivery(0, 1))
    start = time.monotonic()
    assert box.take_round([0, 1], timeout=30.0, partial=False) == ([], [1])
    assert time.monotonic() - start < 5.0


def test_mailbox_dropping_stale_batches_acknowledges_the_highest():
    """An ack covers every seq up to it: acknowledging the newest stale batch lets the actor
    free them all (it would otherwise re-send the others at the next resume)."""
    held = {0: 0}
    box, wire = make_mailbox(window=4, version_floor=lambda w: held[w])
    box.add_worker(0, 4)
    box.session_opened(0)
    for seq in (1, 2, 3):
        box.put(delivery(0, seq))
    held[0] = 1  # a push replaced the weights those batches acted with
    assert box.discard_older([0]) == 3
    assert wire.acks == [(0, 3)]


def test_mailbox_asks_an_idle_actor_for_a_spare_batch_when_the_budget_waits_on_another():
    """The last batch of the budget is credited to worker 0; worker 1 idles. A take that
    waits on worker 0 gives worker 1 a credit past the budget after ``_SPARE_AFTER_S`` (its
    batches take no time), and takes whichever batch lands first."""
    box, wire = make_mailbox(window=1)
    opened(box, 0, 1)
    box.set_budget(2, per_worker=False)
    box.put(delivery(1, 1))
    assert box.take_any(1.0).worker_id == 1  # its batches are timed from their credit
    assert wire.credits == []  # the batch left is worker 0's (credited at its open)
    take = WaitingTake(box, timeout=10.0)
    poll_until(lambda: wire.granted(1) == 1, timeout=5.0)
    box.put(delivery(1, 2))
    assert take.join().seq == 2
    assert wire.credits == [(1, 1)]  # nothing more: the budget is spent


def test_mailbox_no_claim_without_an_outstanding_credit():
    """A batch that starts arriving while its actor holds no credit (past the frame budget)
    is not claimed: no credit is freed for it."""
    box, wire = make_mailbox(window=1)
    box.set_budget(1, per_worker=False)
    opened(box, 0)
    box.put(delivery(0, 1))
    assert box.take_any(1.0).seq == 1  # the last batch wanted: no new credit
    take = WaitingTake(box, timeout=0.5)
    deadline = time.monotonic() + 5.0
    while not box._waiting_takes:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not box.arriving(0)
    assert take.join() is None
    assert box.snapshot()[0].outstanding == 0
    assert wire.credits == []


@pytest.mark.parametrize("take", ["round", "any", "idle"])
def test_a_ctrl_c_in_the_middle_of_a_wait_raises_keyboard_interrupt_and_leaves_the_lock_held(
    take: str,
) -> None:
    box, _ = make_mailbox(window=1)
    box.add_worker(0, max_credits=1)
    box.session_opened(0)
    calls = {
        "round": lambda: box.take_round([0], 5.0, partial=False),
        "any": lambda: box.take_any(5.0),
        "idle": lambda: box.wait_idle(5.0),
    }
    sys.settrace(interrupt_in_condition_wait)
    try:
        with pytest.raises(KeyboardInterrupt, match="signal 2"):
            calls[take]()
    finally:
        sys.settrace(None)
    # The lock is free again for the stream's thread, and the mailbox works.
    delivered = threading.Thread(target=box.put, args=(delivery(0, 1),))
    delivered.start()
    delivered.join(5)
    assert not delivered.is_alive()
    assert box.take_any(1.0) is not None
