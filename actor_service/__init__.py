"""The rlfleet actor: an env pool or LLM chat slots with local models, served as ``ActorService``.

Run one with the ``rlfleet-actor`` command (or ``python -m actor_service``), or
in-process::

    from actor_service import ActorConfig, create_server

    with create_server(ActorConfig(port=0, num_envs=4)).run_in_thread() as actor:
        print(actor.port)   # SERVING: health, reflection and ActorService

A kind's settings are a typed section of the config:
``ActorConfig(kind="llm", llm=LLMActorSettings(task="reverse"))``,
``ActorConfig(env_pool=EnvPoolSettings(env="Pendulum-v1"))``.

The server and its dependencies (torch, gRPC) are imported on first use, so the
command line reports bad flags without loading them.
"""

from __future__ import annotations

import importlib
from typing import Any

from actor_service._config import ActorConfig, ModelSpec
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.llm.settings import LLMActorSettings

__all__ = [
    "ActorConfig",
    "EnvPoolSettings",
    "LLMActorSettings",
    "ModelSpec",
    "ActorServer",
    "ServerThread",
    "create_server",
    "serve",
    "parse_config",
    "main",
]

_LAZY = {
    "ActorServer": "actor_service._serve._server",
    "ServerThread": "actor_service._serve._server",
    "create_server": "actor_service._serve._server",
    "serve": "actor_service._serve._server",
    "parse_config": "actor_service._cli._main",
    "main": "actor_service._cli._main",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'actor_service' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
