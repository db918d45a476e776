"""``tqc/tqc.py`` on actors: ``utils.env_maker`` under its transforms, and the TQC actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The exploration policy of the script's ``make_tqc_agent`` (its actor)."""
    from utils import make_tqc_agent

    return make_tqc_agent(cfg, env, env, "cpu")[1]
