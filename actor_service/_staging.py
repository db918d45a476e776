"""The swap of a checked weight push into a live model: the only moment generation waits.

A push is received, checksummed, decoded, checked and staged on the model's device
while the rollout goes on; :func:`swap_full` and :func:`swap_delta` then take the
model's lock (the one every forward takes, so the swap lands between two env steps
or decode steps), re-check the version rule (a concurrent push may have won), copy
in and set the version. The time the lock was held is the push's generation pause,
returned in a :class:`Swap` and reported in ``PushWeightsResponse.pause_seconds``.
Both the env actor's ``ModelRegistry`` and the LLM actor's ``LLMModels`` swap here.
:class:`ReceiveBuffers` keeps one receive buffer per model for the next push.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from common.errors import SessionStateError
from common.weights import Delta, apply_delta

__all__ = ["ReceiveBuffers", "Swap", "check_base", "swap_delta", "swap_full"]


@dataclasses.dataclass(frozen=True)
class Swap:
    """One applied push.

    Attributes:
        version: The policy version now in force.
        pause_seconds: How long the swap held the model lock (generation waited at most this).
    """

    version: int
    pause_seconds: float


class Slot(Protocol):
    """What a swap needs of a model: its lock and its version (read and written under the lock)."""

    lock: threading.Lock
    version: int


def check_base(model_id: str, base_version: int, current: int) -> None:
    """The rule of delta pushes: they apply only on top of the version they were computed from.

    Raises:
        SessionStateError: ``current != base_version`` (FAILED_PRECONDITION; the learner
            answers with a full push).
    """
    if current != base_version:
        raise SessionStateError(
            f"delta push for model {model_id!r} applies on top of version {base_version}, "
            f"but version {current} is in force; send a full push"
        )


def _timed(lock: threading.Lock, check: Callable[[], None], apply: Callable[[], None]) -> float:
    with lock:
        start = time.perf_counter()
        check()
        apply()
        return time.perf_counter() - start


def swap_full(
    slot: Slot,
    version: int,
    copy_in: Callable[[], None],
    check_newer: Callable[[int, int], None],
) -> Swap:
    """Copy checked, staged tensors into the live model under the lock.

    Args:
        slot: The model (its ``lock`` and ``version``).
        version: The version being installed.
        copy_in: Writes the staged tensors into the model's own (``apply_staged``).
        check_newer: ``(version, current)`` -> None or raises: the staleness rule.
    """

    def apply() -> None:
        copy_in()
        slot.version = version

    pause = _timed(slot.lock, lambda: check_newer(version, slot.version), apply)
    return Swap(version, pause)


def swap_delta(
    slot: Slot,
    model_id: str,
    base_version: int,
    version: int,
    reference: Mapping[str, torch.Tensor],
    delta: Delta,
    check_newer: Callable[[int, int], None],
) -> Swap:
    """Write a checked delta into ``reference`` under the lock, if ``base_version`` is in force.

    Raises:
        SessionStateError: Another version is in force (nothing is written).
        StaleVersionError: ``version`` is not newer than the one in force.
    """

    def check() -> None:
        check_newer(version, slot.version)
        check_base(model_id, base_version, slot.version)

    def apply() -> None:
        apply_delta(reference, delta)
        slot.version = version

    return Swap(version, _timed(slot.lock, check, apply))


class ReceiveBuffers:
    """One reusable receive buffer per model_id, so a push writes into memory already mapped.

    A fresh buffer of 100 MB costs ~25,000 page faults on every push; a kept one
    costs none. A buffer is lent to one push at a time (a concurrent push gets a
    fresh one) and kept after the push is applied or refused; the tensors decoded
    from it are copied into the model before it is given back. The memory held is
    the largest push of each model.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: dict[str, torch.Tensor] = {}

    def take(self, model_id: str, nbytes: int) -> torch.Tensor | None:
        """The model's spare buffer if it holds ``nbytes`` (no longer spare), else None."""
        with self._lock:
            spare = self._spare.get(model_id)
            if spare is None or spare.numel() < nbytes:
                return None
            return self._spare.pop(model_id)

    def give_back(self, model_id: str, buffer: torch.Tensor) -> None:
        """Keep ``buffer`` for the model's next push (the larger one, if two come back)."""
        with self._lock:
            spare = self._spare.get(model_id)
            if spare is None or spare.numel() < buffer.numel():
                self._spare[model_id] = buffer
