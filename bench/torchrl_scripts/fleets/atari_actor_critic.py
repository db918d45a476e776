"""``ppo/ppo_atari.py`` and ``a2c/a2c_atari.py`` on actors: their batched Atari env and actor.

Both scripts collect from ``utils_atari.make_parallel_env(name, num_envs, ...)``, a
``ParallelEnv`` under their pixel transforms and a ``VecNorm`` of its own (its statistics
shared by those envs); an actor hosts that env with its share of the envs, batched itself.
The acting policy is ``make_ppo_models(...)[0]``, the actor of their actor-critic. Their
envs resize frames with TorchRL's ``Resize`` (torchvision) and need Atari's ROMs
(``ale-py``): they run in the venv of ``make test-torchvision``.
"""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any, num_envs: int) -> Any:
    """The script's ``make_parallel_env(cfg.env.env_name, num_envs, ...)`` on the CPU."""
    from utils_atari import make_parallel_env

    return make_parallel_env(
        cfg.env.env_name, num_envs=num_envs, device="cpu", gym_backend=cfg.env.backend
    )


def make_policy(env: Any, cfg: Any) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from utils_atari import make_ppo_models

    return make_ppo_models(cfg.env.env_name, device="cpu", gym_backend=cfg.env.backend)[0]
