"""The settings of an env pool, the section the env-stepping kinds (``env``, ``torchrl``) share.

:class:`EnvPoolSettings` is the ``env_pool`` section of
:class:`~actor_service._config.ActorConfig`: which env each actor steps, how it is built and
how its pool runs. Its fields keep their flat flags and variables (``--env``,
``RLFLEET_ENV_BACKEND``) and their flat reads (``config.env``). Like every settings section it
imports nothing of ``actor_service``, so the config that composes the sections sits over them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["EnvPoolSettings", "factory_name", "env_name"]


@dataclasses.dataclass(frozen=True)
class EnvPoolSettings:
    """What an env-stepping actor steps and how its env pool runs.

    The ranges and choices of these fields are checked by ``ActorConfig`` (its
    ``CHOICES``), which the command line reads too.

    Attributes:
        env: A registered gymnasium id, used when ``env_factory`` is empty.
        env_kwargs: Keyword arguments for ``gymnasium.make`` or the factory.
        env_factory: ``"package.module:function"`` returning a gymnasium ``Env`` (kind
            ``"env"``) or a ``torchrl.envs.EnvBase`` (kind ``"torchrl"``). A server built
            in-process (``create_server``) of kind ``"torchrl"`` also takes the callable
            itself (a lambda, a closure) or a ``torchrl.envs.EnvBase`` (each env of the pool
            a deep copy of it); the command line and its variables take import paths only.
        env_backend: ``"sync"`` (in-process) or ``"async"`` (subprocesses, spawn context);
            kind ``"torchrl"``: a ``SerialEnv`` or a ``ParallelEnv`` of the envs.
        step_timeout: Seconds an async env step may take before it counts as hung, at most
            ``MAX_STEP_TIMEOUT_S``.
    """

    env: str = "CartPole-v1"
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_factory: str | Callable[..., Any] = ""
    env_backend: str = "sync"
    step_timeout: float = 30.0


def env_name(pool: EnvPoolSettings) -> str:
    """The env's name for logs and ``describe``: the factory's or the gymnasium id.

    A factory given as an import path is named by it; one given in memory by its
    ``<qualname>`` (``<lambda>``, ``<GymEnv>``).
    """
    return factory_name(pool.env_factory) or pool.env


def factory_name(factory: str | Callable[..., Any]) -> str:
    """How messages and ``describe`` name a factory: its import path, or an in-memory one's.

    A callable given in memory (a lambda, a closure, an object such as a TorchRL env) is
    named ``<qualname>``: ``<lambda>``, ``<make_env.<locals>.make>``, ``<GymEnv>``.
    """
    if isinstance(factory, str):
        return factory
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return name if name.startswith("<") else f"<{name}>"
