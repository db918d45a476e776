"""Our batches against TorchRL's ``Collector`` for the same env and policy.

Each test collects one batch with a ``EnvCore`` and one with
``torchrl.collectors.Collector(SerialEnv(N, GymEnv(id)), policy,
track_policy_version=...)`` and compares the key sets (nesting included), dtypes,
shapes, dim names and done/trajectory semantics. Values differ (different random
streams) except where the semantics fix them (step counts, truncation marks, split
masks of a never-terminating env), and there they must be equal.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import gymnasium
import pytest
import rlfleet_test_envs  # noqa: F401 - registers RlfleetScalar-v0
import torch
from tensordict import TensorDict

from actor_service._config import ActorConfig, ModelSpec
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.env.core import EnvCore, derive_seed
from common.config import CollectSettings
from common.policies import make_policy

torchrl_collectors = pytest.importorskip("torchrl.collectors")
torchrl_envs = pytest.importorskip("torchrl.envs")
from torchrl._utils import seed_generator  # noqa: E402
from torchrl.envs.llm.transforms import PolicyVersion  # noqa: E402

VERSION_KEYS = {"policy_version", ("next", "policy_version")}


def _ours(env_id: str, factory: str, num_envs: int, **settings) -> TensorDict:
    config = ActorConfig(
        env_pool=EnvPoolSettings(env=env_id),
        num_envs=num_envs,
        seed=0,
        models=(ModelSpec(factory=factory),),
    )
    with EnvCore(config) as worker:
        frames = settings.pop("frames_per_batch")
        worker.configure(CollectSettings(frames_per_batch=frames, **settings))
        return worker.collect_batch()


def _theirs(env_id: str, factory: str, num_envs: int, track: bool = True, **kwargs) -> TensorDict:
    space_env = gymnasium.make(env_id)
    torch.manual_seed(0)
    policy = None
    if factory != "random":
        policy = make_policy(factory, space_env.observation_space, space_env.action_space)
    make: Callable = lambda: torchrl_envs.GymEnv(env_id)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TorchRL's advisories, not ours
        collector = torchrl_collectors.Collector(
            torchrl_envs.SerialEnv(num_envs, make),
            policy,
            track_policy_version=PolicyVersion() if track else False,
            **kwargs,
        )
        try:
            collector.set_seed(0)
            return next(iter(collector))
        finally:
            collector.shutdown()


def _layout(batch: TensorDict) -> dict:
    return {
        key: (value.dtype, tuple(value.shape))
        for key, value in batch.items(include_nested=True, leaves_only=True)
    }


def _assert_same_layout(ours: TensorDict, theirs: TensorDict) -> None:
    assert _layout(ours) == _layout(theirs)
    assert ours.names == theirs.names


def _assert_done_semantics(batch: TensorDict) -> None:
    """Root flags are the state at t (always live); a done in next starts a reset and a new id."""
    done = batch["next", "done"].squeeze(-1)
    assert done.any(), "the batch must contain an episode end for this check to mean anything"
    terminated, truncated = batch["next", "terminated"], batch["next", "truncated"]
    assert torch.equal(batch["next", "done"], terminated | truncated)
    for key in ("done", "terminated", "truncated"):
        assert not batch[key].any()
    follows = (batch["next", "observation"][:, :-1] == batch["observation"][:, 1:]).all(-1)
    assert follows[~done[:, :-1]].all()
    assert not follows[done[:, :-1]].any()
    traj = batch["collector", "traj_ids"]
    assert torch.equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])


@pytest.mark.parametrize(
    ("env_id", "factory", "num_envs", "steps"),
    [
        ("CartPole-v1", "mlp", 3, 100),
        ("CartPole-v1", "random", 3, 100),
        ("Pendulum-v1", "mlp", 2, 205),
        ("FrozenLake-v1", "random", 2, 50),
        ("RlfleetScalar-v0", "mlp", 2, 30),  # a Box of shape (): [..., 1] on both sides
    ],
    ids=["cartpole-mlp", "cartpole-random", "pendulum-mlp", "frozenlake-random", "scalar-mlp"],
)
def test_parity_batch_layout_and_done_semantics(
    env_id: str, factory: str, num_envs: int, steps: int
) -> None:
    frames = num_envs * steps
    ours = _ours(env_id, factory, num_envs, frames_per_batch=frames)
    theirs = _theirs(env_id, factory, num_envs, frames_per_batch=frames)
    _assert_same_layout(ours, theirs)
    assert ours.batch_size == (num_envs, steps)
    assert ours.names == [None, "time"]
    _assert_done_semantics(ours)
    _assert_done_semantics(theirs)


def test_parity_differs_from_untracked_torchrl_only_by_policy_version() -> None:
    ours = _ours("CartPole-v1", "mlp", 2, frames_per_batch=40)
    theirs = _theirs("CartPole-v1", "mlp", 2, track=False, frames_per_batch=40)
    ours_keys = set(ours.keys(include_nested=True, leaves_only=True))
    their_keys = set(theirs.keys(include_nested=True, leaves_only=True))
    assert ours_keys - their_keys == VERSION_KEYS
    assert not their_keys - ours_keys


def test_parity_max_frames_per_traj_counts_and_truncates_like_step_counter() -> None:
    settings = {"frames_per_batch": 24, "max_frames_per_traj": 5}
    ours = _ours("Pendulum-v1", "random", 2, **settings)
    theirs = _theirs("Pendulum-v1", "random", 2, **settings)
    _assert_same_layout(ours, theirs)
    for key in ("step_count", ("next", "step_count"), ("next", "truncated"), ("next", "done")):
        assert torch.equal(ours[key], theirs[key]), key
    _assert_done_semantics(ours)


def test_parity_set_truncated_marks_the_same_frames() -> None:
    settings = {"frames_per_batch": 24, "set_truncated": True}
    ours = _ours("Pendulum-v1", "random", 2, **settings)
    theirs = _theirs("Pendulum-v1", "random", 2, **settings)
    _assert_same_layout(ours, theirs)
    for key in (("next", "truncated"), ("next", "done"), ("next", "terminated")):
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["next", "truncated"][:, -1].all()


def test_parity_split_trajs_pads_and_masks_the_same_way() -> None:
    settings = {"frames_per_batch": 24, "max_frames_per_traj": 5, "split_trajs": True}
    ours = _ours("Pendulum-v1", "random", 2, **settings)
    theirs = _theirs("Pendulum-v1", "random", 2, **settings)
    _assert_same_layout(ours, theirs)
    assert ours.batch_size == (6, 5)
    assert torch.equal(ours["collector", "mask"], theirs["collector", "mask"])
    assert torch.equal(ours["step_count"], theirs["step_count"])


@pytest.mark.parametrize("seed", [0, 10, 2**32 + 5, 2**63])
def test_parity_derive_seed_matches_torchrl_seed_generator(seed: int) -> None:
    assert derive_seed(seed) == seed_generator(seed)
