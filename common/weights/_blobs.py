"""Chunking and reassembly of blobs (weights or actor state) that outgrow one gRPC message.

The sender slices a blob into zero-copy ``memoryview`` chunks of at most
``CHUNK_BYTES``; the receiver announces nothing it has not checked: the size a
peer claims is capped before a byte is allocated, chunks may not overflow it,
missing bytes are an error, and an announced checksum is verified (``DATA_LOSS``
on mismatch): CRC-32C (:func:`crc32c`, hardware instructions, ~10 GB/s) on the
hot path, SHA-256 when the sender wants a cryptographic digest; only the
checksums announced are computed. Re-exported by :mod:`common.weights`, which
is the public home.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator

import torch

from common import checksum
from common.checksum import MAX_CRC32C, crc32c
from common.config import CHUNK_BYTES
from common.errors import DataLossError, SessionStateError, WeightsError, WeightsTooLargeError

__all__ = [
    "DEFAULT_MAX_WEIGHT_BYTES",
    "MAX_CRC32C",
    "CHECKSUMS",
    "BlobAssembler",
    "check_blob_size",
    "check_digests",
    "checksums",
    "crc32c",
    "default_max_weight_bytes",
    "iter_blob_chunks",
    "sha256_hex",
]

#: The largest weight or state blob a receiver accepts unless told otherwise (the floor
#: of :func:`default_max_weight_bytes`).
DEFAULT_MAX_WEIGHT_BYTES: int = 1 << 30
#: How much larger than the model's own bytes a blob may be by default (header, and
#: tied keys a sender did not deduplicate).
MODEL_BYTES_FACTOR = 1.25


def default_max_weight_bytes(model_bytes: int) -> int:
    """The default cap of a push or state blob for a model of ``model_bytes`` bytes.

    ``max(DEFAULT_MAX_WEIGHT_BYTES, 1.25 * model_bytes)``: a 0.5B-parameter model
    (1.9 GB in float32) is accepted, while a tiny one still gets the 1 GiB floor.
    """
    return max(DEFAULT_MAX_WEIGHT_BYTES, int(model_bytes * MODEL_BYTES_FACTOR))


_SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: The checksums a sender may put beside a blob: fast (hardware CRC) or cryptographic.
CHECKSUMS = ("crc32c", "sha256")


def sha256_hex(blob: bytes | bytearray | memoryview) -> str:
    """Return the lowercase hex sha256 of a blob."""
    return hashlib.sha256(blob).hexdigest()


def checksums(blob: bytes | bytearray | memoryview, kind: str) -> tuple[str, int | None]:
    """``(sha256 hex or "", crc32c or None)`` of ``blob``, computing only the ``kind`` asked for.

    Raises:
        ValueError: ``kind`` is not one of :data:`CHECKSUMS`.
    """
    if kind == "crc32c":
        return "", crc32c(blob)
    if kind == "sha256":
        return sha256_hex(blob), None
    raise ValueError(f"checksum must be one of {CHECKSUMS}, got {kind!r}")


def iter_blob_chunks(
    blob: bytes | bytearray | memoryview, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[memoryview]:
    """Split a blob into zero-copy slices of at most ``chunk_bytes`` each.

    An empty blob yields nothing.

    Args:
        blob: The bytes to send.
        chunk_bytes: The largest slice; keeps each message under gRPC's limit.

    Yields:
        Consecutive ``memoryview`` slices of ``blob``.

    Raises:
        ValueError: ``chunk_bytes`` is not a positive int.
    """
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    view = memoryview(blob).cast("B")
    for start in range(0, view.nbytes, chunk_bytes):
        yield view[start : start + chunk_bytes]


def check_blob_size(total_bytes: int, max_bytes: int) -> None:
    """The one rule of an announced blob size: an int in ``[0, max_bytes]``.

    Raises:
        TypeError: ``total_bytes`` is not an int.
        WeightsError: It is negative.
        WeightsTooLargeError: It is over ``max_bytes`` (RESOURCE_EXHAUSTED).
    """
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int):
        raise TypeError(f"total_bytes must be an int, got {type(total_bytes).__name__}")
    if total_bytes < 0:
        raise WeightsError(f"blob size must be non-negative, got {total_bytes}")
    if total_bytes > max_bytes:
        raise WeightsTooLargeError(
            f"blob of {total_bytes} bytes exceeds the cap of {max_bytes} bytes"
        )


def check_digests(sha256: str, crc32c: int | None) -> str:
    """The one rule of announced checksums; returns the sha256 in lowercase ("" for none).

    Raises:
        WeightsError: ``sha256`` is neither empty nor 64 hex digits, or ``crc32c`` is
            neither None nor an int in ``[0, 2**32 - 1]``.
    """
    digest = sha256.lower()
    if digest and not _SHA256_RE.fullmatch(digest):
        raise WeightsError(f"sha256 must be 64 hex digits, got {sha256[:80]!r}")
    if crc32c is not None and (
        isinstance(crc32c, bool) or not isinstance(crc32c, int) or not 0 <= crc32c <= MAX_CRC32C
    ):
        raise WeightsError(f"crc32c must be an int in [0, 2**32 - 1], got {crc32c!r:.80}")
    return digest


class BlobAssembler:
    """Reassembles a chunked blob (weights or state) received from a peer.

    The announced size is checked against the cap before any memory is
    allocated; chunks are copied into one preallocated, uninitialised buffer.

    Args:
        total_bytes: The blob size the peer announced.
        max_bytes: The largest size accepted.
        sha256: The hex digest the peer announced; empty to skip the check.
        crc32c: The CRC-32C the peer announced; None to skip the check.
        buffer: A ``uint8`` tensor of at least ``total_bytes`` to assemble into (reused
            across blobs, so no fresh pages are faulted in); None allocates one.

    Raises:
        WeightsTooLargeError: ``total_bytes`` is over ``max_bytes``.
        WeightsError: ``total_bytes`` is negative, ``sha256`` is not a hex digest or
            ``crc32c`` not a 32-bit unsigned int.

    Example::

        assembler = BlobAssembler(request.total_bytes, sha256=request.sha256)
        for chunk in chunks:
            assembler.add(chunk)
        state, meta = decode_weights(assembler.finish())
    """

    def __init__(
        self,
        total_bytes: int,
        *,
        max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
        sha256: str = "",
        crc32c: int | None = None,
        buffer: torch.Tensor | None = None,
    ) -> None:
        check_blob_size(total_bytes, max_bytes)
        digest = check_digests(sha256, crc32c)
        self._total = total_bytes
        self._expected_sha = digest
        # torch.empty, unlike bytearray, does not zero-fill: every byte is
        # written by add() before finish() lets anyone read it.
        if buffer is not None and buffer.dtype == torch.uint8 and buffer.numel() >= total_bytes:
            self._buffer = buffer[:total_bytes]
        else:
            self._buffer = torch.empty(total_bytes, dtype=torch.uint8)
        self._view = self._buffer.numpy().data.cast("B")
        self._received = 0
        self._expected_crc = crc32c
        self._crc = 0
        self._hasher = hashlib.sha256() if digest else None
        self._result: memoryview | None = None

    @property
    def received(self) -> int:
        """Bytes added so far."""
        return self._received

    @property
    def total_bytes(self) -> int:
        """The blob size announced by the peer."""
        return self._total

    @property
    def buffer(self) -> torch.Tensor:
        """The ``uint8`` tensor the blob is assembled into (complete only after :meth:`finish`)."""
        return self._buffer

    def add(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append the next chunk.

        Raises:
            WeightsError: The chunk would overflow the announced size.
            SessionStateError: The blob was already finished.
        """
        if self._result is not None:
            raise SessionStateError("blob already finished; no more chunks accepted")
        view = memoryview(chunk).cast("B")
        end = self._received + view.nbytes
        if end > self._total:
            raise WeightsError(
                f"chunk of {view.nbytes} bytes at offset {self._received} overflows "
                f"the announced {self._total}-byte blob"
            )
        self._view[self._received : end] = view
        self._count(end)

    def add_rest(self, read_at: Callable[[memoryview, int], None]) -> None:
        """Let ``read_at(into, offset)`` write the rest of the blob straight into the buffer.

        ``offset`` counts from the blob's first byte; ``read_at`` must fill all of ``into``
        (or raise). It is called for pieces of at most :data:`~common.checksum.READ_PIECE`
        bytes, each digested as :meth:`add` digests a chunk's, while still in the CPU's cache.

        Raises:
            SessionStateError: The blob was already finished.
        """
        if self._result is not None:
            raise SessionStateError("blob already finished; no more chunks accepted")
        while self._received < self._total:
            end = min(self._received + checksum.READ_PIECE, self._total)
            read_at(self._view[self._received : end], self._received)
            self._count(end)

    def _count(self, end: int) -> None:
        """Digest the buffer's bytes from the last chunk's end to ``end``, now received."""
        view = self._view[self._received : end]
        if self._hasher is not None:
            self._hasher.update(view)
        if self._expected_crc is not None and view.nbytes:
            self._crc = crc32c(view, self._crc)
        self._received = end

    def finish(self) -> bytes | memoryview:
        """Return the whole blob (a writable ``memoryview`` over :attr:`buffer`; idempotent).

        :func:`~common.weights.decode_weights` returns tensors viewing this
        memory instead of copying it.

        Raises:
            WeightsError: Fewer bytes arrived than announced.
            DataLossError: A checksum announced does not match the bytes.
        """
        if self._result is not None:
            return self._result
        if self._received != self._total:
            raise WeightsError(f"blob incomplete: received {self._received} of {self._total} bytes")
        if self._expected_crc is not None and self._crc != self._expected_crc:
            raise DataLossError(
                f"blob crc32c mismatch: expected {self._expected_crc:#010x}, got {self._crc:#010x}"
            )
        actual = self._hasher.hexdigest() if self._hasher is not None else ""
        if self._expected_sha and actual != self._expected_sha:
            raise DataLossError(
                f"blob sha256 mismatch: expected {self._expected_sha}, got {actual}"
            )
        self._result = self._view
        return self._result
