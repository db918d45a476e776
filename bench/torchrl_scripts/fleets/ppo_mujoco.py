"""``ppo/ppo_mujoco.py`` on actors: ``utils_mujoco``'s env (VecNorm per actor) and actor."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, device, **_make_env_kwargs(cfg))``."""
    from ppo_mujoco import _make_env_kwargs
    from utils_mujoco import make_env as script_env

    return script_env(cfg.env.env_name, "cpu", **_make_env_kwargs(cfg))


def make_policy(env: Any, cfg: Any) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from ppo_mujoco import _make_env_kwargs
    from utils_mujoco import make_ppo_models

    return make_ppo_models(cfg.env.env_name, device="cpu", **_make_env_kwargs(cfg))[0]
