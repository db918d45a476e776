"""One actor's state as a learner reads it: the GetState blob of one worker, decoded.

:func:`actor_state_of` picks ``worker_id``'s blob out of
``GrpcCollector.state_dict()["workers"]`` and decodes it (:mod:`common.actor_state`,
as strict as a weight push: no pickle, finite values). What it holds: ``models``
(``{model_id: {"version", "weights"}}``), the counters (``frames``, ``batches``,
``traj_counter``) and, on a TorchRL-env actor, ``env``: its env's ``state_dict()``
(``VecNorm``'s running statistics, ``ObservationNorm``'s ``loc``/``scale``...), nested
by the env's own module names (``worker0`` for the first env of a pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from common.actor_state import decode_state
from common.errors import UnknownWorkerError

__all__ = ["actor_state_of"]


def actor_state_of(workers: Mapping[int, torch.Tensor], worker_id: int) -> dict[str, Any]:
    """The decoded state of ``worker_id`` among ``workers`` (``state_dict()["workers"]``).

    Raises:
        UnknownWorkerError: ``worker_id`` is not in ``workers``.
        WeightsError: The blob is not a well-formed actor-state file.
    """
    if worker_id not in workers:
        raise UnknownWorkerError(f"worker_id {worker_id!r} is not in the fleet {sorted(workers)}")
    return decode_state(workers[worker_id].numpy().tobytes())
