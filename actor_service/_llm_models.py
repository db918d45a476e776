"""The language model an LLM actor holds: versioned, swapped between decode steps.

:class:`LLMModels` offers the same surface as the env actor's ``ModelRegistry``
(``model_ids``, ``policy_version``, ``parameters_info``, ``load_weights``,
``state_dict``, ``load_state_dict``) for one model, ``"policy"``, built by
:func:`common.llm.build_policy`. Every forward of the decode loop and every weight
swap take the same lock, so a push lands between two tokens, never inside a
forward; a push is validated in full before the lock is taken.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from actor_service._staging import Swap, swap_delta, swap_full
from common.errors import StaleVersionError, UnknownModelError, WeightsError
from common.llm import build_policy
from common.weights import Delta, check_compatible, check_finite, to_state_dict

__all__ = ["LLMModels"]

MODEL_ID = "policy"


class LLMModels:
    """One causal LM and its tokenizer under a lock, with a policy version.

    Args:
        spec: The model spec (``rlfleet:tiny-qwen2``, ``hf:DIR``).
        kwargs: Keyword arguments for :func:`common.llm.build_policy`.
        device: Where the model runs.

    Raises:
        PolicySpecError: The spec names nothing buildable.
    """

    def __init__(self, spec: str, kwargs: Mapping[str, Any], device: torch.device) -> None:
        self.spec = spec
        self.device = device
        model, self.tokenizer = build_policy(spec, **dict(kwargs))
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
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=positions.to(self.device),
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            )
            return out.logits[:, -1].float().cpu(), out.past_key_values, self.version

    def validate(self, model_id: str, state: Mapping[str, torch.Tensor]) -> None:
        """Check keys, shapes, dtypes and finiteness; change nothing."""
        self._check(model_id)
        if not isinstance(state, Mapping):
            raise WeightsError(f"weights must be a mapping, got {type(state).__name__}")
        try:
            check_compatible(state, self._reference)
        except TypeError as exc:
            raise WeightsError(f"weights for {model_id!r}: {exc}") from None
        check_finite(state)

    def load_weights(self, model_id: str, version: int, state: Mapping[str, torch.Tensor]) -> int:
        """Validate ``state`` in full, then swap it in between two decode steps.

        Raises:
            UnknownModelError: ``model_id`` is not ``"policy"``.
            StaleVersionError: ``version`` is not newer than the one in force.
            WeightsError: Keys, shapes, dtypes or values that do not fit.
        """
        return self.swap_weights(model_id, version, state).version

    def swap_weights(self, model_id: str, version: int, state: Mapping[str, torch.Tensor]) -> Swap:
        """:meth:`load_weights`, also saying how long the swap paused decoding."""
        self._check(model_id)
        if not isinstance(version, int) or isinstance(version, bool):
            raise WeightsError(f"policy version must be an int, got {version!r}")
        self._check_newer(version)
        self.validate(model_id, state)
        staged = {k: state[k].to(self.device) for k in self._reference}
        return swap_full(self, version, self._reference, staged, self._newer)

    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap:
        """Apply a checked delta (``common._delta.decode_delta``) on top of ``base_version``.

        Raises:
            UnknownModelError: ``model_id`` is not ``"policy"``.
            SessionStateError: Another version than ``base_version`` is in force.
            StaleVersionError: ``version`` is not newer than the one in force.
        """
        self._check(model_id)
        return swap_delta(
            self, MODEL_ID, base_version, version, self._reference, delta, self._newer
        )

    def _newer(self, version: int, current: int) -> None:
        if version <= current:
            raise StaleVersionError(
                f"weights version {version} for model {MODEL_ID!r} is not newer than the "
                f"version in force, {current}"
            )

    def _check_newer(self, version: int) -> None:
        self._newer(version, self.version)

    def _copy_in(self, staged: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for key, target in self._reference.items():
                target.copy_(staged[key])

    def state_dict(self) -> dict[str, dict]:
        """``{"policy": {"version": int, "weights": {key: CPU tensor}}}`` (copies)."""
        with self.lock:
            return {MODEL_ID: {"version": self.version, "weights": to_state_dict(self.model)}}

    def load_state_dict(
        self, state: Mapping[str, Mapping], *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore weights and version, all or nothing; ``{"policy": (old, new)}``.

        Raises:
            UnknownModelError: ``state`` names another model.
            WeightsError: A missing model, a bad version or weights that do not fit.
            StaleVersionError: The version would go back and ``allow_rollback`` is false.
        """
        if not isinstance(state, Mapping):
            raise WeightsError(f"model state must be a mapping, got {type(state).__name__}")
        for model_id in state:
            self._check(model_id)
        entry = state.get(MODEL_ID)
        if not isinstance(entry, Mapping):
            raise WeightsError(f"model state lacks model {MODEL_ID!r}")
        version = entry.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise WeightsError(f"model state has version {version!r}; need an int >= 0")
        if version < self.version and not allow_rollback:
            raise StaleVersionError(
                f"state version {version} of {MODEL_ID!r} is older than the version in force, "
                f"{self.version} (allow_rollback to restore it)"
            )
        self.validate(MODEL_ID, entry.get("weights"))  # type: ignore[arg-type]
        staged = {k: v.to(self.device) for k, v in entry["weights"].items()}
        with self.lock:
            old = self.version
            self._copy_in(staged)
            self.version = version
        return {MODEL_ID: (old, version)}
