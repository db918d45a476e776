"""``a2c/a2c_mujoco.py`` on actors: ``utils_mujoco``'s env (VecNorm per actor) and actor."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, device)``."""
    from utils_mujoco import make_env as script_env

    return script_env(cfg.env.env_name, "cpu")


def make_policy(env: Any, cfg: Any) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from utils_mujoco import make_ppo_models

    return make_ppo_models(cfg.env.env_name, device="cpu", compile=False)[0]
