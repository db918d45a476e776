"""GrpcCollector batches go, unchanged, into TorchRL's GAE and ClipPPOLoss."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from common.policies import make_policy, make_value_mlp
from learner_client import GrpcCollector
from learner_client._local_fleet import LocalFleet

HIDDEN = [16, 16]


@pytest.fixture(scope="module")
def fleet():
    with LocalFleet(
        2, "CartPole-v1", num_envs=2, seed=11, grace_period=1.0, policy_kwargs={"hidden": HIDDEN}
    ) as local_fleet:
        yield local_fleet


def _ppo_step_on(batch):
    from torchrl.modules import ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    env = gym.make("CartPole-v1")
    actor = make_policy("mlp", env.observation_space, env.action_space, hidden=HIDDEN)
    critic = ValueOperator(
        make_value_mlp(env.observation_space, hidden=HIDDEN), in_keys=["observation"]
    )
    loss_module = ClipPPOLoss(actor, critic)
    # Our log-prob key is TorchRL's default for this module: nothing is renamed.
    assert loss_module.tensor_keys.sample_log_prob == "action_log_prob"
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)

    with torch.no_grad():
        advantage(batch)
    assert torch.isfinite(batch["advantage"]).all()
    assert batch["advantage"].shape == (*batch.shape, 1)

    before = [p.detach().clone() for p in loss_module.parameters()]
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    losses = loss_module(batch)
    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
    assert torch.isfinite(total)
    total.backward()
    optimizer.step()
    after = list(loss_module.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
    return actor


@pytest.mark.long
@pytest.mark.parametrize(("sync", "shape"), [(True, (2, 2, 8)), (False, (2, 16))])
def test_torchrl_gae_and_clip_ppo_loss_accept_collector_batches(fleet, sync, shape):
    with GrpcCollector(
        fleet.addresses, frames_per_batch=32, total_frames=64, sync=sync
    ) as collector:
        batch = next(iter(collector))
        assert tuple(batch.shape) == shape
        assert batch.names[-1] == "time"
        actor = _ppo_step_on(batch)
        # The updated TorchRL-trained actor is pushed back like any policy.
        applied = collector.update_policy_weights_(actor)
        assert sorted(applied) == [0, 1]
