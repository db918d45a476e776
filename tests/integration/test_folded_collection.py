"""End to end, folded batches reach the learner exactly as the actor collected them in full."""

from __future__ import annotations

import torch

from actor_service import ActorConfig, ModelSpec
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.env.core import EnvCore
from common.config import CollectSettings
from learner_client import GrpcCollector, LocalFleet


def test_collector_rebuilds_folded_batches_bit_for_bit() -> None:
    # FrozenLake: one-hot observations of 128 bytes (folded), holes and the goal end episodes.
    with (
        LocalFleet(1, "FrozenLake-v1", num_envs=3, policy="random", seed=5) as fleet,
        GrpcCollector(
            fleet.addresses, frames_per_batch=60, total_frames=180, max_frames_per_traj=4
        ) as collector,
    ):
        received = list(collector)
    config = ActorConfig(
        env_pool=EnvPoolSettings(env="FrozenLake-v1"),
        num_envs=3,
        seed=5,
        models=(ModelSpec(factory="random"),),
    )
    with EnvCore(config) as worker:  # the same actor, in process, not folding
        worker.configure(CollectSettings(frames_per_batch=60, max_frames_per_traj=4))
        expected = [worker.collect_batch() for _ in received]
    assert len(received) == 3
    ends = 0
    for got, full in zip(received, expected, strict=True):
        assert got.names == full.names
        keys = [k for k in full.keys(True, True) if k[0] != "collector"]
        assert set(keys) <= set(got.keys(True, True))
        for key in keys:
            a, b = got.get(key), full.get(key)
            assert (a.dtype, a.shape) == (b.dtype, b.shape), key
            assert torch.equal(a, b), key
        ends += int(full["next", "done"][:, :-1].sum())
    assert ends > 0  # episodes ended inside batches, so finals were sent mid-batch
