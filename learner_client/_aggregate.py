"""Turning per-actor batches into what the collector yields: tagging, stacking, concatenating.

Every batch gets ``("collector", "worker_id")`` (int64, shaped like
``("collector", "traj_ids")``) and its last dim named ``"time"``. A sync batch
is the per-actor batches in worker_id order, stacked as TorchRL's
``MultiSyncCollector`` does (``[workers, envs, time]``; a lazy stack when the
actors' shapes differ) or concatenated on dim 0 with ``cat_results=0``
(``[workers * envs, time]``). Split trajectories (``[trajs, time]`` per actor)
are zero-padded to the longest and concatenated, since their counts differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensordict
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

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
    if len({tuple(b.batch_size) for b in batches}) == 1:
        out = torch.stack(list(batches), 0)
    else:
        # Actors with different env pool sizes give different [envs, time]
        # shapes; TorchRL's MultiSyncCollector returns a lazy stack then too.
        out = LazyStackedTensorDict.lazy_stack(list(batches), 0)
        return out
    return name_time_dim(out)


def _pad_time(batches: Sequence[TensorDictBase]) -> list[TensorDictBase]:
    longest = max(b.batch_size[-1] for b in batches)
    padded = []
    for batch in batches:
        missing = longest - batch.batch_size[-1]
        padded.append(tensordict.pad(batch, [0, 0, 0, missing]) if missing else batch)
    return padded
