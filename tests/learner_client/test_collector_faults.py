"""GrpcCollector under faults: SIGKILLed actors, broken streams, shutdown with a dead actor.

These tests kill their own two actors (worker_ids 0 and 1) and restart them
on the same ports, so they do not share the session fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from helpers import ActorProcess, poll_until, start_actor
from learner_fleet import cartpole_policy, live_threads, start_actors
from tcp_proxy import FaultProxy

from common.config import CHUNK_BYTES
from common.errors import ActorUnavailableError, AuthenticationError, ClosedError, DeadlineError
from learner_client import GrpcCollector, MissingWorkersError, WeightPushError
from learner_client._collect_stream import CollectStream, SessionInfo

TOKEN = "s3cret-learner-token"
ARGS = [
    ["--worker-id", "0", "--num-envs", "2", "--token", TOKEN],
    ["--worker-id", "1", "--num-envs", "2", "--token", TOKEN],
]


@pytest.fixture(scope="module")
def actors() -> Iterator[list[ActorProcess]]:
    """Two actors for the module; tests kill them at will."""
    started = start_actors(ARGS)
    yield started
    for actor in started:
        actor.close()


@pytest.fixture
def pair(actors: list[ActorProcess]) -> list[ActorProcess]:
    """The two actors, with any that a previous test killed started again."""
    for index, actor in enumerate(actors):
        if actor.process.poll() is not None:
            restart(actors, index)
    return actors


def failed_sessions(collector: GrpcCollector, worker_id: int = 1) -> int:
    """Sessions and connection attempts of ``worker_id`` that failed so far."""
    return int(collector.stats(workers="per_worker")[f"worker_{worker_id}/failures"])


def restart(actors: list[ActorProcess], index: int) -> None:
    """Start a killed actor again on its port (a new process: a new epoch)."""
    port = actors[index].port
    actors[index].close()
    actors[index] = start_actor([*ARGS[index], "--port", str(port)])


def worker_of(batch) -> int:
    return int(batch["collector", "worker_id"].flatten()[0])


def drain(collector: GrpcCollector, count: int) -> None:
    for _ in range(count):
        collector.next()


def next_from(collector: GrpcCollector, worker_id: int, timeout: float):
    """The first batch from ``worker_id`` (others keep flowing meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = collector.next()
        if worker_of(batch) == worker_id:
            return batch
    raise AssertionError(f"no batch from worker_id {worker_id} within {timeout} s")


@pytest.mark.slow
def test_async_survives_a_sigkill_and_readmits_the_actor_with_current_weights(pair):
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=4, batch_timeout=20, token=TOKEN
    )
    try:
        version = collector.update_policy_weights_(cartpole_policy())[0]
        for _ in range(4):
            collector.next()
        pair[1].kill()
        poll_until(
            lambda: worker_of(collector.next()) == 0 and collector.worker_states[1] == "down",
            timeout=20,
            message="worker_id 1 reported down while 0 keeps flowing",
        )
        assert all(worker_of(collector.next()) == 0 for _ in range(5))
        stats = collector.stats()
        assert collector.stats(workers="per_worker")["worker_1/failures"] >= 1
        assert stats["workers_alive"] == 1

        with pytest.raises(WeightPushError) as info:
            collector.update_policy_weights_(cartpole_policy())
        assert info.value.succeeded == {0: version + 1}
        assert isinstance(info.value.failed[1], ActorUnavailableError)

        restart(pair, 1)
        batch = next_from(collector, 1, timeout=30)
        # The restarted process got the current weights before any of its data was used.
        assert bool((batch["policy_version"] == version + 1).all())
        stats = collector.stats()
        assert stats["reconnects"] >= 1
        assert stats["workers_alive"] == 2
        assert stats["duplicates"] == 0
    finally:
        collector.shutdown(timeout=5)


def test_sync_raises_naming_a_dead_worker_then_partial_batches_proceed(pair):
    addresses = [a.address for a in pair]
    strict = GrpcCollector(addresses, frames_per_batch=8, sync=True, batch_timeout=30, token=TOKEN)
    # Built while both actors are up; its sessions open at its first batch.
    partial = GrpcCollector(
        addresses,
        frames_per_batch=8,
        sync=True,
        batch_timeout=30,
        allow_partial_batches=True,
        token=TOKEN,
    )
    try:
        strict.next()
        pair[1].kill()
        start = time.monotonic()
        with pytest.raises(MissingWorkersError, match=r"worker_ids \[1\]") as info:
            drain(strict, 5)  # batches already buffered may still complete a round or two
        assert info.value.worker_ids == [1]
        assert isinstance(info.value, ActorUnavailableError)
        assert time.monotonic() - start < 15  # a dead actor fails the round fast
        strict.shutdown(timeout=5)  # an actor serves one learner at a time

        batch = partial.next()
        assert batch.batch_size == torch.Size([1, 2, 2])
        assert batch["collector", "worker_id"].unique().tolist() == [0]
        assert partial.missing_workers == [1]
        assert partial.stats()["missing_workers"] == 1
        assert partial.stats(workers="per_worker")["worker_1/missing"] is True
    finally:
        strict.shutdown(timeout=5)
        partial.shutdown(timeout=5)


@pytest.mark.long
def test_sync_retried_while_an_actor_is_down_waits_for_it_and_names_it_alone(pair):
    """After a push the dead actor missed, the live actor is not named, and retries do not spin."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=8, sync=True, batch_timeout=2, token=TOKEN
    )
    try:
        collector.next()
        pair[1].kill()
        with pytest.raises(MissingWorkersError, match=r"worker_ids \[1\] are down"):
            drain(collector, 5)
        with pytest.raises(WeightPushError):
            collector.update_policy_weights_(cartpole_policy())
        raised, started = 0, time.monotonic()
        while time.monotonic() - started < 5:  # a script that catches and retries at once
            with pytest.raises(MissingWorkersError, match=r"are down") as info:
                collector.next()
            assert info.value.worker_ids == [1]
            raised += 1
        assert raised <= 4, f"{raised} raises in 5 s: each retry should wait batch_timeout"
        restart(pair, 1)
        (batch,) = poll_until(lambda: _next_or_none(collector), timeout=60)
        assert sorted(batch["collector", "worker_id"].unique().tolist()) == [0, 1]
    finally:
        collector.shutdown(timeout=5)


def _next_or_none(collector: GrpcCollector) -> list | None:
    try:
        return [collector.next()]
    except MissingWorkersError:
        return None


@pytest.mark.long  # restarts an actor: 4-8 s
def test_a_push_applied_after_the_catch_up_described_the_actor_is_still_what_it_should_hold(
    pair,
) -> None:
    """An outage can hold a push back until after the learner's catch-up described the
    actor (it reported the older version); the catch-up's re-send is then refused as stale,
    the actor holding it already. The learner still knows what that actor should hold: a
    sync round counts no frame of older weights, and the actor, restarted, is given it."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=8, sync=True, batch_timeout=30, token=TOKEN
    )
    try:
        collector.update_policy_weights_(cartpole_policy(action=0))
        version = collector.update_policy_weights_(cartpole_policy(action=1))[1]
        link = collector._fleet.member_links()[1]
        described_before = dataclasses.replace(link.description, models={"policy": version - 1})
        collector._fleet.loop.run(collector._pusher.admit(link, described_before), 30)
        assert collector._parts.book.should_hold(1, "policy") == version
        restart(pair, 1)  # a new process, with its initial weights (version 0)
        batch = collector.next()  # the returning actor is re-admitted before its frames count
        versions = sorted(set(batch["policy_version"].flatten().tolist()))
        assert versions == [version], f"policy versions in the batch: {versions}"
        assert collector.actor_state(1)["models"]["policy"]["version"] == version
    finally:
        collector.shutdown(timeout=5)


@pytest.mark.long
def test_an_automatic_push_recorded_after_a_newer_push_leaves_the_newer_as_what_it_should_hold(
    pair, monkeypatch
) -> None:
    """An automatic push (made by a thread taking batches, outside the collector's lock) is
    applied, then a newer push from another thread; the automatic push's verdict is recorded
    last. The learner still knows the actor holds, and should hold, the newer version: a sync
    round counts no frame of the older weights, and the actor, restarted, is given the newer."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=8, sync=True, batch_timeout=30, token=TOKEN
    )
    pusher, book = collector._pusher, collector._parts.book
    record, applied, go_on = pusher._record, threading.Event(), threading.Event()

    def record_late(worker_id, enc, reply) -> None:
        if threading.current_thread().name == "taker":
            applied.set()
            assert go_on.wait(30)
        record(worker_id, enc, reply)

    try:
        collector.update_policy_weights_(cartpole_policy(action=0))
        book.count_batch(1)  # worker 1 delivered a batch: its automatic push is due
        monkeypatch.setattr(pusher, "_record", record_late)
        taker = threading.Thread(target=pusher.auto_update, args=([1], 0), name="taker")
        taker.start()
        assert applied.wait(30)
        version = collector.update_policy_weights_(cartpole_policy(action=1))[1]
        go_on.set()
        taker.join(30)
        assert book.applied(1)["policy"] == version
        assert book.should_hold(1, "policy") == version
        restart(pair, 1)  # a new process, with its initial weights (version 0)
        batch = collector.next()  # the returning actor is re-admitted before its frames count
        versions = sorted(set(batch["policy_version"].flatten().tolist()))
        assert versions == [version], f"policy versions in the batch: {versions}"
    finally:
        go_on.set()
        collector.shutdown(timeout=5)


@pytest.mark.long  # restarts an actor: 4-8 s
def test_a_reply_recorded_after_its_actor_restarted_is_not_taken_for_what_the_new_one_holds(
    pair, monkeypatch
) -> None:
    """An actor applies a push and dies; the learner admits the restarted process (re-sending
    the version before, all it knew of) before recording the dead process's reply. That reply
    is not what the new process holds: the learner sends it the push."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=4, batch_timeout=30, token=TOKEN
    )
    pusher, book = collector._pusher, collector._parts.book
    record, replied, go_on = pusher._record, threading.Event(), threading.Event()

    def record_late(worker_id, enc, reply) -> None:
        if worker_id == 1 and threading.current_thread().name == "pushing":
            replied.set()
            assert go_on.wait(30)
        record(worker_id, enc, reply)

    try:
        before = collector.update_policy_weights_(cartpole_policy(action=0))[1]
        next_from(collector, 1, timeout=30)  # the sessions are open
        link = collector._fleet.member_links()[1]
        first = link.description.epoch
        monkeypatch.setattr(pusher, "_record", record_late)
        out: list = []
        pushing = threading.Thread(
            target=_push_into, args=(collector, cartpole_policy(action=1), out), name="pushing"
        )
        pushing.start()
        assert replied.wait(30)  # the push was applied by worker 1; its reply waits
        restart(pair, 1)  # a new process, with its initial weights (version 0)
        poll_until(lambda: link.description.epoch != first, 30, message="no re-admission")
        poll_until(lambda: book.applied(1).get("policy") == before, 30, message="not re-sent")
        go_on.set()
        pushing.join(30)
        version = out[0][1]
        assert version == before + 1
        poll_until(
            lambda: collector.actor_state(1)["models"]["policy"]["version"] == version,
            30,
            message="the new process was never given the push its predecessor applied",
        )
        assert book.applied(1)["policy"] == version
    finally:
        go_on.set()
        collector.shutdown(timeout=5)


@pytest.mark.long
def test_an_actor_restarted_between_its_admission_and_its_session_is_admitted_again(pair):
    """The actor restarts after the learner re-sent it its weights but before its session
    opened: the session opens on a process that was never given them. The learner admits
    that process too, so its frames act with the pushed version, not its initial weights."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=4, batch_timeout=30, token=TOKEN
    )
    admitted, go_on = threading.Event(), threading.Event()
    try:
        version = collector.update_policy_weights_(cartpole_policy(action=1))[1]
        next_from(collector, 1, timeout=30)
        link = collector._fleet.member_links()[1]
        admit, first = link._admit, link.description.epoch

        async def admit_then_wait(link, desc) -> None:
            await admit(link, desc)
            if desc.epoch != first and not admitted.is_set():
                admitted.set()
                await asyncio.to_thread(go_on.wait, 30)

        link._admit = admit_then_wait
        restart(pair, 1)
        assert admitted.wait(30)
        restart(pair, 1)  # once more, before the session of the admitted process opened
        go_on.set()
        batch = next_from(collector, 1, timeout=30)
        versions = sorted(set(batch["policy_version"].flatten().tolist()))
        assert versions == [version], f"policy versions in the batch: {versions}"
        assert collector.actor_state(1)["models"]["policy"]["version"] == version
    finally:
        go_on.set()
        collector.shutdown(timeout=5)


@pytest.mark.long
@pytest.mark.parametrize("taken", ["once-it-opened", "while-it-opens"])
def test_a_batch_of_the_old_process_taken_after_a_restart_acks_nothing_of_the_new_one(
    pair, monkeypatch: pytest.MonkeyPatch, taken: str
):
    """The batch the killed process sent ahead is still buffered when its successor's session
    opens. Taking it (once the session opened, or while the learner waits for its ``opened``)
    acknowledges nothing there: its seq is the old process's. Acked on the new session, it
    would release batches of the new process the learner may not hold yet (here it is beyond
    the new one's last seq, which the actor refuses, breaking the session)."""
    opening, go_on = threading.Event(), threading.Event()
    original = CollectStream.opened

    async def opened_held_back(stream: CollectStream, timeout: float) -> SessionInfo:
        if taken == "while-it-opens" and not go_on.is_set():
            opening.set()
            await asyncio.to_thread(go_on.wait, 30)
        return await original(stream, timeout)

    collector = GrpcCollector([pair[1].address], frames_per_batch=4, batch_timeout=30, token=TOKEN)
    try:
        drain(collector, 2)
        poll_until(lambda: collector._mailbox.snapshot()[1].buffered == 1, timeout=10)
        link, failures = collector._fleet.member_links()[1], failed_sessions(collector)
        old_epoch = link.tracker.epoch
        monkeypatch.setattr(CollectStream, "opened", opened_held_back)
        restart(pair, 1)
        if taken == "while-it-opens":
            assert opening.wait(30)
            failures = failed_sessions(collector)
            drain(collector, 1)  # the old process's batch: its ack reaches the opening stream
            poll_until(lambda: not collector._fleet.streams._pending, timeout=5)
            go_on.set()
        poll_until(lambda: link.state.value == "streaming" and link.tracker.epoch != old_epoch, 30)
        if taken == "once-it-opened":
            failures = failed_sessions(collector)
            drain(collector, 1)
        drain(collector, 2)  # the new process's first two batches
        assert failed_sessions(collector) == failures, link.last_failure
        stats = collector.stats(workers="per_worker")
        assert (stats["worker_1/gaps"], stats["worker_1/duplicates"]) == (0, 0)
        assert link.tracker.last >= 2  # the new process's first two batches
    finally:
        go_on.set()
        collector.shutdown(timeout=5)


def test_shutdown_with_a_dead_actor_is_bounded_and_leaves_no_threads(pair):
    with GrpcCollector([pair[0].address], frames_per_batch=4, total_frames=4, token=TOKEN) as warm:
        list(warm)
    baseline = live_threads()
    collector = GrpcCollector([a.address for a in pair], frames_per_batch=4, token=TOKEN)
    try:
        collector.next()
        pair[1].kill()
        poll_until(lambda: collector.worker_states[1] == "down", timeout=20)
        start = time.monotonic()
        collector.shutdown(timeout=3)
        assert time.monotonic() - start < 8
        poll_until(lambda: live_threads() <= baseline, timeout=10, message="threads at baseline")
    finally:
        collector.shutdown(timeout=3)


@contextlib.contextmanager
def _stopped(actor: ActorProcess) -> Iterator[None]:
    """The actor's process stopped (SIGSTOP: a hung host, no reset), continued after."""
    os.kill(actor.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(actor.process.pid, signal.SIGCONT)


def test_connect_timeout_holds_for_a_hung_actor_this_process_is_connected_to(pair):
    """A second collector (another rank's, a restart) to a stopped actor the first one holds a
    connection to: the error came 1 s after connect_timeout, spent asking the actor why."""
    with GrpcCollector([pair[0].address], frames_per_batch=4, token=TOKEN) as held:
        held.next()
        with _stopped(pair[0]):
            for _ in range(2):
                start = time.monotonic()
                with pytest.raises(ActorUnavailableError, match="connected, but the actor did"):
                    GrpcCollector(
                        [pair[0].address], frames_per_batch=4, token=TOKEN, connect_timeout=1.0
                    )
                assert time.monotonic() - start < 1.6


@pytest.mark.parametrize("call", ["set_seed", "state_dict", "push"])
def test_a_control_call_to_a_hung_actor_names_the_deadline_it_ran_out_of(pair, call: str):
    """A hung actor's control call ends at ``call_timeout`` with a DeadlineError that says
    so (gRPC's own words were "DEADLINE_EXCEEDED: Stream removed"); a push's error quotes it."""
    with GrpcCollector(
        [pair[0].address], frames_per_batch=4, token=TOKEN, call_timeout=1.5
    ) as collector:
        collector.next()
        calls: dict[str, tuple[Callable[[], object], type[Exception]]] = {
            "set_seed": (lambda: collector.set_seed(7), DeadlineError),
            "state_dict": (collector.state_dict, DeadlineError),
            "push": (lambda: collector.update_policy_weights_(cartpole_policy()), WeightPushError),
        }
        method, error = calls[call]
        with _stopped(pair[0]), pytest.raises(error, match=r"deadline of 1\.5 s"):
            method()


@pytest.mark.parametrize("call", ["state_dict", "load_state_dict", "set_seed"])
def test_a_control_call_to_a_hung_actor_names_its_worker_id_and_address(pair, call: str):
    """Its errors named the actor by address alone (set_seed's still did), where every other
    error names both."""
    with GrpcCollector(
        [pair[0].address], frames_per_batch=4, token=TOKEN, call_timeout=1.0
    ) as collector:
        collector.next()
        state, (worker_id,) = collector.state_dict(), collector.worker_ids
        calls: dict[str, Callable[[], object]] = {
            "state_dict": collector.state_dict,
            "load_state_dict": lambda: collector.load_state_dict(state),
            "set_seed": lambda: collector.set_seed(7),
        }
        named = rf"^{pair[0].address} \(worker_id {worker_id}\): DEADLINE_EXCEEDED"
        with _stopped(pair[0]), pytest.raises(DeadlineError, match=named):
            calls[call]()


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_shutdown_during_a_push_to_a_hung_actor_keeps_its_bound_and_the_push_says_closed(pair):
    """A watchdog's shutdown(timeout=2) while the training thread pushes to a hung actor: it
    waited for the push's whole call_timeout (31 s), now ~2 s per phase; the push ends with
    ClosedError."""
    collector = GrpcCollector([a.address for a in pair], frames_per_batch=8, token=TOKEN)
    policy, pushed = cartpole_policy(), []
    try:
        collector.next()
        with _stopped(pair[0]):
            pusher = threading.Thread(target=_push_into, args=(collector, policy, pushed))
            pusher.start()
            time.sleep(1.0)  # the push waits on the hung actor
            start = time.monotonic()
            collector.shutdown(timeout=2)
            assert time.monotonic() - start < 8
            pusher.join(10)
        assert isinstance(pushed[0], ClosedError)
    finally:
        collector.shutdown(timeout=2)


def _push_into(collector: GrpcCollector, policy: torch.nn.Module, out: list) -> None:
    _call_into(lambda: collector.update_policy_weights_(policy), out)


def _call_into(call: Callable[[], object], out: list) -> None:
    try:
        out.append(call())
    except Exception as exc:
        out.append(exc)


def _assert_cut_off_by_shutdown(collector: GrpcCollector, call: Callable[[], object]) -> None:
    """``call`` on another thread waits (a hung actor); a shutdown ends it with ClosedError."""
    out: list = []
    thread = threading.Thread(target=_call_into, args=(call, out))
    thread.start()
    time.sleep(1.0)  # the call waits on the hung actor
    collector.shutdown(timeout=2)
    thread.join(10)
    assert isinstance(out[0], ClosedError), out


@pytest.mark.parametrize("call", ["next", "set_seed", "state_dict"])
@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_a_call_a_shutdown_cuts_off_raises_closed_error(pair, call: str) -> None:
    """next() pushing policy=, set_seed and state_dict wait on a hung actor; a shutdown from
    another thread ends them with ClosedError (a bare CancelledError, or a WeightPushError
    with no reason, after the shutdown stopped waiting for them)."""
    collector = GrpcCollector(
        [a.address for a in pair], frames_per_batch=8, policy=cartpole_policy(), token=TOKEN
    )
    try:
        collector.next()
        calls = {"next": collector.next, "set_seed": lambda: collector.set_seed(3)}
        with _stopped(pair[0]):
            if call == "next":  # the policy changed: the next batch pushes it first
                torch.nn.init.zeros_(next(collector.policy.parameters()))
            _assert_cut_off_by_shutdown(collector, calls.get(call, collector.state_dict))
    finally:
        collector.shutdown(timeout=2)


@pytest.mark.long  # 5 s
def test_a_next_whose_automatic_push_a_shutdown_cuts_off_raises_closed_error(pair) -> None:
    """update_after_each_batch: next() on another thread pushes the last weights before its
    round and waits on a hung actor; a shutdown ends it with ClosedError (it raised a
    WeightPushError with no reason, the push cut off by the closing loop)."""
    collector = GrpcCollector(
        [a.address for a in pair],
        frames_per_batch=8,
        sync=True,
        update_after_each_batch=True,
        token=TOKEN,
    )
    try:
        collector.update_policy_weights_(cartpole_policy())
        collector.next()
        with _stopped(pair[0]):  # the automatic push waits on the hung actor
            _assert_cut_off_by_shutdown(collector, collector.next)
    finally:
        collector.shutdown(timeout=2)


def test_an_add_collectors_a_shutdown_cuts_off_raises_closed_error(pair) -> None:
    """add_collectors() on another thread waits for an address that accepts connections and
    never answers; a shutdown ends it with ClosedError (a bare CancelledError before)."""
    silent = socket.socket()  # listens: the kernel takes the connection, nothing answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    collector = GrpcCollector([pair[0].address], frames_per_batch=4, token=TOKEN)
    try:  # the Describe waits on the silent address
        _assert_cut_off_by_shutdown(collector, lambda: collector.add_collectors([address]))
    finally:
        collector.shutdown(timeout=2)
        silent.close()


def test_a_shutdown_from_the_replay_buffer_thread_does_not_stall_the_first_one(pair) -> None:
    """The buffer's extend() calls shutdown() while the main thread's close joins it: both
    return at once (the second waited for the first, which waited for it: 5 s)."""
    inside, collector = threading.Event(), None

    class Buffer:
        def extend(self, data: object) -> None:
            if not inside.is_set():
                inside.set()
                time.sleep(0.5)  # the main thread's shutdown starts meanwhile
                collector.shutdown()  # "enough frames": stop from the storing thread

    collector = GrpcCollector(
        [pair[0].address], frames_per_batch=8, replay_buffer=Buffer(), token=TOKEN
    )
    try:
        collector.start()
        assert inside.wait(30)
        start = time.monotonic()
        collector.shutdown(timeout=5)
        assert time.monotonic() - start < 3
    finally:
        collector.shutdown(timeout=5)


def test_a_second_concurrent_shutdown_returns_once_the_first_has_closed_everything(pair):
    with GrpcCollector([pair[0].address], frames_per_batch=4, total_frames=4, token=TOKEN) as warm:
        list(warm)
    baseline = live_threads()
    collector = GrpcCollector([a.address for a in pair], frames_per_batch=8, token=TOKEN)
    collector.next()
    with _stopped(pair[0]):  # the close waits its phase bound on the hung actor
        first = threading.Thread(target=collector.shutdown, kwargs={"timeout": 3})
        first.start()
        time.sleep(0.3)
        collector.shutdown(timeout=3)  # returned at once, the first still closing
        assert live_threads() - {first} <= baseline  # the loop thread, rlfleet-learner
    first.join()


def test_collector_raises_if_the_token_is_missing_or_wrong(actors):
    with pytest.raises(AuthenticationError, match=actors[0].address):
        GrpcCollector([actors[0].address], frames_per_batch=4)
    with pytest.raises(AuthenticationError, match="UNAUTHENTICATED"):
        GrpcCollector([actors[0].address], frames_per_batch=4, token="wrong")


@pytest.mark.slow
def test_collector_reassembles_multi_chunk_batches(actors):
    # ~94 bytes per CartPole frame: 36000 frames span two 3 MiB chunks and decode off the loop.
    with GrpcCollector(
        [actors[0].address], frames_per_batch=36_000, total_frames=36_000, token=TOKEN
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size([2, 18_000])
    assert sum(t.numel() * t.element_size() for t in batch.values(True, True)) > CHUNK_BYTES
    assert bool((batch["collector", "worker_id"] == 0).all())
    assert bool(torch.isfinite(batch["next", "observation"]).all())


def test_async_resumes_a_broken_stream_without_duplicates_or_gaps(actors):
    proxy = FaultProxy(("127.0.0.1", actors[0].port))
    collector = GrpcCollector([proxy.address], frames_per_batch=4, batch_timeout=20, token=TOKEN)
    try:
        seen = [collector.next()["observation"].clone() for _ in range(3)]
        for _ in range(3):
            proxy.reset()
            poll_until(lambda: collector.stats()["failures"] >= 1, timeout=10)
            seen += [collector.next()["observation"].clone() for _ in range(3)]
        stats = collector.stats()
        assert stats["reconnects"] >= 1
        assert stats["gaps"] == 0
        # Re-sent batches were dropped: no batch was delivered twice.
        assert not any(torch.equal(a, b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    finally:
        collector.shutdown(timeout=5)
        proxy.close()


def test_a_reconnecting_learner_never_takes_over_another_learners_session(actors):
    proxy = FaultProxy(("127.0.0.1", actors[0].port))
    first = GrpcCollector([proxy.address], frames_per_batch=4, batch_timeout=20, token=TOKEN)
    second = None
    try:
        first.next()
        proxy.refusing = True
        proxy.reset()  # the first learner's link breaks and cannot come back yet
        poll_until(lambda: first.stats()["failures"] >= 1, timeout=10)
        second = GrpcCollector([actors[0].address], frames_per_batch=4, token=TOKEN)
        second.next()
        proxy.refusing = False  # the first learner reconnects and asks to resume
        failures = first.stats()["failures"]
        poll_until(lambda: first.stats()["failures"] >= failures + 2, timeout=45)
        for _ in range(10):  # the second learner keeps its session throughout
            second.next()
        stats = second.stats()
        assert stats["failures"] == 0
        assert stats["reconnects"] == 0
        second.shutdown(timeout=5)
        second = None
        first.next()  # once the actor is free, the first learner gets it back
        opened = [
            line.split("learner=")[1].split()[0]
            for line in actors[0].stderr().splitlines()
            if "session.opened" in line
        ]
        assert len(set(opened[-3:])) == 2, opened  # two learners, two identities
        assert "session.taken_over" not in actors[0].stderr()
    finally:
        for collector in (first, second):
            if collector is not None:
                collector.shutdown(timeout=5)
        proxy.close()


def test_a_learner_resuming_the_session_its_earlier_process_left_open_is_not_stalled(pair):
    """A restarted learner under the same learner_id resumes the session its earlier process
    left open: the batches that one held unacknowledged (``max_credits`` of them, with
    ``prefetch=4``) come again and are dropped as received before. Left unacknowledged, the
    actor started no batch, and the first ``next()`` waited out ``batch_timeout``."""
    address = pair[0].address
    kwargs = dict(frames_per_batch=4, prefetch=4, learner_id="job", batch_timeout=5, token=TOKEN)
    earlier = GrpcCollector([address], **kwargs)
    later = None
    try:
        earlier.next()
        poll_until(lambda: earlier.stats()["queued_batches"] == 4, timeout=20)
        later = GrpcCollector([address], **kwargs)  # the actor still holds the earlier's session
        later.next()
        stats = later.stats()
        assert (stats["duplicates"], stats["failures"]) == (4, 0), stats
    finally:
        for collector in (later, earlier):
            if collector is not None:
                collector.shutdown(timeout=5)


@pytest.mark.long
def test_a_learner_that_trains_longer_than_batch_timeout_keeps_its_stream() -> None:
    # Sync: the actor gets its credit only when the learner asks, after training. The
    # actor's batch (8 steps of 0.1 s) must get the whole batch_timeout from that credit,
    # not what is left of it since the previous batch arrived (which would have fired
    # 0.5 s after the credit and reconnected a healthy stream).
    envs = str(pathlib.Path(__file__).parents[1] / "actor_service")
    slow = ["--env-factory", "rlfleet_test_envs:slow_cartpole", "--env-kwargs", '{"delay": 0.1}']
    with start_actor(["--num-envs", "1", *slow], env={"PYTHONPATH": envs}) as actor:
        collector = GrpcCollector([actor.address], frames_per_batch=8, sync=True, batch_timeout=3)
        try:
            for _ in range(3):
                collector.next()
                time.sleep(2.5)  # "training": nothing is owed meanwhile
            collector.next()
            stats = collector.stats()
            assert (stats["failures"], stats["reconnects"]) == (0, 0)
        finally:
            collector.shutdown(timeout=5)


@pytest.mark.parametrize("sync", [True, False])
def test_an_actor_whose_collection_fails_each_time_is_named_with_its_failure(sync: bool) -> None:
    """A policy that passes the actor's probe step and raises at every batch after it: the
    learner retries, and its MissingWorkersError says what the actor ended the sessions with
    (it said only "sent nothing within batch_timeout")."""
    pytest.importorskip("torchrl")
    from torchrl_harness import torchrl_config

    from actor_service import create_server

    config = torchrl_config("cartpole", "breaks_after_probe_policy")
    with create_server(config).run_in_thread() as actor:
        address = f"127.0.0.1:{actor.port}"
        with GrpcCollector([address], frames_per_batch=4, sync=sync, batch_timeout=3) as c:
            with pytest.raises(MissingWorkersError) as raised:
                c.next()
            assert c.stats()["failures"] >= 1
    message = str(raised.value)
    assert "last failures: worker_id 0: the actor ended the session: ERROR" in message
    assert "collection failed" in message


def test_a_token_on_a_plaintext_channel_off_loopback_is_warned_once(caplog) -> None:
    """A bearer token on a plaintext channel to another host goes in the clear: the learner
    warns once per address, naming the fix and not the token (192.0.2.1 is TEST-NET-1:
    nothing answers there); to a loopback address it does not."""
    caplog.set_level(logging.WARNING, "learner_client")
    loopback = ["127.0.0.1:9", "ipv4:127.0.0.1:9", "ipv6:[::1]:9"]  # the last two were warned
    for address in ["192.0.2.1:50051", "192.0.2.1:50051", *loopback]:
        with pytest.raises(ActorUnavailableError):
            GrpcCollector([address], frames_per_batch=4, token=TOKEN, connect_timeout=0.5)
    warned = [r.getMessage() for r in caplog.records if "in the clear" in r.getMessage()]
    assert len(warned) == 1
    assert "192.0.2.1:50051" in warned[0]
    assert "channel_credentials" in warned[0]
    assert TOKEN not in caplog.text
