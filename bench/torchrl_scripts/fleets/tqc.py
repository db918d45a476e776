"""``tqc/tqc.py`` on actors: ``utils.env_maker`` under its transforms, and the TQC actor."""

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
    """The exploration policy of the script's ``make_tqc_agent`` (its actor)."""
    from utils import make_tqc_agent

    return make_tqc_agent(cfg, env, env, "cpu")[1]
