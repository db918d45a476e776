"""Language-model shapes for push benchmarks: ~25M, ~100M and Qwen2.5-0.5B-shaped models.

All are ``Qwen2ForCausalLM`` with tied embeddings, built from a config with random
weights (nothing is downloaded). ``device="meta"`` builds the shape only (no memory),
which is enough for size arithmetic (:func:`push_bytes`, the actor's default cap);
``device="cpu"`` allocates real weights for timed pushes (the 0.5B shape needs about
2 GB in float32, 1 GB in bfloat16). :func:`lora_model` adds the adapter an actor
started with ``--lora`` holds, so adapter-only pushes can be measured.

Example::

    from bench.llm_shapes import build_llm, push_bytes
    model = build_llm("100m", dtype=torch.bfloat16)
    print(push_bytes(model), "bytes in a full push")
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SHAPES", "build_llm", "llm_config", "lora_model", "push_bytes"]

# The config fields of each shape; the tokenizer of the built-in tiny models is not
# used (a push moves weights, not tokens).
SHAPES: dict[str, dict[str, int]] = {
    # 24000 x 512 embedding (12.3M) + 4 layers of 3.2M: 25M parameters.
    "25m": {
        "vocab_size": 24000,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
    },
    # 32000 x 768 embedding (24.6M) + 11 layers of 7.1M: 102M parameters.
    "100m": {
        "vocab_size": 32000,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 11,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
    },
    # Qwen2.5-0.5B: 494M parameters, 136M of them the tied embedding.
    "0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
}


def llm_config(shape: str) -> Any:
    """The ``Qwen2Config`` of a shape in :data:`SHAPES` (tied embeddings).

    Raises:
        ValueError: An unknown shape.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=4096)


def build_llm(
    shape: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0
) -> Any:
    """A ``Qwen2ForCausalLM`` of ``shape`` with random weights (``device="meta"``: shapes only)."""
    from transformers import Qwen2ForCausalLM

    config = llm_config(shape)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def lora_model(model: Any, spec: str = "r=16,targets=q_proj,v_proj") -> Any:
    """``model`` wrapped in the adapter an actor started with ``--lora SPEC`` holds."""
    from common.llm import apply_lora

    return apply_lora(model, spec)


def push_bytes(
    model: Any, *, dtype: torch.dtype | None = None, only_trainable: bool = False
) -> int:
    """Tensor bytes a push of ``model`` carries (tied tensors once; the header excluded).

    Args:
        model: The learner's module (``meta`` is fine: only shapes are read).
        dtype: The wire dtype (``update_policy_weights_(..., dtype=)``); None: as held.
        only_trainable: Count only the parameters with ``requires_grad``.
    """
    tensors = {
        id(t): t
        for t in model.state_dict(keep_vars=True).values()
        if not only_trainable or (isinstance(t, torch.nn.Parameter) and t.requires_grad)
    }
    total = 0
    for tensor in tensors.values():
        size = (
            dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        ).itemsize
        total += tensor.numel() * size
    return total
