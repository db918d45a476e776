"""``GrpcCollector.stats()``: TorchRL's flat snapshot of scalars, in three views.

TorchRL documents ``stats()`` as a cheap, serialisable mapping of scalars that
its ``LoggerMonitor`` logs as is (``BaseCollector.stats``), with a ``workers``
argument choosing the aggregate or per-worker view (``MultiCollector.stats``)
and a ``timeout`` (``RayCollector.stats``). Here every value is read on the
learner, so no view ever waits on an actor. The keys of each view are listed in
``docs/collector.md`` (the fleet's counters come from :meth:`Fleet.stats
<learner_client._fleet.Fleet.stats>` and :meth:`~learner_client._fleet.Fleet.worker_stats`).
"""

from __future__ import annotations

from collections.abc import Sequence

from learner_client._fleet import Fleet
from learner_client._settings import BatchSettings, positive_timeout

__all__ = ["VIEWS", "snapshot"]

#: The ``workers`` views ``stats()`` accepts, as TorchRL names them.
VIEWS = ("aggregate", "per_worker", "both")

Scalar = int | float | bool


def snapshot(
    workers: str,
    timeout: float | None,
    *,
    fleet: Fleet,
    batch: BatchSettings,
    acting_model: str,
    missing: Sequence[int],
    background_failed: bool,
    completed: bool,
) -> dict[str, Scalar]:
    """The ``stats()`` mapping of one view (see the module docstring).

    Raises:
        ValueError: An unknown view, or a ``timeout`` that is neither None nor seconds > 0.
    """
    if workers not in VIEWS:
        raise ValueError(f"workers must be one of {', '.join(map(repr, VIEWS))}, got {workers!r}")
    if timeout is not None:
        positive_timeout("timeout", timeout)
    out: dict[str, Scalar] = {}
    if workers in ("aggregate", "both"):
        out.update(fleet.stats(acting_model))
        out["requested_frames_per_batch"] = batch.frames_per_batch
        out["missing_workers"] = len(missing)
        out["background_failed"] = background_failed
        if not batch.endless:
            out["total_frames"] = int(batch.total_frames or 0)
            out["completed"] = completed
    out.update(fleet.liveness())
    if workers in ("per_worker", "both"):
        out.update(fleet.worker_stats(acting_model))
        out.update({f"worker_{w}/missing": w in missing for w in fleet.worker_ids})
    return out
