"""``a2c/a2c_mujoco.py`` on actors: ``utils_mujoco``'s env (VecNorm per actor) and actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets import config_of


def make_env(cfg: dict[str, Any]) -> Any:
    """The script's ``make_env(cfg.env.env_name, device)``."""
    from utils_mujoco import make_env as script_env

    return script_env(config_of(cfg).env.env_name, "cpu")


def make_policy(env: Any, cfg: dict[str, Any]) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from utils_mujoco import make_ppo_models

    c = config_of(cfg)
    return make_ppo_models(c.env.env_name, device="cpu", compile=False)[0]
