"""``multiagent/mappo_ippo.py`` on actors: its VMAS env and its policy, as the script builds them.

The script builds both inline; these are its lines (the env: :func:`vmas_env`).
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.vmas import tanh_normal_actor, vmas_env


def make_env(cfg: Any, num_envs: int) -> Any:
    """``num_envs`` of the script's VMAS envs, continuous actions."""
    return vmas_env(cfg, num_envs, continuous_actions=True)


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's ``ProbabilisticActor`` over a ``MultiAgentMLP``."""
    return tanh_normal_actor(env, cfg)
