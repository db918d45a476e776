"""Who an actor is: its random epoch and the description ``Describe`` reports.

:func:`draw_epoch` draws the random id that, with ``worker_id`` and a batch
``seq``, names a batch uniquely; :class:`ActorIdentity` is what a collection core
says it is, in neutral words (slots, backend) that the servicer translates into
the wire's ``num_envs`` and ``env_backend``. (The settings validate themselves:
``ActorConfig.__post_init__``.)
"""

from __future__ import annotations

import dataclasses
import secrets

import gymnasium
import torch

__all__ = ["ActorIdentity", "draw_epoch"]


@dataclasses.dataclass(frozen=True)
class ActorIdentity:
    """What an actor is, for ``Describe``.

    Attributes:
        worker_id: The actor's id in the fleet.
        epoch: Random, nonzero, new at each start.
        env_id: What it collects from: the gymnasium id or env factory string, or the LLM task.
        observation_space: The single-env observation space (None for LLM and TorchRL-env
            actors).
        action_space: The single-env action space (None for LLM and TorchRL-env actors).
        models: ``{model_id: (policy_version, {param: (shape, dtype)})}``.
        num_slots: How many trajectories it runs side by side (envs of the pool, chat slots);
            ``num_envs`` on the wire.
        backend: How the slots run: ``"sync"`` or ``"async"`` (env pools), ``"llm"``;
            ``env_backend`` on the wire.
        device: The models' device.
        software_version: ``common.__version__``.
        kind: ``"env"``, ``"torchrl"`` or ``"llm"``.
        policy: The LLM actor's model spec (empty for env actors).
    """

    worker_id: int
    epoch: int
    env_id: str
    observation_space: gymnasium.Space | None
    action_space: gymnasium.Space | None
    models: dict[str, tuple[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]]
    num_slots: int
    backend: str
    device: str
    software_version: str
    kind: str = "env"
    policy: str = ""


def draw_epoch() -> int:
    """A random, nonzero 63-bit epoch."""
    # From the OS, not torch/numpy: a seeded actor must still get a fresh epoch.
    while True:
        epoch = secrets.randbits(63)
        if epoch:
            return epoch
