"""The settings of an env pool, the section the env-stepping kinds (``env``, ``torchrl``) share.

:class:`EnvPoolSettings` is the ``env_pool`` section of
:class:`~actor_service._config.ActorConfig`: which env each actor steps, how it is built and
how its pool runs. Its fields keep their flat flags and variables (``--env``,
``RLFLEET_ENV_BACKEND``) and their flat reads (``config.env``). Like every settings section it
imports nothing of ``actor_service``, so the config that composes the sections sits over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["EnvPoolSettings", "env_name"]


@dataclasses.dataclass(frozen=True)
class EnvPoolSettings:
    """What an env-stepping actor steps and how its env pool runs.

    The ranges and choices of these fields are checked by ``ActorConfig`` (its
    ``CHOICES``), which the command line reads too.

    Attributes:
        env: A registered gymnasium id, used when ``env_factory`` is empty.
        env_kwargs: Keyword arguments for ``gymnasium.make`` or the factory.
        env_factory: ``"package.module:function"`` returning a gymnasium ``Env`` (kind
            ``"env"``) or a ``torchrl.envs.EnvBase`` (kind ``"torchrl"``).
        env_backend: ``"sync"`` (in-process) or ``"async"`` (subprocesses, spawn context);
            kind ``"torchrl"``: a ``SerialEnv`` or a ``ParallelEnv`` of the envs.
        step_timeout: Seconds an async env step may take before it counts as hung.
    """

    env: str = "CartPole-v1"
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_factory: str = ""
    env_backend: str = "sync"
    step_timeout: float = 30.0


def env_name(pool: EnvPoolSettings) -> str:
    """The env's name for logs and ``describe``: the factory string or the gymnasium id."""
    return pool.env_factory or pool.env
