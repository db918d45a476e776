"""``iql/iql_online.py`` on actors: ``utils.env_maker`` under its transforms, and the actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env_uncut as make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_iql_model(...)[0]``, the actor."""
    from utils import make_iql_model

    return make_iql_model(cfg, env, env, "cpu")[0]
