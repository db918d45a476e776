"""What runs inside vLLM's worker, between two scheduler steps: reload tensors, then read them back.

vLLM keeps a model in its own layout: ``q_proj``/``k_proj``/``v_proj`` stacked in one
``qkv_proj``, ``gate_proj``/``up_proj`` in ``gate_up_proj`` (its ``packed_modules_mapping``),
the vocabulary padded, and on the CPU every linear weight repacked into a kernel handle
(the parameter itself left empty). A weight update is therefore a reload through the
model's own loader (``reload_weights`` with checkpoint-named tensors, layer by layer:
a layer must receive all of its tensors, which :func:`load_groups` makes sure of), and
the proof that the engine serves the new values is a read-back in the engine's own
terms: a parameter the engine keeps as a tensor is compared whole with what was sent;
a repacked linear layer is run on unit vectors, which returns columns of the weight it
really multiplies by, exactly (:func:`reload_and_verify`).

The functions taking ``worker`` are called through ``LLM.collective_rpc`` in the actor's
own process (the engine runs in-process), so tensors are handed over, never serialized.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "PROBE_COLUMNS",
    "engine_layout",
    "engine_module",
    "load_groups",
    "reload_and_verify",
    "verify_loaded",
]

#: Unit-vector probes per repacked linear layer (columns of its weight read back).
PROBE_COLUMNS = 8


def engine_layout(worker: Any) -> dict[str, list[str]]:
    """The model's ``packed_modules_mapping`` (``{"qkv_proj": ["q_proj", ...]}``)."""
    model = worker.model_runner.get_model()
    return {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}


def engine_module(key: str, packed: Mapping[str, Sequence[str]]) -> tuple[str, str, int]:
    """``(engine module, parameter name, shard index)`` of a checkpoint key."""
    module, _, leaf = key.rpartition(".")
    parent, _, name = module.rpartition(".")
    for stacked, parts in packed.items():
        if name in parts:
            return f"{parent}.{stacked}" if parent else stacked, leaf, list(parts).index(name)
    return module, leaf, 0


def load_groups(
    keys: Iterable[str], reference: Mapping[str, torch.Tensor], packed: Mapping[str, Sequence[str]]
) -> list[str]:
    """Every checkpoint key of every engine module that ``keys`` touch, in ``reference`` order.

    A tensor tied to a touched one (same storage) touches its own module too.
    """
    storage = {k: v.untyped_storage().data_ptr() for k, v in reference.items()}
    hit = {storage[k] for k in keys}
    touched = {engine_module(k, packed)[0] for k, s in storage.items() if s in hit}
    return [k for k in reference if engine_module(k, packed)[0] in touched]


def reload_and_verify(
    worker: Any,
    weights: list[tuple[str, torch.Tensor]],
    packed: Mapping[str, Sequence[str]],
    columns: Mapping[str, Sequence[int]],
) -> list[str]:
    """Load checkpoint-named ``weights`` into the engine's model, then read every one back.

    Args:
        worker: vLLM's worker (``collective_rpc`` passes it).
        weights: ``(checkpoint key, tensor)`` for whole engine modules (:func:`load_groups`).
        packed: The model's packed modules (:func:`engine_layout`).
        columns: Input columns to probe first, by engine module (those a delta changed).

    Returns:
        What does not read back as sent (empty when the engine serves ``weights``).
    """
    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    return verify_loaded(worker, weights, packed, columns)


def verify_loaded(
    worker: Any,
    weights: list[tuple[str, torch.Tensor]],
    packed: Mapping[str, Sequence[str]],
    columns: Mapping[str, Sequence[int]],
) -> list[str]:
    """Read ``weights`` back from the engine's model; what does not match (see above)."""
    model = worker.model_runner.get_model()
    stacks: dict[tuple[str, str], list[tuple[int, torch.Tensor]]] = {}
    for key, tensor in weights:
        module, leaf, shard = engine_module(key, packed)
        stacks.setdefault((module, leaf), []).append((shard, tensor))
    wrong = []
    for (module, leaf), shards in stacks.items():
        expected = torch.cat([t for _, t in sorted(shards, key=lambda s: s[0])])
        try:
            target = model.get_submodule(module)
            param = getattr(target, leaf)
        except AttributeError:
            if _tied_away(model, module):
                continue
            wrong.append(f"{module}.{leaf}: not in the engine's model")
            continue
        if not _reads_back(target, param, expected, columns.get(module, ())):
            wrong.append(f"{module}.{leaf}")
    return wrong


def _tied_away(model: Any, module: str) -> bool:
    """The output head of a tied model: the engine keeps the embedding alone."""
    config = getattr(model, "config", None)
    return module == "lm_head" and bool(getattr(config, "tie_word_embeddings", False))


def _reads_back(
    module: Any, param: torch.Tensor, expected: torch.Tensor, first: Sequence[int]
) -> bool:
    """Whether the engine holds ``expected`` in ``param`` (rows beyond it: vocabulary padding)."""
    if param.numel() > 0:
        rows = expected.shape[0]
        if param.dim() != expected.dim() or param.shape[1:] != expected.shape[1:]:
            return False
        return bool(torch.equal(param[:rows], expected.to(param.device, param.dtype)))
    method = getattr(module, "quant_method", None)
    if method is None or expected.dim() != 2:
        return False
    width = expected.shape[1]
    picked = list(dict.fromkeys(c for c in first if 0 <= c < width))[:PROBE_COLUMNS]
    spread = torch.linspace(0, width - 1, PROBE_COLUMNS).long().tolist()
    picked = list(dict.fromkeys([*picked, *spread]))[: max(PROBE_COLUMNS, len(picked))]
    probe = torch.zeros(len(picked), width, dtype=expected.dtype, device=expected.device)
    probe[torch.arange(len(picked)), torch.as_tensor(picked)] = 1
    with torch.no_grad():
        out = method.apply(module, probe.to(_device(module)), bias=None)
    return bool(torch.equal(out.to(expected.device), expected[:, picked].T.to(out.dtype)))


def _device(module: Any) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")
