"""Turning per-actor batches into what the collector yields: tagging, stacking, concatenating.

The layout follows TorchRL's ``MultiSyncCollector`` (``docs/collector.md``, sync and async
batches): ``("collector", "worker_id")`` on every batch, the last dim named ``"time"``, sync
batches stacked in worker_id order (a lazy stack when the actors' shapes differ),
concatenated with ``cat_results=0``, or zero-padded trajectories with ``split_trajs``. A
stacked entry whose per-actor tensors were received into one slab
(:mod:`learner_client._slabs`) is a strided view of it rather than a copy, so it is not
contiguous (``view`` across dim 0 needs ``.contiguous()`` first).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensordict
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

__all__ = ["WORKER_ID_KEY", "combine", "name_time_dim", "tag_worker"]

WORKER_ID_KEY = ("collector", "worker_id")
_TRAJ_IDS_KEY = ("collector", "traj_ids")


def name_time_dim(batch: TensorDictBase) -> TensorDictBase:
    """Name the last batch dim ``"time"`` (and the others None), in place."""
    ndim = batch.batch_dims
    if ndim and batch.names != [None] * (ndim - 1) + ["time"]:
        batch.names = [None] * (ndim - 1) + ["time"]
    return batch


def tag_worker(batch: TensorDictBase, worker_id: int) -> TensorDictBase:
    """Add ``("collector", "worker_id")`` filled with ``worker_id``, in place.

    The entry has the shape of ``("collector", "traj_ids")`` when present, else
    the batch shape, so the two index the same frames.
    """
    traj_ids = batch.get(_TRAJ_IDS_KEY, None)
    shape = traj_ids.shape if traj_ids is not None else batch.batch_size
    batch.set(WORKER_ID_KEY, torch.full(shape, worker_id, dtype=torch.int64))
    return batch


def combine(
    batches: Sequence[TensorDictBase], *, cat_results: str | int, split_trajs: bool
) -> TensorDictBase:
    """Assemble one sync batch from per-actor batches (already in worker_id order).

    Args:
        batches: One tagged batch per actor.
        cat_results: ``"stack"`` or ``0``.
        split_trajs: The batches are split trajectories ``[trajs, time]``.

    Returns:
        The stacked or concatenated batch, last dim named ``"time"``.

    Raises:
        ValueError: No batches.
    """
    if not batches:
        raise ValueError("cannot combine zero batches")
    if split_trajs:
        return name_time_dim(torch.cat(_pad_time(batches), 0))
    if cat_results == 0:
        return name_time_dim(torch.cat(list(batches), 0))
    if len({tuple(b.batch_size) for b in batches}) > 1:
        # Actors with different env pool sizes give different [envs, time]
        # shapes; TorchRL's MultiSyncCollector returns a lazy stack then too.
        return LazyStackedTensorDict.lazy_stack(list(batches), 0)
    out = _stack_views(batches)
    return name_time_dim(torch.stack(list(batches), 0) if out is None else out)


def _stack_views(batches: Sequence[TensorDictBase]) -> TensorDictBase | None:
    """``torch.stack(batches, 0)`` that views, rather than copies, the entries that allow it.

    An entry whose per-batch tensors lie in one storage at a constant distance
    (frames received into one slab, see :mod:`learner_client._slabs`) becomes one
    strided view; other entries are stacked (copied). Returns None when the
    structure is not plain tensors in plain tensordicts with identical keys, for
    ``torch.stack`` to handle (and report) instead.
    """
    first = batches[0]
    keys = set(first.keys())
    if any(type(b) is not TensorDict or set(b.keys()) != keys for b in batches):
        return None
    out = {}
    for key in first.keys():  # noqa: SIM118 (iterating a tensordict walks dim 0, not keys)
        values = [b.get(key) for b in batches]
        if all(type(v) is torch.Tensor for v in values):
            out[key] = _view_stack(values)
        elif all(type(v) is TensorDict for v in values):
            sub = _stack_views(values)
            if sub is None:
                return None
            out[key] = sub
        else:
            return None
    return TensorDict(out, batch_size=[len(batches), *first.batch_size])


def _view_stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    if len(tensors) > 1 and first.numel():
        step = tensors[1].data_ptr() - first.data_ptr()
        storage = first.untyped_storage().data_ptr()
        # The views must not overlap: each batch's tensor ends before the next starts.
        span = first.element_size() * (
            1 + sum((n - 1) * st for n, st in zip(first.shape, first.stride(), strict=True))
        )
        if (
            step >= span
            and step % first.element_size() == 0
            and all(
                t.dtype == first.dtype
                and t.shape == first.shape
                and t.stride() == first.stride()
                and t.untyped_storage().data_ptr() == storage
                and t.data_ptr() - first.data_ptr() == i * step
                for i, t in enumerate(tensors)
            )
        ):
            stride = (step // first.element_size(), *first.stride())
            return first.as_strided((len(tensors), *first.shape), stride)
    return torch.stack(tensors, 0)


def _pad_time(batches: Sequence[TensorDictBase]) -> list[TensorDictBase]:
    longest = max(b.batch_size[-1] for b in batches)
    padded = []
    for batch in batches:
        missing = longest - batch.batch_size[-1]
        padded.append(tensordict.pad(batch, [0, 0, 0, missing]) if missing else batch)
    return padded
