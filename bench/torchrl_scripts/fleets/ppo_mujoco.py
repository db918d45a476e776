"""``ppo/ppo_mujoco.py`` on actors: ``utils_mujoco``'s env (VecNorm per actor) and actor."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets import config_of


def make_env(cfg: dict[str, Any]) -> Any:
    """The script's ``make_env(cfg.env.env_name, device, **_make_env_kwargs(cfg))``."""
    from ppo_mujoco import _make_env_kwargs
    from utils_mujoco import make_env as script_env

    c = config_of(cfg)
    return script_env(c.env.env_name, "cpu", **_make_env_kwargs(c))


def make_policy(env: Any, cfg: dict[str, Any]) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from ppo_mujoco import _make_env_kwargs
    from utils_mujoco import make_ppo_models

    c = config_of(cfg)
    return make_ppo_models(c.env.env_name, device="cpu", **_make_env_kwargs(c))[0]
