"""The rollout/update loop of ``rlfleet-train``: collect a batch, update PPO, push the weights.

Read :func:`train` top to bottom: seed, build the policy and the critic, start
(or join) the fleet, push the initial weights so every actor acts with the
learner's policy, then for every batch track episode returns, run a PPO update
and push the new weights to every actor, until the target return or the frame
budget is reached. The policy and critic are built by the same factories the
actors use (``common.policies``), so the pushed state dicts fit the actors'
policies key for key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import time
from typing import Any

import gymnasium as gym
import torch

from apps._job.cli import seed_everything
from apps._job.report import Progress
from apps.ppo._episodes import EpisodeTracker
from apps.ppo._ppo import PPOConfig, PPOLearner
from apps.ppo._report import TrainSummary, save_run
from apps.ppo._settings import RETURN_WINDOW, TrainSettings
from common.config import DEFAULT_MODEL_ID
from common.policies import make_policy, make_value_mlp
from learner_client import GrpcCollector, LocalFleet, serve_metrics

__all__ = ["train"]


def train(settings: TrainSettings) -> TrainSummary:
    """Train a PPO policy with a fleet of actors and write the run's outputs.

    Args:
        settings: The run's settings.

    Returns:
        The summary also written to ``summary.json``.
    """
    seed_everything(settings.seed)
    policy, learner = _build_learner(settings)
    tracker = EpisodeTracker(window=RETURN_WINDOW)
    target = settings.effective_target_return

    with contextlib.ExitStack() as stack:
        collector = _open_collector(stack, settings)
        progress = stack.enter_context(
            contextlib.closing(Progress(settings.total_frames, enabled=settings.progress))
        )
        if settings.actors:
            # A local fleet is seeded at start; an existing one is seeded here.
            collector.set_seed(settings.seed)
        start = time.monotonic()
        # Actors start with their own random weights: make them act with ours.
        collector.update_policy_weights_(policy)
        frames, batches = _collect_and_learn(settings, collector, learner, tracker, progress)
        wall = time.monotonic() - start
        version = collector.policy_version.get(DEFAULT_MODEL_ID, 0)

    summary = TrainSummary(
        env=settings.env,
        sync=settings.sync,
        seed=settings.seed,
        frames=frames,
        batches=batches,
        episodes=len(tracker.returns),
        wall_time_s=wall,
        fps=frames / max(wall, 1e-9),
        final_return=tracker.recent_mean,
        target_return=target,
        reached_target=_reached(tracker, target),
        policy_version=version,
        out_dir=settings.out_dir,
    )
    save_run(
        pathlib.Path(settings.out_dir),
        policy,
        summary,
        dataclasses.asdict(settings),
        (tracker.end_frames, tracker.returns),
        RETURN_WINDOW,
    )
    return summary


def _build_learner(settings: TrainSettings) -> tuple[torch.nn.Module, PPOLearner]:
    """The policy (built as the actors build theirs) and its PPO learner with a critic."""
    observation_space, action_space = _spaces(settings.env)
    policy = make_policy("mlp", observation_space, action_space, hidden=settings.hidden)
    value = make_value_mlp(observation_space, hidden=settings.hidden)
    learner = PPOLearner(
        policy,
        value,
        PPOConfig(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(PPOConfig)}),
    )
    return policy, learner


def _open_collector(stack: contextlib.ExitStack, settings: TrainSettings) -> GrpcCollector:
    """A collector on the given fleet, or on a local fleet started (and stopped) by ``stack``."""
    addresses = list(settings.actors) or stack.enter_context(_local_fleet(settings)).addresses
    collector = stack.enter_context(
        GrpcCollector(
            addresses,
            frames_per_batch=settings.frames_per_batch,
            total_frames=settings.total_frames,
            sync=settings.sync,
            # From the environment only: a flag would show in `ps` and in summary.json.
            token=os.environ.get("RLFLEET_TOKEN") or None,
        )
    )
    if settings.metrics_port is not None:  # on all interfaces, until the collector shuts down
        serve_metrics(collector, settings.metrics_port)
    return collector


def _collect_and_learn(
    settings: TrainSettings,
    collector: GrpcCollector,
    learner: PPOLearner,
    tracker: EpisodeTracker,
    progress: Progress,
) -> tuple[int, int]:
    """Update PPO on every batch and push the weights, until the target or the budget.

    Returns:
        ``(frames, batches)`` collected.
    """
    target = settings.effective_target_return
    frames = batches = 0
    for batch in collector:
        assert batch is not None  # batches are yielded: there is no replay buffer
        frames += batch.numel()
        batches += 1
        tracker.add(batch, frames)
        if settings.anneal_lr:
            learner.set_lr(settings.lr * max(0.0, 1.0 - frames / settings.total_frames))
        learner.update(batch)
        collector.update_policy_weights_(learner.policy)
        if batches % settings.log_every == 0:
            progress.update(frames, _fields(tracker, collector.stats()))
        if _reached(tracker, target) or frames >= settings.total_frames:
            break
    return frames, batches


def _local_fleet(settings: TrainSettings) -> LocalFleet:
    return LocalFleet(
        settings.num_actors,
        settings.env,
        settings.num_envs,
        "mlp",
        policy_kwargs={"hidden": list(settings.hidden)},
        seed=settings.seed,
    )


def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    # The learner only needs the spaces to build networks that fit the actors'.
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _reached(tracker: EpisodeTracker, target: float | None) -> bool:
    mean = tracker.recent_mean
    return target is not None and tracker.recent_full and mean is not None and mean >= target


def _fields(tracker: EpisodeTracker, stats: dict[str, Any]) -> dict[str, str]:
    mean = tracker.recent_mean
    return {
        "return": "n/a" if mean is None else f"{mean:.1f}",
        "episodes": str(len(tracker.returns)),
        # Versions between the learner's latest push and the oldest frame of the last batch.
        "lag": str(stats.get("policy_lag", "n/a")),
    }
