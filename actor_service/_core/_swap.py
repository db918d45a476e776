"""The swap of a checked weight push into a live model: the only moment generation waits.

A push is received, checksummed, decoded, checked and staged on the model's device
while the rollout goes on; :func:`swap_full` and :func:`swap_delta` then take the
model's lock (the one every forward takes, so the swap lands between two env steps
or decode steps), re-check the version rule (a concurrent push may have won), copy
in and set the version. The time the lock was held is the push's generation pause,
returned in a :class:`Swap` and reported in ``PushWeightsResponse.pause_seconds``.
Every kind of actor pushes, restores and installs multi-part pushes through here (its
models are a :class:`~actor_service._core._model_book.ModelBook`), so a push waits the same
way whatever the model.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from actor_service._core._weight_rules import (
    check_newer,
    check_not_older,
    stage_weights,
    weight_copies,
)
from common.errors import SessionStateError, WeightsError
from common.weights import (
    Delta,
    PushForm,
    apply_delta,
    apply_staged,
    check_policy_version,
    check_ties,
    check_writable,
)

__all__ = [
    "ReceiveBuffers",
    "Swap",
    "StagedParts",
    "check_base",
    "on_devices",
    "push_delta",
    "push_full",
    "restore",
    "snapshot",
    "swap_delta",
    "swap_full",
    "swap_parts",
]


@dataclasses.dataclass(frozen=True)
class Swap:
    """One applied push.

    Attributes:
        version: The policy version now in force.
        pause_seconds: How long the swap held the model lock (generation waited at most this).
    """

    version: int
    pause_seconds: float


@dataclasses.dataclass(frozen=True)
class StagedParts:
    """Every part of one version, checked and staged, merged: what :func:`swap_parts` copies.

    Attributes:
        tensors: Whole tensors of the full parts, in the model's dtypes, on its device.
        delta: The delta parts' entries, on the model's device.
        base_version: The version the delta parts apply on top of; None without delta parts.
    """

    tensors: dict[str, torch.Tensor]
    delta: Delta
    base_version: int | None


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


def push_full(
    slot: Slot,
    model_id: str,
    version: int,
    reference: Mapping[str, torch.Tensor],
    state: object,
    form: PushForm | None = None,
) -> Swap:
    """A whole full push: check the version, stage ``state`` against ``reference``, swap.

    A stale version is refused before the (costly) staging and again under the lock.

    Raises:
        StaleVersionError: ``version`` is not newer than the one in force.
        WeightsError: Keys, shapes, dtypes or values that do not fit, or a version
            outside the int64 range.
    """
    check_policy_version(version)
    check_newer(model_id, version, slot.version)
    staged = stage_weights(model_id, state, reference, form)
    copy_in = functools.partial(apply_staged, reference, staged)
    return swap_full(slot, version, copy_in, functools.partial(check_newer, model_id))


def push_delta(
    slot: Slot,
    model_id: str,
    base_version: int,
    version: int,
    reference: Mapping[str, torch.Tensor],
    delta: Delta,
) -> Swap:
    """A whole delta push: check the version and ties, stage it on the device, :func:`swap_delta`.

    Raises:
        SessionStateError: Another version is in force (nothing is written).
        StaleVersionError: ``version`` is not newer than the one in force.
        WeightsError: A version outside the int64 range, keys the model ties changed
            differently, or a key it holds as a broadcast view changed (``check_writable``).
    """
    check_policy_version(version)
    check_ties({}, reference, delta)
    check_writable(reference, {}, delta)
    newer = functools.partial(check_newer, model_id)
    staged = on_devices(delta, reference)
    return swap_delta(slot, model_id, base_version, version, reference, staged, newer)


def swap_parts(
    slot: Slot,
    model_id: str,
    version: int,
    reference: Mapping[str, torch.Tensor],
    parts: StagedParts,
) -> Swap:
    """Swap every staged part of one version in together, under the lock (one pause).

    The parts were each checked and staged (``actor_service._serve._parts``); ties across
    parts are checked here, before the lock. Under the lock the version must still
    be newer than the one in force and, if a part is a delta, its base in force.

    Raises:
        WeightsError: Two parts give different values to keys the model ties, or change
            a key it holds as a broadcast view (``check_writable``).
        StaleVersionError: A newer version came into force meanwhile (nothing is written).
        SessionStateError: A delta part's base is no longer in force (nothing is written).
    """
    check_ties(parts.tensors, reference, parts.delta)
    check_writable(reference, parts.tensors, parts.delta)

    def check() -> None:
        check_newer(model_id, version, slot.version)
        if parts.base_version is not None:
            check_base(model_id, parts.base_version, slot.version)

    def apply() -> None:
        apply_staged(reference, parts.tensors)
        apply_delta(reference, parts.delta)
        slot.version = version

    return Swap(version, _timed(slot.lock, check, apply))


def on_devices(delta: Delta, reference: Mapping[str, torch.Tensor]) -> Delta:
    """The delta's indices and values on their targets' devices, copied before the lock."""
    return {
        key: (index.to(reference[key].device), values.to(reference[key].device))
        for key, (index, values) in delta.items()
    }


def snapshot(slot: Slot, module: nn.Module) -> dict[str, Any]:
    """A model's entry in a state dict: ``{"version": int, "weights": {key: CPU tensor}}``."""
    with slot.lock:
        return {"version": slot.version, "weights": weight_copies(module)}


def restore(
    slots: Mapping[str, tuple[Slot, Mapping[str, torch.Tensor]]],
    state: object,
    check_id: Callable[[str], object],
    *,
    allow_rollback: bool = False,
) -> dict[str, tuple[int, int]]:
    """Restore every model's weights and version from :func:`snapshot` entries, all or nothing.

    Everything is validated before anything is applied; then every model's lock is
    held while the versions are checked again and the weights swapped, so a
    concurrent push cannot make the restore half-applied.

    Args:
        slots: Each model (its lock and version) and its own tensors, by model_id.
        state: ``{model_id: {"version": int, "weights": {key: tensor}}}`` for every model.
        check_id: Raises UnknownModelError for an id the actor lacks.
        allow_rollback: Accept versions older than those in force (or equal, other weights).

    Returns:
        ``{model_id: (old_version, new_version)}``.

    Raises:
        UnknownModelError: ``state`` names a model this actor lacks.
        WeightsError: A model is missing, a version is not an int in int64 range, or
            weights do not fit.
        StaleVersionError: A version is older than the one in force, or equal with other
            weights, and ``allow_rollback`` is false.
    """
    staged = _stage_entries(slots, state, check_id)
    held = [slots[model_id][0] for model_id in staged]
    for slot in held:
        slot.lock.acquire()
    try:
        if not allow_rollback:
            for model_id, (version, weights) in staged.items():
                slot, live = slots[model_id]
                check_not_older(model_id, version, slot.version, weights, live)
        changes = {}
        for model_id, (version, weights) in staged.items():
            slot, reference = slots[model_id]
            changes[model_id] = (slot.version, version)
            apply_staged(reference, weights)
            slot.version = version
        return changes
    finally:
        for slot in reversed(held):
            slot.lock.release()


def _stage_entries(
    slots: Mapping[str, tuple[Slot, Mapping[str, torch.Tensor]]],
    state: object,
    check_id: Callable[[str], object],
) -> dict[str, tuple[int, dict[str, torch.Tensor]]]:
    """Validate a model state in full; ``{model_id: (version, weights staged)}``."""
    if not isinstance(state, Mapping):
        raise WeightsError(f"model state must be a mapping, got {type(state).__name__}")
    for model_id in state:
        check_id(model_id)
    missing = sorted(set(slots) - set(state))
    if missing:
        raise WeightsError(f"model state lacks models {missing}")
    staged = {}
    for model_id, (_, reference) in slots.items():
        entry = state[model_id]
        version = entry.get("version") if isinstance(entry, Mapping) else None
        version = check_policy_version(version, f"model state of {model_id!r}: version")
        weights = entry.get("weights") if isinstance(entry, Mapping) else None
        # raises unless a mapping of fitting tensors
        staged[model_id] = (version, stage_weights(model_id, weights, reference))
    return staged


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
