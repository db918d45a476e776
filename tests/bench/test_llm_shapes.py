"""The LLM shapes the push benchmarks use: sizes from the config, and push bytes as encoded."""

from __future__ import annotations

import pytest
import torch

from bench.llm_shapes import build_llm, llm_config, lora_model, push_bytes
from common.weights import default_max_weight_bytes, encode_weights, state_nbytes

pytest.importorskip("transformers")


@pytest.mark.parametrize(("shape", "low", "high"), [("100m", 95e6, 110e6), ("0.5b", 490e6, 500e6)])
def test_llm_shapes_have_their_parameter_counts(shape: str, low: float, high: float) -> None:
    model = build_llm(shape, device="meta")
    assert low < sum(p.numel() for p in model.parameters()) < high
    assert model.lm_head.weight is model.model.embed_tokens.weight
    info = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    assert push_bytes(model) <= default_max_weight_bytes(state_nbytes(info))


def test_push_bytes_equals_the_tensor_bytes_of_an_encoded_push() -> None:
    from common.llm import build_policy

    model = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)[0]
    for dtype in (None, torch.bfloat16):
        blob = encode_weights(model, dtype=dtype)
        assert len(blob) - 8 - int.from_bytes(blob[:8], "little") == push_bytes(model, dtype=dtype)


def test_adapter_push_of_the_half_billion_shape_is_under_one_percent() -> None:
    pytest.importorskip("peft")
    model = lora_model(build_llm("0.5b", device="meta"))
    adapter = push_bytes(model, dtype=torch.bfloat16, only_trainable=True)
    assert adapter / push_bytes(model, dtype=torch.bfloat16) < 0.005
    with pytest.raises(ValueError, match="unknown shape"):
        llm_config("7b")
