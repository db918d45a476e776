"""The raw bytes of a tensor: what packets, weight blobs and their digests are made of."""

from __future__ import annotations

import torch

__all__ = ["byte_view"]


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of ``tensor``'s elements in row-major order (CPU, strided).

    No copy where the elements are one dense run of memory. A copy where they are not:
    also for tensors torch calls contiguous whose size-1 dimensions have another stride
    (``scalar.expand(1)`` has stride 0), which no byte view can take.
    """
    flat = tensor.reshape(-1)
    if not flat.numel():  # an empty tensor's stride may be anything (0 after an expand)
        return torch.empty(0, dtype=torch.uint8)
    if flat.stride(0) != 1:
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8)
