"""Errors only the learner raises: a push failed or disagreeing, settings refused, missing workers.

Both extend :mod:`common.errors` so ``except RlfleetError`` still catches
everything rlfleet raises on purpose::

    RlfleetError
    ├── WeightPushError                       some targets did not apply a push
    ├── VersionConflictError (ValueError)     learner ranks pushed one version differently
    ├── EndlessCollectorError (TypeError, RuntimeError)
    │                                         len() of a collector with no frame budget
    ├── ProtocolError (ValueError)
    │   └── SettingsRefusedError              an actor refused the session's settings
    └── ActorUnavailableError (ConnectionError)
        └── MissingWorkersError               a sync batch lacks these worker_ids
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.errors import ActorUnavailableError, ProtocolError, RlfleetError

__all__ = [
    "EndlessCollectorError",
    "MissingWorkersError",
    "SettingsRefusedError",
    "VersionConflictError",
    "WeightPushError",
]


class WeightPushError(RlfleetError, RuntimeError):
    """A weight push was rejected by, or could not reach, some of its target workers.

    Workers that applied the push are never hidden: ``succeeded`` holds their
    applied versions, ``failed`` the error each other target raised.

    For a single-model push both mappings are keyed by worker_id; for a
    ``weights_dict`` push they are keyed by model_id, then worker_id.

    Attributes:
        succeeded: ``{worker_id: version}`` (or ``{model_id: {worker_id: version}}``).
        failed: ``{worker_id: exception}`` (or ``{model_id: {worker_id: exception}}``).
    """

    def __init__(
        self, message: str, *, succeeded: Mapping[Any, Any], failed: Mapping[Any, Any]
    ) -> None:
        super().__init__(message)
        self.succeeded = dict(succeeded)
        self.failed = dict(failed)


class VersionConflictError(RlfleetError, ValueError):
    """Learner ranks pushed one policy version with different weights (or other versions).

    Raised on every rank, before anything is sent.

    Attributes:
        pushed: ``{rank: (version, digest)}`` as each rank gave it.
    """

    def __init__(self, message: str, *, pushed: Mapping[int, tuple[int, int]]) -> None:
        super().__init__(message)
        self.pushed = dict(pushed)


class EndlessCollectorError(RlfleetError, TypeError, RuntimeError):
    """``len()`` (or ``bool()``) of a collector with no frame budget (``total_frames=-1``).

    A ``TypeError``, as Python's protocols expect of an object without a length (``tqdm``
    and ``list()`` then go without one), and a ``RuntimeError``, as TorchRL's collectors raise
    ("Non-terminating collectors do not have a length"), so either ``except`` catches it.
    """


class SettingsRefusedError(ProtocolError):
    """An actor answered a session's open with INVALID_ARGUMENT: it cannot collect with them.

    Retrying would ask the same again, so the actor's link stops and the next batch taken
    raises this, naming the actor and its reason (a stop token outside its vocabulary...).
    """


class MissingWorkersError(ActorUnavailableError):
    """A sync batch could not be completed: these workers sent nothing in time.

    Attributes:
        worker_ids: The missing workers, sorted.
    """

    def __init__(self, message: str, *, worker_ids: list[int]) -> None:
        super().__init__(message)
        self.worker_ids = sorted(worker_ids)
