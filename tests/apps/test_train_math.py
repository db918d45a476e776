"""PPO math of the reference learner: GAE (checked against TorchRL's) and episode returns."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from apps.ppo._episodes import EpisodeTracker
from apps.ppo._ppo import compute_gae


def _reference_gae(reward, value, next_value, terminated, done, gamma, lam):
    advantage = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        bootstrap = next_value[:, t] * (~terminated[:, t]).float()
        delta = reward[:, t] + gamma * bootstrap - value[:, t]
        running = delta + gamma * lam * (~done[:, t]).float() * running
        advantage[:, t] = running
    return advantage


def _random_episode_flags(generator, shape):
    terminated = torch.rand(shape, generator=generator) < 0.1
    truncated = (torch.rand(shape, generator=generator) < 0.1) & ~terminated
    return terminated, terminated | truncated


def test_compute_gae_matches_a_step_by_step_reference():
    g = torch.Generator().manual_seed(0)
    shape = (5, 37)
    reward, value, next_value = (torch.randn(shape, generator=g) for _ in range(3))
    terminated, done = _random_episode_flags(g, shape)
    advantage, target = compute_gae(
        reward, value, next_value, terminated, done, gamma=0.97, lam=0.9
    )
    expected = _reference_gae(reward, value, next_value, terminated, done, 0.97, 0.9)
    torch.testing.assert_close(advantage, expected)
    torch.testing.assert_close(target, expected + value)


def test_compute_gae_matches_torchrl_generalized_advantage_estimate():
    from torchrl.objectives.value.functional import generalized_advantage_estimate

    g = torch.Generator().manual_seed(1)
    shape = (3, 2, 50)
    reward, value, next_value = (torch.randn(shape, generator=g) for _ in range(3))
    terminated, done = _random_episode_flags(g, shape)
    advantage, target = compute_gae(
        reward, value, next_value, terminated, done, gamma=0.99, lam=0.95
    )
    ref_adv, ref_target = generalized_advantage_estimate(
        0.99,
        0.95,
        value.unsqueeze(-1),
        next_value.unsqueeze(-1),
        reward.unsqueeze(-1),
        done.unsqueeze(-1),
        terminated.unsqueeze(-1),
        time_dim=-2,
    )
    torch.testing.assert_close(advantage, ref_adv.squeeze(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(target, ref_target.squeeze(-1), rtol=1e-4, atol=1e-5)


def test_compute_gae_bootstraps_truncated_steps_but_not_terminated_ones():
    one = torch.ones(1, 1)
    no = torch.zeros(1, 1, dtype=torch.bool)
    yes = torch.ones(1, 1, dtype=torch.bool)
    truncated_adv, _ = compute_gae(one, 0 * one, 10 * one, no, yes, gamma=0.5, lam=1.0)
    terminated_adv, _ = compute_gae(one, 0 * one, 10 * one, yes, yes, gamma=0.5, lam=1.0)
    assert truncated_adv.item() == pytest.approx(1 + 0.5 * 10)
    assert terminated_adv.item() == pytest.approx(1.0)


def test_compute_gae_does_not_leak_advantage_across_trajectories():
    reward = torch.tensor([[0.0, 100.0]])
    zeros = torch.zeros(1, 2)
    done = torch.tensor([[True, False]])
    advantage, _ = compute_gae(reward, zeros, zeros, done, done, gamma=1.0, lam=1.0)
    assert advantage[0, 0].item() == 0.0
    assert advantage[0, 1].item() == 100.0


def _batch(traj_ids, rewards, dones, worker_ids=None):
    traj = torch.tensor(traj_ids)
    td = TensorDict(
        {
            ("collector", "traj_ids"): traj,
            ("next", "reward"): torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1),
            ("next", "done"): torch.tensor(dones).unsqueeze(-1),
        },
        batch_size=traj.shape,
    )
    if worker_ids is not None:
        td["collector", "worker_id"] = torch.tensor(worker_ids)
    return td


def test_episode_tracker_sums_rewards_per_trajectory_across_batches():
    tracker = EpisodeTracker(window=2)
    # Two envs; env 0 runs traj 0 then 2, env 1 runs traj 1 across both batches.
    first = _batch(
        [[0, 0, 2], [1, 1, 1]],
        [[1, 1, 5], [2, 2, 2]],
        [[False, True, False], [False, False, False]],
    )
    second = _batch(
        [[2, 2, 4], [1, 1, 3]], [[5, 5, 5], [2, 2, 7]], [[False, True, False], [False, True, False]]
    )
    assert tracker.add(first, frames=6) == [2.0]
    assert tracker.recent_mean == 2.0
    assert sorted(tracker.add(second, frames=12)) == [10.0, 15.0]
    assert sorted(tracker.lengths) == [2, 3, 5]
    assert tracker.end_frames == [6, 12, 12]
    assert tracker.recent_full
    assert tracker.recent_mean == pytest.approx(sum(tracker.returns[-2:]) / 2)


def test_episode_tracker_keeps_equal_traj_ids_of_different_workers_apart():
    tracker = EpisodeTracker()
    batch = _batch(
        [[0, 0], [0, 0]],
        [[1, 1], [10, 10]],
        [[False, True], [False, True]],
        worker_ids=[[0, 0], [1, 1]],
    )
    assert sorted(tracker.add(batch, frames=4)) == [2.0, 20.0]


def test_episode_tracker_raises_if_window_is_not_positive():
    with pytest.raises(ValueError, match="window"):
        EpisodeTracker(window=0)


def test_episode_tracker_is_full_at_exactly_window_episodes():
    tracker = EpisodeTracker(window=2)
    tracker.add(_batch([[0], [1]], [[1], [3]], [[True], [False]]), frames=2)
    assert not tracker.recent_full
    tracker.add(_batch([[0], [1]], [[1], [3]], [[False], [True]]), frames=4)
    assert tracker.recent_full
    assert tracker.recent_mean == pytest.approx((1 + 6) / 2)
