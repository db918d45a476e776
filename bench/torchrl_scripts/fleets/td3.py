"""``td3/td3.py`` on actors: ``utils.env_maker`` under its transforms, and the exploring actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The exploration policy of the script's ``make_td3_agent`` (actor + Gaussian noise)."""
    from utils import make_td3_agent

    return make_td3_agent(cfg, env, env, "cpu")[1]
