"""Ray's lifetime under several fleets of one process, and under the script's own shutdown.

Each fleet used to shut Ray down on stop if it had started it, under the fleets (and drop-in
collectors) still using it: their next call started a new local Ray, their batches timed out,
their stop raised. As TorchRL's Ray users count theirs, the last to stop shuts Ray down.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import ray_processes_gone, start_local_ray, stop_local_ray

from common.errors import SessionStateError
from learner_client import GrpcCollector, RayFleet
from learner_client._ray_runtime import shut_down_ray_when_unused

pytestmark = pytest.mark.ray


@pytest.fixture
def ray() -> Iterator[Any]:
    """Ray, not initialised: the test's fleets start it (and must stop it)."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    yield ray
    if ray.is_initialized():
        stop_local_ray()


@pytest.fixture
def temp_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live there
    yield path
    ray_processes_gone(path)  # a Ray shut down without waiting: the next test's start races it
    shutil.rmtree(path, ignore_errors=True)


def _fleet(temp_dir: str) -> RayFleet:
    init = {"num_cpus": 2, "_temp_dir": temp_dir, "log_to_driver": False}
    return RayFleet(
        1, num_envs=2, grace_period=1.0, remote_configs={"num_cpus": 0.5}, ray_init_config=init
    )


def test_ray_started_by_one_fleet_stays_up_for_the_others_until_the_last_stops(
    ray: Any, temp_dir: str
) -> None:
    first = start_local_ray(lambda: _fleet(temp_dir).start(), temp_dir)  # initialises Ray
    second = _fleet(temp_dir).start()
    first.stop()
    assert ray.is_initialized()  # the second still uses it
    assert second.is_alive(0)
    with GrpcCollector(second, frames_per_batch=8, total_frames=16, sync=True) as collector:
        assert [batch.numel() for batch in collector] == [8, 8]
    second.stop()
    assert not ray.is_initialized()  # the last one out, and a fleet had started it


def test_a_fleet_under_the_scripts_own_ray_shutdown_stops_without_a_new_ray(
    ray: Any, temp_dir: str
) -> None:
    fleet = start_local_ray(lambda: _fleet(temp_dir).start(), temp_dir)
    ray.shutdown()  # the script's own, before the fleet's stop
    assert fleet.live_addresses() == []
    assert not fleet.is_alive(0)
    with pytest.raises(SessionStateError, match=r"ray\.shutdown"):
        _ = fleet.addresses
    began = time.monotonic()
    fleet.stop()  # used to raise, after starting a new local Ray to call the gone actors
    assert time.monotonic() - began < 5
    assert not ray.is_initialized()


def test_raycollectors_shutdown_ray_stops_ray_once_no_fleet_uses_it(
    ray: Any, temp_dir: str
) -> None:
    """``shutdown(shutdown_ray=True)``, RayCollector's: a TypeError before; now Ray stops, after
    the last fleet still using it."""
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    other = _fleet(temp_dir).start()  # the script started Ray: no fleet would stop it
    collector = GrpcCollector(_fleet(temp_dir), frames_per_batch=8, sync=True)
    assert collector.next().numel() == 8
    collector.shutdown(shutdown_ray=True)
    assert ray.is_initialized()  # the other fleet still uses it
    other.stop()
    assert not ray.is_initialized()


def test_a_fleet_given_shutdown_ray_stops_the_scripts_ray_when_it_stops(
    ray: Any, temp_dir: str
) -> None:
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    config = {"num_cpus": 0.5}
    fleet = RayFleet(1, num_envs=2, grace_period=1.0, remote_configs=config, shutdown_ray=True)
    with fleet:
        assert fleet.is_alive(0)
    assert not ray.is_initialized()  # the script started Ray, but the fleet was asked to stop it


@pytest.mark.long
def test_a_ray_the_script_starts_again_after_shut_down_ray_when_unused_outlives_a_later_fleet(
    ray: Any, temp_dir: str
) -> None:
    """With no fleet using it, ``shutdown_ray`` stops Ray at once; the shutdown asked is then
    done: a Ray the script starts again is its own, never stopped by a plain fleet."""
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    shut_down_ray_when_unused()
    assert not ray.is_initialized()
    ray_processes_gone(temp_dir)
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    with _fleet(temp_dir) as fleet:
        assert fleet.is_alive(0)
    assert ray.is_initialized()  # the script's Ray, which no fleet started nor was asked to stop


@pytest.mark.long
def test_raycollectors_shutdown_ray_stops_ray_when_asked_after_the_collector_shut_down(
    ray: Any, temp_dir: str
) -> None:
    """RayCollector's form shuts itself down at ``total_frames``; the script's own
    ``shutdown(shutdown_ray=True)`` after the loop (TorchRL's stops Ray there) used to return
    as a second shutdown does, leaving the script's Ray up."""
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    collector = GrpcCollector(_fleet(temp_dir), frames_per_batch=8, sync=True)
    assert collector.next().numel() == 8
    collector.shutdown()  # as the form's own shutdown at total_frames
    assert ray.is_initialized()  # the script started Ray: no fleet stops it
    collector.shutdown(shutdown_ray=True)
    assert not ray.is_initialized()


@pytest.mark.long
def test_a_fleet_under_a_ray_the_script_started_again_stops_without_calling_the_gone_actors(
    ray: Any, temp_dir: str
) -> None:
    """After the script's ``ray.shutdown()`` and ``ray.init()`` again, the fleet's actors are
    gone with the first Ray: its stop (the collector's shutdown) used to call them in the new
    one and raise Ray's bare ``Exception`` ("Can't find actor ..."); ``is_alive`` did too."""
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    collector = GrpcCollector(_fleet(temp_dir), frames_per_batch=8, sync=True)
    assert collector.next().numel() == 8
    fleet: Any = collector._owner.fleet  # white-box: the fleet the collector was given
    stop_local_ray()
    ray_processes_gone(temp_dir)
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    assert not fleet.is_alive(0)
    assert fleet.live_addresses() == []
    with pytest.raises(SessionStateError, match=r"ray\.shutdown"):
        _ = fleet.addresses
    collector.shutdown()  # used to raise
    assert ray.is_initialized()  # the script's new Ray: no fleet started it


@pytest.mark.long
def test_a_fleet_that_started_ray_leaves_up_the_ray_the_script_started_again(
    ray: Any, temp_dir: str
) -> None:
    """A fleet that started Ray stops it with the last fleet; after the script's own
    ``ray.shutdown()`` and ``ray.init()``, its stop used to shut down the script's new Ray."""
    fleet = start_local_ray(lambda: _fleet(temp_dir).start(), temp_dir)  # initialises Ray
    stop_local_ray()
    ray_processes_gone(temp_dir)
    init = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    start_local_ray(lambda: ray.init(**init, _temp_dir=temp_dir), temp_dir)
    fleet.stop()
    assert ray.is_initialized()  # the script's own
    with _fleet(temp_dir):  # a fleet of the new Ray counts afresh: it did not start this one
        pass
    assert ray.is_initialized()
