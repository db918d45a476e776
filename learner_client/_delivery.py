"""Where the learner delivers batches: on the host as received, or on a device.

TorchRL's ``device`` / ``storing_device``: a batch is yielded (and stored in a
replay buffer) on ``storing_device``, or on ``device`` when only that is given.
On a fleet these name the learner's side alone: the actors keep the device
they were started with (``--device``), and ``policy_device`` / ``env_device``
are what a session asks of them.

On CUDA the packets are received into pinned slabs
(:class:`~learner_client._slabs.PacketSlabs` with ``pin_memory``) and every
batch goes to the device in one ``non_blocking`` copy per tensor, enqueued on
the calling thread's current stream: kernels the user launches on that stream
afterwards see the data, and nothing on the host waits for the copy. The host
batch is kept until the copy is done (a CUDA event is recorded after it):
a slab is reused only once no tensor views it, so its memory is never
overwritten while a copy still reads it.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from tensordict import TensorDictBase

from common.config import local_device

__all__ = ["Placement"]


class Placement:
    """Moves each delivered batch to the learner's storing device.

    Args:
        device: TorchRL's ``device``: the storing device when ``storing_device`` is None.
        storing_device: Where batches are delivered; None and ``device`` None: as received
            (on the host).

    Raises:
        ValueError: Not a device, or a CUDA device this process does not have.
    """

    def __init__(self, device: Any = None, storing_device: Any = None) -> None:
        chosen, name = (
            (device, "device") if storing_device is None else (storing_device, "storing_device")
        )
        self.device = None if chosen is None else local_device(chosen, name)
        self._in_flight: collections.deque[tuple[Any, TensorDictBase]] = collections.deque()

    @property
    def pin_memory(self) -> bool:
        """Whether received packets should land in pinned host memory (a CUDA target)."""
        return self.device is not None and self.device.type == "cuda"

    def place(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the storing device (itself when that is the host or None)."""
        device = self.device
        if device is None or device.type == "cpu":
            return batch
        if device.type != "cuda":
            return batch.to(device)
        stream = torch.cuda.current_stream(device)
        placed = batch.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        self._forget_finished()
        self._in_flight.append((done, batch))
        return placed

    def _forget_finished(self) -> None:
        """Let go of host batches whose copies are done (their slabs become reusable)."""
        while self._in_flight and self._in_flight[0][0].query():
            self._in_flight.popleft()

    def __repr__(self) -> str:
        return f"Placement(device={self.device})"
