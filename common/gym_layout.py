"""How a gymnasium space's values lie in a batch: TorchRL's ``GymEnv`` layout, one rule.

Used by the actor (its batches), the built-in policies (their input width) and the learner
(the signature of a gymnasium ``create_env_fn``), so the three agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["batch_dtype", "batch_shape", "torch_dtype"]


def batch_shape(space: Any) -> tuple[int, ...]:
    """The per-env shape of a value of ``space`` (an observation or an action) in a batch.

    A ``Discrete`` space's value is one-hot, ``(n,)``; a scalar ``Box`` (shape ``()``)
    becomes ``(1,)``, as TorchRL's ``GymWrapper`` makes them; every other shape is kept.
    """
    if _is_discrete(space):
        return (int(space.n),)
    shape = tuple(int(d) for d in (space.shape or ()))
    return shape or (1,)


def batch_dtype(space: Any) -> torch.dtype:
    """The torch dtype of a value of ``space`` in a batch (``int64`` one-hot for Discrete)."""
    if _is_discrete(space):
        return torch.int64
    return torch_dtype(space.dtype)


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.float32`` → ``torch.float32``)."""
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


def _is_discrete(space: Any) -> bool:
    import gymnasium  # the learner imports this module without needing gymnasium first

    return isinstance(space, gymnasium.spaces.Discrete)
