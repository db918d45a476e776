"""The env of a script whose ``utils.py`` has ``env_maker`` and ``apply_env_transforms``.

``sac``, ``ddpg``, ``discrete_sac``, ``td3``, ``tqc`` and ``crossq`` cut episodes in
``apply_env_transforms(env, max_episode_steps)``; ``iql_online``, ``cql_online`` and
``discrete_cql_online`` in their collector (``apply_env_transforms(env)``). Each script's
``make_environment`` batches such envs in a ``ParallelEnv``; an actor steps its share
(``num_envs``) in a ``SerialEnv``, or its one env as it is (``crossq``, whose batch-norm
actor needs the batch dimension, builds the script's batch of one itself). ``utils`` is the
script's own: its folder is on the actors' ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_env", "make_env_uncut"]


def make_env(cfg: Any) -> Any:
    """``apply_env_transforms(env_maker(cfg), max_episode_steps=cfg.env.max_episode_steps)``."""
    from utils import apply_env_transforms, env_maker

    return apply_env_transforms(env_maker(cfg), max_episode_steps=cfg.env.max_episode_steps)


def make_env_uncut(cfg: Any) -> Any:
    """``apply_env_transforms(env_maker(cfg))``: the scripts that cut episodes in the collector."""
    from utils import apply_env_transforms, env_maker

    return apply_env_transforms(env_maker(cfg))
