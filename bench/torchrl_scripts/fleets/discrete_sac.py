"""``discrete_sac/discrete_sac.py`` on actors: ``utils.env_maker`` under its transforms, its actor.

The file is the same at pytorch/rl main (ae9719f17b1517af5c2523a36c4616f003ee55cf) as in
the torchrl 0.14.1 wheel the port reads it from.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The acting policy of the script's ``make_sac_agent`` (``model[0]``, the actor)."""
    from utils import make_sac_agent

    return make_sac_agent(cfg, env, make_env(cfg), "cpu")[0]
