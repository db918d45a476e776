"""Merging checked padded LLM batches of several actors into one, on dim 0.

Each actor pads to its own widest turn, so batches differ in their padded widths
(tokens ``L``, log-probs ``R``, history messages ``M``). :func:`merge_padded` pads
every batch to the widest (tokens and log-probs with 0, messages with empty
strings; the lengths say what is real) and concatenates them on dim 0:
``[slots_i, T]`` batches become ``[sum slots_i, T]``, ``[n_i]`` ones ``[sum n_i]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDictBase

__all__ = ["merge_padded", "pad_widths"]

_WIDE = ("tokens", "log_probs", ("collector", "token_policy_version"))


def pad_widths(td: TensorDictBase, width: int, span: int, messages: int) -> TensorDictBase:
    """``td`` with tokens padded to ``width``, log-probs to ``span``, history to ``messages``."""
    out = td.copy()
    for key, size in zip(_WIDE, (width, span, span), strict=True):
        if key not in td.keys(include_nested=True):
            continue
        value = td.get(key)
        if value.shape[-1] < size:
            out.set(key, torch.nn.functional.pad(value, (0, size - value.shape[-1])))
    for key in (("history", "role"), ("history", "content")):
        stack = td.get(key)
        if stack.batch_size[-1] < messages:
            extra = messages - stack.batch_size[-1]
            rows = _pad_rows(stack.tolist(), extra, td.ndim)
            out.set(key, NonTensorStack.from_list(rows))
    return out


def _pad_rows(rows: list[Any], extra: int, depth: int) -> list[Any]:
    if depth == 1:
        return [list(row) + [""] * extra for row in rows]
    return [_pad_rows(row, extra, depth - 1) for row in rows]


def merge_padded(batches: Sequence[TensorDictBase]) -> TensorDictBase:
    """Pad checked batches to common widths and concatenate them on dim 0."""
    if len(batches) == 1:
        return batches[0]
    width = max(int(b.get("tokens").shape[-1]) for b in batches)
    span = max(int(b.get("log_probs").shape[-1]) for b in batches)
    messages = max(int(b.get(("history", "role")).batch_size[-1]) for b in batches)
    return torch.cat([pad_widths(b, width, span, messages) for b in batches], dim=0)
