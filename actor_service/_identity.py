"""Who an actor is: its validated settings, its random epoch and its description.

:func:`validate_config` checks the settings the collection core relies on before
anything is built; :func:`draw_epoch` draws the random id that, with ``worker_id``
and a batch ``seq``, names a batch uniquely; :class:`ActorIdentity` is what
``Describe`` reports.
"""

from __future__ import annotations

import dataclasses
import secrets

import gymnasium
import torch

from actor_service._config import ActorConfig

__all__ = ["ActorIdentity", "draw_epoch", "validate_config"]


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


def validate_config(config: ActorConfig) -> None:
    """Refuse settings the collection core cannot run with (ValueError/TypeError naming them)."""
    if not isinstance(config, ActorConfig):
        raise TypeError(f"config must be an ActorConfig, got {type(config).__name__}")
    if not isinstance(config.worker_id, int) or not 0 <= config.worker_id <= 0xFFFF:
        raise ValueError(f"worker_id must be an int in 0..65535, got {config.worker_id!r}")
    if not isinstance(config.torch_threads, int) or config.torch_threads < 1:
        raise ValueError(f"torch_threads must be a positive int, got {config.torch_threads!r}")
    if not config.step_timeout > 0:
        raise ValueError(f"step_timeout must be positive, got {config.step_timeout!r}")
    if config.kind not in ("env", "llm"):
        raise ValueError(f"kind must be 'env' or 'llm', got {config.kind!r}")
    if config.seed is not None and (
        not isinstance(config.seed, int) or not 0 <= config.seed < 2**64
    ):
        raise ValueError(f"seed must be None or an int in [0, 2**64), got {config.seed!r}")


def draw_epoch() -> int:
    """A random, nonzero 63-bit epoch."""
    # From the OS, not torch/numpy: a seeded actor must still get a fresh epoch.
    while True:
        epoch = secrets.randbits(63)
        if epoch:
            return epoch
