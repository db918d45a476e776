"""What a training script imports: :class:`GrpcCollector`, :class:`LocalFleet` and the errors.

``GrpcCollector`` speaks TorchRL's collector API (``RayCollector`` /
``MultiSyncCollector`` knobs, ``update_policy_weights_``, ``start``/``pause``,
``state_dict``, ``set_seed``) over a fleet of rlfleet actors reached by gRPC::

    from learner_client import GrpcCollector

    with GrpcCollector(["127.0.0.1:50051"], frames_per_batch=256, total_frames=10_000) as c:
        for batch in c:
            ...

:class:`LocalFleet` starts a fleet of actor subprocesses on loopback for a
single-machine run; :class:`RayFleet` places one on a Ray cluster (the ``rlfleet[ray]``
extra); :func:`serve_metrics` exposes a collector's Prometheus metrics over HTTP
(see ``docs/observability.md``); :func:`resolve_actors` expands a ``dns:`` name into the
fleet's addresses; :class:`ActorDescription` decodes what an actor's ``Describe`` reports
(``rlfleet status`` prints it). Everything else in this package is private (modules start
with ``_``). Programs built on the library (the reference learners, the ``rlfleet`` command)
live in ``apps``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from learner_client._collector import GrpcCollector
    from learner_client._description import ActorDescription
    from learner_client._discovery import resolve_actors
    from learner_client._errors import (
        EndlessCollectorError,
        MissingWorkersError,
        SettingsRefusedError,
        VersionConflictError,
        WeightPushError,
    )
    from learner_client._fleet import RemoteActor
    from learner_client._given_fleet import ActorFleet
    from learner_client._llm_collector import GrpcLLMCollector
    from learner_client._local_fleet import LocalFleet
    from learner_client._metrics import check_metrics_port, serve_metrics
    from learner_client._pushes import PartResult
    from learner_client._ray_fleet import RayFleet
    from learner_client._settings import WeightPushSettings

__all__ = [
    "ActorDescription",
    "ActorFleet",
    "EndlessCollectorError",
    "GrpcCollector",
    "GrpcLLMCollector",
    "LocalFleet",
    "MissingWorkersError",
    "PartResult",
    "RayFleet",
    "RemoteActor",
    "SettingsRefusedError",
    "VersionConflictError",
    "WeightPushError",
    "WeightPushSettings",
    "check_metrics_port",
    "resolve_actors",
    "serve_metrics",
]

# Each public name's module, imported on first use (PEP 562): a program that needs only
# ``resolve_actors`` and ``ActorDescription`` (``rlfleet status``) does not import torch.
_HOMES = {
    "ActorDescription": "_description",
    "ActorFleet": "_given_fleet",
    "EndlessCollectorError": "_errors",
    "GrpcCollector": "_collector",
    "GrpcLLMCollector": "_llm_collector",
    "LocalFleet": "_local_fleet",
    "MissingWorkersError": "_errors",
    "PartResult": "_pushes",
    "RayFleet": "_ray_fleet",
    "RemoteActor": "_fleet",
    "SettingsRefusedError": "_errors",
    "VersionConflictError": "_errors",
    "WeightPushError": "_errors",
    "WeightPushSettings": "_settings",
    "check_metrics_port": "_metrics",
    "resolve_actors": "_discovery",
    "serve_metrics": "_metrics",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'learner_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"learner_client.{home}"), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
