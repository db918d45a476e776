"""Applying a received state to a live model: fit, cast, tie and finiteness checks, then copy.

:func:`stage_state` does every check and every device move or dtype cast of a
push before anything changes; :func:`apply_staged` then only copies (under the
caller's lock). :func:`load_into` joins both for a plain module. Re-exported by
:mod:`common.weights`, which is the public home.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from common.errors import WeightsError
from common.weights._aliases import split_aliases
from common.weights._delta import Delta, apply_delta, same_entry
from common.weights._push_form import FULL, PushForm, check_fit

__all__ = [
    "apply_staged",
    "check_compatible",
    "check_finite",
    "check_ties",
    "check_writable",
    "load_into",
    "stage_state",
    "state_nbytes",
]


def check_finite(state: Mapping[str, torch.Tensor]) -> None:
    """Refuse NaN and Inf in floating-point and complex tensors.

    Args:
        state: Tensors by key.

    Raises:
        WeightsError: Naming every key that holds a non-finite value.
    """
    bad = []
    for key, tensor in state.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        # isfinite is not implemented for the 1-byte float8 dtypes.
        values = tensor.float() if tensor.element_size() == 1 else tensor
        # NaN and Inf survive a sum, so a finite sum proves every element finite
        # at a fraction of isfinite's cost; a non-finite one may also be a
        # finite overflow, so only then is every element checked.
        if bool(torch.isfinite(values.sum())):
            continue
        if not bool(torch.isfinite(values).all()):
            bad.append(key)
    if bad:
        raise WeightsError(f"weights hold non-finite values (NaN/Inf) in keys {sorted(bad)}")


def check_compatible(
    state: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    form: PushForm = FULL,
) -> None:
    """Check that ``state`` fits ``reference``: keys, shapes and dtypes.

    A full push (the default ``form``) must hold exactly the reference's keys,
    each in its dtype; a subset may lack keys, and a declared wire dtype may
    stand for any floating dtype (:func:`common.weights._push_form.fit_problems`).

    Args:
        state: The incoming tensors by key.
        reference: What the target model holds (e.g. ``module.state_dict()``).
        form: What the push declares.

    Raises:
        WeightsError: Naming every missing key, every unexpected key, every
            shape mismatch (with both shapes) and every dtype mismatch (with
            both dtypes) at once.
        TypeError: A value of either mapping is not a tensor.
    """
    for name, mapping in (("weights", state), ("reference", reference)):
        for key, value in mapping.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{name} value {key!r} must be a torch.Tensor, got {type(value).__name__}"
                )
    check_fit(
        {k: (v.shape, v.dtype) for k, v in state.items()},
        {k: (v.shape, v.dtype) for k, v in reference.items()},
        form,
    )


def stage_state(
    state: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    form: PushForm = FULL,
) -> dict[str, torch.Tensor]:
    """Check a push against a live model and prepare it for :func:`apply_staged`.

    Checks keys, shapes and dtypes (:func:`check_compatible`), casts each tensor
    onto its target's device and into its dtype (once per distinct tensor, so an
    alias costs nothing), refuses two different values for keys the model ties
    and other values for a key it holds as a broadcast view (:func:`check_writable`),
    and scans the cast values for NaN/Inf (a float64 value may overflow float32).
    Nothing of the model changes.

    Args:
        state: The incoming tensors by key (e.g. :func:`decode_weights` output).
        reference: The model's own tensors by key (``module.state_dict()``).
        form: What the push declares.

    Returns:
        ``{key: tensor ready to copy}`` for the keys ``state`` holds.

    Raises:
        WeightsError: The state does not fit, breaks a tie, changes a broadcast view,
            or is not finite.
    """
    try:
        check_compatible(state, reference, form)
    except TypeError as exc:
        raise WeightsError(str(exc)) from None
    staged: dict[str, torch.Tensor] = {}
    cast: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
    for key, value in state.items():
        target = reference[key]
        slot = (id(value), target.dtype, target.device)
        if slot not in cast:
            cast[slot] = value.to(device=target.device, dtype=target.dtype)
        staged[key] = cast[slot]
    check_ties(staged, reference)
    check_writable(reference, staged)
    try:
        check_finite(_distinct(staged))
    except WeightsError as exc:
        cause = _overflow_cause(state, staged, form)
        if not cause:
            raise
        raise WeightsError(f"{exc}{cause}") from None
    return staged


def _overflow_cause(
    state: Mapping[str, torch.Tensor], staged: Mapping[str, torch.Tensor], form: PushForm
) -> str:
    """Where the Inf of refused values may come from ("" if no cause is known).

    A cast here into a narrower range, or the push's wire dtype, whose narrow range the
    learner's cast overflowed.
    """
    casts = {(state[key].dtype, staged[key].dtype) for key in staged}
    narrowed = sorted(f"{a} -> {b}" for a, b in casts if a != b and _range(a) > _range(b))
    if narrowed:
        return (
            f" once cast into the model's dtypes ({', '.join(narrowed)}): values beyond "
            "the model dtype's range overflow to Inf"
        )
    wire = form.wire_dtype
    if wire is None or _range(wire) >= _range(torch.bfloat16):
        return ""
    return (
        f"; the push travelled in {wire}, whose values end at ±{_range(wire):g}: larger ones "
        "become Inf in the learner's cast (push with dtype=torch.bfloat16, float32's range, "
        "or without a dtype)"
    )


def _range(dtype: torch.dtype) -> float:
    """The largest finite value of a floating dtype (0 for any other)."""
    return float(torch.finfo(dtype).max) if dtype.is_floating_point else 0.0


def check_ties(
    staged: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    delta: Delta | None = None,
) -> None:
    """Refuse two different values for keys the model ties (one tensor under several keys).

    Whole tensors (``staged``) given to both keys must be equal. A delta's entries
    (``delta``, applied on the values the tied keys share) must change both alike, the
    same indices and value bits, or neither; an entry for one key beside a whole tensor
    for the other must give it that tensor's values.

    Raises:
        WeightsError: Naming the tied pairs given different values.
    """
    _, ties = split_aliases(reference)
    changes = delta or {}
    broken = [
        f"{alias} and {target}"
        for alias, target in ties.items()
        if _tie_broken(staged, changes, reference, alias, target)
    ]
    if broken:
        raise WeightsError(
            f"weights give different values to keys this model ties (one tensor): "
            f"{broken[:10]}; send them tied, or as one key"
        )


def _tie_broken(
    staged: Mapping[str, torch.Tensor],
    delta: Delta,
    reference: Mapping[str, torch.Tensor],
    alias: str,
    target: str,
) -> bool:
    """Whether a push gives the tied ``alias`` and ``target`` different values."""
    one, other = delta.get(alias), delta.get(target)
    if one is not None and other is not None:
        return not same_entry(one, other)
    if one is None and other is None:
        return (
            alias in staged
            and target in staged
            and staged[alias] is not staged[target]
            and not torch.equal(staged[alias], staged[target])
        )
    key, entry, twin = (alias, one, target) if one is not None else (target, other, alias)
    if twin not in staged:
        return True  # one key changes, the other keeps its value
    changed = reference[key].detach().clone()  # a whole part beside a delta part: exact
    apply_delta({key: changed}, {key: entry})  # type: ignore[dict-item]
    return not torch.equal(changed, staged[twin])


def _broadcast(tensor: torch.Tensor) -> bool:
    """Whether elements of ``tensor`` share memory: a stride-0 view, as ``expand()`` makes."""
    sizes = zip(tensor.shape, tensor.stride(), strict=True)
    return any(size > 1 and stride == 0 for size, stride in sizes)


def check_writable(
    reference: Mapping[str, torch.Tensor],
    staged: Mapping[str, torch.Tensor],
    delta: Delta | None = None,
) -> None:
    """Refuse to change a key the model holds as a broadcast view (see below).

    A broadcast view (stride 0, as ``expand()`` makes) holds many elements in one memory
    cell: no copy can write other values there (torch refuses the write). A whole tensor
    equal to the live one needs no write (:func:`apply_staged` skips it); any other value,
    and any delta entry (a change), is refused before anything changes.

    Raises:
        WeightsError: Naming the keys and the fix.
    """
    changes = delta or {}
    bad = sorted(
        key
        for key in {*staged, *changes}
        if _broadcast(reference[key])
        and (key in changes or not torch.equal(staged[key], reference[key]))
    )
    if bad:
        raise WeightsError(
            f"weights change keys {bad[:10]} that this model holds as broadcast views "
            "(stride 0, as expand() makes them: every element one memory cell), which no "
            "push can write; build the actor's policy with those tensors cloned "
            "(.expand(...).clone()) to push them"
        )


def _distinct(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The first key of each distinct tensor object (an alias is scanned once)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in state.items():
        if id(value) not in seen:
            seen.add(id(value))
            out[key] = value
    return out


def apply_staged(reference: Mapping[str, torch.Tensor], staged: Mapping[str, torch.Tensor]) -> None:
    """Copy :func:`stage_state`'s output into the model's tensors (the caller holds its lock).

    A key tied to one already written with the same tensor is skipped, and so is a
    broadcast view given its own values (:func:`check_writable`).
    """
    done: set[tuple[int, int]] = set()
    with torch.no_grad():
        for key, source in staged.items():
            target = reference[key]
            slot = (target.data_ptr(), id(source))
            if slot in done or (_broadcast(target) and torch.equal(target, source)):
                continue
            done.add(slot)
            target.copy_(source)


def state_nbytes(info: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> int:
    """The bytes of a state described as ``{key: (shape, dtype)}`` (each key counted)."""
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in info.values())


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor], form: PushForm = FULL) -> None:
    """Apply ``state`` to a live module, all or nothing.

    Every check (:func:`stage_state`: keys, shapes, dtypes, ties, finiteness)
    and every device move or cast happens before the first copy, so a rejected
    state leaves the module untouched.

    Args:
        module: The module to update in place (parameters and buffers).
        state: Tensors by dotted key, e.g. from :func:`decode_weights`.
        form: What the state declares (a subset, a wire dtype).

    Raises:
        WeightsError: The state does not fit the module or is not finite.
    """
    reference = module.state_dict()
    apply_staged(reference, stage_state(state, reference, form))
