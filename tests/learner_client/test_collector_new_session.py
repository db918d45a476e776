"""A new collector on a fleet starts from reset envs, as a new TorchRL collector does.

The fleet outlives its collectors: the next one used to continue the last one's trajectories
mid-episode (its first frames were the old trajectories', its random frames carried the old
policy's outputs). A resumed session (the same learner reconnecting) continues instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from learner_fleet import ACTOR_ENV, start_actors

from learner_client import GrpcCollector

pytestmark = pytest.mark.long

TORCHRL = [
    *("--kind", "torchrl", "--env-factory", "rlfleet_test_torchrl:cartpole"),
    *("--policy", "rlfleet_test_torchrl:sampling_policy"),
]


@pytest.fixture(scope="module", params=["env", "torchrl"])
def actor(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    args = ["--worker-id", "0", "--num-envs", "2", "--seed", "3"]
    kind_args = TORCHRL if request.param == "torchrl" else ["--policy", "mlp"]
    (process,) = start_actors([[*args, *kind_args]], env=ACTOR_ENV)
    yield request.param, process.address
    process.close()


def test_a_new_collector_starts_new_trajectories_with_no_old_outputs(
    actor: tuple[str, str],
) -> None:
    kind, address = actor
    with GrpcCollector([address], frames_per_batch=8, total_frames=16) as first:
        batches = list(first)
    old_ids = set(torch.cat([b["collector", "traj_ids"].flatten() for b in batches]).tolist())
    ongoing = ~batches[-1]["next", "done"][:, -1].flatten()
    assert ongoing.any()  # CartPole lasts longer than 8 steps: an episode was cut
    with GrpcCollector(
        [address], frames_per_batch=8, total_frames=8, init_random_frames=8
    ) as second:
        batch = second.next()
    assert not set(batch["collector", "traj_ids"][:, 0].tolist()) & old_ids
    if kind == "torchrl":  # TorchRL writes zeros for the policy's outputs on random frames
        assert (batch["logits"] == 0).all()
        assert (batch["action_log_prob"] == 0).all()
