"""RayFleet on a real local Ray cluster: placement, collection, resources, shutdown, restarts.

The module starts one Ray head in this process (2 CPUs, no dashboard, a temporary directory
of its own) and every fleet reuses it; `make test-ray` runs these in `.venv-ray`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import poll_until, process_alive, start_local_ray, stop_local_ray
from learner_fleet import cartpole_policy
from tensordict import TensorDictBase

from common.errors import ActorUnavailableError, AuthenticationError, SessionStateError
from learner_client import GrpcCollector, RayFleet
from learner_client._ray_runtime import RayLease

pytestmark = pytest.mark.ray

#: A custom resource of the test cluster, asked per actor so its accounting is exact.
SLOT = "rlfleet_slot"
SLOTS = 4.0
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray head for this module: 2 CPUs, 4 ``rlfleet_slot`` resources, no dashboard."""
    ray = pytest.importorskip("ray")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live there
    config = {"num_cpus": 2, "resources": {SLOT: SLOTS}, "include_dashboard": False}
    start_local_ray(lambda: ray.init(**config, _temp_dir=temp_dir, log_to_driver=False), temp_dir)
    yield ray
    stop_local_ray()
    shutil.rmtree(temp_dir, ignore_errors=True)


def _available(ray: Any, name: str) -> float:
    return float(ray.available_resources().get(name, 0.0))


def test_ray_fleet_collects_sync_and_async_batches(ray_cluster: Any) -> None:
    with RayFleet(2, "CartPole-v1", num_envs=4, seed=0, grace_period=1.0) as fleet:
        addresses = fleet.addresses
        assert len(set(addresses)) == 2
        node_ip = ray_cluster.util.get_node_ip_address()
        assert all(address.startswith(f"{node_ip}:") for address in addresses)
        with GrpcCollector(addresses, frames_per_batch=64, total_frames=128, sync=True) as c:
            shapes = [tuple(batch.batch_size) for batch in c]
        assert shapes == [(2, 4, 8), (2, 4, 8)]
        with GrpcCollector(addresses, frames_per_batch=32, total_frames=128, sync=False) as c:
            batches = list(c)
        assert [tuple(batch.batch_size) for batch in batches] == [(4, 8)] * 4
        workers = {int(batch["collector", "worker_id"].flatten()[0]) for batch in batches}
        assert workers <= {0, 1}
    assert ray_cluster.is_initialized()  # the fleet reused this Ray: it leaves it running


@pytest.mark.parametrize("host", ["0.0.0.0", "[::1]"])
def test_ray_fleet_gives_addresses_a_collector_dials_for_a_wildcard_or_bracketed_host(
    ray_cluster: Any, host: str
) -> None:
    """A server bound to every interface is dialed at its node's IP (it gave ``0.0.0.0:port``:
    from another node, the learner's own machine); ``[::1]`` gave ``[[::1]]:port``."""
    node_ip = ray_cluster.util.get_node_ip_address()
    with (
        RayFleet(1, "CartPole-v1", num_envs=1, host=host, grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=4) as collector,
    ):
        assert fleet.addresses[0].startswith(f"{node_ip}:" if host == "0.0.0.0" else "[::1]:")
        assert fleet.live_addresses() == fleet.addresses
        assert collector.next().numel() == 4


def test_ray_fleet_asks_each_actor_its_resources(ray_cluster: Any) -> None:
    total = ray_cluster.cluster_resources()
    cpus, slots, memory = (float(total[name]) for name in ("CPU", SLOT, "memory"))
    # Resources freed by the fleets before this one come back to Ray asynchronously.
    poll_until(lambda: _available(ray_cluster, "CPU") == cpus, timeout=30)
    configs = [
        {"num_cpus": 1, "memory": 64 * MIB, "resources": {SLOT: 1.5}},
        {"num_cpus": 0.5, "memory": 32 * MIB, "resources": {SLOT: 0.5}},
    ]
    with RayFleet(2, num_envs=1, grace_period=1.0, remote_configs=configs) as fleet:
        assert len(fleet.addresses) == 2
        poll_until(lambda: _available(ray_cluster, SLOT) == slots - 2.0, timeout=30)
        assert _available(ray_cluster, "CPU") == cpus - 1.5
        assert _available(ray_cluster, "memory") == memory - 96 * MIB
    poll_until(lambda: _available(ray_cluster, SLOT) == slots, timeout=30)
    poll_until(lambda: _available(ray_cluster, "CPU") == cpus, timeout=30)


def test_ray_fleet_stop_leaves_no_actor_and_no_server(ray_cluster: Any) -> None:
    fleet = RayFleet(2, num_envs=1, grace_period=1.0, remote_configs={"num_cpus": 0.5})
    with fleet:
        servers, workers = fleet.pids, fleet.ray_pids
        handles = list(fleet.actor_handles.values())
        assert all(process_alive(pid) for pid in servers + workers)
        with pytest.raises(SessionStateError, match="on a running fleet"):
            fleet.start()  # would place a second set of actors, the first left unstopped
        assert fleet.pids == servers
    poll_until(lambda: not any(process_alive(pid) for pid in servers), timeout=30)
    for handle in handles:  # each Ray actor is dead, for good
        with pytest.raises(ray_cluster.exceptions.RayActorError):
            ray_cluster.get(handle.is_alive.remote(), timeout=30)
    poll_until(lambda: not any(process_alive(pid) for pid in workers), timeout=30)
    assert ray_cluster.is_initialized()
    fleet.stop()  # idempotent
    with pytest.raises(SessionStateError, match="stopped"):
        _ = fleet.addresses


def test_ray_fleet_stop_terminates_each_server_at_once_not_after_its_grace_period(
    ray_cluster: Any,
) -> None:
    """A server not sent SIGTERM would serve out its grace period, then be SIGKILLed undrained."""
    fleet = RayFleet(1, num_envs=1, grace_period=15.0, remote_configs={"num_cpus": 0.5})
    (server,) = fleet.start().pids
    began = time.monotonic()
    fleet.stop()
    assert time.monotonic() - began < 10
    assert not process_alive(server)


def test_ray_fleet_kills_the_server_when_its_ray_actor_is_killed(ray_cluster: Any) -> None:
    with RayFleet(1, num_envs=1, grace_period=1.0, remote_configs={"num_cpus": 0.5}) as fleet:
        (server,), (worker,) = fleet.pids, fleet.ray_pids
        ray_cluster.kill(fleet.actor_handles[0], no_restart=True)
        poll_until(
            lambda: not process_alive(server), timeout=30, message="server outlived its actor"
        )
        poll_until(lambda: not process_alive(worker), timeout=30, message="the Ray actor lives on")


def test_ray_fleet_reports_a_server_that_dies_before_ready(ray_cluster: Any) -> None:
    fleet = RayFleet(1, num_envs=1, extra_args=["--num-envs", "0"], start_timeout=60)
    with pytest.raises(ActorUnavailableError, match="before it was ready"):
        fleet.start()
    with pytest.raises(SessionStateError):
        _ = fleet.addresses


@pytest.mark.long
@pytest.mark.parametrize(("step", "held_worker"), [("_init_ray", None), ("_argv", 1)])
def test_ray_fleet_stopped_by_another_thread_while_it_starts_leaves_no_actor_running(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch, step: str, held_worker: int | None
) -> None:
    """A stop() before the fleet took its lease on Ray, or between two placements, stopped
    only the actors placed so far: start() went on placing the rest, which served on (their
    CPUs and a lease on Ray held) until the process exited, and failed without stopping them."""
    leases = RayLease._leases
    held, go_on = threading.Event(), threading.Event()
    original = getattr(RayFleet, step)

    def gated(fleet: RayFleet, *args: Any) -> Any:
        if held_worker is None or args == (held_worker,):
            held.set()
            go_on.wait(timeout=30)
        return original(fleet, *args)

    monkeypatch.setattr(RayFleet, step, gated)
    fleet = RayFleet(2, num_envs=1, grace_period=1.0, remote_configs={"num_cpus": 0.5})
    errors: list[BaseException] = []
    starter = threading.Thread(target=lambda: _start_into(fleet, errors))
    starter.start()
    try:
        assert held.wait(timeout=30)
        fleet.stop()
    finally:
        go_on.set()
    starter.join(timeout=60)
    assert not starter.is_alive()
    assert [type(error) for error in errors] == [SessionStateError]
    for handle in fleet._handles.values():  # each Ray actor it placed is dead, for good
        with pytest.raises(ray_cluster.exceptions.RayActorError):
            ray_cluster.get(handle.is_alive.remote(), timeout=30)
    assert RayLease._leases == leases


@pytest.mark.long
def test_ray_fleet_second_stop_returns_once_the_first_stopped_every_actor(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop() while another thread's stop() ran returned at once, its actors still serving."""
    held, go_on = threading.Event(), threading.Event()
    original = RayFleet._stop_handles

    def gated(fleet: RayFleet, ray: Any) -> None:
        held.set()
        go_on.wait(timeout=30)
        original(fleet, ray)

    monkeypatch.setattr(RayFleet, "_stop_handles", gated)
    fleet = RayFleet(1, num_envs=1, grace_period=1.0, remote_configs={"num_cpus": 0.5})
    (server,) = fleet.start().pids
    first = threading.Thread(target=fleet.stop)
    first.start()
    second = threading.Thread(target=fleet.stop)
    try:
        assert held.wait(timeout=30)
        second.start()
        second.join(timeout=1.0)
        assert second.is_alive()  # waits for the first
    finally:
        go_on.set()
    second.join(timeout=60)
    assert not second.is_alive()
    assert not process_alive(server)
    first.join(timeout=60)


def _start_into(fleet: RayFleet, errors: list[BaseException]) -> None:
    try:
        fleet.start()
    except BaseException as error:
        errors.append(error)


def test_ray_fleet_restarted_actor_comes_back_at_a_new_address(ray_cluster: Any) -> None:
    config = {"num_cpus": 0.5, "max_restarts": 1}
    with RayFleet(1, num_envs=2, seed=0, grace_period=1.0, remote_configs=config) as fleet:
        (old_address,), (server,), (worker,) = fleet.addresses, fleet.pids, fleet.ray_pids
        os.kill(worker, signal.SIGKILL)  # the Ray worker crashes; Ray restarts the actor
        poll_until(
            lambda: not process_alive(server), timeout=30, message="server outlived its actor"
        )

        # Asked while Ray restarts it, the fleet waits for the new server (no Ray error).
        (address,) = fleet.addresses
        assert address != old_address
        (new_server,) = fleet.pids
        assert new_server != server
        assert fleet.is_alive(0)
        with GrpcCollector([address], frames_per_batch=16, total_frames=32, sync=True) as c:
            assert [tuple(batch.batch_size) for batch in c] == [(1, 2, 8)] * 2


def _first_observations(fleet: RayFleet) -> list[list[float]]:
    """Each worker's first batch of observations, in worker-id order."""
    with GrpcCollector(fleet, frames_per_batch=8, sync=True) as collector:
        batch = collector.next()
    assert batch is not None
    return [rows.flatten().tolist() for rows in batch["observation"]]


@pytest.mark.long
def test_ray_fleet_of_callables_seeds_each_actor_from_the_fleets_seed(ray_cluster: Any) -> None:
    """The in-process form passed no ``--seed``: its actors drew random seeds, a seeded run
    was not reproducible and its workers' envs were not seeded apart."""
    from torchrl.envs import GymEnv

    def fleet() -> RayFleet:
        return RayFleet(
            2,
            num_envs=1,
            seed=5,
            grace_period=1.0,
            create_env_fn=lambda: GymEnv("CartPole-v1"),
            remote_configs={"num_cpus": 0.5},
        )

    first, again = _first_observations(fleet()), _first_observations(fleet())
    assert first == again
    assert first[0] != first[1]


def _worker(batch: TensorDictBase) -> int:
    return int(batch["collector", "worker_id"].flatten()[0])


def test_ray_fleet_restarted_actor_rejoins_the_same_collector(ray_cluster: Any) -> None:
    config = {"num_cpus": 0.5, "max_restarts": 1}
    fleet = RayFleet(2, num_envs=2, seed=0, grace_period=1.0, remote_configs=config)
    with GrpcCollector(
        fleet, frames_per_batch=16, batch_timeout=10.0, dns_refresh_interval=0.5
    ) as c:
        prints: list[str] = []

        def take() -> TensorDictBase:
            batch = c.next()
            assert batch is not None
            prints.append(hashlib.sha256(batch["observation"].numpy().tobytes()).hexdigest())
            return batch

        seen: set[int] = set()
        while seen != {0, 1}:
            seen.add(_worker(take()))
        version = c.update_policy_weights_(cartpole_policy())[0]
        old_address, worker = fleet.addresses[0], fleet.ray_pids[0]
        os.kill(worker, signal.SIGKILL)  # Ray restarts the actor: a new server, a new port
        killed = time.monotonic()
        while True:  # the same collector takes worker 0's batches again, at its new address
            batch = take()
            if _worker(batch) == 0 and c.stats()["restarts"] >= 1:
                break
            assert time.monotonic() - killed < 60, "the restarted actor did not come back"
        assert c.remote_collectors[0].address != old_address
        assert c.remote_collectors[0].address == fleet.addresses[0]
        # Re-admitted with the newest weights before its first frame counted.
        assert set(batch["policy_version"].flatten().tolist()) == {version}
        assert {_worker(take()) for _ in range(8)} <= {0, 1}
        stats = c.stats()
        assert stats["duplicates"] == 0
        assert len(set(prints)) == len(prints)
    with pytest.raises(SessionStateError, match="stopped"):  # stopped with the collector
        _ = fleet.addresses


def test_ray_fleet_dead_actor_is_reported_by_the_collector(ray_cluster: Any) -> None:
    config = {"num_cpus": 0.5, "max_restarts": 0}
    fleet = RayFleet(2, num_envs=2, seed=0, grace_period=1.0, remote_configs=config)
    with GrpcCollector(
        fleet, frames_per_batch=16, batch_timeout=10.0, dns_refresh_interval=0.5
    ) as c:
        seen: set[int] = set()
        while seen != {0, 1}:
            batch = c.next()
            assert batch is not None
            seen.add(_worker(batch))
        os.kill(fleet.ray_pids[0], signal.SIGKILL)  # for good: no restart left
        poll_until(lambda: c.worker_states[0] == "down", timeout=60, interval=0.5)
        # Collection goes on from the other (batches worker 0 sent before it died may come first).
        assert 1 in {_worker(b) for b in (c.next() for _ in range(6)) if b is not None}
        assert c.worker_states[0] != "streaming"
        assert fleet.live_addresses() == [c.remote_collectors[1].address]


def test_ray_fleet_reports_an_actor_dead_for_good_as_its_own_error(ray_cluster: Any) -> None:
    config = {"num_cpus": 0.5, "max_restarts": 0}
    with RayFleet(1, num_envs=2, grace_period=1.0, remote_configs=config) as fleet:
        os.kill(fleet.ray_pids[0], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ActorUnavailableError, match="died"):
            poll_until(lambda: fleet.addresses and None, timeout=30, interval=0.2)
        assert time.monotonic() - start < 30


def _command_lines() -> list[bytes]:
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                lines.append(file.read())
        except OSError:
            continue  # gone meanwhile
    return lines


@pytest.mark.parametrize("form", ["server", "in_process"])
def test_ray_fleet_token_is_required_and_never_on_a_command_line(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    monkeypatch.delenv("RLFLEET_TOKEN", raising=False)
    token = "s3cret-" + os.urandom(8).hex()
    kwargs: dict[str, Any] = {"num_envs": 2, "grace_period": 1.0, "token": token}
    if form == "in_process":
        from torchrl.envs import GymEnv

        kwargs["create_env_fn"] = lambda: GymEnv("CartPole-v1")
    with RayFleet(1, remote_configs={"num_cpus": 0.5}, **kwargs) as fleet:
        assert fleet.token == token
        with (  # a collector given the addresses alone sends no token
            pytest.raises(AuthenticationError, match="UNAUTHENTICATED"),
            GrpcCollector(fleet.addresses, frames_per_batch=8) as bare,
        ):
            next(iter(bare))
        with GrpcCollector(fleet, frames_per_batch=8, total_frames=16) as collector:
            assert [batch.numel() for batch in collector] == [8, 8]  # the fleet's token sent
        assert not [line for line in _command_lines() if token.encode() in line]


def test_ray_fleet_without_a_token_leaves_a_runtime_envs_token_in_force(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLFLEET_TOKEN", raising=False)
    token = "s3cret-" + os.urandom(8).hex()
    config = {"num_cpus": 0.5, "runtime_env": {"env_vars": {"RLFLEET_TOKEN": token}}}
    with RayFleet(1, num_envs=2, grace_period=1.0, remote_configs=config) as fleet:
        assert fleet.token is None
        addresses = fleet.addresses  # (a collector given the fleet would stop it with it)
        with (  # the servers still require it: never silently open
            pytest.raises(AuthenticationError, match="UNAUTHENTICATED"),
            GrpcCollector(addresses, frames_per_batch=8, token=fleet.token) as bare,
        ):
            next(iter(bare))
        with GrpcCollector(addresses, frames_per_batch=8, total_frames=8, token=token) as c:
            assert [batch.numel() for batch in c] == [8]
