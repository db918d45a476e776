"""CRC-32C, the checksum every chunked transfer carries (batches, weights, actor state).

One function both codecs use (:mod:`common.packets` and :mod:`common.weights`): a CRC-32C
continued across chunks, on the hardware CRC instructions where the CPU has them (~10 GB/s).
"""

from __future__ import annotations

import google_crc32c
import numpy as np

__all__ = ["MAX_CRC32C", "READ_PIECE", "crc32c"]

#: The largest CRC-32C value.
MAX_CRC32C = 0xFFFFFFFF

#: Bytes read from shared memory at a time, each checksummed while still in a core's L2
#: cache (batches: ``BatchAssembler.add_rest``; pushes: ``BlobAssembler.add_rest``).
READ_PIECE = 1 << 19


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data`` continued from ``crc``; SSE4.2 / ARMv8 CRC instructions when present.

    ``google_crc32c`` takes read-only ``bytes`` or an ndarray: a zero-copy uint8 view of
    any buffer is the way in without a copy.
    """
    view = np.frombuffer(data, dtype=np.uint8)
    return int(google_crc32c.extend(crc, view))
