"""The strict packet decoder: header validation and TensorDict construction.

:mod:`common.packets` documents the layout byte by byte and is the public face of
the codec; this module holds the layout constants, the caps (:class:`PacketLimits`)
and the part that faces hostile input: it parses the JSON header, checks every
field, type, size and offset against the caps before anything is allocated, and
builds the TensorDict with tensors viewing the packet's buffer. Every failure is a
:class:`~common.errors.ProtocolError` (:class:`~common.errors.PacketTooLargeError` for
caps). Nothing here unpickles.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from common.errors import PacketTooLargeError, ProtocolError

__all__ = ["ALIGN", "DTYPES", "MAGIC", "PREAMBLE", "STR", "PacketLimits", "decode"]

#: The first four bytes of every packet.
MAGIC = b"RLF1"
PREAMBLE = struct.Struct("<4sQ")
ALIGN = 16
STR = "str"
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_TOP_FIELDS = frozenset({"batch_size", "names", "tds", "entries", "payload_bytes"})
_TD_FIELDS = frozenset({"key", "batch_size", "names"})
_ENTRY_FIELDS = frozenset({"key", "dtype", "shape", "offset", "nbytes"})
Key = tuple[str, ...]
# Validated headers kept for reuse, and the largest kept (see _header).
_CACHED_HEADERS = 32
_CACHED_HEADER_BYTES = 16 << 10


@dataclasses.dataclass(frozen=True)
class PacketLimits:
    """Caps the decoder enforces before it allocates anything.

    Attributes:
        max_packet_bytes: Largest whole packet, and largest dim or element count, accepted.
        max_header_bytes: Largest JSON header (H).
        max_entries: Most entries plus nested tensordicts in one packet.
        max_depth: Most components in one key.
        max_key_length: Longest key component or dim name, in characters.
        max_ndim: Most dims in one shape or batch size.
        max_strings: Most strings in one packet, an empty string stack's nested lists
            counted as strings. Each becomes a tensordict object (about 0.1 ms and
            0.6 KiB), so this bounds the decode time strings can cost.
    """

    max_packet_bytes: int = 1 << 30
    max_header_bytes: int = 1 << 20
    max_entries: int = 4096
    max_depth: int = 16
    max_key_length: int = 256
    max_ndim: int = 16
    max_strings: int = 1 << 16

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"PacketLimits.{field.name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Entry:
    key: Key
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def decode(data: torch.Tensor, limits: PacketLimits) -> TensorDict:
    """Decodes a whole packet held in a uint8 tensor; tensors are views of ``data``.

    Raises:
        ProtocolError: If the packet is malformed, truncated or inconsistent.
        PacketTooLargeError: If the packet exceeds a cap in ``limits``.
    """
    magic, length = PREAMBLE.unpack(bytes(data[: PREAMBLE.size].numpy()))
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if length > limits.max_header_bytes:
        raise PacketTooLargeError(
            f"header of {length} bytes exceeds max_header_bytes={limits.max_header_bytes}"
        )
    start = PREAMBLE.size + length
    if start > data.numel():
        raise ProtocolError(f"header of {length} bytes runs past the {data.numel()}-byte packet")
    if start % ALIGN:
        raise ProtocolError(f"payload offset {start} is not a multiple of {ALIGN}")
    spec = _header(bytes(data[PREAMBLE.size : start].numpy()), limits)
    payload = data[start:]
    if payload.numel() != spec.payload_bytes:
        raise ProtocolError(
            f"payload has {payload.numel()} bytes, the header announces {spec.payload_bytes}"
        )
    try:
        return spec.build(payload)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"packet does not form a valid tensordict: {exc}") from exc


def _header(raw: bytes, limits: PacketLimits) -> _Header:
    """The validated header of ``raw``: a batch laid out as the last ones reuses their parse.

    A stream's batches of one shape have byte-identical headers (layout only, no
    counters), and parsing one is about 100 us of a small batch's 250. Equal bytes under
    equal limits validate equally, so only headers that passed are kept, and only small
    ones (at most ``_CACHED_HEADERS`` of ``_CACHED_HEADER_BYTES``): memory stays bounded
    whatever a peer sends.
    """
    if len(raw) > _CACHED_HEADER_BYTES:
        return _Header(_load_json(raw), limits)
    return _cached_header(raw, limits)


@functools.lru_cache(maxsize=_CACHED_HEADERS)
def _cached_header(raw: bytes, limits: PacketLimits) -> _Header:
    return _Header(_load_json(raw), limits)


def _load_json(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_unique_fields, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not valid UTF-8 JSON: {exc}") from None
    return _fields(header, _TOP_FIELDS, "header")


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise ProtocolError(f"duplicate field in a header object: {[name for name, _ in pairs]}")
    return fields


def _no_constant(name: str) -> None:
    raise ProtocolError(f"{name} is not allowed in a header")


def _fields(value: Any, expected: frozenset[str], what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise ProtocolError(f"{what} must be a JSON object, got {type(value).__name__}")
    if value.keys() != expected:
        raise ProtocolError(
            f"{what} must have exactly the fields {sorted(expected)}, got {sorted(value)[:10]}"
        )
    return value


def _list(value: Any, what: str, cap: int, cap_name: str) -> list[Any]:
    if type(value) is not list:
        raise ProtocolError(f"{what} must be a JSON array, got {type(value).__name__}")
    if len(value) > cap:
        raise PacketTooLargeError(f"{what} has {len(value)} items, over {cap_name}={cap}")
    return value


def _int(value: Any, what: str, limits: PacketLimits) -> int:
    if type(value) is not int:
        raise ProtocolError(f"{what} must be an integer, got {value!r:.60}")
    if value < 0:
        raise ProtocolError(f"{what} must be non-negative, got {value}")
    if value > limits.max_packet_bytes:
        raise PacketTooLargeError(
            f"{what} = {value} exceeds max_packet_bytes={limits.max_packet_bytes}"
        )
    return value


def _shape(value: Any, what: str, limits: PacketLimits) -> tuple[int, ...]:
    dims = _list(value, what, limits.max_ndim, "max_ndim")
    shape = tuple(_int(dim, f"{what}[{i}]", limits) for i, dim in enumerate(dims))
    if math.prod(shape) > limits.max_packet_bytes:
        raise PacketTooLargeError(f"{what} {list(shape)} has more elements than max_packet_bytes")
    return shape


def _name(value: Any, what: str, limits: PacketLimits) -> str:
    if type(value) is not str or not value:
        raise ProtocolError(f"{what} must be a non-empty string, got {value!r:.60}")
    if len(value) > limits.max_key_length:
        raise PacketTooLargeError(
            f"{what} {value[:40]!r}... is over max_key_length={limits.max_key_length}"
        )
    return value


def _key(value: Any, limits: PacketLimits) -> Key:
    parts = _list(value, "key", limits.max_depth, "max_depth")
    if not parts:
        raise ProtocolError("key must have at least one component")
    return tuple(_name(part, "key component", limits) for part in parts)


def _names(value: Any, ndim: int, what: str, limits: PacketLimits) -> list[str | None]:
    names = _list(value, what, limits.max_ndim, "max_ndim")
    if len(names) != ndim:
        raise ProtocolError(f"{what} {names!r:.80} must have one item per batch dim ({ndim})")
    names = [None if name is None else _name(name, what, limits) for name in names]
    given = [name for name in names if name is not None]
    if len(set(given)) != len(given):
        raise ProtocolError(f"{what} {names} repeats a name")
    return names


class _Header:
    """A header whose every field passed validation, and the tensordict it builds.

    Never changed once built: one may serve many packets (and threads) at once.
    """

    def __init__(self, header: dict[str, Any], limits: PacketLimits) -> None:
        self.limits = limits
        batch_size = _shape(header["batch_size"], "batch_size", limits)
        names = _names(header["names"], len(batch_size), "names", limits)
        self.groups: dict[Key, tuple[tuple[int, ...], list[str | None]]] = {(): (batch_size, names)}
        self.payload_bytes = _int(header["payload_bytes"], "payload_bytes", limits)
        tds = _list(header["tds"], "tds", limits.max_entries, "max_entries")
        entries = _list(header["entries"], "entries", limits.max_entries, "max_entries")
        if len(tds) + len(entries) > limits.max_entries:
            raise PacketTooLargeError(
                f"{len(tds)} tds + {len(entries)} entries exceed max_entries={limits.max_entries}"
            )
        for item in tds:
            self._add_group(_fields(item, _TD_FIELDS, "tds item"))
        self.entries: list[_Entry] = []
        self._seen: set[Key] = set()
        self._strings = 0
        end = 0
        for item in entries:
            end = self._add_entry(_fields(item, _ENTRY_FIELDS, "entry"), end)
        if end != self.payload_bytes:
            raise ProtocolError(f"entries end at {end}, payload_bytes is {self.payload_bytes}")

    def _parent(self, key: Key, seen: set[Key]) -> tuple[tuple[int, ...], list[str | None]]:
        if key in self.groups or key in seen:
            raise ProtocolError(f"key {list(key)} appears twice")
        if key[:-1] not in self.groups:
            raise ProtocolError(f"key {list(key)}: parent {list(key[:-1])} is not a declared td")
        return self.groups[key[:-1]]

    def _add_group(self, item: dict[str, Any]) -> None:
        key = _key(item["key"], self.limits)
        parent_batch, parent_names = self._parent(key, set())
        batch_size = _shape(item["batch_size"], f"td {list(key)} batch_size", self.limits)
        names = _names(item["names"], len(batch_size), f"td {list(key)} names", self.limits)
        if (
            batch_size[: len(parent_batch)] != parent_batch
            or names[: len(parent_names)] != parent_names
        ):
            raise ProtocolError(
                f"td {list(key)}: batch size {list(batch_size)} / names {names} do not extend "
                f"the parent's {list(parent_batch)} / {parent_names}"
            )
        self.groups[key] = (batch_size, names)

    def _add_entry(self, item: dict[str, Any], previous_end: int) -> int:
        key = _key(item["key"], self.limits)
        parent_batch = self._parent(key, self._seen)[0]
        dtype = item["dtype"]
        if type(dtype) is not str or (dtype not in DTYPES and dtype != STR):
            raise ProtocolError(f"entry {list(key)}: dtype {dtype!r:.40} is not allowed")
        shape = _shape(item["shape"], f"entry {list(key)} shape", self.limits)
        offset = _int(item["offset"], f"entry {list(key)} offset", self.limits)
        nbytes = _int(item["nbytes"], f"entry {list(key)} nbytes", self.limits)
        if shape[: len(parent_batch)] != parent_batch and not (dtype == STR and not shape):
            raise ProtocolError(
                f"entry {list(key)}: shape {list(shape)} does not start with the batch size "
                f"{list(parent_batch)}"
            )
        count = math.prod(shape)
        if dtype == STR:
            self._strings += _string_cost(shape)
            if self._strings > self.limits.max_strings:
                raise PacketTooLargeError(
                    f"entry {list(key)} shape {list(shape)}: more than "
                    f"max_strings={self.limits.max_strings} strings"
                )
            if nbytes < 8 * count:
                raise ProtocolError(
                    f"entry {list(key)}: {nbytes} bytes cannot hold {count} offsets"
                )
        elif nbytes != count * DTYPES[dtype].itemsize:
            raise ProtocolError(f"entry {list(key)}: nbytes {nbytes} != {count} x {dtype} size")
        expected = previous_end + -previous_end % ALIGN
        if offset != expected:
            raise ProtocolError(
                f"entry {list(key)}: offset {offset}, expected {expected} "
                "(entries are packed in order, 16-byte aligned)"
            )
        if offset + nbytes > self.payload_bytes:
            raise ProtocolError(f"entry {list(key)} ends past payload_bytes={self.payload_bytes}")
        self._seen.add(key)
        self.entries.append(_Entry(key, dtype, shape, offset, nbytes))
        return offset + nbytes

    def build(self, payload: torch.Tensor) -> TensorDict:
        """Builds the tensordict; tensors are views of ``payload``."""
        raw = payload.numpy().data
        sources: dict[Key, dict[str, Any]] = {key: {} for key in self.groups}
        end = 0
        for entry in self.entries:
            if any(raw[end : entry.offset]):
                raise ProtocolError(f"entry {list(entry.key)}: padding before it is not zero")
            end = entry.offset + entry.nbytes
            parent = entry.key[:-1]
            if entry.dtype == STR:
                value = _strings(entry, raw[entry.offset : end], self.groups[parent][0])
            else:
                value = _tensor(entry, payload[entry.offset : end])
            sources[parent][entry.key[-1]] = value
        tds = {
            key: TensorDict(sources[key], batch_size=group[0]) for key, group in self.groups.items()
        }
        for key in list(tds)[1:]:
            tds[key[:-1]].set(key[-1], tds[key])
        # Named last and top-down: tensordict renames (or erases) a td's children when its
        # names are set, and renames a parent when a named child is set into it.
        for key, (_, names) in self.groups.items():
            if any(name is not None for name in names):
                tds[key].names = names
        return tds[()]


def _string_cost(shape: tuple[int, ...]) -> int:
    """What a string entry of ``shape`` counts against ``max_strings``.

    Its strings, or the empty lists its stack nests when those are more: ``[2**30, 0]``
    holds no string and no byte, yet would be built as 2^30 lists.
    """
    lists = 1
    for dim in shape[:-1]:
        if not dim:
            break
        lists *= dim
    return max(math.prod(shape), lists)


def _tensor(entry: _Entry, region: torch.Tensor) -> torch.Tensor:
    dtype = DTYPES[entry.dtype]
    # torch.bool assumes bytes 0 and 1; anything else is undefined behaviour.
    if dtype is torch.bool and entry.nbytes and int(region.max()) > 1:
        raise ProtocolError(f"entry {list(entry.key)}: bool bytes must be 0 or 1")
    return region.view(dtype).view(entry.shape)


def _strings(entry: _Entry, region: memoryview, batch_size: tuple[int, ...]) -> TensorDictBase:
    count = math.prod(entry.shape)
    ends = np.frombuffer(region, dtype="<u8", count=count)
    body = bytes(region[8 * count :])
    last = int(ends[-1]) if count else 0
    if last != len(body) or (count > 1 and bool((ends[1:] < ends[:-1]).any())):
        raise ProtocolError(
            f"entry {list(entry.key)}: string offsets are not monotonic up to "
            f"the {len(body)} text bytes"
        )
    bounds = ends.tolist()
    try:
        texts = [body[a:b].decode("utf-8") for a, b in zip([0, *bounds], bounds, strict=False)]
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"entry {list(entry.key)}: text is not valid UTF-8: {exc}") from None
    if not entry.shape:
        return NonTensorData(data=texts[0], batch_size=batch_size)
    stack = NonTensorStack.from_list(_nest(texts, entry.shape))
    if tuple(stack.batch_size) != entry.shape:
        raise ProtocolError(
            f"entry {list(entry.key)}: cannot build a string stack of shape {list(entry.shape)}"
        )
    return stack


def _nest(flat: list[str], shape: tuple[int, ...]) -> list[Any]:
    if len(shape) <= 1:
        return flat
    if not shape[0]:
        return []
    step = len(flat) // shape[0]
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]
