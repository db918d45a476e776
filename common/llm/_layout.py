"""The dense LLM wire form, its strict checks, and TorchRL 0.14.1's ``LLMCollector`` layout.

An LLM batch travels as an ordinary packet (:mod:`common.packets`) of dense
tensors and string stacks, never pickled objects. Per element (one dialog turn),
batch shape ``S`` (``[slots, T]`` in steps mode, ``[n]`` otherwise)::

    tokens                    int64  [*S, L]  prompt ‖ response, right-padded
    prompt_len, response_len  int64  [*S]     0 <= len, prompt_len + response_len <= L
    log_probs                 float32[*S, R]  response log-probs (R >= response_len)
    policy_version            int64  [*S]     version the turn's first token was drawn at
    done/terminated/truncated bool   [*S, 1]  the state at the turn (always False)
    history.role/.content     str    [*S, M]  the history after the turn ("" past next_length)
    history.length            int64  [*S]     2 <= length <= M: the turn's prompt and response
    history.next_length       int64  [*S]     length <= next_length <= M: with the task's reply
    text.prompt/.response     str    [*S]
    query                     str    [*S]
    collector.traj_ids, .group_id, .dialog_turns  int64 [*S]; collector.stopped bool [*S]
    collector.token_policy_version  int64 [*S, R]  (when per-token versions are recorded)
    next.reward float32 [*S, 1]; next.done/.terminated/.truncated/.success bool [*S, 1]

:func:`check_padded` enforces all of it (a hostile peer's lengths beyond the padded
width, negative lengths, counts that do not agree raise :class:`~common.errors.ProtocolError`);
:func:`to_torchrl` rebuilds TorchRL's layout: ragged ``tokens``/``masks``/``log_probs``
(``prompt``, ``response``, ``full``), ``text``, ``history`` (``prompt``, ``response``,
``full`` as ``role``/``content`` string stacks), ``next.history.prompt`` (this turn's
full history and the task's reply: the next turn's prompt), lazily stacked to ``[B, T]`` or ``[n]``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, NonTensorStack, TensorDict, TensorDictBase

from common.errors import ProtocolError

__all__ = ["check_padded", "to_torchrl"]

_INT = torch.int64
_ROW_INTS = (
    "prompt_len",
    "response_len",
    "policy_version",
    ("history", "length"),
    ("history", "next_length"),
    ("collector", "traj_ids"),
    ("collector", "group_id"),
    ("collector", "dialog_turns"),
)
_FLAGS = (
    "done",
    "terminated",
    "truncated",
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "success"),
)
_STRINGS = ("query", ("text", "prompt"), ("text", "response"))


def _get(td: TensorDictBase, key: Any, what: str) -> Any:
    if key not in td.keys(include_nested=True):
        raise ProtocolError(f"LLM batch lacks {key!r} ({what})")
    return td.get(key)


def _tensor(td: TensorDictBase, key: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
    value = _get(td, key, f"{dtype} {list(shape)}")
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or tuple(value.shape) != shape:
        got = f"{getattr(value, 'dtype', type(value).__name__)} {list(getattr(value, 'shape', []))}"
        raise ProtocolError(f"LLM batch {key!r} must be {dtype} {list(shape)}, got {got}")
    return value


def check_padded(td: TensorDictBase, vocab_size: int = 0) -> None:
    """Check an LLM batch in the padded wire form; nothing is trusted.

    Args:
        td: The batch.
        vocab_size: Token ids must be below it (the learner model's embedding rows); 0
            checks only that they are not negative.

    Raises:
        ProtocolError: A missing key, a wrong dtype or shape, a negative length, a length
            beyond the padded width, counts that do not agree, or a token id outside
            ``[0, vocab_size)``.
    """
    batch = tuple(td.batch_size)
    if len(batch) not in (1, 2):
        raise ProtocolError(f"LLM batch must be [n] or [slots, T], got {list(batch)}")
    tokens = _get(td, "tokens", "int64 [*S, L]")
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != len(batch) + 1:
        raise ProtocolError(
            f"LLM batch 'tokens' must be int64 [*S, L], got {type(tokens).__name__}"
        )
    width = tokens.shape[-1]
    _tensor(td, "tokens", _INT, (*batch, width))
    span = _get(td, "log_probs", "float32 [*S, R]")
    span = span.shape[-1] if isinstance(span, torch.Tensor) and span.ndim else -1
    _tensor(td, "log_probs", torch.float32, (*batch, span))
    rows = {key: _tensor(td, key, _INT, batch) for key in _ROW_INTS}
    for key in _FLAGS:
        _tensor(td, key, torch.bool, (*batch, 1))
    _tensor(td, ("collector", "stopped"), torch.bool, batch)
    _tensor(td, ("next", "reward"), torch.float32, (*batch, 1))
    token_versions = None
    if ("collector", "token_policy_version") in td.keys(include_nested=True):
        token_versions = _tensor(td, ("collector", "token_policy_version"), _INT, (*batch, span))
    prompt, response = rows["prompt_len"], rows["response_len"]
    if bool((prompt < 0).any()) or bool((response < 0).any()):
        raise ProtocolError("LLM batch has negative prompt_len or response_len")
    # Each length is bounded before they are added: int64 sums of wire values wrap.
    beyond = (prompt > width) | (response > span) | (response > width)
    if bool(beyond.any()) or bool((prompt + response > width).any()):
        raise ProtocolError(
            f"LLM batch lengths exceed the padded widths (tokens {width}, log_probs {span})"
        )
    for key in ("policy_version", ("collector", "traj_ids"), ("collector", "group_id")):
        if bool((rows[key] < 0).any()):
            raise ProtocolError(f"LLM batch has a negative {key!r}")
    if token_versions is not None:
        _check_token_versions(token_versions, rows["policy_version"], response)
    if bool((rows["collector", "dialog_turns"] < 1).any()):
        raise ProtocolError("LLM batch has a dialog_turns below 1 (the first turn is 1)")
    _check_token_ids(td.get("tokens"), vocab_size)
    ended = td.get(("next", "terminated")) | td.get(("next", "truncated"))
    if not torch.equal(td.get(("next", "done")), ended):  # a learner's loss reads either
        raise ProtocolError("LLM batch has a next.done unlike next.terminated | next.truncated")
    if not bool(torch.isfinite(td.get("log_probs")).all()):
        raise ProtocolError("LLM batch has non-finite log_probs")
    _check_strings(td, batch, rows[("history", "length")], rows[("history", "next_length")])


def _check_token_ids(tokens: torch.Tensor, vocab_size: int) -> None:
    """Token ids are not negative and, with a ``vocab_size``, below it."""
    if bool((tokens < 0).any()):
        raise ProtocolError("LLM batch has negative token ids")
    if vocab_size and bool((tokens >= vocab_size).any()):
        raise ProtocolError(
            f"LLM batch has token ids beyond the learner's vocab_size={vocab_size} "
            f"(up to {int(tokens.max())})"
        )


def _check_token_versions(
    versions: torch.Tensor, turn_version: torch.Tensor, response: torch.Tensor
) -> None:
    """Each response token's version is at least its turn's (the first token's); padding 0."""
    inside = torch.arange(versions.shape[-1]) < response.unsqueeze(-1)
    below = inside & (versions < turn_version.unsqueeze(-1))
    if bool(below.any()) or bool((versions[~inside] != 0).any()):
        raise ProtocolError(
            "LLM batch has a token_policy_version below its turn's policy_version, or one "
            "in the padding past response_len (0 there)"
        )


def _check_strings(
    td: TensorDictBase, batch: tuple[int, ...], length: torch.Tensor, next_length: torch.Tensor
) -> None:
    for key in _STRINGS:
        value = _get(td, key, "strings")
        if not isinstance(value, NonTensorStack) or tuple(value.batch_size) != batch:
            raise ProtocolError(f"LLM batch {key!r} must be a string stack of shape {list(batch)}")
    messages = -1
    for key in (("history", "role"), ("history", "content")):
        value = _get(td, key, "strings [*S, M]")
        shape = tuple(getattr(value, "batch_size", ()))
        if (
            not isinstance(value, NonTensorStack)
            or shape[:-1] != batch
            or len(shape) != len(batch) + 1
        ):
            raise ProtocolError(f"LLM batch {key!r} must be a string stack of shape [*S, M]")
        if messages not in (-1, shape[-1]):
            raise ProtocolError("LLM batch history role and content counts do not agree")
        messages = shape[-1]
    if bool((length < 2).any()) or bool((length > messages).any()):
        # at least one prompt message and the response
        raise ProtocolError(f"LLM batch history.length must be in [2, {messages}]")
    if bool((next_length < length).any()) or bool((next_length > messages).any()):
        raise ProtocolError(
            f"LLM batch history.next_length must be in [history.length, {messages}]"
        )


def _history(roles: list[str], contents: list[str]) -> TensorDict:
    return TensorDict(
        {"role": NonTensorStack(*roles), "content": NonTensorStack(*contents)},
        batch_size=[len(roles)],
    )


def _element(td: TensorDictBase, index: tuple[int, ...]) -> TensorDict:
    e = td[index]
    p, r = int(e["prompt_len"]), int(e["response_len"])
    full = e["tokens"][: p + r].clone()
    n, following = int(e["history", "length"]), int(e["history", "next_length"])
    all_roles, all_contents = list(e["history", "role"]), list(e["history", "content"])
    roles, contents = all_roles[:n], all_contents[:n]
    log_probs = e["log_probs"][:r].clone()
    turns = e["collector", "dialog_turns"].reshape(1).clone()
    text_prompt, text_response = e["text", "prompt"], e["text", "response"]
    out = {
        "tokens": {"prompt": full[:p], "response": full[p:], "full": full},
        "masks": {
            "all_attention_mask": torch.ones(p + r, dtype=torch.bool),
            "all_assistant_mask": torch.arange(p + r) >= p,
        },
        "log_probs": {"response": log_probs, "full": torch.cat([torch.zeros(p), log_probs])},
        "text": {
            "prompt": text_prompt,
            "response": text_response,
            "full": text_prompt + text_response,
        },
        "history": {
            "prompt": _history(roles[:-1], contents[:-1]),
            "response": _history(roles[-1:], contents[-1:]),
            "full": _history(roles, contents),
        },
        "query": e["query"],
        "policy_version": e["policy_version"].clone(),
        "done": e["done"].clone(),
        "terminated": e["terminated"].clone(),
        "truncated": e["truncated"].clone(),
        "step_count": turns - 1,
        "collector": e["collector"].exclude("token_policy_version", "stopped").clone(),
        "next": e["next"].clone(),
    }
    # TorchRL's LLM reward parsers write rewards of shape [..., 1, 1] per turn.
    out["next"]["reward"] = out["next"]["reward"].reshape(1, 1)
    out["next"].update(
        {
            "history": {"prompt": _history(all_roles[:following], all_contents[:following])},
            "policy_version": e["policy_version"].clone(),
            "step_count": turns,
        }
    )
    if ("collector", "token_policy_version") in e.keys(include_nested=True):
        out["collector"]["token_policy_version"] = e["collector", "token_policy_version"][
            :r
        ].clone()
    return TensorDict(out, batch_size=[])


def to_torchrl(td: TensorDictBase) -> LazyStackedTensorDict:
    """TorchRL 0.14.1's ``LLMCollector`` layout of a checked padded batch (ragged lazy stacks).

    ``[slots, T]`` becomes a ``[slots, T]`` lazy stack along the time dim, ``[n]`` a
    ``[n]`` lazy stack; run :func:`check_padded` first.
    """
    if td.ndim == 1:
        return LazyStackedTensorDict.lazy_stack([_element(td, (i,)) for i in range(td.shape[0])])
    slots, steps = td.shape
    columns = [
        LazyStackedTensorDict.lazy_stack([_element(td, (b, t)) for b in range(slots)])
        for t in range(steps)
    ]
    return LazyStackedTensorDict.lazy_stack(columns, dim=1)
