"""A LoRA adapter served by vLLM: the host copy's peft keys in vLLM's terms, loaded, read back.

An LLM actor with ``--engine vllm --lora ...`` holds the same peft model as with the
decode loop (its host copy, keys ``base_model.model.*``); vLLM holds the base model
(checkpoint names: :func:`checkpoint_names` maps the host copy's base keys onto them) and
one LoRA adapter, ``lora_int_id`` :data:`LORA_ID`, that every request is added with.

:class:`EngineAdapter` installs a new adapter with vLLM's own loader: the adapter is
written as a peft directory (``adapter_config.json`` + ``adapter_model.safetensors``)
under one temporary directory, which never holds more than two (the one serving and the
one being loaded), and loaded *in place* (``load_inplace=True``: vLLM loads and checks
the new adapter before it drops the old one), under the model lock, between two
scheduler steps. Requests in flight therefore continue on the new adapter from their next
token on, with the version the push brought, exactly as with the decode loop and as with
a full push into vLLM. The proof that the engine serves it is a read-back of vLLM's LoRA
slots (:func:`verify_adapter`): every ``lora_A`` and every ``lora_B`` (times peft's
``alpha / r``, which vLLM folds into ``B``) must equal what was sent, bit for bit. An
adapter vLLM refuses or does not read back is replaced by the previous one, reloaded
from its directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from actor_service._core._scratch import scratch_dir
from actor_service._kinds.llm.vllm_worker import engine_module

__all__ = [
    "LORA_ID",
    "EngineAdapter",
    "adapter_keys",
    "check_targets",
    "checkpoint_names",
    "lora_modules",
    "verify_adapter",
]

#: The ``lora_int_id`` of the actor's one adapter in vLLM (ids start at 1).
LORA_ID = 1
_PEFT_PREFIX = "base_model.model."
_MARKS = (".lora_A.", ".lora_B.")
# peft's adapters on embeddings (vLLM serves LoRA on linear layers only).
_EMBEDDING_MARKS = (".lora_embedding_A.", ".lora_embedding_B.")


def adapter_keys(keys: Iterable[str]) -> list[str]:
    """The keys of a peft model's LoRA adapter (``...lora_A.<name>.weight``, ``lora_B``)."""
    return [k for k in keys if any(m in k for m in (*_MARKS, *_EMBEDDING_MARKS))]


def checkpoint_names(keys: Iterable[str]) -> dict[str, str]:
    """``{host key: checkpoint key}`` for every base key (identity for a plain model).

    peft's ``base_model.model.`` prefix and a wrapped layer's ``.base_layer`` go; adapter
    keys are left out.
    """
    names = {}
    keys = list(keys)
    adapter = set(adapter_keys(keys))
    for key in keys:
        if key in adapter:
            continue
        name = key.removeprefix(_PEFT_PREFIX) if key.startswith(_PEFT_PREFIX) else key
        names[key] = name.replace(".base_layer.", ".")
    return names


def _layer_and_kind(key: str) -> tuple[str, str]:
    """``(checkpoint module, "A" or "B")`` of an adapter key (``...lora_A.default.weight``)."""
    for mark in _MARKS:
        if mark in key:
            module = key.split(mark, 1)[0].removeprefix(_PEFT_PREFIX)
            return module, mark[-2]
    raise ValueError(f"{key!r} is no LoRA adapter key")


class EngineAdapter:
    """The adapter a vLLM engine serves, replaced in place by :meth:`load`.

    Args:
        engine: The :class:`~actor_service._kinds.llm.vllm_engine.VLLMEngine` (started with LoRA).
        config: The host copy's peft ``LoraConfig`` (written beside every adapter).
    """

    def __init__(self, engine: Any, config: Any) -> None:
        self._engine = engine
        self._config = config
        self._scaling = float(config.lora_alpha) / float(config.r)
        self._root = scratch_dir("vllm-lora")
        self._count = 0
        self.serving: str | None = None
        self._previous: str | None = None

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Write ``state`` (every adapter key, host names), load it in place, read it back.

        Call under the model lock. On success the new adapter serves and the previous
        one's directory waits for :meth:`commit` or :meth:`rollback`; on failure the
        caller has vLLM :meth:`reload` the one still named :attr:`serving`.

        Raises:
            OSError: The adapter could not be written (nothing reached vLLM).
            LookupError: vLLM does not serve what was sent (the parts that differ).
            Exception: vLLM refused the adapter (its reason).
        """
        path = self._write(state)
        try:
            self._engine.load_adapter(path)
            wrong = self._engine.read_adapter(self._expected(state))
            if wrong:
                raise LookupError(", ".join(wrong[:8]))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self._previous, self.serving = self.serving, path

    def commit(self) -> None:
        """Forget the previous adapter (the push that replaced it stands)."""
        if self._previous is not None:
            shutil.rmtree(self._previous, ignore_errors=True)
            self._previous = None

    def rollback(self) -> None:
        """Name the previous adapter :attr:`serving` again (then :meth:`reload` it)."""
        if self._previous is not None:
            if self.serving is not None:
                shutil.rmtree(self.serving, ignore_errors=True)
            self.serving, self._previous = self._previous, None

    def reload(self, state: Mapping[str, torch.Tensor]) -> list[str]:
        """Load :attr:`serving` into vLLM in place; what of ``state`` does not read back.

        Raises:
            Exception: vLLM refused it (the caller stops serving).
        """
        if self.serving is None:
            return []
        self._engine.load_adapter(self.serving)
        return list(self._engine.read_adapter(self._expected(state)))

    def _write(self, state: Mapping[str, torch.Tensor]) -> str:
        from safetensors.torch import save_file

        self._count += 1
        path = f"{self._root}/{self._count}"
        shutil.rmtree(path, ignore_errors=True)
        tensors = {}
        for key, tensor in state.items():
            module, kind = _layer_and_kind(key)
            tensors[f"{_PEFT_PREFIX}{module}.lora_{kind}.weight"] = tensor.detach().contiguous()
        os.makedirs(path)
        try:
            save_file(tensors, f"{path}/adapter_model.safetensors")
            self._config.save_pretrained(path)  # adapter_config.json
        except BaseException:  # a write that fails half way (disk full) leaves nothing
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path

    def _expected(
        self, state: Mapping[str, torch.Tensor]
    ) -> list[tuple[str, int, str, torch.Tensor]]:
        """``(engine module, shard, "A"|"B", tensor)``: what vLLM's slots must hold."""
        packed = self._engine.packed
        out = []
        for key, tensor in state.items():
            module, kind = _layer_and_kind(key)
            name, _, shard = engine_module(f"{module}.weight", packed)
            value = tensor if kind == "A" or self._scaling == 1 else tensor * self._scaling
            out.append((name, shard, kind, value))
        return out

    def close(self) -> None:
        """Remove the adapters' directory (idempotent)."""
        shutil.rmtree(self._root, ignore_errors=True)


def check_targets(keys: Iterable[str], supported: Iterable[str]) -> None:
    """Refuse an adapter on modules vLLM serves no LoRA on, naming those it does.

    Raises:
        ValueError: The adapter's modules that are not among ``supported``.
    """
    wrapped = {k.split(".lora_", 1)[0].rpartition(".")[2] for k in adapter_keys(keys)}
    wrong = sorted(wrapped - set(supported))
    if wrong:
        raise ValueError(
            f"lora targets {wrong} are modules vLLM serves no LoRA adapter on; it serves "
            f"them on {sorted(supported)} of this model"
        )


def lora_modules(worker: Any) -> list[str]:
    """The module names vLLM serves LoRA on (unpacked: ``q_proj``, not ``qkv_proj``).

    Called through ``LLM.collective_rpc``.
    """
    manager = worker.model_runner.lora_manager._adapter_manager
    packed = manager.packed_modules_mapping
    return sorted({p for m in manager.supported_lora_modules for p in packed.get(m, [m])})


def verify_adapter(
    worker: Any, expected: Sequence[tuple[str, int, str, torch.Tensor]], lora_id: int
) -> list[str]:
    """What of ``expected`` vLLM's LoRA slots do not hold (empty: the engine serves it).

    Called through ``LLM.collective_rpc`` (the engine runs in this process).
    """
    manager = worker.model_runner.lora_manager._adapter_manager
    if lora_id not in manager.lora_index_to_id:
        return [f"adapter {lora_id} is in no LoRA slot"]
    slot = manager.lora_index_to_id.index(lora_id)
    wrong = []
    for module, shard, kind, tensor in expected:
        layer = manager.modules.get(module)
        if layer is None:
            wrong.append(f"{module}: no LoRA layer in the engine")
            continue
        stacked = (layer.lora_a_stacked if kind == "A" else layer.lora_b_stacked)[shard]
        rows, cols = tensor.shape
        held = stacked[slot, 0, :rows, :cols]
        if held.shape != tensor.shape or not torch.equal(held, tensor.to(held.dtype)):
            wrong.append(f"{module}[{shard}].lora_{kind}")
    return wrong
