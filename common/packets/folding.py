"""Folded batches: each observation crosses the wire once, and the full layout is rebuilt exactly.

In TorchRL's batch layout ``("next", key)`` at step ``t`` of an env is ``key`` at
step ``t + 1`` of the same env, except where the episode ended at ``t`` (the
final observation, while step ``t + 1`` holds the reset one) and at the batch's
last step (whose successor is in the next batch). A folded batch is two packets:

* the **batch** without ``("next", key)`` for each folded key (``[N, T]``, the
  rest unchanged);
* the **finals**, batch size ``[K]``: ``"index"`` (``int64``, strictly ascending
  flat positions ``env * T + t`` in ``[0, N * T)``, every ``env * T + T - 1``
  among them), and for each folded key its values at those positions
  (``[K, *shape]``, the key's dtype; nested keys stay nested).

:func:`unfold` rebuilds ``("next", key)`` = ``key`` shifted by one step, the
finals written at their positions; every count, shape, dtype and index is
checked against the batch before anything is allocated, so a hostile peer can
cause neither an out-of-range write nor an allocation larger than the batch it
sent. :func:`fold` folds a full batch (the positions where ``("next", key)``
differs from the following step, compared bit for bit, and the last step), so
folding is exact whatever the batch holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from common.errors import ProtocolError

__all__ = ["FoldedBatch", "INDEX", "fold", "fold_from_steps", "unfold"]

#: The finals' entry of flat positions.
INDEX = "index"
_ALIGN = 16
Key = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FoldedBatch:
    """A ``[N, T]`` batch without ``("next", key)`` for its folded keys, and their finals.

    Attributes:
        batch: The batch, ``("next", key)`` left out for each folded key.
        finals: ``[K]``: ``"index"`` and each folded key's values at those positions.
    """

    batch: TensorDict
    finals: TensorDict

    def numel(self) -> int:
        """Frames in the batch."""
        return int(self.batch.numel())

    def unfold(self) -> TensorDict:
        """The full batch (see :func:`unfold`)."""
        return unfold(self.batch, self.finals)


def fold_from_steps(
    batch: TensorDict, finals: dict[Key, torch.Tensor], index: torch.Tensor
) -> FoldedBatch:
    """Wraps a batch built without ``("next", key)`` and its finals (the actor's path).

    Args:
        batch: The ``[N, T]`` batch, each folded key present at the root only.
        finals: Each folded key's values at ``index``, ``[K, *shape]``.
        index: ``int64`` ``[K]`` positions, strictly ascending, every last step among them.
    """
    values: dict[str, torch.Tensor] = {INDEX: index}
    out = TensorDict(values, batch_size=[index.shape[0]])
    for key, value in finals.items():
        out.set(key, value)
    return FoldedBatch(batch, out)


def fold(full: TensorDictBase, keys: Sequence[str | Key]) -> FoldedBatch:
    """Folds a full ``[N, T]`` batch: ``("next", key)`` is kept only where it is not ``key`` at t+1.

    Args:
        full: A batch in TorchRL's layout (batch dims ``[N, T]``, a ``"next"`` sub-tensordict).
        keys: The keys to fold (each must be at the root and under ``"next"``, alike).

    Returns:
        The folded batch; :func:`unfold` gives back a batch equal to ``full`` bit for bit.

    Raises:
        ValueError: A key is missing or its two entries differ in shape or dtype.
    """
    if full.batch_dims != 2:
        raise ValueError(f"fold expects a [N, T] batch, got batch size {list(full.batch_size)}")
    n, t = full.batch_size
    norm = [_key(k) for k in keys]
    differs = torch.zeros((n, t), dtype=torch.bool)
    differs[:, -1] = True
    for key in norm:
        now, nxt = full.get(key, None), full.get(("next", *key), None)
        if not isinstance(now, torch.Tensor) or not isinstance(nxt, torch.Tensor):
            raise ValueError(f"key {list(key)} is not a tensor at the root and under 'next'")
        if now.shape != nxt.shape or now.dtype != nxt.dtype:
            raise ValueError(f"key {list(key)}: root and 'next' entries differ in shape or dtype")
        if t > 1:
            differs[:, :-1] |= _bits(nxt[:, :-1]).ne(_bits(now[:, 1:])).any(-1)
    index = differs.reshape(-1).nonzero().squeeze(-1)
    batch = full.clone(recurse=False)
    nxt_td = full.get("next").clone(recurse=False)
    for key in norm:
        nxt_td.del_(key)
    batch.set("next", nxt_td)
    finals = {k: full.get(("next", *k)).reshape(n * t, *full.get(k).shape[2:])[index] for k in norm}
    return fold_from_steps(batch, finals, index)


def _bits(value: torch.Tensor) -> torch.Tensor:
    """``[N, T', ...]`` as one row of raw bytes per frame (so -0.0 != 0.0 and NaN == NaN)."""
    flat = value.contiguous().reshape(*value.shape[:2], -1)
    if flat.dtype.is_floating_point or flat.dtype.is_complex:
        flat = flat.view(torch.uint8)
    return flat


def _key(key: str | Key) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def unfold(
    batch: TensorDict,
    finals: TensorDict,
    allocate: Callable[[int], torch.Tensor] | None = None,
) -> TensorDict:
    """Rebuilds the full batch from a folded one, in place of ``batch``'s ``"next"``.

    ``("next", key)`` comes first in ``"next"`` for every folded key, in the
    finals' order, then ``"next"``'s other entries.

    Args:
        batch: The folded ``[N, T]`` batch (as decoded from the wire).
        finals: The ``[K]`` finals.
        allocate: Gives the ``nbytes`` uint8 buffer the rebuilt entries are written
            into (16-byte aligned, contiguous); None allocates a fresh one.

    Returns:
        ``batch``, with its ``"next"`` complete.

    Raises:
        ProtocolError: The two do not fit together (a key missing or present twice,
            shapes, dtypes, or positions out of range, repeated or unordered).
    """
    plan = _plan(batch, finals)
    n, t = batch.batch_size
    offsets, total = [], 0
    for key, _ in plan:
        total += -total % _ALIGN
        offsets.append(total)
        total += batch.get(key).numel() * batch.get(key).element_size()
    storage = torch.empty(total, dtype=torch.uint8) if allocate is None else allocate(total)
    index = finals.get(INDEX)
    rebuilt: dict[Key, torch.Tensor] = {}
    for (key, value), offset in zip(plan, offsets, strict=True):
        now = batch.get(key)
        size = now.numel() * now.element_size()
        out = storage[offset : offset + size].view(now.dtype).view(now.shape)
        out[:, :-1] = now[:, 1:]
        out.view(n * t, *now.shape[2:])[index] = value
        rebuilt[key] = out
    old = batch.get("next")
    nxt = TensorDict({}, batch_size=old.batch_size)
    for key, value in rebuilt.items():
        nxt.set(key, value)
    names = batch.names
    batch.set("next", _merged(nxt, old))
    if any(name is not None for name in names):
        batch.names = names
    return batch


def _merged(rebuilt: TensorDictBase, old: TensorDictBase) -> TensorDict:
    """``rebuilt``'s entries first, then ``old``'s; a sub-tensordict both hold is merged alike.

    The result has ``old``'s batch size at every level, so a nested folded key (say
    ``("agents", "observation")`` under an ``"agents"`` of batch ``[N, T, A]``) lands
    beside its siblings without changing their tensordict's shape.
    """
    out = TensorDict({}, batch_size=old.batch_size)
    for key, value in rebuilt.items():
        sibling = old.get(key, None)
        both = isinstance(value, TensorDictBase) and isinstance(sibling, TensorDictBase)
        out.set(key, _merged(value, sibling) if both else value)
    for key, value in old.items():
        if out.get(key, None) is None:
            out.set(key, value)
    return out


def _plan(batch: TensorDict, finals: TensorDict) -> list[tuple[Key, torch.Tensor]]:
    """Checks that ``finals`` fits ``batch``; returns each folded key and its final values."""
    if batch.batch_dims != 2 or finals.batch_dims != 1:
        raise ProtocolError(
            f"a folded batch is [N, T] with [K] finals, got {list(batch.batch_size)} and "
            f"{list(finals.batch_size)}"
        )
    n, t = batch.batch_size
    if not n or not t:
        raise ProtocolError(f"a folded batch has frames, got {n} x {t}")
    count = finals.batch_size[0]
    nxt = batch.get("next", None)
    if not isinstance(nxt, TensorDictBase) or nxt.batch_size != batch.batch_size:
        raise ProtocolError("a folded batch needs a 'next' tensordict of its batch size")
    index = finals.get(INDEX, None)
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.dim() != 1:
        raise ProtocolError("the finals need an int64 'index' of shape [K]")
    _check_index(index, n, t)
    plan = []
    for key in finals.keys(include_nested=True, leaves_only=True):
        key = _key(key)
        if key == (INDEX,):
            continue
        value, now = finals.get(key), batch.get(key, None)
        if not isinstance(value, torch.Tensor) or not isinstance(now, torch.Tensor):
            raise ProtocolError(f"folded key {list(key)} is not a tensor in the batch")
        if ("next", *key) in batch.keys(include_nested=True):
            raise ProtocolError(f"folded key {list(key)} is also sent under 'next'")
        if value.dtype != now.dtype or value.shape != (count, *now.shape[2:]):
            raise ProtocolError(
                f"folded key {list(key)}: finals {value.dtype} {list(value.shape)} do not fit "
                f"the batch's {now.dtype} {list(now.shape)}"
            )
        plan.append((key, value))
    if not plan:
        raise ProtocolError("the finals fold no key")
    return plan


def _check_index(index: torch.Tensor, n: int, t: int) -> None:
    """Positions strictly ascending in ``[0, n * t)`` and every env's last step among them."""
    count = index.shape[0]
    if count > n * t or count < n:
        raise ProtocolError(f"{count} final positions for a batch of {n} x {t} frames")
    if count and (int(index[0]) < 0 or int(index[-1]) >= n * t):
        raise ProtocolError(f"final positions must lie in [0, {n * t})")
    if count > 1 and not bool((index[1:] > index[:-1]).all()):
        raise ProtocolError("final positions must be strictly ascending")
    last = torch.arange(t - 1, n * t, t, dtype=torch.int64)
    if not bool(torch.isin(last, index).all()):
        raise ProtocolError("the finals must hold every env's last step")
