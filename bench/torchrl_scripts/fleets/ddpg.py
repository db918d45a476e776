"""``ddpg/ddpg.py`` on actors: ``utils.env_maker`` under its transforms, and OU noise."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The exploration policy of the script's ``make_ddpg_agent`` (``OrnsteinUhlenbeck``).

    ``make_ddpg_agent`` closes the env it initialises the networks on: it gets one of its own.
    """
    from utils import make_ddpg_agent

    return make_ddpg_agent(cfg, env, make_env(cfg), "cpu")[1]
