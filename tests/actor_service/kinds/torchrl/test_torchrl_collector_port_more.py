"""More of TorchRL's own collector tests (``test/test_collectors.py``), on actors.

The companion of ``test_torchrl_collector_port.py``: each test is one of TorchRL's, run on
real actors and a real learner over loopback with the same mock env and policy
(``rlfleet_test_mocks``, ``rlfleet_test_torchrl``), and held to what TorchRL's test checks;
where the env and the policy are deterministic, the batches must also equal those of
TorchRL's ``Collector`` given the same arguments. TorchRL's multi-worker collectors become
several actors. Where rlfleet differs on purpose (``frames_per_batch`` split exactly,
trajectory ids unique across the fleet, a shut-down collector raising), the test says so.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_mocks
import rlfleet_test_torchrl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import ExplorationType
from torchrl_harness import (
    assert_equal_batches,
    assert_strings_follow_steps,
    fleet_batches,
    torchrl_batches,
    torchrl_config,
)

from actor_service import create_server
from learner_client import GrpcCollector

pytestmark = pytest.mark.long  # ~40 s of fleets: make test-long (CI runs it), not make test

COUNTING = "counting"
COUNT = "rlfleet_test_mocks:count_policy"
DISCRETE_VEC = "rlfleet_test_mocks:discrete_vec"
LADDER = "rlfleet_test_mocks:counting_ladder"


@contextlib.contextmanager
def fleet(
    actors: int,
    env: str,
    policy: str = "random",
    policy_kwargs: dict[str, Any] | None = None,
    **config: Any,
) -> Iterator[list[str]]:
    """The addresses of ``actors`` in-thread actors of ``torchrl_config``, worker ids 0, 1, ..."""
    with contextlib.ExitStack() as stack:
        addresses = []
        for worker_id in range(actors):
            settings = {"worker_id": worker_id, **config}
            server = create_server(torchrl_config(env, policy, policy_kwargs, **settings))
            addresses.append(f"127.0.0.1:{stack.enter_context(server.run_in_thread()).port}")
        yield addresses


@pytest.mark.parametrize("num_envs", [1, 2])
def test_port_split_trajs(num_envs: int) -> None:
    """TorchRL's ``TestCollectorGeneric.test_split_trajs``, and equal to its ``Collector``'s."""
    kwargs = {"max_steps": 7}
    settings = {"split_trajs": True, "max_frames_per_traj": 2000, "reset_when_done": True}
    config = torchrl_config(COUNTING, COUNT, env_kwargs=kwargs, num_envs=num_envs)
    (data,) = fleet_batches(config, 1, 10 * num_envs, sync=True, device="cpu", **settings)
    assert data.ndim == 2
    assert data["collector", "mask"].shape == data.shape
    assert data["next", "step_count"].shape == data["next", "done"].shape
    assert data["collector", "traj_ids"].shape == data.shape
    assert int(data["collector", "mask"].sum()) == 10 * num_envs
    for traj in data.unbind(0):
        mask = traj["collector", "mask"]
        assert traj["collector", "traj_ids"][mask].unique().numel() == 1
        steps = traj["next", "step_count"][mask]
        assert (steps[1:] - steps[:-1] == 1).all()
    (theirs,) = torchrl_batches(
        COUNTING, COUNT, 1, 10 * num_envs, num_envs=num_envs, env_kwargs=kwargs, **settings
    )
    assert_equal_batches(data, theirs, split=True)


@pytest.mark.parametrize("sync", [True, False])
def test_port_set_truncated(sync: bool) -> None:
    """TorchRL's ``TestCollectorGeneric.test_set_truncated`` (nested done keys), two workers."""
    with (
        fleet(2, "rlfleet_test_mocks:nested_truncated") as addresses,
        GrpcCollector(
            addresses,
            frames_per_batch=20 if sync else 10,
            sync=sync,
            cat_results="stack",
            set_truncated=True,
        ) as collector,
    ):
        data = collector.next()
    assert data[..., -1]["next", "data", "truncated"].all()
    assert not data[..., :-1]["next", "data", "truncated"].any()  # never done by itself


@pytest.mark.parametrize("sync", [True, False])
def test_port_no_stopiteration(sync: bool) -> None:
    """TorchRL's ``test_no_stopiteration``: ``len()`` batches, then the iterator ends.

    TorchRL asks 173 frames and rounds them up to the workers' envs; rlfleet splits
    ``frames_per_batch`` exactly, so the test asks the rounded count (176 for two actors of 8).
    """
    frames = 176 if sync else 88
    with fleet(2, COUNTING, num_envs=8) as addresses:
        with pytest.warns(UserWarning, match="52 additional frames"):  # as TorchRL's
            c = GrpcCollector(addresses, frames_per_batch=frames, total_frames=300, sync=sync)
        with c:
            iterator = iter(c)
            assert len(c) == -(-300 // frames)
            for _ in range(len(c)):
                assert next(iterator).numel() == frames
            assert next(iterator, None) is None


def test_port_collector_reloading() -> None:
    """TorchRL's ``test_collector_reloading``: a collector loaded at its budget yields nothing."""
    settings = {"frames_per_batch": 30, "total_frames": 90, "sync": True}
    with fleet(1, DISCRETE_VEC) as addresses:
        with GrpcCollector(addresses, **settings) as collector:
            assert sum(1 for _ in collector) == 3
            state = collector.state_dict()
        with GrpcCollector(addresses, **settings) as collector:
            collector.load_state_dict(state)
            assert collector.stats()["frames"] == 90
            assert list(collector) == []


def test_port_collector_next_method() -> None:
    """TorchRL's ``test_collector_next_method``: ``next()`` and iteration share the budget."""
    with (
        fleet(1, DISCRETE_VEC) as addresses,
        GrpcCollector(addresses, frames_per_batch=50, total_frames=500, sync=False) as c,
    ):
        assert c.next().numel() == 50
        assert c.next().numel() == 50
        for batches, data in enumerate(c, start=1):
            assert data.numel() == 50
            if batches == 2:
                break
        assert c.stats()["frames"] == 200


def test_port_next_and_iter_after_shutdown_raise() -> None:
    """TorchRL's collectors fail after ``shutdown()`` (``test_collector_next_method``'s end).

    rlfleet's raises ``RuntimeError`` from ``next()`` and ``iter()``, and never hangs.
    """
    with fleet(1, DISCRETE_VEC) as addresses:
        collector = GrpcCollector(addresses, frames_per_batch=16, total_frames=160, sync=True)
        collector.next()
        collector.shutdown()
        outcome: dict[str, Any] = {}

        def take() -> None:
            try:
                outcome["batch"] = collector.next()
            except Exception as error:
                outcome["error"] = error

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), RuntimeError)
        with pytest.raises(RuntimeError):
            next(iter(collector))


def test_port_reset_at_each_iter() -> None:
    """TorchRL's ``reset_at_each_iter=True`` (no test of its own upstream): equal batches."""
    kwargs = {"max_steps": 100}
    config = torchrl_config(COUNTING, COUNT, env_kwargs=kwargs)
    ours = fleet_batches(config, 3, 6, reset_at_each_iter=True)
    theirs = torchrl_batches(COUNTING, COUNT, 3, 6, env_kwargs=kwargs, reset_at_each_iter=True)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference)
        assert (mine["observation"][:, 0] == 0).all()  # every batch starts from a reset


def test_port_maxframes_error() -> None:
    """TorchRL's ``test_maxframes_error``: ``max_frames_per_traj`` over a ``StepCounter``."""
    with fleet(1, "rlfleet_test_mocks:counting_step_counter") as addresses:
        with GrpcCollector(addresses, frames_per_batch=10, total_frames=100, sync=True) as c:
            assert c.next().numel() == 10
        with (
            pytest.raises(ValueError, match="step_count"),
            GrpcCollector(
                addresses, frames_per_batch=10, total_frames=100, sync=True, max_frames_per_traj=2
            ) as c,
        ):
            c.next()


def test_port_initial_obs_consistency() -> None:
    """TorchRL's ``test_initial_obs_consistency`` (``CountingBatchedEnv`` of horizons 17, 18)."""
    start_val, max_steps = 4, 18
    frames = ((max_steps - 3) * 2 + 2) * 2
    env = "rlfleet_test_mocks:counting_batched_initial"
    (data,) = fleet_batches(torchrl_config(env, COUNT), 1, frames)
    obs = data["observation"].squeeze()
    arange_0 = start_val + torch.arange(max_steps - 3 - 1)
    expected_0 = torch.cat([arange_0, arange_0, start_val + torch.arange(start_val)])
    arange_0 = start_val + torch.arange(max_steps - 3)
    expected_1 = torch.cat([arange_0, arange_0, start_val + torch.arange(2)])
    assert torch.equal(obs, torch.stack([expected_0, expected_1]).to(obs.dtype))
    (theirs,) = torchrl_batches(env, COUNT, 1, frames, num_envs=None)
    assert_equal_batches(data, theirs)


def test_port_multisync_split_trajs_set_seed() -> None:
    """TorchRL's ``test_multisync_split_trajs_set_seed``: first ids of the rows all differ."""
    with (
        fleet(2, COUNTING, env_kwargs={"max_steps": 100}, num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            frames_per_batch=200,
            total_frames=2000,
            max_frames_per_traj=50,
            init_random_frames=-1,
            reset_at_each_iter=False,
            device="cpu",
            storing_device="cpu",
            cat_results="stack",
            split_trajs=True,
            sync=True,
        ) as collector,
    ):
        collector.set_seed(42)
        for _ in range(3):
            data = collector.next()
    ids = data.get(("collector", "traj_ids")).select(-1, 0)
    assert ids.unique().numel() == ids.numel()


@pytest.mark.parametrize("cat_results", ["stack", 0])
def test_port_unique_traj_sync(cat_results: Any) -> None:
    """TorchRL's ``TestUniqueTraj.test_unique_traj_sync``: no id in two rows of the buffer."""
    stack = cat_results == "stack"
    buffer = ReplayBuffer(storage=LazyTensorStorage(900, ndim=2 + stack), batch_size=16)
    with (
        fleet(3, "cartpole") as addresses,
        GrpcCollector(
            addresses, frames_per_batch=300, total_frames=900, sync=True, cat_results=cat_results
        ) as collector,
    ):
        for data in collector:
            buffer.extend(data)
    ids = buffer[:].get(("collector", "traj_ids")).tolist()
    rows = [set(row) for worker in ids for row in worker] if stack else [set(r) for r in ids]
    assert len(rows) == 6
    for i, row in enumerate(rows):
        for other in rows[i + 1 :]:
            assert row.isdisjoint(other)


def test_port_nontensor_simple() -> None:
    """TorchRL's ``TestCollectorsNonTensor.test_simple``: strings follow their steps."""
    with (
        fleet(1, "rlfleet_test_mocks:nontensor_cartpole", num_envs=1) as addresses,
        GrpcCollector(addresses, frames_per_batch=10, total_frames=200, sync=False) as c,
    ):
        result = torch.cat([data[0] for data in c])
    nt, next_nt = result["nt"], result["next", "nt"]
    assert len(nt) == 200
    assert "reset!" in nt  # episodes ended inside the 200 steps
    assert_strings_follow_steps(list(nt), list(next_nt))


def test_port_unbatched_env_traj_ids_shape_consistency() -> None:
    """TorchRL's ``test_unbatched_env_traj_ids_shape_consistency``: ``[30]`` batches and ids."""
    env = rlfleet_test_mocks.unbatched_done()
    settings = {"frames_per_batch": 30, "total_frames": 100, "sync": True}
    with fleet(1, "rlfleet_test_mocks:unbatched_done", num_envs=1) as addresses:
        with pytest.warns(UserWarning, match="20 additional frames"):  # as TorchRL's
            collector = GrpcCollector(
                addresses, create_env_fn=env, storing_device="cpu", **settings
            )
        with collector:
            for i, data in enumerate(collector):
                assert data.shape == (30,)
                ids = data.get(("collector", "traj_ids"))
                assert ids.shape == (30,)
                assert (ids >= 0).all()
                assert ids.unique().numel() == 5  # done every 6 steps: 5 trajectories in 30
                if i == 2:
                    break


@pytest.mark.parametrize("use_rb", [False, True])
@pytest.mark.parametrize("sync", [True, False])
def test_port_collector_postproc_zeros(use_rb: bool, sync: bool) -> None:
    """TorchRL's ``TestCollectorRB.test_collector_postproc_zeros`` (``extend_buffer=True``)."""
    buffer = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=5) if use_rb else None
    with (
        fleet(2, DISCRETE_VEC) as addresses,
        GrpcCollector(
            addresses,
            frames_per_batch=16 if sync else 8,
            total_frames=64,
            sync=sync,
            replay_buffer=buffer,
            postproc=lambda td: td.apply(torch.zeros_like),
        ) as collector,
    ):
        batches = list(collector)
    assert len(batches) == (4 if sync else 8)
    for batch in batches:
        if use_rb:
            assert batch is None
        sample = buffer.sample(5) if buffer is not None else batch
        assert (sample["observation"] == 0).all()
        assert (sample["action"] == 0).all()
        assert (sample["next", "reward"] == 0).all()
    if buffer is not None:
        assert buffer[:].numel() == 64  # each actor's [envs, time] part, one row an env


def test_port_set_seed_determinism() -> None:
    """TorchRL's ``test_concurrent_collector_seed``: the same seed gives the same batches."""
    runs = []
    with fleet(1, "cartpole", "sampling_policy") as addresses:
        for _ in range(2):
            with GrpcCollector(addresses, frames_per_batch=20, total_frames=40, sync=True) as c:
                c.set_seed(7)
                runs.append([d.select("observation", "action", ("next", "reward")) for d in c])
    assert len(runs[0]) == 2
    for first, second in zip(*runs, strict=True):
        assert (first == second).all()


@pytest.mark.parametrize("num_envs", [1, 2])
def test_port_traj_len_consistency(num_envs: int) -> None:
    """TorchRL's ``test_traj_len_consistency``: 1, 10 or 20 frames a batch, the same steps."""
    runs = []
    with fleet(1, DISCRETE_VEC, "rlfleet_test_mocks:vec_policy", num_envs=num_envs) as addresses:
        for frames in (1, 10, 20):
            with GrpcCollector(
                addresses,
                frames_per_batch=frames * num_envs,
                total_frames=2 * num_envs * 20,
                max_frames_per_traj=2000,
                device="cpu",
                sync=True,
            ) as collector:
                collector.set_seed(100)
                batches = [collector.next().exclude("collector") for _ in range(-(-20 // frames))]
            runs.append(torch.cat(batches, -1)[..., :20])
    assert runs[0].shape == (1, num_envs, 20)  # sync: [workers, envs, time]
    assert not (runs[0]["observation"][..., 1:, :] == runs[0]["observation"][..., :1, :]).all()
    for run in runs[1:]:
        assert (run == runs[0]).all()


@pytest.mark.parametrize("num_envs", [1, 4])
def test_port_collector_outplace_policy(num_envs: int) -> None:
    """TorchRL's ``test_collector_outplace_policy``: a policy writing a new TensorDict or not.

    Both act as modules here (an actor takes a ``TensorDictModuleBase``; TorchRL's collector
    also takes the bare functions); the batches equal each other's and TorchRL's.
    """
    env, kwargs = (COUNTING, {"max_steps": 10}) if num_envs == 1 else (LADDER, {"envs": 4})
    frames = 10 if num_envs == 1 else 8
    runs = []
    for policy in ("rlfleet_test_mocks:inplace_policy", "rlfleet_test_mocks:outplace_policy"):
        config = torchrl_config(env, policy, env_kwargs=kwargs, num_envs=num_envs)
        ours = fleet_batches(config, 10, frames)
        theirs = torchrl_batches(env, policy, 10, frames, num_envs=None, env_kwargs=kwargs)
        if num_envs == 1:  # one actor of one env: [1, time] (TorchRL's env as it is: [time])
            theirs = [batch.unsqueeze(0) for batch in theirs]
        for mine, reference in zip(ours, theirs, strict=True):
            assert_equal_batches(mine, reference.refine_names(None, "time"))
        runs.append(torch.cat([batch.exclude("collector") for batch in ours], -1))
    assert (runs[0] == runs[1]).all()
    assert runs[0]["next", "done"].any()


# TorchRL's ``test_collector_output_keys``: every key of its batch, with ``split_trajs``.
OUTPUT_KEYS = {
    "action",
    "done",
    "terminated",
    "truncated",
    "collector",
    "hidden1",
    "hidden2",
    ("next", "hidden1"),
    ("next", "hidden2"),
    ("next", "observation"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "reward"),
    "next",
    "observation",
    ("collector", "traj_ids"),
}
# What rlfleet adds to every batch: the acting weights' version, the worker.
RLFLEET_KEYS = {"policy_version", ("next", "policy_version"), ("collector", "worker_id")}


@pytest.mark.parametrize("workers", [1, 3], ids=["Collector", "MultiSync"])
@pytest.mark.parametrize("init_random_frames", [0, 50])
@pytest.mark.parametrize(("explicit_spec", "split_trajs"), [(True, True), (False, False)])
def test_port_collector_output_keys(
    workers: int, init_random_frames: int, explicit_spec: bool, split_trajs: bool
) -> None:
    """TorchRL's ``test_collector_output_keys``: an LSTM policy's hidden keys and ``next`` copies.

    Three workers: 21 frames a batch (rlfleet splits them exactly; TorchRL rounds 20 up).
    """
    frames = 20 if workers == 1 else 21
    with (
        fleet(
            workers,
            "rlfleet_test_mocks:pendulum",
            "rlfleet_test_mocks:lstm_net_policy",
            {"explicit_spec": explicit_spec},
            num_envs=1,
        ) as addresses,
        GrpcCollector(
            addresses,
            frames_per_batch=frames,
            total_frames=10 * frames,
            init_random_frames=init_random_frames,
            split_trajs=split_trajs,
            sync=True,
        ) as collector,
    ):
        batch = collector.next()
    expected = OUTPUT_KEYS | ({("collector", "mask")} if split_trajs else set())
    assert set(batch.keys(True)) == expected | RLFLEET_KEYS
    assert batch["hidden1"].shape[-2:] == (1, 12)


def test_port_collector_env_reset() -> None:
    """TorchRL's ``test_collector_env_reset``: ``step_count`` is 1 right after a done."""
    with (
        fleet(1, "rlfleet_test_mocks:frame_skip_cartpole") as addresses,
        GrpcCollector(addresses, frames_per_batch=400, sync=True) as collector,
    ):
        (data,) = collector.next()  # one worker: [envs, time]
    steps = data["next", "step_count"][..., 1:, :]
    done = data["next", "done"][..., :-1, :]
    assert done.sum() > 3
    assert (steps[done] == 1).all()
    assert (steps[~done] > 1).all()
    assert (steps == 1)[done].all()
    assert data["next", "reward"].sum(-2).min() >= 0


def test_port_collector_restores_policy_version() -> None:
    """TorchRL's ``TestPolicyVersion.test_*_collector_restores_*policy_version*``.

    Two workers; the state restored into a collector of fresh actors. TorchRL's test pushes
    an unchanged policy with ``update_policy_weights_()``, which rlfleet does not re-send (the
    version stays, docs/collector.md); pushing the module itself always sends.
    """
    policy = rlfleet_test_torchrl.greedy_policy(rlfleet_test_torchrl.cartpole())
    settings = {"frames_per_batch": 20, "total_frames": 60, "sync": True}
    with (
        fleet(2, "cartpole", "greedy_policy") as addresses,
        GrpcCollector(addresses, policy=policy, **settings) as collector,
    ):
        collector.update_policy_weights_(policy)
        collector.update_policy_weights_(policy)
        state, saved = collector.state_dict(), collector.policy_version
    assert saved == 2
    with (
        fleet(2, "cartpole", "greedy_policy") as addresses,
        GrpcCollector(addresses, policy=policy, **settings) as restored,
    ):
        assert restored.policy_version == 0  # fresh actors
        restored.load_state_dict(state)
        assert restored.policy_version == saved
        assert restored.update_policy_weights_(policy) == {0: saved + 1, 1: saved + 1}
        assert restored.policy_version == saved + 1
        assert (restored.next()["policy_version"] == saved + 1).all()


def _wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_port_async_collection_pause() -> None:
    """TorchRL's ``TestAsyncCollection.test_pause``: nothing is written while paused."""
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    with (
        fleet(1, COUNTING, num_envs=1) as addresses,
        GrpcCollector(addresses, replay_buffer=buffer, frames_per_batch=16) as collector,
    ):
        collector.start()
        for _ in range(2):
            _wait_for(lambda: len(buffer) >= 1)
            with collector.pause():
                written = buffer.write_count
                for _ in range(10):
                    assert buffer.write_count == written
                    time.sleep(0.05)
            _wait_for(lambda written=written: buffer.write_count > written)
        collector.async_shutdown(timeout=10)


@pytest.mark.parametrize(
    ("workers", "sync"),
    [(1, True), (2, False), (2, True)],
    ids=["Collector", "MultiAsync", "MultiSync"],
)
def test_port_async_collection_start_update_policy(workers: int, sync: bool) -> None:
    """TorchRL's ``TestAsyncCollection.test_start_update_policy``: a push reaches ``start()``."""
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    policy = rlfleet_test_mocks.zero_linear_policy(rlfleet_test_torchrl.counting(5))
    weights = TensorDict.from_module(policy).data.clone()
    with (
        fleet(
            workers,
            COUNTING,
            "rlfleet_test_mocks:zero_linear_policy",
            env_kwargs={"max_steps": 5},
            num_envs=1,
        ) as addresses,
        GrpcCollector(
            addresses, replay_buffer=buffer, frames_per_batch=16 * workers, sync=sync
        ) as collector,
    ):
        collector.start()
        _wait_for(lambda: len(buffer) >= 1)
        assert (buffer[-1:]["action"] == 0).all()
        weights["module", "1", "module", "bias"] += 1
        collector.update_policy_weights_(weights)
        _wait_for(lambda: (buffer[-1:]["action"] == 1).all())
        collector.async_shutdown(timeout=10)


@pytest.mark.parametrize("workers", [1, 3], ids=["Collector", "MultiSync"])
@pytest.mark.parametrize("out_key", ["_dummy", ["out", "_dummy"], ["_out", "dummy"]])
def test_port_excluded_keys(workers: int, out_key: str | list[str]) -> None:
    """TorchRL's ``test_excluded_keys`` (its default, ``exclude=True``): no private keys."""
    with (
        fleet(
            workers,
            "rlfleet_test_mocks:continuous_vec_init",
            "rlfleet_test_mocks:private_key_policy",
            {"out_key": out_key},
            num_envs=1,
        ) as addresses,
        GrpcCollector(addresses, frames_per_batch=30, sync=True) as collector,
    ):
        batch = collector.next()
    root = set(batch.keys())  # a TensorDict iterates over its rows, not its keys
    assert not any(key.startswith("_") for key in root)
    assert (out_key if isinstance(out_key, str) else tuple(out_key)) not in batch.keys(True, True)
    assert "action" in root


@pytest.mark.parametrize(
    "exploration_type", [ExplorationType.DETERMINISTIC, ExplorationType.RANDOM]
)
def test_port_exploration_type(exploration_type: ExplorationType) -> None:
    """TorchRL's collectors' ``exploration_type``: a sampling actor's mode, or its samples.

    Both equal TorchRL's ``Collector`` with the same argument and seed.
    """
    config = torchrl_config("cartpole", "sampling_policy")
    mode = exploration_type
    ours = fleet_batches(config, 2, 20, exploration_type=mode)
    theirs = torchrl_batches(
        "cartpole", "sampling_policy", 2, 20, exploration_type=exploration_type
    )
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference)
    actions = torch.cat([batch["action"] for batch in ours])
    logits = torch.cat([batch["logits"] for batch in ours])
    greedy = torch.nn.functional.one_hot(logits.argmax(-1), 2)
    deterministic = exploration_type is ExplorationType.DETERMINISTIC
    assert bool((actions == greedy).all()) == deterministic
