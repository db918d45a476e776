"""What a training script's own code can do while it iterates, and what is lost by it.

A replay buffer whose ``extend`` raises, a ``postproc`` that raises, a Ctrl-C while a batch
is being laid out, a ``next()`` from the thread that paused: each loses at most what TorchRL
loses in the same place (the failing part), counts nothing twice, and never hangs.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch
from helpers import poll_until
from learner_fleet import StuckBuffer, cartpole_policy
from tensordict import NonTensorData, TensorDict, tensorclass
from torchrl.data import LazyTensorStorage, ReplayBuffer

from common.errors import ClosedError
from learner_client import GrpcCollector, _rounds, _wiring
from learner_client._background import Background
from learner_client._handover import Handover

ROOT = pathlib.Path(__file__).resolve().parents[2]


def addresses(fleet, *worker_ids):
    return [fleet[w].address for w in worker_ids]


class _FlakyBuffer(ReplayBuffer):
    """A user's buffer whose first ``extend`` raises (a full disk, a transform's bug)."""

    def __init__(self) -> None:
        super().__init__(storage=LazyTensorStorage(10_000))
        self.calls = 0

    def extend(self, data, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("transient extend failure")
        return super().extend(data, *args, **kwargs)


def _drain(collector: GrpcCollector) -> list[BaseException]:
    errors: list[BaseException] = []
    while True:
        try:
            if collector.next() is None and collector.stats()["completed"]:
                return errors
        except RuntimeError as exc:
            errors.append(exc)


def test_sync_replay_buffer_loses_only_the_part_whose_extend_raised(fleet) -> None:
    rb = _FlakyBuffer()
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=24, sync=True, replay_buffer=rb
    ) as collector:
        errors = _drain(collector)
        frames = collector.stats()["frames"]
    assert [str(e) for e in errors] == ["transient extend failure"]
    assert rb.calls == 6  # every part of every round was offered, the failing one too
    assert frames == 24
    workers = rb[:]["collector", "worker_id"][:, 0].tolist()
    assert len(rb) == 10  # 5 parts of [2 envs, 2 steps]: only the first part is missing
    assert (workers.count(0), workers.count(2)) == (4, 6)


def test_the_first_parts_error_is_raised_once_every_part_was_tried() -> None:
    """Two parts whose ``extend`` both raise: both are tried, and the first error is raised."""

    class Refusing:
        calls = 0

        def extend(self, batch: TensorDict) -> None:
            self.calls += 1
            raise (KeyError if self.calls == 1 else ValueError)(f"part {self.calls}")

    parts = [TensorDict({"x": torch.zeros(2)}, [2]) for _ in range(2)]
    buffer = Refusing()
    with pytest.raises(KeyError, match="part 1"):
        Handover().deliver(parts, buffer, None)
    assert buffer.calls == 2


def test_sync_replay_buffer_loses_only_the_part_whose_postproc_raised(fleet) -> None:
    calls = []

    def postproc(batch):
        calls.append(int(batch["collector", "worker_id"].flatten()[0]))
        if len(calls) == 1:
            raise RuntimeError("postproc failed once")
        return batch

    rb = ReplayBuffer(storage=LazyTensorStorage(10_000))
    with GrpcCollector(
        addresses(fleet, 0, 2),
        frames_per_batch=8,
        total_frames=16,
        sync=True,
        replay_buffer=rb,
        postproc=postproc,
    ) as collector:
        errors = _drain(collector)
    assert [str(e) for e in errors] == ["postproc failed once"]
    assert calls == [0, 2, 0, 2]  # the other actor's part of the failing round went on
    assert len(rb) == 6


def test_a_postproc_that_forgets_to_return_the_batch_is_named(fleet) -> None:
    def scale_rewards(batch):
        batch["next", "reward"] *= 0.1  # in place, and no return

    with (
        GrpcCollector(
            addresses(fleet, 0), frames_per_batch=4, total_frames=8, postproc=scale_rewards
        ) as collector,
        pytest.raises(TypeError, match=r"postproc must return the batch .* got NoneType"),
    ):
        next(iter(collector))


@tensorclass
class _Steps:
    observation: torch.Tensor
    reward: torch.Tensor


def test_a_postproc_may_return_a_tensorclass(fleet) -> None:
    def to_steps(batch):
        return _Steps(batch["observation"], batch["next", "reward"], batch_size=batch.shape)

    with GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, total_frames=8, postproc=to_steps
    ) as collector:
        batches = list(collector)
    assert [type(b) for b in batches] == [_Steps, _Steps]
    assert batches[0].observation.shape == (2, 2, 4)


def _interrupting(function, at_call: int, calls: list[int]):
    """``function`` that raises KeyboardInterrupt (a Ctrl-C) at its ``at_call``-th call."""

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return function(*args, **kwargs)

    return interrupted


@pytest.mark.parametrize("at_call", [2, 5], ids=["a-middle-batch", "the-last-batch"])
@pytest.mark.parametrize("sync", [True, False])
def test_an_interrupt_while_a_batch_is_laid_out_gives_that_batch_at_the_next_take(
    fleet, monkeypatch: pytest.MonkeyPatch, sync: bool, at_call: int
) -> None:
    """Ctrl-C lands while the round is stacked (sync) or placed (async): the script that
    catches it and goes on gets that batch next, counted once (it was counted and lost);
    the last one too, though its frames already reach total_frames."""
    calls: list[int] = []
    if sync:
        monkeypatch.setattr(_rounds, "combine", _interrupting(_rounds.combine, at_call, calls))
    else:  # after the batch was taken, where it is moved to its storing device
        place = _rounds.Placement.place
        monkeypatch.setattr(_rounds.Placement, "place", _interrupting(place, at_call, calls))
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=40, sync=sync
    ) as collector:
        batches, interrupts = _collect_through_interrupts(collector)
        stats = collector.stats()
    assert interrupts == 1
    assert sum(b.numel() for b in batches) == 40 == stats["frames"]
    assert (stats["gaps"], stats["duplicates"], stats["discarded"]) == (0, 0, 0)
    frames = [tuple(b["observation"].flatten().tolist()) for b in batches]
    assert len(set(frames)) == len(frames)  # the batch given again is given once


def _collect_through_interrupts(collector: GrpcCollector) -> tuple[list, int]:
    """A script's loop that catches Ctrl-C and goes on: (the batches, the interrupts)."""
    batches, interrupts = [], 0
    while True:
        try:
            batch = collector.next()
        except KeyboardInterrupt:
            interrupts += 1
            continue
        if batch is None:
            return batches, interrupts
        batches.append(batch)


def test_a_batch_kept_by_an_interrupt_is_given_on_a_fleet_whose_actors_hold_other_versions(
    fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No push since the take: the kept round is given, though its actors act with different
    versions (one had an addressed push), below the acting one (the highest): it was dropped
    as stale, its frames counted, so the loop ended a round short (16 of 24)."""
    with GrpcCollector(addresses(fleet, 2), frames_per_batch=4) as collector:
        collector.update_policy_weights_(cartpole_policy(), worker_ids=[2])
    monkeypatch.setattr(_rounds, "combine", _interrupting(_rounds.combine, 2, []))
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=24, sync=True
    ) as collector:
        batches, interrupts = _collect_through_interrupts(collector)
        stats = collector.stats()
    assert interrupts == 1
    assert sum(b.numel() for b in batches) == 24 == stats["frames"]
    assert stats["discarded"] == 0


@pytest.mark.parametrize("pushed_to", [[0, 2], [2]], ids=["every-actor", "one-actor"])
def test_a_batch_kept_by_an_interrupt_is_dropped_when_weights_were_pushed_since(
    fleet, monkeypatch: pytest.MonkeyPatch, pushed_to: list[int]
) -> None:
    """Sync on demand: the batch after a push acts with it, also after a Ctrl-C; the dropped
    round counts no more, so total_frames still reach the user (16 of 24 before). A push to
    one actor is enough: the kept round holds a share older than that actor now holds."""
    monkeypatch.setattr(_rounds, "combine", _interrupting(_rounds.combine, 1, []))
    policy = cartpole_policy()
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=24, sync=True
    ) as collector:
        with pytest.raises(KeyboardInterrupt):
            collector.next()
        version = collector.policy_version + 1
        collector.update_policy_weights_(policy, version=version, worker_ids=pushed_to)
        batches = list(collector)
        stats = collector.stats()
    assert stats["discarded"] == 2  # both actors' parts of the kept round
    assert sum(b.numel() for b in batches) == 24 == stats["frames"]
    assert stats["batches"] == 3
    pushed = [index for index, wid in enumerate([0, 2]) if wid in pushed_to]
    for batch in batches:
        versions = batch["next", "policy_version"][pushed]  # the pushed actors' shares
        assert torch.equal(versions, torch.full_like(versions, version))


class _InterruptedBuffer(ReplayBuffer):
    """A buffer whose ``at_call``-th ``extend`` is cut by a Ctrl-C (it stores nothing)."""

    def __init__(self, at_call: int) -> None:
        super().__init__(storage=LazyTensorStorage(10_000))
        self.calls, self.at_call = 0, at_call

    def extend(self, data, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at_call:
            raise KeyboardInterrupt
        return super().extend(data, *args, **kwargs)


@pytest.mark.parametrize("at_call", [3, 5], ids=["a-middle-round", "the-last-round"])
def test_an_interrupt_while_a_round_is_stored_loses_the_cut_part_only(fleet, at_call: int) -> None:
    """Ctrl-C in ``extend()`` of an actor's part: the round's other part is stored by the
    next ``next()``, before its own round, or alone by the one that ends the collection."""
    rb = _InterruptedBuffer(at_call)
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=24, sync=True, replay_buffer=rb
    ) as collector:
        interrupts = 0
        while True:
            try:
                if collector.next() is None and collector.stats()["completed"]:
                    break
            except KeyboardInterrupt:
                interrupts += 1
        frames = collector.stats()["frames"]
    assert (interrupts, rb.calls, frames) == (1, 6, 24)
    assert len(rb) == 10  # 5 of the 6 parts of [2 envs, 2 steps]: the cut one is missing
    workers = rb[:]["collector", "worker_id"][:, 0].tolist()
    assert (workers.count(0), workers.count(2)) == (4, 6)


def test_an_interrupt_during_shutdown_is_raised_once_everything_is_closed(
    fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    close = _wiring.Parts.close

    def slow_close(parts, timeout):
        time.sleep(0.5)  # the Ctrl-C lands meanwhile
        close(parts, timeout)

    monkeypatch.setattr(_wiring.Parts, "close", slow_close)
    collector = GrpcCollector(addresses(fleet, 0), frames_per_batch=4, sync=True)
    collector.next()
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        collector.shutdown()
    time.sleep(0.1)  # the close thread's last instructions after it says it has closed
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rlfleet-")]
    collector.shutdown()  # closed: nothing more to do
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, sync=True) as again:
        assert again.next().numel() == 4  # the actor's session was ended, not left held


def test_a_collector_shut_down_while_the_interpreter_exits_lets_it_exit(fleet) -> None:
    """A generator owning its collector (``with ... : yield from``) left unfinished: Python
    closes it at exit, and ``shutdown()`` runs then (it once waited for a thread forever)."""
    script = (
        "import sys\n"
        "from learner_client import GrpcCollector\n"
        "def batches(address):\n"
        "    with GrpcCollector([address], frames_per_batch=4, total_frames=-1) as c:\n"
        "        yield from c\n"
        "stream = batches(sys.argv[1])\n"
        "next(stream)\n"
        "print('end of script', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, fleet[0].address],
        capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "end of script" in done.stdout


_FORKING_SCRIPT = """
import json, os, sys, time
from learner_client import GrpcCollector, LocalFleet
with LocalFleet(1, "CartPole-v1", num_envs=2) as fleet, GrpcCollector(
    fleet, frames_per_batch=4, sync=True
) as collector:
    collector.next()
    start = time.monotonic()
    child = os.fork()
    if child == 0:  # a worker leaving the blocks it inherited, as a script's end does
        sys.exit(0)
    os.waitpid(child, 0)
    child_s = time.monotonic() - start
    after = collector.next()
    print(json.dumps({"child_s": child_s, "alive": fleet.is_alive(0), "frames": after.numel()}))
"""


def _outcome_of(script: str) -> dict:
    """Run ``script`` in a fresh interpreter (no gRPC thread of pytest's to fork); its JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {"stderr": done.stderr[-3000:], **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.mark.long  # an actor process of its own
def test_a_forked_child_leaving_the_collector_and_fleet_closes_neither() -> None:
    # The child ran the teardown: it waited ~26 s on the parent's sessions and could stop
    # the parent's actors (LocalFleet's processes, its shared-memory segments).
    outcome = _outcome_of(_FORKING_SCRIPT)
    assert outcome["child_s"] < 5, outcome["stderr"]
    assert outcome["alive"]
    assert outcome["frames"] == 4  # the parent's collector goes on


_STARTED_IN_A_CHILD = """
import json, os, sys
from learner_client import LocalFleet
fleet = LocalFleet(1, "CartPole-v1", num_envs=2)
child = os.fork()
if child == 0:  # the fleet is built here but started in the child: its actors are the child's
    with fleet:
        pid = fleet.pids[0]
    print(json.dumps({"stopped": not os.path.exists(f"/proc/{pid}")}), flush=True)  # reaped
    os._exit(0)
os.waitpid(child, 0)
"""


@pytest.mark.long  # an actor process of its own
def test_a_fleet_started_in_a_forked_child_is_stopped_by_that_child() -> None:
    outcome = _outcome_of(_STARTED_IN_A_CHILD)
    assert outcome["stopped"], outcome["stderr"]


def test_shutdown_from_the_background_threads_replay_buffer_returns_at_once(fleet) -> None:
    """A buffer that ends the collection from inside ``extend`` (a budget of its own)."""
    took: list[float] = []

    class Stopping(ReplayBuffer):
        def extend(self, data, *args, **kwargs):
            if not took:
                started = time.monotonic()
                collector.shutdown()  # on the background thread that stores this batch
                took.append(time.monotonic() - started)
            return super().extend(data, *args, **kwargs)

    collector = GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, sync=True,
        replay_buffer=Stopping(storage=LazyTensorStorage(100)),
    )  # fmt: skip
    collector.start()
    assert poll_until(lambda: bool(took), timeout=30)
    assert took[0] < 3.0  # it used to wait its whole timeout to join its own thread
    collector.shutdown()


def test_threads_sharing_next_each_store_their_own_rounds_parts() -> None:
    """A None from ``next()`` means that round is in the buffer, also beside other threads."""

    class Gated:
        def __init__(self) -> None:
            self.stored: list[str] = []
            self.first_started, self.other_done = threading.Event(), threading.Event()

        def extend(self, part) -> None:
            if part["who"] == "a1":
                self.first_started.set()
                assert self.other_done.wait(10)  # the other thread delivers meanwhile
            self.stored.append(part["who"])

    def part(who: str) -> TensorDict:
        return TensorDict({"who": NonTensorData(who)})

    handover, buffer = Handover(), Gated()
    first = threading.Thread(target=handover.deliver, args=([part("a1"), part("a2")], buffer, None))
    first.start()
    assert buffer.first_started.wait(10)
    handover.deliver([part("b1"), part("b2")], buffer, None)
    assert buffer.stored == ["b1", "b2"]  # this thread's round, and nothing of the other's
    buffer.other_done.set()
    first.join(10)
    assert buffer.stored == ["b1", "b2", "a1", "a2"]


def test_next_from_the_thread_holding_pause_raises_while_background_collection_runs(
    fleet,
) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, sync=True, replay_buffer=rb
    ) as collector:
        collector.start()
        time.sleep(0.5)
        outcome: list[BaseException] = []

        def paused_next() -> None:
            with collector.pause():
                try:
                    collector.next()
                except RuntimeError as exc:
                    outcome.append(exc)

        thread = threading.Thread(target=paused_next, daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), "next() inside pause() hung (it waited holding the turn)"
        assert [str(e) for e in outcome] == [
            "cannot collect inside pause() from the thread that paused"
        ]
        held = len(rb)
        time.sleep(0.5)
        assert len(rb) > held  # collection went on after the pause


def test_parts_an_interrupt_left_are_stored_before_the_next_takes_round() -> None:
    """Ctrl-C cuts the first part of a round: the round's other parts are stored by the next
    take, before that take's own round (the buffer keeps the order the batches came in)."""

    class CutOnce:
        def __init__(self) -> None:
            self.stored: list[str] = []
            self.calls = 0

        def extend(self, part) -> None:
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt
            self.stored.append(part["who"])

    def part(who: str) -> TensorDict:
        return TensorDict({"who": NonTensorData(who)})

    handover, buffer = Handover(), CutOnce()
    with pytest.raises(KeyboardInterrupt):
        handover.deliver([part("a1"), part("a2"), part("a3")], buffer, None)
    assert buffer.stored == []
    assert handover.deliver([part("b1"), part("b2")], buffer, None) is None
    assert buffer.stored == ["a2", "a3", "b1", "b2"]


def test_a_start_a_shutdown_overtakes_raises_closed_error_and_starts_no_thread(
    fleet, monkeypatch
) -> None:
    """start() on one thread checks the collector open, a shutdown() on another closes it
    before the thread starts: start() raises ClosedError (it started a thread on the closed
    collector, which failed at once and left an error in stats)."""
    collector = GrpcCollector(
        addresses(fleet, 0),
        frames_per_batch=4,
        replay_buffer=ReplayBuffer(storage=LazyTensorStorage(100)),
    )
    checked, release = threading.Event(), threading.Event()
    start = collector._background.start

    def held_after_the_check() -> None:
        checked.set()
        release.wait(30)
        start()

    monkeypatch.setattr(collector._background, "start", held_after_the_check)
    outcome: list[BaseException | None] = []

    def starting() -> None:
        try:
            collector.start()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=starting)
    thread.start()
    try:
        assert checked.wait(30)
        collector.shutdown()
    finally:
        release.set()
        thread.join(30)
    assert isinstance(outcome[0], ClosedError), outcome
    time.sleep(0.3)  # a thread started on the closed collector would fail meanwhile
    assert not collector.is_running()
    assert collector.stats()["background_failed"] is False


def test_a_first_next_a_shutdown_overtakes_raises_closed_error_and_leaves_it_closed(
    fleet, monkeypatch
) -> None:
    """The first next() opens the sessions under the lock; a shutdown(timeout=0.5) on another
    thread gives up waiting for it and closes: next() raises ClosedError and the collector
    stays closed (next() marked it running over the shutdown, and pause() was then taken)."""
    collector = GrpcCollector(addresses(fleet, 0), frames_per_batch=4)
    opening, go_open, closing, go_close = (threading.Event() for _ in range(4))
    update_budget, close = collector._rounds.update_budget, Background.close

    def held_opening() -> None:  # next() checked the collector READY and holds the lock
        opening.set()
        assert go_open.wait(30)
        update_budget()

    def held_closing(self: Background) -> None:  # the shutdown marked it closed
        closing.set()
        assert go_close.wait(30)
        close(self)

    monkeypatch.setattr(collector._rounds, "update_budget", held_opening)
    monkeypatch.setattr(Background, "close", held_closing)
    outcome: list[object] = []
    taking = threading.Thread(target=lambda: outcome.append(_result_of(collector.next)))
    closer = threading.Thread(target=collector.shutdown, kwargs={"timeout": 0.5})
    try:
        taking.start()
        assert opening.wait(30)
        closer.start()
        assert closing.wait(30)
        go_open.set()
        taking.join(30)
    finally:
        go_open.set()
        go_close.set()
        closer.join(30)
        taking.join(30)
    assert isinstance(outcome[0], ClosedError), outcome
    assert "state=closed" in repr(collector)
    with pytest.raises(ClosedError):
        collector.pause()


def _result_of(call: Callable[[], object]) -> object:
    """``call()``'s result, or the exception it raised."""
    try:
        return call()
    except BaseException as exc:
        return exc


def test_start_while_the_thread_a_pause_stopped_still_stores_raises_until_it_ended(fleet) -> None:
    """pause(resume=False) timed out on a slow extend(): the thread stores that batch, then
    ends. A start() meanwhile raises (it returned as if collecting, and nothing collected once
    the thread ended); once it ended, start() collects again."""
    rb = StuckBuffer()
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        assert rb.entered.wait(30)
        with pytest.raises(TimeoutError), collector.pause(0.5, resume=False):
            pass
        with pytest.raises(RuntimeError, match="still storing its last batch"):
            collector.start()
        rb.release.set()
        poll_until(lambda: not collector.is_running(), timeout=30, message="the thread ends")
        held = len(rb.inner)
        collector.start()
        poll_until(lambda: len(rb.inner) > held, timeout=30, message="collection started again")
        assert collector.stats()["background_failed"] is False


@pytest.mark.parametrize("raised", [RuntimeError, ValueError])
def test_background_failed_counts_an_extend_that_raised_while_shutdown_stopped_the_thread(
    fleet, raised: type[Exception]
) -> None:
    """A user's ``extend`` raising while ``shutdown()`` stops the thread lost that batch:
    ``stats()`` reports it whatever the error's type (a RuntimeError passed for the
    collector's own end and was dropped)."""
    entered, release = threading.Event(), threading.Event()

    class Failing:
        def extend(self, data):
            entered.set()
            release.wait(30)
            raise raised("disk full")

    collector = GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=Failing())
    collector.start()
    assert entered.wait(30)
    closer = threading.Thread(target=collector.shutdown)
    closer.start()
    try:
        assert poll_until(lambda: collector._background._stop.is_set(), timeout=30)
    finally:
        release.set()
        closer.join(30)
    assert collector.stats()["background_failed"] is True
    assert collector._background.error == f"{raised.__name__}: disk full"


_SHUT_DOWN_IN_A_HANDLER = """
import json, signal, sys, threading, time
from learner_fleet import cartpole_policy
from torchrl.data import LazyTensorStorage, ReplayBuffer
from learner_client import GrpcCollector
address, mode = sys.argv[1:]
policy = cartpole_policy()
collector = GrpcCollector(
    [address], frames_per_batch=4, sync=True, policy=policy,
    replay_buffer=ReplayBuffer(storage=LazyTensorStorage(1000)),
)
# Where a lock the close takes is held: start() waiting for its thread to start, a push
# handing its call over to the event loop.
inside = {"start": threading.Thread.start.__code__, "push": "run_coroutine_threadsafe"}[mode]
closed, raised = [], None

def handler(signum, frame):
    while frame is not None and inside not in (frame.f_code, frame.f_code.co_name):
        frame = frame.f_back
    if frame is not None and not closed:
        signal.setitimer(signal.ITIMER_REAL, 0)
        started = time.monotonic()
        collector.shutdown(timeout=5)
        closed.append(time.monotonic() - started)

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
try:
    while not closed:
        if mode == "start":
            collector.start()
            with collector.pause(None, resume=False):
                pass
        else:
            collector.update_policy_weights_(policy)
except Exception as exc:
    raised = type(exc).__name__
print(json.dumps({"closed_s": closed[0], "raised": raised}), flush=True)
"""


@pytest.mark.long  # an interpreter of its own
@pytest.mark.parametrize("mode", ["start", "push"])
def test_shutdown_from_a_signal_handler_interrupting_start_or_a_push_closes(fleet, mode) -> None:
    """A SIGTERM handler calling ``shutdown()`` runs on the main thread, which may hold a lock
    the close takes (start() waiting for its thread, a push handing its call to the loop):
    the close waited for it forever."""
    tests = ROOT / "tests"
    path = os.pathsep.join([str(ROOT), str(tests / "learner_client"), str(tests)])
    done = subprocess.run(
        [sys.executable, "-c", _SHUT_DOWN_IN_A_HANDLER, fleet[0].address, mode],
        capture_output=True, text=True, timeout=90, env=os.environ | {"PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["closed_s"] < 10
    assert outcome["raised"] == "ClosedError"  # the interrupted call, once the close ended
