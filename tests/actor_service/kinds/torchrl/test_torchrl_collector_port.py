"""TorchRL's own collector tests on its mock envs (``test/test_collectors.py``), on actors.

The tests come from pytorch/rl main at ``ae9719f1`` (2026-08-22) and run against the
installed torchrl 0.14.1, whose ``Collector`` gives the reference batches. Each test is
one of TorchRL's, run on a real actor and learner over loopback with the same mock env
and policy (``rlfleet_test_mocks``), and held to what TorchRL's test checks; where the
env is deterministic, the batches must also equal its ``Collector``'s.
TorchRL's ``MultiSyncCollector``/``MultiaSyncCollector`` consistency tests become two
actors: consecutive batches differ, and the last dim is named ``"time"``.
TorchRL's ``TestHeterogeneousEnvsCollector`` (agents of different shapes in one group, lazy
stacks) is refused at start (``test_torchrl_core.py``); heterogeneous agents travel in the
per-group layout instead (``test_torchrl_pixels_agents.py``, VMAS ``simple_tag``).
Where rlfleet differs on purpose (``track_traj_ids``, ``compact_obs``, ``trajs_per_batch``,
a shared ``VecNorm``), the test holds the documented behaviour and names its docs.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_mocks
import rlfleet_test_torchrl
from tensordict import TensorDict
from torchrl.collectors import MultiSyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.testing.assertions import check_rollout_consistency_multikey_env
from torchrl.testing.mocking_classes import (
    ContinuousActionVecMockEnv,
    DiscreteActionVecMockEnv,
    DiscreteActionVecPolicy,
)
from torchrl_harness import (
    any_done,
    assert_equal_batches,
    assert_strings_follow_steps,
    fleet_batches,
    torchrl_batches,
    torchrl_config,
)

from actor_service import create_server
from actor_service._kinds.torchrl.core import TorchRLCore
from learner_client import GrpcCollector

NESTED = "rlfleet_test_mocks:nested"
COUNT = "rlfleet_test_mocks:count_policy"
MULTI_KEY = "rlfleet_test_mocks:multi_key"
VEC = "rlfleet_test_mocks:discrete_vec"


@pytest.mark.parametrize("nest_obs_action", [True, False])
@pytest.mark.parametrize("nest_done", [True, False])
@pytest.mark.parametrize("nest_reward", [True, False])
def test_port_collector_nested_env_combinations(
    nest_obs_action: bool, nest_done: bool, nest_reward: bool
) -> None:
    kwargs = {
        "nest_reward": nest_reward,
        "nest_done": nest_done,
        "nest_obs_action": nest_obs_action,
    }
    config = torchrl_config(NESTED, COUNT, env_kwargs=kwargs)
    ours = fleet_batches(config, 2, 20)
    theirs = torchrl_batches(NESTED, COUNT, 2, 20, env_kwargs=kwargs)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference)
    assert any_done(ours)


@pytest.mark.parametrize("batch", [0, 5])
def test_port_nested_env_dims(batch: int) -> None:
    nested_dim = 5
    kwargs = {"nested_dim": nested_dim, "batch": batch}
    config = torchrl_config(NESTED, COUNT, env_kwargs=kwargs, num_envs=batch or 2)
    (td,) = fleet_batches(config, 1, 20)
    envs = batch or 2
    assert ("data", "reward") not in td.keys(True)
    assert td.batch_size == (envs, 20 // envs)
    assert td["data"].batch_size == (envs, 20 // envs, nested_dim)
    assert td["next", "data"].batch_size == (envs, 20 // envs, nested_dim)


def test_port_nested_env_of_two_batch_dims_is_refused() -> None:
    # Refused with the reason: no num_envs fits an env batched over two dims.
    with pytest.raises(ValueError, match=r"batched over 2 dims, \[5, 2\]: an actor's envs are"):
        TorchRLCore(torchrl_config("rlfleet_test_mocks:nested_2d", COUNT, num_envs=10))


@pytest.mark.parametrize("batch", [0, 2])
@pytest.mark.parametrize("frames_per_batch", [4, 8, 16])
@pytest.mark.parametrize("max_steps", [2, 3])
def test_port_multi_key_collector(batch: int, frames_per_batch: int, max_steps: int) -> None:
    envs = batch or 2
    config = torchrl_config(
        MULTI_KEY,
        "rlfleet_test_mocks:multi_key_policy",
        policy_kwargs={"envs": 0 if batch else envs},
        env_kwargs={"max_steps": max_steps, "batch": batch},
        num_envs=envs,
    )
    (td,) = fleet_batches(config, 1, frames_per_batch)
    for key in td.keys(True, True):
        assert (key if isinstance(key, str) else key[-1]) != "_reset", key
    check_rollout_consistency_multikey_env(td.exclude("collector"), max_steps=max_steps)


@pytest.mark.parametrize(
    ("env", "policy", "kwargs"),
    [
        (NESTED, COUNT, {}),
        # One env is stepped as it is (TorchRL's Collector on it): the policy's spec unbatched.
        (MULTI_KEY, "rlfleet_test_mocks:multi_key_policy", {"deterministic": True}),
    ],
    ids=["nested", "multi-key"],
)
def test_port_multi_collector_consistency(env: str, policy: str, kwargs: dict[str, Any]) -> None:
    # One env, 20 steps a batch; episodes whose length does not divide 20 (TorchRL's).
    env_kwargs = {"max_steps": 5} if env == MULTI_KEY else {}
    config = torchrl_config(env, policy, kwargs, num_envs=1, env_kwargs=env_kwargs)
    with create_server(config).run_in_thread() as actor:
        batches = {}
        for sync in (True, False):
            with GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=20, sync=sync) as c:
                one, two = c.next(), c.next()
            assert one.names[-1] == "time"
            assert not (one.exclude("collector") == two.exclude("collector")).all()
            batches[sync] = one.exclude("collector")
    assert batches[True].batch_size == (1, 1, 20)  # [workers, envs, time] when sync
    assert batches[False].batch_size == (1, 20)
    # TorchRL's MultiAsync and MultiSync first batches are equal, reshaped.
    assert (batches[True].reshape(batches[False].shape) == batches[False]).all()


def test_port_reset_heterogeneous_envs() -> None:
    config = torchrl_config("rlfleet_test_mocks:mixed_limits", "random")
    (data,) = fleet_batches(config, 1, 100)
    truncated = data["next", "truncated"].squeeze(-1)
    assert torch.equal(truncated[0], torch.tensor([False, True]).repeat(25))
    assert torch.equal(truncated[1], torch.tensor([False, False, True]).repeat(17)[:50])


def test_port_policy_with_mask_is_never_called_on_zeros() -> None:
    config = torchrl_config(
        "rlfleet_test_mocks:counting_batched", "rlfleet_test_mocks:no_zeros_policy", num_envs=1
    )
    (data,) = fleet_batches(config, 1, 10)
    assert (data["observation"] >= 10).all()


def test_port_max_frames_per_traj_set_then_lifted_on_fresh_envs() -> None:
    # The learner's sessions change the limit; envs just reset take it (or lose it) as they are.
    config = torchrl_config("counting", COUNT)
    with create_server(config).run_in_thread() as actor:
        address = f"127.0.0.1:{actor.port}"
        for limit in (3, 0):
            with GrpcCollector([address], frames_per_batch=10, max_frames_per_traj=limit) as c:
                c.set_seed(0)  # new trajectories: the envs are fresh when the limit comes
                batch = c.next()
            assert c.stats()["failures"] == 0
            assert ("step_count" in batch) == bool(limit)
            assert ("truncated" in batch["next"]) == bool(limit)
        steps = batch["next", "observation"][0, :, 0]  # CountingEnv counts its steps
        assert steps.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]  # no limit: past 3


@contextlib.contextmanager
def _actors(workers: int, env: str, policy: str, **config: Any) -> Iterator[list[str]]:
    """The addresses of ``workers`` actors of ``torchrl_config``, worker ids and seeds 0, 1, ..."""
    with contextlib.ExitStack() as stack:
        actors = [
            stack.enter_context(
                create_server(
                    torchrl_config(env, policy, worker_id=w, seed=w, **config)
                ).run_in_thread()
            )
            for w in range(workers)
        ]
        yield [f"127.0.0.1:{actor.port}" for actor in actors]


def _two_actors(num_envs: int) -> contextlib.AbstractContextManager[list[str]]:
    """Two actors of ``num_envs`` of TorchRL's ``DiscreteActionVecMockEnv``, random actions."""
    return _actors(2, VEC, "random", num_envs=num_envs)


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_port_multi_sync_ordering_of_a_list_of_env_constructors() -> None:
    # TorchRL's test_multi_sync_data_collector_ordering: MultiSyncCollector([env_fn] * 2) of
    # unbatched envs stacks its workers, [2, T] named [None, "time"]; its async sibling gives
    # one worker's [T]. It gave [2, 1, T] and a warning suggesting another fleet.
    def env_fn() -> Any:
        return DiscreteActionVecMockEnv()

    with _two_actors(1) as addresses:
        for sync, shape in ((True, (2, 10)), (False, (20,))):
            with GrpcCollector(
                addresses, create_env_fn=[env_fn] * 2, frames_per_batch=20, sync=sync
            ) as collector:
                batch = collector.next()
            assert batch.batch_size == shape
            assert batch.names[-1] == "time"
    reference = MultiSyncCollector([env_fn] * 2, None, frames_per_batch=20, total_frames=20)
    assert next(iter(reference)).batch_size == (2, 10)
    reference.shutdown()


def test_port_an_env_class_or_a_batched_env_as_create_env_fn() -> None:
    # TorchRL's tests pass the env class itself (TestCollectorStats, TestMakePolicyFactory) and
    # constructors of a SerialEnv (test_collector_batch_size): the class crashed the check
    # (read as an env object) and the SerialEnv built for it raised closing it unstarted.
    def serial() -> Any:
        return SerialEnv(2, DiscreteActionVecMockEnv)

    with _two_actors(2) as addresses:
        for create_env_fn in (DiscreteActionVecMockEnv, serial):
            with (
                warnings.catch_warnings(),  # a class of one env for a fleet of 4: warned
                GrpcCollector(
                    addresses, create_env_fn=create_env_fn, frames_per_batch=20, sync=True
                ) as collector,
            ):
                warnings.simplefilter("ignore", UserWarning)
                assert collector.next().numel() == 20


def _seeded_batches(address: str, seed: int, sync: bool, **settings: Any) -> list[TensorDict]:
    """The first two batches of a collector seeded ``seed``, without rlfleet's ids."""
    with GrpcCollector([address], sync=sync, device="cpu", **settings) as collector:
        collector.set_seed(seed)
        return [collector.next().exclude("collector") for _ in range(2)]


@pytest.mark.parametrize("num_envs", [1, 2])
def test_port_concurrent_collector_consistency(num_envs: int) -> None:
    """TorchRL's ``test_concurrent_collector_consistency``: ``Collector`` and ``AsyncCollector``.

    One actor seeded alike gives the same two batches to a sync and an async collector.
    """
    config = torchrl_config(VEC, "rlfleet_test_mocks:vec_policy", num_envs=num_envs)
    frames = {"frames_per_batch": 20 * num_envs, "total_frames": 200 * num_envs}
    with create_server(config).run_in_thread() as actor:
        address = f"127.0.0.1:{actor.port}"
        synced = _seeded_batches(address, 40, True, max_frames_per_traj=200, **frames)
        concurrent = _seeded_batches(address, 40, False, max_frames_per_traj=2000, **frames)
    for batches in (synced, concurrent):
        assert batches[-1].names[-1] == "time"
        assert not (batches[0] == batches[1]).all()
    for mine, theirs in zip(synced, concurrent, strict=True):
        assert mine.batch_size == (1, *theirs.batch_size)  # sync: [workers, envs, time]
        assert (mine[0] == theirs).all()


@pytest.mark.parametrize("num_envs", [1, 2])
def test_port_collector_consistency(num_envs: int) -> None:
    """TorchRL's ``test_collector_consistency``: a batch is the seeded env's own rollout."""
    seed = 100
    make = rlfleet_test_mocks.discrete_vec
    policy = DiscreteActionVecPolicy()
    env = TransformedEnv(make() if num_envs == 1 else SerialEnv(num_envs, make), StepCounter(20))
    env.set_seed(seed)
    rollout = env.rollout(max_steps=50, policy=policy, auto_reset=True)
    env.set_seed(seed)
    assert (env.rollout(max_steps=50, policy=policy, auto_reset=True) == rollout).all()
    assert not (env.rollout(max_steps=50, policy=policy, auto_reset=True) == rollout).all()
    env.close()
    config = torchrl_config(VEC, "rlfleet_test_mocks:vec_policy", num_envs=num_envs)
    with create_server(config).run_in_thread() as actor:
        one, two = _seeded_batches(
            f"127.0.0.1:{actor.port}",
            seed,
            False,
            frames_per_batch=20 * num_envs,
            total_frames=200,
            max_frames_per_traj=20,
        )
    assert not (one == two).all()
    rollout = rollout if num_envs > 1 else rollout.unsqueeze(0)  # one actor: [envs, time]
    assert one.batch_size == rollout.batch_size
    assert (one.select(*rollout.keys(True, True)) == rollout).all()


@pytest.mark.parametrize("static_seed", [True, False])
def test_port_set_seed_chains_over_every_env(static_seed: bool) -> None:
    """TorchRL's ``test_collector_vecnorm_envcreator``'s seeding: one chain over every env.

    ``MultiSyncCollector([ParallelEnv(4, ...)] * 2).set_seed`` returns the seed after all
    8 envs (``seed`` itself when static); here 2 actors of 2 envs. Its shared ``VecNorm``
    is not ported: each actor keeps its own statistics (docs/collector.md, "A fleet of N
    actors splits each batch over at least N envs, each with its own transforms' statistics").
    """
    reference = [SerialEnv(2, rlfleet_test_torchrl.cartpole) for _ in range(2)]
    expected = 0
    for env in reference:
        expected = env.set_seed(expected, static_seed=static_seed)
        env.close()
    assert (expected == 0) == static_seed
    with (
        _actors(2, "cartpole", "greedy_policy") as addresses,
        GrpcCollector(addresses, frames_per_batch=8, sync=True) as collector,
    ):
        assert collector.set_seed(0, static_seed=static_seed) == expected
        first = collector.next()["observation"][..., 0, :].reshape(4, -1)
    distinct = {tuple(row.tolist()) for row in first}
    assert len(distinct) == (1 if static_seed else 4)


@pytest.mark.parametrize("workers", [1, 2], ids=["Collector", "MultiSync"])
def test_port_collector_lazy_random_policy_instance(workers: int) -> None:
    """TorchRL's ``TestRandomPolicyLazyInit``: ``policy=RandomPolicy()``, spec-less, collects.

    ``Collector(env, policy=RandomPolicy())`` fills the instance's ``action_spec`` from its
    env (the script's env object here too); ``MultiSyncCollector``'s workers fill their own
    copies. The actors act with their own random policy. It raised ``TypeError``.
    """
    policy = RandomPolicy()
    env = ContinuousActionVecMockEnv()
    create_env_fn = env if workers == 1 else [ContinuousActionVecMockEnv] * workers
    with _actors(workers, "rlfleet_test_mocks:continuous_vec", "random", num_envs=1) as addresses:
        with pytest.warns(UserWarning, match=r"RandomPolicy\(\.\.\.\) holds no weights to push"):
            collector = GrpcCollector(
                addresses,
                create_env_fn=create_env_fn,
                policy=policy,
                frames_per_batch=10 * workers,
                total_frames=20 * workers,
                sync=True,
            )
        with collector:
            assert (policy.action_spec is not None) == (workers == 1)
            data = collector.next()
    assert data.batch_size == ((10,) if workers == 1 else (2, 10))
    assert data["action"].shape[-1] == env.full_action_spec["action"].shape[-1]


def test_a_policy_neither_a_module_nor_callable_is_refused_before_connecting() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module or a callable without weights"):
        GrpcCollector(["127.0.0.1:1"], policy="random", frames_per_batch=8, connect_timeout=0.5)


def test_port_collector_without_traj_ids() -> None:
    """TorchRL's ``test_collector_without_traj_ids``: ``track_traj_ids=False``.

    A documented difference: TorchRL's batch then has no ``"collector"`` entry; a fleet's
    always has its ids (docs/collector.md, "Every argument on a fleet": ``track_traj_ids``
    has "no effect, silently: ... trajectory ids and per-frame `policy_version` are always
    there").
    """
    with (
        warnings.catch_warnings(),
        _actors(1, "counting", "random", env_kwargs={"max_steps": 3}, num_envs=1) as addresses,
        GrpcCollector(addresses, frames_per_batch=4, total_frames=4, track_traj_ids=False) as c,
    ):
        warnings.simplefilter("error")
        data = c.next()
    assert ("collector", "traj_ids") in data.keys(True)


@pytest.mark.parametrize("sync", [True, False], ids=["test_sync", "test_async"])
def test_port_nontensor_two_workers(sync: bool) -> None:
    """TorchRL's ``TestCollectorsNonTensor.test_sync``/``test_async``: two workers' strings."""
    with (
        _actors(2, "rlfleet_test_mocks:nontensor_cartpole", "random", num_envs=1) as addresses,
        GrpcCollector(
            addresses, frames_per_batch=10, total_frames=200, sync=sync, cat_results="stack"
        ) as collector,
    ):
        batches = list(collector)
    # sync: [workers, envs, time], each worker's row in turn; async: one worker's [envs, time]
    rows = torch.cat(batches, -1)[:, 0].unbind(0) if sync else [b[0] for b in batches]
    assert sum(row.numel() for row in rows) == 200
    for row in rows:
        assert_strings_follow_steps(list(row["nt"]), list(row["next", "nt"]))
    assert any("reset!" in list(row["nt"][1:]) for row in rows)


def test_port_multi_async_probabilistic_actor_writes_log_prob_to_rb() -> None:
    """TorchRL's ``test_multi_async_probabilistic_actor_writes_log_prob_to_rb``.

    Two workers fill a replay buffer with a ``ProbabilisticActor``'s log-probabilities.
    TorchRL's test asks whole trajectories (``trajs_per_batch=2``), which a fleet refuses
    (docs/collector.md: "complete-trajectory batches are not collected"); frames here.
    """
    buffer = ReplayBuffer(storage=LazyTensorStorage(400))
    with (
        _actors(2, "cartpole", "sampling_policy", num_envs=1) as addresses,
        GrpcCollector(
            addresses,
            create_env_fn=[rlfleet_test_torchrl.cartpole] * 2,  # TorchRL's layout: [time]
            replay_buffer=buffer,
            frames_per_batch=16,
            total_frames=96,
            sync=False,
        ) as collector,
    ):
        assert all(batch is None for batch in collector)
    assert len(buffer) == 96
    data = buffer[:]
    assert "action_log_prob" in data.keys(True, True)
    logits = data["logits"].log_softmax(-1)
    assert torch.allclose((logits * data["action"]).sum(-1), data["action_log_prob"])


@pytest.mark.parametrize("workers", [1, 2], ids=["Collector", "MultiSync"])
def test_port_compact_obs_keeps_next_obs(workers: int) -> None:
    """TorchRL's ``test_compact_obs_drops_next_obs``, held to a documented difference.

    ``compact_obs=True`` drops ``("next", "observation")`` from TorchRL's batches; a fleet's
    keep it (docs/collector.md, "Every argument on a fleet": ``compact_obs`` has "no effect,
    silently ... observations travel once (folded) anyway"). The test's identity holds:
    within a trajectory, the next root observation is the step's ``("next", ...)`` one.
    """
    with (
        _actors(workers, "rlfleet_test_mocks:continuous_vec_init", "random", num_envs=1) as a,
        GrpcCollector(a, frames_per_batch=30 * workers, sync=True, compact_obs=True) as c,
    ):
        data = c.next()
    assert {"observation", ("next", "observation"), ("next", "reward")} <= set(data.keys(True))
    done = data["next", "done"].squeeze(-1)[..., :-1]
    following = data["observation"][..., 1:, :][~done]
    assert torch.equal(data["next", "observation"][..., :-1, :][~done], following)


def test_port_single_collector_stats() -> None:
    """TorchRL's ``TestCollectorStats``' single-collector tests: counts as batches are taken.

    ``test_single_collector_stats``, ``..._policy_version`` and ``test_stats_is_serializable``
    (the multi-worker forms: ``test_collector_torchrl_parity.py``).
    """
    with (
        _actors(1, "rlfleet_test_mocks:continuous_vec", "random", num_envs=1) as addresses,
        GrpcCollector(addresses, frames_per_batch=16, total_frames=32, sync=True) as collector,
    ):
        stats = collector.stats()
        assert (stats["frames"], stats["batches"]) == (0, 0)
        assert (stats["total_frames"], stats["requested_frames_per_batch"]) == (32, 16)
        assert not stats["completed"]
        seen = [collector.stats()["frames"] for _ in collector]
        stats = collector.stats()
    assert seen == [16, 32]
    assert stats["batches"] == 2
    assert stats["completed"]
    assert isinstance(stats["policy_version"], int)
    assert json.loads(json.dumps(stats))["frames"] == 32
