"""Where a session's policy and envs run, and how its policy is compiled.

A learner may ask, with a session's settings, for the devices its script names
(TorchRL's ``policy_device`` and ``env_device``), for a compiled policy
(``compile_policy``) or for CUDA graphs (``cudagraph_policy``). An actor's devices
are fixed when it starts (``--device``; gymnasium envs step on the CPU), so a
session asking for another one is refused with :class:`PlacementError`
(``FAILED_PRECONDITION``) naming the actor and both devices: the actor never moves
its policy, and never falls back to the CPU in silence. ``torch.compile`` is applied
per session to the acting model's forward (:class:`CompiledForward`), and undone by
a session that does not ask for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from common.config import CollectSettings, CompileSettings, same_device
from common.errors import SessionStateError

__all__ = ["CompiledForward", "PlacementError", "check_placement"]


class PlacementError(SessionStateError):
    """A session asks for a device or a policy form this actor cannot give (FAILED_PRECONDITION)."""


def check_placement(
    settings: CollectSettings, *, worker_id: int, policy_device: torch.device, env_device: str
) -> None:
    """Refuse ``settings`` if they ask for devices or a policy form this actor does not offer.

    Raises:
        PlacementError: A ``policy_device`` or ``env_device`` other than the actor's, or
            ``cudagraph_policy`` on an actor without CUDA graphs (naming the actor).
    """
    asked = (
        ("policy_device", settings.policy_device, policy_device),
        ("env_device", settings.env_device, env_device),
    )
    for name, requested, actual in asked:
        if requested and not same_device(requested, actual):
            raise PlacementError(
                f"actor {worker_id} runs its {name.removesuffix('_device')} on {actual}, "
                f"the session asks {name}={requested!r}; start the actor with --device "
                f"{requested} (an actor never moves it, nor falls back to the CPU)"
            )
    if settings.cudagraph_policy:
        raise PlacementError(
            f"actor {worker_id} cannot capture its policy in CUDA graphs (cudagraph_policy) "
            f"on {policy_device}; the session asks for it"
        )


class CompiledForward:
    """A model's forward, eager or ``torch.compile``-d for the session in force.

    Args:
        eager: The forward as built.
    """

    def __init__(self, eager: Callable[..., Any]) -> None:
        self.eager = eager
        self._compiled: Callable[..., Any] | None = None
        self._settings: CompileSettings | None = None

    def use(self, settings: CompileSettings | None) -> None:
        """Compile with ``settings`` (lazily, at the first call), or go back to eager (None).

        The compiled forward is kept while the settings stay the same, so a session that
        reopens with them does not compile again.
        """
        if settings != self._settings:
            self._settings = settings
            self._compiled = (
                None if settings is None else torch.compile(self.eager, **settings.kwargs())
            )

    @property
    def compiled(self) -> bool:
        """Whether calls go through ``torch.compile``."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        """Call the forward in force."""
        forward = self.eager if self._compiled is None else self._compiled  # no truth test:
        return forward(*args)  # a compiled module answers len() like its module
