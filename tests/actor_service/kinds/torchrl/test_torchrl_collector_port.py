"""TorchRL's own collector tests on its mock envs (``test/test_collector.py``), on actors.

Each test is one of TorchRL's, run on a real actor and learner over loopback with the
same mock env and policy (``rlfleet_test_mocks``), and held to what TorchRL's test
checks; where the env is deterministic, the batches must also equal its ``Collector``'s.
TorchRL's ``MultiSyncCollector``/``MultiaSyncCollector`` consistency tests become two
actors: consecutive batches differ, and the last dim is named ``"time"``.
TorchRL's ``TestHeterogeneousEnvsCollector`` (agents of different shapes in one group, lazy
stacks) is refused at start (``test_torchrl_core.py``); heterogeneous agents travel in the
per-group layout instead (``test_torchrl_pixels_agents.py``, VMAS ``simple_tag``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import SerialEnv
from torchrl.testing.assertions import check_rollout_consistency_multikey_env
from torchrl.testing.mocking_classes import DiscreteActionVecMockEnv
from torchrl_harness import (
    any_done,
    assert_equal_batches,
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
def _two_actors(num_envs: int) -> Iterator[list[str]]:
    """Two actors of ``num_envs`` of TorchRL's ``DiscreteActionVecMockEnv``, random actions."""
    with contextlib.ExitStack() as stack:
        actors = [
            stack.enter_context(
                create_server(
                    torchrl_config(VEC, "random", num_envs=num_envs, worker_id=w, seed=w)
                ).run_in_thread()
            )
            for w in range(2)
        ]
        yield [f"127.0.0.1:{actor.port}" for actor in actors]


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
