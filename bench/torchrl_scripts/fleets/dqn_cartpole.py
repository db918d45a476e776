"""``dqn/dqn_cartpole.py`` on actors: ``utils_cartpole``'s env, its Q-network and the epsilon."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.egreedy import e_greedy


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, "cpu")``, as its collector gets it."""
    from utils_cartpole import make_env as script_env

    return script_env(cfg.env.env_name, "cpu")


def make_policy(env: Any, cfg: Any) -> Any:
    """``TensorDictSequential(make_dqn_model(...), EGreedyModule(...))``, as in the script."""
    from utils_cartpole import make_dqn_model

    return e_greedy(make_dqn_model(cfg.env.env_name, device="cpu"), cfg)
