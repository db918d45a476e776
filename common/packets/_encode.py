"""The packet encoder: a tensordict walked into a JSON header and zero-copy payload views.

:mod:`common.packets` documents the layout byte by byte and is the public face of
the codec; this module walks a tensordict depth-first and collects the header
records and the views of every entry's bytes, in order, with the zero padding
that aligns each entry to 16 bytes. Contiguous CPU tensors are not copied, nor
are tensors whose rows are each contiguous (sent row by row); strings are
encoded as offsets and UTF-8 text. The CRC-32C used by both ends lives here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase, is_non_tensor

from common.errors import ProtocolError
from common.packets._decode import ALIGN, DTYPES, STR
from common.tensor_bytes import byte_view

__all__ = ["Encoder", "cut_chunks"]

_ZEROS = memoryview(bytes(ALIGN))
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# Above this many rows a strided tensor is copied once rather than sent row by row.
_MAX_ROW_VIEWS = 4096
Key = tuple[str, ...]


def cut_chunks(parts: Sequence[memoryview], chunk_bytes: int) -> list[list[memoryview]]:
    """Cuts consecutive byte views into pieces of ``chunk_bytes`` (the last shorter), as views.

    Nothing is copied: each piece is the list of views whose bytes make it up.
    """
    pieces: list[list[memoryview]] = []
    pending: list[memoryview] = []
    size = 0
    for part in parts:
        start, end = 0, part.nbytes
        while start < end:
            take = min(end - start, chunk_bytes - size)
            pending.append(part[start : start + take])
            size += take
            start += take
            if size == chunk_bytes:
                pieces.append(pending)
                pending, size = [], 0
    if pending:
        pieces.append(pending)
    return pieces


class Encoder:
    """Walks a tensordict depth-first, collecting header records and payload views."""

    def __init__(self) -> None:
        self.tds: list[dict[str, Any]] = []
        self.entries: list[dict[str, Any]] = []
        self.parts: list[memoryview] = []
        self.offset = 0

    def dense(self, td: TensorDictBase, key: Key) -> TensorDictBase:
        if type(td) is TensorDict:
            return td
        try:
            return td.contiguous()
        except (RuntimeError, ValueError) as exc:
            raise ProtocolError(f"cannot densify the tensordict at {list(key)}: {exc}") from exc

    def walk(self, td: TensorDictBase, prefix: Key, names: list[str | None]) -> None:
        for name, value in td.items():
            key = (*prefix, name)
            if isinstance(value, torch.Tensor):
                self.add(key, _DTYPE_NAMES.get(value.dtype), value.shape, _tensor_views(key, value))
            elif is_non_tensor(value):
                shape, view = _strings_view(key, value, td.batch_size)
                self.add(key, STR, shape, [view])
            elif isinstance(value, TensorDictBase):
                value = self.dense(value, key)
                # tensordict keeps a child's leading names equal to its parent's, except
                # after erasing names; the packet always states the consistent form.
                sub_names = [*names, *value.names[td.batch_dims :]]
                record = {"key": list(key), "batch_size": list(value.batch_size)}
                self.tds.append({**record, "names": sub_names})
                self.walk(value, key, sub_names)
            else:
                raise TypeError(f"entry {list(key)}: cannot encode a {type(value).__name__}")

    def add(
        self, key: Key, dtype: str | None, shape: Sequence[int], views: list[memoryview]
    ) -> None:
        pad = -self.offset % ALIGN
        if pad:
            self.parts.append(_ZEROS[:pad])
            self.offset += pad
        nbytes = sum(view.nbytes for view in views)
        record = {"key": list(key), "dtype": dtype, "shape": list(shape)}
        self.entries.append({**record, "offset": self.offset, "nbytes": nbytes})
        self.parts.extend(view for view in views if view.nbytes)
        self.offset += nbytes


def _tensor_views(key: Key, tensor: torch.Tensor) -> list[memoryview]:
    """Byte views of a tensor's elements in C order: one, or one per row of dim 0.

    A tensor whose rows are each contiguous (a ``[N, T]`` slice of an ``[N, T + 1]``
    buffer) is sent row by row without a copy; any other layout is copied once.
    """
    if tensor.dtype not in _DTYPE_NAMES:
        raise TypeError(f"entry {list(key)}: dtype {tensor.dtype} is not one of {list(DTYPES)}")
    if tensor.layout is not torch.strided:
        raise TypeError(f"entry {list(key)}: layout {tensor.layout} is not torch.strided")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_contiguous():
        return [_bytes_of(tensor)]
    if tensor.dim() > 1 and tensor.shape[0] <= _MAX_ROW_VIEWS and tensor[0].is_contiguous():
        return [_bytes_of(row) for row in tensor.unbind(0)]
    return [_bytes_of(tensor.contiguous())]


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    return byte_view(tensor).numpy().data


def _strings_view(key: Key, value: TensorDictBase, batch_size: torch.Size) -> tuple[list[int], Any]:
    if isinstance(value, NonTensorStack):
        shape = list(value.batch_size)
        flat = _flatten(value.tolist(), len(shape))
    elif value.batch_size == batch_size:
        shape, flat = [], [value.data]
    else:
        raise ProtocolError(
            f"entry {list(key)}: NonTensorData batch size {list(value.batch_size)} differs from "
            f"its tensordict's {list(batch_size)}; use a NonTensorStack"
        )
    for item in flat:
        if not isinstance(item, str):
            raise TypeError(f"entry {list(key)}: non-tensor values must be str, got {item!r:.60}")
    try:
        encoded = [item.encode("utf-8") for item in flat]
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"entry {list(key)}: text is not encodable as UTF-8: {exc}") from exc
    ends = np.cumsum([len(item) for item in encoded], dtype="<u8")
    return shape, memoryview(ends.tobytes() + b"".join(encoded))


def _flatten(nested: Any, ndim: int) -> list[Any]:
    for _ in range(ndim - 1):
        nested = [item for row in nested for item in row]
    return list(nested)
