"""``ddpg/ddpg.py`` on actors: ``utils.env_maker`` under its transforms, and OU noise."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """One env of the script's ``make_environment``: ``env_maker`` + ``apply_env_transforms``."""
    from utils import apply_env_transforms, env_maker

    return apply_env_transforms(env_maker(cfg), max_episode_steps=cfg.env.max_episode_steps)


def make_policy(env: Any, cfg: Any) -> Any:
    """The exploration policy of the script's ``make_ddpg_agent`` (``OrnsteinUhlenbeck``).

    ``make_ddpg_agent`` closes the env it initialises the networks on: it gets one of its own.
    """
    from utils import make_ddpg_agent

    return make_ddpg_agent(cfg, env, make_env(cfg), "cpu")[1]
