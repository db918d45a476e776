"""A decode forward over a fixed-size KV cache, so the per-token step can be compiled.

The default decode forward (:func:`common.llm.cached_forward`) grows a dynamic KV
cache by one position per token: every step has new shapes, and each costs the
launch of every kernel of the model, one by one, from Python. :class:`StaticDecode`
keeps the cache in a ``transformers.StaticCache`` of ``rows x width`` positions and
the attention mask in one buffer of that width, so every decode step has the same
shapes; with ``compiled=True`` the step is a function compiled by ``torch.compile`` (mode
``reduce-overhead`` on CUDA: the whole step replays as one CUDA graph). The prefill
(one call per generation, whose width depends on the prompts) stays eager.

The width is the prompts' width plus :attr:`StaticDecode.max_new_tokens` (set it
between generations to the session's budget), rounded up to :data:`WIDTH_STEP`, so
generations of similar lengths share one compiled step; a new row count or width
rebuilds the cache (and recompiles). Weight pushes copy into the
model's own tensors, so a compiled step and its CUDA graph see them at the next token.
Tokens and log-probs equal the default forward's to float rounding
(``tests/common/test_llm_static.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from common.llm._decode import cache_keyword

__all__ = ["WIDTH_STEP", "StaticDecode"]

#: Widths (prompt + new tokens) are rounded up to a multiple of this.
WIDTH_STEP = 64


class StaticDecode:
    """``(ids, mask, positions, past) -> (last logits, cache)`` over a static KV cache.

    Not thread-safe: one decode loop at a time (the actor calls it under its model lock).

    Args:
        model: A causal LM whose forward takes a ``transformers`` cache.
        max_new_tokens: The most tokens a generation appends (settable between two
            generations; a generation beyond it raises).
        compiled: Compile the per-token step (``reduce-overhead`` on CUDA).
    """

    def __init__(self, model: Any, max_new_tokens: int = 16, *, compiled: bool = False) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.compiled = compiled
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._cache_name = cache_keyword(base.__class__)
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._step = self._forward
        if compiled:
            on_cuda = next(model.parameters()).device.type == "cuda"
            mode = "reduce-overhead" if on_cuda else None
            self._step = torch.compile(self._forward, mode=mode, dynamic=False)

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
    ) -> tuple[torch.Tensor, Any]:
        """One forward of the decode loop: the prefill when ``past`` is None, else a token."""
        if past is None:
            self._start(ids.shape[0], mask)
            return self._forward(ids, self._mask, positions), self._cache
        if mask.shape[1] > self.width:
            raise ValueError(
                f"a generation longer than its static cache ({self.width} positions): "
                "set max_new_tokens before the generation"
            )
        self._mask[:, : mask.shape[1]] = mask
        return self._step(ids, self._mask, positions), self._cache

    @property
    def width(self) -> int:
        """The cache's width in positions (0 before the first generation)."""
        return int(self._mask.shape[1])

    def _start(self, rows: int, mask: torch.Tensor) -> None:
        """An empty cache of ``rows`` rows wide enough for these prompts and their tokens."""
        needed = mask.shape[1] + self.max_new_tokens
        width = -(-needed // WIDTH_STEP) * WIDTH_STEP
        if self._cache is None or self._mask.shape != (rows, width):
            config = self.model.config
            self._cache = _static_cache(config, width)
            self._mask = torch.zeros(rows, width, dtype=mask.dtype, device=mask.device)
        else:
            self._cache.reset()
            self._mask.zero_()
        self._mask[:, : mask.shape[1]] = mask

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> Any:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_name: self._cache},
        )
        return out["logits"][:, -1]


def _static_cache(config: Any, width: int) -> Any:
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=width)
