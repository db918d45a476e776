"""One env step's way to the policy's device and back, with one synchronisation.

On the CPU nothing is copied: the policy reads the batch buffers' views and its
outputs are written into the batch by the rollout. On CUDA the whole env pool's
observations are copied into a page-locked buffer and go to the device in one
``non_blocking`` copy; the action and every extra output come back through
``non_blocking`` copies into page-locked buffers, and one event synchronisation
waits for all of them (the rollout needs the action on the host to step the
envs). The batch buffers stay on the host: what the policy returns is checked
and recorded there.

Per step on CUDA: one host→device copy of ``num_envs`` observations, one
device→host copy per output key, one synchronisation; no per-env or per-key
waits.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["DeviceStage"]


class DeviceStage:
    """Moves a step's observations to ``device`` and the policy's outputs back.

    Args:
        device: The models' device.

    Example::

        stage = DeviceStage(torch.device("cuda"))
        action, extras = policy(stage.to_device(observation))
        action, extras = stage.to_host(action, extras)   # one synchronisation
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.staged = device.type == "cuda"
        self._pinned: dict[object, torch.Tensor] = {}
        self._done = torch.cuda.Event() if self.staged else None

    def _buffer(self, key: object, like: torch.Tensor) -> torch.Tensor:
        """A page-locked host buffer shaped like ``like`` (kept and reused per key)."""
        buffer = self._pinned.get(key)
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            buffer = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
            self._pinned[key] = buffer
        return buffer

    def to_device(self, observation: torch.Tensor) -> torch.Tensor:
        """``observation`` on the device (through page-locked memory on CUDA)."""
        if observation.device == self.device:
            return observation
        if not self.staged:
            return observation.to(self.device)
        pinned = self._buffer(("in",), observation)
        pinned.copy_(observation)
        return pinned.to(self.device, non_blocking=True)

    def to_host(
        self, action: torch.Tensor, extras: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The action and extras on the host; on CUDA after one synchronisation.

        The tensors returned on CUDA are this stage's buffers: valid until the next
        call (the rollout copies them into the batch at once).
        """
        if not self.staged:
            return action.cpu(), {k: v.cpu() for k, v in extras.items()}
        assert self._done is not None
        host_action = self._buffer(("out", "action"), action)
        host_action.copy_(action, non_blocking=True)
        host = {}
        for key, value in extras.items():
            host[key] = self._buffer(("out", key), value)
            host[key].copy_(value, non_blocking=True)
        self._done.record()
        self._done.synchronize()
        return host_action, host
