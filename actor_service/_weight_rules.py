"""The rules every weight swap on an actor follows, whatever model it holds.

Env actors (:class:`~actor_service._models.ModelRegistry`) and LLM actors
(:class:`~actor_service._llm_models.LLMModels`) apply pushes and restored states
the same way: the weights are checked against the model's own tensors before
anything changes (:func:`check_weights`), a push must be newer than the version in
force (:func:`check_newer`), a restored state may not go back unless asked
(:func:`check_not_older`), and the swap copies into the model's tensors in place
(:func:`copy_in`) under the model's lock, once every check passed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from common.errors import StaleVersionError, WeightsError
from common.weights import check_compatible, check_finite

__all__ = ["check_newer", "check_not_older", "check_weights", "copy_in"]


def check_weights(model_id: str, state: object, reference: Mapping[str, torch.Tensor]) -> None:
    """Check ``state`` against a model's ``reference`` tensors; change nothing.

    Raises:
        WeightsError: Not a mapping; missing or unexpected keys, shape or dtype mismatches,
            NaN or Inf (naming every offending key).
    """
    if not isinstance(state, Mapping):
        raise WeightsError(
            f"weights for {model_id!r} must be a mapping, got {type(state).__name__}"
        )
    try:
        check_compatible(state, reference)
    except TypeError as exc:
        raise WeightsError(f"weights for {model_id!r}: {exc}") from None
    check_finite(state)


def check_newer(model_id: str, version: int, current: int) -> None:
    """The one staleness rule of weight pushes: a version must be newer than the one in force.

    Raises:
        StaleVersionError: ``version <= current``.
    """
    if version <= current:
        raise StaleVersionError(
            f"weights version {version} for model {model_id!r} is not newer than "
            f"the version in force, {current}"
        )


def check_not_older(model_id: str, version: int, current: int) -> None:
    """A restored state may not take a model's version back (unless ``allow_rollback``).

    Raises:
        StaleVersionError: ``version < current``.
    """
    if version < current:
        raise StaleVersionError(
            f"state version {version} for model {model_id!r} is older than the "
            f"version in force, {current}; set allow_rollback to load it anyway"
        )


def copy_in(reference: Mapping[str, torch.Tensor], staged: Mapping[str, torch.Tensor]) -> None:
    """Copy ``staged`` into the model's own tensors, key by key (every check already passed)."""
    # `reference` holds the module's own parameter and buffer tensors, so copying into
    # them updates the module in place.
    with torch.no_grad():
        for key, target in reference.items():
            target.copy_(staged[key])
