"""Receiving one batch from its chunks: one packet, or a folded batch's two, checksummed whole.

A batch's chunks carry ``total_bytes`` of data: the batch's packet, followed,
when the batch is folded (:mod:`common.packets.folding`), by its finals packet of
``finals_bytes``. :class:`BatchAssembler` copies each chunk once, into the
packet it belongs to (the batch packet into the buffer ``allocate`` gives, so
sync rounds line up in slabs), folds every byte into one CRC-32C as it
arrives, and on :meth:`~BatchAssembler.finish` checks the CRC, decodes both
packets strictly and rebuilds the full batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict

from common import checksum
from common.checksum import crc32c
from common.errors import DataLossError, ProtocolError, SessionStateError
from common.packets import DEFAULT_LIMITS, PacketAssembler, PacketLimits
from common.packets.folding import unfold

__all__ = ["BatchAssembler"]


class BatchAssembler:
    """Reassembles a batch (plain or folded) from its chunks, each copied once.

    Example::

        assembler = BatchAssembler(info.total_bytes, finals_bytes=info.fold.finals_bytes)
        for data in chunks:
            assembler.add(data)
        batch = assembler.finish(expected_crc32c=info.crc32c)

    Args:
        total_bytes: Bytes announced for the batch (both packets when folded).
        finals_bytes: Length of the finals packet at the end; 0 for a plain batch.
        limits: The caps each packet is decoded under.
        allocate: Gives the batch packet's buffer and the rebuilt ``"next"`` entries'
            (see :class:`~common.packets.PacketAssembler`); None allocates fresh ones.

    Raises:
        ProtocolError: The sizes are not ints, or ``finals_bytes`` does not leave room
            for a batch packet.
        PacketTooLargeError: A packet exceeds ``limits.max_packet_bytes``.
    """

    def __init__(
        self,
        total_bytes: int,
        *,
        finals_bytes: int = 0,
        limits: PacketLimits = DEFAULT_LIMITS,
        allocate: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        for name, value in (("total_bytes", total_bytes), ("finals_bytes", finals_bytes)):
            if type(value) is not int or value < 0:
                raise ProtocolError(f"{name} must be a non-negative int, got {value!r:.60}")
        if finals_bytes > total_bytes:
            raise ProtocolError(f"finals_bytes={finals_bytes} exceeds total_bytes={total_bytes}")
        self.total_bytes = total_bytes
        self._allocate = allocate
        self._parts = [
            PacketAssembler(total_bytes - finals_bytes, limits, allocate, checksum=False)
        ]
        if finals_bytes:
            self._parts.append(PacketAssembler(finals_bytes, limits, checksum=False))
        self._boundary = total_bytes - finals_bytes
        self._received = 0
        self._crc = 0
        self._done = False

    @property
    def received(self) -> int:
        """Bytes received so far."""
        return self._received

    def add(self, chunk: bytes | bytearray | memoryview) -> None:
        """Copies the next chunk into the packet(s) it belongs to.

        Raises:
            ProtocolError: The chunk would take the batch past its announced length.
            SessionStateError: :meth:`finish` was already called.
        """
        if self._done:
            raise SessionStateError("BatchAssembler.add called after finish()")
        piece = memoryview(chunk).cast("B")
        end = self._received + piece.nbytes
        if end > self.total_bytes:
            raise ProtocolError(
                f"batch overflow: {end} bytes received, {self.total_bytes} were announced"
            )
        split = max(0, min(piece.nbytes, self._boundary - self._received))
        if split:
            self._parts[0].add(piece[:split])
        if split < piece.nbytes:
            self._parts[1].add(piece[split:])
        self._crc = crc32c(piece, self._crc)
        self._received = end

    def add_rest(self, read_at: Callable[[memoryview, int], None]) -> None:
        """Let ``read_at(into, offset)`` fill each packet's rest in place (no chunk copy).

        ``offset`` counts from the batch's first byte; ``read_at`` must fill all of
        ``into`` (or raise). It is called for pieces of at most
        :data:`~common.checksum.READ_PIECE` bytes, each checksummed while still in cache.

        Raises:
            SessionStateError: :meth:`finish` was already called.
        """
        if self._done:
            raise SessionStateError("BatchAssembler.add_rest called after finish()")
        offset = 0
        for part in self._parts:
            while part.received < part.total_bytes:
                start = offset + part.received

                def read(into: memoryview, at: int = start) -> None:
                    read_at(into, at)

                size = min(checksum.READ_PIECE, part.total_bytes - part.received)
                self._crc = crc32c(part.fill_next(size, read), self._crc)
            offset += part.total_bytes
        self._received = self.total_bytes

    def finish(self, expected_crc32c: int | None = None) -> TensorDict:
        """Checks completeness and the checksum, decodes, and unfolds a folded batch.

        Args:
            expected_crc32c: The sender's CRC-32C of all the bytes, or None to skip the check.

        Returns:
            The full batch; its tensors view the received buffers (and the rebuilt ones).

        Raises:
            ProtocolError: Bytes missing, a malformed packet, or finals that do not fit.
            DataLossError: The checksum does not match.
            SessionStateError: :meth:`finish` was already called.
        """
        if self._done:
            raise SessionStateError("BatchAssembler.finish called twice")
        self._done = True
        if self._received != self.total_bytes:
            raise ProtocolError(
                f"batch incomplete: {self._received} of {self.total_bytes} bytes received"
            )
        if expected_crc32c is not None and self._crc != expected_crc32c:
            raise DataLossError(
                f"batch checksum mismatch: got crc32c {self._crc:#010x}, "
                f"expected {expected_crc32c:#010x}"
            )
        batch = self._parts[0].finish()
        if len(self._parts) == 1:
            return batch
        return unfold(batch, self._parts[1].finish(), self._allocate)
