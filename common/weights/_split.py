"""A whole push's blob split into parts that share its bytes (a push striped over streams).

:func:`~common.weights.encode_weights` lays a blob's tensors out one after the other
(``common.weights._safetensors``), so a run of consecutive tensors is one contiguous range
of its data. :func:`split_blob` cuts the tensors into up to ``count`` runs of about equal
bytes and gives each run a header of its own: its keys with their offsets counted from the
run's start, the blob's metadata, and the aliases whose target it holds. That header
followed by the run's bytes (a view of the blob, never a copy) is a valid blob of those
keys, and the runs are the parts ``(i, n)`` of one multi-part push of the whole model
(``common.weights._parts``): the receiver checks each as any part and applies the version
whole once all arrived. Tensor boundaries stay where the encoder put them, so every tensor
keeps the alignment it had.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

from common.weights._aliases import ALIASES_KEY, decode_aliases, encode_aliases
from common.weights._parts import Part
from common.weights._push_form import PushForm
from common.weights._safetensors import METADATA_KEY, header_bytes, parse_header

__all__ = ["BlobPart", "split_blob"]


@dataclasses.dataclass(frozen=True)
class BlobPart:
    """One part of a split blob: its own safetensors header, then a run of the blob's data.

    Attributes:
        part: Its index and the number of parts.
        header: The part's length prefix and padded JSON header.
        data: Its tensors' bytes: a view of the split blob.
    """

    part: Part
    header: bytes
    data: memoryview

    @property
    def nbytes(self) -> int:
        """The part's size as a blob of its own."""
        return len(self.header) + self.data.nbytes


def split_blob(blob: bytes | memoryview, count: int) -> list[BlobPart]:
    """Split a whole blob into at most ``count`` parts of about equal bytes, by keys.

    Fewer parts come back when the blob has fewer tensors than ``count``, or when a large
    tensor takes more than one part's share (a tensor is never cut).

    Args:
        blob: A blob :func:`~common.weights.encode_weights` wrote, holding every key of the
            model (not a subset: the parts must hold every key between them).
        count: The most parts, ``>= 1``.

    Raises:
        ValueError: ``count`` below 1, or a blob that declares a subset.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    view = memoryview(blob).cast("B")
    infos, metadata, data_start = parse_header(view, view.nbytes, max_keys=sys.maxsize)
    if PushForm.from_metadata(metadata).subset:
        raise ValueError("a subset blob cannot be split: parts must hold every key between them")
    data = view[data_start:]
    runs = _runs(infos, count, data.nbytes)
    aliases = decode_aliases(metadata, infos, sys.maxsize)
    parts = []
    for index, keys in enumerate(runs):
        start = infos[keys[0]]["data_offsets"][0]
        end = infos[keys[-1]]["data_offsets"][1]
        held = set(keys)
        own = {a: t for a, t in aliases.items() if t in held}
        parts.append(
            BlobPart(
                Part(index, len(runs)),
                _run_header(infos, keys, start, metadata, own),
                data[start:end],
            )
        )
    return parts


def _runs(infos: Mapping[str, Any], count: int, data_bytes: int) -> list[list[str]]:
    """The keys in data order, cut into at most ``count`` runs of about equal bytes.

    Each tensor goes to the run whose share holds its middle byte, so runs stay
    contiguous and a tensor larger than a share leaves the runs it spans empty (dropped);
    a run under a quarter of a share joins the run before it (the first, the one after).
    """
    order = sorted(infos, key=lambda k: (infos[k]["data_offsets"], k))
    share = max(1, -(-data_bytes // count))
    runs: list[list[str]] = [[] for _ in range(count)]
    for key in order:
        start, end = infos[key]["data_offsets"]
        runs[min(count - 1, (start + end) // 2 // share)].append(key)

    def small(run: list[str]) -> bool:
        nbytes: int = infos[run[-1]]["data_offsets"][1] - infos[run[0]]["data_offsets"][0]
        return nbytes < share // 4

    joined: list[list[str]] = []
    for run in filter(None, runs):
        if joined and (small(run) or small(joined[-1])):
            joined[-1] += run
        else:
            joined.append(run)
    return joined


def _run_header(
    infos: Mapping[str, Any],
    keys: list[str],
    start: int,
    metadata: Mapping[str, str],
    aliases: Mapping[str, str],
) -> bytes:
    """One run's header: its tensors at offsets from ``start``, the blob's metadata."""
    meta = {k: v for k, v in metadata.items() if k != ALIASES_KEY}
    if aliases:
        meta[ALIASES_KEY] = encode_aliases(aliases)
    header: dict[str, Any] = {METADATA_KEY: meta} if meta else {}
    for key in keys:
        info = infos[key]
        first, last = info["data_offsets"]
        header[key] = {
            "dtype": info["dtype"],
            "shape": info["shape"],
            "data_offsets": [first - start, last - start],
        }
    return header_bytes(header)
