"""A strict, copy-free reader and a one-copy writer of the safetensors format.

The format is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8
JSON (``{"__metadata__": {str: str}, key: {"dtype", "shape", "data_offsets"}}``)
and the raw little-endian tensor bytes. ``safetensors.torch.save`` copies the
state into a Rust buffer and again into ``bytes``, and ``safetensors.torch.load``
needs ``bytes`` and copies every tensor out of it; weight pushes of 100 MB pay
for each pass. :func:`write_blob` therefore joins the header and the tensors'
memory in one copy, and :func:`read_blob` validates the header exactly as
safetensors does (dtype allow-list, shapes, offsets contiguous from 0, in bounds,
non-overlapping and covering the data exactly) and then returns
``torch.frombuffer`` views over the caller's buffer, copying only tensors whose
offset is not aligned to their element size. Blobs stay interchangeable with
the ``safetensors`` package in both directions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from common.errors import WeightsError, WeightsTooLargeError
from common.tensor_bytes import byte_view

__all__ = [
    "DEFAULT_MAX_KEYS",
    "DTYPES",
    "HEADER_PREFIX",
    "MAX_HEADER_BYTES",
    "METADATA_KEY",
    "Expected",
    "HeaderCheck",
    "header_bytes",
    "parse_header",
    "read_blob",
    "write_blob",
]

HEADER_PREFIX = 8
#: The largest header a blob may have: safetensors' own reader refuses headers over 100 MB;
#: we refuse them before it does, and before ``json.loads`` sees them.
MAX_HEADER_BYTES = 100_000_000
#: Most tensors a blob may list unless the caller says otherwise.
DEFAULT_MAX_KEYS = 65_536
# Header bytes allowed besides the tensor entries (metadata), and per tensor entry:
# a long key, a 16-dim shape and two offsets fit easily.
_HEADER_BASE_BYTES = 1 << 20
_BYTES_PER_ENTRY = 1024
# Every tensor entry holds this once; counting it bounds the entries before parsing.
_ENTRY_MARK = b'"data_offsets"'
#: What the receiver holds: ``{key: (shape, torch dtype)}``.
Expected = Mapping[str, tuple[tuple[int, ...], torch.dtype]]
#: A check of a parsed header (``infos``, ``metadata``) run before any tensor is built.
HeaderCheck = Callable[[dict[str, Any], dict[str, str]], None]
METADATA_KEY = "__metadata__"
_INFO_FIELDS = frozenset(("dtype", "shape", "data_offsets"))

#: safetensors dtype name -> torch dtype, for the dtypes both directions support.
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# safetensors' Dtype enum order (sizes ascending); it lays tensors out by
# descending rank, then name, which keeps every offset aligned.
_RANK = {
    name: i
    for i, name in enumerate(
        (
            "BOOL",
            "U8",
            "I8",
            "F8_E5M2",
            "F8_E4M3",
            "I16",
            "U16",
            "F16",
            "BF16",
            "I32",
            "U32",
            "F32",
            "C64",
            "F64",
            "I64",
            "U64",
        )
    )
}


def _invalid(reason: str) -> WeightsError:
    return WeightsError(f"weights blob is not valid safetensors: {reason}")


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    # A flat uint8 view of the tensor's own memory: numpy cannot hold bf16/fp8.
    return byte_view(tensor).numpy().data.cast("B")


def write_blob(
    state: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    allocate: Callable[[int], torch.Tensor] | None = None,
) -> bytes | memoryview:
    """Serialise contiguous tensors into safetensors bytes with one copy.

    The bytes are those ``safetensors.torch.save`` writes: tensors laid out by
    decreasing dtype rank, then by name, after a compact JSON header padded
    with spaces to a multiple of 8, so every offset is aligned to its element
    size. Given ``allocate``, or when some tensor lives on an accelerator, the blob is
    written into one host buffer (``allocate``'s, reused by the caller, else a fresh
    one): each tensor is copied once, straight into its place, device copies
    ``non_blocking`` with one synchronisation at the end. Otherwise CPU tensors are
    joined into ``bytes``.

    Args:
        state: Contiguous tensors of :data:`DTYPES` by key, sharing no memory.
        metadata: String pairs for the header's ``__metadata__``, or None.
        allocate: Gives a ``uint8`` host tensor of (at least) the blob's size.

    Returns:
        The blob (a ``memoryview`` of the buffer when written in place).
    """
    order, prefix = _layout(state, metadata)
    if allocate is None and all(state[key].device.type == "cpu" for key in order):
        parts: list[bytes | memoryview] = [prefix]
        parts.extend(_as_bytes(state[key]) for key in order if state[key].numel())
        return b"".join(parts)
    return _write_in_place(state, order, prefix, allocate)


def _layout(
    state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None
) -> tuple[list[str], bytes]:
    """The tensors' order in the blob, and the blob's prefix (length and padded header)."""
    order = sorted(state, key=lambda k: (-_RANK[_NAMES[state[k].dtype]], k))
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for key in order:
        tensor = state[key]
        end = offset + tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    return order, header_bytes(header)


def header_bytes(header: Mapping[str, Any]) -> bytes:
    """A blob's prefix: the 8-byte length, then the compact JSON header padded to 8 bytes."""
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(HEADER_PREFIX, "little") + text


def _write_in_place(
    state: Mapping[str, torch.Tensor],
    order: list[str],
    prefix: bytes,
    allocate: Callable[[int], torch.Tensor] | None,
) -> memoryview:
    """The blob in one host buffer, each tensor copied into its place (see :func:`write_blob`)."""
    total = len(prefix) + sum(state[k].numel() * state[k].element_size() for k in order)
    if allocate is not None:
        out = allocate(total)[:total]
    else:
        out = torch.empty(total, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    out[: len(prefix)].copy_(torch.frombuffer(bytearray(prefix), dtype=torch.uint8))
    start = len(prefix)
    devices = set()
    for key in order:
        tensor = state[key]
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            place = out[start : start + nbytes].view(tensor.dtype).view(tensor.shape)
            place.copy_(tensor, non_blocking=True)
            devices.add(tensor.device)
        start += nbytes
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return out.numpy().data.cast("B")


def parse_header(
    view: memoryview,
    max_header: int,
    *,
    max_keys: int = DEFAULT_MAX_KEYS,
    expected: Expected | None = None,
    check: HeaderCheck | None = None,
) -> tuple[dict[str, Any], dict[str, str], int]:
    """Parse and validate the header of a safetensors blob, cheap checks first.

    Before the JSON is parsed, the header length is bounded by the number of
    tensors allowed (``max_keys``, or the number ``expected``) and the tensor
    entries are counted in the raw bytes, so a header listing 300,000 tensors
    costs a byte scan, not 300,000 Python dicts. ``check`` (e.g. keys, shapes
    and dtypes against the model) runs on the parsed header before any tensor
    is built.

    Returns:
        ``(infos, metadata, data_start)``: each tensor's header entry by key.

    Raises:
        WeightsTooLargeError: The header is over its cap, or lists too many tensors.
        WeightsError: The header is truncated, malformed, inconsistent with the
            data, or does not match ``expected``.
    """
    size = view.nbytes
    if size < HEADER_PREFIX:
        raise WeightsError(f"weights blob of {size} bytes is truncated: no 8-byte header length")
    header_len = int.from_bytes(view[:HEADER_PREFIX], "little")
    if header_len > size - HEADER_PREFIX:
        raise WeightsError(
            f"weights header length {header_len} points past the end of the {size}-byte blob"
        )
    raw = _bounded_header(view, header_len, max_header, max_keys, expected)
    try:
        header = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WeightsError(f"weights header is not valid JSON: {exc}") from None
    del raw
    if not isinstance(header, dict):
        raise WeightsError(f"weights header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise WeightsError("weights header metadata must map strings to strings")
    for key, info in header.items():
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if not isinstance(dtype, str) or dtype not in DTYPES:  # a list is unhashable
            raise WeightsError(f"weight {key!r} has unsupported or missing dtype {dtype!r:.80}")
    data_start = HEADER_PREFIX + header_len
    _check_layout(header, size - data_start)
    if check is not None:
        check(header, metadata)
    return header, metadata, data_start


def _bounded_header(
    view: memoryview, header_len: int, max_header: int, max_keys: int, expected: Expected | None
) -> bytes:
    """The raw header, once its length and tensor-entry count are within bounds."""
    keys = max_keys if expected is None else len(expected)
    cap = min(max_header, _HEADER_BASE_BYTES + keys * _BYTES_PER_ENTRY)
    # Beyond what the expected keys allow, the blob cannot fit the model (INVALID_ARGUMENT);
    # beyond the general caps, it is too large (RESOURCE_EXHAUSTED).
    error = WeightsTooLargeError if expected is None else WeightsError
    if header_len > cap:
        raise error(
            f"weights header of {header_len} bytes exceeds the cap of {cap} bytes "
            f"for at most {keys} tensors"
        )
    raw = bytes(view[HEADER_PREFIX : HEADER_PREFIX + header_len])
    entries = raw.count(_ENTRY_MARK)
    # A few extra expected-mode entries are parsed, so the error can name them.
    if entries > (keys if expected is None else 2 * keys + 16):
        raise error(f"weights header lists {entries} tensors; at most {keys} are accepted")
    return raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = [k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])]
        raise ValueError(f"duplicate keys {seen}")
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(infos: dict[str, Any], data_bytes: int) -> None:
    # The rules of safetensors' own Metadata::validate: sorted by start, each
    # tensor starts where the previous ended, sizes match shape x dtype, and
    # the last one ends exactly at the end of the blob.
    spans = []
    for key, info in infos.items():
        if set(info) != _INFO_FIELDS:
            raise _invalid(
                f"tensor {key!r} has fields {sorted(info)}, expected {sorted(_INFO_FIELDS)}"
            )
        shape, offsets = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise _invalid(f"tensor {key!r} has shape {shape!r}, not a list of non-negative ints")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_count(o) for o in offsets)
        ):
            raise _invalid(
                f"tensor {key!r} has data_offsets {offsets!r}, not two non-negative ints"
            )
        start, end = offsets
        expected = math.prod(shape) * DTYPES[info["dtype"]].itemsize
        if end < start or end - start != expected:
            raise _invalid(
                f"tensor {key!r} of shape {shape} ({info['dtype']}) needs {expected} "
                f"bytes, its data_offsets {offsets} hold {end - start}"
            )
        spans.append((start, end, key))
    position = 0
    for start, end, key in sorted(spans):
        if start != position:
            kind = "overlaps the previous tensor" if start < position else "leaves a gap"
            raise _invalid(
                f"tensor {key!r} at data_offsets [{start}, {end}] {kind} "
                f"(previous data ends at {position})"
            )
        position = end
    if position != data_bytes:
        raise _invalid(f"tensors cover {position} bytes but the blob holds {data_bytes} data bytes")


def read_blob(
    view: memoryview,
    max_header: int,
    *,
    max_keys: int = DEFAULT_MAX_KEYS,
    expected: Expected | None = None,
    check: HeaderCheck | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Validate a safetensors blob and return tensors viewing its memory.

    Args:
        view: A byte view of the blob. If writable, the returned tensors share
            its memory (those at an offset misaligned for their dtype are
            copies); a read-only one is copied once, after validation.
        max_header: The largest header accepted.
        max_keys: The most tensors accepted.
        expected: The keys the receiver holds (bounds the header's size).
        check: Run on the parsed header before any tensor is built.

    Returns:
        ``(state, metadata)``.

    Raises:
        WeightsTooLargeError: The header is over ``max_header`` bytes.
        WeightsError: The blob is malformed (see :func:`parse_header`).
    """
    infos, metadata, data_start = parse_header(
        view, max_header, max_keys=max_keys, expected=expected, check=check
    )
    if view.readonly:  # torch.frombuffer needs writable memory: copy once, once valid
        view = memoryview(bytearray(view))
    base = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else None
    address = base.data_ptr() if base is not None else 0
    state: dict[str, torch.Tensor] = {}
    for key, info in infos.items():
        dtype = DTYPES[info["dtype"]]
        start, end = (data_start + o for o in info["data_offsets"])
        if base is None or start == end:
            state[key] = torch.empty(info["shape"], dtype=dtype)
            continue
        raw = base[start:end]
        if (address + start) % dtype.itemsize:
            raw = raw.clone()  # a view must be aligned to its element size
        state[key] = raw.view(dtype).reshape(info["shape"])
    return state, metadata
