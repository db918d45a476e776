"""``td3/td3.py`` on actors: ``utils.env_maker`` under its transforms, and the exploring actor."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """One env of the script's ``make_environment``: ``env_maker`` + ``apply_env_transforms``.

    The script batches ``env_per_collector`` of them in a ``ParallelEnv``; the actors pool
    their share (``num_envs``) in a ``SerialEnv``.
    """
    from utils import apply_env_transforms, env_maker

    return apply_env_transforms(env_maker(cfg), cfg.env.max_episode_steps)


def make_policy(env: Any, cfg: Any) -> Any:
    """The exploration policy of the script's ``make_td3_agent`` (actor + Gaussian noise)."""
    from utils import make_td3_agent

    return make_td3_agent(cfg, env, env, "cpu")[1]
