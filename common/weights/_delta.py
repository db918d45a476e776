"""Sparse-delta weights: only the elements that changed since a version the receiver holds.

A delta is a safetensors blob (:mod:`common.weights._safetensors`) holding, for every
tensor with at least one changed element, two 1-D tensors:

* ``indices:<key>`` — ``int32`` (or ``int64`` for tensors of 2**31 elements or
  more) flat element indices into the row-major tensor, strictly increasing; or,
  where it is smaller, ``gaps:<key>`` — ``uint8`` steps from one index to the next
  (the first from -1), each 1 to 255: an index further than 255 from the previous
  one is reached through *filler* entries that re-send an unchanged element (its
  bits are the receiver's already). One byte per index instead of four: a bf16
  delta of scattered elements is half the bytes;
* ``values:<key>`` — the new values at those indices, in the tensor's dtype, or
  in the *wire dtype* the header declares (``rlfleet.dtype``, as a full push
  does: :mod:`common.weights._push_form`), cast into the receiver's floating dtype.

Keys tied in both states (one tensor under several keys, as :func:`split_aliases`
finds them) travel once: the header names the others as aliases
(``rlfleet.aliases``, as in a full push) of a key whose entry the blob holds, and
the receiver gives them that very entry. Unchanged tensors are absent. "Changed"
compares bit patterns, not values (so ``-0.0`` after ``0.0`` is a change), and
applying every delta of a sequence gives the bits of the last full state exactly.
A wire-dtype delta is computed between two states cast to that dtype; as the
receiver casts element by element, a sequence of them leaves it with the bits a
full push of the last state in the same wire dtype would. The header's
``__metadata__`` carries ``"rlfleet.delta": "1"`` and the model_id; the version
it applies on top of travels beside the blob (``WeightsHeader.base_version``).

:func:`encode_delta` builds one on the learner; :func:`decode_delta` checks one
a peer sent against the receiver's ``{key: (shape, dtype)}`` (key names, both
halves present, dtypes, 1-D, equal lengths, indices within the tensor and
strictly increasing, values finite once cast) before anything is applied;
:func:`apply_delta` writes checked deltas into live tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from common.errors import WeightsError, WeightsTooLargeError
from common.weights._aliases import ALIASES_KEY, decode_aliases, encode_aliases, split_aliases
from common.weights._push_form import PushForm
from common.weights._safetensors import MAX_HEADER_BYTES, Expected, read_blob, write_blob

__all__ = [
    "DELTA_MARK",
    "Delta",
    "apply_delta",
    "changed_elements",
    "decode_delta",
    "encode_delta",
    "same_entry",
]

#: The ``__metadata__`` key (value ``"1"``) that marks a blob as a delta.
DELTA_MARK = "rlfleet.delta"
_INDICES = "indices:"
_GAPS = "gaps:"
_VALUES = "values:"
#: The largest step of a ``gaps:`` entry (its dtype is uint8).
_MAX_GAP = 255
# Integer dtypes of each element size, to compare bit patterns of any dtype.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: ``{key: (flat indices, values)}``, checked against the receiver's model.
Delta = dict[str, tuple[torch.Tensor, torch.Tensor]]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A flat integer view of ``tensor``'s bit patterns (no copy for contiguous tensors)."""
    flat = tensor.reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    if flat.dtype.is_complex:
        return flat.view(torch.float32).view(torch.int32).reshape(-1, 2)
    return flat.view(_BITS[flat.element_size()])


def changed_elements(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Flat indices (``int64``, increasing) where ``new``'s bits differ from ``old``'s.

    Raises:
        WeightsError: The two differ in shape or dtype.
    """
    # numpy's flatnonzero is ~4x faster than torch's nonzero on one CPU thread.
    return torch.from_numpy(np.flatnonzero(_differs(old, new).numpy()))


def _differs(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """A flat bool mask of the elements whose bits differ."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise WeightsError(
            f"a delta needs equal shapes and dtypes, got {list(old.shape)} {old.dtype} "
            f"and {list(new.shape)} {new.dtype}"
        )
    differs = _bits(old) != _bits(new)
    return differs.any(dim=1) if differs.dim() == 2 else differs  # complex: either part


def encode_delta(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
    max_bytes: int | None = None,
) -> bytes | memoryview | None:
    """The delta that turns ``old`` into ``new`` (same keys, shapes, dtypes), as safetensors.

    Args:
        old: What the receiver holds (contiguous CPU tensors by key).
        new: The state to send (contiguous CPU tensors, the same keys).
        metadata: Extra string pairs for the header (``"rlfleet.delta"`` is added).
        max_bytes: Give up (return None) when the indices and values alone would
            exceed this, e.g. the full state's bytes: a dense change is cheaper whole.

    Raises:
        WeightsError: The key sets, a shape or a dtype differ.
    """
    if set(old) != set(new):
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        raise WeightsError(f"a delta needs the same keys: missing {missing}, extra {extra}")
    ties = _kept_ties(old, new)
    masks = {key: _differs(old[key], new[key]) for key in sorted(new) if key not in ties}
    # Counted before any index is built (at the cheapest, one byte per index): listing
    # the indices of a dense change costs more than sending it whole.
    lower = sum(
        int(np.count_nonzero(mask.numpy())) * (1 + new[k].element_size())
        for k, mask in masks.items()
    )
    if max_bytes is not None and lower > max_bytes:
        return None
    parts: dict[str, torch.Tensor] = {}
    for key, mask in masks.items():
        index = np.flatnonzero(mask.numpy())
        if index.size:
            parts.update(_entry(key, index, new[key]))
    if max_bytes is not None and sum(t.nbytes for t in parts.values()) > max_bytes:
        return None
    meta = {**(metadata or {}), DELTA_MARK: "1"}
    aliases = {alias: target for alias, target in ties.items() if _VALUES + target in parts}
    if aliases:
        meta[ALIASES_KEY] = encode_aliases(aliases)
    return write_blob(parts, meta)


def _kept_ties(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``{alias: target}`` of the keys tied in both states: their change travels once."""
    _, before = split_aliases(old)
    _, after = split_aliases(new)
    return {alias: target for alias, target in after.items() if before.get(alias) == target}


def _entry(key: str, index: np.ndarray, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """One tensor's changed elements as ``gaps:``/``indices:`` and ``values:``, the smaller."""
    steps = np.diff(index, prepend=-1)
    fillers = (steps - 1) // _MAX_GAP  # before each index, to keep every step <= 255
    count = index.size + int(fillers.sum())
    width = tensor.element_size()
    if count * (1 + width) < index.size * ((4 if tensor.numel() < 2**31 else 8) + width):
        gaps = np.full(count, _MAX_GAP, dtype=np.int64)
        gaps[np.arange(index.size) + np.cumsum(fillers)] = steps - _MAX_GAP * fillers
        chosen = torch.from_numpy(np.cumsum(gaps) - 1)  # the indices, fillers included
        head = {_GAPS + key: torch.from_numpy(gaps.astype(np.uint8))}
    else:
        chosen = torch.from_numpy(index)
        small = tensor.numel() < 2**31
        head = {_INDICES + key: chosen.to(torch.int32) if small else chosen}
    return {**head, _VALUES + key: tensor.reshape(-1).index_select(0, chosen)}


def decode_delta(view: memoryview, expected: Expected, *, max_bytes: int) -> Delta:
    """Parse and check a delta a peer sent against the model it applies to; change nothing.

    Args:
        view: The received blob (tensors returned view it when it is writable).
        expected: ``{key: (shape, dtype)}`` of the receiver's model.
        max_bytes: The largest blob accepted.

    Returns:
        ``{key: (int64 flat indices, values in the model's dtype)}`` for each changed
        tensor (values of a declared wire dtype are cast into the model's dtype).

    Raises:
        WeightsTooLargeError: Over ``max_bytes``, or more entries than the model allows.
        WeightsError: Not a delta, an unknown key, a half missing, a wrong dtype or
            shape, unequal lengths, an index outside the tensor or out of order,
            a non-finite value.
    """
    if view.nbytes > max_bytes:
        raise WeightsTooLargeError(
            f"delta blob of {view.nbytes} bytes exceeds the cap of {max_bytes} bytes"
        )
    parts, metadata = read_blob(view, MAX_HEADER_BYTES, max_keys=2 * len(expected))
    if metadata.get(DELTA_MARK) != "1":
        raise WeightsError(f"a delta push must carry {DELTA_MARK!r} in its metadata")
    form = PushForm.from_metadata(metadata)  # a wire dtype (checked)
    halves = _halves(parts, expected)
    delta = {key: _checked(key, pair, expected[key], form) for key, pair in sorted(halves.items())}
    for alias, target in decode_aliases(metadata, halves, len(expected)).items():
        if expected.get(alias) != expected[target]:
            raise WeightsError(
                f"delta alias {alias[:120]!r} names no parameter of the model shaped as "
                f"{target[:120]!r}"
            )
        delta[alias] = delta[target]
    return delta


def _halves(
    parts: Mapping[str, torch.Tensor], expected: Expected
) -> dict[str, dict[str, torch.Tensor]]:
    """A delta blob's tensors as ``{key: {"indices" | "gaps" | "values": tensor}}``."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in parts.items():
        kind, _, key = name.partition(":")
        if kind + ":" not in (_INDICES, _GAPS, _VALUES) or key not in expected:
            known = ", ".join(sorted(expected)[:5])
            raise WeightsError(
                f"delta entry {name[:120]!r} names no parameter of the model "
                f"(want 'indices:<key>' or 'gaps:<key>', and 'values:<key>', with keys "
                f"such as {known})"
            )
        halves.setdefault(key, {})[kind] = tensor
    return halves


def _checked(
    key: str,
    pair: dict[str, torch.Tensor],
    spec: tuple[tuple[int, ...], torch.dtype],
    form: PushForm,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor's (indices, values in the model's dtype), every bound checked."""
    shape, dtype = spec
    if "values" not in pair:
        raise WeightsError(f"delta of {key!r} lacks its values")
    if ("indices" in pair) == ("gaps" in pair):
        what = "holds both indices and gaps" if "gaps" in pair else "lacks its indices (or gaps)"
        raise WeightsError(f"delta of {key!r} {what}")
    index, values = _index(key, pair), pair["values"]
    fits = form.fits_dtype(values.dtype, dtype)
    if not fits or values.dim() != 1 or values.numel() != index.numel():
        wire = f" (or {form.wire_dtype})" if form.wire_dtype and dtype.is_floating_point else ""
        raise WeightsError(
            f"delta values of {key!r} must be 1-D {dtype}{wire} with one value per index "
            f"({index.numel()}), got {values.dtype} of shape {list(values.shape)}"
        )
    numel = 1
    for dim in shape:
        numel *= dim
    if index.numel() and (int(index[0]) < 0 or int(index[-1]) >= numel):
        raise WeightsError(
            f"delta indices of {key!r} reach {int(index[0])}..{int(index[-1])}, outside "
            f"the tensor's {numel} elements"
        )
    if index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
        raise WeightsError(f"delta indices of {key!r} must be strictly increasing")
    values = values.to(dtype)  # a wire dtype into the model's (a cast may overflow: checked)
    if (values.is_floating_point() or values.is_complex()) and not _finite(values):
        raise WeightsError(f"delta values of {key!r} hold non-finite values (NaN/Inf)")
    return index, values


def _index(key: str, pair: dict[str, torch.Tensor]) -> torch.Tensor:
    """The int64 flat indices of one entry, from its ``indices`` or its ``gaps``."""
    if "gaps" in pair:
        gaps = pair["gaps"]
        if gaps.dtype != torch.uint8 or gaps.dim() != 1:
            raise WeightsError(
                f"delta gaps of {key!r} must be 1-D uint8, got {gaps.dtype} "
                f"of shape {list(gaps.shape)}"
            )
        if gaps.numel() and not bool(gaps.all()):
            raise WeightsError(f"delta gaps of {key!r} must be 1 to 255 (indices increase)")
        return gaps.to(torch.int64).cumsum(0) - 1
    index = pair["indices"]
    if index.dtype not in (torch.int32, torch.int64) or index.dim() != 1:
        raise WeightsError(
            f"delta indices of {key!r} must be 1-D int32 or int64, got {index.dtype} "
            f"of shape {list(index.shape)}"
        )
    return index.to(torch.int64)


def _finite(values: torch.Tensor) -> bool:
    wide = values.float() if values.element_size() == 1 else values
    return bool(torch.isfinite(wide).all())


def same_entry(
    one: tuple[torch.Tensor, torch.Tensor] | None, other: tuple[torch.Tensor, torch.Tensor] | None
) -> bool:
    """Whether two checked entries change a tensor alike: the same indices and value bits."""
    if one is None or other is None:
        return one is other
    return one is other or (
        torch.equal(one[0], other[0])
        and one[1].dtype == other[1].dtype
        and torch.equal(_bits(one[1]), _bits(other[1]))
    )


def apply_delta(targets: Mapping[str, torch.Tensor], delta: Delta) -> None:
    """Write checked deltas into live tensors (e.g. a module's state-dict tensors).

    Every index and dtype was checked by :func:`decode_delta`; this only copies.
    """
    with torch.no_grad():
        for key, (index, values) in delta.items():
            target = targets[key]
            if target.is_contiguous():
                target.view(-1).index_copy_(0, index.to(target.device), values.to(target.device))
            else:
                flat = target.reshape(-1).clone()
                flat.index_copy_(0, index.to(target.device), values.to(target.device))
                target.copy_(flat.view_as(target))
