"""Page-locked host buffers that pushes of a model on an accelerator are written into.

A push of a CUDA module is encoded straight into one host buffer: each tensor is
copied from the device once, into its place in the blob, which then goes on the
wire as it is (``common.weights.encode_weights``'s ``allocate``). Page-locked
memory makes those copies fast and asynchronous, but it is slow to allocate, so
each model keeps its buffers: a buffer is reused once nothing views it any more
(the push that sent it is done and its blob was let go, as packet slabs are
reused in :mod:`learner_client._slabs`). A model's last push is kept for re-sends,
so two buffers per model are in use at most.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from learner_client._slabs import storage_users

__all__ = ["BlobBuffers"]

_KEPT_PER_MODEL = 2


class BlobBuffers:
    """Reusable page-locked blob buffers, per model_id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, list[tuple[torch.Tensor, int | None]]] = {}

    def for_model(self, model_id: str) -> Callable[[int], torch.Tensor]:
        """The ``allocate`` of ``model_id``'s pushes: a buffer of at least the size asked."""
        return lambda nbytes: self.take(model_id, nbytes)

    def take(self, model_id: str, nbytes: int) -> torch.Tensor:
        """An idle buffer of ``model_id`` holding ``nbytes``, else a new one (kept for reuse)."""
        with self._lock:
            kept = self._kept.setdefault(model_id, [])
            for buffer, own in kept:
                if buffer.numel() >= nbytes and own is not None and storage_users(buffer) == own:
                    return buffer
            pinned = torch.cuda.is_available()
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
            kept.append((buffer, storage_users(buffer)))
            del kept[:-_KEPT_PER_MODEL]
            return buffer
