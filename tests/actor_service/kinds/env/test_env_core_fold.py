"""The actor's folded batches unfold to exactly the batches it collects in full."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from actor_service._config import ActorConfig
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.env.core import EnvCore
from common.config import CollectSettings
from common.packets.folding import INDEX, FoldedBatch


def _collect(fold: bool, batches: int, env: str, **settings) -> list[TensorDict | FoldedBatch]:
    with EnvCore(ActorConfig(env_pool=EnvPoolSettings(env=env), num_envs=3, seed=7)) as worker:
        worker.configure(CollectSettings(frames_per_batch=60, fold_observations=fold, **settings))
        return [worker.collect_batch() for _ in range(batches)]


def _assert_identical(a: TensorDict, b: TensorDict) -> None:
    assert list(a.keys(True, True)) == list(b.keys(True, True))  # same keys, same order
    assert a.batch_size == b.batch_size
    assert a.names == b.names
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if key == ("collector", "traj_ids"):  # two workers: their epoch tags differ
            x, y = x & 0xFFFF_FFFF, y & 0xFFFF_FFFF
        assert (x.dtype, x.shape) == (y.dtype, y.shape), key
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), key


@pytest.mark.parametrize(
    ("env", "settings"),
    [
        # One-hot Discrete observations (128 bytes); holes and the goal terminate.
        ("FrozenLake-v1", {}),
        ("FrozenLake-v1", {"max_frames_per_traj": 3}),  # truncations by the limit too
        ("FrozenLake-v1", {"reset_at_each_iter": True, "set_truncated": True}),
    ],
)
def test_rollout_folded_batches_unfold_to_the_full_batches(env: str, settings: dict) -> None:
    full = _collect(False, 3, env, **settings)
    folded = _collect(True, 3, env, **settings)
    ended = 0
    for whole, part in zip(full, folded, strict=True):
        assert isinstance(part, FoldedBatch)
        assert isinstance(whole, TensorDict)
        assert ("next", "observation") not in part.batch.keys(True)
        done = whole["next", "done"].squeeze(-1)
        # Finals: every step that ended an episode, and each env's last step.
        expected = done.clone()
        expected[:, -1] = True
        assert part.finals[INDEX].tolist() == expected.reshape(-1).nonzero().squeeze(-1).tolist()
        ended += int(done[:, :-1].sum())
        _assert_identical(part.unfold(), whole)
    assert ended > 0


def test_rollout_never_folds_split_trajectories_or_small_observations() -> None:
    (small,) = _collect(True, 1, "CartPole-v1")  # 16 bytes per observation
    assert isinstance(small, TensorDict)
    assert ("next", "observation") in small.keys(True)
    (batch,) = _collect(True, 1, "FrozenLake-v1", split_trajs=True)
    assert isinstance(batch, TensorDict)
    assert ("next", "observation") in batch.keys(True)


@pytest.mark.parametrize(("desc", "folds"), [(["SFFF", "FHFG"], True), (["SFFHFFG"], False)])
def test_rollout_folds_observations_from_the_minimum_frame_size_on(
    desc: list[str], folds: bool
) -> None:
    """FrozenLake's one-hot int64 observations: 8 cells are 64 bytes (the minimum), 7 are 56."""
    pool = EnvPoolSettings(env="FrozenLake-v1", env_kwargs={"desc": desc})
    with EnvCore(ActorConfig(env_pool=pool, num_envs=2, seed=7)) as worker:
        assert worker.models.observation_codec.shape == (len("".join(desc)),)
        worker.configure(CollectSettings(frames_per_batch=8, fold_observations=True))
        assert isinstance(worker.collect_batch(), FoldedBatch) is folds
