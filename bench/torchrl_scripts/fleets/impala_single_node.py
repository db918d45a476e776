"""``impala/impala_single_node.py`` on actors: ``utils.make_env``'s Atari env and the actor.

The script's collector is TorchRL's ``MultiaSyncCollector`` form (``num_collectors``
workers of one env each, ``sync=False``): on a fleet, actors of one env each, async. Its env
resizes frames with TorchRL's ``Resize`` (torchvision) and needs Atari's ROMs (``ale-py``):
it runs in the venv of ``make test-torchvision``.
"""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, device, gym_backend=...)`` on the CPU."""
    from utils import make_env as script_env

    return script_env(cfg.env.env_name, "cpu", gym_backend=cfg.env.backend)


def make_policy(env: Any, cfg: Any) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from utils import make_ppo_models

    return make_ppo_models(cfg.env.env_name, cfg.env.backend)[0]
