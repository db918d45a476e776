"""The registry of actor kinds: each kind's collection core and its checks before binding.

A new kind is one folder beside this module and one line in :data:`KINDS`; a kind with
settings of its own also declares them in its ``settings.py`` and gives them a section of
:class:`~actor_service._config.ActorConfig` (see that module). The registry is a module of
its own, not the package's ``__init__``: the config imports the kinds' settings, and a
package ``__init__`` that imported the cores (which read the config) would close a circle.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from actor_service._config import ActorConfig
from actor_service._core._base import CoreBase
from actor_service._core._protocol import BatchRecorder, CollectionCore
from actor_service._kinds.env import check as env_check
from actor_service._kinds.env.core import EnvCore
from actor_service._kinds.llm import check as llm_check
from actor_service._kinds.llm.core import LLMCore
from actor_service._kinds.torchrl import check as torchrl_check
from actor_service._kinds.torchrl.core import TorchRLCore

__all__ = ["CORES", "KINDS", "Kind", "core_factory"]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of actor, as the server and the command line need it.

    Attributes:
        core: The collection core an actor of this kind runs.
        check: Raises ``ValueError`` for what would fail at start (``rlfleet-actor``
            turns it into a usage error before it binds a port).
    """

    core: type[CoreBase]
    check: Callable[[ActorConfig], None]


#: Every ``ActorConfig.kind``: its core and its checks.
KINDS: dict[str, Kind] = {
    "env": Kind(EnvCore, env_check.check),
    "torchrl": Kind(TorchRLCore, torchrl_check.check),
    "llm": Kind(LLMCore, llm_check.check),
}

#: The collection core of each ``ActorConfig.kind``.
CORES: dict[str, type[CoreBase]] = {name: kind.core for name, kind in KINDS.items()}


def core_factory(
    config: ActorConfig, metrics: BatchRecorder | None = None
) -> Callable[[ActorConfig], CollectionCore]:
    """What builds the collection core of ``config.kind``, counting its batches into ``metrics``."""
    return functools.partial(CORES[config.kind], metrics=metrics)
