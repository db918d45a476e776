"""``sac/sac.py`` on actors: ``utils.env_maker`` under its transforms, and the SAC actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets import config_of


def make_env(cfg: dict[str, Any]) -> Any:
    """One env of the script's ``make_environment``: ``env_maker`` + ``apply_env_transforms``.

    The script batches ``env_per_collector`` of them in a ``ParallelEnv``; the actors pool
    their share (``num_envs``) in a ``SerialEnv``.
    """
    from utils import apply_env_transforms, env_maker

    c = config_of(cfg)
    return apply_env_transforms(env_maker(c), c.env.max_episode_steps)


def make_policy(env: Any, cfg: dict[str, Any]) -> Any:
    """The exploration policy of the script's ``make_sac_agent``."""
    from utils import make_sac_agent

    return make_sac_agent(config_of(cfg), env, env, "cpu")[1]
