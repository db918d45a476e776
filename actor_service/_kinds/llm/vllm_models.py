"""The model of an LLM actor whose engine is vLLM: a host copy that validates, vLLM that serves.

:class:`VLLMModels` is an :class:`~actor_service._kinds.llm.models.LLMModels` (versions, keys,
staging, state and ``Describe`` come from its host copy, on the CPU, in the dtype vLLM
runs) whose turns run on a :class:`~actor_service._kinds.llm.vllm_engine.VLLMEngine`. A push is
checked and staged against the host copy in full first, as on every actor; then, under
the model lock (between two scheduler steps), the engine modules it touches are reloaded
from the new values and read back (``actor_service._kinds.llm.vllm_worker``); only when the engine
serves them does the host copy take them and the version move. An engine that refuses
them or does not read them back is reloaded with the host copy's values, and the push is
refused: the old weights keep serving, under the old version. A delta is applied to
copies of the host tensors it names, then installed the same way.

With a LoRA adapter (``--lora``) the host copy is the decode loop's peft model; vLLM
serves its base (checkpoint names, ``actor_service._kinds.llm.vllm_lora.checkpoint_names``) and
its adapter, which a push touching any ``lora_A``/``lora_B`` replaces in place, read
back, before the base tensors it also touches (``actor_service._kinds.llm.vllm_lora``); a refusal
of either puts the previous adapter and base back.
"""

from __future__ import annotations

import copy
import functools
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from actor_service._core._scratch import scratch_dir
from actor_service._core._swap import StagedParts, Swap, check_base, swap_full
from actor_service._core._weight_rules import check_newer
from actor_service._kinds.llm.models import LLMModels
from actor_service._kinds.llm.vllm_engine import VLLMEngine, VLLMOptions
from actor_service._kinds.llm.vllm_lora import (
    EngineAdapter,
    adapter_keys,
    check_targets,
    checkpoint_names,
)
from actor_service._kinds.llm.vllm_worker import PROBE_COLUMNS, engine_module, load_groups
from common.errors import InternalError, WeightsError
from common.llm import Generation, GenerationSettings, LoraSpec, default_dtype
from common.weights import (
    Delta,
    PushForm,
    apply_delta,
    apply_staged,
    check_policy_version,
    check_ties,
)

__all__ = ["VLLMModels"]


class VLLMModels(LLMModels):
    """A causal LM served by vLLM, with a host copy that takes pushes only once vLLM serves them.

    Args:
        spec: ``hf:DIR`` (vLLM loads ``DIR``), or a built-in tiny model (saved to a
            temporary checkpoint for vLLM).
        kwargs: :func:`common.llm.build_policy` keyword arguments; without ``dtype``,
            :func:`common.llm.default_dtype` of ``device``.
        device: The actor's device (the host copy stays on the CPU; vLLM picks its own).
        options: vLLM's knobs.
        seed: vLLM's global seed.
        lora: A LoRA adapter to wrap the host copy in (as the decode loop's ``--lora``),
            served by vLLM's LoRA; None: the plain model.

    Raises:
        ValueError: vLLM is missing (naming the install), or the adapter targets modules
            vLLM serves no LoRA on (naming those it does).
    """

    def __init__(
        self,
        spec: str,
        kwargs: Mapping[str, Any],
        device: torch.device,
        options: VLLMOptions,
        seed: int,
        lora: LoraSpec | None = None,
    ) -> None:
        kwargs = dict(kwargs)
        kwargs.setdefault("dtype", default_dtype(device))
        super().__init__(spec, kwargs, torch.device("cpu"), lora)
        self._export: str | None = None
        checkpoint = spec[3:] if spec.startswith("hf:") else self._save_checkpoint(lora is not None)
        reference = self._slot.reference
        self.dtype = next(iter(reference.values())).dtype
        self._names = checkpoint_names(reference)  # host key -> checkpoint key
        self._base = {name: reference[key] for key, name in self._names.items()}
        self._adapter: EngineAdapter | None = None
        try:
            self.engine = VLLMEngine(
                checkpoint, self.dtype, options, seed, None if lora is None else lora.r
            )
            if lora is not None:
                check_targets(reference, self.engine.lora_modules())
                self._adapter = EngineAdapter(self.engine, self.model.peft_config["default"])
                self._adapter.load(self._adapter_state({}))
                self._adapter.commit()
        except BaseException:
            self.close()
            raise
        self.context = self.engine.max_model_len
        self._prefix_caching = options.enable_prefix_caching
        self._engine_lock = threading.Lock()
        self._broken = ""
        self._cache_version: int | None = None
        self._storage: dict[int, list[str]] = {}
        for key, tensor in reference.items():
            self._storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(key)

    def _save_checkpoint(self, unwrap: bool) -> str:
        self._export = scratch_dir("vllm")
        model = self.model
        if unwrap:  # vLLM loads the base; the adapter goes in on its own
            model = copy.deepcopy(model).unload()
        model.save_pretrained(self._export)
        self.tokenizer.save_pretrained(self._export)
        return self._export

    def _remove_export(self) -> None:
        if self._export is not None:
            shutil.rmtree(self._export, ignore_errors=True)
            self._export = None

    def check_generation(self, settings: GenerationSettings) -> None:
        """Refuse settings vLLM refuses (ValueError with vLLM's reason)."""
        self.engine.check(settings)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: GenerationSettings,
        *,
        budgets: Sequence[int],
        stop_ids: Sequence[int],
        pad_id: int,
        generator: torch.Generator,
    ) -> Generation:
        """One response per prompt from vLLM; each request's seed is drawn from ``generator``."""
        count, device = len(prompts), generator.device
        seeds = torch.randint(0, 2**62, (count,), generator=generator, device=device)
        params = [
            self.engine.sampling(settings, budget, stop_ids, int(seed))
            for budget, seed in zip(budgets, seeds.tolist(), strict=True)
        ]
        self._fresh_prefix_cache()
        return self.engine.run(prompts, params, pad_id, self._locked)

    def _locked(self, step: Callable[[], list[Any]]) -> tuple[list[Any], int]:
        with self._engine_lock, self._slot.lock:
            if self._broken:
                raise InternalError(self._broken)
            return step(), self._slot.version

    def _fresh_prefix_cache(self) -> None:
        """Before a turn's requests: no cached prefix computed with weights no longer in force."""
        with self._engine_lock, self._slot.lock:
            stale = self._prefix_caching and self._cache_version != self._slot.version
            if stale and self.engine.reset_prefix_cache():
                self._cache_version = self._slot.version

    def swap_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> Swap:
        """Validate ``state`` against the host copy, then install it into vLLM between two steps.

        Raises:
            StaleVersionError, WeightsError, UnknownModelError: As every actor's push.
            WeightsError: vLLM's loader refused the tensors (the old weights still serve).
            InternalError: vLLM did not read them back (the old weights still serve).
        """
        slot = self._get(model_id)
        check_policy_version(version)
        check_newer(model_id, version, slot.version)
        staged = self.validate(model_id, state, form)  # the model book's checks, adapter too
        install = functools.partial(self._install, staged, {})
        return swap_full(slot, version, install, functools.partial(check_newer, model_id))

    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap:
        """Apply a delta to copies of the host tensors it names, then install them as a push.

        Raises:
            SessionStateError: Another version than ``base_version`` is in force.
            StaleVersionError, WeightsError, InternalError: As :meth:`swap_weights`.
        """
        slot = self._get(model_id)
        check_policy_version(version)
        check_ties({}, slot.reference, delta)

        def newer(new: int, current: int) -> None:
            check_newer(model_id, new, current)
            check_base(model_id, base_version, current)

        def install() -> None:
            changed = {key: slot.reference[key].clone() for key in delta}
            apply_delta(changed, delta)
            self._install(changed, self._columns(delta))

        return swap_full(slot, version, install, newer)

    def swap_parts(self, model_id: str, version: int, parts: StagedParts) -> Swap:
        """Install every staged part of ``version`` together, as one push (engine first).

        The book's swap would copy the parts into the host copy alone: the version would
        move while vLLM served the old weights.

        Raises:
            WeightsError: Parts that give tied keys different values, or vLLM refused them.
            StaleVersionError: ``version`` is no longer newer than the one in force.
            SessionStateError: A delta part's base is no longer in force.
            InternalError: vLLM did not read them back (the old weights still serve).
        """
        slot = self._get(model_id)
        check_ties(parts.tensors, slot.reference, parts.delta)

        def newer(new: int, current: int) -> None:
            check_newer(model_id, new, current)
            if parts.base_version is not None:
                check_base(model_id, parts.base_version, current)

        def install() -> None:
            changed = dict(parts.tensors)
            for key in parts.delta:  # on top of a full part's value, as the book applies it
                changed[key] = changed.get(key, slot.reference[key]).clone()
            apply_delta(changed, parts.delta)
            self._install(changed, self._columns(parts.delta))

        return swap_full(slot, version, install, newer)

    def _columns(self, delta: Delta) -> dict[str, list[int]]:
        """Input columns a delta changed, by engine module (probed first on read-back)."""
        columns: dict[str, list[int]] = {}
        for key, (index, _) in delta.items():
            target = self._slot.reference[key]
            if target.dim() == 2 and key in self._names:
                module = engine_module(self._names[key], self.engine.packed)[0]
                found = (index[: 4 * PROBE_COLUMNS] % target.shape[1]).tolist()
                columns.setdefault(module, []).extend(int(c) for c in found)
        return columns

    def _install(self, new: dict[str, torch.Tensor], columns: Mapping[str, Sequence[int]]) -> None:
        """Put the new adapter, then the new base tensors into vLLM; then update the host copy.

        Called under the model lock. On any failure vLLM gets the host copy's values back.
        """
        reference = self._slot.reference
        for key in list(new):  # a tied tensor's other names carry the same value
            for alias in self._storage[reference[key].untyped_storage().data_ptr()]:
                new.setdefault(alias, new[key])
        base = {self._names[k]: v for k, v in new.items() if k in self._names}
        adapter = {k: v for k, v in new.items() if k not in self._names}
        if adapter:
            self._load_adapter(adapter)
        try:
            if base:
                self._reload_base(base, columns)
        except BaseException:
            if adapter:
                self._rollback_adapter()
            raise
        if self._adapter is not None:
            self._adapter.commit()
        apply_staged(reference, new)
        self._cache_version = None

    def _adapter_state(self, changed: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The host copy's adapter with ``changed`` over it."""
        reference = self._slot.reference
        return {k: changed.get(k, reference[k]) for k in adapter_keys(reference)}

    def _load_adapter(self, changed: Mapping[str, torch.Tensor]) -> None:
        """Serve the host copy's adapter with ``changed`` over it (vLLM reads it back).

        On failure the host copy's adapter is reloaded into vLLM (it serves on).
        """
        assert self._adapter is not None
        try:
            self._adapter.load(self._adapter_state(changed))
        except LookupError as exc:
            self._reinstate_adapter()
            raise InternalError(
                f"vLLM did not serve the pushed LoRA adapter: {exc} read back otherwise; "
                "the previous adapter still serves"
            ) from None
        except OSError as exc:
            raise InternalError(f"the pushed LoRA adapter could not be written: {exc}") from None
        except Exception as exc:  # vLLM's loader raises many kinds; the reason is theirs
            self._reinstate_adapter()
            raise WeightsError(
                f"vLLM refused the pushed LoRA adapter ({type(exc).__name__}: {exc}); "
                "the previous adapter still serves"
            ) from None

    def _rollback_adapter(self) -> None:
        """Serve the previous adapter again (a push's base tensors were refused)."""
        assert self._adapter is not None
        self._adapter.rollback()
        self._reinstate_adapter()

    def _reinstate_adapter(self) -> None:
        """Reload the host copy's adapter into vLLM and read it back; else stop serving."""
        assert self._adapter is not None
        try:
            wrong = self._adapter.reload(self._adapter_state({}))
        except Exception as exc:  # reported through _broken
            wrong = [f"{type(exc).__name__}: {exc}"]
        if wrong:
            self._broken = (
                "vLLM could not be given its previous LoRA adapter back after a refused push "
                f"({', '.join(wrong[:4])}); restart this actor"
            )

    def _reload_base(
        self, new: dict[str, torch.Tensor], columns: Mapping[str, Sequence[int]]
    ) -> None:
        """Reload the touched modules (checkpoint names) into vLLM and read them back."""
        keys = load_groups(new, self._base, self.engine.packed)
        try:
            wrong = self.engine.reload([(k, new.get(k, self._base[k])) for k in keys], columns)
        except Exception as exc:  # vLLM's loaders raise many kinds; the reason is theirs
            self._reinstate(keys)
            raise WeightsError(
                f"vLLM refused the pushed weights ({type(exc).__name__}: {exc}); "
                "the previous weights still serve"
            ) from None
        if wrong:
            self._reinstate(keys)
            raise InternalError(
                f"vLLM did not serve the pushed weights: {', '.join(wrong[:8])} read back "
                "otherwise; the previous weights still serve"
            )

    def _reinstate(self, keys: list[str]) -> None:
        """Put the host copy's values back into vLLM; if even that fails, stop serving."""
        try:
            wrong = self.engine.reload([(k, self._base[k]) for k in keys], {})
        except Exception as exc:  # reported through _broken
            wrong = [f"{type(exc).__name__}: {exc}"]
        if wrong:
            self._broken = (
                "vLLM could not be given its previous weights back after a refused push "
                f"({', '.join(wrong[:4])}); restart this actor"
            )

    def load_state_dict(
        self, state: object, *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore the host copy (all or nothing, as every actor), then reload all of it into vLLM.

        Raises:
            InternalError: vLLM did not take the restored weights (the actor stops serving).
        """
        with self._engine_lock:
            changes = super().load_state_dict(state, allow_rollback=allow_rollback)
            with self._slot.lock:
                self._broken = ""  # a whole reload that reads back makes vLLM whole again
                self._reinstate(list(self._base))
                self._restore_adapter()
                self._cache_version = None
                if self._broken:
                    raise InternalError(self._broken)
        return changes

    def _restore_adapter(self) -> None:
        """Serve the host copy's adapter (after a restore); if that fails, stop serving."""
        if self._adapter is None:
            return
        try:
            self._load_adapter({})
            self._adapter.commit()
        except (WeightsError, InternalError) as exc:
            self._broken = f"vLLM could not be given the restored LoRA adapter ({exc})"

    def close(self) -> None:
        """Shut vLLM down and remove the checkpoint and adapters saved for it (idempotent)."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        adapter: EngineAdapter | None = getattr(self, "_adapter", None)
        if adapter is not None:
            adapter.close()
        self._remove_export()
