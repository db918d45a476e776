"""Where an LLM decode loop runs: dtypes by device, one staged copy in, a lagged stop check.

The decode loop (:func:`common.llm.generate`) keeps all its state on the model's
device. This module holds what that takes:

* :func:`model_dtype` — the dtype a model is held in: the one asked for, else
  ``bfloat16`` on CUDA (half the memory and bandwidth of weights and KV cache) and
  ``float32`` everywhere else;
* :func:`to_device` — host tensors onto the device in one copy each, from pinned
  memory and ``non_blocking`` on CUDA, so the host is not held while they travel;
* :class:`AllFinished` — whether every row of a batch finished. On the CPU it reads
  the answer at once (free); on CUDA reading it at once would wait for the GPU
  every token, so the answer is copied into pinned host memory without blocking and
  read one step later, when the GPU has long produced it while the next forward was
  already queued. The loop then runs at most one step more than needed (its tokens
  are masked out; it draws from the generator, so the random stream of a lagged
  loop differs from an unlagged one — each is reproducible).
"""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "AllFinished", "default_dtype", "model_dtype", "to_device"]

#: The dtypes a language model may be held in, by name (the ``dtype`` model kwarg).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_dtype(device: torch.device | str) -> str:
    """``"bfloat16"`` on CUDA, ``"float32"`` on every other device."""
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def model_dtype(name: object, device: torch.device | str) -> torch.dtype:
    """The dtype named ``name`` (None: :func:`default_dtype` of ``device``).

    Raises:
        ValueError: ``name`` is not one of :data:`DTYPES`.
    """
    if name is None:
        name = default_dtype(device)
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``: one copy, pinned and non-blocking on CUDA."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class AllFinished:
    """Whether every row finished, asked once per decode step (see the module docstring).

    Args:
        device: Where the loop's ``active`` mask lives.
        lag: Steps between a mask and the answer about it: 0 reads it at once, 1 reads
            the previous step's. None: 1 on CUDA, 0 elsewhere.
    """

    def __init__(self, device: torch.device, lag: int | None = None) -> None:
        self.lag = (1 if device.type == "cuda" else 0) if lag is None else lag
        if self.lag not in (0, 1):
            raise ValueError(f"lag must be 0 or 1, got {lag}")
        self._cuda = device.type == "cuda"
        self._flags = torch.zeros(2, dtype=torch.bool, pin_memory=self._cuda)
        # torch.cuda.Event is untyped.
        self._events = [torch.cuda.Event(), torch.cuda.Event()] if self._cuda else []  # type: ignore[no-untyped-call]
        self._step = 0

    def __call__(self, active: torch.Tensor) -> bool:
        """Record whether any row of ``active`` is on; True once none was (``lag`` steps ago)."""
        if self.lag == 0:
            return not bool(active.any())
        slot = self._step % 2
        self._flags[slot].copy_(active.any(), non_blocking=self._cuda)
        if self._cuda:
            self._events[slot].record()
        self._step += 1
        if self._step < 2:
            return False
        previous = 1 - slot
        if self._cuda:
            self._events[previous].synchronize()
        return not bool(self._flags[previous])
