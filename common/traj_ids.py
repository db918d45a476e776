"""Trajectory ids unique across a fleet: the actor's worker_id and an epoch tag above a counter.

Actors draw them (:class:`TrajIds`: ``("collector", "traj_ids")``, an LLM actor's
``("collector", "group_id")``); the learner checks that an actor's ids name that actor
(:func:`worker_of`), so that no actor can pour its frames into another's trajectories.
"""

from __future__ import annotations

import numpy as np
import torch

from common.config import MAX_WORKER_ID

__all__ = ["WORKER_SHIFT", "TrajIds", "worker_of"]

_COUNTER_BITS = 32
_TAG_BITS = 15
_WORKER_BITS = 16  # holds every worker_id, 0..MAX_WORKER_ID (65535)
#: Where an id's worker_id starts (bits 62..47).
WORKER_SHIFT = _TAG_BITS + _COUNTER_BITS


class TrajIds:
    """Trajectory ids unique across a fleet: ``worker_id`` and an epoch tag above a counter.

    Layout of the non-negative ``int64`` id (bit 63 is always 0)::

        bits 62..47  worker_id            (16 bits, 0..65535)
        bits 46..32  epoch & 0x7FFF        (15 bits: the low bits of the actor's epoch)
        bits 31..0   per-actor counter     (wraps after 2**32 trajectories)

    Two actors never share a ``worker_id``; two starts of one actor draw different
    epochs, so their tags differ with probability 1 - 2**-15.

    Args:
        worker_id: The actor's id in the fleet.
        epoch: The actor's random epoch.
        counter: The first counter value (restored from a state dict).

    Raises:
        ValueError: ``worker_id`` outside 0..65535.
    """

    def __init__(self, worker_id: int, epoch: int, counter: int = 0) -> None:
        if not isinstance(worker_id, int) or not 0 <= worker_id <= MAX_WORKER_ID:
            raise ValueError(f"worker_id must be an int in 0..{MAX_WORKER_ID}, got {worker_id!r}")
        tag = epoch & ((1 << _TAG_BITS) - 1)
        self.base = (worker_id << WORKER_SHIFT) | (tag << _COUNTER_BITS)
        self.counter = counter

    def take(self, count: int) -> np.ndarray:
        """``count`` new ids, in order."""
        low = np.arange(self.counter, self.counter + count, dtype=np.int64) & (
            (1 << _COUNTER_BITS) - 1
        )
        self.counter += count
        return low | self.base


def worker_of(ids: torch.Tensor) -> torch.Tensor:
    """The worker_id each id names (a negative id names none: -1 or below)."""
    return ids >> WORKER_SHIFT
