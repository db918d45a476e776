"""``GrpcCollector.stats()``: TorchRL's flat snapshot of scalars, in three views.

TorchRL documents ``stats()`` as a cheap, serialisable mapping of scalars that
its ``LoggerMonitor`` logs as is (``BaseCollector.stats``), with a ``workers``
argument choosing the aggregate or per-worker view (``MultiCollector.stats``)
and a ``timeout`` (``RayCollector.stats``). Here every value is read on the
learner, so no view ever waits on an actor. The keys of each view are listed in
``docs/collector.md``; they count the actors this learner rank owns (see
:mod:`learner_client._members`), and the aggregate view names the rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from learner_client._fleet import Fleet
from learner_client._ledger import Counts
from learner_client._settings import BatchSettings, positive_timeout

__all__ = ["VIEWS", "fleet_stats", "liveness", "snapshot", "worker_stats"]

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
    counts = fleet.ledger.counts()  # one read for both views: they agree while batches land
    if workers in ("aggregate", "both"):
        out.update(fleet_stats(fleet, acting_model, counts))
        out["requested_frames_per_batch"] = batch.frames_per_batch
        out["missing_workers"] = len(missing)
        out["background_failed"] = background_failed
        if not batch.endless:
            out["total_frames"] = int(batch.total_frames or 0)
            out["completed"] = completed
    out.update(liveness(fleet))
    out.update(counts.extra)  # an LLM collection's yielded_turns and tokens, every view
    if workers in ("per_worker", "both"):
        out.update(worker_stats(fleet, acting_model, counts))
        out.update({f"worker_{w}/missing": w in missing for w in fleet.worker_ids})
    return out


def fleet_stats(fleet: Fleet, acting_model: str, counts: Counts) -> dict[str, Scalar]:
    """The fleet's counters as flat scalars (the aggregate view, less the batch settings)."""
    ledger, links = fleet.ledger, fleet.owned_links()
    versions = fleet.book.versions()
    out: dict[str, Scalar] = {
        "rank": fleet.ranks.rank,
        "world_size": fleet.ranks.world_size,
        "members": len(fleet.member_ids),
        "frames": counts.frames,
        "batches": counts.batches,
        "worker_frames": sum(counts.worker_frames.values()),
        "policy_version": versions.get(acting_model, 0),
        "policy_lag": ledger.policy_lag,
        "policy_lag_max": ledger.policy_lag_max,
        "gaps": sum(link.tracker.gaps for link in links.values()),
        "duplicates": sum(link.tracker.duplicates for link in links.values()),
        "reconnects": sum(ledger.reconnects.values()),
        "failures": sum(ledger.failures.values()),
        "restarts": sum(ledger.restarts.values()),
        "lost_in_progress": ledger.lost_in_progress,
        "discarded": ledger.discarded,
        "auto_pushes": ledger.auto_pushes,
        **ledger.push_stats(),
        **fleet.shm.stats(),
        **fleet.relay.stats(),
        **fleet.stripes.stats(),
        "queued_batches": sum(slot.buffered for slot in fleet.mailbox.snapshot().values()),
    }
    out.update({f"policy_version/{mid}": v for mid, v in sorted(versions.items())})
    return out


def liveness(fleet: Fleet) -> dict[str, int]:
    """``workers`` and ``workers_alive`` (owned actors), which every view reports."""
    owned = fleet.worker_ids
    return {"workers": len(owned), "workers_alive": sum(map(fleet.reachable, owned))}


def worker_stats(fleet: Fleet, acting_model: str, counts: Counts) -> dict[str, Scalar]:
    """Each owned actor's counters as ``worker_<id>/<metric>`` scalars."""
    ledger = fleet.ledger
    out: dict[str, Scalar] = {}
    for wid, link in fleet.owned_links().items():
        prefix = f"worker_{wid}/"
        out[prefix + "frames"] = counts.worker_frames.get(wid, 0)
        out[prefix + "batches"] = counts.worker_batches.get(wid, 0)
        out[prefix + "alive"] = fleet.reachable(wid)
        out[prefix + "failures"] = ledger.failures.get(wid, 0)
        out[prefix + "reconnects"] = ledger.reconnects.get(wid, 0)
        out[prefix + "gaps"] = link.tracker.gaps
        out[prefix + "duplicates"] = link.tracker.duplicates
        out[prefix + "policy_version"] = fleet.book.applied(wid).get(acting_model, 0)
    return out
