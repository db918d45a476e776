"""Yet more of TorchRL's collector tests (``test/test_collectors.py``), on actors.

Weight sync (``TestUpdateParams.test_param_sync``, ``test_update_weights``), background
collection (``TestAsyncCollection.test_start_*`` with ``total_frames``), replay-buffer
layouts (``TestCollectorRB``) and ``max_frames_per_traj`` over several workers. Where
TorchRL's collector runs in this process (``Collector``) the test runs it beside the fleet;
TorchRL's multi-process collectors spawn workers too slowly for a test on two cores, so
their outcome (checked by hand against torchrl 0.14.1) is written as TorchRL's test writes it.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_mocks
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.envs import SerialEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.testing.mocking_classes import CountingEnv
from torchrl_harness import torchrl_batches, torchrl_config

from actor_service import create_server
from learner_client import GrpcCollector

pytestmark = pytest.mark.long  # fleets of up to three actors: make test-long

COUNT = "rlfleet_test_mocks:count_policy"
STEPS = "rlfleet_test_mocks:counting_steps"
VEC = "rlfleet_test_mocks:continuous_vec"
LAZY = "rlfleet_test_mocks:lazy_linear_policy"


@contextlib.contextmanager
def fleet(actors: int, env: str, policy: str = "random", **config: Any) -> Iterator[list[str]]:
    """The addresses of ``actors`` in-thread actors of ``torchrl_config``, worker ids 0, 1, ..."""
    with contextlib.ExitStack() as stack:
        addresses = []
        for worker_id in range(actors):
            server = create_server(torchrl_config(env, policy, worker_id=worker_id, **config))
            addresses.append(f"127.0.0.1:{stack.enter_context(server.run_in_thread()).port}")
        yield addresses


def _wait_for(condition: Callable[[], bool], seconds: float = 8.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# --- weights -------------------------------------------------------------------------------


@pytest.mark.parametrize("give_weights", [True, False])
@pytest.mark.parametrize("sync", [True, False], ids=["MultiSync", "MultiAsync"])
def test_port_param_sync(sync: bool, give_weights: bool) -> None:
    """``TestUpdateParams.test_param_sync``: a parameter and a buffer both reach the workers.

    The action is ``param + buf``: 0 before, 3 after ``param += 1; buf += 2`` and
    ``update_policy_weights_(TensorDict.from_module(policy))`` or ``update_policy_weights_()``
    (TorchRL's MultiSync and MultiAsync collectors give 3 in both forms).

    Async: a worker's batch under way at the update may straddle the versions (and a batch
    claimed as it arrived may wait beside it), and a slow worker's may come after any number
    of the other's (first ready, first served): each frame acts as its ``policy_version``
    says, and each worker's third batch after the update acts 3 throughout.
    """
    policy = rlfleet_test_mocks.param_sync_policy(rlfleet_test_mocks.param_sync_env())
    with (
        fleet(
            2,
            "rlfleet_test_mocks:param_sync_env",
            "rlfleet_test_mocks:param_sync_policy",
            num_envs=1,
        ) as addresses,
        GrpcCollector(
            addresses,
            policy=policy,
            frames_per_batch=10 if sync else 5,
            total_frames=200 if sync else -1,  # async: until each worker gave three batches
            sync=sync,
            cat_results="stack",
        ) as collector,
    ):
        after: dict[int, list[bool]] = {0: [], 1: []}  # async: each batch entirely new?
        for i, data in enumerate(collector):
            if i == 0:
                assert (data["action"] == 0).all()
                policy.param.data += 1
                policy.buf.data += 2
                weights = TensorDict.from_module(policy) if give_weights else None
                versions = collector.update_policy_weights_(weights)
                assert set(versions) == {0, 1}
                (version,) = set(versions.values())
            elif sync:
                if i == 6:
                    assert (data["action"] == 3).all()
                    break
            else:
                new = data["policy_version"] == version
                assert (data["action"][new] == 3).all()
                assert (data["action"][~new] == 0).all()
                after[int(data["collector", "worker_id"].flatten()[0])].append(bool(new.all()))
                if min(len(seen) for seen in after.values()) >= 3:
                    break
    if not sync:
        for seen in after.values():  # once new, a worker's batches stay new
            assert seen == sorted(seen), after
            assert seen[2], after


def _holds(collector: GrpcCollector, policy: torch.nn.Module) -> dict[int, bool]:
    """Whether each worker's policy weights (its GetState) equal ``policy``'s."""
    state = policy.state_dict()
    held = {}
    for worker_id in collector.worker_ids:
        weights = collector.actor_state(worker_id)["models"]["policy"]["weights"]
        held[worker_id] = set(weights) == set(state) and all(
            torch.allclose(weights[k], state[k]) for k in state
        )
    return held


@pytest.mark.parametrize("sync", [True, False], ids=["MultiSync", "MultiAsync"])
def test_port_update_weights_reach_every_worker(sync: bool) -> None:
    """``test_update_weights``: after ``update_policy_weights_()`` every worker holds the policy.

    TorchRL's workers hold the policy's weights from construction; a fleet's actors get the
    ``policy=`` module before the first batch or at the first push (documented). A change
    through ``param.data`` is then pushed by ``update_policy_weights_(policy)``.
    """
    policy = rlfleet_test_mocks.lazy_linear_policy(rlfleet_test_mocks.continuous_vec(), seed=2)
    with (
        fleet(3, VEC, LAZY, num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            policy=policy,
            frames_per_batch=21 if sync else 7,
            sync=sync,
            cat_results="stack",
        ) as collector,
    ):
        assert collector.update_policy_weights_() == dict.fromkeys(range(3), 1)
        assert _holds(collector, policy) == dict.fromkeys(range(3), True)
        for p in policy.parameters():
            p.data += torch.randn_like(p)
        assert _holds(collector, policy) == dict.fromkeys(range(3), False)
        assert collector.update_policy_weights_(policy) == dict.fromkeys(range(3), 2)
        assert _holds(collector, policy) == dict.fromkeys(range(3), True)
        assert (collector.next()["policy_version"] == 2).all()


def test_port_update_weights_data_change_is_not_seen_without_argument() -> None:
    """Documented difference: ``param.data += x`` then ``update_policy_weights_()`` sends nothing.

    TorchRL's ``test_update_weights`` does exactly this and its workers then hold the new
    weights; docs/collector.md ("The shared policy") says a change through ``.data`` on a
    parameter is not seen and the version stays: push the module itself.
    """
    policy = rlfleet_test_mocks.lazy_linear_policy(rlfleet_test_mocks.continuous_vec(), seed=2)
    with (
        fleet(2, VEC, LAZY, num_envs=1) as addresses,
        GrpcCollector(addresses, policy=policy, frames_per_batch=14, sync=True) as collector,
    ):
        assert collector.update_policy_weights_() == {0: 1, 1: 1}
        for p in policy.parameters():
            p.data += torch.randn_like(p)
        assert collector.update_policy_weights_() == {0: 1, 1: 1}  # nothing sent
        assert _holds(collector, policy) == {0: False, 1: False}


@pytest.mark.parametrize(
    "devices",
    [("device", "storing_device"), ("policy_device", "env_device")],
    ids=["device", "policy_device"],
)
def test_port_update_weights_per_worker_device_lists(devices: tuple[str, str]) -> None:
    """``test_update_weights`` builds ``MultiSyncCollector(..., device=[d] * 3, ...)``.

    TorchRL 0.14.1's multi-worker collectors take a device (and a policy/env device) per
    worker; a fleet of CPU actors should take ``[cpu] * 3`` as it takes ``"cpu"``.
    """
    cpu = [torch.device("cpu")] * 3
    with (
        fleet(3, VEC, LAZY, num_envs=1) as addresses,
        GrpcCollector(
            addresses, frames_per_batch=21, sync=True, **dict.fromkeys(devices, cpu)
        ) as collector,
    ):
        assert collector.next().numel() == 21


def test_port_policy_device_is_the_actors() -> None:
    """``TestUpdateParams``' ``policy_device``: the actors' device is taken, another refused."""
    with fleet(2, VEC, LAZY, num_envs=1) as addresses:
        with GrpcCollector(addresses, frames_per_batch=14, sync=True, policy_device="cpu") as c:
            assert c.next().numel() == 14
        with pytest.raises(ValueError, match="worker_id 0 runs it on cpu, worker_id 1 runs it"):
            GrpcCollector(addresses, frames_per_batch=14, sync=True, policy_device="meta")


@pytest.mark.parametrize(
    ("device", "storing_device"), [(None, "cpu"), ("cpu", None), ("cpu", "cpu")]
)
@pytest.mark.parametrize("sync", [True, False])
def test_port_output_device(sync: bool, device: str | None, storing_device: str | None) -> None:
    """``TestCollectorDevices.test_output_device``: ``data.device`` is the storing device.

    TorchRL's ``Collector`` gives ``batch.device == torch.device("cpu")`` for each of these
    (its storing device, else ``device``); run beside the fleet.
    """
    env = CountingEnv()
    reference = Collector(
        env,
        RandomPolicy(env.action_spec),
        device=device,
        storing_device=storing_device,
        frames_per_batch=4,
        total_frames=8,
    )
    assert next(iter(reference)).device == torch.device("cpu")
    reference.shutdown()
    with (
        fleet(1, "counting", num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            device=device,
            storing_device=storing_device,
            frames_per_batch=4,
            sync=sync,
        ) as collector,
    ):
        assert collector.next().device == torch.device("cpu")


# --- start() -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "sync"),
    [(1, True), (2, True), (2, False)],
    ids=["Collector", "MultiSync", "MultiAsync"],
)
@pytest.mark.parametrize("total_frames", [-1, 1_000_000_000])
def test_port_start(workers: int, sync: bool, total_frames: int) -> None:
    """``TestAsyncCollection.test_start_single`` / ``test_start_multi``: the buffer fills."""
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    with (
        fleet(workers, "counting", num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            replay_buffer=buffer,
            frames_per_batch=16 * workers,
            total_frames=total_frames,
            sync=sync,
            create_env_fn=CountingEnv,
        ) as collector,
    ):
        collector.start()
        _wait_for(lambda: len(buffer) >= 16)
        collector.async_shutdown(timeout=10)


@pytest.mark.parametrize(
    ("workers", "sync"),
    [(1, True), (2, True), (2, False)],
    ids=["Collector", "MultiSync", "MultiAsync"],
)
def test_port_start_stops_at_total_frames(workers: int, sync: bool) -> None:
    """``start()`` with a budget ends the background collection there, as ``Collector``'s.

    TorchRL's ``Collector.start()`` stores exactly ``total_frames`` and its thread ends (run
    here beside the fleet); its multi-process collectors' ``start()`` ignores the budget and
    fills the buffer past it (7,000+ writes for a budget of 64 in 4 s): the fleet keeps the
    budget in every mode.
    """
    env = CountingEnv()
    theirs = ReplayBuffer(storage=LazyTensorStorage(1000))
    reference = Collector(
        env,
        RandomPolicy(env.action_spec),
        replay_buffer=theirs,
        total_frames=64,
        frames_per_batch=16,
    )
    reference.start()
    _wait_for(lambda: not reference._thread.is_alive())
    reference.async_shutdown(timeout=10)
    assert theirs.write_count == 64
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    with (
        fleet(workers, "counting", num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            replay_buffer=buffer,
            frames_per_batch=16 * workers,
            total_frames=64,
            sync=sync,
            create_env_fn=CountingEnv,
        ) as collector,
    ):
        collector.start()
        _wait_for(lambda: buffer.write_count >= 64)
        time.sleep(0.5)  # nothing more comes
        assert buffer.write_count == theirs.write_count
        assert buffer[:].shape == theirs[:].shape == (64,)
        assert collector.stats()["frames"] == 64
        collector.async_shutdown(timeout=10)


# --- TestCollectorRB -----------------------------------------------------------------------

DETERMINISTIC = ("observation", ("next", "observation"), ("next", "step_count"), "action")


@pytest.mark.parametrize("as_env", [False, True], ids=["addresses", "create_env_fn"])
@pytest.mark.parametrize(
    ("envs", "frames", "total"),
    [(8, 16, 256), (4, 100, 200)],
    ids=["rb_sync", "rb_parallel_env"],
)
def test_port_collector_rb_2d_storage(as_env: bool, envs: int, frames: int, total: int) -> None:
    """``test_collector_rb_sync`` / ``test_collector_with_rb_parallel_env``: ``ndim=2`` storage.

    A ``SerialEnv`` of ``envs`` into ``LazyTensorStorage(..., ndim=2)``: ``[envs, time]`` rows
    grow along time, ``len()`` after each batch as TorchRL's, and the content equals TorchRL's
    ``Collector``'s (deterministic env and policy).
    """

    def make() -> SerialEnv:
        return SerialEnv(envs, rlfleet_test_mocks.counting_steps)

    def buffer() -> ReplayBuffer:
        return ReplayBuffer(storage=LazyTensorStorage(max(256, total), ndim=2), batch_size=5)

    policy = rlfleet_test_mocks.count_policy(rlfleet_test_mocks.counting_steps())
    theirs = buffer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = Collector(
            make(), policy, replay_buffer=theirs, total_frames=total, frames_per_batch=frames
        )
        their_lengths = [len(theirs) for _ in reference]
    reference.shutdown()
    ours = buffer()
    with (
        fleet(1, STEPS, COUNT, num_envs=envs) as addresses,
        GrpcCollector(
            addresses,
            replay_buffer=ours,
            total_frames=total,
            frames_per_batch=frames,
            sync=True,
            create_env_fn=make() if as_env else None,
        ) as collector,
    ):
        lengths = [len(ours) for data in collector if data is None]
    assert lengths == their_lengths
    assert ours[:].shape == theirs[:].shape
    for key in DETERMINISTIC:
        assert torch.equal(ours[:][key], theirs[:][key]), key


def _check_chunks(buffer: ReplayBuffer, chunk: int) -> None:
    """TorchRL's check: in each worker's chunk steps go up by one or reset, ids never fall."""
    steps = buffer["step_count"].squeeze().split(chunk)
    ids = buffer["collector", "traj_ids"].squeeze().split(chunk)
    for step_count, traj_ids in zip(steps, ids, strict=True):
        diff = step_count.diff()
        assert ((diff == 1) | (diff < 0)).all()
        assert (traj_ids.diff() >= 0).all()


@pytest.mark.parametrize(
    "create_env_fn", ["function", "list"], ids=["one_constructor", "constructor_list"]
)
@pytest.mark.parametrize("sync", [True, False], ids=["multisync", "multiasync"])
def test_port_collector_rb_multi(sync: bool, create_env_fn: str) -> None:
    """``test_collector_rb_multisync`` / ``_multiasync``: two workers into a 1-D storage.

    As TorchRL's (``[env, env]`` of one unbatched env each): ``len(rb)`` grows by the
    batch's frames (32 a round, 16 a batch), ends at 256, and each worker's 16-frame chunk
    is one env's consecutive steps.
    """
    env: Any = rlfleet_test_mocks.counting_steps
    buffer = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=5)
    frames = 32 if sync else 16
    with (
        fleet(2, STEPS, num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            replay_buffer=buffer,
            total_frames=256,
            frames_per_batch=frames,
            sync=sync,
            create_env_fn=env if create_env_fn == "function" else [env] * 2,
        ) as collector,
    ):
        lengths = [len(buffer) for data in collector if data is None]
    assert lengths == list(range(frames, 257, frames))
    assert buffer[:].shape == (256,)
    _check_chunks(buffer, 16)
    # Documented difference: ids are unique across the fleet (TorchRL's workers repeat them).
    workers = buffer["collector", "worker_id"]
    ids = buffer["collector", "traj_ids"]
    assert set(ids[workers == 0].tolist()).isdisjoint(ids[workers == 1].tolist())


def test_port_collector_rb_multi_without_env_keeps_the_fleet_layout() -> None:
    """Documented difference: without ``create_env_fn`` each actor's ``[1, 16]`` part is a row.

    TorchRL's ``MultiSyncCollector([env, env])`` fills a 1-D storage frame by frame;
    docs/collector.md (``replay_buffer``): a fleet extends it with each actor's
    ``[envs, time]`` batch, so without the env's layout a 1-D storage holds ``[rows, 16]``.
    """
    buffer = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=5)
    with (
        fleet(2, STEPS, num_envs=1) as addresses,
        GrpcCollector(
            addresses, replay_buffer=buffer, total_frames=256, frames_per_batch=32, sync=True
        ) as collector,
    ):
        lengths = [len(buffer) for data in collector if data is None]
    assert lengths == list(range(2, 17, 2))
    assert buffer[:].shape == (16, 16)


# --- max_frames_per_traj -------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["MultiSync", "MultiAsync"])
def test_port_max_frames_per_traj_several_workers(sync: bool) -> None:
    """``max_frames_per_traj`` on two workers: every worker's trajectories cut at 5 steps.

    Each worker's frames equal TorchRL's ``Collector`` on one env with the same limit (its
    ``MultiSyncCollector([env] * 2)`` gives these same rows, ``[2, 12]``).
    """
    kwargs = {"max_steps": 100}

    def make() -> CountingEnv:
        return CountingEnv(**kwargs)

    frames = 24 if sync else 12
    with (
        fleet(2, "counting", COUNT, env_kwargs=kwargs, num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            create_env_fn=[make] * 2,
            frames_per_batch=frames,
            total_frames=48,
            max_frames_per_traj=5,
            sync=sync,
        ) as collector,
    ):
        ours = list(collector)
    # Async delivery has no fixed order: a worker may deliver up to all four batches.
    theirs = torchrl_batches(
        "counting", COUNT, 4, 12, num_envs=None, env_kwargs=kwargs, max_frames_per_traj=5
    )
    keys = ["observation", ("next", "step_count"), ("next", "truncated"), ("next", "done")]
    if sync:
        assert [batch.shape for batch in ours] == [torch.Size([2, 12])] * 2
        rows = [(batch[w], theirs[i]) for i, batch in enumerate(ours) for w in range(2)]
    else:
        assert [batch.shape for batch in ours] == [torch.Size([12])] * 4
        seen: dict[int, int] = {}
        rows = []
        for batch in ours:
            worker = int(batch["collector", "worker_id"][0])
            rows.append((batch, theirs[seen.get(worker, 0)]))
            seen[worker] = seen.get(worker, 0) + 1
        assert sum(seen.values()) == 4
        assert set(seen) <= {0, 1}
    for mine, reference in rows:
        for key in keys:
            assert torch.equal(mine[key], reference[key]), key


@pytest.mark.parametrize("extend_buffer", [True, False])
def test_port_collector_rb_multisync_memmap(extend_buffer: bool, tmp_path: Any) -> None:
    """``test_collector_rb_multisync``'s ``LazyMemmapStorage`` and ``extend_buffer`` cases.

    ``extend_buffer=False`` has no effect on a fleet and warns (documented): the buffer is
    filled as with TorchRL's default.
    """
    env: Any = rlfleet_test_mocks.counting_steps
    storage = LazyMemmapStorage(256, scratch_dir=tmp_path)
    buffer = ReplayBuffer(storage=storage, batch_size=5)
    with contextlib.ExitStack() as stack:
        addresses = stack.enter_context(fleet(2, STEPS, num_envs=1))
        if not extend_buffer:
            stack.enter_context(pytest.warns(UserWarning, match="extend_buffer"))
        collector = stack.enter_context(
            GrpcCollector(
                addresses,
                replay_buffer=buffer,
                total_frames=256,
                frames_per_batch=32,
                sync=True,
                create_env_fn=[env] * 2,
                extend_buffer=extend_buffer,
            )
        )
        lengths = [len(buffer) for data in collector if data is None]
    assert lengths == list(range(32, 257, 32))
    _check_chunks(buffer, 16)
