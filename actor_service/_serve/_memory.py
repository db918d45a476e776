"""How the actor process's C allocator keeps memory: freed blocks are kept for the next push.

A push reaches an actor as chunk messages of up to 3 MiB that gRPC hands over as fresh
``bytes``; a relay forwards each. glibc's allocator serves blocks of that size with their own
``mmap`` and gives them back on ``free``, so every push faults its whole size in again, page
by page (24,000 faults per 100 MB; on the 2-core host bed, 10-20% of a relaying actor's CPU
per push). :func:`keep_freed_memory` has glibc serve blocks up to 32 MiB from its heap and
keep up to 1 GiB freed at the heap's top, so the next push reuses pages already faulted in.
The process then holds its peak memory (the blocks of the largest push) instead of returning
it between pushes.

Left alone where the allocator is not glibc's, and where the operator set any of glibc's own
``MALLOC_*_`` tunables (they win).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (glibc's largest allowed threshold on 64-bit).
MMAP_THRESHOLD = 32 << 20
#: Freed memory kept at the heap's top before glibc returns it to the kernel.
TRIM_THRESHOLD = 1 << 30
_OPERATOR_TUNABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
)


def keep_freed_memory() -> bool:
    """Have glibc keep freed blocks for reuse (see the module); whether it was applied."""
    if any(name in os.environ for name in _OPERATOR_TUNABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
