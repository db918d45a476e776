"""Who an actor is: its random epoch and its description.

:func:`draw_epoch` draws the random id that, with ``worker_id`` and a batch
``seq``, names a batch uniquely; :class:`ActorIdentity` is what ``Describe``
reports. (The settings validate themselves: ``ActorConfig.__post_init__``.)
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING

import gymnasium
import torch

if TYPE_CHECKING:
    from actor_service._runtime import CoreModels

__all__ = ["ActorIdentity", "describe_models", "draw_epoch"]


@dataclasses.dataclass(frozen=True)
class ActorIdentity:
    """What an actor is, for ``Describe``.

    Attributes:
        worker_id: The actor's id in the fleet.
        epoch: Random, nonzero, new at each start.
        env_id: The gymnasium id or the env factory string.
        observation_space: The single-env observation space (None for an LLM actor).
        action_space: The single-env action space (None for an LLM actor).
        models: ``{model_id: (policy_version, {param: (shape, dtype)})}``.
        num_envs: Size of the env pool.
        env_backend: ``"sync"`` or ``"async"``.
        device: The models' device.
        software_version: ``common.__version__``.
        kind: ``"env"`` or ``"llm"``.
        policy: The LLM actor's model spec (empty for env actors).
    """

    worker_id: int
    epoch: int
    env_id: str
    observation_space: gymnasium.Space | None
    action_space: gymnasium.Space | None
    models: dict[str, tuple[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]]
    num_envs: int
    env_backend: str
    device: str
    software_version: str
    kind: str = "env"
    policy: str = ""


def describe_models(
    models: CoreModels,
) -> dict[str, tuple[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]]:
    """``ActorIdentity.models`` of a core's models, env or LLM: version and parameters by id."""
    return {
        mid: (models.policy_version(mid), models.parameters_info(mid)) for mid in models.model_ids
    }


def draw_epoch() -> int:
    """A random, nonzero 63-bit epoch."""
    # From the OS, not torch/numpy: a seeded actor must still get a fresh epoch.
    while True:
        epoch = secrets.randbits(63)
        if epoch:
            return epoch
