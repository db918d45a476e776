"""An actor's models by ``model_id``: lookup, versions, and every push, whatever the models are.

:class:`ModelBook` is what the models of every kind of actor (``models.py`` in each folder
of ``actor_service._kinds``) share: finding a
model (``UnknownModelError`` naming the known ids), its version and parameters, and the
whole push path of ``actor_service._core._swap`` (a full push, a delta or the staged parts of a
multi-part push, validated in full before the model's lock is taken, swapped between two env or
decode steps) with the state dict of
GetState/LoadState. Each kind of model says only how it is built and how it acts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

import torch
from torch import nn

from actor_service._core._placement import CompiledForward, PlacementError
from actor_service._core._swap import (
    Slot,
    StagedParts,
    Swap,
    on_devices,
    push_delta,
    push_full,
    restore,
    snapshot,
    swap_parts,
)
from actor_service._core._weight_rules import stage_weights
from common.config import CompileSettings
from common.errors import UnknownModelError
from common.weights import Delta, PushForm, apply_delta, eager_names

__all__ = ["BookModel", "LiveState", "ModelBook"]


class LiveState(Mapping[str, torch.Tensor]):
    """A module's state-dict tensors, each looked up in the module when it is read.

    A push is checked against and copied into these tensors under the model's lock. A
    forward may replace a buffer or parameter (``self.steps = self.steps + 1``): a dict
    taken when the model was built would then hold tensors the module no longer acts
    with, and a push copied there would be reported applied yet never act. The keys are
    the module's state-dict keys when it was built, named as pushes name them
    (``common.weights.eager_names``: a ``torch.compile``'d factory's ``_orig_mod.`` off).

    Args:
        module: The model's module.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        named = eager_names(module, module.state_dict())
        self._keys = {name: key for key, name in named.items()}  # pushed name -> own key

    def __getitem__(self, name: str) -> torch.Tensor:
        key = self._keys.get(name)
        if key is None:
            raise KeyError(name)
        owner_path, _, attr = key.rpartition(".")
        tensor: torch.Tensor | None = None
        try:
            owner = self._module.get_submodule(owner_path)
        except AttributeError:  # a key a module's own state_dict makes up
            owner = None
        if owner is not None:
            tensor = owner._parameters.get(attr)
            if tensor is None:
                tensor = owner._buffers.get(attr)
        if tensor is None:
            tensor = self._module.state_dict()[key]
        return tensor.detach()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class BookModel(Slot, Protocol):
    """What the book needs of one model: its lock and version, module and reference state."""

    module: nn.Module
    reference: Mapping[str, torch.Tensor]
    parameters_info: dict[str, tuple[tuple[int, ...], torch.dtype]]


M = TypeVar("M", bound=BookModel)


class ModelBook(Generic[M]):
    """The models of one actor by ``model_id``, in registration order (the first acts).

    Args:
        models: The models by id.

    Raises:
        ValueError: No model.
    """

    #: ``(r, alpha)`` of the LoRA adapter the models are wrapped in (an LLM actor's
    #: ``--lora``); a push declaring another is refused (``PushForm.check_adapter``).
    adapter: tuple[int, int] | None = None

    def __init__(self, models: Mapping[str, M]) -> None:
        if not models:
            raise ValueError("an actor needs at least one model")
        self._models = dict(models)

    def add(self, model_id: str, model: M) -> None:
        """Register one more model, last (while the actor is built, before it serves).

        Raises:
            ValueError: ``model_id`` is taken.
        """
        if model_id in self._models:
            raise ValueError(f"model_id {model_id!r} is registered already")
        self._models[model_id] = model

    def _get(self, model_id: str) -> M:
        try:
            return self._models[model_id]
        except (KeyError, TypeError):
            raise UnknownModelError(
                f"no model {model_id!r} on this actor; known model_ids: {list(self._models)}"
            ) from None

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The registered ids, in registration order (the first acts by default)."""
        return tuple(self._models)

    def module(self, model_id: str) -> nn.Module:
        """The live module of ``model_id`` (read it only between weight loads)."""
        return self._get(model_id).module

    def policy_version(self, model_id: str) -> int:
        """The version of the weights ``model_id`` acts with now (0 until a push)."""
        return self._get(model_id).version

    def parameters_info(self, model_id: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """State-dict keys of ``model_id`` with their shapes and dtypes (what a push must match)."""
        return dict(self._get(model_id).parameters_info)

    def use_compiled(self, model_id: str, settings: CompileSettings | None) -> None:
        """``torch.compile`` how ``model_id`` acts with ``settings``, or act eagerly (None).

        Raises:
            PlacementError: Compilation asked of a model that cannot be compiled here.
        """
        runner = self._compiling_runner(model_id, settings)
        if runner is not None:
            with self._get(model_id).lock:
                runner.use(settings)

    def check_compilable(self, model_id: str, settings: CompileSettings | None) -> None:
        """Refuse what :meth:`use_compiled` refuses; change nothing.

        Raises:
            PlacementError: Compilation asked of a model that cannot be compiled here.
            UnknownModelError: No such model.
        """
        self._compiling_runner(model_id, settings)

    def _compiling_runner(
        self, model_id: str, settings: CompileSettings | None
    ) -> CompiledForward | None:
        """``model_id``'s compiling runner; None when it has none and ``settings`` asks none.

        Raises:
            PlacementError: Compilation asked of a model that cannot be compiled here.
            UnknownModelError: No such model.
        """
        runner = getattr(self._get(model_id), "runner", None)
        if isinstance(runner, CompiledForward):
            return runner
        if settings is None:
            return None
        raise PlacementError(f"model {model_id!r} of this actor cannot be compiled")

    def validate(
        self, model_id: str, state: object, form: PushForm | None = None
    ) -> dict[str, torch.Tensor]:
        """Check ``state`` against ``model_id`` and stage it; change nothing.

        Keys, shapes, dtypes (under ``form``: a subset, a wire dtype), ties and
        finiteness (``common.weights.stage_state``).

        Returns:
            The tensors cast into the model's dtypes, on its device.

        Raises:
            UnknownModelError: No such model.
            WeightsError: Naming every offending key.
        """
        if form is not None:
            form.check_adapter(self.adapter)
        return stage_weights(model_id, state, self._get(model_id).reference, form)

    def load_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> int:
        """Validate ``state`` in full, then swap it in between two steps; the new version."""
        return self.swap_weights(model_id, version, state, form).version

    def swap_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> Swap:
        """Validate ``state`` in full, then swap it in between two steps (env or decode).

        Args:
            model_id: The model to update.
            version: The new policy version; must be greater than the current one.
            state: Tensors by state-dict key (``common.weights.decode_weights`` output).
            form: What the push declares (a subset of the keys, a wire dtype); None: full.

        Returns:
            The version now in force and how long the swap paused the rollout.

        Raises:
            UnknownModelError: No such model (the message lists the known ids).
            StaleVersionError: ``version`` is not greater than the current one.
            WeightsError: Missing/unexpected keys, shape or dtype mismatches, NaN/Inf, a
                declared LoRA adapter other than the one held.
        """
        model = self._get(model_id)
        if form is not None:
            form.check_adapter(self.adapter)
        return push_full(model, model_id, version, model.reference, state, form)

    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap:
        """Apply a checked delta on ``base_version`` (else SessionStateError, StaleVersionError)."""
        model = self._get(model_id)
        return push_delta(model, model_id, base_version, version, model.reference, delta)

    def stage_delta(self, model_id: str, delta: Delta) -> tuple[dict[str, torch.Tensor], Delta]:
        """Stage a checked delta (``decode_delta``) of a multi-part push; change nothing.

        Returns:
            ``(tensors, delta)``: entries whose indices and values outweigh their whole
            tensor, as whole tensors (a copy of the live values with the change applied),
            so a staged part never holds more than the model's bytes; the others as a
            delta, on the model's device. The copy is read without the lock: if a swap
            changes the model meanwhile, its version moves off the part's base and the
            parts' swap refuses the base (nothing is written).
        """
        reference = self._get(model_id).reference
        dense = {
            key
            for key, (index, values) in delta.items()
            if index.nbytes + values.nbytes > reference[key].nbytes
        }
        tensors = {key: reference[key].detach().clone() for key in sorted(dense)}
        apply_delta(tensors, {key: delta[key] for key in dense})
        sparse = {key: entry for key, entry in delta.items() if key not in dense}
        return tensors, on_devices(sparse, reference)

    def swap_parts(self, model_id: str, version: int, parts: StagedParts) -> Swap:
        """Swap every staged part of ``version`` in together (``_swap.swap_parts``).

        Raises:
            UnknownModelError: No such model.
            WeightsError: Parts that give tied keys different values.
            StaleVersionError: ``version`` is no longer newer than the one in force.
            SessionStateError: A delta part's base is no longer in force.
        """
        model = self._get(model_id)
        return swap_parts(model, model_id, version, model.reference, parts)

    def state_dict(self) -> dict[str, dict]:
        """``{model_id: {"version": int, "weights": {key: CPU tensor}}}`` (copies)."""
        return {model_id: snapshot(m, m.module) for model_id, m in self._models.items()}

    def load_state_dict(
        self, state: object, *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore every model's weights and version, all or nothing; ``{model_id: (old, new)}``.

        ``state`` is a :meth:`state_dict`; see ``actor_service._core._swap.restore`` for the
        checks (UnknownModelError, WeightsError, StaleVersionError unless ``allow_rollback``).
        """
        slots = {model_id: (m, m.reference) for model_id, m in self._models.items()}
        return restore(slots, state, self._get, allow_rollback=allow_rollback)
