"""Tied and aliased tensors: sent once, named in the header, re-tied when decoded.

A module with tied parameters (a language model's input embedding and output head,
one ``nn.Linear`` used twice) lists the same tensor under several state-dict keys.
:func:`split_aliases` keeps the first key of each group as the tensor that travels
and records every other key as an *alias* of it, so a push carries the unique
parameter bytes only. The alias map travels in the safetensors header metadata,
under :data:`ALIASES_KEY`, as a JSON object ``{alias: target}``.
:func:`decode_aliases` reads it back strictly before any tensor is built: bounded
text, at most ``max_aliases`` string pairs, every target a tensor of the blob, no
alias that is itself a tensor or a target (so there are no chains and no cycles).
The receiver then gives every alias the very tensor of its target
(:func:`expand_aliases`): loading copies the same values into both keys, and an
actor whose module ties them holds one tensor, as the sender did.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import torch

from common.errors import WeightsError

__all__ = ["ALIASES_KEY", "decode_aliases", "encode_aliases", "expand_aliases", "split_aliases"]

#: The header metadata key of the alias map.
ALIASES_KEY = "rlfleet.aliases"
# Characters of alias-map text allowed per alias (two keys, quotes and separators).
_CHARS_PER_ALIAS = 1024


def _identity(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors the same tensor: memory, offset, shape, strides, dtype."""
    if tensor.numel() == 0 or tensor.device.type == "meta" or tensor.layout != torch.strided:
        return None  # nothing to share (the encoder refuses the latter two)
    storage = tensor.untyped_storage()
    if storage.data_ptr() == 0:
        return None
    return (
        tensor.device,
        storage.data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def split_aliases(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one key per distinct tensor; name the others as its aliases.

    Two keys alias when they hold the same tensor: the same memory at the same
    offset, with the same shape, strides and dtype (tied parameters). Tensors
    that merely overlap are not aliases; they travel separately.

    Args:
        state: Tensors by key, as the sender holds them (before any copy).

    Returns:
        ``(unique, aliases)``: the tensors that travel, in ``state``'s order, and
        ``{alias: target}`` with every target a key of ``unique``.
    """
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for key, tensor in state.items():
        ident = _identity(tensor)
        if ident is not None and ident in first:
            aliases[key] = first[ident]
            continue
        if ident is not None:
            first[ident] = key
        unique[key] = tensor
    return unique, aliases


def encode_aliases(aliases: Mapping[str, str]) -> str:
    """The header metadata value of an alias map (compact JSON, keys sorted)."""
    return json.dumps(dict(sorted(aliases.items())), separators=(",", ":"), ensure_ascii=False)


def decode_aliases(
    metadata: Mapping[str, str], tensor_keys: Collection[str], max_aliases: int
) -> dict[str, str]:
    """Read and check the alias map of a received header.

    Args:
        metadata: The header's ``__metadata__``.
        tensor_keys: The keys of the tensors the blob holds.
        max_aliases: The most aliases accepted.

    Returns:
        ``{alias: target}`` (empty when the header has none).

    Raises:
        WeightsError: The map is too long, not a JSON object of strings, names a
            target the blob lacks, or an alias that is also a tensor or a target.
    """
    text = metadata.get(ALIASES_KEY)
    if text is None:
        return {}
    limit = _CHARS_PER_ALIAS * max(1, max_aliases)
    if len(text) > limit:
        raise WeightsError(f"weights alias map of {len(text)} characters exceeds {limit}")
    try:
        aliases = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WeightsError(f"weights alias map is not valid JSON: {exc}") from None
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
    ):
        raise WeightsError("weights alias map must be a JSON object mapping key to key")
    if len(aliases) > max_aliases:
        raise WeightsError(f"weights alias map lists {len(aliases)} aliases; at most {max_aliases}")
    keys = set(tensor_keys)
    unknown = sorted(v[:80] for v in set(aliases.values()) - keys)
    if unknown:
        raise WeightsError(f"weights aliases name targets the blob does not hold: {unknown[:10]}")
    clashing = sorted(k[:80] for k in aliases if k in keys or k in aliases.values())
    if clashing:
        raise WeightsError(
            f"weights aliases {clashing[:10]} are also tensors or alias targets "
            "(an alias must name a tensor of the blob directly)"
        )
    return aliases


def expand_aliases(state: dict[str, torch.Tensor], aliases: Mapping[str, str]) -> None:
    """Give every alias the tensor of its target, in place (checked by :func:`decode_aliases`)."""
    for alias, target in aliases.items():
        state[alias] = state[target]
