"""The rules every weight swap on an actor follows, whatever model it holds.

Every kind of actor applies pushes and restored states the same way: the weights are
checked against the model's own tensors and staged before anything changes, a push must
be newer than the version in force, a restored state may not go back unless asked, and
the swap (``common.weights.apply_staged``) runs under the model's lock once every check
passed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from common.errors import StaleVersionError, WeightsError
from common.weights import PushForm, stage_state, to_state_dict

__all__ = ["check_newer", "check_not_older", "stage_weights", "weight_copies"]


def stage_weights(
    model_id: str,
    state: object,
    reference: Mapping[str, torch.Tensor],
    form: PushForm | None = None,
) -> dict[str, torch.Tensor]:
    """Check ``state`` against a model's ``reference`` tensors and stage it; change nothing.

    Keys, shapes, dtypes (under ``form``: a subset, a wire dtype), ties and finiteness
    (``common.weights.stage_state``).

    Returns:
        The tensors cast into the model's dtypes, on its device.

    Raises:
        WeightsError: Not a mapping, or naming every offending key.
    """
    if not isinstance(state, Mapping):
        raise WeightsError(
            f"weights for {model_id!r} must be a mapping, got {type(state).__name__}"
        )
    return stage_state(state, reference, form or PushForm())


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


def check_not_older(
    model_id: str,
    version: int,
    current: int,
    staged: Mapping[str, torch.Tensor],
    live: Mapping[str, torch.Tensor],
) -> None:
    """A restored state may not take a model back (unless ``allow_rollback``).

    Back is an older version, or other weights under the version in force: a pushed
    version names one set of weights, which the versions on every batch rely on. Version 0
    is each actor's own first weights (its factory's), so a state at 0 may carry another
    actor's. The weights are compared only when the versions are equal.

    Raises:
        StaleVersionError: ``version < current``, or ``version == current > 0`` with
            ``staged`` unlike ``live``.
    """
    if version < current:
        raise StaleVersionError(
            f"state version {version} for model {model_id!r} is older than the "
            f"version in force, {current}; set allow_rollback to load it anyway"
        )
    if version == current > 0 and not _equal_tensors(staged, live):
        raise StaleVersionError(
            f"state version {version} for model {model_id!r} is the version in force, "
            "with other weights; set allow_rollback to load it anyway"
        )


def _equal_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def weight_copies(module: nn.Module) -> dict[str, torch.Tensor]:
    """A snapshot of ``module``'s weights that a later push cannot change."""
    # to_state_dict's CPU tensors may view the live parameters.
    return {k: v.clone() for k, v in to_state_dict(module).items()}
