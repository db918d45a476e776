"""The PPO update of the reference learner, step by step against a hand computation.

The loss (clipped ratio of normalised advantages, value loss, entropy bonus), the
gradient-norm clip and the number of gradient steps of ``epochs`` passes of minibatches.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value.functional import generalized_advantage_estimate

from apps.ppo._ppo import PPOConfig, PPOLearner
from common.policies import make_policy, make_value_mlp

OBSERVATION = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(4)


def _learner(**config) -> PPOLearner:
    torch.manual_seed(0)
    policy = make_policy("mlp", OBSERVATION, ACTIONS, hidden=(8,))
    value = make_value_mlp(OBSERVATION, hidden=(8,))
    return PPOLearner(policy, value, PPOConfig(**config))


def _minibatch(learner: PPOLearner, frames: int = 12) -> TensorDict:
    """Frames whose recorded log-probs put many ratios outside any small clip range."""
    g = torch.Generator().manual_seed(1)
    observation = torch.rand(frames, 3, generator=g) * 2 - 1
    action = torch.nn.functional.one_hot(torch.randint(0, 4, (frames,), generator=g), 4)
    with torch.no_grad():
        log_prob, _, _ = learner.model(observation, action)
    return TensorDict(
        {
            "observation": observation,
            "action": action,
            "old_log_prob": log_prob + torch.randn(frames, generator=g) * 0.5,
            "advantage": torch.randn(frames, generator=g) * 3 + 1,
            "value_target": torch.randn(frames, generator=g),
        },
        batch_size=[frames],
    )


def _hand_loss(model, mb, clip_eps, vf_coef, ent_coef):
    """PPO's loss as the papers write it, and the figures the update reports."""
    log_prob, entropy, value = model(mb["observation"], mb["action"])
    ratio = (log_prob - mb["old_log_prob"]).exp()
    adv = (mb["advantage"] - mb["advantage"].mean()) / mb["advantage"].std()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss_policy = -surrogate.mean()
    loss_value = 0.5 * ((value - mb["value_target"]) ** 2).mean()
    loss = loss_policy + vf_coef * loss_value - ent_coef * entropy.mean()
    figures = {
        "loss_policy": loss_policy.item(),
        "loss_value": loss_value.item(),
        "entropy": entropy.mean().item(),
        "clip_fraction": ((ratio - 1).abs() > clip_eps).float().mean().item(),
        # Schulman's k3 estimator of KL(old || new): (r - 1) - log r, never negative.
        "approx_kl": ((ratio - 1) - ratio.log()).mean().item(),
    }
    return loss, figures


@pytest.mark.parametrize("max_grad_norm", [float("inf"), 1e-3])
def test_ppo_step_follows_the_clipped_loss_with_its_value_and_entropy_terms(max_grad_norm):
    """With plain SGD at lr 1 a step moves the weights by minus the (clipped) gradient of the
    loss computed by hand: the clip, the signs and weights of the terms, and the grad-norm clip
    each show in the step."""
    knobs = {"clip_eps": 0.1, "vf_coef": 0.7, "ent_coef": 0.3}
    learner = _learner(max_grad_norm=max_grad_norm, **knobs)
    learner.optimizer = torch.optim.SGD(learner._params, lr=1.0)
    mb = _minibatch(learner)
    reference = copy.deepcopy(learner.model)
    loss, figures = _hand_loss(reference, mb, **knobs)
    assert 0.2 < figures["clip_fraction"] < 0.9  # some ratios clipped, not all
    params = list(reference.parameters())
    grads = torch.autograd.grad(loss, params)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = min(1.0, max_grad_norm / (norm.item() + 1e-6))
    before = [p.detach().clone() for p in learner.model.parameters()]

    stats = learner._step(mb)

    for name, expected in figures.items():
        assert stats[name] == pytest.approx(expected, rel=1e-4, abs=1e-6), name
    for old, new, grad in zip(before, learner.model.parameters(), grads, strict=True):
        torch.testing.assert_close(new.detach() - old, -scale * grad, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize(("frames", "minibatch", "epochs", "steps"), [(12, 4, 3, 9), (12, 5, 2, 4)])
def test_ppo_update_takes_a_step_per_whole_minibatch_of_every_epoch(
    frames, minibatch, epochs, steps
):
    """``epochs`` passes over the batch, each in ``frames // minibatch`` gradient steps."""
    learner = _learner(epochs=epochs, minibatch_size=minibatch)
    taken = []
    learner.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    g = torch.Generator().manual_seed(2)
    batch = TensorDict(
        {
            "observation": torch.rand(1, frames, 3, generator=g),
            "action": torch.nn.functional.one_hot(torch.randint(0, 4, (1, frames), generator=g), 4),
            "action_log_prob": torch.full((1, frames), -1.4),
            "next": {
                "observation": torch.rand(1, frames, 3, generator=g),
                "reward": torch.ones(1, frames, 1),
                "terminated": torch.zeros(1, frames, 1, dtype=torch.bool),
                "done": torch.zeros(1, frames, 1, dtype=torch.bool),
            },
        },
        batch_size=[1, frames],
    )
    stats = learner.update(batch)
    assert len(taken) == steps
    assert set(stats) == {"loss_policy", "loss_value", "entropy", "approx_kl", "clip_fraction"}


def _batch(frames: int, seed: int = 2, envs: int = 1) -> TensorDict:
    """A collector batch ``[envs, frames]``, some steps terminated and some truncated."""
    g = torch.Generator().manual_seed(seed)
    shape = (envs, frames)
    terminated = torch.rand(*shape, 1, generator=g) < 0.2
    truncated = (torch.rand(*shape, 1, generator=g) < 0.2) & ~terminated
    return TensorDict(
        {
            "observation": torch.rand(*shape, 3, generator=g),
            "action": torch.nn.functional.one_hot(torch.randint(0, 4, shape, generator=g), 4),
            "action_log_prob": torch.full(shape, -1.4),
            "next": {
                "observation": torch.rand(*shape, 3, generator=g),
                "reward": torch.randn(*shape, 1, generator=g),
                "terminated": terminated,
                "done": terminated | truncated,
            },
        },
        batch_size=shape,
    )


def test_ppo_prepare_matches_torchrl_gae_on_the_values_of_observation_and_next_observation():
    learner = _learner(gamma=0.9, gae_lambda=0.8)
    batch = _batch(frames=20, envs=3)
    data = learner.prepare(batch)
    with torch.no_grad():
        value = learner.value(batch["observation"])
        next_value = learner.value(batch["next", "observation"])
    advantage, target = generalized_advantage_estimate(
        0.9,
        0.8,
        value,
        next_value,
        batch["next", "reward"],
        batch["next", "done"],
        batch["next", "terminated"],
        time_dim=-2,
    )
    torch.testing.assert_close(data["advantage"], advantage.reshape(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(data["value_target"], target.reshape(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(data["observation"], batch["observation"].reshape(-1, 3))
    torch.testing.assert_close(data["old_log_prob"], torch.full((60,), -1.4))


@pytest.mark.parametrize("minibatch", [5, 100])
def test_ppo_update_steps_on_every_frame_and_on_a_batch_smaller_than_a_minibatch(minibatch):
    """Each epoch's minibatches are distinct frames of the batch; a minibatch bigger than
    the batch is the whole batch, one step per epoch (not none)."""
    learner = _learner(epochs=2, minibatch_size=minibatch)
    seen: list[torch.Tensor] = []
    learner.model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    batch = _batch(frames=10)
    learner.update(batch)
    assert len(seen) == 2 * (10 // min(minibatch, 10))
    per_epoch = len(seen) // 2
    for epoch in range(2):
        frames = torch.cat(seen[epoch * per_epoch : (epoch + 1) * per_epoch])
        expected = batch["observation"].reshape(-1, 3)
        assert sorted(map(tuple, frames.tolist())) == sorted(map(tuple, expected.tolist()))


def test_ppo_steps_in_a_row_each_follow_their_own_gradient_only():
    """The gradients of one step do not add to the next (zeroed between steps)."""
    knobs = {"clip_eps": 0.1, "vf_coef": 0.7, "ent_coef": 0.3}
    learner = _learner(max_grad_norm=float("inf"), **knobs)
    learner.optimizer = torch.optim.SGD(learner._params, lr=0.1)
    mb = _minibatch(learner)
    learner._step(mb)
    reference = copy.deepcopy(learner.model)
    loss, _ = _hand_loss(reference, mb, **knobs)
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    before = [p.detach().clone() for p in learner.model.parameters()]
    learner._step(mb)
    for old, new, grad in zip(before, learner.model.parameters(), grads, strict=True):
        torch.testing.assert_close(new.detach() - old, -0.1 * grad, rtol=1e-3, atol=1e-7)


def test_ppo_update_reports_the_mean_over_its_steps_and_set_lr_zero_freezes_the_weights():
    """At lr 0 every step of every epoch sees the same weights and the whole batch: the
    figures reported are one step's, not their sum."""
    learner = _learner(epochs=3, minibatch_size=100)
    learner.set_lr(0.0)
    batch = _batch(frames=10)
    initial = copy.deepcopy(learner.model.state_dict())
    stats = learner.update(batch)
    one = learner._step(learner.prepare(batch))
    for key, value in one.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for key, value in learner.model.state_dict().items():
        assert torch.equal(initial[key], value), key
