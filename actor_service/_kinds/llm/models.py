"""The language model an LLM actor holds: versioned, swapped between decode steps.

:class:`LLMModels` is a :class:`~actor_service._core._model_book.ModelBook` of one model,
``"policy"``, built by :func:`common.llm.build_policy` and, with ``--lora``, wrapped in
a LoRA adapter (:func:`common.llm.apply_lora`; its keys are then peft's,
``base_model.model.*``): versions, pushes and state are the book's, as on an env
actor. Every forward of the decode loop and every weight swap take the same lock,
so a push lands between two tokens, never inside a forward; a push is validated,
cast and staged in full before the lock is taken.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from actor_service._core._model_book import LiveState, ModelBook
from common.config import DEFAULT_MODEL_ID
from common.llm import (
    Generation,
    GenerationSettings,
    LoraSpec,
    StaticDecode,
    apply_lora,
    build_policy,
    cached_forward,
    default_dtype,
    end_token_ids,
    generate,
)
from common.weights import to_state_dict

__all__ = ["LLMModels"]

MODEL_ID = DEFAULT_MODEL_ID


class _Slot:
    """The one model: its module, lock, version and the reference state a push must fit."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.version = 0
        self.lock = threading.Lock()
        self.reference = LiveState(module)
        self.parameters_info = {
            k: (tuple(v.shape), v.dtype) for k, v in to_state_dict(module).items()
        }


class LLMModels(ModelBook[_Slot]):
    """One causal LM and its tokenizer under a lock, with a policy version.

    Args:
        spec: The model spec (``rlfleet:tiny-qwen2``, ``hf:DIR``).
        kwargs: Keyword arguments for :func:`common.llm.build_policy`; without a
            ``dtype``, the model is held in :func:`common.llm.default_dtype` of
            ``device`` (``bfloat16`` on CUDA, ``float32`` elsewhere), and so is its KV cache.
        device: Where the model runs (and the decode loop with it).
        lora: A LoRA adapter to wrap the model in; None holds the plain model.
        decode: ``"eager"`` (:func:`common.llm.cached_forward`), ``"static"`` or
            ``"compiled"`` (:class:`common.llm.StaticDecode`, sized by
            :meth:`plan_generation`).

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
        decode: str = "eager",
    ) -> None:
        self.spec = spec
        self.device = device
        kwargs = dict(kwargs)
        kwargs.setdefault("dtype", default_dtype(device))
        model, self.tokenizer = build_policy(spec, **kwargs)
        #: The ids a response ends on (the tokenizer's EOS and the checkpoint's others).
        self.end_ids = end_token_ids(model, self.tokenizer)
        if lora is not None:
            model = apply_lora(model, lora).eval()
            self.adapter = (lora.r, lora.r if lora.alpha is None else lora.alpha)  # pushes match
        self._slot = _Slot(model.to(device))
        super().__init__({MODEL_ID: self._slot})
        self._decode: Any = functools.partial(cached_forward, self.model)
        if decode != "eager":
            self._decode = StaticDecode(self.model, compiled=decode == "compiled")
        config = self.model.config
        self.context = int(getattr(config, "max_position_embeddings", 0) or 0) or int(
            getattr(config, "n_positions", 0) or 1 << 20
        )
        #: How many token ids the model may draw: its output rows (a padded vocabulary's
        #: beyond the tokenizer's too; nothing masks them), at least the tokenizer's.
        self.token_ids = max(len(self.tokenizer), int(getattr(config, "vocab_size", 0) or 0))

    @property
    def model(self) -> Any:
        """The live language model (read it only between weight loads)."""
        return self._slot.module

    @property
    def version(self) -> int:
        """The version of the weights in force (0 until a push)."""
        return self._slot.version

    def plan_generation(self, max_new_tokens: int) -> None:
        """Size a static decode cache for generations of at most ``max_new_tokens`` tokens.

        Takes effect at the next generation; nothing to do for the growing cache.
        """
        if isinstance(self._decode, StaticDecode):
            with self._slot.lock:
                self._decode.max_new_tokens = max_new_tokens

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
    ) -> tuple[torch.Tensor, Any, int]:
        """One decode-loop forward under the lock: ``(last logits, cache, version)``.

        The inputs are on :attr:`device` already, and the logits stay there (in the
        model's dtype): the decode loop samples where the model runs.
        """
        with self._slot.lock, torch.no_grad():
            logits, cache = self._decode(ids, mask, positions, past)
            return logits, cache, self._slot.version

    def check_generation(self, settings: GenerationSettings) -> None:
        """Refuse generation settings the engine cannot honour (ValueError); the loop takes all."""

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
        """One response per prompt (:func:`common.llm.generate` over :meth:`forward`)."""
        return generate(
            self.forward,
            prompts,
            settings,
            budgets=budgets,
            stop_ids=stop_ids,
            pad_id=pad_id,
            generator=generator,
            device=self.device,
        )

    def close(self) -> None:
        """Release what the engine holds beyond the model (nothing for the decode loop)."""
