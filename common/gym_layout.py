"""How a gymnasium space's values lie in a batch: TorchRL's ``GymEnv`` layout, one rule.

Used by the actor (its batches), the built-in policies (their input width) and the learner
(the signature of a gymnasium ``create_env_fn``), so the three agree.
"""

from __future__ import annotations

from typing import Any

__all__ = ["batch_shape"]


def batch_shape(space: Any) -> tuple[int, ...]:
    """The per-env shape of a value of ``space`` (an observation or an action) in a batch.

    A scalar ``Box`` (shape ``()``) becomes ``(1,)``, as TorchRL's ``GymWrapper`` makes it;
    every other shape is kept (a ``Discrete`` space's one-hot width is the codecs' own).
    """
    shape = tuple(int(d) for d in (space.shape or ()))
    return shape or (1,)
