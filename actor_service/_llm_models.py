"""The language model an LLM actor holds: versioned, swapped between decode steps.

:class:`LLMModels` offers the same surface as the env actor's ``ModelRegistry``
(``model_ids``, ``policy_version``, ``parameters_info``, ``load_weights``,
``state_dict``, ``load_state_dict``) for one model, ``"policy"``, built by
:func:`common.llm.build_policy` and, with ``--lora``, wrapped in a LoRA adapter
(:func:`common.llm.apply_lora`; its keys are then peft's, ``base_model.model.*``).
Every forward of the decode loop and every weight swap take the same lock, so a
push lands between two tokens, never inside a forward; a push is validated,
cast and staged in full before the lock is taken.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from actor_service._swap import Swap, push_delta, push_full, restore, snapshot
from actor_service._weight_rules import stage_weights
from common.config import DEFAULT_MODEL_ID
from common.errors import UnknownModelError
from common.llm import LoraSpec, apply_lora, build_policy, cached_forward
from common.weights import Delta, PushForm, to_state_dict

__all__ = ["LLMModels"]

MODEL_ID = DEFAULT_MODEL_ID


class LLMModels:
    """One causal LM and its tokenizer under a lock, with a policy version.

    Args:
        spec: The model spec (``rlfleet:tiny-qwen2``, ``hf:DIR``).
        kwargs: Keyword arguments for :func:`common.llm.build_policy`.
        device: Where the model runs.
        lora: A LoRA adapter to wrap the model in; None holds the plain model.

    Raises:
        PolicySpecError: The spec names nothing buildable.
        ValueError: The LoRA targets name no module of the model.
    """

    def __init__(
        self,
        spec: str,
        kwargs: Mapping[str, Any],
        device: torch.device,
        lora: LoraSpec | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        model, self.tokenizer = build_policy(spec, **dict(kwargs))
        if lora is not None:
            model = apply_lora(model, lora).eval()
        self.model = model.to(device)
        self.version = 0
        self.lock = threading.Lock()
        self._reference = {k: v.detach() for k, v in self.model.state_dict().items()}
        self._info = {k: (tuple(v.shape), v.dtype) for k, v in to_state_dict(self.model).items()}
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or int(
            getattr(self.model.config, "n_positions", 0) or 1 << 20
        )

    @property
    def model_ids(self) -> tuple[str, ...]:
        """``("policy",)``."""
        return (MODEL_ID,)

    def _check(self, model_id: str) -> None:
        if model_id != MODEL_ID:
            raise UnknownModelError(
                f"no model {model_id!r} on this LLM actor; known model_ids: [{MODEL_ID!r}]"
            )

    def policy_version(self, model_id: str) -> int:
        """The version of the weights in force (0 until a push)."""
        self._check(model_id)
        return self.version

    def parameters_info(self, model_id: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """State-dict keys with shapes and dtypes (what a push must match)."""
        self._check(model_id)
        return dict(self._info)

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
    ) -> tuple[torch.Tensor, Any, int]:
        """One decode-loop forward under the lock: ``(last logits, cache, version)``."""
        with self.lock, torch.no_grad():
            device = self.device
            logits, cache = cached_forward(
                self.model, ids.to(device), mask.to(device), positions.to(device), past
            )
            return logits.float().cpu(), cache, self.version

    def validate(
        self, model_id: str, state: object, form: PushForm | None = None
    ) -> dict[str, torch.Tensor]:
        """Check keys, shapes, dtypes, ties and finiteness; return the staged tensors.

        Nothing changes; ``common.weights.stage_state`` casts into the model's dtypes.
        """
        self._check(model_id)
        return stage_weights(model_id, state, self._reference, form)

    def load_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> int:
        """Validate ``state`` in full, then swap it in between two decode steps.

        ``form`` declares a subset push (an adapter alone) or a wire dtype; None: full.

        Raises:
            UnknownModelError: ``model_id`` is not ``"policy"``.
            StaleVersionError: ``version`` is not newer than the one in force.
            WeightsError: Keys, shapes, dtypes or values that do not fit, or a version
                outside the int64 range.
        """
        return self.swap_weights(model_id, version, state, form).version

    def swap_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> Swap:
        """:meth:`load_weights`, also saying how long the swap paused decoding."""
        self._check(model_id)
        return push_full(self, MODEL_ID, version, self._reference, state, form)

    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap:
        """Apply a checked delta on ``base_version`` (else SessionStateError, StaleVersionError)."""
        self._check(model_id)
        return push_delta(self, MODEL_ID, base_version, version, self._reference, delta)

    def state_dict(self) -> dict[str, dict]:
        """``{"policy": {"version": int, "weights": {key: CPU tensor}}}`` (copies)."""
        return {MODEL_ID: snapshot(self, self.model)}

    def load_state_dict(
        self, state: object, *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore weights and version, all or nothing; ``{"policy": (old, new)}``.

        Raises:
            UnknownModelError: ``state`` names another model.
            WeightsError: A missing model, a bad version or weights that do not fit.
            StaleVersionError: The version would go back and ``allow_rollback`` is false.
        """
        slots = {MODEL_ID: (self, self._reference)}
        return restore(slots, state, self._check, allow_rollback=allow_rollback)
