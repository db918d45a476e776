"""A collector the user drops, or leaves at exit, without ``shutdown()`` is released.

As TorchRL's collectors shut down in ``__del__``: a failed trial of a sweep, or a
collector a helper built and returned, no longer holds its actors' sessions (the next
collector on the fleet got ``ActorBusyError`` until ``batch_timeout``), its loop thread,
or the fleet it was given (whose actors ran until the learner died, their segments left
in /dev/shm). ``shutdown()`` with the collector still referenced lets the pushed blobs go.
"""

from __future__ import annotations

import gc
import json
import logging
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import gymnasium
import pytest
from helpers import poll_until, process_alive

from common.policies import make_policy
from learner_client import GrpcCollector, LocalFleet

pytestmark = pytest.mark.usefixtures("loopback_only")

ROOT = pathlib.Path(__file__).resolve().parents[2]
HIDDEN = [1024, 1024]  # a 4 MiB policy: its pushes to a local actor go through segments


def _learner_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rlfleet")]


def _segments_mapped() -> int:
    return pathlib.Path("/proc/self/maps").read_text().count("rlfleet-shm")


@pytest.fixture(scope="module")
def fleet():
    with LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0,
                    policy_kwargs={"hidden": HIDDEN}) as fleet:  # fmt: skip
        yield fleet


def _dropped_mid_run(addresses: list[str]) -> weakref.ref[GrpcCollector]:
    collector = GrpcCollector(addresses, frames_per_batch=8, total_frames=80, sync=True)
    collector.next()  # then the trial fails: the collector is never shut down
    return weakref.ref(collector)


def test_a_dropped_collector_frees_its_actors_for_the_next_one_and_its_thread(fleet) -> None:
    dropped = _dropped_mid_run(fleet.addresses)
    gc.collect()
    assert dropped() is None, "something still holds the dropped collector"
    poll_until(lambda: not _learner_threads(), timeout=10, message="the loop thread lives")
    started = time.monotonic()
    with GrpcCollector(fleet.addresses, frames_per_batch=8, total_frames=8, sync=True,
                       batch_timeout=20.0) as collector:  # fmt: skip
        assert len(list(collector)) == 1
    assert time.monotonic() - started < 10  # not a wait for an actor busy with the first


class _FullBuffer:
    def extend(self, batch) -> None:
        raise ValueError("storage full")


def _failed_in_the_background(addresses: list[str]) -> weakref.ref[GrpcCollector]:
    collector = GrpcCollector(addresses, frames_per_batch=8, sync=True, replay_buffer=_FullBuffer())
    collector.start()
    poll_until(lambda: not collector.is_running(), timeout=30, message="the thread runs on")
    assert collector.stats()["background_failed"] is True
    return weakref.ref(collector)


def test_a_collector_whose_background_thread_failed_is_freed_when_dropped(
    fleet, monkeypatch
) -> None:
    # The kept error's frames held the collector: each such trial left its thread, its
    # channel and its actor's session (the next collector on the actor: ActorBusyError).
    # pytest's log capture keeps every record with its traceback (a script's handlers
    # print and let it go): the thread's logged error is kept from it here.
    monkeypatch.setattr(logging.getLogger("learner_client"), "propagate", False)
    dropped = _failed_in_the_background(fleet.addresses)
    gc.collect()
    assert dropped() is None, "something still holds the dropped collector"
    poll_until(lambda: not _learner_threads(), timeout=10, message="the loop thread lives")
    with GrpcCollector(fleet.addresses, frames_per_batch=8, total_frames=8, sync=True,
                       batch_timeout=20.0) as collector:  # fmt: skip
        assert len(list(collector)) == 1


def test_a_dropped_collector_stops_the_fleet_it_was_given() -> None:
    owned = LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0)
    collector = GrpcCollector(owned, frames_per_batch=8, total_frames=80, sync=True)
    collector.next()
    pids = owned.pids
    del collector
    gc.collect()
    poll_until(lambda: not any(map(process_alive, pids)), timeout=15, message=f"{pids} live")


def test_shutdown_lets_the_pushed_blobs_go_while_the_collector_is_referenced(fleet) -> None:
    env = gymnasium.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space, hidden=HIDDEN)
    before = _segments_mapped()
    with GrpcCollector(fleet.addresses, frames_per_batch=8, total_frames=24, sync=True) as c:
        for _ in c:
            c.update_policy_weights_(policy)
        assert c.stats()["shm_pushes"] >= 1
        assert _segments_mapped() > before
    assert _segments_mapped() <= before  # ``c`` is still referenced here
    assert c.stats()["shm_pushes"] >= 1  # its counters still read


_LEFT_AT_EXIT = textwrap.dedent("""
    import json
    from learner_client import GrpcCollector, LocalFleet
    fleet = LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0)
    collector = GrpcCollector(fleet, frames_per_batch=8, total_frames=80, sync=True)
    collector.next()
    print(json.dumps(fleet.pids), flush=True)
    # the script ends without shutdown()
""")


@pytest.mark.long
def test_a_collector_left_at_exit_stops_its_fleet_and_leaves_no_segment() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", _LEFT_AT_EXIT], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (pid,) = json.loads(done.stdout)
    poll_until(lambda: not process_alive(pid), timeout=10, message=f"actor {pid} outlived")
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"rlfleet-shm-{pid}-*")]
    assert not left, left  # the actor drained and removed its batch segments
    assert "Traceback" not in done.stderr, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
