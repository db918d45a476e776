"""RolloutWorker: batches, settings, weights between steps, seeding, traj ids, backends."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from actor_service._config import ActorConfig, ModelSpec
from actor_service._rollout import RolloutWorker
from common.config import CollectSettings


def _worker(**overrides) -> RolloutWorker:
    fields = {"num_envs": 4, "seed": 0, **overrides}
    return RolloutWorker(ActorConfig(**fields))


def test_rollout_worker_collects_a_cartpole_batch_of_the_configured_size() -> None:
    with _worker() as worker:
        worker.configure(CollectSettings(frames_per_batch=64))
        batch = worker.collect_batch()
        assert isinstance(batch, TensorDict)
        assert batch.batch_size == torch.Size([4, 16])
        assert batch.names == [None, "time"]
        assert batch["action"].dtype == torch.int64
        assert batch["action"].sum(-1).eq(1).all()
        assert (worker.frames, worker.batches) == (64, 1)


def test_rollout_worker_continues_observations_across_steps_and_batches() -> None:
    with _worker(models=(ModelSpec(factory="random"),)) as worker:
        worker.configure(CollectSettings(frames_per_batch=200))
        first, second = worker.collect_batch(), worker.collect_batch()
        done = first["next", "done"].squeeze(-1)
        follows = first["next", "observation"][:, :-1] == first["observation"][:, 1:]
        assert follows.all(-1)[~done[:, :-1]].all()
        assert done.any()  # 50 steps of random CartPole always end an episode
        carried = first["next", "observation"][:, -1] == second["observation"][:, 0]
        assert carried.all(-1)[~done[:, -1]].all()
