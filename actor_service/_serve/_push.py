"""One weight push as the actor serves it: its header fields, its audit-log line and its metrics.

Every push, whole or one part of a multi-part version, is audit-logged once as the
``weights.push`` event (peer, model_id, version, sha256, crc32c, base_version, part,
bytes, pause, outcome, result) and counted in the actor's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from actor_service._serve._logging import log_event
from common.config import DEFAULT_MODEL_ID
from common.errors import to_status
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import Part, PushOutcome

if TYPE_CHECKING:
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["PushCall"]


class PushCall:
    """One weight push: its header fields, its audit-log line and its metrics.

    Args:
        header: The push's header as received (its part is checked by :meth:`read_part`).
        peer: Who pushed.
        metrics: Where to count it; None counts nothing.
    """

    def __init__(self, header: pb.WeightsHeader, peer: str, metrics: ActorMetrics | None) -> None:
        self.model_id = header.model_id or DEFAULT_MODEL_ID
        self.version = int(header.version)
        self.total_bytes = int(header.total_bytes)
        self.sha256 = header.sha256
        self.crc32c = header.crc32c if header.HasField("crc32c") else None
        self.base_version = header.base_version if header.HasField("base_version") else None
        self._part_fields = (
            (int(header.part.index), int(header.part.count)) if header.HasField("part") else None
        )
        self.part: Part | None = None  # set by read_part once checked
        self.outcome = PushOutcome.APPLIED
        self.peer = peer
        self._metrics = metrics
        self._started = time.monotonic()
        self.pause = 0.0
        self.buffer: torch.Tensor | None = None  # lent by ReceiveBuffers while in use
        self.fresh = False  # the buffer was allocated for this push, not lent

    @property
    def is_part(self) -> bool:
        """Whether the header names a part of a multi-part push."""
        return self._part_fields is not None

    def read_part(self) -> None:
        """Check the header's part (``common.weights.Part``: WeightsError when out of range)."""
        if self._part_fields is not None:
            self.part = Part(*self._part_fields)

    def audit(self, exc: BaseException | None) -> None:
        """Log who pushed what and the result (OK, CANCELLED or the status code); count it."""
        if exc is None:
            result = "OK"
        elif isinstance(exc, asyncio.CancelledError):
            result = "CANCELLED"
        else:
            result = to_status(exc)[0].name
        if self._metrics is not None:
            model = self._metrics.model_label(self.model_id)
            self._metrics.weight_pushes.labels(model, result).inc()
            if exc is None:
                self._metrics.weight_push_bytes.labels(model).inc(self.total_bytes)
                self._metrics.weight_push_seconds.labels(model).observe(
                    time.monotonic() - self._started
                )
                self._metrics.weight_push_pause_seconds.labels(model).observe(self.pause)
        fields: dict[str, Any] = {}
        if self._part_fields is not None:
            fields = {"part": "{}/{}".format(*self._part_fields), "outcome": self.outcome.name}
        log_event(
            "weights.push",
            logging.INFO if exc is None else logging.WARNING,
            peer=self.peer,
            model_id=self.model_id,
            version=self.version,
            sha256=self.sha256,
            crc32c=self.crc32c,
            base_version=self.base_version,
            bytes=self.total_bytes,
            pause_seconds=round(self.pause, 6),
            result=result,
            **fields,
        )
