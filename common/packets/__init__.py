"""Packets: the wire encoding of a TensorDict batch, and its strict decoder.

A packet is a safetensors-like header followed by the raw bytes of every entry.
All integers are little-endian; ``align16(n)`` rounds ``n`` up to a multiple of 16::

    offset 0       4 bytes   magic b"RLF1"
    offset 4       8 bytes   H, the header length, uint64 (at most PacketLimits.max_header_bytes)
    offset 12      H bytes   header: a UTF-8 JSON object, right-padded with spaces so that
                             12 + H is a multiple of 16 (the payload starts 16-byte aligned)
    offset 12+H    P bytes   payload: the entries' bytes, in header order, entry i starting at
                             align16(end of entry i-1) (0 for the first), padding bytes zero;
                             P is the end of the last entry (no trailing padding)

The header object has exactly these fields (JSON integers only, never bools or floats)::

    {"batch_size": [8, 125],            root batch size
     "names": [null, "time"],           root dim names, one per batch dim
     "tds": [{"key": ["next"], "batch_size": [8, 125], "names": [null, "time"]}, ...],
                                        every nested tensordict, parents before children
     "entries": [{"key": ["next", "observation"], "dtype": "float32", "shape": [8, 125, 4],
                  "offset": 0, "nbytes": 16000}, ...],
     "payload_bytes": P}

A key is the list of its nested string components; the parent of an entry or a
nested tensordict (its key minus the last component) is the root or an earlier
``tds`` item, and its shape starts with that parent's batch size (a nested
tensordict's names also start with its parent's names). Tensor dtypes
are ``float16 float32 float64 bfloat16 uint8 int8 int16 int32 int64 bool``; the
bytes of a tensor are its C-contiguous elements (bool as one byte, 0 or 1) and
``nbytes == numel * itemsize``. Strings (tensordict ``NonTensorData`` and
``NonTensorStack``) have ``"dtype": "str"``: shape ``[]`` is one string shared by
the batch (``NonTensorData``), any other shape is a ``NonTensorStack`` of that
shape; the region holds ``count`` (the shape's product, 1 for ``[]``) uint64 end
offsets, then the concatenated UTF-8 strings, ``nbytes = 8 * count + text bytes``.

Decoding trusts nothing (:mod:`common.packets._decode`): every field, type, size
and offset is checked against :class:`PacketLimits` before anything is allocated,
entries must be packed exactly as above, and every failure raises
:class:`~common.errors.ProtocolError` (:class:`~common.errors.PacketTooLargeError`
for caps). Decoded tensors are views into one buffer: the caller's ``bytearray``
or writable ``memoryview`` (aligned to 16 bytes), else one copy of it; with
:class:`PacketAssembler`, the buffer the chunks were copied into. Batches travel
on CPU and decode with device ``None``. No pickle is involved anywhere.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor

from common.checksum import crc32c as _crc32c
from common.config import CHUNK_BYTES
from common.errors import DataLossError, PacketTooLargeError, ProtocolError, SessionStateError
from common.packets._decode import ALIGN, MAGIC, PREAMBLE, PacketLimits, decode
from common.packets._encode import Encoder, cut_chunks

__all__ = [
    "EncodedPacket",
    "PacketAssembler",
    "PacketLimits",
    "DEFAULT_LIMITS",
    "MAGIC",
    "decode_packet",
    "checksummed_pieces",
    "cut_chunks",
    "encode_packet",
    "packet_crc32c",
]

#: The caps used when none are given.
DEFAULT_LIMITS = PacketLimits()


@dataclasses.dataclass(frozen=True)
class EncodedPacket:
    """An encoded packet: its header and zero-copy views of its payload.

    The payload views borrow the tensors' memory: leave the encoded tensordict
    unchanged until the packet has been sent.

    Example::

        packet = encode_packet(batch)
        for data in packet.chunks():  # each at most CHUNK_BYTES
            send(data)

    Attributes:
        header: Bytes 0 to 12+H: magic, header length and padded JSON header.
        payload: The payload in order, as flat byte views (entries and zero padding).
        nbytes: Total length of the packet.
    """

    header: bytes
    payload: tuple[memoryview, ...]
    nbytes: int

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """Cuts the packet into consecutive pieces, copying each byte once.

        Args:
            chunk_bytes: Largest piece; every piece but the last has exactly this length.

        Yields:
            The pieces, which concatenate to :meth:`tobytes`.

        Raises:
            ValueError: If ``chunk_bytes`` is not a positive int.
        """
        _check_chunk_bytes(chunk_bytes)
        for piece in cut_chunks(self.parts(), chunk_bytes):
            yield b"".join(piece)

    def parts(self) -> list[memoryview]:
        """The packet as consecutive byte views: the header, then the payload."""
        return [memoryview(self.header), *self.payload]

    def tobytes(self) -> bytes:
        """Returns the whole packet as one ``bytes`` object."""
        return b"".join((self.header, *self.payload))


def encode_packet(td: TensorDictBase) -> EncodedPacket:
    """Encodes a tensordict as a packet without copying contiguous CPU tensors.

    Lazy stacks are densified; other tensors are made CPU and contiguous only when
    they are not. Nested tensordicts keep their own batch sizes and dim names.

    Args:
        td: The batch: tensors of the allowed dtypes and strings, nested at will.

    Returns:
        The encoded packet.

    Raises:
        TypeError: If ``td`` or one of its values (named by key) has an unsupported
            type, dtype or layout, or a non-tensor value is not a string.
        ProtocolError: If a value cannot be represented (ragged lazy stack, unencodable text).
    """
    if not isinstance(td, TensorDictBase) or is_non_tensor(td):
        raise TypeError(f"encode_packet expects a TensorDict, got {type(td).__name__}")
    encoder = Encoder()
    td = encoder.dense(td, ())
    encoder.walk(td, (), td.names)
    header = {
        "batch_size": list(td.batch_size),
        "names": td.names,
        "tds": encoder.tds,
        "entries": encoder.entries,
        "payload_bytes": encoder.offset,
    }
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(PREAMBLE.size + len(text)) % ALIGN)
    head = PREAMBLE.pack(MAGIC, len(text)) + text
    return EncodedPacket(head, tuple(encoder.parts), len(head) + encoder.offset)


def decode_packet(
    buffer: bytes | bytearray | memoryview, limits: PacketLimits = DEFAULT_LIMITS
) -> TensorDict:
    """Decodes one whole packet, checking it as strictly as safetensors.

    Tensors are views into ``buffer`` when it is a ``bytearray`` or a writable,
    contiguous ``memoryview`` starting 16-byte aligned; otherwise (``bytes``, a
    read-only view) the buffer is copied once and the tensors view the copy.

    Args:
        buffer: Exactly one packet.
        limits: The caps to enforce.

    Returns:
        The batch, with its batch size, dim names and nested structure.

    Raises:
        ProtocolError: If the packet is malformed, truncated or inconsistent.
        PacketTooLargeError: If the packet exceeds a cap in ``limits``.
        TypeError: If ``buffer`` is not a bytes-like object.
    """
    if not isinstance(buffer, bytes | bytearray | memoryview):
        raise TypeError(f"decode_packet expects bytes-like data, got {type(buffer).__name__}")
    view = memoryview(buffer)
    if view.nbytes < PREAMBLE.size:
        raise ProtocolError(f"a packet has at least {PREAMBLE.size} bytes, got {view.nbytes}")
    if view.nbytes > limits.max_packet_bytes:
        raise PacketTooLargeError(
            f"packet of {view.nbytes} bytes exceeds max_packet_bytes={limits.max_packet_bytes}"
        )
    if view.readonly or not view.c_contiguous:
        view = memoryview(bytearray(view))
    data = torch.frombuffer(view.cast("B"), dtype=torch.uint8)
    if data.data_ptr() % ALIGN:
        data = data.clone()
    return decode(data, limits)


class PacketAssembler:
    """Reassembles a packet from its chunks into one preallocated buffer.

    Each chunk is copied once into the buffer and checksummed as it arrives;
    :meth:`finish` compares the CRC-32C and decodes tensors as views of that
    buffer, with no second pass or copy.

    Example::

        assembler = PacketAssembler(info.total_bytes)
        for data in chunks:
            assembler.add(data)
        batch = assembler.finish(expected_crc32c=info.crc32c)

    Args:
        total_bytes: The announced packet length; checked against the caps before allocating.
        limits: The caps to enforce.
        allocate: Called with ``total_bytes`` (after the checks) to get the buffer: a
            contiguous 1-D uint8 CPU tensor of exactly that length, starting 16-byte
            aligned, that nothing else writes to. None allocates a fresh one.
        checksum: Fold each chunk into a CRC-32C; False when the caller checksums a
            stream of several packets itself (:class:`common.packets.assembly.BatchAssembler`).

    Raises:
        ProtocolError: If ``total_bytes`` is too small for a packet, or ``allocate``
            returned an unusable buffer.
        PacketTooLargeError: If ``total_bytes`` exceeds ``limits.max_packet_bytes``.
    """

    def __init__(
        self,
        total_bytes: int,
        limits: PacketLimits = DEFAULT_LIMITS,
        allocate: Callable[[int], torch.Tensor] | None = None,
        *,
        checksum: bool = True,
    ) -> None:
        if type(total_bytes) is not int:
            raise ProtocolError(f"total_bytes must be an int, got {total_bytes!r:.60}")
        if total_bytes > limits.max_packet_bytes:
            raise PacketTooLargeError(
                f"packet of {total_bytes} bytes exceeds max_packet_bytes={limits.max_packet_bytes}"
            )
        if total_bytes < PREAMBLE.size:
            raise ProtocolError(f"a packet has at least {PREAMBLE.size} bytes, got {total_bytes}")
        self._limits = limits
        self._total = total_bytes
        self._received = 0
        self._crc = 0
        self._checksum = checksum
        if allocate is None:
            buffer = torch.empty(total_bytes, dtype=torch.uint8)
        else:
            buffer = _checked_buffer(allocate(total_bytes), total_bytes)
        self._buffer: torch.Tensor | None = buffer
        self._view = buffer.numpy().data

    @property
    def total_bytes(self) -> int:
        """The announced packet length."""
        return self._total

    @property
    def received(self) -> int:
        """Bytes received so far."""
        return self._received

    def add(self, chunk: bytes | bytearray | memoryview) -> None:
        """Copies the next chunk into the packet buffer.

        Args:
            chunk: The next consecutive bytes of the packet.

        Raises:
            ProtocolError: If the chunk would take the packet past its announced length.
            SessionStateError: If :meth:`finish` was already called.
        """
        if self._buffer is None:
            raise SessionStateError("PacketAssembler.add called after finish()")
        piece = memoryview(chunk).cast("B")
        end = self._received + piece.nbytes
        if end > self._total:
            raise ProtocolError(
                f"packet overflow: {end} bytes received, {self._total} were announced"
            )
        self._view[self._received : end] = piece
        # Checksummed as it arrives (the bytes are in cache): finish() needs no extra pass.
        if self._checksum:
            self._crc = _crc32c(piece, self._crc)
        self._received = end

    def fill_next(self, nbytes: int, read: Callable[[memoryview], None]) -> memoryview:
        """Let ``read`` fill the packet's next ``nbytes`` in place (no chunk copy).

        ``read`` gets that part of the buffer and must fill all of it (or raise); the
        bytes are then checksummed as :meth:`add` checksums a chunk's.

        Returns:
            The part ``read`` filled.

        Raises:
            ProtocolError: If ``nbytes`` would take the packet past its announced length.
            SessionStateError: If :meth:`finish` was already called.
        """
        if self._buffer is None:
            raise SessionStateError("PacketAssembler.fill_next called after finish()")
        end = self._received + nbytes
        if nbytes < 0 or end > self._total:
            raise ProtocolError(f"packet overflow: {end} bytes of {self._total} announced")
        view = self._view[self._received : end]
        read(view)
        if self._checksum:
            self._crc = _crc32c(view, self._crc)
        self._received = end
        return view

    def finish(self, expected_crc32c: int | None = None) -> TensorDict:
        """Checks completeness (and the checksum when given), then decodes the packet.

        Args:
            expected_crc32c: The sender's :func:`packet_crc32c`, or None to skip the check.

        Returns:
            The batch; its tensors are views into the assembled buffer.

        Raises:
            ProtocolError: If bytes are missing or the packet is malformed.
            DataLossError: If the checksum does not match.
            SessionStateError: If :meth:`finish` was already called.
        """
        if self._buffer is None:
            raise SessionStateError("PacketAssembler.finish called twice")
        if expected_crc32c is not None and not self._checksum:
            raise ValueError("this assembler does not checksum (checksum=False)")
        buffer, actual = self._buffer, self._crc
        self._buffer = None
        self._view = memoryview(b"")
        if self._received != self._total:
            raise ProtocolError(
                f"packet incomplete: {self._received} of {self._total} bytes received"
            )
        if expected_crc32c is not None and actual != expected_crc32c:
            raise DataLossError(
                f"packet checksum mismatch: got crc32c {actual:#010x}, "
                f"expected {expected_crc32c:#010x}"
            )
        return decode(buffer, self._limits)


def _checked_buffer(buffer: Any, total_bytes: int) -> torch.Tensor:
    if (
        not isinstance(buffer, torch.Tensor)
        or buffer.dtype != torch.uint8
        or buffer.device.type != "cpu"
        or buffer.dim() != 1
        or buffer.numel() != total_bytes
        or not buffer.is_contiguous()
        or buffer.data_ptr() % ALIGN
    ):
        raise ProtocolError(
            f"allocate({total_bytes}) must return a contiguous 1-D uint8 CPU tensor of that "
            f"length starting {ALIGN}-byte aligned, got {type(buffer).__name__} "
            f"{getattr(buffer, 'shape', '')}"
        )
    return buffer


def packet_crc32c(packet: EncodedPacket | bytes | bytearray | memoryview) -> int:
    """Returns the CRC-32C (Castagnoli) of a packet, as sent in ``BatchInfo.crc32c``.

    Args:
        packet: An encoded packet or its bytes.

    Returns:
        The unsigned 32-bit checksum.
    """
    if isinstance(packet, EncodedPacket):
        crc = _crc32c(packet.header)
        for part in packet.payload:
            crc = _crc32c(part, crc)
        return crc
    return _crc32c(packet)


def checksummed_pieces(
    packets: Sequence[EncodedPacket], chunk_bytes: int = CHUNK_BYTES
) -> tuple[list[list[memoryview]], int]:
    """Cuts consecutive packets into chunk-sized pieces, as views, and checksums them.

    Nothing is copied: the caller copies each piece once, into the message that
    carries it. The CRC-32C is read from the packets' own memory.

    Args:
        packets: The packets, sent back to back.
        chunk_bytes: Largest piece; every piece but the last has exactly this length.

    Returns:
        Each piece as the list of views that make it up, and the CRC-32C of all the bytes.

    Raises:
        ValueError: If ``chunk_bytes`` is not a positive int.
    """
    _check_chunk_bytes(chunk_bytes)
    parts = [part for packet in packets for part in packet.parts()]
    crc = 0
    for part in parts:
        crc = _crc32c(part, crc)
    return cut_chunks(parts, chunk_bytes), crc


def _check_chunk_bytes(chunk_bytes: int) -> None:
    if type(chunk_bytes) is not int or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
